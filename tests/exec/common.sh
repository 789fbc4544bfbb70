# Shared set-up of the executor's MPI test scripts (sourced, not run):
# the mpirun command line, a temporary folder removed on exit, and the
# fail/pass reporters that count failures.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS=1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
# Under tools/test-sanitize: full unwinding on malloc for the MPI ranks, so that
# OpenMPI's own leaks carry a frame tests/sanitizers/lsan.supp can match; and no
# walk of the threads' dynamic TLS (use_tls=0): that walk in LeakSanitizer (gcc
# 12, glibc 2.36; most likely over the DTV entries of OpenMPI's dlclose()d
# plugins) can crash its tracer at exit ("Tracer caught signal 11" while processing the main
# thread; the rank exits 1 with no ASan or leak report): 4-rank MoE runs of one
# build crashed so where an older build ran the same plan file clean, and both
# ran clean with use_tls=0. Unscanned TLS can only add leak reports (a block
# held from TLS alone), never hide one.
if [[ -n "${LSAN_OPTIONS:-}" ]]; then export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0:use_tls=0"; fi
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

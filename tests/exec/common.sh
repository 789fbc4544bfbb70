# Shared set-up of the executor's MPI test scripts (sourced, not run):
# the mpirun command line, a temporary folder removed on exit, and the
# fail/pass reporters that count failures.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS=1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
# Under tools/test-sanitize: full unwinding on malloc for the MPI ranks, so that
# OpenMPI's own leaks carry a frame tests/sanitizers/lsan.supp can match.
if [[ -n "${LSAN_OPTIONS:-}" ]]; then export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0"; fi
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

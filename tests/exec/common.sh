# Shared set-up of the executor's MPI test scripts (sourced, not run):
# the mpirun command line, a temporary folder removed on exit, and the
# fail/pass reporters that count failures.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS=1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

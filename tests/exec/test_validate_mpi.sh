#!/usr/bin/env bash
# cuboid validate on real measurements: the executor's op names, groups and
# rank mapping must pass validate's checks (exit 0 or 1, never 2) for TP, PP,
# DP, ZeRO-1 and TP x PP plans, and a run of one plan checked against another
# plan must exit 2. Guards against the executor and the simulator drifting
# apart (an op renamed or added on one side only). The tolerance is huge: the
# numbers on a shared machine are not what this test is about.
# Usage: test_validate_mpi.sh CUBOID_BINARY (run from the source root).
set -u
CUBOID=${1:?usage: test_validate_mpi.sh path/to/cuboid}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

check() {  # check NAME NP CLUSTER PLAN-FLAGS...
  local name=$1 np=$2 cluster=$3
  shift 3
  if ! "$CUBOID" plan --model models/tiny.json --cluster "$cluster" --micro-batch 1 --flash-attention off \
      --recompute none --simulate-top 1 --out "$TMP/$name.json" "$@" >"$TMP/$name.plan.log" 2>&1; then
    fail "plan $name: $(tail -2 "$TMP/$name.plan.log")"
    return
  fi
  if ! timeout 120 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 1 \
      --warmup 0 --timeout-s 60 --out "$TMP/$name.m.json" >"$TMP/$name.run.log" 2>&1; then
    fail "run $name: $(tail -2 "$TMP/$name.run.log")"
    return
  fi
  "$CUBOID" validate --plan "$TMP/$name.json" --measurements "$TMP/$name.m.json" --cluster "$cluster" \
    --tolerance 1000 >"$TMP/$name.v.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ] && grep -q "^PASS: end-to-end error" "$TMP/$name.v.log"; then pass "validate $name"; else
    fail "validate $name exited $rc: $(tail -2 "$TMP/$name.v.log")"; fi
}

CPU2=topologies/localhost-cpu.json
CPU4=tests/data/clusters/localhost-cpu-4.json
check tp2 2 "$CPU2" --tp 2 --pp 1 --dp 1 --global-batch 2
check pp2 2 "$CPU2" --tp 1 --pp 2 --dp 1 --global-batch 4 --schedule 1f1b
check dp2 2 "$CPU2" --tp 1 --pp 1 --dp 2 --global-batch 2
check zero1 2 "$CPU2" --tp 1 --pp 1 --dp 2 --zero 1 --global-batch 2
check tp2pp2 4 "$CPU4" --tp 2 --pp 2 --dp 1 --global-batch 4 --schedule 1f1b

# The TP 2 run checked against the DP 2 plan: another plan, exit 2, one line.
if [ -f "$TMP/tp2.m.json" ] && [ -f "$TMP/dp2.json" ]; then
  "$CUBOID" validate --plan "$TMP/dp2.json" --measurements "$TMP/tp2.m.json" --cluster "$CPU2" >"$TMP/x.out" 2>"$TMP/x.err"
  rc=$?
  if [ "$rc" -eq 2 ] && grep -q "plan.tp: the run had TP 2 but plan file .* has 1" "$TMP/x.err" &&
     [ "$(wc -l <"$TMP/x.err")" -eq 1 ]; then pass "another plan refused"; else
    fail "another plan: exit $rc: $(cat "$TMP/x.err")"; fi
fi

if [ "$failures" -gt 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all validate MPI checks passed"

#!/usr/bin/env bash
# cuboid run of mixture-of-experts plans under mpirun (tiny-moe, CPU
# backend): EP 2 on 2 ranks and EP 4 / EP 2 with TP 2 on 4 ranks pass --check
# (the sharded MoE layer against all experts on one rank) and keep their
# replicas equal; a negated expert shard fails the check; EP 1 and EP 2 of
# the same layout train to the same losses; the measurements hold the EP
# all-to-alls and validate prices them; calibrate sweeps the MoE layer's
# kernels and the all-to-all; what the executor does not run is refused with
# the reason; ZeRO 1 shards the experts' optimizer and trains as ZeRO 0.
# Usage: test_moe_mpi.sh CUBOID_BINARY (run from the source root).
set -u
CUBOID=${1:?usage: test_moe_mpi.sh path/to/cuboid}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

MODEL=models/tiny-moe.json
CPU2=topologies/localhost-cpu.json
CPU4=tests/data/clusters/localhost-cpu-4.json
CPU2X2=tests/data/clusters/localhost-cpu-2x2.json

plan() {  # plan NAME CLUSTER FLAGS...
  local name=$1 cluster=$2
  shift 2
  "$CUBOID" plan --model "$MODEL" --cluster "$cluster" --global-batch 8 --micro-batch 1 --recompute none \
    --out "$TMP/$name.json" "$@" >"$TMP/$name.plan.log" 2>&1 || fail "plan $name: $(tail -3 "$TMP/$name.plan.log")"
}

same_losses() {  # same_losses A B [C D ...]: each pair of runs trains to the same losses
  local paths=()
  for n in "$@"; do paths+=("$TMP/$n.m.json"); done
  python3 - "${paths[@]}" <<'PY'
import json, sys
def losses(path):
    return [x for r in json.load(open(path))["ranks"] for x in (r["loss"] or []) if x is not None]
for a, b in zip(sys.argv[1::2], sys.argv[2::2]):
    la, lb = losses(a), losses(b)
    assert la and len(la) == len(lb), (la, lb)
    assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(la, lb)), (la, lb)
PY
}

run_ok() {  # run_ok NAME NP [flags]
  local name=$1 np=$2
  shift 2
  if timeout 120 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 3 --warmup 0 \
      --check --timeout-s 60 --out "$TMP/$name.m.json" "$@" >"$TMP/$name.log" 2>&1; then
    if ! grep -q "MoE layer with EP .* vs unsharded reference.*PASSED" "$TMP/$name.log"; then
      fail "$name: no PASSED MoE check line"; cat "$TMP/$name.log"; return; fi
    if ! grep -q "^check: after 3 steps, .*PASSED" "$TMP/$name.log"; then
      fail "$name: replicas drifted apart"; grep "^check" "$TMP/$name.log"; return; fi
    if python3 - "$TMP/$name.m.json" "$np" "$name" >"$TMP/$name.py.log" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert len(d["ranks"]) == int(sys.argv[2])
ep = d["plan"]["ep"]
assert d["plan"]["etp"] == 1 and d["model"]["num_experts"] == 8
for r in d["ranks"]:
    ops = {o["name"]: o for o in r["ops"]}
    for name in ("router", "router_topk", "moe_permute", "expert_fc1", "expert_fc2_wgrad", "moe_unpermute", "router_wgrad"):
        assert name in ops, (name, sorted(ops))
    assert "fc1" not in ops  # every layer of tiny-moe is an MoE layer
    a2a = [o for o in r["ops"] if o["name"].startswith("ep_a2a")]
    flex = [o for o in r["ops"] if o["name"].startswith("ep_flex")]
    if sys.argv[3].startswith("flex"):
        assert [o["name"] for o in a2a] == ["ep_a2a_counts"], sorted(o["name"] for o in a2a)  # DeepEP's notify
        assert len(flex) == 6, sorted(o["name"] for o in flex)  # dispatch, probs, combine; and back
        for o in a2a + flex:
            assert o["group"] == "ep" and o["group_size"] == ep, o
    elif ep > 1:
        assert not flex
        assert len(a2a) == 7, sorted(o["name"] for o in a2a)  # counts, dispatch, probs, combine; and back
        for o in a2a:
            assert o["collective"] == "all_to_all" and o["group"] == "ep" and o["group_size"] == ep, o
    else:
        assert not a2a
PY
    then pass "$name"; else fail "$name: measurements: $(tail -2 "$TMP/$name.py.log")"; fi
  else
    fail "$name: exit $?"; tail -20 "$TMP/$name.log"
  fi
}

plan ep1 "$CPU2" --tp 1 --pp 1 --dp 2 --ep 1 --zero 0
plan ep2 "$CPU2" --tp 1 --pp 1 --dp 2 --ep 2 --zero 0 --moe-dispatcher alltoall
plan t2d2ep4 "$CPU4" --tp 2 --pp 1 --dp 2 --ep 4 --etp 1 --zero 0 --moe-dispatcher alltoall
plan t2d2ep2 "$CPU4" --tp 2 --pp 1 --dp 2 --ep 2 --etp 1 --zero 0 --moe-dispatcher alltoall
plan p2d2ep2 "$CPU4" --tp 1 --pp 2 --dp 2 --ep 2 --zero 0 --moe-dispatcher alltoall

run_ok ep1 2
run_ok ep2 2
run_ok t2d2ep4 4
run_ok t2d2ep2 4
run_ok p2d2ep2 4

# EP only moves experts: the same layout with EP 1 and EP 2 trains alike.
same_losses ep1 ep2 t2d2ep2 t2d2ep4 \
  && pass "EP 1 and EP 2 (and EP 2 and EP 4 with TP 2) give the same losses" || fail "losses differ across EP"

# The check catches a wrong expert shard (the last EP rank's FC2 negated).
if timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/ep2.json" --backend cpu --steps 1 --check \
    --inject-fault flip-shard >"$TMP/flip.log" 2>&1; then
  fail "flip-shard: the check passed a negated expert shard"
elif grep -q "MoE layer with EP 2 of 8 experts.*FAILED" "$TMP/flip.log"; then pass "a negated expert shard fails the check"
else fail "flip-shard: no FAILED message"; tail -5 "$TMP/flip.log"; fi

# validate reads the all-to-alls and prices them over the EP group.
"$CUBOID" validate --plan "$TMP/ep2.json" --measurements "$TMP/ep2.m.json" --cluster "$CPU2" --ops >"$TMP/validate.txt" 2>&1
rc=$?
if [ $rc -le 1 ] && grep -Eq "ep_a2a_dispatch +collective +[0-9]+ +0\.0*[1-9]" "$TMP/validate.txt"; then
  pass "validate prices the EP all-to-alls"
else fail "validate: rc $rc: $(grep -m3 "ep_a2a\|cuboid:" "$TMP/validate.txt")"; fi

# ZeRO 1 shards the experts' optimizer over expert-DP (reduce-scatter, Adam on
# the block, all-gather): the same losses as ZeRO 0, the replicas equal.
plan z1 "$CPU2" --tp 1 --pp 1 --dp 2 --ep 2 --zero 1 --moe-dispatcher alltoall
run_ok z1 2
same_losses ep2 z1 && python3 - "$TMP/z1.m.json" <<'PY' && pass "ZeRO 1 with experts trains as ZeRO 0" || fail "ZeRO 1 losses differ"
import json, sys
ops = {o["name"]: o for o in json.load(open(sys.argv[1]))["ranks"][0]["ops"]}
assert "dp_rs_grads" in ops and "dp_ag_params" in ops, sorted(ops)
PY

# Refused with the reason, before any work: expert tensor parallelism.
plan etp2 "$CPU2" --tp 2 --pp 1 --dp 1 --ep 1 --etp 2 --zero 0
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/etp2.json" --backend cpu >"$TMP/etp2.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "parallel.etp: the executor does not run expert tensor parallelism (ETP 2)" "$TMP/etp2.log"; then
  pass "ETP 2 with TP 2 is refused"; else fail "ETP 2: rc $rc $(tail -2 "$TMP/etp2.log")"; fi
# calibrate sweeps an MoE plan: the MoE layer's kernels, its grouped GEMMs and the all-to-all.
# Each sample the faster of two sweeps: --quick's three sizes of a grouped
# GEMM, disturbed by a loaded machine, can pool to a flat series whose fit is
# rejected (a fresh clone's suite beside a sanitizer build, 2026-12-07).
timeout 120 "${MPIRUN[@]}" -np 2 "$CUBOID" calibrate --backend cpu --plan "$TMP/ep2.json" --cluster "$CPU2" --quick \
  --repeat 2 --statistic min --out "$TMP/cal.json" >"$TMP/cal.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && python3 - "$TMP/cal.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["calibration"]
for k in ("router_topk", "moe_permute", "moe_sort", "expert_act", "moe_unpermute", "router_topk_bwd"):
    assert k in c["kernels"], (k, sorted(c["kernels"]))
# The grouped expert GEMMs as the layer runs them (the router's split), keyed
# by the local experts (EP 2 of 8: 4) and FLOPs: 2 x 128 tokens x 2 copies x
# 256 x 256 at the plan's own size.
for g in ("expert_fc1", "expert_fc2"):
    for k in (g + "@4", g + "_dgrad@4", g + "_wgrad@4"):
        assert k in c["kernels"], (k, sorted(c["kernels"]))
        assert any(s["bytes"] == 2 * 128 * 2 * 256 * 256 for s in c["kernels"][k]["samples"]), c["kernels"][k]
assert any(x["collective"] == "all_to_all" and x["group_size"] == 2 for x in c["collectives"])
PY
then pass "calibrate measures the MoE kernels, the grouped GEMMs and the all-to-all"; else fail "calibrate: rc $rc $(tail -2 "$TMP/cal.log")"; fi

# The flex dispatcher, EP 4 over 2 nodes x 2 ranks (localhost-cpu-2x2.json):
# the same expert rows as alltoall, so --check passes and the losses agree.
plan flex4 "$CPU2X2" --tp 1 --pp 1 --dp 4 --ep 4 --zero 0 --moe-dispatcher flex
plan a2a4 "$CPU2X2" --tp 1 --pp 1 --dp 4 --ep 4 --zero 0 --moe-dispatcher alltoall
run_ok flex4 4
run_ok a2a4 4
same_losses flex4 a2a4 && pass "flex and alltoall train to the same losses" || fail "flex losses differ"
"$CUBOID" validate --plan "$TMP/flex4.json" --measurements "$TMP/flex4.m.json" --cluster "$CPU2X2" --ops \
  >"$TMP/validate-flex.txt" 2>&1
rc=$?
if [ $rc -le 1 ] && grep -Eq "ep_flex_dispatch +collective +[0-9]+ +0\.0*[1-9]" "$TMP/validate-flex.txt" &&
   grep -Eq "ep_flex_combine_bwd +collective" "$TMP/validate-flex.txt"; then
  pass "validate prices the flex legs per op"
else fail "validate flex: rc $rc: $(grep -m3 "ep_flex\|cuboid:" "$TMP/validate-flex.txt")"; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

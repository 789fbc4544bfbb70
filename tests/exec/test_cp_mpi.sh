#!/usr/bin/env bash
# cuboid run of context-parallel plans under mpirun (tiny and tiny-moe, CPU
# backend, the fused attention core): CP 2 on 2 ranks and CP 4, CP 2 with
# TP 2 (sequence parallel), with DP 2 and with PP 2 on 4 ranks pass --check
# (the CP ring attention against the whole sequence on one rank) and keep
# their replicas equal; the last CP rank's V weights negated fail the check;
# without dropout CP 1 and CP 2 train to the same mean loss; an MoE model
# with CP 2 and EP 2 runs; the measurements hold the ring's sends and
# validate prices them; calibrate sweeps the CP group's send/recv; the a2a
# exchange is refused with the reason.
# Usage: test_cp_mpi.sh CUBOID_BINARY (run from the source root).
set -u
CUBOID=${1:?usage: test_cp_mpi.sh path/to/cuboid}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

CPU2=topologies/localhost-cpu.json
CPU4=tests/data/clusters/localhost-cpu-4.json

plan() {  # plan NAME MODEL CLUSTER FLAGS...
  local name=$1 model=$2 cluster=$3
  shift 3
  "$CUBOID" plan --model "$model" --cluster "$cluster" --global-batch 8 --micro-batch 1 --recompute none \
    --flash-attention on --out "$TMP/$name.json" "$@" >"$TMP/$name.plan.log" 2>&1 ||
    fail "plan $name: $(tail -3 "$TMP/$name.plan.log")"
}

run_ok() {  # run_ok NAME NP CP [run flags]
  local name=$1 np=$2 cp=$3
  shift 3
  if timeout 120 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 3 --warmup 0 \
      --check --timeout-s 60 --out "$TMP/$name.m.json" "$@" >"$TMP/$name.log" 2>&1; then
    if [ "$cp" -gt 1 ] && ! grep -q "CP $cp ring attention over $((2 * cp)) chunks.* vs unsharded reference.*PASSED" "$TMP/$name.log"; then
      fail "$name: no PASSED CP check line"; cat "$TMP/$name.log"; return; fi
    if ! grep -q "^check: after 3 steps, .*PASSED" "$TMP/$name.log"; then
      fail "$name: replicas drifted apart"; grep "^check" "$TMP/$name.log"; return; fi
    if python3 - "$TMP/$name.m.json" "$np" "$cp" >"$TMP/$name.py.log" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
np_, cp = int(sys.argv[2]), int(sys.argv[3])
assert len(d["ranks"]) == np_
assert d["plan"].get("cp", 1) == cp
cps = sorted({r["coord"]["cp"] for r in d["ranks"]})
assert cps == list(range(cp)), cps
for r in d["ranks"]:
    ops = {o["name"]: o for o in r["ops"]}
    assert "attn_flash" in ops and "attn_flash_bwd" in ops and "attn_qk" not in ops, sorted(ops)
    if cp == 1:
        assert "cp_kv_p2p" not in ops
        continue
    fwd, bwd = ops["cp_kv_p2p"], ops["cp_kv_dkv_p2p_bwd"]
    assert fwd["group"] == "cp" and fwd["group_size"] == cp and fwd["collective"] == "send_recv", fwd
    layers = r["layers"]
    assert fwd["calls_per_step"] == (cp - 1) * layers * d["plan"]["num_micro_batches"], fwd
    assert bwd["calls_per_step"] == cp * layers * d["plan"]["num_micro_batches"], bwd
    for name in ("cp_out_correct", "cp_grad_sum_bwd", "cp_kv_pack"):
        assert name in ops, name
PY
    then pass "$name"; else fail "$name: measurements: $(tail -2 "$TMP/$name.py.log")"; fi
  else
    fail "$name: exit $?"; tail -20 "$TMP/$name.log"
  fi
}

plan cp1 models/tiny.json "$CPU2" --tp 1 --pp 2 --dp 1 --cp 1 --zero 0
plan cp2 models/tiny.json "$CPU2" --tp 1 --pp 1 --dp 1 --cp 2 --zero 1
plan cp4 models/tiny.json "$CPU4" --tp 1 --pp 1 --dp 1 --cp 4 --zero 0
plan t2cp2 models/tiny.json "$CPU4" --tp 2 --pp 1 --dp 1 --cp 2 --sequence-parallel on --zero 0
plan d2cp2 models/tiny.json "$CPU4" --tp 1 --pp 1 --dp 2 --cp 2 --zero 1
plan p2cp2 models/tiny.json "$CPU4" --tp 1 --pp 2 --dp 1 --cp 2 --zero 0
plan moecp2 models/tiny-moe.json "$CPU2" --tp 1 --pp 1 --dp 1 --cp 2 --ep 2 --zero 0 --moe-dispatcher alltoall

run_ok cp1 2 1 --dropout 0
run_ok cp2 2 2 --dropout 0
run_ok cp4 4 4
run_ok t2cp2 4 2
run_ok d2cp2 4 2
run_ok p2cp2 4 2
run_ok moecp2 2 2

# CP only splits each sequence: without dropout, PP 2 and CP 2 of one
# replica (the same sequences) train alike, the mean over the CP ranks'
# losses (each over equally many tokens) equal to the last stage's loss.
python3 - "$TMP/cp1.m.json" "$TMP/cp2.m.json" <<'PY' && pass "CP 2 trains as CP 1 does" || fail "losses differ across CP"
import json, sys
ref = next(r["loss"] for r in json.load(open(sys.argv[1]))["ranks"] if r["coord"]["pp"] == 1)
two = json.load(open(sys.argv[2]))["ranks"]
mean = [sum(x) / len(x) for x in zip(*(r["loss"] for r in two))]
assert ref and len(ref) == len(mean) == 3, (ref, mean)
assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(ref, mean)), (ref, mean)
PY

# The check catches a CP rank whose K/V differ (its V weights negated).
if timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/cp2.json" --backend cpu --steps 1 --check \
    --inject-fault flip-shard >"$TMP/flip.log" 2>&1; then
  fail "flip-shard: the check passed a negated V shard on a CP rank"
elif grep -q "CP 2 ring attention over 4 chunks.*FAILED" "$TMP/flip.log"; then pass "a CP rank's negated V fails the check"
else fail "flip-shard: no FAILED message"; tail -5 "$TMP/flip.log"; fi

# validate reads the ring's sends and prices them over the CP group.
"$CUBOID" validate --plan "$TMP/cp2.json" --measurements "$TMP/cp2.m.json" --cluster "$CPU2" --ops >"$TMP/validate.txt" 2>&1
rc=$?
if [ $rc -le 1 ] && grep -Eq "cp_kv_p2p +p2p +[0-9]+ +0\.0*[1-9]" "$TMP/validate.txt"; then
  pass "validate prices the CP ring's sends"
else fail "validate: rc $rc: $(grep -m3 "cp_kv\|cuboid:" "$TMP/validate.txt")"; fi

# Refused with the reason, before any work: the a2a exchange.
plan a2a models/tiny.json "$CPU2" --tp 1 --pp 1 --dp 1 --cp 2 --cp-comm-type a2a --zero 0
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/a2a.json" --backend cpu >"$TMP/a2a.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "parallel.cp_comm: the executor does not run context parallelism's a2a exchange" "$TMP/a2a.log"; then
  pass "CP's a2a exchange is refused"; else fail "a2a: rc $rc $(tail -2 "$TMP/a2a.log")"; fi

# calibrate sweeps a CP plan: the ring's kernels and the CP group's send/recv.
timeout 120 "${MPIRUN[@]}" -np 2 "$CUBOID" calibrate --backend cpu --plan "$TMP/cp2.json" --cluster "$CPU2" --quick \
  --out "$TMP/cal.json" >"$TMP/cal.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && python3 - "$TMP/cal.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["calibration"]
for k in ("cp_out_correct", "cp_grad_sum_bwd"):
    assert k in c["kernels"], (k, sorted(c["kernels"]))
assert any(x["collective"] == "send_recv" and x["group_size"] == 2 for x in c["collectives"]), c["collectives"]
PY
then pass "calibrate measures the CP ring's kernels and its send/recv"; else fail "calibrate: rc $rc $(tail -2 "$TMP/cal.log")"; fi

echo "$failures failure(s)"
[ "$failures" -eq 0 ]

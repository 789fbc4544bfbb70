#!/usr/bin/env bash
# cuboid calibrate under mpirun -np 2 on the tiny model's TP 2 plan (--quick):
# the nccl-tests tables and the fits are printed, no collective result is
# wrong, the calibrated card loads in cuboid simulate, the raw samples are
# well-formed; a plan for another world size is refused (exit 2).
# Usage: test_calibrate_mpi.sh CUBOID_BINARY (run from the source root).
set -u
CUBOID=${1:?usage: test_calibrate_mpi.sh path/to/cuboid}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

CPU2=topologies/localhost-cpu.json
"$CUBOID" plan --model models/tiny.json --cluster "$CPU2" --nodes 1 --global-batch 4 --micro-batch 1 \
  --tp 2 --pp 1 --dp 1 --sequence-parallel on --out "$TMP/tp2.json" >"$TMP/plan.log" 2>&1 || fail "plan tp2"
CPU4=tests/data/clusters/localhost-cpu-4.json
"$CUBOID" plan --model models/tiny.json --cluster "$CPU4" --nodes 1 --global-batch 4 --micro-batch 1 \
  --tp 2 --pp 2 --dp 1 --schedule 1f1b --out "$TMP/four.json" >"$TMP/plan4.log" 2>&1 || fail "plan 4 ranks"

start=$(date +%s)
if timeout 120 "${MPIRUN[@]}" -np 2 "$CUBOID" calibrate --backend cpu --plan "$TMP/tp2.json" --cluster "$CPU2" \
    --quick --timeout-s 60 --out "$TMP/cal.json" --raw "$TMP/raw.json" >"$TMP/cal.log" 2>&1; then
  pass "calibrate --quick, 2 ranks ($(( $(date +%s) - start )) s)"
else
  fail "calibrate exit $?"; tail -30 "$TMP/cal.log"
fi

# The nccl-tests table: header, one row per size with 9 columns, and no wrong element.
grep -q "#       size         count      type   redop    root     time   algbw   busbw" "$TMP/cal.log" \
  && pass "nccl-tests header" || fail "no nccl-tests header"
for c in all_reduce reduce_scatter all_gather broadcast send_recv all_to_all; do
  grep -q "^# $c: tp groups of 2 ranks (intra_node), float" "$TMP/cal.log" && pass "table $c" || fail "no $c table"
done
awk '/^ +[0-9]+ +[0-9]+ +float/ { rows++; if (NF != 9 || $9 != 0) bad++ } END { exit !(rows >= 20 && bad == 0) }' \
  "$TMP/cal.log" && pass "table rows well-formed, #wrong 0" || fail "table rows: $(grep -c float "$TMP/cal.log") rows"
# Every collective is fitted or reported as rejected (a noisy machine may give a
# time that falls as the size grows; the reader refuses such a fit).
grep -q "^collective *tier *ranks *buffers *alpha(us) busbw(GB/s)" "$TMP/cal.log" || fail "no collective fit table"
# Each collective in both cache states: hot (the layers' exchanges) and cold (the DP collectives).
for c in all_reduce reduce_scatter all_gather broadcast send_recv all_to_all; do
  grep -q "^# $c: tp groups of 2 ranks (intra_node), float, cold buffers" "$TMP/cal.log" \
    && pass "cold table $c" || fail "no cold $c table"
  for state in hot cold; do
    suffix=; [ "$state" = cold ] && suffix=.cold
    grep -Eq "^$c +intra_node +2 +$state |not calibrated .*collectives\.$c\.intra_node\.2$suffix:" "$TMP/cal.log" \
      && pass "fit $c ($state)" || fail "collective $c ($state) neither fitted nor rejected"
  done
done
grep -Eq "^GEMM operands rotated over [0-9.]+ MiB" "$TMP/cal.log" && pass "GEMM operand pool reported" \
  || fail "no GEMM operand pool line"
grep -Eq "^norm_in +[0-9.]+ +[0-9.]+ |not calibrated .*kernel norm_in:" "$TMP/cal.log" && pass "kernel fit" \
  || fail "kernel norm_in neither fitted nor rejected"
grep -q "^GEMM: [0-9]* shapes; achieved TFLOP/s" "$TMP/cal.log" && pass "GEMM summary" || fail "no GEMM summary"
# Pooled (isotonic) series are reported as such, e.g. "made monotone (isotonic regression): kernel act_bwd: 2 of 3 medians pooled ...".
if grep -q "^made monotone" "$TMP/cal.log"; then
  grep -Eq "^made monotone \(isotonic regression\): .+: [0-9]+ of [0-9]+ medians pooled \(time fell as the size grew\)$" \
    "$TMP/cal.log" && pass "isotonic adjustments reported" || fail "made-monotone line malformed"
fi

python3 - "$TMP/cal.json" "$TMP/raw.json" <<'PY' && pass "card and raw samples well-formed" || fail "card / raw"
import json, sys
card, raw = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
cal = card["calibration"]
assert cal["schema"] == "cuboid.calibration/1", cal["schema"]
assert "calibrated by cuboid calibrate" in card["description"].lower(), card["description"]
assert card["gpus_per_node"]["value"] == 2  # the input card is kept
assert cal["activation_bytes_per_element"] == 4, cal.get("activation_bytes_per_element")  # cpu: f32
# Stored series are monotone (calibrate pools noisy medians; the loader checks).
for series in list(cal["kernels"].values()) + cal["collectives"]:
    t = [x["time_us"] for x in series["samples"]]
    assert all(a <= b for a, b in zip(t, t[1:])), t
# Both cache states (a noisy machine may leave a fit out: each series is fitted or
# rejected, checked above), and the GEMM sweep's operand pool (the plan's step working set).
states = {c.get("buffers", "hot") for c in cal["collectives"]}
assert states == {"hot", "cold"}, states
assert 1 << 20 <= cal["gemm_operand_pool_bytes"] <= 64 << 20, cal["gemm_operand_pool_bytes"]
assert len(raw["ranks"]) == 2
for r in raw["ranks"]:
    assert len(r["gemms"]) > 0 and all(g[4] > 0 for g in r["gemms"])
    names = {k[0] for k in r["kernels"]}
    # The layer's kernels; the optimizer's and the gradient buffer's; the
    # embedding's backward (each timed alone, as the step runner calls it).
    for op in ("norm_in", "act", "attn_softmax_bwd", "drop_add_mlp", "adam", "grad_scale", "grad_zero", "embed_grad"):
        assert op in names, (op, names)
    # The unfused plan's card carries the fused core's blocks too (what a
    # --flash-attention on or CP plan planned with it runs), keyed by FLOPs.
    for op in ("attn_flash", "attn_flash_bwd"):
        assert op in names, (op, names)
    fwd = sorted(k[1] for k in r["kernels"] if k[0] == "attn_flash")
    bwd = sorted(k[1] for k in r["kernels"] if k[0] == "attn_flash_bwd")
    assert bwd == [2.5 * f for f in fwd], (fwd, bwd)
    # grad_scale reads and writes what grad_zero writes: 8 against 4 bytes per element.
    scale = sorted(k[1] for k in r["kernels"] if k[0] == "grad_scale")
    zero = sorted(k[1] for k in r["kernels"] if k[0] == "grad_zero")
    assert scale == [2 * b for b in zero], (scale, zero)
    assert all(c["wrong"] == 0 and c["time_ns"] > 0 for c in r["collectives"])
# The layer's dense GEMMs are timed in the layer, at each of the sweep's sizes
# (--quick: 64, 128 and 256 tokens): TP 2 with SP gathers the 128 tokens of a
# micro-batch, so fc1 is [m, 1024 / 2] x [256], qkv [m, 3 * 256 / 2] x [256],
# the attention's scores [128, 128] x [32] for 8 / 2 heads; the grid around
# them stays the GEMM sweep's.
by_shape = {(g["m"], g["n"], g["k"], g["batch"]): g.get("source", "") for g in cal["gemms"]}
layer = "timed in the executor's layer"
for m in (64, 128, 256):
    assert by_shape.get((m, 512, 256, 1)) == layer, ("fc1", m, by_shape.get((m, 512, 256, 1)))
    assert by_shape.get((m, 384, 256, 1)) == layer, ("qkv", m, by_shape.get((m, 384, 256, 1)))
assert by_shape.get((128, 128, 32, 4)) == layer, by_shape.get((128, 128, 32, 4))
assert sum(1 for s in by_shape.values() if s == layer) < len(by_shape), "the grid stays the sweep's"
PY

if "$CUBOID" simulate --plan "$TMP/tp2.json" --cluster "$TMP/cal.json" >"$TMP/sim.log" 2>&1; then
  pass "simulate with the calibrated card"
else
  fail "simulate with the calibrated card: $(tail -3 "$TMP/sim.log")"
fi

# A plan for 4 ranks under 2 ranks: refused (exit 2) before any measurement.
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" calibrate --backend cpu --plan "$TMP/four.json" --cluster "$CPU4" --quick \
  --out "$TMP/bad.json" >"$TMP/bad.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "the plan needs TP 2 x PP 2 x DP 1 = 4 ranks but 2 were launched" "$TMP/bad.log" \
    && [ ! -e "$TMP/bad.json" ]; then
  pass "wrong world size refused"
else
  fail "wrong world size: exit $rc: $(tail -3 "$TMP/bad.log")"
fi

# Four ranks on this machine's cores, consecutive ranks on one core (as
# tools/calibrate-local binds them): the ranks wait with yield, the GEMMs are
# timed in turns, and the card records the share when ranks outnumber cores.
cores=$(nproc)
for r in 0 1 2 3; do echo "rank $r=localhost slot=$((r * cores / 4 % cores))"; done >"$TMP/rankfile"
start=$(date +%s)
if timeout 180 "${MPIRUN[@]}" --rankfile "$TMP/rankfile" -np 4 "$CUBOID" calibrate --backend cpu --plan "$TMP/four.json" \
    --cluster "$CPU4" --quick --repeat 2 --timeout-s 120 --out "$TMP/cal4.json" >"$TMP/cal4.log" 2>&1; then
  pass "calibrate --quick --repeat 2, 4 ranks ($(( $(date +%s) - start )) s)"
else
  fail "calibrate 4 ranks: exit $?"; tail -30 "$TMP/cal4.log"
fi
python3 - "$TMP/cal4.json" "$TMP/cal.json" "$cores" <<'PY' && pass "ranks_per_core recorded" || fail "ranks_per_core"
import json, sys
four, two, cores = json.load(open(sys.argv[1]))["calibration"], json.load(open(sys.argv[2]))["calibration"], int(sys.argv[3])
assert four["ranks"] == 4
assert abs(four["ranks_per_core"] - max(1.0, 4 / cores)) < 1e-12, (four["ranks_per_core"], cores)
assert two["ranks_per_core"] == max(1.0, 2 / cores), two["ranks_per_core"]
assert ("MPI waits: yield" in four["created_by"]) == (cores < 4), four["created_by"]
# Ranks that share a core time GEMMs in turns only: none comes from the layer.
assert all(g.get("source", "") != "timed in the executor's layer" for g in four["gemms"]) or cores >= 4
PY
if [ "$cores" -lt 4 ]; then
  grep -Eq "^cuboid calibrate: [0-9.]+ ranks per core \(MPI waits: yield\): GEMMs and the optimizer timed in 2 turns" \
    "$TMP/cal4.log" && pass "shared cores reported" || fail "no ranks-per-core line: $(head -3 "$TMP/cal4.log")"
fi
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" calibrate --backend cpu --plan "$TMP/tp2.json" --cluster "$CPU2" --quick \
  --repeat 0 --out "$TMP/bad0.json" >"$TMP/bad0.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] && grep -q "command line: --repeat: is 0 (fix: give 1 to 100 (3 on a noisy machine))" "$TMP/bad0.log" \
  && pass "--repeat 0 refused" || fail "--repeat 0: exit $rc: $(tail -2 "$TMP/bad0.log")"

[ "$failures" -eq 0 ] && echo "all calibrate MPI tests passed" || echo "$failures calibrate MPI test(s) failed"
exit $((failures > 0))

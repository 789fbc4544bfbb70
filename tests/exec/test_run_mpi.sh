#!/usr/bin/env bash
# cuboid run under mpirun on the tiny model with the CPU backend: TP, PP, DP
# and 2 x 2 x 1 plans run, pass --check and write well-formed measurements;
# an injected sharding bug fails the check; a wrong world size is refused;
# a killed or hung rank ends the whole job within the timeout; ranks given
# different plans are refused at start-up.
# Usage: test_run_mpi.sh CUBOID_BINARY (run from the source root).
set -u
CUBOID=${1:?usage: test_run_mpi.sh path/to/cuboid}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

plan() {  # plan NAME CLUSTER FLAGS...
  local name=$1 cluster=$2
  shift 2
  "$CUBOID" plan --model models/tiny.json --cluster "$cluster" --nodes 1 --global-batch 4 --micro-batch 1 \
    --out "$TMP/$name.json" "$@" >"$TMP/$name.plan.log" 2>&1 || { fail "plan $name: $(tail -3 "$TMP/$name.plan.log")"; }
}

# check_measurements FILE RANKS STEPS: schema, one entry per rank, timings per op and step.
check_measurements() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, os, sys
path, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = json.load(open(path))
assert d["schema"] == "cuboid.measurements/1", d["schema"]
assert len(d["ranks"]) == ranks, len(d["ranks"])
assert d["iteration_time_s"] > 0
for k in ("backend", "compute_dtype", "mpi_library", "hostnames"):
    assert k in d["environment"], k
assert sorted(r["rank"] for r in d["ranks"]) == list(range(ranks))
for r in d["ranks"]:
    assert len(r["step_seconds"]) == steps, r["step_seconds"]
    assert r["iteration"]["median_s"] > 0 and r["iteration"]["min_s"] <= r["iteration"]["max_s"]
    names = {o["name"] for o in r["ops"]}
    for op in ("qkv", "fc1", "fc2_wgrad", "adam"):
        assert op in names, (op, sorted(names))
    for o in r["ops"]:
        assert len(o["step_seconds"]) == steps and o["calls_per_step"] >= 1
        if o["kind"] == "gemm":
            assert o["shape"]["m"] > 0 and o["flops_per_call"] > 0
        if o["kind"] in ("collective", "p2p"):
            assert o["group"] in ("tp", "pp", "dp") and o["bytes_per_call"] >= 0
    assert r["achieved_tflops"] > 0
    # The executor holds its host memory (cuboid/exec/host_memory.hpp): after
    # the warm-up no buffer of the step and no MPI temporary touches fresh
    # pages (before, the ZeRO-1 reduce-scatter's 14.7 MB buffer faulted 3,557
    # pages every step on rank 0). Under AddressSanitizer (tools/test-sanitize
    # sets ASAN_OPTIONS) its own allocator and quarantine decide instead.
    faults = r["page_faults_per_step"]
    assert len(faults) == steps and all(isinstance(f, int) and f >= 0 for f in faults), faults
    if "ASAN_OPTIONS" in os.environ:
        assert d["environment"]["host_memory"].startswith("AddressSanitizer's allocator"), d["environment"]
    else:
        assert d["environment"]["host_memory"].startswith("glibc malloc, freed memory kept"), d["environment"]
        assert max(faults) < 256, (r["rank"], faults)
    # DP gradients travel as fp32 (4 bytes per parameter of the bucket).
    for o in r["ops"]:
        if o["name"] in ("dp_ar_grads", "dp_rs_grads"):
            assert d["environment"]["grad_dtype"] == "f32"
            assert o["bytes_per_call"] % 4 == 0 and o["bytes_per_call"] > 0, o
PY
}

run_ok() {  # run_ok NAME NP RANKS [extra flags]
  local name=$1 np=$2
  shift 2
  if timeout 90 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 2 --warmup 1 \
      --check --timeout-s 60 --out "$TMP/$name.m.json" "$@" >"$TMP/$name.log" 2>&1; then
    if ! grep -q "vs unsharded reference.*PASSED" "$TMP/$name.log"; then fail "$name: no PASSED check line"; cat "$TMP/$name.log"; return; fi
    if ! grep -q "^check: after 3 steps, .*PASSED" "$TMP/$name.log"; then
      fail "$name: the weights replicated over TP / DP drifted apart"; grep "^check" "$TMP/$name.log"; return; fi
    if check_measurements "$TMP/$name.m.json" "$np" 2 >"$TMP/$name.py.log" 2>&1; then pass "$name"; else
      fail "$name: measurements: $(tail -2 "$TMP/$name.py.log")"; fi
  else
    fail "$name: exit $?"; tail -20 "$TMP/$name.log"
  fi
}

CPU2=topologies/localhost-cpu.json
CPU4=tests/data/clusters/localhost-cpu-4.json
plan tp2 "$CPU2" --tp 2 --pp 1 --dp 1 --sequence-parallel on
plan tp2nosp "$CPU2" --tp 2 --pp 1 --dp 1 --sequence-parallel off --recompute full
plan pp2 "$CPU2" --tp 1 --pp 2 --dp 1 --schedule 1f1b
plan pp2gpipe "$CPU2" --tp 1 --pp 2 --dp 1 --schedule gpipe --recompute selective --flash-attention off
plan dp2 "$CPU2" --tp 1 --pp 1 --dp 2 --zero 0
plan dp2zero1 "$CPU2" --tp 1 --pp 1 --dp 2 --zero 1
plan t2p2 "$CPU4" --tp 2 --pp 2 --dp 1 --schedule 1f1b
# Sequence parallelism with DP: the norms' gradients must be all-reduced over TP.
plan t2d2sp "$CPU4" --tp 2 --pp 1 --dp 2 --sequence-parallel on --zero 1
# The same plan with the interleaved schedule (2 model chunks per stage).
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["parallel"].update(schedule="interleaved", virtual_stages=2); json.dump(d, open(sys.argv[2], "w"))' \
  "$TMP/t2p2.json" "$TMP/t2p2i.json" || fail "interleaved plan"
# Uneven stages in interleaved chunks (Megatron-Core's rule): 6 layers on PP 2
# in 2 chunks per stage are 4 + 2, chunks of 2 and 1 layers in virtual-stage
# order (layers 0-1 | 2 | 3-4 | 5).
python3 -c 'import json,sys; d=json.load(open("models/tiny.json")); d["num_layers"]=6; d["name"]="tiny-6"; json.dump(d, open(sys.argv[1], "w"))' \
  "$TMP/tiny6.json" || fail "6-layer model"
"$CUBOID" plan --model "$TMP/tiny6.json" --cluster "$CPU2" --nodes 1 --global-batch 4 --micro-batch 1 --tp 1 --pp 2 --dp 1 \
  --vpp 2 --uneven-stages --out "$TMP/pp2vu.json" >"$TMP/pp2vu.plan.log" 2>&1 || fail "plan pp2vu: $(tail -3 "$TMP/pp2vu.plan.log")"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["parallel"]; assert (p["virtual_stages"], p["first_stage_layers"], p["last_stage_layers"]) == (2, 4, 2), p' \
  "$TMP/pp2vu.json" && pass "pp2vu: 6 layers on PP 2 in 2 chunks split 4 + 2" || fail "pp2vu: the split"
# Megatron-Core's split that counts the embedding and the loss as layers: 4
# layers + 2 on PP 2 in 3 chunks per stage, one slot each (the first chunk
# holds the embedding alone, the last the loss alone).
plan pp2split "$CPU2" --tp 1 --pp 2 --dp 1 --vpp 3 --account-for-embedding-in-pipeline-split \
  --account-for-loss-in-pipeline-split
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["parallel"]; assert (p["virtual_stages"], p["embedding_in_pipeline_split"], p["loss_in_pipeline_split"]) == (3, True, True), p' \
  "$TMP/pp2split.json" && pass "pp2split: the embedding and the loss counted in the split" || fail "pp2split: the plan file"

run_ok tp2 2
run_ok pp2split 2
run_ok tp2nosp 2
run_ok pp2 2
run_ok pp2gpipe 2
run_ok pp2vu 2
# Megatron's batches: after each schedule step, its send with the next step's
# receive, timed as one op; no send waits for a later receive.
python3 - "$TMP/pp2.m.json" <<'PY' && pass "pp2: pipeline exchanges batched per schedule step" || fail "pp2: pipeline op names"
import json, sys
d = json.load(open(sys.argv[1]))
names = {r["coord"]["pp"]: {o["name"] for o in r["ops"] if o["name"].startswith("pp_")} for r in d["ranks"]}
assert "pp_send_fwd_recv_bwd" in names[0] and "pp_send_bwd_recv_fwd" in names[1], names
assert not any("wait" in n for s in names.values() for n in s), names
PY
run_ok dp2 2
run_ok dp2zero1 2
run_ok t2p2 4 --layers 2 --seq-length 64
run_ok t2d2sp 4 --layers 2 --seq-length 64
# Every way of waiting computes the same thing; the policy is recorded.
cp "$TMP/tp2.json" "$TMP/tp2yield.json"
cp "$TMP/tp2.json" "$TMP/tp2sleep.json"
cp "$TMP/t2p2.json" "$TMP/t2p2sleep.json"
run_ok tp2yield 2 --mpi-wait yield
run_ok tp2sleep 2 --mpi-wait sleep
run_ok t2p2sleep 4 --layers 2 --seq-length 64 --mpi-wait sleep
python3 - "$TMP" "$(nproc)" <<'PY' && pass "the wait policy is recorded (auto: yield when ranks outnumber cores)" \
  || fail "environment.mpi_wait"
import json, sys
tmp, cores = sys.argv[1], int(sys.argv[2])
wait = lambda name: json.load(open(f"{tmp}/{name}.m.json"))["environment"]["mpi_wait"]
assert wait("tp2yield") == "yield" and wait("tp2sleep") == "sleep" and wait("t2p2sleep") == "sleep"
assert wait("tp2") == ("spin" if cores >= 2 else "yield"), wait("tp2")
assert wait("t2p2") == ("spin" if cores >= 4 else "yield"), wait("t2p2")
PY
timeout 30 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu --mpi-wait poll >"$TMP/poll.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "command line: --mpi-wait: is 'poll' (fix: use auto, spin, yield or sleep)" "$TMP/poll.log" \
  && pass "--mpi-wait poll exits 2" || fail "--mpi-wait poll: rc $rc: $(tail -2 "$TMP/poll.log")"
run_ok t2p2i 4

# FP8 plans (the plan file's precision; the CPU card prices no FP8, the
# executor emulates it): the linear layers' GEMMs on FP8-rounded operands,
# checked against the unquantized layer at FP8's tolerance (0.25), and
# measurably off the f32 layer (the quantization is applied).
for prec in fp8-current mxfp8; do
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["parallel"]["precision"]=sys.argv[3]; json.dump(d, open(sys.argv[2], "w"))' \
    "$TMP/tp2.json" "$TMP/tp2-$prec.json" "$prec" || fail "$prec plan"
  run_ok "tp2-$prec" 2
  python3 - "$TMP/tp2-$prec.m.json" "$prec" <<'PY' && pass "tp2-$prec: FP8 error above f32's, within 0.25" || fail "tp2-$prec: the check's figures"
import json, sys
c = json.load(open(sys.argv[1]))["check"]
assert c["tolerance"] == 0.25, c
assert 1e-4 < c["attention_relative_error"] < 0.25 and 1e-4 < c["layer_relative_error"] < 0.25, c
print(sys.argv[2], c["attention_relative_error"], c["layer_relative_error"])
PY
done
if timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/tp2-fp8-current.json" --backend cpu --steps 1 --check \
    --inject-fault flip-shard >"$TMP/flip8.log" 2>&1; then
  fail "flip-shard fp8: the check passed a flipped weight shard at FP8's tolerance"
elif grep -q "FAILED" "$TMP/flip8.log"; then pass "flip-shard fails the FP8 check too"; else
  fail "flip-shard fp8: no FAILED message"; tail -5 "$TMP/flip8.log"; fi

# The check catches a sharding bug: one TP rank's FC2 shard negated.
if timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu --steps 1 --check \
    --inject-fault flip-shard >"$TMP/flip.log" 2>&1; then
  fail "flip-shard: the check passed a flipped weight shard"
elif grep -q "FAILED" "$TMP/flip.log"; then pass "flip-shard fails the check"; else
  fail "flip-shard: no FAILED message"; tail -5 "$TMP/flip.log"; fi

# A wrong world size is refused before any work, naming the sizes.
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/t2p2.json" --backend cpu >"$TMP/ws.log" 2>&1
if grep -q "the plan needs TP 2 x PP 2 x DP 1 = 4 ranks but 2 were launched" "$TMP/ws.log"; then
  pass "world size 2 for a 4-rank plan is refused"; else fail "bad world size: $(tail -3 "$TMP/ws.log")"; fi
# Without a launcher: one rank, refused for a 2-rank plan; WORLD_SIZE=2 asks for MPI.
"$CUBOID" run --plan "$TMP/tp2.json" --backend cpu >"$TMP/ws1.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "but 1 were launched" "$TMP/ws1.log"; then pass "standalone run of a 2-rank plan exits 2"; else
  fail "standalone: rc $rc $(cat "$TMP/ws1.log")"; fi
WORLD_SIZE=2 RANK=0 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu >"$TMP/ws2.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "mpirun -np 2" "$TMP/ws2.log"; then pass "torchrun-style WORLD_SIZE=2 without MPI exits 2"; else
  fail "WORLD_SIZE=2: rc $rc $(cat "$TMP/ws2.log")"; fi

# Faults end the whole job within the timeout, exit non-zero, name the rank
# and the op, and leave no measurements file (not even a partial one): a
# killed rank (the launcher stops the others; they say which op they were in),
# a hung one (a watchdog, the hung rank's own or a peer's, aborts the job).
for case in "kill:1 2 pp2" "hang:1 2 pp2" "kill:2 4 t2p2"; do
  read -r fault np name <<<"$case"
  rm -f "$TMP/fault.m.json"
  start=$(date +%s)
  timeout 60 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 2 --timeout-s 3 \
    --layers 2 --seq-length 64 --inject-fault "$fault" --out "$TMP/fault.m.json" >"$TMP/fault.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 30 ]; then
    fail "$fault: rc $rc after ${took}s"; tail -5 "$TMP/fault.log"
  elif [ -e "$TMP/fault.m.json" ] || ls "$TMP"/.fault.m.json.tmp.* >/dev/null 2>&1; then
    fail "$fault: a measurements file was written"
  elif [ "$fault" = hang:1 ] && ! grep -q "rank [01]: op '[a-z_]*' did not finish within --timeout-s 3 s" "$TMP/fault.log"; then
    fail "$fault: no watchdog message naming the rank and the op"; tail -8 "$TMP/fault.log"
  elif [ "${fault%%:*}" = kill ] && ! { grep -q "process rank ${fault#kill:} .*signal 9" "$TMP/fault.log" &&
      grep -q "rank [0-9]: stopped by SIGTERM .* while in op '[a-z_]*'" "$TMP/fault.log"; }; then
    fail "$fault: the messages do not name the dead rank and the survivor's op"; tail -12 "$TMP/fault.log"
  else
    pass "$fault of $np ranks ends the job (rc $rc, ${took}s), names the rank and the op, no measurements"
  fi
done

# A rank that throws (as one running out of device memory would) prints its
# error and ends the job at once: not after unwinding, which would wait for
# the peers blocked on it, and not after the peers' --timeout-s.
for name in pp2 t2p2; do
  np=2; [ "$name" = t2p2 ] && np=4
  rm -f "$TMP/throw.m.json"
  start=$(date +%s)
  timeout 90 "${MPIRUN[@]}" -np "$np" "$CUBOID" run --plan "$TMP/$name.json" --backend cpu --steps 2 --timeout-s 60 \
    --layers 2 --seq-length 64 --inject-fault throw:1 --out "$TMP/throw.m.json" >"$TMP/throw.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ] && [ ! -e "$TMP/throw.m.json" ] &&
      grep -q "cuboid: rank 1: .*injected failure: this rank threw (as cudaMalloc running out of memory would).*; ending the job" "$TMP/throw.log"; then
    pass "a rank that throws ends the $np-rank job (rc $rc, ${took}s, --timeout-s 60) with its own message first"
  else fail "throw:1 on $name: rc $rc after ${took}s: $(tail -4 "$TMP/throw.log")"; fi
done

# A rank that never reaches the communicators' creation: the others' watchdog
# ends the job instead of waiting in MPI_Comm_dup (ncclCommInitRank on GPUs).
start=$(date +%s)
timeout 60 "${MPIRUN[@]}" -np 2 "$CUBOID" run --plan "$TMP/pp2.json" --backend cpu --steps 1 --timeout-s 3 \
  --inject-fault stall-setup:1 >"$TMP/stall.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ] &&
    grep -q "rank 0: op 'creating the communicators (ncclCommInitRank / MPI_Comm_dup)' did not finish within --timeout-s 3 s" "$TMP/stall.log"; then
  pass "a rank that never creates its communicators ends the job (rc $rc, ${took}s)"
else fail "stall-setup:1: rc $rc after ${took}s: $(tail -4 "$TMP/stall.log")"; fi

# Every rank must run the same plan: a rank given another plan file (or other
# sizes) would call other collectives and hang the job, so start-up refuses,
# naming the ranks and their files; nothing is written.
rm -f "$TMP/mpmd.m.json"
timeout 60 "${MPIRUN[@]}" -np 1 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu --out "$TMP/mpmd.m.json" : \
  -np 1 "$CUBOID" run --plan "$TMP/pp2.json" --backend cpu --out "$TMP/mpmd.m.json" >"$TMP/mpmd.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ ! -e "$TMP/mpmd.m.json" ] &&
    grep -q "the ranks were not given the same plan and sizes: rank 0 runs $TMP/tp2.json (fingerprint [0-9a-f]*); rank 1 runs $TMP/pp2.json" "$TMP/mpmd.log"; then
  pass "a rank with another plan file is refused at start-up (rc $rc)"
else fail "different plan files: rc $rc $(tail -4 "$TMP/mpmd.log")"; fi
timeout 60 "${MPIRUN[@]}" -np 1 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu --steps 2 : \
  -np 1 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu --steps 3 >"$TMP/mpmd2.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 0 runs $TMP/tp2.json (fingerprint [0-9a-f]*); rank 1 runs $TMP/tp2.json" "$TMP/mpmd2.log"; then
  pass "ranks with different --steps are refused at start-up"
else fail "different --steps: rc $rc $(tail -4 "$TMP/mpmd2.log")"; fi

# torchrun-style variables: the world size is checked against the plan before
# anything starts (no rendezvous is attempted: MASTER_PORT 1 is never dialled).
WORLD_SIZE=4 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$CUBOID" run --plan "$TMP/tp2.json" --backend cpu >"$TMP/ws4.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "the plan needs TP 2 x PP 1 x DP 1 = 2 ranks but 4 were launched" "$TMP/ws4.log"; then
  pass "torchrun-style WORLD_SIZE=4 for a 2-rank plan exits 2 before any work"; else
  fail "WORLD_SIZE=4: rc $rc $(cat "$TMP/ws4.log")"; fi

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all passed"

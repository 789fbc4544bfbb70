#!/usr/bin/env bash
# The CUDA backend as a module (src/exec/cuda_module.hpp), in a build with the
# gpu feature: the cuboid binary links no CUDA library and loads none for
# --version or plan --help; --backend cuda loads cuboid-cuda.so from beside
# the binary and refuses as before without a GPU; a binary without the module
# refuses with the module's path.
# Usage: test_cuda_module.sh CUBOID_BINARY CUDA_MODULE (run from the source root).
set -u
CUBOID=${1:?usage: test_cuda_module.sh path/to/cuboid path/to/cuboid-cuda.so}
MODULE=${2:?usage: test_cuda_module.sh path/to/cuboid path/to/cuboid-cuda.so}
# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"
cuda_libs='^(libcudart|libcublas|libcublasLt|libnccl|libcuda)\.so'

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

# 1. The binary's own dependencies: no CUDA library; the module has them.
linked=$(needed "$CUBOID" | grep -E "$cuda_libs" | tr '\n' ' ')
if [[ -z $linked ]]; then pass "cuboid links no CUDA library"; else fail "cuboid links $linked"; fi
for lib in libcudart libcublas libnccl; do
  if needed "$MODULE" | grep -q "^$lib\.so"; then pass "the module links $lib"; else fail "the module does not link $lib"; fi
done

# 2. What the dynamic loader initialises (LD_DEBUG=libs) for commands that
# run no backend; run --backend cuda below is the control that it sees one.
initialised() {  # initialised LOG_PREFIX: the CUDA libraries and modules the run's log shows
  cat "$1".* 2>/dev/null | sed -n 's/.*calling init: //p' |
    grep -E '/(libcudart|libcublas|libcublasLt|libnccl|libcuda|cuboid-cuda)\.so' | xargs -rn1 basename | sort -u | tr '\n' ' '
}
for args in "--version" "plan --help"; do
  log=$TMP/ld-${args// /-}
  # shellcheck disable=SC2086
  LD_DEBUG=libs LD_DEBUG_OUTPUT=$log "$CUBOID" $args >/dev/null 2>&1
  opened=$(initialised "$log")
  if [[ -z $opened ]]; then pass "cuboid $args loads no CUDA library"; else fail "cuboid $args loads $opened"; fi
done

# 3. --backend cuda with no GPU visible: the module loads (every symbol it
# takes from the binary resolved at once, RTLD_NOW), cudaGetDeviceCount
# answers 0 and the run is refused as it was when the backend was linked in.
# The plan: one rank (needing no launcher), the localhost card cut to one rank.
python3 - topologies/localhost-cpu.json "$TMP/one-rank.json" <<'PY'
import json, sys
card = json.load(open(sys.argv[1]))
card["gpus_per_node"]["value"] = 1
json.dump(card, open(sys.argv[2], "w"))
PY
"$CUBOID" plan --model models/tiny.json --cluster "$TMP/one-rank.json" --global-batch 2 --micro-batch 1 \
  --out "$TMP/plan.json" >"$TMP/plan.log" 2>&1 || fail "plan: $(tail -3 "$TMP/plan.log")"
no_gpu="cuboid: environment: CUDA_VISIBLE_DEVICES: this rank sees no NVIDIA GPU (CUDA_VISIBLE_DEVICES=) (fix: run on a GPU node, and check that the launcher does not hide every GPU from the ranks)"
CUDA_VISIBLE_DEVICES='' LD_DEBUG=libs LD_DEBUG_OUTPUT=$TMP/ld-run "$CUBOID" run --plan "$TMP/plan.json" --backend cuda \
  --steps 1 >"$TMP/run.out" 2>"$TMP/run.err"
rc=$?
opened=$(initialised "$TMP/ld-run")
if [[ $opened == *cuboid-cuda.so* && $opened == *libcublas.so* ]]; then
  pass "run --backend cuda loads $opened"
else
  fail "run --backend cuda loads '$opened', not the module"
fi
if [[ $rc == 2 && $(cat "$TMP/run.err") == "$no_gpu" ]]; then
  pass "run --backend cuda without a GPU: exit 2, the same message"
else
  fail "run --backend cuda without a GPU: exit $rc: $(cat "$TMP/run.err")"
fi

# 4. The binary without its module beside it.
mkdir "$TMP/alone"
cp "$CUBOID" "$TMP/alone/cuboid"
CUDA_VISIBLE_DEVICES='' "$TMP/alone/cuboid" run --plan "$TMP/plan.json" --backend cuda --steps 1 >"$TMP/alone.out" 2>"$TMP/alone.err"
rc=$?
missing="cuboid: command line: --backend: this build's CUDA backend cuboid-cuda.so is missing (looked for $TMP/alone/cuboid-cuda.so,"
if [[ $rc == 2 && $(head -c ${#missing} "$TMP/alone.err") == "$missing" ]]; then
  pass "without the module: exit 2, names where it looked"
else
  fail "without the module: exit $rc: $(cat "$TMP/alone.err")"
fi

# 5. A module that does not load (not an ELF file) is refused with dlopen's reason.
echo "not a module" >"$TMP/alone/cuboid-cuda.so"
CUDA_VISIBLE_DEVICES='' "$TMP/alone/cuboid" run --plan "$TMP/plan.json" --backend cuda --steps 1 >"$TMP/bad.out" 2>"$TMP/bad.err"
rc=$?
if [[ $rc == 2 ]] && grep -q "^cuboid: command line: --backend: the CUDA backend $TMP/alone/cuboid-cuda.so does not load: " "$TMP/bad.err"; then
  pass "a broken module: exit 2, dlopen's reason"
else
  fail "a broken module: exit $rc: $(cat "$TMP/bad.err")"
fi

[[ $failures == 0 ]] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"

#!/usr/bin/env python3
"""tools/lib/moe_recipes.py: a recipe row's flags, placement, the recipes'
own layout check and the relaxing of each refusal, pinned on rows worked by
hand (the real CSV's rows through tools/fidelity are fidelity-bridge-moe-rows)."""
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "lib"))
import moe_recipes as m  # noqa: E402

failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


# Placement: DGX nodes of 8; the fewest NVL72 racks of an equal share.
check("H100 x 1024", m.placement("H100", 1024), ("topologies/dgx-h100.json", ["--nodes", "128"]))
check("GB200 x 256", m.placement("GB200", 256),
      ("topologies/gb200-nvl72.json", ["--nodes", "4", "--gpus-per-node", "64"]))
check("GB300 x 8", m.placement("GB300", 8), ("topologies/gb300-nvl72.json", ["--nodes", "1", "--gpus-per-node", "8"]))
check("GB200 x 72", m.placement("GB200", 72), ("topologies/gb200-nvl72.json", ["--nodes", "1"]))

with open(ROOT / m.CSV, newline="") as f:
    header = next(csv.reader(f))
base = dict.fromkeys(header, "")
base.update(recipe="x", model="Qwen3-235B-A22B", gpu="GB300", num_gpus="64", precision="mxfp8", fp8_param_gather="1",
            tp="1", pp="4", vpp="12", cp="1", ep="32", etp="1", dp="16", sequence_parallel="0", micro_batch="2",
            global_batch="2048", seq_len="4096", dispatcher="flex", flex_backend="hybridep",
            recompute_granularity="", cuda_graph_impl="full_iteration", account_for_embedding="1",
            account_for_loss="1", ep_overlap="1", delay_wgrad="1", megatron_fsdp="0", fine_grained_offloading="0",
            force_load_balancing="1", distributed_optimizer="1", overlap_grad_reduce="1", grad_reduce_in_fp32="0", overlap_param_gather="1",
            tp_comm_overlap="1", mtp_layers="0")

# EP 32 x PP 4 on 64 GPUs: 16 ranks a stage (Megatron-Core refuses it too).
check("64 GPUs, PP 4, EP 32", m.inconsistent(base),
      "the recipe's layout does not fit its 64 GPUs: EP x ETP = 32 but a pipeline stage has 16 ranks "
      "(Megatron-Core needs EP x ETP x PP to divide the world size: parallel_state.py:874-883@d98e8a64)")
row = dict(base, num_gpus="256", dp="64")
check("256 GPUs, PP 4, EP 32", m.inconsistent(row), None)

args, reason = m.moe_args(row)
check("no unflagged setting", reason, None)
check("cluster", flag(args, "--cluster"), "topologies/gb300-nvl72.json")
check("racks", (flag(args, "--nodes"), flag(args, "--gpus-per-node")), ("4", "64"))
check("virtual stages without a layout", (flag(args, "--schedule"), flag(args, "--vpp")), ("interleaved", "12"))
check("pipeline split", [a for a in args if a.startswith("--account-for")],
      ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"])
check("no SP flag at TP 1", flag(args, "--sequence-parallel"), None)
check("no TP overlap at TP 1 (Bridge drops it)", flag(args, "--tp-comm-overlap"), None)
check("distributed optimizer", (flag(args, "--zero"), flag(args, "--overlap-param-gather")), ("1", "on"))
check("no gather under the step unless the recipe sets it", flag(args, "--overlap-param-gather-with-optimizer-step"), None)
check("the gather under the step",
      flag(m.moe_args(dict(row, overlap_param_gather_with_optimizer_step="1"))[0],
           "--overlap-param-gather-with-optimizer-step"), "on")
check("CommOverlapConfig's DDP bucket with DP > 1", flag(args, "--ddp-bucket-size"), "134217728")
check("Megatron-Core's bucket without comm_overlap",
      flag(m.moe_args(dict(row, tp_comm_overlap=""))[0], "--ddp-bucket-size"), None)
check("bf16 gradient reduction (grad_reduce_in_fp32 = False)", flag(args, "--grad-reduce-dtype"), "bf16")
check("fp32 gradient reduction", flag(m.moe_args(dict(row, grad_reduce_in_fp32="1"))[0], "--grad-reduce-dtype"), "fp32")
check("precision", (flag(args, "--precision"), "--fp8-param-gather" in args), ("mxfp8", True))
check("no recompute", flag(args, "--recompute"), "none")
check("graphs", flag(args, "--cuda-graphs"), "full_iteration")
check("dispatcher", (flag(args, "--moe-dispatcher"), flag(args, "--moe-flex-backend")), ("flex", "hybridep"))
check("EP overlap, forced balance", (flag(args, "--moe-ep-overlap"), flag(args, "--moe-imbalance")), ("on", "1"))
check("the weight gradients delayed (the default)", flag(args, "--moe-delay-wgrad"), None)
check("HybridEP's domain as the node's EP ranks", m.moe_args(dict(row, hybridep_ranks_per_nvlink_domain="32"))[1],
      None)
check("a smaller HybridEP domain is named",
      (m.moe_args(dict(row, hybridep_ranks_per_nvlink_domain="8"))[1] or "").startswith("HybridEP's NVLink domain of 8"),
      True)
muon, reason = m.moe_args(dict(row, optimizer="muon", distributed_optimizer="0"))
check("Muon as the recipes' dist_muon: the layer-wise optimizer, ZeRO 1",
      (flag(muon, "--optimizer"), flag(muon, "--zero"), reason), ("muon", "1", None))
check("Adam unless the recipe runs Muon", flag(args, "--optimizer"), None)
check("the weight gradients not delayed", flag(m.moe_args(dict(row, delay_wgrad="0"))[0], "--moe-delay-wgrad"), "off")

layout = dict(row, pipeline_layout="Et*4|(t*4|)*14tmL", recompute_granularity="selective",
              recompute_modules="mla_up_proj,mlp", cuda_graph_impl="transformer_engine",
              cuda_graph_scope="attn,moe_router,moe_preprocess", megatron_fsdp="1", fine_grained_offloading="1",
              offload_modules="core_attn,attn_proj", tp="2", sequence_parallel="1", dp="32")
args, reason = m.moe_args(layout)
check("a layout sets the virtual stages", (flag(args, "--pipeline-model-parallel-layout"), flag(args, "--vpp")),
      ("Et*4|(t*4|)*14tmL", None))
check("Megatron-FSDP", (flag(args, "--zero"), flag(args, "--overlap-param-gather")), ("3", None))
check("TP overlap with TP 2 and SP", flag(args, "--tp-comm-overlap"), "on")
check("modules", flag(args, "--recompute-modules"), "mla_up_proj,mlp")
check("offloading's modules", (flag(args, "--offload-modules"), reason), ("core_attn,attn_proj", None))
check("selective, empty list", flag(m.moe_args(dict(row, recompute_granularity="selective"))[0], "--recompute"), "none")

# Each refusal relaxes its own flag and nothing else.
r = m.relax(args, "command line: --recompute-modules: recomputing mla_up_proj is not modelled (...)")
check("recompute relaxed", flag(r, "--recompute-modules"), "mlp")
r = m.relax(r, "command line: --recompute-modules: recomputing mlp is not modelled (...)")
check("last module relaxed", (flag(r, "--recompute-modules"), flag(r, "--recompute")), (None, "none"))
r = m.relax(args, 'command line: --cuda-graphs: unknown CUDA graph module "moe_router" in "..."')
check("graph scope relaxed", flag(r, "--cuda-graphs"), "transformer_engine:attn,moe_preprocess")
r = m.relax(args, "cuboid simulate has no --moe-flex-backend flag")
check("backend dropped", ("--moe-flex-backend" in r, "hybridep" in r, len(r)), (False, False, len(args) - 2))
r = m.relax(args, "command line: --moe-ep-overlap: the EP all-to-all overlap (...) with PP > 1 is not modelled")
check("overlap off", flag(r, "--moe-ep-overlap"), "off")
r = m.relax(args, "command line: --zero: ZeRO-3 of a mixture-of-experts model is not modelled (...)")
check("ZeRO 1", flag(r, "--zero"), "1")
check("nothing to relax", m.relax(args, "some other refusal"), None)

# The rank capacity factor, the paged stash and its buffer factor, as the recipe sets them.
stash = dict(row, moe_paged_stash="1", expert_rank_capacity_factor="1.5", paged_stash_buffer_factor_cuda="1.2")
args, reason = m.moe_args(stash)
check("static budget and stash", (flag(args, "--moe-rank-capacity-factor"), flag(args, "--moe-paged-stash"),
                                  flag(args, "--moe-paged-stash-buffer-factor")), ("1.5", "on", "1.2"))
check("Megatron-Core's default buffer factor: no flag",
      flag(m.moe_args(dict(stash, paged_stash_buffer_factor_cuda=""))[0], "--moe-paged-stash-buffer-factor"), None)
check("no stash, no flags", [a for a in m.moe_args(row)[0] if "capacity" in a or "stash" in a], [])
r = m.relax(args, "command line: --moe-rank-capacity-factor: the busiest EP rank receives (...)")
check("budget and stash relaxed together", [a for a in r if "capacity" in a or "stash" in a], [])
r = m.relax(args, "cuboid simulate has no --moe-flex-backend flag")
check("the budget goes with HybridEP", [a for a in r if "capacity" in a or "stash" in a or "hybridep" in a], [])

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("moe_recipes: all checks passed")

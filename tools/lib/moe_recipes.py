"""tools/fidelity --set bridge-moe: Megatron-Bridge's MoE performance recipes
(tests/data/reference/megatron_bridge_moe_recipes.csv, written by
tools/bridge-moe-recipes) as `cuboid simulate` commands, each row's simulated
step and memory or the reason cuboid cannot express it. The recipes' measured
throughputs are held out: there is no error column.

A row's flags come from its CSV columns alone (moe_args). A refused row is
probed further: the flag its refusal names is relaxed and the row rerun, so
that every mechanism it needs and cuboid lacks is counted, not only the first
(the relaxed runs are never reported as predictions).
"""
import csv
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

CSV = Path("tests/data/reference/megatron_bridge_moe_recipes.csv")
CARDS = {"DeepSeek-V3": "models/deepseek-v3.json", "Qwen3-30B-A3B": "models/qwen3-30b-a3b.json",
         "Qwen3-235B-A22B": "tests/data/hf/qwen3-235b-a22b-config.json", "Kimi-K2": "models/kimi-k2.json"}
# GPU -> (cluster card, GPUs per node); an NVL72 rack is one node of 72.
CLUSTERS = {"H100": ("topologies/dgx-h100.json", 8), "B200": ("topologies/dgx-b200.json", 8),
            "GB200": ("topologies/gb200-nvl72.json", 72), "GB300": ("topologies/gb300-nvl72.json", 72)}
GPU_ORDER = ["H100", "B200", "GB200", "GB300"]


def placement(gpu, n):
    """--nodes and --gpus-per-node: DGX nodes of 8, or the fewest NVL72 racks
    with an equal share each (as the dense set places its rows)."""
    card, per_node = CLUSTERS[gpu]
    if per_node == 8:
        return card, ["--nodes", str(max(1, n // 8))] + (["--gpus-per-node", str(n)] if n < 8 else [])
    racks = -(-n // per_node)
    while n % racks:
        racks += 1
    return card, ["--nodes", str(racks)] + (["--gpus-per-node", str(n // racks)] if n // racks != per_node else [])


def inconsistent(r):
    """Why the recipe's layout cannot run on its GPU count, or None."""
    n, tp, pp, cp = (int(r[k]) for k in ("num_gpus", "tp", "pp", "cp"))
    ep, etp = int(r["ep"]), int(r["etp"] or r["tp"])
    if n % (tp * pp * cp):
        return f"the recipe's layout does not fit its {n} GPUs: TP x PP x CP = {tp * pp * cp} does not divide them"
    stage = n // pp
    if stage % (ep * etp):
        return (f"the recipe's layout does not fit its {n} GPUs: EP x ETP = {ep * etp} but a pipeline stage has "
                f"{stage} ranks (Megatron-Core needs EP x ETP x PP to divide the world size: "
                f"parallel_state.py:874-883@d98e8a64)")
    return None


def moe_args(r):
    """The row's `cuboid simulate` flags, and a reason when a setting has no
    cuboid mechanism at all (nothing to pass)."""
    card, where = placement(r["gpu"], int(r["num_gpus"]))
    tp, pp = int(r["tp"]), int(r["pp"])
    a = ["--model", CARDS[r["model"]], "--cluster", card, *where, "--tp", r["tp"], "--pp", r["pp"], "--dp", r["dp"],
         "--ep", r["ep"], "--etp", r["etp"] or r["tp"]]
    if int(r["cp"]) > 1:
        a += ["--cp", r["cp"]]
    if r["pipeline_layout"]:
        a += ["--pipeline-model-parallel-layout", r["pipeline_layout"]]
    elif r["vpp"]:
        a += ["--schedule", "interleaved", "--vpp", r["vpp"]]
    a += [f"--account-for-{k}-in-pipeline-split" for k in ("embedding", "loss") if r[f"account_for_{k}"] == "1"]
    a += ["--micro-batch", r["micro_batch"], "--global-batch", r["global_batch"], "--seq-length", r["seq_len"]]
    if tp > 1:
        a += ["--sequence-parallel", "on" if r["sequence_parallel"] == "1" else "off"]
    fsdp = r["megatron_fsdp"] == "1"
    # Muon shards its own states: the recipes' dist_muon is Megatron-Core's
    # layer-wise distributed optimizer, cuboid's --optimizer muon --zero 1.
    sharded = r["distributed_optimizer"] == "1" or r["optimizer"] == "muon"
    a += ["--zero", "3" if fsdp else "1" if sharded else "0"]
    if r["optimizer"] == "muon":
        a += ["--optimizer", "muon"]
    a += ["--dp-overlap", "on" if r["overlap_grad_reduce"] == "1" else "off"]
    # The DDP config's grad_reduce_in_fp32 (False in every performance recipe: _benchmark_common).
    a += ["--grad-reduce-dtype", "fp32" if r["grad_reduce_in_fp32"] == "1" else "bf16"]
    if (not fsdp and r["distributed_optimizer"] == "1" and r["overlap_param_gather"] == "1"
            and r["overlap_grad_reduce"] == "1" and int(r["dp"]) * int(r["cp"]) > 1):
        a += ["--overlap-param-gather", "on"]
        # The first chunk's gather under the optimizer step (15 of the 102, all with virtual stages).
        if r["overlap_param_gather_with_optimizer_step"] == "1":
            a += ["--overlap-param-gather-with-optimizer-step", "on"]
    # CommOverlapConfig's DDP bucket with DP > 1 (training/comm_overlap.py
    # _get_optimizer_overlap_cfgs: 128 x 1024 x 1024 parameters; the recipes
    # that leave comm_overlap None, tp_comm_overlap empty, keep Megatron-Core's).
    if not fsdp and r["distributed_optimizer"] == "1" and r["tp_comm_overlap"] != "" and int(r["dp"]) > 1:
        a += ["--ddp-bucket-size", "134217728"]
    a += ["--precision", r["precision"]]
    if r["precision"] != "bf16" and r["fp8_param_gather"] == "1":
        a += ["--fp8-param-gather"]
    # The mixed-precision config's fp8_dot_product_attention (12 of the 102, all MXFP8).
    if r["precision"] != "bf16" and r["fp8_dot_product_attention"] == "1":
        a += ["--fp8-attention"]
    # The optimizer's precision settings (main_params_dtype is fp32 and
    # exp_avg_sq_dtype is exp_avg_dtype in all 102; main_grads_dtype follows
    # the DDP buffer, --grad-reduce-dtype above).
    if r["precision_aware_optimizer"] == "1":
        a += ["--precision-aware-optimizer"]
    if r["exp_avg_dtype"] == "bfloat16":
        a += ["--adam-moments", "bf16"]
    mods = r["recompute_modules"]
    if r["recompute_granularity"] == "selective" and mods:
        a += ["--recompute", "selective"] if mods == "core_attn" else ["--recompute-modules", mods]
    elif r["recompute_granularity"] == "selective":
        a += ["--recompute", "none"]  # selective with an empty module list recomputes nothing
    else:
        a += ["--recompute", r["recompute_granularity"] or "none"]
    impl, scope = r["cuda_graph_impl"], r["cuda_graph_scope"]
    if impl == "full_iteration" or (impl == "local" and scope == "full_iteration"):
        a += ["--cuda-graphs", "full_iteration"]
    elif impl in ("local", "transformer_engine"):
        a += ["--cuda-graphs", impl + (":" + scope if scope else "")]
    else:
        a += ["--cuda-graphs", "none"]
    if tp > 1 and r["sequence_parallel"] == "1" and r["tp_comm_overlap"] == "1":
        a += ["--tp-comm-overlap", "on"]
    a += ["--moe-dispatcher", r["dispatcher"]]
    if r["flex_backend"] == "hybridep":
        a += ["--moe-flex-backend", "hybridep"]
    if r["expert_rank_capacity_factor"]:
        a += ["--moe-rank-capacity-factor", r["expert_rank_capacity_factor"]]
    if r["moe_paged_stash"] == "1":
        a += ["--moe-paged-stash", "on"]
        if r["paged_stash_buffer_factor_cuda"]:
            a += ["--moe-paged-stash-buffer-factor", r["paged_stash_buffer_factor_cuda"]]
    a += ["--moe-ep-overlap", "on" if r["ep_overlap"] == "1" else "off"]
    # CommOverlapConfig's delay_wgrad_compute (with the overlap only: Megatron-Core asserts it).
    if r["ep_overlap"] == "1" and r["delay_wgrad"] != "1":
        a += ["--moe-delay-wgrad", "off"]
    if r["force_load_balancing"] == "1":
        a += ["--moe-imbalance", "1"]
    if r["fine_grained_offloading"] == "1" and r["offload_modules"]:
        a += ["--offload-modules", r["offload_modules"]]
    # HybridEP's NVLink domain: cuboid's is the EP ranks one node holds
    # (hybrid_ep_buffer.py detect_accessible_ranks); a recipe that sets another
    # (NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN) is named, not priced as that.
    if r["flex_backend"] == "hybridep" and r["dispatcher"] == "flex" and r["hybridep_ranks_per_nvlink_domain"]:
        nodes = int(where[where.index("--nodes") + 1])
        on_node = min(int(r["ep"]), int(r["num_gpus"]) // nodes // int(r["etp"] or r["tp"]))
        if int(r["hybridep_ranks_per_nvlink_domain"]) != on_node:
            return a, (f"HybridEP's NVLink domain of {r['hybridep_ranks_per_nvlink_domain']} ranks "
                       f"(NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN) where a node holds {on_node} of the EP "
                       "ranks is not modelled")
    return a, None


def relax(args, reason):
    """The flags with what the refusal names relaxed, or None when the reason
    names nothing relaxable."""
    a = list(args)

    def value(flag):
        return a[a.index(flag) + 1]

    def put(flag, v):
        a[a.index(flag) + 1] = v

    m = re.search(r"recomputing (\w+) is not modelled", reason)
    if m and "--recompute-modules" in a:
        mods = [x for x in value("--recompute-modules").split(",") if x != m.group(1)]
        i = a.index("--recompute-modules")
        a[i:i + 2] = ["--recompute-modules", ",".join(mods)] if mods else ["--recompute", "none"]
        return a
    static = {"--moe-rank-capacity-factor", "--moe-paged-stash", "--moe-paged-stash-buffer-factor"}
    if re.match(r"command line: --moe-(rank-capacity-factor|paged-stash)", reason) and static & set(a):
        return drop(a, static)
    if "--moe-flex-backend" in reason and "--moe-flex-backend" in a:
        return drop(a, {"--moe-flex-backend"} | static)
    m = re.search(r'unknown CUDA graph module "(\w+)"', reason)
    if m and "--cuda-graphs" in a:
        impl, _, scope = value("--cuda-graphs").partition(":")
        keep = [x for x in scope.split(",") if x and x != m.group(1)]
        put("--cuda-graphs", impl + ":" + ",".join(keep) if keep else "none")
        return a
    if "with PP > 1" in reason and "--moe-ep-overlap" in a:
        put("--moe-ep-overlap", "off")
        return a
    if "--offload-modules" in reason and "--offload-modules" in a:
        return drop(a, {"--offload-modules"})
    if "ZeRO-3 of a mixture-of-experts model" in reason:
        put("--zero", "1")
        return a
    return None


def drop(args, flags):
    """The flags without `flags` and the value each takes (the next token, when
    it is not itself a flag)."""
    out, i = [], 0
    while i < len(args):
        if args[i] in flags:
            i += 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        out.append(args[i])
        i += 1
    return out


def run(binary, args, analytical):
    cmd = [binary, "simulate", *args, "--trainer", "megatron-core", "--json"] + (["--analytical"] if analytical else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode == 2:
        lines = [x.strip() for x in p.stderr.splitlines() if x.strip()]
        reason = lines[-1] if lines else ""
        return None, reason[len("cuboid: "):] if reason.startswith("cuboid: ") else reason
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        sys.exit(p.returncode if p.returncode > 0 else 128 - p.returncode)
    return json.loads(p.stdout), None




def evaluate(binary, r, analytical, known):
    """(result or None, the reasons in the order they were met)."""
    args, pre = moe_args(r)
    bad = inconsistent(r)
    if bad:
        return None, [bad], args
    reasons = [pre] if pre else []
    result = None
    probe = list(args)
    for _ in range(8):
        lacking = [f for f in probe if f.startswith("--") and f not in known]
        if lacking:
            reason = "cuboid simulate has no " + ", ".join(dict.fromkeys(lacking)) + " flag"
            out = None
        else:
            out, reason = run(binary, probe, analytical)
        if out is not None:
            result = out if not reasons else None
            break
        reasons.append(reason)
        relaxed = relax(probe, reason) if not lacking else drop(probe, lacking)
        if relaxed is None or relaxed == probe:
            break
        probe = relaxed
    return result, reasons, args


def gib(b):
    return b / 2**30


def listing(binary, known, mechanisms, doc_text, analytical=False, recipe_inconsistent=None):
    """Print the table and the summary; return the names of rows whose reasons
    name no mechanism on the not-modelled list (the caller fails on them)."""
    with open(CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        card = json.loads(Path(CARDS[r["model"]]).read_text())
        mtp = card.get("mtp_layers", card.get("num_nextn_predict_layers", 0)) or 0
        if int(r["mtp_layers"]) != int(mtp):
            print(f"fidelity: {CSV}: {r['recipe']}: mtp_layers {r['mtp_layers']} but {CARDS[r['model']]} has {mtp}",
                  file=sys.stderr)
            sys.exit(2)
    print("%-62s %5s  %s" % ("recipe (Megatron-Bridge perf_recipes @ %s)" % rows[0]["commit"][:8], "GPUs",
                             "simulated step, memory per GPU" + (" (--analytical)" if analytical else "")))
    done, blocked, unnamed = [], [], []
    for r in rows:
        result, reasons, args = evaluate(binary, r, analytical, known)
        if result is not None:
            m = result["memory"]
            fit = "fits" if m["fits"] else "DOES NOT FIT"
            print("%-62s %5s  %8.3f s  %6.1f of %.1f GiB, %s" % (r["recipe"], r["num_gpus"], result["iteration_time_s"],
                                                                gib(result["memory_per_gpu_bytes"]),
                                                                gib(m["capacity_bytes"]), fit))
            done.append((r, result))
        else:
            print("%-62s %5s  not expressed: %s" % (r["recipe"], r["num_gpus"], reasons[0]))
            for more in reasons[1:]:
                print("%-62s %5s  and then: %s" % ("", "", more))
            named = [mechanisms(x) or ([recipe_inconsistent[0]] if recipe_inconsistent and
                                       re.search(recipe_inconsistent[1], x) else []) for x in reasons]
            if any(not n for n in named):
                unnamed.append(r["recipe"] + " (" + "; ".join(x for x, n in zip(reasons, named) if not n) + ")")
            blocked.append((r, [n for ns in named for n in ns]))
        print("    " + shlex.join(["cuboid", "simulate", *args, "--trainer", "megatron-core"]))
    summary(rows, done, blocked)
    undocumented = sorted({n for _, ns in blocked for n in ns if n not in doc_text})
    return unnamed, undocumented, len(done)


def summary(rows, done, blocked):
    print()
    fits = sum(1 for _, x in done if x["memory"]["fits"])
    print(f"{len(rows)} recipes, {len(done)} expressed ({fits} fit in memory, {len(done) - fits} do not), "
          f"{len(blocked)} not expressed")
    models = list(dict.fromkeys(r["model"] for r in rows))
    print()
    print("expressed / recipes by model x GPU")
    print("%-18s" % "" + "".join("%8s" % g for g in GPU_ORDER))
    for m in models:
        line = "%-18s" % m
        for g in GPU_ORDER:
            n = sum(1 for r in rows if r["model"] == m and r["gpu"] == g)
            e = sum(1 for r, _ in done if r["model"] == m and r["gpu"] == g)
            line += "%8s" % (f"{e} / {n}" if n else "-")
        print(line)
    print()
    print("not expressed: what blocks them (a row counts under each mechanism it needs; 'alone': the rows it is "
          "the only blocker of)")
    counts, alone = {}, {}
    for r, names in blocked:
        names = list(dict.fromkeys(names))
        for n in names:
            counts[n] = counts.get(n, 0) + 1
        if len(names) == 1:
            alone[names[0]] = alone.get(names[0], 0) + 1
    for n, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {c:3d} rows ({alone.get(n, 0)} alone)  {n}")
    print()
    print("not expressed, by the whole set of mechanisms a row needs")
    combos = {}
    for r, names in blocked:
        key = " + ".join(sorted(set(names)))
        combos[key] = combos.get(key, 0) + 1
    for k, c in sorted(combos.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {c:3d}  {k}")

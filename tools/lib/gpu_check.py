#!/usr/bin/env python3
"""The JSON steps of tools/gpu-check and tools/gpu-node-check, one subcommand each:

  one-gpu-cluster CLUSTER GPU_CARD OUT   the shipped 8-GPU node card with one GPU
  summary RUN GPU_CARD GPU_NAME          the GEMM TFLOP/s table of a `cuboid run` (measurements.json)
  slice MODEL LAYERS OUT                 the model card cut to its first LAYERS layers
  check-run RUN                          did `cuboid run --check` pass both checks? (exit 1 if not)
  validated VALIDATION                   the table and verdict of `cuboid validate --json` (exit 1 outside the tolerance)
  calibrated CARD                        does the card hold a calibration section? (exit 1 if not)

Each reads the JSON cuboid writes, never its text output.
"""
import argparse
import json
import sys


def one_gpu_cluster(args):
    """A one-GPU cluster: the shipped 8-GPU node with gpus_per_node = 1."""
    c = json.load(open(args.cluster))
    c["name"] += " (one GPU, gpu-check)"
    c["nodes"] = 1
    c["gpus_per_node"]["value"] = 1
    c["gpu"] = args.gpu_card
    json.dump(c, open(args.out, "w"), indent=2)


def median(v):
    v = sorted(v)
    n = len(v)
    return 0.0 if n == 0 else (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2]))


def summary(args):
    """GEMM TFLOP/s achieved vs the GPU's dense BF16 peak, and the step time."""
    run = json.load(open(args.run))
    peak = json.load(open(args.gpu_card))["peak_bf16_tflops"]["value"]
    gpu = args.gpu_name
    rank = run["ranks"][0]

    rows, flops, secs = [], 0.0, 0.0
    for op in rank["ops"]:
        if op["kind"] != "gemm":
            continue
        t = median(op["step_seconds"])
        f = op["flops_per_call"] * op["calls_per_step"]
        flops, secs = flops + f, secs + t
        s = op["shape"]
        rows.append((op["name"], op["pass"], f"{s['m']}x{s['n']}x{s['k']}" + (f" x{s['batch']}" if s["batch"] > 1 else ""),
                     t, f / t / 1e12 if t > 0 else 0.0))
    rows.sort(key=lambda r: -r[3])
    step = run["iteration_time_s"]
    print(f"GPU {gpu}: dense BF16 peak {peak:.0f} TFLOP/s ({args.gpu_card.rsplit('/', 1)[-1]})")
    print(f"{'GEMM':<28}{'pass':<10}{'m x n x k':>22}{'ms/step':>10}{'TFLOP/s':>10}{'of peak':>9}")
    for name, pas, shape, t, tf in rows[:8]:
        print(f"{name:<28}{pas:<10}{shape:>22}{t * 1e3:>10.2f}{tf:>10.1f}{tf / peak:>9.1%}")
    gemm_tf = flops / secs / 1e12 if secs > 0 else 0.0
    print(f"{'all GEMMs':<60}{secs * 1e3:>10.2f}{gemm_tf:>10.1f}{gemm_tf / peak:>9.1%}")
    print(f"step time {step * 1e3:.1f} ms (median of {run['steps']}); model TFLOP/s {rank['achieved_tflops']:.1f} "
          f"({rank['achieved_tflops'] / peak:.1%} of peak); GEMMs {secs / step:.0%} of the step" if step > 0 else "")
    if "check" in run:
        print("check:", json.dumps(run["check"])[:200])


def slice_model(args):
    """The first LAYERS layers of the model (with its embedding and head)."""
    m = json.load(open(args.model))
    m["name"] = f"gpt-1.3b-{args.layers}-layers"
    m["description"] = f"The first {args.layers} of the 24 layers of the GPT-3 XL shape (with its embedding and head), for tools/gpu-check's calibration loop."
    m["num_layers"] = int(args.layers)
    json.dump(m, open(args.out, "w"), indent=2)


def load(path, what):
    """The JSON document at path, or exit 1 naming what is missing."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"no {what}: {e}")
        sys.exit(1)


def check_run(args):
    """`cuboid run --check` passed: the sharded forward against the unsharded
    reference, and the replicated weights after the steps (run.cpp writes both
    under "check"; it writes no measurements when either fails)."""
    run = load(args.run, "measurements")
    check = run.get("check")
    if not isinstance(check, dict):
        print("FAILED: the measurements hold no check (was the run made with --check?)")
        sys.exit(1)
    after = check.get("after_steps", {})
    failed = []
    if check.get("passed") is not True:
        failed.append(f"sharded forward vs unsharded reference (layer output error {check.get('layer_relative_error')}, "
                      f"tolerance {check.get('tolerance')})")
    if after.get("passed") is not True:
        failed.append(f"replicated weights after the steps (TP drift {after.get('tp_replicated_weights_relative_drift')}, "
                      f"DP drift {after.get('dp_replica_relative_drift')}, tolerance {after.get('tolerance')})")
    if failed:
        print("FAILED: " + "; ".join(failed))
        sys.exit(1)
    print(f"iteration time (slowest rank, median): {run['iteration_time_s']:.4f} s")


def validated(args):
    """The components and the end-to-end verdict of `cuboid validate --json`."""
    v = load(args.validation, "validation")
    print(f"{'component':<22} {'predicted(s)':>13} {'measured(s)':>12} {'error':>9}")
    for c in v["components"]:
        error = "-" if c["error"] is None else f"{100 * c['error']:+.1f}%"
        print(f"{c['component']:<22} {c['predicted_s']:>13.4f} {c['measured_s']:>12.4f} {error:>9}")
    ok = v["within_tolerance"] is True
    print(f"{'PASS' if ok else 'FAIL'}: end-to-end error {100 * v['error']:+.1f}% (predicted "
          f"{v['predicted_iteration_s']:.4f} s, measured {v['measured_iteration_s']:.4f} s) "
          f"{'is within' if ok else 'exceeds'} the tolerance of {100 * v['tolerance']:.1f}%")
    sys.exit(0 if ok else 1)


def calibrated(args):
    """A calibrated card: the input card plus "calibration" with samples in it."""
    card = load(args.card, "calibrated card")
    cal = card.get("calibration") if isinstance(card, dict) else None
    if not isinstance(cal, dict) or not cal.get("collectives"):
        print(f"FAILED: {args.card} has no calibration section with collectives")
        sys.exit(1)
    print(f"card written: {len(cal.get('gemms', []))} GEMM shapes, {len(cal.get('kernels', {}))} kernels, "
          f"{len(cal['collectives'])} collective fits on {cal.get('ranks')} ranks")


def main():
    parser = argparse.ArgumentParser(prog="tools/lib/gpu_check.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("one-gpu-cluster", help="the shipped 8-GPU node card with one GPU")
    p.add_argument("cluster", help="cluster card (topologies/*.json)")
    p.add_argument("gpu_card", help="GPU profile path written into the card's gpu field")
    p.add_argument("out", help="cluster card to write")
    p.set_defaults(func=one_gpu_cluster)
    p = sub.add_parser("summary", help="GEMM TFLOP/s table of a cuboid run")
    p.add_argument("run", help="measurements.json of `cuboid run`")
    p.add_argument("gpu_card", help="GPU profile (peak_bf16_tflops)")
    p.add_argument("gpu_name", help="the GPU's name as nvidia-smi prints it")
    p.set_defaults(func=summary)
    p = sub.add_parser("slice", help="the model card cut to its first LAYERS layers")
    p.add_argument("model", help="model card")
    p.add_argument("layers", help="layers to keep")
    p.add_argument("out", help="model card to write")
    p.set_defaults(func=slice_model)
    p = sub.add_parser("check-run", help="did cuboid run --check pass both checks")
    p.add_argument("run", help="measurements.json of `cuboid run --check`")
    p.set_defaults(func=check_run)
    p = sub.add_parser("validated", help="table and verdict of cuboid validate --json")
    p.add_argument("validation", help="the output of `cuboid validate --json`")
    p.set_defaults(func=validated)
    p = sub.add_parser("calibrated", help="does the card hold a calibration section")
    p.add_argument("card", help="the card `cuboid calibrate --out` wrote")
    p.set_defaults(func=calibrated)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Validates cuboid plan files against schemas/cuboid.plan.1.schema.json.

    validate_plan_schema.py --schema SCHEMA [--emit EMIT_PLANS] [--cuboid CUBOID] [PLAN.json ...]

--emit runs the tests' emit_plans helper to write the fixture plans (the same
plan_to_json output `cuboid plan --out` writes) into a temporary directory and
validates them too. The schema must also reject a file with an unknown field
or another schema version, so a test fails if it stops being strict.
--cuboid additionally runs `cuboid export` on an emitted plan: success, and the
bad inputs (unknown --to, another schema version, an unwritable --out) must
exit with code 2, one message on stderr and no output file.
Needs python3-jsonschema (Debian package); exits 77 (meson: skipped) without it.
"""
import argparse
import copy
import json
import os
import subprocess
import tempfile

from schema_check import check, load_validator, validate_file


def validate_files(validator, paths):
    for path in paths:
        validate_file(validator, path)


def schema_is_strict(validator, path):
    with open(path) as f:
        doc = json.load(f)
    for where in ([], ["parallel"], ["prediction", "memory"]):
        bad = copy.deepcopy(doc)
        target = bad
        for key in where:
            target = target[key]
        target["not_a_field"] = 1
        check(not validator.is_valid(bad), "schema rejects an unknown field in /" + "/".join(where))
    bad = copy.deepcopy(doc)
    bad["schema"] = "cuboid.plan/2"
    check(not validator.is_valid(bad), "schema rejects cuboid.plan/2")


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def cli_checks(cuboid, plan, tmp):
    r = run([cuboid, "export", "--plan", plan, "--to", "megatron"])
    check(r.returncode == 0 and "--tensor-model-parallel-size" in r.stdout, "cuboid export --to megatron succeeds")
    out = os.path.join(tmp, "seed.sh")
    r2 = run([cuboid, "export", "--plan", plan, "--to", "megatron", "--out", out])
    check(r2.returncode == 0 and r2.stdout == "" and open(out).read() == r.stdout, "--out writes the same text")

    r = run([cuboid, "export", "--plan", plan, "--to", "jax"])
    check(r.returncode == 2 and r.stdout == "" and
          r.stderr == 'cuboid: command line: --to: unknown export target "jax" '
                      "(fix: use megatron, megatron-bridge, deepspeed, torchtitan, torchtitan-main or nemo)\n",
          "unknown --to exits 2 with one message")

    with open(plan) as f:
        doc = json.load(f)
    doc["schema"] = "cuboid.plan/2"
    v2 = os.path.join(tmp, "v2.plan.json")
    with open(v2, "w") as f:
        json.dump(doc, f)
    r = run([cuboid, "export", "--plan", v2, "--to", "megatron"])
    check(r.returncode == 2 and r.stderr == f'cuboid: {v2}: schema: plan file schema "cuboid.plan/2" is not supported '
          "(fix: regenerate it with this cuboid, which writes cuboid.plan/1)\n",
          "a cuboid.plan/2 file exits 2 with the fix")

    missing = os.path.join(tmp, "no-such-dir", "out.sh")
    r = run([cuboid, "export", "--plan", plan, "--to", "megatron", "--out", missing])
    check(r.returncode == 2 and "does not exist" in r.stderr and not os.path.exists(missing),
          "--out into a missing directory exits 2 and writes nothing")

    r = run([cuboid, "export", "--plan", plan, "--to", "deepspeed"])
    check(r.returncode == 2 and "parallel.tp: DeepSpeed's config has no tensor-parallel size" in r.stderr
          and r.stdout == "", "a plan DeepSpeed cannot express exits 2 with the reason")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schema", required=True)
    ap.add_argument("--emit")
    ap.add_argument("--cuboid")
    ap.add_argument("plans", nargs="*")
    args = ap.parse_args()

    validator = load_validator(args.schema)

    with tempfile.TemporaryDirectory() as tmp:
        plans = list(args.plans)
        if args.emit:
            r = run([args.emit, tmp])
            check(r.returncode == 0, "emit_plans wrote the fixture plans" + ("" if r.returncode == 0 else ": " + r.stderr))
            plans += r.stdout.split()
        if args.cuboid:
            # Plans written by `cuboid plan --out` itself: the seeds' examples,
            # one of them re-ranked by the simulator, one with uneven stages.
            runs = [
                ("llama3-70b.plan.json", ["--model", "models/llama3-70b.json", "--cluster",
                                          "topologies/dgx-a100-4node.json", "--simulate-top", "1"]),
                ("gpt-512b.plan.json", ["--model", "models/gpt-512b.json", "--cluster",
                                        "topologies/dgx-a100-superpod.json", "--tp", "8", "--pp", "16",
                                        "--simulate-top", "0"]),
                ("llama3.1-405b.plan.json", ["--model", "models/llama3.1-405b.json", "--cluster",
                                             "topologies/h100-roce-24k.json", "--nodes", "2048", "--tp", "8",
                                             "--pp", "16", "--uneven-stages", "--global-batch", "2048",
                                             "--simulate-top", "0"]),
            ]
            for name, flags in runs:
                out = os.path.join(tmp, name)
                r = run([args.cuboid, "plan", *flags, "--out", out])
                check(r.returncode == 0 and os.path.exists(out), "cuboid plan --out wrote " + name +
                      ("" if r.returncode == 0 else ": " + r.stderr))
                plans.append(out)
        check(len(plans) > 0, "there are plan files to validate")
        validate_files(validator, plans)
        schema_is_strict(validator, plans[0])
        if args.cuboid:
            cli_checks(args.cuboid, plans[0], tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""The closing table of tools/calibrate-local: per plan the trial with the
median error (measured, predicted, error, PASS/FAIL at the tolerance) and every
trial's error, from OUT/round<r>/<plan>.validate.json, and the same for the
cross-plan validations (<plan>.cross.validate.json) where every trial has one;
the median trial's files are copied to OUT/<plan>.*. Exit 1 when a plan misses
the tolerance, same-plan or cross-plan."""
import argparse
import glob
import json
import os
import shutil
import sys


def median_trial(out, rounds, name, kind):
    """The trial with the median error of OUT/round<r>/<name>.<kind>.json: (its JSON, r, every trial's error)."""
    trials = [(json.load(open(f"{out}/round{r}/{name}.{kind}.json")), r) for r in range(1, rounds + 1)]
    v, r = sorted(trials, key=lambda t: t[0]["error"])[(len(trials) - 1) // 2]
    return v, r, " ".join(f"{100 * t['error']:+.1f}%" for t, _ in trials)


def main():
    parser = argparse.ArgumentParser(prog="tools/lib/calibrate_table.py", description=__doc__)
    parser.add_argument("out", help="tools/calibrate-local's output folder")
    parser.add_argument("rounds", type=int, help="trials (round1 .. roundR)")
    parser.add_argument("tol", type=float, help="tolerance on the relative error")
    parser.add_argument("plans", nargs="*", metavar="NAME:RANKS", help="the plans, in the table's order")
    args = parser.parse_args()
    out, rounds, tol = args.out, args.rounds, args.tol

    print(f"{'plan':<8} {'ranks':>5} {'measured(s)':>13} {'predicted(s)':>14} {'error':>8}  within {tol:g}  "
          f"(error of each trial; the median trial is shown)")
    failed = 0
    cross_rows = []
    for arg in args.plans:
        name, ranks = arg.split(":")
        v, r, each = median_trial(out, rounds, name, "validate")
        ok = abs(v["error"]) <= tol
        failed += not ok
        # The median trial's files, where the README and a reader look for them.
        for kind in ("validate.txt", "validate.json", "plan.json"):
            shutil.copy(f"{out}/round{r}/{name}.{kind}", f"{out}/{name}.{kind}")
        for run in glob.glob(f"{out}/round{r}/{name}.measurements-*.json"):
            shutil.copy(run, f"{out}/{os.path.basename(run)}")
        print(f"{name:<8} {ranks:>5} {v['measured_iteration_s']:>13.4f} {v['predicted_iteration_s']:>14.4f} "
              f"{100 * v['error']:>+7.1f}%  {'PASS' if ok else 'FAIL':<11}  ({each}; median: trial {r})")
        if all(os.path.exists(f"{out}/round{t}/{name}.cross.validate.json") for t in range(1, rounds + 1)):
            cross_rows.append((name, ranks, median_trial(out, rounds, name, "cross.validate")))
    if cross_rows:
        print()
        print("cross-plan: each plan's run validated against a card calibrated on other plans (the sets of --help)")
        print(f"{'plan':<8} {'ranks':>5} {'measured(s)':>13} {'predicted(s)':>14} {'error':>8}  within {tol:g}  "
              f"(error of each trial; the median trial is shown)")
        for name, ranks, (v, r, each) in cross_rows:
            ok = abs(v["error"]) <= tol
            failed += not ok
            for kind in ("validate.txt", "validate.json"):
                shutil.copy(f"{out}/round{r}/{name}.cross.{kind}", f"{out}/{name}.cross.{kind}")
            print(f"{name:<8} {ranks:>5} {v['measured_iteration_s']:>13.4f} {v['predicted_iteration_s']:>14.4f} "
                  f"{100 * v['error']:>+7.1f}%  {'PASS' if ok else 'FAIL':<11}  ({each}; median: trial {r})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The closing table of tools/calibrate-local: per plan the trial with the
median error (measured, predicted, error, PASS/FAIL at the tolerance) and every
trial's error, from OUT/round<r>/<plan>.validate.json; the median trial's files
are copied to OUT/<plan>.*. Exit 1 when a plan misses the tolerance."""
import argparse
import json
import shutil
import sys


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
    for arg in args.plans:
        name, ranks = arg.split(":")
        trials = [(json.load(open(f"{out}/round{r}/{name}.validate.json")), r) for r in range(1, rounds + 1)]
        by_error = sorted(trials, key=lambda t: t[0]["error"])
        v, r = by_error[(len(by_error) - 1) // 2]
        ok = abs(v["error"]) <= tol
        failed += not ok
        # The median trial's files, where the README and a reader look for them.
        for kind in ("validate.txt", "validate.json", "measurements.json", "plan.json"):
            shutil.copy(f"{out}/round{r}/{name}.{kind}", f"{out}/{name}.{kind}")
        each = " ".join(f"{100 * t['error']:+.1f}%" for t, _ in trials)
        print(f"{name:<8} {ranks:>5} {v['measured_iteration_s']:>13.4f} {v['predicted_iteration_s']:>14.4f} "
              f"{100 * v['error']:>+7.1f}%  {'PASS' if ok else 'FAIL':<11}  ({each}; median: trial {r})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

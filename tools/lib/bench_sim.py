#!/usr/bin/env python3
"""The simulator lines of tools/bench: one case's bench_planner runs, one fresh
process each (the first process's first line in full, the first runs' rates
sorted with their median, the last process's last line).

  tools/lib/bench_sim.py OUT1 JSON1 OUT2 JSON2 ... OUTN JSONN

OUTk is what bench_planner printed in process k, JSONk what it wrote with
BENCH_JSON (one object per case: events, and per run its CPU seconds). The
rates are computed from the JSON; a run that wrote none exits 2 naming it,
rather than a median of nothing.
"""
import argparse
import json
import statistics
import sys


def first_run_rate(out_path, json_path):
    """(printed lines, the first run's M events per CPU second) of one bench_planner process."""
    with open(out_path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    try:
        with open(json_path, encoding="utf-8") as f:
            case = json.loads(f.readline())
        rate = case["events"] / case["runs"][0]["cpu_s"] / 1e6
    except (OSError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
        print(f"bench: {json_path}: bench_planner wrote no usable run ({e})", file=sys.stderr)
        sys.exit(2)
    if not lines:
        print(f"bench: {out_path}: bench_planner printed nothing", file=sys.stderr)
        sys.exit(2)
    return lines, rate


def main():
    parser = argparse.ArgumentParser(prog="tools/lib/bench_sim.py", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="OUT JSON pairs of bench_planner sim CASE, one per process, in order")
    args = parser.parse_args()
    if len(args.files) % 2:
        parser.error("give an OUT and a JSON file per process")
    runs = [first_run_rate(args.files[i], args.files[i + 1]) for i in range(0, len(args.files), 2)]
    rates = sorted(rate for _, rate in runs)
    print(runs[0][0][0])
    print(f"{'':<40} first run of {len(rates)} processes: {' '.join(f'{r:.2f}' for r in rates)} M events/s per cpu s, "
          f"median {statistics.median(rates):.2f}")
    print(runs[-1][0][-1])


if __name__ == "__main__":
    main()

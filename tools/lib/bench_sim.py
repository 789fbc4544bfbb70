#!/usr/bin/env python3
"""The simulator lines of tools/bench: one case's bench_planner outputs, one
file per fresh process (the first process's first line in full, the first
runs' rates sorted with their median, the last process's last line).

  tools/lib/bench_sim.py OUT1 OUT2 ... OUTN

bench_planner prints no JSON, so its first line is read by its printf format
(bench/bench_planner.cpp, bench_simulation); a line that does not match exits
2 naming it, rather than a median of nothing.
"""
import argparse
import re
import statistics
import sys

# "... %.3f s host, %.3f s cpu (%.2f M events/s per cpu s) ..."
RATE = re.compile(r" s host, [0-9.]+ s cpu \(([0-9.]+) M events/s per cpu s\) ")


def first_line_rate(path):
    """(lines, the first line's M events per CPU second as printed) of one bench_planner output."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    match = RATE.search(lines[0]) if lines else None
    if not match:
        print(f"bench: {path}: bench_planner's first line has no rate: {lines[0] if lines else '(empty)'}",
              file=sys.stderr)
        sys.exit(2)
    return lines, match.group(1)


def main():
    parser = argparse.ArgumentParser(prog="tools/lib/bench_sim.py", description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", help="bench_planner sim CASE outputs, one per process, in order")
    args = parser.parse_args()
    runs = [first_line_rate(p) for p in args.outputs]
    rates = sorted((rate for _, rate in runs), key=float)
    n = len(rates)
    median = rates[n // 2] if n % 2 else f"{statistics.median(float(r) for r in rates):.2f}"
    print(runs[0][0][0])
    print(f"{'':<40} first run of {n} processes: {' '.join(rates)} M events/s per cpu s, median {median}")
    print(runs[-1][0][-1])


if __name__ == "__main__":
    main()

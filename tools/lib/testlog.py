#!/usr/bin/env python3
"""The closing line of tools/test, read from meson's test log.

  tools/lib/testlog.py build/meson-logs/testlog.json

The log holds one JSON object per test run (name, result, duration, ...;
meson's JsonLogfileBuilder in mesonbuild/mtest.py). Results are counted as
meson's TestResult does: OK and EXPECTEDFAIL pass; FAIL, TIMEOUT, INTERRUPT,
UNEXPECTEDPASS and ERROR fail; SKIP is skipped. Prints each failed test's
name and result, then 'tests: N passed, N failed, N skipped'. Exit 0 when
at least one test ran and none failed, 1 otherwise, 2 when the log cannot be
read.
"""
import argparse
import json
import sys

PASSED = {"OK", "EXPECTEDFAIL"}
FAILED = {"FAIL", "TIMEOUT", "INTERRUPT", "UNEXPECTEDPASS", "ERROR"}
SKIPPED = {"SKIP"}


def read_log(path):
    """The test runs of a testlog.json, one dict per non-empty line."""
    runs = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                run = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
            if not isinstance(run, dict) or "name" not in run or "result" not in run:
                raise ValueError(f"{path}:{number}: not a test run (no name or result)")
            runs.append(run)
    return runs


def summarise(runs):
    """(passed, failed, skipped, [(name, result) of each failed run])."""
    passed = failed = skipped = 0
    failures = []
    for run in runs:
        result = run["result"]
        if result in PASSED:
            passed += 1
        elif result in SKIPPED:
            skipped += 1
        else:  # FAILED, and any result this meson does not name (still running, say)
            failed += 1
            failures.append((run["name"], result))
    return passed, failed, skipped, failures


def main():
    parser = argparse.ArgumentParser(prog="tools/lib/testlog.py", description=__doc__.splitlines()[0])
    parser.add_argument("testlog", help="meson's meson-logs/testlog.json")
    args = parser.parse_args()
    try:
        runs = read_log(args.testlog)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"tests: cannot read the test log: {e}", file=sys.stderr)
        sys.exit(2)
    passed, failed, skipped, failures = summarise(runs)
    for name, result in failures:
        print(f"failed: {name} ({result})")
    if not runs:
        print("no test ran")
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(0 if runs and failed == 0 else 1)


if __name__ == "__main__":
    main()

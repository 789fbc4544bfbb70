#!/usr/bin/env python3
"""Test of tools/check-trace on a real trace and on broken ones.

1. `cuboid simulate --trace --trace-per-rank` of the seed's Llama-3-70B
   TP4 x PP4 x DP2 plan (one file per stage's simulated rank) passes every
   structural check and shows 1F1B on every stage.
2. The checker is not vacuous: the same real trace with two steps swapped
   fails the 1F1B check, and small hand-made files, each breaking one rule
   (one per rule of Perfetto's importer that tools/check-trace lists), fail
   with the exact message expected.
3. A single-file trace of ranks 1 and 8 passes too (rank 1 is where a tid 0
   would collide with stream 1 in Perfetto).
4. tools/trace-svg draws the per-rank traces: one row per stage, one box per
   forward / backward step.

  check_trace_test.py --checker tools/check-trace --cuboid build/cuboid [--svg tools/trace-svg]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

failures = []


def expect(cond, what):
    # The checker's output (after the first line) only when it matters.
    print("ok   " + what.split("\n")[0] if cond else "FAIL " + what)
    if not cond:
        failures.append(what)


def run_checker(checker, files, *flags):
    p = subprocess.run([sys.executable, checker, *flags, *files], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def write(path, doc_or_text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text))
    return path


def meta(pid, tid=0):
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid} (stage 0)"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "compute"}}]


def x(name, ts, dur, pid=0, tid=0, cat="compute"):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checker", required=True)
    ap.add_argument("--cuboid", required=True)
    ap.add_argument("--svg", help="tools/trace-svg, to check its drawing of the real trace")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "llama70b.json")
        sim = subprocess.run([a.cuboid, "simulate", "--model", "models/llama3-70b.json",
                              "--cluster", "topologies/dgx-a100-4node.json", "--tp", "4", "--pp", "4",
                              "--recompute", "full", "--zero", "1", "--global-batch", "64",
                              "--trace", base, "--trace-per-rank"], capture_output=True, text=True)
        expect(sim.returncode == 0, f"cuboid simulate --trace exits 0 ({sim.stderr.strip()[:200]})")
        files = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.startswith("llama70b.rank"))
        expect(len(files) == 4, f"one trace file per stage ({len(files)} written)")
        rc, out = run_checker(a.checker, files, "--per-rank", "--expect-1f1b", "4")
        expect(rc == 0 and out.count(": ok (") == 4 and "1F1B on 1 ranks" in out,
               "the real per-rank traces pass every check and show 1F1B\n" + out)
        rc, out = run_checker(a.checker, files, "--expect-1f1b", "4", "--micro-batches", "16")
        expect(rc == 1 and "32 micro-batches" not in out and "16 micro-batches" in out,
               "a wrong micro-batch count is caught\n" + out[:300])

        # Swap the names of stage 0's first backward and the forward before it.
        with open(files[0], encoding="utf-8") as f:
            doc = json.load(f)
        steps = sorted((e for e in doc["traceEvents"] if e.get("cat") in ("forward", "backward")),
                       key=lambda e: e["ts"])
        k = next(i for i, e in enumerate(steps) if e["name"] == "B0")
        steps[k]["name"], steps[k - 1]["name"] = steps[k - 1]["name"], steps[k]["name"]
        swapped = write(os.path.join(tmp, "swapped.rank0.json"), doc)
        rc, out = run_checker(a.checker, [swapped], "--expect-1f1b", "4")
        expect(rc == 1 and "step 3 breaks 1F1B (pp 4, 32 micro-batches, 3 warm-up forwards): "
               "got ... F0 F1 F2 B0 F3 F4 B1 ..., expected ... F0 F1 F2 F3 B0 F4 B1 ..." in out,
               "swapped steps in a real trace break 1F1B\n" + out)

        single = os.path.join(tmp, "ranks1and8.json")
        sim = subprocess.run([a.cuboid, "simulate", "--model", "models/llama3-70b.json",
                              "--cluster", "topologies/dgx-a100-4node.json", "--tp", "4", "--pp", "4",
                              "--recompute", "full", "--zero", "1", "--global-batch", "64",
                              "--trace", single, "--trace-ranks", "1,8"], capture_output=True, text=True)
        rc, out = run_checker(a.checker, [single], "--expect-1f1b", "4")
        expect(sim.returncode == 0 and rc == 0 and "1F1B on 2 ranks" in out,
               "a single-file trace of ranks 1 and 8 passes every check\n" + out + sim.stderr[:200])

        if a.svg:
            svg = os.path.join(tmp, "pipeline.svg")
            p = subprocess.run([sys.executable, a.svg, "-o", svg, *files], capture_output=True, text=True)
            ok = p.returncode == 0
            if ok:
                import xml.dom.minidom
                dom = xml.dom.minidom.parse(svg)
                boxes = [r for r in dom.getElementsByTagName("rect") if r.getElementsByTagName("title")]
                rows = sorted({r.getAttribute("y") for r in boxes})
                titles = [r.getElementsByTagName("title")[0].firstChild.data.split()[0] for r in boxes]
                ok = (len(rows) == 4 and len(boxes) == 4 * 64
                      and all(titles.count(f"{d}{m}") == 4 for d in "FB" for m in range(32)))
            expect(ok, f"trace-svg draws 4 rows of 32 forwards and 32 backwards\n{p.stderr}")

        cases = [
            ("partial overlap", {"traceEvents": meta(0) + [x("a", 0, 2), x("b", 1, 2)]}, [],
             "pid 0 tid 0: event 2 'a' [0, 2000) ns and event 3 'b' [1000, 3000) ns overlap without nesting"),
            ("nested and disjoint are fine", {"traceEvents": meta(0) + [x("a", 0, 2), x("b", 0.5, 1.5), x("c", 2, 1)]},
             [], None),
            ("thread without a name", {"traceEvents": meta(0) + [x("a", 0, 1, tid=3)]}, [],
             "pid 0 tid 3 has X events but no thread_name metadata event"),
            ("process without a name", {"traceEvents": [x("a", 0, 1, pid=5)]}, [],
             "pid 5 has X events but no process_name metadata event"),
            ("negative duration", {"traceEvents": meta(0) + [x("a", 0, -1)]}, [],
             "event 2 (X 'a'): negative \"dur\" -1"),
            ("missing ts", {"traceEvents": meta(0) + [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "dur": 1}]}, [],
             "event 2 (X 'a'): \"ts\" missing or not a finite number"),
            ("missing tid", {"traceEvents": meta(0) + [{"ph": "X", "name": "a", "pid": 0, "ts": 0, "dur": 1}]}, [],
             "event 2 (X 'a'): \"tid\" missing or not an integer"),
            ("NaN timestamp", '{"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": NaN, "dur": 1}]}',
             [], "not valid trace JSON: non-finite number NaN (JSON has no NaN / Infinity)"),
            ("bad thread_name args", {"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {}}]},
             [], "event 0 (M 'thread_name'): args.name missing or not a non-empty string"),
            ("empty process name", {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                                                     "args": {"name": ""}}]},
             [], "event 0 (M 'process_name'): args.name missing or not a non-empty string"),
            ("ph not a string", {"traceEvents": [{"ph": 5, "pid": 0, "tid": 0, "ts": 0}]}, [],
             "event 0 (5 None): \"ph\" must be a one-letter string"),
            ("displayTimeUnit", {"displayTimeUnit": "ns", "traceEvents": meta(0) + [x("a", 0, 1)]}, [],
             "\"displayTimeUnit\" is 'ns': older Perfetto versions then read ts and dur in that unit instead of "
             "microseconds (leave it out)"),
            ("tid 0 under a non-zero pid", {"traceEvents": meta(5) + [x("a", 0, 1, pid=5)]}, [],
             "pid 5 uses tid 0 (first in event 0): Perfetto reads tid 0 as unset and puts those events on tid 5 "
             "instead (use tids >= 1)"),
            ("negative pid", {"traceEvents": meta(0) + [x("a", 0, 1, pid=-1)]}, [],
             "event 2 (X 'a'): \"pid\" -1 is outside 0..4294967295 (Perfetto reads it as no pid)"),
            ("cat not a string", {"traceEvents": meta(0) + [dict(x("a", 0, 1), cat=7)]}, [],
             "event 2 (X 'a'): \"cat\" is not a string"),
            ("args not an object", {"traceEvents": meta(0) + [dict(x("a", 0, 1), args="x")]}, [],
             "event 2 (X 'a'): \"args\" is not an object"),
            ("array field", {"traceEvents": meta(0) + [dict(x("a", 0, 1), stack=[1, 2])]}, [],
             "event 2 (X 'a'): field \"stack\" is an array (Perfetto's tokenizer rejects the whole file)"),
            ("missing dur", {"traceEvents": meta(0) + [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0}]}, [],
             "event 2 (X 'a'): \"dur\" missing or not a finite number"),
            # 1.001 us is 1000.9999999999999 ns as a double: truncated to 1000, so the kernel that ends
            # where the span ends (1001 ns) sticks out by 1 ns.
            ("nesting broken by truncation", '{"traceEvents": [' + ", ".join(json.dumps(e) for e in meta(0)) +
             ', {"ph": "X", "name": "span", "pid": 0, "tid": 0, "ts": 0, "dur": 1.001}'
             ', {"ph": "X", "name": "kernel", "pid": 0, "tid": 0, "ts": 0.001, "dur": 1}]}', [],
             "pid 0 tid 0: event 2 'span' [0, 1000) ns and event 3 'kernel' [1, 1001) ns overlap without nesting "
             "once ts and dur are truncated to whole ns, as Perfetto's json_utils.cc CoerceToTs does"),
            ("enclosing event listed second", {"traceEvents": meta(0) + [x("k", 0, 1), x("span", 0, 2)]}, [],
             "pid 0 tid 0: event 3 'span' encloses event 2 'k' that starts at the same ts but comes first in the "
             "file (older Perfetto keeps file order at equal ts and would nest it the other way round)"),
            ("too deep", {"traceEvents": meta(0) + [x(f"d{k}", 0, 1000 - k) for k in range(256)]}, [],
             "pid 0 tid 0: events nest 256 levels deep; Perfetto keeps 255 and drops the events below"),
            ("255 levels are fine", {"traceEvents": meta(0) + [x(f"d{k}", 0, 1000 - k) for k in range(255)]}, [],
             None),
            ("array, not object", [], [], 'not a JSON object (expected {"traceEvents": [...]})'),
            ("per-rank without distributedInfo", {"traceEvents": meta(0) + [x("a", 0, 1)]}, ["--per-rank"],
             'per-rank file without an integer "distributedInfo": {"rank": ...}'),
            ("rank file of another pid", {"distributedInfo": {"rank": 0}, "traceEvents": meta(1) + [x("a", 0, 1, pid=1)]},
             [], "distributedInfo.rank is 0 but the file has events of pid 1"),
        ]
        for i, (what, doc, flags, message) in enumerate(cases):
            # ".rank0.json" names make the rank check apply to the last case.
            name = f"case{i}.rank0.json" if what == "rank file of another pid" else f"case{i}.json"
            path = write(os.path.join(tmp, name), doc)
            rc, out = run_checker(a.checker, [path], *flags)
            if message is None:
                expect(rc == 0, f"{what}: passes\n{out}")
            else:
                expect(rc == 1 and f"{path}: {message}\n" in out, f"{what}: exit 1 with '{message}'\n{out}")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

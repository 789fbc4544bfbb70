#!/usr/bin/env python3
"""The HTML plan report (`--report`) in a real browser: Debian's headless Chromium.

1. `cuboid plan ... --report` of a small TP 2 x PP 2 x DP 2 plan and `cuboid
   simulate --plan ... --report --trace` of its winner are loaded with
   `--dump-dom` at `#selftest`, which makes the page's script sort every numeric
   column of each table and measure each section, and record what it saw.
2. Each page must finish its script (#report-status data-state="ready") with no
   error: none recorded by the page's own error hook (<html data-errors>,
   #report-errors), none on the browser's console.
3. Every section is there and drawn (header, ranked, pareto, mesh, timeline,
   breakdown, explain for plan; header, mesh, timeline, breakdown for simulate);
   the page references nothing outside itself.
4. Sorting works: each recorded sort is in order, with every row.
5. The timeline is the simulator's trace (`simulate --trace` of the same plan,
   another process): the same stages on the same ranks, the same forward and
   backward steps (and the optimizer step) with the same start and end in
   nanoseconds, and each communication row's drawn blocks exactly covering the
   trace's events of that stream (merged below a pixel, counted in data-count).
6. The checks are not vacuous: the report with its script broken, with a
   section removed and with one timeline block moved by 1 us must each fail.

Exit 77 (meson: skipped) only when no Chromium is installed; a browser that is
installed but does not run is a failure.

  report_browser_test.py --cuboid build/cuboid [--browser chromium-headless-shell]
"""
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
PLAN_SECTIONS = ["header", "ranked", "pareto", "mesh", "timeline", "breakdown", "explain"]
SIMULATE_SECTIONS = ["header", "mesh", "timeline", "breakdown"]
ROW_TID = {"compute": 1, "tp": 2, "pp-forward": 3, "pp-backward": 4, "dp": 5}  # the trace's tid per timeline row
BROWSERS = ["chromium-headless-shell", "chromium", "chromium-browser"]
PLAN_ARGS = ["--model", "models/gpt-small.json", "--cluster", "topologies/dgx-a100.json", "--nodes", "1",
             "--tp", "2", "--pp", "2", "--global-batch", "64"]


class Page(html.parser.HTMLParser):
    """What the checks need of a dumped DOM."""

    def __init__(self, text):
        super().__init__()
        self.ids = {}            # id -> attributes
        self.blocks = []         # attributes of each timeline block
        self.stages = []         # attributes of each timeline stage group
        self.rows = {}           # table id -> rows
        self.errors = []         # texts of #report-errors items
        self.html_attrs = {}
        self.selftest = None
        self._table = None
        self._in_errors = False
        self._capture = None     # id whose text is being read
        self._text = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.html_attrs = a
        if "id" in a:
            self.ids[a["id"]] = a
        cls = a.get("class", "").split()
        if tag == "rect" and "tl-block" in cls:
            self.blocks.append(a)
        if tag == "g" and "tl-stage" in cls:
            self.stages.append(a)
        if tag == "table":
            self._table = a.get("id")
            self.rows[self._table] = 0
        if tag == "tr" and self._table and "data-i" in a:
            self.rows[self._table] += 1
        if a.get("id") == "report-errors":
            self._in_errors = True
        if tag == "li" and self._in_errors:
            self._capture, self._text = "error", []
        if a.get("id") == "report-selftest":
            self._capture, self._text = "selftest", []

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        if tag == "ul":
            self._in_errors = False
        if self._capture == "error" and tag == "li":
            self.errors.append("".join(self._text))
            self._capture = None
        if self._capture == "selftest" and tag == "pre":
            self.selftest = json.loads("".join(self._text))
            self._capture = None

    def handle_data(self, data):
        if self._capture:
            self._text.append(data)


def find_browser(explicit):
    if explicit:
        return shutil.which(explicit) or explicit
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    return None


def load(browser, path, tmp):
    """The DOM after the page's script ran at #selftest, and the console lines."""
    profile = tempfile.mkdtemp(dir=tmp, prefix="profile-")
    env = dict(os.environ, HOME=profile, XDG_CONFIG_HOME=profile, XDG_CACHE_HOME=profile)
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0", "--window-size=1280,2000",
           "--dump-dom", "file://" + os.path.abspath(path) + "#selftest"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if p.returncode != 0 or "<html" not in p.stdout:
        raise RuntimeError(f"{os.path.basename(browser)} did not load {path} (exit {p.returncode}):\n{p.stderr[-3000:]}")
    console = [line for line in p.stderr.splitlines() if ":CONSOLE" in line]
    return p.stdout, console


def ns(us):
    """Trace microseconds ("us.nnn01", trace.hpp) to integer nanoseconds."""
    return round(us * 1000)


def trace_blocks(trace_path):
    """Per stage: its rank and, per timeline row, the trace's events as (start, end, name, cat)."""
    doc = json.load(open(trace_path))
    stage_of, per = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            stage_of[e["pid"]] = int(re.search(r"stage (\d+)", e["args"]["name"]).group(1))
    for e in doc["traceEvents"]:
        if e["ph"] != "X" or e["cat"] == "kernel":
            continue
        start = ns(e["ts"])
        per.setdefault((stage_of[e["pid"]], e["tid"]), []).append((start, start + ns(e["dur"]), e["name"], e["cat"]))
    ranks = {stage: pid for pid, stage in stage_of.items()}
    # The compute row: the steps, and what runs outside them (the optimizer step).
    for (stage, tid), events in per.items():
        if tid != ROW_TID["compute"]:
            continue
        steps = [ev for ev in events if ev[3] in ("forward", "backward")]
        outside = [ev for ev in events if ev[3] not in ("forward", "backward")
                   and not any(s[0] <= ev[0] and ev[1] <= s[1] for s in steps)]
        per[(stage, tid)] = steps + outside
    return ranks, per


def check_timeline(page, ranks, per, end_ns, expect):
    stages = {int(g["data-stage"]): int(g["data-rank"]) for g in page.stages}
    expect(stages == ranks, f"timeline stages and ranks {stages} are the trace's {ranks}")
    svg = page.ids.get("timeline-svg", {})
    expect(int(svg.get("data-end-ns", -1)) == end_ns, f"timeline ends at the simulated iteration's end ({end_ns} ns)")
    drawn = {}
    for b in page.blocks:
        key = (int(b["data-stage"]), ROW_TID[b["data-row"]])
        drawn.setdefault(key, []).append((int(b["data-start-ns"]), int(b["data-end-ns"]), b["data-name"],
                                          b["data-category"], int(b["data-count"])))
    expect(set(drawn) == set(per), f"timeline rows {sorted(drawn)} are the trace's streams {sorted(per)}")
    for key in sorted(set(drawn) & set(per)):
        stage, tid = key
        events = sorted(per[key])
        blocks = sorted(drawn[key])
        if tid == ROW_TID["compute"]:
            got = [(s, e, n, c) for s, e, n, c, _ in blocks]
            want = [(s, e, n, c) for s, e, n, c in events]
            diff = [(g, w) for g, w in zip(got, want) if g != w][:3]
            expect(got == want and all(b[4] == 1 for b in blocks),
                   f"stage {stage} compute: {len(got)} blocks are the trace's {len(want)} steps"
                   + (f", first differences (drawn, trace): {diff}" if diff else ""))
            continue
        # Each trace event in exactly one drawn block, each block exactly spanning its events.
        covered = [[] for _ in blocks]
        lost = []
        for ev in events:
            inside = [i for i, b in enumerate(blocks) if b[0] <= ev[0] and ev[1] <= b[1]]
            if len(inside) == 1:
                covered[inside[0]].append(ev)
            else:
                lost.append(ev)
        bad = [b for b, evs in zip(blocks, covered)
               if not evs or b[0] != min(e[0] for e in evs) or b[1] != max(e[1] for e in evs) or b[4] != len(evs)]
        expect(not lost and not bad,
               f"stage {stage} row tid {tid}: {len(blocks)} drawn blocks cover the trace's {len(events)} events exactly"
               + (f"; not covered once: {lost[:3]}" if lost else "") + (f"; wrong blocks: {bad[:3]}" if bad else ""))


def check_page(page, console, sections, absent, expect, name):
    status = page.ids.get("report-status", {}).get("data-state")
    expect(status == "ready", f"{name}: the page's script finished (data-state={status})")
    expect(not page.errors and "data-errors" not in page.html_attrs, f"{name}: no error recorded by the page: {page.errors}")
    expect(not console, f"{name}: nothing on the browser's console: {console[:3]}")
    st = page.selftest or {}
    expect(bool(st), f"{name}: the self-test ran")
    heights = st.get("sections", {})
    for s in sections:
        expect(s in page.ids and heights.get(s, -1) > 0, f"{name}: section #{s} is there and drawn ({heights.get(s)} px)")
    for s in absent:
        expect(s not in page.ids, f"{name}: no section #{s}")
    tl = st.get("timeline", {})
    expect(tl.get("blocks", 0) == len(page.blocks) > 0 and tl.get("drawn") == tl.get("blocks"),
           f"{name}: every timeline block is drawn ({tl})")
    sorted_ok, sorted_bad = {}, []
    for sort in st.get("sorts", []):
        values = [float(v) for v in sort["values"]]
        ordered = sorted(values, reverse=sort["descending"])
        sorted_ok[sort["table"]] = sorted_ok.get(sort["table"], 0) + 1
        if values != ordered or len(values) != page.rows.get(sort["table"]):
            sorted_bad.append((sort["table"], sort["column"], sort["descending"], values))
    for table in [t for t in ("ranked-table", "explain-table") if t.split("-")[0] in sections]:
        expect(sorted_ok.get(table, 0) >= 2, f"{name}: {table} sorted {sorted_ok.get(table, 0)} times "
                                             f"(every numeric column, both ways)")
    expect(not sorted_bad, f"{name}: every sort is in order with every row {sorted_bad[:2]}")


def self_contained(text, expect, name):
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"'#][^"']*)""", text)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text)) - {"http://www.w3.org/2000/svg"}
    expect(not refs and not urls and "<link" not in text, f"{name}: references nothing outside itself {refs[:3]} {sorted(urls)[:3]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuboid", required=True)
    ap.add_argument("--browser", help="the browser to use (default: the first of %s found)" % ", ".join(BROWSERS))
    a = ap.parse_args()
    browser = find_browser(a.browser)
    if browser is None:
        print("SKIP: no headless Chromium installed (Debian's chromium-headless-shell; tools/test installs it)")
        return SKIP
    failures = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    def quiet(cond, what):  # for the negative controls: collect, do not print
        if not cond:
            quiet.failed.append(what)

    def run(*args):
        p = subprocess.run([a.cuboid, *args], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"cuboid {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
        return p.stdout

    with tempfile.TemporaryDirectory(prefix="cuboid-report-") as tmp:
        plan_html, plan_json = os.path.join(tmp, "plan.html"), os.path.join(tmp, "plan.json")
        sim_html, trace = os.path.join(tmp, "simulate.html"), os.path.join(tmp, "trace.json")
        run("plan", *PLAN_ARGS, "--report", plan_html, "--out", plan_json)
        sim = json.loads(run("simulate", "--plan", plan_json, "--trace", trace, "--report", sim_html, "--json"))
        end_ns = round(sim["iteration_time_s"] * 1e9)
        ranks, per = trace_blocks(trace)
        print(f"browser: {browser}; trace: {len(ranks)} stages, {sum(len(v) for v in per.values())} blocks")

        for path, sections, absent, name in [(plan_html, PLAN_SECTIONS, [], "plan --report"),
                                             (sim_html, SIMULATE_SECTIONS, ["ranked", "pareto", "explain"],
                                              "simulate --report")]:
            text = open(path, encoding="utf-8").read()
            self_contained(text, expect, name)
            dom, console = load(browser, path, tmp)
            page = Page(dom)
            check_page(page, console, sections, absent, expect, name)
            check_timeline(page, ranks, per, end_ns, lambda c, w, n=name: expect(c, f"{n}: {w}"))

        # The checks fail on a broken page: a script error, a missing section, a moved block.
        text = open(plan_html, encoding="utf-8").read()
        # Each with the failure it must cause (a substring of the failed check).
        broken = {
            "a syntax error in the script": (text.replace("(function () {\n  'use strict';\n  var each",
                                                          "(function () {\n  var each = ;", 1),
                                             ["no error recorded by the page", "nothing on the browser's console",
                                              "script finished"]),
            "a runtime error in the script": (text.replace("var tables = document", "var tables = null.x = document", 1),
                                              ["no error recorded by the page", "nothing on the browser's console",
                                               "script finished"]),
            "the explain section removed": (re.sub(r'<section id="explain">.*?</section>', "", text, flags=re.S),
                                            ["section #explain"]),
            "a timeline block moved by 1 us": (re.sub(r'(data-row="compute" data-name="[^"]*" data-category="forward" '
                                                      r'data-start-ns=")(\d+)',
                                                      lambda m: m.group(1) + str(int(m.group(2)) + 1000), text, count=1),
                                               ["compute:"]),
        }
        for what, (variant, must) in broken.items():
            expect(variant != text, f"control '{what}' changes the page")
            path = os.path.join(tmp, "broken.html")
            open(path, "w", encoding="utf-8").write(variant)
            quiet.failed = []
            dom, console = load(browser, path, tmp)
            page = Page(dom)
            check_page(page, console, PLAN_SECTIONS, [], quiet, "broken")
            check_timeline(page, ranks, per, end_ns, quiet)
            missing = [m for m in must if not any(m in f for f in quiet.failed)]
            expect(not missing, f"control '{what}' fails as it must ({len(quiet.failed)} failed checks: "
                                f"{quiet.failed[:1]}{'; missing: ' + str(missing) if missing else ''})")

    print(f"{len(failures)} failure(s)" if failures else "all report checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

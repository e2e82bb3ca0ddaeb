#!/usr/bin/env python3
"""Where a case's time goes between its kernels, from a `twell bench --timeline` trace.

    scripts/timeline_summary.py TRACE.csv SUMMARY.md [--min-gap-us G] [--top N]

For each traced case and timing call (bench/include/twell/bench/timeline.hpp), the runs are split
at the harness's L2 flush. A run spans from the flush's end to the end of its last GPU activity
(about what the bench's events time); busy is the union of its kernels, copies and memsets, idle
the rest. Each idle gap is split by when the host called the API that queued the activity after
it: "host" is the part of the gap before that call began (the GPU had nothing queued: the host
was late, e.g. waiting in a synchronisation), "queue" the rest (launch latency and dependency
resolution with the work already queued). A kernel launched early (docs/decisions.md, "Kernels
launch early") is recorded from when it starts on the GPU, which may be while the kernel before it
still runs and it waits: kernels then overlap, busy includes that waiting, and idle is the time
with nothing on the GPU at all. Where every run has the same activities, each gap is the median
over the runs at its position; otherwise the median run's own. Prints one line per case and call;
writes the tables to SUMMARY.md.
"""
import argparse
import bisect
import csv
import re
import statistics
import sys
from collections import defaultdict

GPU_KINDS = {"kernel", "memcpy", "memset", "flush"}
# Runtime calls that wait for the GPU: time the host spends in them is time it queues nothing.
WAITS = re.compile(r"Synchronize|^cudaMemcpy(_v\d+)?$|^cudaMemcpy2D(_v\d+)?$")


def short_name(row):
    """A kernel's function name without namespaces, template arguments and parameters."""
    if row["kind"] != "kernel":
        return row["name"] if row["kind"] != "memcpy" else "memcpy %d B" % row["bytes"]
    name = row["name"][5:] if row["name"].startswith("void ") else row["name"]
    name = name.replace("(anonymous namespace)::", "")
    depth, plain = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            if ch == "(":
                break
            plain.append(ch)
    return "".join(plain).split("::")[-1].strip() or name[:60]


def load(path):
    groups = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for key in ("start_ns", "end_ns", "correlation", "bytes", "stream"):
                r[key] = int(r[key])
            r["call"] = int(r["call"])
            groups[(r["case"], r["call"])].append(r)
    return groups


def runs_of(rows):
    """The runs of one timing call: lists of GPU activities, each after its flush."""
    gpu = sorted((r for r in rows if r["kind"] in GPU_KINDS), key=lambda r: r["start_ns"])
    flushes = [r for r in gpu if r["kind"] == "flush"]
    runs = []
    for i, flush in enumerate(flushes):
        stop = flushes[i + 1]["start_ns"] if i + 1 < len(flushes) else float("inf")
        acts = [r for r in gpu if r["kind"] != "flush" and flush["end_ns"] <= r["start_ns"] < stop]
        if acts:
            runs.append((flush, acts))
    return runs


def host_before(calls, starts, t):
    """The last API call that began and ended before time t (the host's work before its launch)."""
    i = bisect.bisect_left(starts, t) - 1
    while i >= 0 and calls[i]["end_ns"] > t:
        i -= 1
    return calls[i]["name"].split("_v")[0] if i >= 0 else "-"


def analyse(flush, acts, launch_start, waits, calls, starts):
    """Span, busy time and the gaps (with their host part) of one run, in µs."""
    t0 = flush["end_ns"]
    covered_to = t0
    busy = 0
    gaps = []
    prev = None
    for a in acts:
        if a["start_ns"] > covered_to:
            gap = a["start_ns"] - covered_to
            called = launch_start.get(a["correlation"])
            host = min(gap, max(0, called[0] - covered_to)) if called is not None else 0
            gaps.append({"prev": short_name(prev) if prev else "(run start)", "next": short_name(a),
                         "gap": gap / 1e3, "host": host / 1e3,
                         "queued_by": called[1].split("_v")[0] if called else "?",
                         "host_before": host_before(calls, starts, called[0]) if called else "?"})
        busy += max(0, a["end_ns"] - max(a["start_ns"], covered_to))
        covered_to = max(covered_to, a["end_ns"])
        prev = a
    span = covered_to - t0
    waited = sum(min(w["end_ns"], covered_to) - max(w["start_ns"], t0)
                 for w in waits if w["end_ns"] > t0 and w["start_ns"] < covered_to)
    return {"span": span / 1e3, "busy": busy / 1e3, "gaps": gaps, "waits": waited / 1e3, "count": len(acts)}


def summarize(case, call, rows, min_gap, top):
    api = [r for r in rows if r["kind"] in ("runtime", "driver")]
    launch_start = {}
    for r in api:  # the outermost call that queued each activity: (its start, its name)
        c = r["correlation"]
        if c not in launch_start or r["start_ns"] < launch_start[c][0]:
            launch_start[c] = (r["start_ns"], r["name"])
    calls = sorted(api, key=lambda r: r["start_ns"])
    starts = [r["start_ns"] for r in calls]
    waits = [r for r in api if r["kind"] == "runtime" and WAITS.search(r["name"])]
    results = [analyse(f, acts, launch_start, waits, calls, starts) for f, acts in runs_of(rows)]
    if not results:
        return None, []
    med = lambda key: statistics.median(x[key] for x in results)
    idle = [x["span"] - x["busy"] for x in results]
    host = [sum(g["host"] for g in x["gaps"]) for x in results]
    line = {"case": case, "call": call, "runs": len(results), "span": med("span"), "busy": med("busy"),
            "idle": statistics.median(idle), "host": statistics.median(host), "waits": med("waits"),
            "activities": med("count"), "gaps": statistics.median(len(x["gaps"]) for x in results)}
    same = len({(x["count"], len(x["gaps"])) for x in results}) == 1 and all(
        [(g["prev"], g["next"]) for g in x["gaps"]] == [(g["prev"], g["next"]) for g in results[0]["gaps"]]
        for x in results)
    if same:
        gaps = [dict(results[0]["gaps"][i],
                     gap=statistics.median(x["gaps"][i]["gap"] for x in results),
                     host=statistics.median(x["gaps"][i]["host"] for x in results))
                for i in range(len(results[0]["gaps"]))]
        line["gap_basis"] = "median over runs by position"
    else:
        spans = sorted(results, key=lambda x: x["span"])
        gaps = spans[len(spans) // 2]["gaps"]
        line["gap_basis"] = "the median run's own (runs differ in their activities)"
    big = sorted((g for g in gaps if g["gap"] >= min_gap), key=lambda g: -g["gap"])[:top]
    line["gap_sum"] = sum(g["gap"] for g in gaps)
    line["host_sum"] = sum(g["host"] for g in gaps)
    return line, big


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("summary")
    p.add_argument("--min-gap-us", type=float, default=2.0)
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    groups = load(a.trace)
    md = ["# Timeline summary of %s" % a.trace, "",
          "µs per run: median over the runs of each case's timing call. A run spans from the L2 flush's "
          "end to its last GPU activity's end; idle = span - busy; host = the part of the idle gaps before "
          "the host began the call that queued the next activity; waits = host time inside synchronising "
          "calls during the run. Tracing adds host time to every API call.", "",
          "| case | call | runs | activities | span | busy | idle | of which host | gaps | host waits |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    tables = []
    for (case, call), rows in sorted(groups.items()):
        line, big = summarize(case, call, rows, a.min_gap_us, a.top)
        if line is None:
            continue
        md.append("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %d | %.1f |" % (
            case, call, line["runs"], line["activities"], line["span"], line["busy"], line["idle"], line["host"],
            line["gaps"], line["waits"]))
        print("%s call %d: %d runs, span %.1f us, busy %.1f, idle %.1f (host %.1f), %d gaps" % (
            case, call, line["runs"], line["span"], line["busy"], line["idle"], line["host"], line["gaps"]))
        t = ["", "## %s, call %d" % (case, call), "",
             "Gaps of %.1f µs or more, largest first (%s; all gaps sum to %.1f µs, host part %.1f):" % (
                 a.min_gap_us, line["gap_basis"], line["gap_sum"], line["host_sum"]), "",
             "| after | before | gap µs | host µs | queued by | the host's call before that |",
             "|---|---|---|---|---|---|"]
        t += ["| %s | %s | %.1f | %.1f | %s | %s |" % (g["prev"], g["next"], g["gap"], g["host"], g["queued_by"],
                                                    g["host_before"]) for g in big]
        tables += t
    with open(a.summary, "w") as f:
        f.write("\n".join(md + tables) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs bench/plot.py on the benchmark reports in docs/benchmarks: the markdown summary of every
report, and the plots of the newest report (by its meta.date) holding each suite, since drawing
all of them takes minutes; with --no-plots (a python without matplotlib) only the summaries.

gpu-check.sh runs plot.py after the benchmarks, on whichever suites the call ran; a report that
plot.py cannot take is found here rather than after a GPU run. Usage:
plot_check.py REPO_ROOT [--no-plots]. Exits non-zero naming each report that failed.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile


def check_break_evens(root):
    """plot.break_evens on hand-made lines: every crossing of 1, placed where the straight segment
    on log-log axes crosses it; none for a line on one side; a pair at one density skipped."""
    sys.path.insert(0, os.path.join(root, "bench"))
    import plot

    def close(got, want):
        return len(got) == len(want) and all(abs(g - w) <= 1e-12 * w for g, w in zip(got, want))

    cases = [
        ([(0.001, 0.5), (0.01, 2.0), (0.1, 0.5)], [0.001 * 10 ** 0.5, 0.01 * 10 ** 0.5]),
        ([(0.001, 2.0), (0.01, 1.5)], []),
        ([(0.005, 1.2), (0.005, 0.9), (0.01, 0.8)], []),
        ([(0.01, 4.0), (0.02, 0.25)], [0.01 * 2 ** 0.5]),
    ]
    bad = [(pts, want, plot.break_evens(pts)) for pts, want in cases if not close(plot.break_evens(pts), want)]
    for pts, want, got in bad:
        print(f"plot_check.py: break_evens({pts}) = {got}, expected {want}")
    return not bad


def main(root, draw):
    if not check_break_evens(root):
        return 1
    reports = sorted(glob.glob(os.path.join(root, "docs", "benchmarks", "*.json")))
    if not reports:
        print("plot_check.py: no benchmark report under docs/benchmarks")
        return 1
    newest = {}  # suite -> (date, report): file names start with the device, not the date
    for report in reports:
        with open(report) as f:
            data = json.load(f)
        date = data.get("meta", {}).get("date", "")
        for suite in {c.get("suite") for c in data.get("cases", [])}:
            if suite not in newest or date >= newest[suite][0]:
                newest[suite] = (date, report)
    plotted = {report for _, report in newest.values()} if draw else set()
    failed = []
    for report in reports:
        with tempfile.TemporaryDirectory() as out:
            summary = os.path.join(out, "summary.md")
            args = [sys.executable, os.path.join(root, "bench", "plot.py"), report, "--single", "--out", out,
                    "--summary", summary]
            if report not in plotted:
                args.append("--no-plots")
            run = subprocess.run(args, capture_output=True, text=True)
            if run.returncode != 0 or not os.path.exists(summary) or os.path.getsize(summary) == 0:
                name = os.path.basename(report)
                failed.append(name)
                print(f"plot_check.py: {name}: exit {run.returncode}\n{run.stderr[-2000:]}")
    print(f"plot_check.py: {len(reports) - len(failed)} of {len(reports)} reports summarised, "
          f"plots drawn for {len(plotted)}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--no-plots"):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], draw=len(sys.argv) == 2))

#!/usr/bin/env python3
"""Runs bench/plot.py on the benchmark reports in docs/benchmarks: the markdown summary of every
report, and the plots of the newest report holding each suite (drawing all of them takes minutes).

gpu-check.sh runs plot.py after the benchmarks, on whichever suites the call ran; a report that
plot.py cannot take is found here rather than after a GPU run. Usage: plot_check.py REPO_ROOT.
Exits non-zero naming each report that failed.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile


def main(root):
    reports = sorted(glob.glob(os.path.join(root, "docs", "benchmarks", "*.json")))
    if not reports:
        print("plot_check.py: no benchmark report under docs/benchmarks")
        return 1
    plotted = {}  # suite -> the newest report holding it (names sort by date)
    for report in reports:
        with open(report) as f:
            for suite in {c.get("suite") for c in json.load(f).get("cases", [])}:
                plotted[suite] = report
    failed = []
    for report in reports:
        with tempfile.TemporaryDirectory() as out:
            summary = os.path.join(out, "summary.md")
            args = [sys.executable, os.path.join(root, "bench", "plot.py"), report, "--single", "--out", out,
                    "--summary", summary]
            if report not in plotted.values():
                args.append("--no-plots")
            run = subprocess.run(args, capture_output=True, text=True)
            if run.returncode != 0 or os.path.getsize(summary) == 0:
                failed.append(os.path.basename(report))
                print(f"plot_check.py: {os.path.basename(report)}: exit {run.returncode}\n{run.stderr[-2000:]}")
    print(f"plot_check.py: {len(reports) - len(failed)} of {len(reports)} reports taken (plots drawn for {len(set(plotted.values()))})")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))

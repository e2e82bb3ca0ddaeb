#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of gpu__time_duration.sum (gpu-check.sh --profile).

Usage: ncu_summary.py PROFILE_CSV OUT_MD CASE [RUNS]

Writes OUT_MD: one row per kernel launch in launch order (kernel, grid, microseconds), their sum
and the sum per run of the op, and prints a one-line summary. The NVTX range of a bench case
holds every run of the op (warm-up and timed: two with --warmup 1 --reps 1), which RUNS (default
1) names. Exits 1 when the CSV holds no launch: the case name did not match a range
(bench/suites/common.cpp names them).
"""
import csv
import sys

TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def launches(path):
    header = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
            elif header and len(row) == len(header):
                rec = dict(zip(header, row))
                if rec.get("Metric Name") != "gpu__time_duration.sum":
                    continue
                value = float(rec["Metric Value"].replace(",", ""))
                yield rec["Kernel Name"], rec.get("Grid Size", ""), value * TO_US[rec["Metric Unit"]]


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    csv_path, md_path, case = sys.argv[1:4]
    runs = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    if runs < 1:
        sys.exit("ncu_summary.py: RUNS must be at least 1")
    rows = list(launches(csv_path))
    total = sum(us for _, _, us in rows)
    with open(md_path, "w") as md:
        md.write(f"# Kernels of `{case}`\n\n")
        if not rows:
            md.write("No kernel launch in the range: check the case name against the NVTX ranges.\n")
        else:
            md.write("| # | kernel | grid | µs |\n|---|---|---|---|\n")
            for i, (name, grid, us) in enumerate(rows):
                md.write(f"| {i} | `{name[:100]}` | {grid} | {us:.1f} |\n")
            md.write(f"\n{len(rows)} launches, {total:.1f} µs in all: {total / runs:.1f} µs per run of the op "
                     f"({runs} run{'s' if runs > 1 else ''} in the range).\n")
    if not rows:
        return 1
    print(f"{len(rows)} launches, {total:.0f} us in all, {total / runs:.0f} us per run ({runs} in the range)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

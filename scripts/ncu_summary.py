#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of gpu__time_duration.sum (gpu-check.sh --profile).

Usage: ncu_summary.py PROFILE_CSV OUT_MD CASE [RUNS]

Writes OUT_MD: one row per kernel launch in launch order (kernel, grid, microseconds, then any
other metric the CSV holds, one column each, in the order they first appear: gpu-check.sh
--profile-metrics), their sum and the sum per run of the op, and prints a one-line summary that
names the other metrics. The NVTX range of a bench case holds every run of the op (warm-up and
timed: two with --warmup 1 --reps 1), which RUNS (default 1) names. Exits 1 when the CSV holds no
launch: the case name did not match a range (bench/suites/common.cpp names them).
"""
import csv
import sys

TIME = "gpu__time_duration.sum"
TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def launches(path):
    """(kernel, grid, µs, {metric: "value unit"}) per launch ID, in launch order."""
    header = None
    found = {}  # launch ID -> its record, in first-seen (launch) order
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
            elif header and len(row) == len(header):
                rec = dict(zip(header, row))
                launch = found.setdefault(rec["ID"], {"kernel": rec["Kernel Name"], "grid": rec.get("Grid Size", ""),
                                                      "us": None, "other": {}})
                name, value, unit = rec.get("Metric Name"), rec["Metric Value"], rec.get("Metric Unit", "")
                if name == TIME:
                    launch["us"] = float(value.replace(",", "")) * TO_US[unit]
                else:
                    launch["other"][name] = f"{value} {unit}".strip()
    for launch in found.values():
        if launch["us"] is not None:
            yield launch["kernel"], launch["grid"], launch["us"], launch["other"]


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    csv_path, md_path, case = sys.argv[1:4]
    runs = int(sys.argv[4]) if len(sys.argv) == 5 else 1
    if runs < 1:
        sys.exit("ncu_summary.py: RUNS must be at least 1")
    rows = list(launches(csv_path))
    total = sum(us for _, _, us, _ in rows)
    metrics = list(dict.fromkeys(name for *_, other in rows for name in other))
    with open(md_path, "w") as md:
        md.write(f"# Kernels of `{case}`\n\n")
        if not rows:
            md.write("No kernel launch in the range: check the case name against the NVTX ranges.\n")
        else:
            md.write("| # | kernel | grid | µs |" + "".join(f" {m} |" for m in metrics) + "\n")
            md.write("|---|---|---|---|" + "---|" * len(metrics) + "\n")
            for i, (name, grid, us, other) in enumerate(rows):
                cells = "".join(f" {other.get(m, '')} |" for m in metrics)
                md.write(f"| {i} | `{name[:100]}` | {grid} | {us:.1f} |{cells}\n")
            md.write(f"\n{len(rows)} launches, {total:.1f} µs in all: {total / runs:.1f} µs per run of the op "
                     f"({runs} run{'s' if runs > 1 else ''} in the range).\n")
    if not rows:
        return 1
    also = f"; also {', '.join(metrics)}" if metrics else ""
    print(f"{len(rows)} launches, {total:.0f} us in all, {total / runs:.0f} us per run ({runs} in the range){also}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

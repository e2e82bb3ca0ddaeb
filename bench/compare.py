#!/usr/bin/env python3
"""Compares the JSON of several `twell bench --out` runs case by case.

    python3 bench/compare.py base.json other.json [...] [--op spmm] [--variant twell] [--out FILE]

Prints a markdown table: one row per case (suite, op, variant, shape, M, distribution, density
target), the median ms of each file, and each later file's median over the first's, or, for a
file of a later round (NAME.rK.json, as bench-variants.sh --rounds writes them), over the first
file's own round K where there is one (so that a round's ratios do not carry the base's drift
between rounds; the base's later rounds are still over its first, which shows that drift). Meant for
builds of one tree timed in one call on one device (scripts/bench-variants.sh writes such files):
the ratio of medians is only meaningful between runs on the same GPU. A case missing from a file,
or not "ok" there, shows as "-"; a case "ok" in none of them is left out. Columns are named by the
files' base names (their paths where two base names are the same). Exits 1 when no case passes
the filters. Needs the standard library only.
"""
import argparse
import json
import os
import re
import sys

KEY_FIELDS = ("suite", "op", "variant", "shape", "M", "distribution", "density_target")


def medians(path):
    """{case key: median ms} of the file's cases whose status is ok."""
    with open(path) as f:
        report = json.load(f)
    out = {}
    for c in report.get("cases", []):
        if c.get("status") != "ok":
            continue
        out[tuple(c.get(k) for k in KEY_FIELDS)] = c["ms"]["median"]
    return out


def split_round(name):
    """("new", 2) for "new.r2", (name, 1) for a name without a round suffix."""
    m = re.fullmatch(r"(.*)\.r([0-9]+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 1)


def ratio_bases(stems):
    """For each file after the first, the index of the file its ratio is over: the first file's
    variant in the same round where there is one (and it is not the file itself), else the first."""
    first = split_round(stems[0])[0]
    where = {split_round(s): i for i, s in enumerate(stems)}
    bases = []
    for i, s in enumerate(stems[1:], start=1):
        j = where.get((first, split_round(s)[1]), 0)
        bases.append(0 if j == i else j)
    return bases


def table(paths, op=None, variant=None):
    runs = [medians(p) for p in paths]
    stems = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    names = stems if len(set(stems)) == len(stems) else list(paths)
    bases = ratio_bases(stems)
    keys = [k for k in dict.fromkeys(k for run in runs for k in run)  # first seen first
            if (op is None or k[1] == op) and (variant is None or k[2] == variant)]
    head = ["suite", "op", "variant", "shape", "M", "dist", "density"]
    head += [f"{n} ms" for n in names] + [f"{n} / {names[b]}" for n, b in zip(names[1:], bases)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in keys:
        ms = [run.get(k) for run in runs]
        cells = ["" if v is None else str(v) for v in k]
        cells += ["-" if v is None else f"{v:.4f}" for v in ms]
        cells += ["-" if v is None or ms[b] is None or ms[b] == 0 else f"{v / ms[b]:.3f}"
                  for v, b in zip(ms[1:], bases)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", len(keys)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="bench JSON files; the first is the base of the ratios")
    p.add_argument("--op", help="only cases of this op (e.g. spmm, spmm_at)")
    p.add_argument("--variant", help="only cases of this variant (e.g. twell)")
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args(argv)
    text, rows = table(args.files, args.op, args.variant)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if rows == 0:
        print("compare.py: no case passes the filters", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

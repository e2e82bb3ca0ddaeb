#!/usr/bin/env python3
"""Plots and summarises the JSON written by `twell bench --out`.

    python3 bench/plot.py bench.json [--out docs/benchmarks] [--single] [--summary FILE]

Draws speedup-versus-density plots (one PNG per suite, or all suites in one PNG with --single):
one panel per (shape, M) and distribution, one line per twell variant and baseline, the
break-even (speedup 1) marked where a line crosses it; where the JSON has floors (extra.floor), a
dashed line shows the speedup a kernel at the op's floor would have. --summary writes a markdown summary (the
device, the measured ceilings, the performance-contract rows that the JSON can fill, and a table
per suite) to paste into docs/benchmarks/README.md. Needs matplotlib only for the plots.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

TWELL_VARIANTS = {
    "spmm": ["twell", "twell+convert", "cusparse_csr", "cusparse_coo"],
    "sddmm": ["twell"],
    "convert": ["dense->hybrid", "dense->hybrid_plan", "dense->twell", "dense->twell_into",
                "dense->twell_into_async"],
    "gemm_to_sparse": ["twell", "twell_run_and_count", "twell_allocating", "twell_portable", "twell_decode_split"],
    "ffn": ["fused", "unfused", "fused_plain"],
    "training": ["twell", "twell_plan", "twell_backward", "twell_plan_backward"],
}
SUITE_ORDER = ["spmm", "sddmm", "convert", "gemm_to_sparse", "ffn", "training"]
# Ops a suite times besides its main one, and how their variants are labelled.
SECONDARY_OPS = {"spmm_at": "A^T"}
DISTRIBUTIONS = ["uniform", "neuron_skewed", "token_skewed"]


def load(path):
    with open(path) as f:
        return json.load(f)


def ok_cases(report, suite=None):
    """Cases that ran, with a usable median: the writer turns a NaN or Inf time into null, and
    such a case is not a measurement (nor is a zero time)."""
    for c in report.get("cases", []):
        median = (c.get("ms") or {}).get("median")
        usable = isinstance(median, (int, float)) and math.isfinite(median) and median > 0
        if c.get("status") == "ok" and usable and (suite is None or c.get("suite") == suite):
            yield c


def label(c):
    """The case's variant, marked with its op when that is a secondary one (spmm's A^T product)."""
    mark = SECONDARY_OPS.get(c.get("op"))
    return f"{c['variant']} [{mark}]" if mark else c["variant"]


FLOOR = "floor"


def series(report, suite):
    """{(shape, M): {distribution: {(variant, baseline): [(density, speedup), ...]}}}; cases with a
    floor (extra.floor, set_floor) add the line "floor" against their primary baseline: the speedup
    a kernel running at the op's floor would have (speedup x measured_over_floor), once a density."""
    out = OrderedDict()
    for c in ok_cases(report, suite):
        if c["variant"] not in TWELL_VARIANTS.get(suite, []):
            continue
        lines = out.setdefault((c["shape"], c["M"]), OrderedDict()).setdefault(c["distribution"], OrderedDict())
        for baseline, s in (c.get("extra", {}).get("speedup_vs") or {}).items():
            if s is None:
                continue
            lines.setdefault((label(c), baseline), []).append((c["density_target"], s))
        floor = c.get("extra", {}).get("floor")
        if isinstance(floor, dict) and floor.get("measured_over_floor") and c.get("speedup"):
            mark = SECONDARY_OPS.get(c.get("op"))
            pts = lines.setdefault((f"{FLOOR} [{mark}]" if mark else FLOOR, c["baseline"]), [])
            if all(d != c["density_target"] for d, _ in pts):
                pts.append((c["density_target"], c["speedup"] * floor["measured_over_floor"]))
    for panels in out.values():
        for lines in panels.values():
            for pts in lines.values():
                pts.sort()
    return out


def break_evens(points):
    """Every density where the speedup crosses 1, interpolated in log(density) and log(speedup)
    (straight on the plots' log-log axes); points sorted by density, one per density."""
    out = []
    for (d0, s0), (d1, s1) in zip(points, points[1:]):
        if d0 == d1 or s0 <= 0 or s1 <= 0:
            continue
        g0, g1 = math.log(s0), math.log(s1)
        if g0 * g1 > 0 or g0 == g1:  # both on one side of 1, or a flat stretch at 1
            continue
        t = -g0 / (g1 - g0)
        cross = math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))
        if not out or out[-1] != cross:
            out.append(cross)
    return out


def draw_suite_rows(fig_axes, report, suite, start_row):
    """Draws the suite's panels from row start_row; returns the rows used."""
    from matplotlib.ticker import FuncFormatter

    data = series(report, suite)
    row = start_row
    for (shape, m), panels in data.items():
        for col, dist in enumerate(DISTRIBUTIONS):
            ax = fig_axes[row][col]
            lines = panels.get(dist)
            ax.set_title(f"{suite}: {shape}, M={m}, {dist}", fontsize=9)
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
            if not lines:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=8)
                continue
            for (variant, baseline), pts in lines.items():
                xs = [100 * d for d, _ in pts]
                ys = [s for _, s in pts]
                style = dict(linestyle="--", marker="x") if variant.startswith(FLOOR) else dict(marker="o")
                (line,) = ax.plot(xs, ys, markersize=3, label=f"{variant} vs {baseline}", **style)
                for be in break_evens(pts):
                    ax.axvline(100 * be, color=line.get_color(), linewidth=0.6, linestyle=":")
                    ax.annotate(f"{100 * be:.2g}%", (100 * be, 1.0), fontsize=7, color=line.get_color(),
                                xytext=(2, 4), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel("density (%)", fontsize=8)
            ax.set_ylabel("speedup (baseline ms / ms)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
        row += 1
    return row - start_row


def rows_of(report, suite):
    return len(series(report, suite))


def plot(report, out_dir, single):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    device = report.get("device", {}).get("name", "unknown device")
    date = report.get("meta", {}).get("date", "")
    suites = [s for s in SUITE_ORDER if rows_of(report, s) > 0]
    written = []
    groups = [suites] if single else [[s] for s in suites]
    for group in groups:
        if not group:
            continue
        rows = sum(rows_of(report, s) for s in group)
        fig, axes = plt.subplots(rows, 3, figsize=(15, 3.6 * rows), squeeze=False)
        r = 0
        for s in group:
            r += draw_suite_rows(axes, report, s, r)
        fig.suptitle(f"twell bench, bf16, {device}, {date}", fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 0.98))
        name = "speedup.png" if single else f"{group[0]}.png"
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=80 if single else 100)
        plt.close(fig)
        written.append(path)
    return written


def fmt(x, digits=3):
    if x is None:
        return "-"
    return f"{x:.{digits}g}"


def find(report, suite, variant, shape="paper", m=None, density=None, dist="uniform"):
    for c in ok_cases(report, suite):
        if c.get("op") in SECONDARY_OPS:
            continue
        if c["variant"] != variant or c["shape"] != shape or c["distribution"] != dist:
            continue
        if m is not None and c["M"] != m:
            continue
        if density is not None and abs(c["density_target"] - density) > 1e-12:
            continue
        return c
    return None


def floor_text(c):
    """"; floor X ms (bound), Y x it" from a case's extra.floor (set_floor), or ""."""
    fl = (c or {}).get("extra", {}).get("floor")
    if not isinstance(fl, dict) or not fl.get("ms"):
        return ""
    bounds = " + ".join(f"{p['name']}: {p['bound'].replace('_', '-')}" for p in fl.get("phases", []))
    return f"; floor {fmt(fl['ms'])} ms ({bounds}), measured {fmt(fl.get('measured_over_floor'))}x it"


def contract_rows(report):
    """Rows of DESIGN.md's performance contract that this JSON can fill."""
    big = max((c["M"] for c in ok_cases(report)), default=None)
    rows = []

    c = find(report, "gemm_to_sparse", "twell", m=big, density=0.005)
    ratio = c["extra"].get("time_ratio_vs_baseline") if c else None
    rows.append(("gemm_to_sparse / cuBLAS GEMM (time ratio), 0.5 %, uniform", "<= 1.05", fmt(ratio),
                 f"{fmt(c['ms']['median'])} ms" if c else "not measured"))

    for dist, target in (("uniform", ">= 2.3x"), ("token_skewed", ">= 2.0x, exact")):
        c = find(report, "ffn", "fused", m=big, density=0.005, dist=dist)
        d = find(report, "ffn", "dense", m=big, density=0.005, dist=dist)
        err = c.get("extra", {}).get("rel_error_vs_dense") if c else None
        err_text = f"; rel. error vs dense {err if isinstance(err, str) else fmt(err, 2)}" if err is not None else ""
        rows.append((f"gated FFN forward vs dense, 0.5 %, {dist}", target, fmt(c.get("speedup") if c else None),
                     f"{c['variant']} {fmt(c['ms']['median'])} ms vs {fmt(d['ms']['median'])} ms"
                     f"{err_text}{floor_text(c)}" if c and d else "not measured"))

    # One point per density at the largest M (the suite sweeps densities there only).
    by_density = {}
    for c in ok_cases(report, "ffn"):
        if (c["variant"] == "fused" and c["shape"] == "paper" and c["distribution"] == "uniform" and c["M"] == big
                and c.get("baseline") == "dense" and c.get("speedup")):
            by_density.setdefault(c["density_target"], c["speedup"])
    pts = sorted(by_density.items())
    crossings = break_evens(pts)
    if crossings:
        be_text = ", ".join(f"{100 * be:.2g} %" for be in crossings)
    elif pts:
        be_text = f"> {100 * pts[-1][0]:g} %" if pts[-1][1] > 1 else f"< {100 * pts[0][0]:g} %"
    else:
        be_text = "-"
    rows.append(("break-even density, gated FFN forward vs dense (uniform)", ">= 5 %", be_text,
                 f"{len(pts)} densit{'y' if len(pts) == 1 else 'ies'} at M = {big}" if pts else "not measured"))

    c = find(report, "spmm", "twell", m=big, density=0.005)
    vs = (c or {}).get("extra", {}).get("speedup_vs", {}) if c else {}
    # The paper's reference kernel took 0.27 ms on an H100 at this point (DESIGN.md).
    rows.append(("TwELL spmm (down projection, 0.5 %, uniform) vs cuSPARSE CSR", ">= 4x", fmt(vs.get("cusparse_csr")),
                 f"{fmt(c['ms']['median'])} ms ({fmt(0.27 / c['ms']['median'])}x the paper's 0.27 ms, target >= 1.5x); "
                 f"vs dense {fmt(vs.get('cublas_dense'))}x{floor_text(c)}" if c else "not measured"))

    # cuSPARSE refuses bf16 SDDMM: first against fp32 copies made (and preprocessed) outside the
    # timing, then against converting in every run.
    for dist in ("uniform", "token_skewed"):
        c = find(report, "sddmm", "twell", m=big, density=0.005, dist=dist)
        vs = (c or {}).get("extra", {}).get("speedup_vs", {}) if c else {}
        rows.append((f"sddmm vs cuSPARSE SDDMM, 0.5 %, {dist}", "faster", fmt(vs.get("cusparse_sddmm_fp32_inputs")),
                     f"{fmt(c['ms']['median'])} ms, against cuSPARSE on fp32 copies made once; "
                     f"{fmt(vs.get('cusparse_sddmm'))}x cuSPARSE converting bf16 in every run" if c else "not measured"))

    c = find(report, "spmm", "twell+convert", m=big, density=0.005)
    vs = (c or {}).get("extra", {}).get("speedup_vs", {}) if c else {}
    # Both sides converting into plan-held storage; cuSPARSE allocating its CSR in the detail.
    rows.append(("the same with each side's conversion from dense (twell: dense -> Hybrid; cuSPARSE: DenseToSparse)",
                 "reported", fmt(vs.get("cusparse_csr+convert_plan")),
                 f"{fmt(c['ms']['median'])} ms; {fmt(vs.get('cusparse_csr+convert'))}x cuSPARSE allocating its CSR"
                 if c else "not measured"))

    # The conversion kernel itself (into a preallocated TwELL, nothing read back); the allocating
    # dense -> Hybrid (scan, maps, dense block) in the detail.
    c = find(report, "convert", "dense->twell_into_async", m=big, density=0.005)
    checked = find(report, "convert", "dense->twell_into", m=big, density=0.005)
    h = find(report, "convert", "dense->hybrid", m=big, density=0.005)
    pct = c["extra"].get("percent_of_copy_bandwidth") if c else None
    detail = f"{fmt(c['gb_per_s'])} GB/s into a preallocated TwELL (drop policy, nothing read back)" if c \
        else "not measured"
    if checked:
        detail += (f"; with the error policy's overflow read back and sync "
                   f"{fmt(checked['extra'].get('percent_of_copy_bandwidth'))} %")
    if h:
        detail += f"; dense -> Hybrid with its allocation {fmt(h['extra'].get('percent_of_copy_bandwidth'))} %"
    rows.append(("dense -> TwELL conversion, % of copy bandwidth, 0.5 %, uniform", ">= 70 %", fmt(pct), detail))
    for dist in ("uniform", "token_skewed"):
        # The plan form (storage held) is the contract's figure, with its own gradients'
        # comparison; the allocating free functions are in the detail.
        free = find(report, "training", "twell", m=big, density=0.005, dist=dist)
        c = find(report, "training", "twell_plan", m=big, density=0.005, dist=dist) or free
        d = find(report, "training", "dense", m=big, density=0.005, dist=dist)
        errs = c.get("extra", {}).get("rel_error_vs_dense") if c else None
        free_text = f"; free functions {fmt(free['ms']['median'])} ms" if free and c is not free else ""
        err_text = ""
        if isinstance(errs, dict) and errs:
            worst = max((v for v in errs.values() if not isinstance(v, str)), default=None)
            err_text = "; gradients' rel. error vs dense " + ("not finite" if any(isinstance(v, str) for v in
                                                                               errs.values()) else fmt(worst, 2))
        rows.append((f"training forward + backward vs dense, 0.5 %, {dist}", ">= 2.0x, exact",
                     fmt(c.get("speedup") if c else None),
                     f"{c['variant']} {fmt(c['ms']['median'])} ms vs {fmt(d['ms']['median'])} ms"
                     f"{free_text}{err_text}" if c and d else "not measured"))
    return rows


def summary(report):
    lines = []
    dev = report.get("device", {})
    meta = report.get("meta", {})
    ceil = report.get("ceilings", {})
    nvml = dev.get("nvml", {}) or {}
    if meta.get("error"):
        lines.append(f"Nothing measured: {meta['error']}.")
        lines.append("")
    lines.append(f"Measured {meta.get('date', '?')} on {dev.get('name', '?')} "
                 f"({dev.get('sm_count', '?')} SMs, L2 {dev.get('l2_bytes', 0) / 2**20:.0f} MiB, "
                 f"driver {nvml.get('driver', dev.get('cuda_driver_api', '?'))}, "
                 f"CUDA runtime {dev.get('cuda_runtime', '?')}), bf16, "
                 f"{meta.get('reps', '?')} timed runs per case{' (--quick: not a result)' if meta.get('quick') else ''}"
                 f", source {meta.get('source_commit', 'not recorded')}.")
    # JSON from before meta.grade: graded by its run count.
    grade = meta.get("grade") or ("result" if meta.get("reps", 0) >= 50 and not meta.get("quick")
                                  else "diagnostic: fewer than 50 timed runs or --quick shapes, not a result")
    if grade != "result":
        lines.append(f"**{grade}**")
    if meta.get("cases"):
        lines.append(f"Only the cases matching `--cases '{meta['cases']}'` ran, with the cases they need; "
                     "the others are not measured here.")
    copy = ceil.get("device_copy", {})
    gemm = ceil.get("bf16_gemm", {})
    on_chip = ""
    if "shared_load" in ceil:
        on_chip = (f", shared-memory loads {fmt(ceil['shared_load'].get('gb_per_s'), 5)} GB/s, L2 loads "
                   f"{fmt(ceil.get('l2_load', {}).get('gb_per_s'), 4)} GB/s, fp32 FMA "
                   f"{fmt(ceil.get('fp32_fma', {}).get('tflop_per_s'), 3)} TFLOP/s")
    lines.append(f"Ceilings measured in the same run: device copy {fmt(copy.get('gb_per_s'), 4)} GB/s "
                 f"(read + write), cuBLAS bf16 GEMM {fmt(gemm.get('tflop_per_s'), 4)} TFLOP/s at "
                 f"{gemm.get('m_n_k', '?')}^3{on_chip}. Energy: {dev.get('energy', '?')}.")
    lines.append("")
    lines.append("| measure | target | measured | detail |")
    lines.append("|---|---|---|---|")
    for r in contract_rows(report):
        lines.append("| " + " | ".join(r) + " |")
    lines.append("")
    for suite in SUITE_ORDER:
        cases = [c for c in report.get("cases", []) if c.get("suite") == suite]
        if not cases:
            continue
        lines.append(f"### {suite}")
        lines.append("")
        lines.append("| variant | shape | M | density | dist | ms (p10-p90) | rate | speedup | baseline |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for c in cases:
            dens = f"{100 * c['density_target']:g} %"
            if c.get("status") != "ok":
                lines.append(f"| {label(c)} | {c['shape']} | {c['M']} | {dens} | {c['distribution']} | "
                             f"{c['status']} | | | |")
                continue
            ms = c["ms"]
            if c.get("tflop_per_s") and c["tflop_per_s"] >= 1:
                rate = f"{c['tflop_per_s']:.1f} TFLOP/s"
            elif c.get("gb_per_s"):
                rate = f"{c['gb_per_s']:.0f} GB/s"
            else:
                rate = f"{c.get('tflop_per_s', 0):.2f} TFLOP/s"
            sp = f"{c['speedup']:.2f}x" if c.get("speedup") else ""
            lines.append(f"| {label(c)} | {c['shape']} | {c['M']} | {dens} | {c['distribution']} | "
                         f"{ms['median']:.4f} ({ms['p10']:.4f}-{ms['p90']:.4f}) | {rate} | {sp} | "
                         f"{c.get('baseline', '')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", help="file written by twell bench --out")
    p.add_argument("--out", default="docs/benchmarks", help="folder for the PNGs (default docs/benchmarks)")
    p.add_argument("--single", action="store_true", help="all suites in one PNG (speedup.png)")
    p.add_argument("--summary", help="also write a markdown summary to this file ('-' for stdout)")
    p.add_argument("--no-plots", action="store_true", help="only the summary")
    a = p.parse_args(argv)
    report = load(a.json)
    status = 0
    if a.summary:
        text = summary(report)
        if a.summary == "-":
            sys.stdout.write(text)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(a.summary)), exist_ok=True)
            with open(a.summary, "w") as f:
                f.write(text)
    if not a.no_plots:
        try:
            for path in plot(report, a.out, a.single):
                print(f"plot.py: wrote {path}", file=sys.stderr)
        except ImportError as e:
            print(f"plot.py: no plots: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

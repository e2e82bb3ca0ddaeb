#!/usr/bin/env python3
"""Plots the JSON that `twell stats --json` writes: histograms of nonzeros per row and per
(row, tile), and the hybrid bytes and overflow rows of every candidate TwELL layout.

usage: plot_stats.py STATS.json OUT.png   (called by `twell stats --png OUT.png`)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bin_labels(histogram):
    """Bin 0 counts zeros, bin k >= 1 counts [2^(k-1), 2^k)."""
    labels = []
    for k in range(len(histogram)):
        if k == 0:
            labels.append("0")
        elif k == 1:
            labels.append("1")
        else:
            labels.append(f"{2 ** (k - 1)}-{2 ** k - 1}")
    return labels


def histogram_panel(ax, dist, title):
    hist = dist["histogram"]
    ax.bar(range(len(hist)), hist, color="#3b6ea5")
    ax.set_xticks(range(len(hist)))
    ax.set_xticklabels(bin_labels(hist), rotation=45, ha="right", fontsize=8)
    ax.set_yscale("log" if any(h > 0 for h in hist) else "linear")
    ax.set_title(f"{title}\nmean {dist['mean']:.2f}, p50 {dist['p50']}, p99 {dist['p99']}, max {dist['max']}",
                 fontsize=9)
    ax.set_ylabel("count")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        s = json.load(f)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    histogram_panel(axes[0], s["per_row"], "nonzeros per row")
    histogram_panel(axes[1], s["per_row_tile"], f"nonzeros per (row, tile of {s['tile']})")
    cands = s["candidates"]
    ax = axes[2]
    names = [f"{c['tile']}/{c['compression']}" for c in cands]
    ax.bar(range(len(cands)), [c["hybrid_bytes"] / 2**20 for c in cands], color="#7aa95c")
    ax.set_xticks(range(len(cands)))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("hybrid MiB")
    ax.set_xlabel("tile / C")
    rec = s["recommended"]
    ax.set_title(f"layouts (recommended tile {rec['tile']}, C {rec['compression']})", fontsize=9)
    twin = ax.twinx()
    twin.plot(range(len(cands)), [c["overflow_rows"] for c in cands], "o-", color="#b5473a")
    twin.set_ylabel("overflow rows", color="#b5473a")
    fig.suptitle(f"{s['file']}: {s['rows']} x {s['cols']} {s['dtype']}, nnz {s['nnz']} "
                 f"(density {100 * s['density']:.3f} %)", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()

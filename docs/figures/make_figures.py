#!/usr/bin/env python3
"""Renders the TwELL and Hybrid layout figures of docs/format.md (twell_layout.png,
hybrid_layout.png) from one small example matrix. Run: python3 docs/figures/make_figures.py
(needs matplotlib; writes next to this script)."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TILE, C = 8, 2
S = TILE // C  # 4 slots per (row, tile): the count and 3 entries
COLS = 14      # two tiles, the second ragged (6 columns)
# The example: row 2's first tile holds 5 nonzeros, more than S - 1 = 3: it overflows.
ROWS = [
    {1: 0.5, 6: 1.25},
    {},
    {0: 2.0, 2: 0.75, 3: 1.5, 5: 3.0, 7: 0.25, 9: 1.0},
    {8: 0.5, 13: 2.5},
]
C_DENSE, C_EMPTY, C_COUNT, C_SLOT, C_PAD, C_OVER = "#3b6ea5", "#ffffff", "#f2c14e", "#9cc3e6", "#eeeeee", "#c8553d"


def cell(ax, x, y, color, text="", size=8, weight="normal"):
    ax.add_patch(Rectangle((x, y), 1, 1, facecolor=color, edgecolor="#555555", linewidth=0.6))
    if text:
        ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=size, weight=weight)


def dense_panel(ax, title):
    n = len(ROWS)
    for r, row in enumerate(ROWS):
        for c in range(COLS):
            v = row.get(c)
            cell(ax, c, n - 1 - r, C_DENSE if v is not None else C_EMPTY, f"{v:g}" if v is not None else "", 7)
    for t in range(0, COLS + 1, TILE):
        ax.plot([t, t], [0, n], color="black", linewidth=2.2)
    ax.plot([COLS, COLS], [0, n], color="black", linewidth=2.2)
    for c in range(COLS):
        ax.text(c + 0.5, n + 0.25, str(c), ha="center", fontsize=7)
    for r in range(n):
        ax.text(-0.4, n - 1 - r + 0.5, f"row {r}", ha="right", va="center", fontsize=8)
    ax.text(TILE / 2, n + 0.8, "tile 0 (8 columns)", ha="center", fontsize=8)
    ax.text(TILE + (COLS - TILE) / 2, n + 0.8, "tile 1 (ragged: 6)", ha="center", fontsize=8)
    ax.set_title(title, fontsize=10, pad=22)
    ax.set_xlim(-2.2, COLS + 0.2)
    ax.set_ylim(-0.2, n + 1.3)
    ax.set_aspect("equal")
    ax.axis("off")


def packed_panel(ax, title, shadow):
    n = len(ROWS)
    tiles = (COLS + TILE - 1) // TILE
    for r, row in enumerate(ROWS):
        y = n - 1 - r
        for t in range(tiles):
            entries = [(c - t * TILE, v) for c, v in sorted(row.items()) if t * TILE <= c < (t + 1) * TILE]
            over = len(entries) > S - 1
            x0 = t * S
            cell(ax, x0, y, C_OVER if over else C_COUNT, str(len(entries)), 9, "bold")
            for s in range(1, S):
                if s - 1 < len(entries):
                    local, v = entries[s - 1]
                    cell(ax, x0 + s, y, C_SLOT, f"{v:g}|{local}", 7)
                else:
                    cell(ax, x0 + s, y, C_PAD, "0", 7)
        if shadow and any(len([c for c in row if t * TILE <= c < (t + 1) * TILE]) > S - 1 for t in range(tiles)):
            ax.text(tiles * S + 0.3, y + 0.5, "shadow row", va="center", fontsize=8, color=C_OVER)
    for t in range(tiles + 1):
        ax.plot([t * S, t * S], [0, n], color="black", linewidth=2.2)
    for t in range(tiles):
        ax.text(t * S + S / 2, n + 0.25, f"tile {t}: slots 0..{S - 1}", ha="center", fontsize=8)
    ax.set_title(title, fontsize=10, pad=22)
    ax.set_xlim(-0.2, tiles * S + 2.6)
    ax.set_ylim(-0.2, n + 1.3)
    ax.set_aspect("equal")
    ax.axis("off")


def twell_figure():
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 3.6), gridspec_kw={"width_ratios": [COLS + 2.4, 2 * S + 2.8]})
    dense_panel(a, "dense M x N (tile = 8)")
    packed_panel(b, f"TwELL(tile 8, C 2): S = {S} slots per (row, tile)", shadow=False)
    fig.text(0.5, 0.02, "slot 0 = true count (red: count > S-1, overflowed; under the error policy the "
             "conversion throws); slots 1..S-1 = value|tile-local column, in column order; unused slots 0",
             ha="center", fontsize=8)
    fig.savefig(os.path.join(HERE, "twell_layout.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


def hybrid_figure():
    fig = plt.figure(figsize=(13, 4.6))
    a = fig.add_axes([0.0, 0.25, 0.45, 0.7])
    packed_panel(a, "Hybrid: TwELL part (every tile keeps its true count)", shadow=True)
    b = fig.add_axes([0.47, 0.45, 0.53, 0.5])
    over_rows = [r for r, row in enumerate(ROWS)
                 if any(len([c for c in row if t * TILE <= c < (t + 1) * TILE]) > S - 1 for t in range(2))]
    for k, r in enumerate(over_rows):
        for c in range(COLS):
            v = ROWS[r].get(c)
            cell(b, c, 0, C_OVER if v is not None else C_EMPTY, f"{v:g}" if v is not None else "", 7)
        b.text(-0.4, 0.5, f"block row {k}\n(row {r})", ha="right", va="center", fontsize=8)
    b.set_title("dense overflow block R x N (R = 1): the whole row, authoritative", fontsize=10)
    b.set_xlim(-3.2, COLS + 0.2)
    b.set_ylim(-0.2, 1.2)
    b.set_aspect("equal")
    b.axis("off")
    m = fig.add_axes([0.47, 0.05, 0.53, 0.35])
    m.axis("off")
    mapping = [over_rows.index(r) if r in over_rows else -1 for r in range(len(ROWS))]
    m.text(0, 0.75, "row_to_overflow[M] = " + str(mapping), fontsize=10, family="monospace")
    m.text(0, 0.45, "overflow_to_row[R] = " + str(over_rows), fontsize=10, family="monospace")
    m.text(0, 0.1, "A row is in the block iff one of its tiles overflowed; its TwELL slots keep the\n"
           "first S-1 entries of each tile (what a GEMM epilogue writes) and are ignored on read.",
           fontsize=8)
    fig.savefig(os.path.join(HERE, "hybrid_layout.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    twell_figure()
    hybrid_figure()
    print("wrote", os.path.join(HERE, "twell_layout.png"), "and hybrid_layout.png")

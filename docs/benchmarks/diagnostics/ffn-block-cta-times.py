#!/usr/bin/env python3
"""Summarises the per-CTA timeline that ffn-block-cta-times.patch writes ($TWELL_DIAG_CTA_FILE):
the kernel's span, the helpers' and token blocks' durations and entries, the CTAs that ended
last and the longest ones, and the CTAs running in each 10 us bin.

    python3 ffn-block-cta-times.py cta-4096-uniform.csv cta-4096-token_skewed.csv
"""
import csv
import statistics
import sys

HELPER = 1 << 63


def describe(info):
    return (f"entries {info & 0xffffffff} routed {(info >> 32) & 0xff} split {(info >> 40) & 0xff} "
            f"overflow rows {(info >> 48) & 0x7fff}")


def summarise(path):
    rows = [{k: int(v) for k, v in r.items()} for r in csv.DictReader(open(path))]
    t0 = min(r["start_ns"] for r in rows)
    t1 = max(r["end_ns"] for r in rows)
    us = lambda ns: ns / 1000  # noqa: E731
    dur = lambda r: us(r["end_ns"] - r["start_ns"])  # noqa: E731
    helpers = [r for r in rows if r["info"] & HELPER]
    blocks = [r for r in rows if not r["info"] & HELPER]
    print(f"{path}: span {us(t1 - t0):.1f} us, {len(rows)} CTAs, {len(helpers)} helpers")
    if helpers:
        print(f"  helpers: duration median {statistics.median(map(dur, helpers)):.1f} max {max(map(dur, helpers)):.1f} us")
    d = sorted(map(dur, blocks))
    e = [r["info"] & 0xffffffff for r in blocks]
    print(f"  token blocks: duration median {statistics.median(d):.1f} p90 {d[int(0.9 * len(d))]:.1f} "
          f"max {d[-1]:.1f} us; entries median {statistics.median(e)} max {max(e)} total {sum(e)}")
    for r in sorted(rows, key=lambda r: -r["end_ns"])[:6]:
        print(f"   ended last: cta {r['cta']} start {us(r['start_ns'] - t0):.1f} end {us(r['end_ns'] - t0):.1f} "
              f"us, {describe(r['info']) if not r['info'] & HELPER else 'helper'}")
    for r in sorted(blocks, key=lambda r: -dur(r))[:4]:
        print(f"   longest: cta {r['cta']} start {us(r['start_ns'] - t0):.1f} duration {dur(r):.1f} us, {describe(r['info'])}")
    active = [0] * ((t1 - t0) // 10000 + 1)
    for r in rows:
        for b in range((r["start_ns"] - t0) // 10000, (r["end_ns"] - t0) // 10000 + 1):
            active[b] += 1
    print("  CTAs running per 10 us:", active)


for p in sys.argv[1:]:
    summarise(p)

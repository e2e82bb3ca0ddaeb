#!/usr/bin/env python3
"""Cross-checks the twell tool's file conversions against scipy and numpy, both directions.

usage: scipy_crosscheck.py TWELL_BINARY   (registered with ctest, label cpu)

scipy writes random sparse matrices (several shapes and densities, empty rows, a ragged last
tile) as .mtx; `twell convert` turns each into every format (.twell) and back to .mtx and .npy;
scipy/numpy read the results and they must equal the original exactly. Then the reverse: numpy
writes .npy (fp32, fp16), twell converts to .mtx/.twell and back, scipy compares. Also: explicit
zeros are dropped, duplicate entries and overflow under the error policy are refused (exit 1),
and bf16 output is numpy's round-to-nearest-even of the fp32 bits.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import scipy.io
import scipy.sparse

FAILURES = []
CHECKS = 0


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def twell(*args, expect=0):
    r = subprocess.run([TWELL, *args], capture_output=True, text=True)
    check(r.returncode == expect, f"twell {' '.join(args)} exited {r.returncode}, expected {expect}: {r.stderr.strip()}")
    return r


def random_matrix(rng, rows, cols, density):
    a = np.where(rng.random((rows, cols)) < density, rng.uniform(-2, 2, (rows, cols)), 0).astype(np.float32)
    if rows > 2:
        a[rng.choice(rows, max(1, rows // 5), replace=False)] = 0  # empty rows
    return a


def bf16_round(a):
    """Round-to-nearest-even of fp32 to bfloat16 bits, as uint16 (no NaN in the inputs)."""
    u = a.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_back(path):
    if path.endswith(".mtx"):
        m = scipy.io.mmread(path)
        return np.asarray(m.todense() if scipy.sparse.issparse(m) else m, dtype=np.float32)
    return np.load(path)


def forward(tmp, rng):
    shapes = [(1, 1), (7, 19), (33, 300), (64, 1000), (5, 256)]
    for rows, cols in shapes:
        for density in (0.0, 0.02, 0.3, 1.0):
            a = random_matrix(rng, rows, cols, density)
            tag = f"{rows}x{cols}@{density}"
            src = os.path.join(tmp, f"in_{rows}_{cols}.mtx")
            scipy.io.mmwrite(src, scipy.sparse.coo_matrix(a))
            # scipy writes fp32 with 8 significant digits, not always enough to round-trip: the
            # reference is what scipy itself reads from the file, rounded to fp32 as twell does.
            a = read_back(src)
            # Per-tile counts decide whether plain TwELL (tile 64, C 2: 31 slots) must overflow.
            tiles = [a[:, t:t + 64] for t in range(0, cols, 64)]
            overflows = any(np.count_nonzero(t, axis=1).max(initial=0) > 31 for t in tiles)
            for fmt in ("dense", "csr", "ell", "twell", "hybrid"):
                out = os.path.join(tmp, f"{fmt}.twell")
                args = ["convert", src, out, "--to", fmt, "--tile", "64", "--compression", "2", "--quiet"]
                if fmt == "twell" and overflows:
                    r = twell(*args, expect=1)
                    check("overflow" in (r.stderr + r.stdout).lower(), f"{tag}: TwELL overflow error names it")
                    continue
                twell(*args)
                twell("validate", out)
                for back in ("back.mtx", "back.npy"):
                    path = os.path.join(tmp, back)
                    twell("convert", out, path, "--quiet")
                    b = read_back(path)
                    check(b.shape == a.shape and b.dtype == np.float32 and np.array_equal(a, b),
                          f"{tag}: scipy -> {fmt} -> {back} differs")


def reverse(tmp, rng):
    for rows, cols in ((3, 5), (40, 260), (17, 1)):
        a = random_matrix(rng, rows, cols, 0.2)
        src = os.path.join(tmp, "in.npy")
        np.save(src, a)
        twell("convert", src, os.path.join(tmp, "r.mtx"), "--quiet")
        m = scipy.io.mmread(os.path.join(tmp, "r.mtx"))
        check(np.array_equal(np.asarray(m.todense(), dtype=np.float32), a), f"{rows}x{cols}: numpy -> .mtx differs")
        check(m.nnz == np.count_nonzero(a), f"{rows}x{cols}: .mtx stores zeros")
        twell("convert", src, os.path.join(tmp, "r.twell"), "--to", "hybrid", "--tile", "8", "--compression", "4",
              "--quiet")
        twell("convert", os.path.join(tmp, "r.twell"), os.path.join(tmp, "r2.npy"), "--quiet")
        check(np.array_equal(np.load(os.path.join(tmp, "r2.npy")), a), f"{rows}x{cols}: numpy -> hybrid -> .npy differs")
        # fp16 '<f2' in and out, bit for bit.
        h = a.astype(np.float16)
        np.save(src, h)
        twell("convert", src, os.path.join(tmp, "h.twell"), "--to", "csr", "--quiet")
        twell("convert", os.path.join(tmp, "h.twell"), os.path.join(tmp, "h.npy"), "--quiet")
        hb = np.load(os.path.join(tmp, "h.npy"))
        check(hb.dtype == np.float16 and np.array_equal(hb.view(np.uint16), h.view(np.uint16)), "fp16 .npy round trip")
        # bf16 is stored as '<u2' bits: numpy's own rounding must agree.
        np.save(src, a)
        twell("convert", src, os.path.join(tmp, "b.npy"), "--dtype", "bf16", "--quiet")
        b = np.load(os.path.join(tmp, "b.npy"))
        want = bf16_round(a)
        want[(want & 0x7FFF) == 0] = 0  # twell stores no zeros; -0 reads back as +0 in dense output
        check(b.dtype == np.uint16 and np.array_equal(b, want), f"{rows}x{cols}: bf16 bits differ from numpy's rounding")


def edge_cases(tmp):
    path = os.path.join(tmp, "z.mtx")
    coo = scipy.sparse.coo_matrix((np.array([1.5, 0.0, -2.0], dtype=np.float32), ([0, 1, 2], [0, 1, 2])), shape=(3, 3))
    scipy.io.mmwrite(path, coo)
    twell("convert", path, os.path.join(tmp, "z.npy"), "--quiet")
    check(np.count_nonzero(np.load(os.path.join(tmp, "z.npy"))) == 2, "explicit zero is dropped")
    dup = scipy.sparse.coo_matrix((np.array([1.0, 2.0], dtype=np.float32), ([0, 0], [1, 1])), shape=(2, 2))
    scipy.io.mmwrite(path, dup)
    r = twell("convert", path, os.path.join(tmp, "d.npy"), expect=1)
    check("duplicate" in r.stderr, "duplicate entries are refused with a message naming them")
    r = twell("validate", path, expect=1)
    with open(os.path.join(tmp, "bad.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'}")
    twell("validate", os.path.join(tmp, "bad.npy"), expect=1)


def main():
    global TWELL
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    TWELL = sys.argv[1]
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    with tempfile.TemporaryDirectory(prefix="twell_scipy_") as tmp:
        forward(tmp, rng)
        reverse(tmp, rng)
        edge_cases(tmp)
    print(f"scipy cross-check: {CHECKS - len(FAILURES)} of {CHECKS} checks passed (scipy {scipy.__version__}, "
          f"numpy {np.__version__})")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())

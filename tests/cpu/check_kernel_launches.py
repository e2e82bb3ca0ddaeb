#!/usr/bin/env python3
"""Holds the library's kernels to lib/src/cuda_launch.cuh's rule.

    tests/cpu/check_kernel_launches.py ROOT

launch_kernel lets a kernel start before the kernel ahead of it in the stream has finished, so
every kernel it may launch must begin with wait_for_prior_grids(): one that does not could read
inputs still being written. This checks, in every CUDA source under ROOT's converters/, kernels/
and lib/src/, that each __global__ function's body opens with that call and that no kernel is
launched with <<<>>> (which would bypass launch_kernel's checks). Prints each fault and exits 1
on any; exits 0 with the number of kernels checked otherwise.
"""
import pathlib
import re
import sys

DIRS = ("converters", "kernels", "lib/src")
WAIT = re.compile(r"(::)?(twell::)?(detail::)?wait_for_prior_grids\(\);")


def strip_comments(text):
    """The text with comments blanked (same length, so offsets still give line numbers)."""
    out = re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), text)
    return re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), out, flags=re.S)


def kernels(text):
    """(name, offset of the body's first statement) of each __global__ function defined."""
    for m in re.finditer(r"__global__\b", text):
        open_paren = text.find("(", m.end())
        # The parameter list's "(" is the one after the name; __launch_bounds__(...) comes before.
        head = text[m.end():open_paren]
        if "__launch_bounds__" in head:
            close = text.find(")", open_paren)
            open_paren = text.find("(", close)
            head = text[m.end():open_paren]
        name = head.split()[-1] if head.split() else "?"
        depth, i = 0, open_paren
        while True:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        rest = text[i:]
        brace = re.match(r"\s*\{", rest)
        if brace is None:  # a declaration
            continue
        yield name, i + brace.end()


def main(root):
    root = pathlib.Path(root)
    faults, count = [], 0
    for d in DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.suffix not in (".cu", ".cuh"):
                continue
            text = strip_comments(path.read_text())
            rel = path.relative_to(root)
            for m in re.finditer(r"<<<", text):
                faults.append("%s:%d: a kernel launched with <<<>>>; use detail::launch_kernel"
                              % (rel, text.count("\n", 0, m.start()) + 1))
            for name, body in kernels(text):
                count += 1
                if not WAIT.match(text[body:].lstrip()):
                    faults.append("%s:%d: kernel %s does not begin with wait_for_prior_grids()"
                                  % (rel, text.count("\n", 0, body) + 1, name))
    for f in faults:
        print(f)
    if count == 0:
        faults.append("no kernel found under %s" % ", ".join(DIRS))
        print(faults[-1])
    if faults:
        return 1
    print("%d kernels begin with wait_for_prior_grids(); no <<<>>> launches" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

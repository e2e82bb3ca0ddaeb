#!/usr/bin/env python3
"""Holds the library's kernels to lib/src/cuda_launch.cuh's rule.

    tests/cpu/check_kernel_launches.py ROOT

launch_kernel lets a kernel start before the kernel ahead of it in the stream has finished, so
every kernel it may launch must begin with wait_for_prior_grids(): one that does not could read
inputs still being written. This checks, in every C++ and CUDA source under ROOT's converters/,
kernels/ and lib/src/, that each __global__ function's body opens with that call, that no kernel
is launched with <<<>>> (which would bypass launch_kernel), and that it could read every
__global__ it found (e.g. not one made by a macro). Prints each fault and exits 1 on any; exits 0
with the number of kernels checked otherwise.
"""
import pathlib
import re
import sys

DIRS = ("converters", "kernels", "lib/src")
SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".inl")
WAIT = re.compile(r"(::)?(twell::)?(detail::)?wait_for_prior_grids\(\);")
ATTRIBUTE = re.compile(r"__\w+__\s*$")  # __launch_bounds__, __maxnreg__, __cluster_dims__, ...


def blank_comments_and_literals(text):
    """The text with comments and string and character literals blanked, in one left-to-right
    pass (so "//" inside a block comment or a string is not taken for a comment); the same length,
    so offsets still give line numbers."""
    token = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return token.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def balanced_end(text, open_paren):
    """The offset just past the parenthesis that closes the one at open_paren (None if none)."""
    depth = 0
    for i in range(open_paren, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return None


def kernels(text):
    """(name, offset of the body's first statement or None for a declaration, offset of
    __global__) of each __global__ function; name None where it could not be read."""
    for m in re.finditer(r"\b__global__\b", text):
        pos = m.end()
        while True:
            open_paren = text.find("(", pos)
            if open_paren < 0:
                yield None, None, m.start()
                break
            head = text[m.end():open_paren]
            if ATTRIBUTE.search(head):  # an attribute's arguments, not the parameters
                pos = balanced_end(text, open_paren) or len(text)
                continue
            words = re.findall(r"\w+", head)
            close = balanced_end(text, open_paren)
            if not words or close is None:
                yield None, None, m.start()
                break
            rest = text[close:]
            brace = re.match(r"\s*\{", rest)
            if brace is not None:
                yield words[-1], close + brace.end(), m.start()
            elif re.match(r"\s*;", rest):
                yield words[-1], None, m.start()
            else:
                yield None, None, m.start()
            break


def main(root):
    root = pathlib.Path(root)
    faults, count = [], 0
    for d in DIRS:
        for path in sorted((root / d).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            text = blank_comments_and_literals(path.read_text())
            rel = path.relative_to(root)
            line = lambda offset: text.count("\n", 0, offset) + 1
            for m in re.finditer(r"<<<", text):
                faults.append("%s:%d: a kernel launched with <<<>>>; use detail::launch_kernel" % (rel, line(m.start())))
            for name, body, at in kernels(text):
                if name is None:
                    faults.append("%s:%d: a __global__ function this check cannot read" % (rel, line(at)))
                elif body is not None:
                    count += 1
                    if not WAIT.match(text[body:].lstrip()):
                        faults.append("%s:%d: kernel %s does not begin with wait_for_prior_grids()"
                                      % (rel, line(body), name))
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

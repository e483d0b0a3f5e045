#!/usr/bin/env python3
"""Every function defined with KVSLIM_TARGET_CLONES (src/kernels/clones.h) must reach the binary as
one copy per SIMD level chosen by an ifunc resolver. Regression check: clang 14 compiled such a
definition that followed a plain declaration as its first (AVX-512) clone only, with no resolver,
so the sanitizer builds ran AVX-512 code on AVX2 machines (an illegal instruction in CI). Reading
the symbols catches it on any CPU, also on machines where the wrong clone would happen to run.

Usage: check_target_clones.py BINARY SRC_DIR   (exit 0: every function has its resolver)
"""
import pathlib
import re
import subprocess
import sys


def defined_clones(src: pathlib.Path) -> set:
    names = set()
    for path in src.rglob("*.cpp"):
        for m in re.finditer(r"^KVSLIM_TARGET_CLONES\s+[\w:<>*&\s]*?\b(\w+)\s*\(", path.read_text(), re.M):
            names.add(m.group(1))
    return names


def resolved(binary: str) -> set:
    out = subprocess.run(["nm", "-C", binary], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        if line.endswith("[clone .resolver]"):
            m = re.search(r"(\w+)\(", line)
            if m:
                names.add(m.group(1))
    return names


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    want = defined_clones(pathlib.Path(sys.argv[2]))
    if not want:
        print(f"no KVSLIM_TARGET_CLONES definitions found under {sys.argv[2]}", file=sys.stderr)
        return 1
    have = resolved(sys.argv[1])
    missing = sorted(want - have)
    if missing:
        print(f"{sys.argv[1]}: no ifunc resolver for {', '.join(missing)} (compiled as one copy for every CPU)",
              file=sys.stderr)
        return 1
    print(f"{len(want)} multi-versioned functions, each with its resolver: {', '.join(sorted(want))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

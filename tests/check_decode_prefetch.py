#!/usr/bin/env python3
"""Every packed decode kernel (gemv_packed_q4k, _q6k, _q6k_wide, _q8 at each SIMD level) must
request the weight lines ahead from inside its loop over the weights. Regression check: GCC at -O2
took the small functions that only issue prefetch instructions for functions without side effects
and dropped the calls, so the kernels requested only the first blocks of a run and a decode step of
several rows waited on memory; the results stayed the same, only slower, which no value test sees.

A loop is the address range between a backward jump and its target; the check asks for one loop
that holds both a prefetch instruction and an integer multiply-add (vpdpbusd, vpmaddubsw).

Usage: check_decode_prefetch.py BINARY_OR_OBJECT   (exit 0: every kernel found requests its lines)
"""
import re
import subprocess
import sys

KERNEL = re.compile(r"qdot::(\w+)::\(anonymous namespace\)::(gemv_packed_q(?:4k|6k|6k_wide|8)<\d+>)\(")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(?:\{vex\}\s+)?(\S+)\s*(.*)$")
JUMP_TARGET = re.compile(r"^([0-9a-f]+) <")


def functions(path: str) -> dict:
    """Kernel name -> list of (address, mnemonic, operands)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], check=True, capture_output=True,
                         text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        if line.endswith(">:"):
            m = KERNEL.search(line)
            cur = f"{m.group(1)}::{m.group(2)}" if m else None
            if cur:
                funcs[cur] = []
            continue
        if cur is None:
            continue
        m = INSN.match(line)
        if m:
            funcs[cur].append((int(m.group(1), 16), m.group(2), m.group(3)))
    return funcs


def requests_in_loop(insns: list) -> bool:
    prefetch = [a for a, op, _ in insns if op.startswith("prefetch")]
    multiply = [a for a, op, _ in insns if op.startswith(("vpdpbusd", "vpmaddubsw"))]
    for addr, op, args in insns:
        if not op.startswith("j"):
            continue
        m = JUMP_TARGET.match(args)
        if not m or int(m.group(1), 16) >= addr:
            continue
        lo, hi = int(m.group(1), 16), addr
        if any(lo <= a <= hi for a in prefetch) and any(lo <= a <= hi for a in multiply):
            return True
    return False


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    funcs = functions(sys.argv[1])
    if not funcs:
        print(f"check_decode_prefetch: no packed decode kernels found in {sys.argv[1]}", file=sys.stderr)
        return 1
    missing = sorted(name for name, insns in funcs.items() if not requests_in_loop(insns))
    for name in missing:
        print(f"check_decode_prefetch: {name} requests no weight lines inside its loops", file=sys.stderr)
    print(f"check_decode_prefetch: {len(funcs) - len(missing)} of {len(funcs)} kernels request their lines ahead")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The module order of docs/ARCHITECTURE.md, checked from the includes: a module of src/ includes only
modules before it (or at its own level where the order allows it), directly or through the public
header (include/kvslim/) that the module implements.

    util -> gguf -> kernels -> kv, tokenizer -> model -> press -> run -> context -> eval, train
         -> server, cli

`KNOWN` lists the inclusions that still break the order, each with what it waits for; the check fails
on any other (a new violation) and on a listed one that is gone (so the list only shrinks).

Usage: check_layering.py SOURCE_DIR   (exit 0: no inclusion breaks the order beyond KNOWN)
"""
import pathlib
import re
import sys

RANK = {"util": 0, "gguf": 1, "kernels": 2, "kv": 3, "tokenizer": 3, "model": 4, "press": 5, "run": 6,
        "context": 7, "eval": 8, "train": 8, "server": 9, "cli": 10}

# The module each public header belongs to (the one whose sources implement it).
PUBLIC = {"error.h": "util", "version.h": "util", "gguf.h": "gguf", "quant.h": "gguf", "threads.h": "kernels",
          "kv_cache.h": "kv", "kv_latent.h": "kv", "tokenizer.h": "tokenizer", "model.h": "model",
          "sampling.h": "model", "session.h": "model", "synth.h": "model", "press.h": "press",
          "generate.h": "run", "request.h": "run", "context.h": "context"}

# (including module, included module): why it is still there.
KNOWN = {
    ("kernels", "kv"): "attention reads the segments' stores; waits for a plain segment view defined in kernels",
}


def module_of_include(target: str):
    if target.startswith("kvslim/"):
        name = target[len("kvslim/"):]
        if name.startswith("eval"):
            return "eval"
        return PUBLIC.get(name)
    head = target.split("/")[0]
    return head if head in RANK else None


def main() -> int:
    src = pathlib.Path(sys.argv[1])
    found = {}
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".cpp", ".h", ".inc") or not path.is_file():
            continue
        mod = path.relative_to(src).parts[0]
        if mod not in RANK:
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            dep = module_of_include(m.group(1))
            if dep is None or dep == mod:
                continue
            if RANK[dep] > RANK[mod] or (RANK[dep] == RANK[mod] and mod != "cli"):
                found.setdefault((mod, dep), []).append(f"{path.relative_to(src)}: {m.group(1)}")
    bad = 0
    for key, where in sorted(found.items()):
        if key not in KNOWN:
            bad += 1
            print(f"{key[0]} includes {key[1]}, which comes later in the module order:")
            for w in where:
                print(f"  {w}")
    for key, why in sorted(KNOWN.items()):
        if key not in found:
            bad += 1
            print(f"{key[0]} no longer includes {key[1]}: drop it from KNOWN in {pathlib.Path(__file__).name}")
    if bad == 0:
        print(f"module order holds ({len(KNOWN)} known exceptions)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

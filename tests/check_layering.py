#!/usr/bin/env python3
"""The module order of docs/ARCHITECTURE.md, checked from the includes: a module of src/ includes only
modules before it (or at its own level where the order allows it), directly or through the public
header (include/kvslim/) that the module implements.

    util -> gguf -> kernels -> kv, tokenizer -> attention -> model -> press -> run -> context
         -> eval, train -> tools -> server -> cli

The front-ends see the engine through narrow doors, checked too: src/cli and src/server include
only the public headers (include/kvslim/), their own folder's headers, src/server's (the CLI's
`serve`) and the tools API (src/tools/tools.h); python/src only the public headers; and a public
header includes only other public headers and the standard library (no nlohmann/json, nothing of
src/).

`KNOWN` lists the inclusions that still break the order, each with what it waits for; the check fails
on any other (a new violation) and on a listed one that is gone (so the list only shrinks).

Usage: check_layering.py SOURCE_DIR   (exit 0: no inclusion breaks the order beyond KNOWN)
"""
import pathlib
import re
import sys

RANK = {"util": 0, "gguf": 1, "kernels": 2, "kv": 3, "tokenizer": 3, "attention": 4, "model": 5, "press": 6, "run": 7,
        "context": 8, "eval": 9, "train": 9, "tools": 10, "server": 11, "cli": 12}

# What each front-end may include besides the public headers and its own folder.
FRONT_ENDS = {"src/cli": ("cli/", "server/", "tools/tools.h"), "src/server": ("server/", "tools/tools.h"),
              "python/src": ()}

# The module each public header belongs to (the one whose sources implement it).
PUBLIC = {"error.h": "util", "version.h": "util", "gguf.h": "gguf", "quant.h": "gguf", "threads.h": "kernels",
          "tokenizer.h": "tokenizer", "model.h": "model",
          "sampling.h": "model", "synth.h": "model", "kv_options.h": "kv", "press.h": "press",
          "generate.h": "run", "request.h": "run", "context.h": "context"}

# (including module, included module): why it is still there.
KNOWN = {}


def module_of_include(target: str):
    if target.startswith("kvslim/"):
        name = target[len("kvslim/"):]
        if name.startswith("eval"):
            return "eval"
        return PUBLIC.get(name)
    head = target.split("/")[0]
    return head if head in RANK else None


def includes(path: pathlib.Path):
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r'\s*#\s*include\s+([<"])([^">]+)[">]', line)
        if m:
            yield m.group(1), m.group(2)


def check_doors(root: pathlib.Path) -> int:
    """The front-ends' and the public headers' include rules; returns the number of violations."""
    bad = 0
    for folder, allowed in FRONT_ENDS.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cpp", ".h") or not path.is_file():
                continue
            for kind, target in includes(path):
                if kind == '"' and not target.startswith("kvslim/") and not target.startswith(allowed):
                    bad += 1
                    print(f"{path.relative_to(root)} includes {target}: a front-end includes only the public headers, "
                          f"its own folder and {', '.join(a for a in allowed if a.endswith('.h')) or 'nothing else'}")
    for path in sorted((root / "include" / "kvslim").glob("*.h")):
        for kind, target in includes(path):
            if (kind == '"' and not target.startswith("kvslim/")) or target.startswith("nlohmann/"):
                bad += 1
                print(f"{path.relative_to(root)} includes {target}: a public header includes only public headers "
                      "and the standard library")
    return bad


def main() -> int:
    src = pathlib.Path(sys.argv[1])
    found = {}
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".cpp", ".h", ".inc") or not path.is_file():
            continue
        mod = path.relative_to(src).parts[0]
        if mod not in RANK:
            continue
        for kind, target in includes(path):
            dep = module_of_include(target) if kind == '"' else None
            if dep is None or dep == mod:
                continue
            if RANK[dep] >= RANK[mod]:
                found.setdefault((mod, dep), []).append(f"{path.relative_to(src)}: {target}")
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
    bad += check_doors(src.resolve().parent)
    if bad == 0:
        print(f"module order holds ({len(KNOWN)} known exceptions)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

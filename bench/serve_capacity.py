#!/usr/bin/env python3
"""How many 8K-token requests fit in a KV budget: the KV bytes one request holds after its
context is compressed, measured by `kvslim serve` (usage.kv_bytes of a real request), for a full
f16 cache, SnapKV 0.75, KIVI-4 and both. The bytes of a layer's segments do not depend on the
layer, so a file with fewer layers (`kvslim synth --layers 2`) gives the per-layer bytes of the
full model exactly; --scale-layers multiplies them back.

    kvslim synth --shape tinyllama-1.1b --type q8_0 --layers 2 --vocab-from VOCAB.gguf -o tl2.gguf
    python3 bench/serve_capacity.py -m tl2.gguf --tokens 8192 --scale-layers 11 --budget-gib 1,4"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import serve_util  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--scale-layers", type=float, default=1.0)
    ap.add_argument("--budget-gib", default="1,4")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=1024)
    args = ap.parse_args()
    rng = random.Random(1)
    prompt = [1] + [rng.randrange(3, 32000) for _ in range(args.tokens - 1)]
    configs = [("full cache (f16)", [], "none"), ("SnapKV 0.75", [], "snapkv"),
               ("KIVI-4", ["--kivi-bits", 4], "none"), ("SnapKV 0.75 + KIVI-4", ["--kivi-bits", 4], "snapkv")]
    rows = []
    for name, flags, press in configs:
        srv = serve_util.ServerProc("-c", args.tokens + 16, "-t", args.threads, "--temp", 0, "--chunk-size",
                                    args.chunk, "--max-body", 1 << 20, *flags, model=args.model)
        try:
            status, j = serve_util.post(srv.port, "/v1/completions",
                                        {"prompt": prompt, "max_tokens": 1, "press": press,
                                         "compression_ratio": 0.75}, timeout=3600)
            assert status == 200, j
            u = j["usage"]
            b = u["kv_bytes"] * args.scale_layers
            rows.append((name, b, u["kv_full_f16_bytes"] * args.scale_layers, u["compression_ratio"]))
            print(name, u, flush=True)
        finally:
            srv.close()
    budgets = [float(x) for x in args.budget_gib.split(",")]
    print(f"\n| cache ({args.tokens} tokens) | KV MiB per request | memory ratio | "
          + " | ".join(f"requests in {g:g} GiB" for g in budgets) + " |")
    print("|---|---|---|" + "---|" * len(budgets))
    for name, b, full, r in rows:
        print(f"| {name} | {b / 2**20:.1f} | {b / full:.3f} | "
              + " | ".join(str(int(g * 2**30 // b)) for g in budgets) + " |")


if __name__ == "__main__":
    main()

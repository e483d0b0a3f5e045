#!/usr/bin/env python3
"""Aggregate decode throughput of `kvslim serve` against the number of concurrent requests, with
continuous batching (one pass over the weights per decode step for all requests) and without it
(--no-batch: each request's decode step on its own). Python standard library only.

    python3 bench/serve_throughput.py -m tinyllama-q8_0.gguf --concurrency 1,2,4,8 --gen 32 -t 2

Decode tokens/s = tokens run by decode steps / engine seconds spent in decode steps, read from
/metrics around each round (prefill excluded); wall tokens/s = tokens generated / round time."""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import serve_util  # noqa: E402


def rounds(args, batch):
    extra = [] if batch else ["--no-batch"]
    srv = serve_util.ServerProc("--parallel", max(args.concurrency), "-c", args.ctx, "-t", args.threads, "--temp", 0,
                                "--chunk-size", args.chunk, *extra, model=args.model)
    out = []
    try:
        words = "the a one two red blue cat dog sun moon tree house river stone bird fish".split()
        serve_util.post(srv.port, "/v1/completions", {"prompt": "warm up", "max_tokens": 4}, timeout=600)
        for c in args.concurrency:
            for rep in range(args.reps):
                prompts = [" ".join(words[(i * 7 + j * 3 + rep) % len(words)] for j in range(args.prompt_words))
                           for i in range(c)]
                m0 = srv.metrics()
                t0 = time.time()
                with ThreadPoolExecutor(c) as ex:
                    res = list(ex.map(lambda p: serve_util.post(srv.port, "/v1/completions",
                                                                {"prompt": p, "max_tokens": args.gen}, timeout=900),
                                      prompts))
                wall = time.time() - t0
                m1 = srv.metrics()
                assert all(s == 200 for s, _ in res), res
                rows = m1["kvslim_decode_rows_total"] - m0["kvslim_decode_rows_total"]
                secs = m1["kvslim_decode_seconds_total"] - m0["kvslim_decode_seconds_total"]
                passes = m1["kvslim_decode_passes_total"] - m0["kvslim_decode_passes_total"]
                gen = sum(j["usage"]["completion_tokens"] for _, j in res)
                r = {"batch": batch, "concurrency": c, "rep": rep, "decode_tps": rows / secs if secs else 0,
                     "wall_tps": gen / wall, "tokens": gen, "decode_rows": rows, "decode_passes": passes,
                     "mean_rows_per_pass": rows / passes if passes else 0, "wall_s": wall}
                print(json.dumps(r), flush=True)
                out.append(r)
    finally:
        srv.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="write all rounds here")
    args = ap.parse_args()
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    results = rounds(args, True) + rounds(args, False)
    print("\n| concurrent requests | decode t/s, batched | decode t/s, one by one | rows per pass (batched) |")
    print("|---|---|---|---|")
    for c in args.concurrency:
        def best(batch, key):
            return max(r[key] for r in results if r["batch"] == batch and r["concurrency"] == c)
        print(f"| {c} | {best(True, 'decode_tps'):.1f} | {best(False, 'decode_tps'):.1f} | "
              f"{best(True, 'mean_rows_per_pass'):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

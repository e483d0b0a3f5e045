#!/usr/bin/env python3
"""Time to first token of `kvslim serve` for a question on a long document: cold (the document
prefilled and compressed), and warm from a stored context in memory, in a directory shared with
another replica, and in Redis shared with another replica. The model is loaded before any timing.

    bench/context_ttft.py --model models/retrieval.gguf --doc-chars 60000 \
        --press 'adakv(snapkv)' --ratio 0.9 --cache-type q8_0 -c 16384 -t 2

Each case is the time from sending the request to the first streamed token, the median of --reps
requests (a warm request that sends the document again also tokenizes it; one that names the
stored context by "context_id" does not) (the cold case sends "cache_prompt": false, so it never reuses anything). Prints one JSON
line per case and a Markdown table. Needs redis-server for the Redis case (skipped without it).
Standard library only."""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_proc import free_port, metrics, start_serve, stream_completion  # noqa: E402


class Replica:
    def __init__(self, kvslim, args):
        self.proc, self.port = start_serve(kvslim, args)

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read())
        c.close()
        if r.status != 200:
            raise SystemExit(f"{path}: HTTP {r.status}: {data}")
        return data

    def ttft(self, body):
        """Seconds from sending the request to its first streamed token, and the whole text."""
        first, _, _, text = stream_completion(self.port, body)
        return first, text

    def metrics(self):
        return metrics(self.port)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvslim", default="build/kvslim")
    ap.add_argument("--model", default="models/retrieval.gguf")
    ap.add_argument("--doc", default="models/passkey.txt", help="text repeated up to --doc-chars characters")
    ap.add_argument("--doc-chars", type=int, default=60000)
    ap.add_argument("--question", default=" What is the pass key? The pass key is")
    ap.add_argument("--press", default="adakv(snapkv)")
    ap.add_argument("--ratio", type=float, default=0.9)
    ap.add_argument("--cache-type", default="q8_0")
    ap.add_argument("-c", "--ctx-size", type=int, default=16384)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=8)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    text = open(args.doc).read()
    doc = ((text + " ") * (args.doc_chars // max(1, len(text)) + 1))[:args.doc_chars]
    body = {"prompt": doc, "question": args.question, "max_tokens": args.max_tokens, "temperature": 0}
    work = tempfile.mkdtemp(prefix="kvslim-ttft-")
    common = ["-m", args.model, "-c", str(args.ctx_size), "-t", str(args.threads), "--temp", "0", "--press", args.press,
              "--compression-ratio", str(args.ratio), "--cache-type-k", args.cache_type, "--cache-type-v",
              args.cache_type, "--chunk-size", str(args.chunk_size), "--parallel", "1"]
    redis = None
    redis_url = None
    if shutil.which("redis-server"):
        rport = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL)
        redis_url = f"redis://127.0.0.1:{rport}"
        time.sleep(0.5)
    rows = []
    try:
        store = ["--context-dir", os.path.join(work, "dir")] + (["--context-store", redis_url] if redis_url else [])
        a = Replica(args.kvslim, common + store)
        cold = [a.ttft(dict(body, cache_prompt=False)) for _ in range(args.reps)]
        build = a.ttft(body)  # cold, and stores the context in every tier
        deadline = time.time() + 60
        want = 2 if redis_url else 1
        while time.time() < deadline:
            m = a.metrics()
            if sum(v for k, v in m.items() if k.startswith("kvslim_context_stores_total")) >= want:
                break
            time.sleep(0.1)
        mem = [a.ttft(body) for _ in range(args.reps)]
        cid = a.post("/v1/contexts", {"prompt": doc})["id"]
        by_id = [a.ttft({"context_id": cid, "question": args.question, "max_tokens": args.max_tokens, "temperature": 0})
                 for _ in range(args.reps)]
        n_tokens = a.post("/v1/completions", dict(body, max_tokens=1))["usage"]["prompt_tokens_details"]["cached_tokens"]
        a.close()
        cases = [("cold (prefill and press)", cold), ("first request (cold, then stored)", [build]), ("warm: memory (the prompt sent again)", mem),
                 ("warm: memory (context_id)", by_id)]
        # A fresh replica with only the directory, then one with only Redis: their first request
        # reads the shared tier, later ones hit their own memory.
        b = Replica(args.kvslim, common + ["--context-dir", os.path.join(work, "dir")])
        cases.append(("warm: directory (another replica)", [b.ttft(body)]))
        b.close()
        if redis_url:
            c = Replica(args.kvslim, common + ["--context-store", redis_url])
            cases.append(("warm: Redis (another replica)", [c.ttft(body)]))
            c.close()
        files = [os.path.join(work, "dir", f) for f in os.listdir(os.path.join(work, "dir")) if f.endswith(".kvc")]
        size = os.path.getsize(files[0]) if files else 0
        ref_text = cold[0][1]
        cold_s = statistics.median(t for t, _ in cold)
        for name, runs in cases:
            t = statistics.median(x for x, _ in runs)
            same = all(x == ref_text for _, x in runs)
            row = {"case": name, "ttft_s": round(t, 4), "share_of_cold": round(t / cold_s, 5), "same_answer": same,
                   "runs": len(runs), "document_tokens": n_tokens, "stored_bytes": size}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if redis:
            redis.kill()
            redis.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("\n| case | time to first token | share of cold | same answer |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['ttft_s']:.3f} s | {100 * r['share_of_cold']:.2f}% | {'yes' if r['same_answer'] else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())

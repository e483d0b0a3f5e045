#!/usr/bin/env python3
"""A bounded load test of stored contexts: N clients asking questions about M documents through
nginx (deploy/nginx.conf), two `kvslim serve` replicas sharing a `redis-server`, all on loopback.
Each client picks a document at random and asks one of its questions; the same run is made with
"cache_prompt": false (every question prefills its document again) for comparison.

    bench/context_load.py --model models/retrieval.gguf --docs 8 --doc-chars 12000 --clients 4 \
        --questions 48 -t 1

Reports, for each mode: questions per second, p50 and p99 time to first token (of all questions,
and of those answered from a stored context), the replicas' decode rate while the mode ran (their
/metrics: decoded tokens over decode seconds), and how many answers differ from the first answer of the same question
(there must be none). Needs nginx and redis-server (Debian packages). Standard library only."""
import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_proc import free_port, metrics, start_serve, stream_completion  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


def nginx(work, a, b):
    with open(os.path.join(SRC, "deploy", "nginx.conf")) as f:
        conf = f.read()
    port = free_port()
    conf = conf.replace("127.0.0.1:8081", f"127.0.0.1:{a}").replace("127.0.0.1:8082", f"127.0.0.1:{b}")
    conf = conf.replace("listen 127.0.0.1:8080", f"listen 127.0.0.1:{port}")
    for d in ("logs", "tmp"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    path = os.path.join(work, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    p = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", work, "-c", path, "-g",
                          "daemon off; master_process off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return p, port


def ask(port, body):
    """(time to first token, total seconds, cached prompt tokens, text) of one streamed completion."""
    first, total, usage, text = stream_completion(port, body)
    return first, total, usage.get("prompt_tokens_details", {}).get("cached_tokens", 0), text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def decode_rate(ports):
    """(decoded tokens, decode seconds) summed over the replicas' /metrics."""
    ms = [metrics(p) for p in ports]
    return sum(m["kvslim_decode_rows_total"] for m in ms), sum(m["kvslim_decode_seconds_total"] for m in ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvslim", default="build/kvslim")
    ap.add_argument("--model", default="models/retrieval.gguf")
    ap.add_argument("--doc", default="models/passkey.txt")
    ap.add_argument("--docs", type=int, default=8, help="M documents (each the text rotated by a different offset)")
    ap.add_argument("--doc-chars", type=int, default=12000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--questions", type=int, default=48, help="questions per mode")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--press", default="kvzip")
    ap.add_argument("--ratio", type=float, default=0.9)
    ap.add_argument("--cache-type", default="q8_0")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    text = open(args.doc).read()
    docs = []
    for i in range(args.docs):
        off = (i * 997) % len(text)
        docs.append(((text[off:] + " " + text) * (args.doc_chars // len(text) + 2))[:args.doc_chars])
    questions = [" What is the pass key? The pass key is", " Remember the pass key. It is"]
    work = tempfile.mkdtemp(prefix="kvslim-load-")
    rport = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", work], stdout=subprocess.DEVNULL)
    wait_port(rport)
    common = ["-m", args.model, "-c", str(args.ctx_size), "-t", str(args.threads), "--temp", "0", "--press",
              args.press, "--compression-ratio", str(args.ratio), "--cache-type-k", args.cache_type,
              "--cache-type-v", args.cache_type, "--parallel", str(args.parallel), "--context-store",
              f"redis://127.0.0.1:{rport}"]
    procs = []
    try:
        a, pa = start_serve(args.kvslim, common)
        b, pb = start_serve(args.kvslim, common)
        procs += [a, b]
        ng, port = nginx(work, pa, pb)
        procs.append(ng)
        rng = random.Random(args.seed)
        plan = [(rng.randrange(args.docs), rng.randrange(len(questions))) for _ in range(args.questions)]
        first_answer = {}
        for mode, cache in (("no reuse (cache_prompt: false)", False), ("stored contexts (memory + Redis)", True)):
            r0, s0 = decode_rate([pa, pb])
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as ex:
                res = list(ex.map(lambda dq: (dq, ask(port, {"prompt": docs[dq[0]], "question": questions[dq[1]],
                                                              "max_tokens": args.max_tokens, "temperature": 0,
                                                              "cache_prompt": cache})), plan))
            wall = time.perf_counter() - t0
            r1, s1 = decode_rate([pa, pb])
            ttft = [r[0] for _, r in res]
            warm = [r[0] for _, r in res if r[2] > 0]
            differ = 0
            for dq, r in res:
                differ += first_answer.setdefault(dq, r[3]) != r[3]
            print(json.dumps({"mode": mode, "questions": len(res), "wall_s": round(wall, 2),
                              "questions_per_s": round(len(res) / wall, 3), "ttft_p50_s": round(pct(ttft, 0.5), 4),
                              "ttft_p99_s": round(pct(ttft, 0.99), 4), "warm_questions": len(warm),
                              "warm_ttft_p50_s": round(pct(warm, 0.5), 4) if warm else None,
                              "warm_ttft_p99_s": round(pct(warm, 0.99), 4) if warm else None,
                              "decode_tokens_per_s": round((r1 - r0) / (s1 - s0), 1) if s1 > s0 else None,
                              "answers_differing": differ}), flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        redis.kill()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

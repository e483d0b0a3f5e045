#!/usr/bin/env python3
"""`kvslim serve` against llama.cpp's `llama-server` on the same GGUF file: aggregate decode
tokens/s for 1, 2, 4, 8 concurrent requests, both servers started with `--parallel N` and the
same thread count, measured by bench/serve_client.py (the same client and method for both).
Python standard library only; llama-server is built outside this repository (bench/README.md).

    python3 bench/serve_compare.py -m /dev/shm/tinyllama-q8_0.gguf \
        --llama-server /path/to/llama-server -t 2,1 -n 1,2,4,8 --reps 2 --json out.json

For each thread count, repetition and N the two engines run one after the other, in alternating
order (kvslim first on even repetitions, llama-server first on odd ones), each in a fresh server
process with `--parallel N` (one warm-up request, then the short and long rounds of
serve_client.measure). Every measurement is printed as a JSON line; the summary gives per
engine the median over repetitions, and the kvslim / llama-server ratio of each repetition
(the two engines measured a minute apart under the same load)."""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_cmd(engine, args, n, threads, port):
    if engine == "kvslim":
        return [args.kvslim, "serve", "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                "--parallel", str(n), "-c", str(args.ctx), "-t", str(threads)]
    # llama-server's -c is the context of all slots together; --no-cache-prompt: kvslim has no
    # prompt cache, and each round repeats the previous round's prompt.
    return [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(n), "-c", str(args.ctx * n), "-t", str(threads), "-tb", str(threads),
            "--no-cache-prompt", "--no-webui"] + args.llama_arg


class Server:
    """A server process on a free loopback port, ready once GET /health answers 200."""

    def __init__(self, cmd, port, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {self.proc.returncode}; log in {log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"{cmd[0]} not ready after 300 s; log in {log_path}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--kvslim", default="build/kvslim")
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--llama-arg", action="append", default=[], help="extra llama-server argument (repeatable)")
    ap.add_argument("-t", "--threads", default="2,1")
    ap.add_argument("-n", "--concurrency", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--short", type=int, default=16)
    ap.add_argument("--long", type=int, default=80)
    ap.add_argument("--ctx", type=int, default=512, help="context per request")
    ap.add_argument("--logs", default="/tmp/serve_compare_logs")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()
    os.makedirs(args.logs, exist_ok=True)
    threads = [int(x) for x in args.threads.split(",")]
    conc = [int(x) for x in args.concurrency.split(",")]
    results = []
    for t in threads:
        for rep in range(args.reps):
            for n in conc:
                order = ["kvslim", "llama-server"] if rep % 2 == 0 else ["llama-server", "kvslim"]
                for engine in order:
                    port = free_port()
                    srv = Server(engine_cmd(engine, args, n, t, port), port,
                                 os.path.join(args.logs, f"{engine}-t{t}-n{n}-r{rep}.log"))
                    try:
                        serve_client.complete(srv.url, serve_client.PROMPT, 4)  # warm-up
                        r = serve_client.measure(srv.url, n, short=args.short, long=args.long, pid=srv.proc.pid)
                    finally:
                        srv.close()
                    r.update(engine=engine, threads=t, rep=rep)
                    print(json.dumps(r), flush=True)
                    results.append(r)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(results, f, indent=1)
    print("\n| threads | concurrent requests | kvslim t/s | llama-server t/s | kvslim t/CPU-s | "
          "llama-server t/CPU-s | ratio (wall), per rep | ratio (CPU), per rep |")
    print("|---|---|---|---|---|---|---|---|")
    for t in threads:
        for n in conc:
            def pick(engine, key):
                return [r[key] for r in sorted(results, key=lambda r: r["rep"])
                        if r["engine"] == engine and r["threads"] == t and r["concurrency"] == n]
            kw, lw = pick("kvslim", "decode_tps"), pick("llama-server", "decode_tps")
            kc, lc = pick("kvslim", "decode_tps_per_cpu_s"), pick("llama-server", "decode_tps_per_cpu_s")
            rw = " / ".join(f"{a / b:.2f}" for a, b in zip(kw, lw))
            rc = " / ".join(f"{a / b:.2f}" for a, b in zip(kc, lc))
            print(f"| {t} | {n} | {statistics.median(kw):.1f} | {statistics.median(lw):.1f} | "
                  f"{statistics.median(kc):.1f} | {statistics.median(lc):.1f} | {rw} | {rc} |")


if __name__ == "__main__":
    main()

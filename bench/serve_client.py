#!/usr/bin/env python3
"""Aggregate decode tokens/s of any OpenAI-compatible server (`kvslim serve`, llama.cpp's
`llama-server`, ...) against the number of concurrent requests. Python standard library only.

    python3 bench/serve_client.py --url http://127.0.0.1:8080 -n 1,2,4,8 [--pid PID]

Method (the same for every server, nothing read from the server but the responses):
- A round sends N identical `POST /v1/completions` requests at once (fixed prompt, greedy,
  `max_tokens` G, not streamed) and times until the last response; `usage.completion_tokens`
  gives the tokens generated.
- Each measurement is two rounds, a short one (G = --short) and a long one (G = --long), with the
  same N and prompt. Aggregate decode tokens/s = (tokens_long - tokens_short) / (wall_long -
  wall_short): prefill, HTTP and the first decode steps (while the N requests join the batch)
  cost the same in both rounds and cancel, leaving only steps with all N requests decoding.
- With --pid, the server process's CPU time (user + system, all threads, /proc/PID/stat) is read
  around each round, and the same difference gives decode tokens per process CPU second: on a
  machine shared with other jobs this is the rate the server would have on cores of its own.
- Requests carry `"ignore_eos": true` and `"cache_prompt": false` (llama-server's fields: no
  early stop, no reuse of the previous round's prompt; servers without them ignore them), and a
  round where a request returned fewer than G tokens is reported (the rate uses the actual counts).

Outputs one JSON line per measurement."""
import argparse
import http.client
import json
import os
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

PROMPT = ("Once upon a time, in a small village by the river, there lived an old fisherman who told "
          "the children stories about the sea every evening.")


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid`, all its threads (fields 14 and 15 of
    /proc/PID/stat, in clock ticks). None when pid is None."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def complete(url, prompt, max_tokens, timeout=1800, model=None):
    """One non-streamed /v1/completions request; returns (HTTP status, parsed body)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": False,
            "ignore_eos": True, "cache_prompt": False}
    if model:
        body["model"] = model
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data)


def one_round(url, n, prompt, max_tokens, pid=None, model=None):
    """N concurrent requests; returns wall seconds, server CPU seconds, tokens generated, and the
    number of requests that stopped before max_tokens."""
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(n) as ex:
        res = list(ex.map(lambda _: complete(url, prompt, max_tokens, model=model), range(n)))
    wall = time.perf_counter() - t0
    c1 = cpu_seconds(pid)
    bad = [(s, j) for s, j in res if s != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} requests failed: {bad[0]}")
    toks = [j["usage"]["completion_tokens"] for _, j in res]
    return {"wall_s": wall, "cpu_s": None if pid is None else c1 - c0, "tokens": sum(toks),
            "short_requests": sum(t < max_tokens for t in toks)}


def measure(url, n, prompt=PROMPT, short=16, long=80, pid=None, model=None):
    """Aggregate decode tokens/s for N concurrent requests (the two-round difference above)."""
    a = one_round(url, n, prompt, short, pid, model)
    b = one_round(url, n, prompt, long, pid, model)
    dt, dtok = b["wall_s"] - a["wall_s"], b["tokens"] - a["tokens"]
    out = {"concurrency": n, "decode_tps": dtok / dt if dt > 0 else float("nan"),
           "decode_tokens": dtok, "short": a, "long": b, "loadavg": os.getloadavg()[0]}
    if pid is not None:
        dc = b["cpu_s"] - a["cpu_s"]
        out["decode_tps_per_cpu_s"] = dtok / dc if dc > 0 else float("nan")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("-n", "--concurrency", default="1,2,4,8")
    ap.add_argument("--short", type=int, default=16, help="max_tokens of the short round")
    ap.add_argument("--long", type=int, default=80, help="max_tokens of the long round")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--pid", type=int, help="server process id, for tokens per CPU second")
    ap.add_argument("--model", help="`model` field of the requests (some servers require one)")
    args = ap.parse_args()
    for n in (int(x) for x in args.concurrency.split(",")):
        r = measure(args.url, n, args.prompt, args.short, args.long, args.pid, args.model)
        print(json.dumps(r), flush=True)
        if r["short"]["short_requests"] or r["long"]["short_requests"]:
            print(f"warning: some requests stopped before max_tokens at N={n}", file=sys.stderr)


if __name__ == "__main__":
    main()

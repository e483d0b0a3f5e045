#!/usr/bin/env python3
"""Soak run of one `kvslim serve`: a low, steady mixed load for a fixed time while the server's
resident memory is sampled. Python standard library only.

    python3 bench/serve_soak.py --kvslim build/kvslim -m models/stories260K.gguf --minutes 20 \
        [--clients 2] [--sample-s 15] [--seed 1] [--json OUT.json] [-- extra serve flags]

The driver starts `kvslim serve --port 0` itself (loopback) and reads VmRSS from
/proc/PID/status every --sample-s seconds. Each of --clients threads sends, one after the other
with a short pause, requests drawn from this mix (fixed seed):
- completions and chat completions, streamed or not, greedy (temperature 0), 8-96 new tokens;
- a press per request: none, snapkv with compression_ratio 0.5, knorm with compression_ratio 0.3;
- cancellations: a stream closed after a few events, a non-streamed request whose client closes
  before the answer;
- bad requests (expected 4xx): empty prompt, compression_ratio 1.5, an unknown press, a body that
  is not JSON, negative max_tokens.
Checks per request: a good request gets 200 with whole JSON and a finish_reason, or a stream with
a finish_reason and `data: [DONE]`; a bad request gets a 4xx with OpenAI's error body; the same
greedy request (prompt, press, length) always gets the same text. Anything else is an error.

At the end: request counts by outcome, VmRSS and RssAnon at the first sample (after a warm-up of
every kind of request), at half time, their maximum and the last sample, and /metrics' requests still holding a slot (0 once
idle). Exit status 0 when there was no error, nothing holds a slot at the end, and the final RSS,
less the memory the server's stored contexts hold (kvslim_context_bytes{tier="memory"}: kept on
purpose, within --context-cache), is within --rss-tolerance-kib of the same at half time (the
first minutes touch pages that stay resident: code, thread stacks, allocator pages; growth that
matters is growth in the second half); 1 otherwise."""
import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to play with", "One day, a big bird",
           "Tom and his mom went to the park. Tom saw", "There was a girl who liked to sing. She"]
PRESSES = [{}, {"press": "snapkv", "compression_ratio": 0.5}, {"press": "knorm", "compression_ratio": 0.3}]
BAD = [
    ("/v1/completions", {"prompt": "", "max_tokens": 8}),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 8, "press": "snapkv", "compression_ratio": 1.5}),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 8, "press": "no_such_press"}),
    ("/v1/completions", b'{"prompt": "Once", "max_tokens": '),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": -1}),
]


def rss_kib(pid, field="VmRSS"):
    """A memory figure of /proc/PID/status in KiB: VmRSS (all resident pages), RssAnon (heap,
    arenas, stacks: what a leak grows) or RssFile (mapped code and model file)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, port, pause):
        self.port, self.pause = port, pause
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []
        self.greedy = {}  # (path, prompt, press, max_tokens) -> text

    def count(self, outcome, detail=None):
        with self.lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if outcome == "error" and len(self.errors) < 20:
                self.errors.append(detail)

    def same_text(self, key, text):
        with self.lock:
            first = self.greedy.setdefault(key, text)
        return first == text

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def draw(self, rng):
        """One request of the mix: (kind, path, body)."""
        r = rng.random()
        if r < 0.10:
            path, body = rng.choice(BAD)
            return "bad", path, body
        chat = rng.random() < 0.4
        prompt = rng.choice(PROMPTS)
        body = {"max_tokens": rng.randint(8, 96), "temperature": 0, **rng.choice(PRESSES)}
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            path = "/v1/completions"
            body["prompt"] = prompt
        if r < 0.18:
            return "cancel_stream", path, dict(body, stream=True)
        if r < 0.22:
            return "cancel_wait", path, body
        if rng.random() < 0.5:
            return "stream", path, dict(body, stream=True)
        return "plain", path, body

    def one(self, kind, path, body):
        chat = path.endswith("chat/completions")
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        c = self.conn()
        try:
            c.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            if kind == "cancel_wait":
                time.sleep(0.05)
                c.sock.close()  # the client goes away before its answer
                return self.count("cancelled")
            resp = c.getresponse()
            if kind == "bad":
                j = json.loads(resp.read())
                ok = 400 <= resp.status < 500 and isinstance(j.get("error"), dict) and j["error"].get("message")
                return self.count("bad_4xx" if ok else "error", f"bad request {body!r} -> {resp.status} {j}")
            if resp.status != 200:
                return self.count("error", f"{path} {body} -> {resp.status} {resp.read()[:300]!r}")
            key = (path, body.get("prompt") or body["messages"][0]["content"], body.get("press"), body["max_tokens"])
            if kind == "plain":
                j = json.loads(resp.read())  # whole JSON or an exception (an error)
                ch = j["choices"][0]
                text = ch["message"]["content"] if chat else ch["text"]
                if not ch.get("finish_reason"):
                    return self.count("error", f"no finish_reason: {j}")
                if not self.same_text(key, text):
                    return self.count("error", f"greedy text differs for {key}: {text!r}")
                return self.count("ok_plain")
            stop_after = 1 + len(key[1]) % 4 if kind == "cancel_stream" else None
            events, done = [], False
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                events.append(json.loads(line[6:]))
                if stop_after is not None and len(events) >= stop_after:
                    c.sock.close()
                    return self.count("cancelled")
            finished = any(ch.get("finish_reason") for e in events for ch in e.get("choices", []))
            if stop_after is not None:
                return self.count("ok_stream" if done and finished else "error", "short stream ended early")
            if not (done and finished):
                return self.count("error", f"stream cut short ({len(events)} events, done={done})")
            text = "".join((ch["delta"].get("content", "") if chat else ch["text"])
                           for e in events for ch in e.get("choices", []))
            if not self.same_text(key, text):
                return self.count("error", f"greedy stream text differs for {key}: {text!r}")
            return self.count("ok_stream")
        except Exception as e:  # noqa: BLE001 -- every unexpected failure is counted and reported
            return self.count("error", f"{kind} {path} {body!r}: {type(e).__name__}: {e}")
        finally:
            c.close()

    def client(self, seed, until):
        rng = random.Random(seed)
        while time.time() < until:
            self.one(*self.draw(rng))
            time.sleep(self.pause)


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def stored_kib(port):
    """Memory held by the server's stored contexts (kvslim_context_bytes{tier="memory"}), KiB."""
    return int(metrics(port).get('kvslim_context_bytes{tier="memory"}', 0) // 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvslim", default="build/kvslim")
    ap.add_argument("-m", "--model", default="models/stories260K.gguf")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--sample-s", type=float, default=15)
    ap.add_argument("--pause", type=float, default=0.2, help="seconds each client waits between requests")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rss-tolerance-kib", type=int, default=4096)
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("serve_args", nargs="*", help="extra `kvslim serve` flags (after --)")
    a = ap.parse_args()

    cmd = [a.kvslim, "serve", "-m", a.model, "--host", "127.0.0.1", "--port", "0", "--chat-template", "chatml",
           "-c", "512", *a.serve_args]
    srv = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    for line in srv.stderr:
        m = re.search(r" on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("kvslim serve did not start")
    log_tail = []
    threading.Thread(target=lambda: [log_tail.append(l) for l in srv.stderr], daemon=True).start()
    try:
        soak = Soak(port, a.pause)
        # Warm-up: every kind of request once, so the first RSS sample has the buffers a steady load uses.
        for kind, path, body in [("plain", "/v1/completions", {"prompt": p, "max_tokens": 96, "temperature": 0, **pr})
                                 for p in PROMPTS[:2] for pr in PRESSES] + \
                                [("stream", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                      "max_tokens": 96, "temperature": 0, "stream": True})]:
            soak.one(kind, path, body)
        soak.counts.clear()
        t0 = time.time()
        until = t0 + a.minutes * 60
        threads = [threading.Thread(target=soak.client, args=(a.seed * 1000 + i, until)) for i in range(a.clients)]
        for t in threads:
            t.start()
        samples = []
        while True:
            samples.append((round(time.time() - t0, 1), rss_kib(srv.pid), rss_kib(srv.pid, "RssAnon"),
                            stored_kib(port)))
            if time.time() >= until:
                break
            time.sleep(min(a.sample_s, max(0.0, until - time.time())))
        for t in threads:
            t.join()
        time.sleep(1.0)  # cancelled requests notice their client within 200 ms
        m = metrics(port)
        samples.append((round(time.time() - t0, 1), rss_kib(srv.pid), rss_kib(srv.pid, "RssAnon"), stored_kib(port)))
        rss = [r for _, r, _, _ in samples]
        anon = [r for _, _, r, _ in samples]
        stored = [c for _, _, _, c in samples]
        # Stored contexts are kept on purpose (within --context-cache): growth that matters is
        # growth of what is left.
        rest = [r - c for r, c in zip(rss, stored)]
        summary = {
            "duration_s": round(time.time() - t0, 1), "clients": a.clients, "serve": " ".join(cmd[1:]),
            "requests": sum(soak.counts.values()), "outcomes": dict(sorted(soak.counts.items())),
            "rss_kib": {"start": rss[0], "half": rss[len(rss) // 2], "max": max(rss), "end": rss[-1], "samples": len(rss)},
            "rss_anon_kib": {"start": anon[0], "half": anon[len(anon) // 2], "max": max(anon), "end": anon[-1]},
            "stored_contexts_kib": {"start": stored[0], "half": stored[len(stored) // 2], "end": stored[-1]},
            "rss_less_stored_kib": {"start": rest[0], "half": rest[len(rest) // 2], "max": max(rest), "end": rest[-1]},
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
            "server_processing_at_end": m.get("kvslim_requests_processing"),
            "server_finished": m.get("kvslim_requests_finished_total"),
            "server_cancelled": m.get("kvslim_requests_cancelled_total"),
            "errors": soak.errors,
        }
        passed = (not soak.counts.get("error") and rest[-1] - rest[len(rest) // 2] <= a.rss_tolerance_kib
                  and m.get("kvslim_requests_processing") == 0)
        summary["pass"] = passed
        out = json.dumps(summary)
        print(out)
        print("samples (s, VmRSS KiB, RssAnon KiB, stored contexts KiB):", samples, file=sys.stderr)
        if a.json:
            with open(a.json, "w") as f:
                f.write(json.dumps(summary, indent=1) + "\n")
        return 0 if passed else 1
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    sys.exit(main())

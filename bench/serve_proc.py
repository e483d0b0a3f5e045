"""What the stored-context benchmarks share: starting `kvslim serve` on a free loopback port, a
streamed completion timed to its first token, and /metrics as a dict. Standard library only."""
import http.client
import json
import re
import socket
import subprocess
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(kvslim, args):
    """`kvslim serve --port 0 ARGS` on loopback, once its model is loaded: (process, port)."""
    p = subprocess.Popen([kvslim, "serve", "--host", "127.0.0.1", "--port", "0", *args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    while True:
        line = p.stderr.readline()
        if not line:
            raise SystemExit("kvslim serve did not start:\n" + "".join(log))
        log.append(line)
        m = re.search(r" on http://127\.0\.0\.1:(\d+)", line)
        if m:
            # Drain stderr so the server never blocks on it.
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))


def stream_completion(port, body):
    """(seconds to the first streamed token, total seconds, usage, text) of one /v1/completions."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True, stream_options={"include_usage": True})),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    first, text, usage = None, "", {}
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise SystemExit(f"request failed: {ev}")
        usage = ev.get("usage") or usage
        piece = ev["choices"][0]["text"] if ev.get("choices") else ""
        if piece and first is None:
            first = time.perf_counter() - t0
        text += piece
    c.close()
    total = time.perf_counter() - t0
    return (first if first is not None else total), total, usage, text


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and l[0] != "#"}

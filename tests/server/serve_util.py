"""Helpers for the `kvslim serve` tests: start a server on a free loopback port, talk to it with
Python's standard library (http.client), read server-sent events. No third-party packages."""
import http.client
import json
import os
import re
import subprocess
import threading
import time

KVSLIM = os.environ.get("KVSLIM", "build/kvslim")
SRC = os.environ.get("KVSLIM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "models", "stories260K.gguf")


class ServerProc:
    """`kvslim serve --port 0 ARGS...`; the port is read from the line it prints on stderr."""

    def __init__(self, *args, model=MODEL, env=None, ready=True, port=0):
        """ready=False: returns once the listener is up ("listening at" line), before the model is loaded.
        port: a fixed port instead of a free one (a replica restarted where its load balancer expects it)."""
        cmd = [KVSLIM, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))
        pattern = r" on http://127\.0\.0\.1:(\d+)" if ready else r"listening at http://127\.0\.0\.1:(\d+)"
        self.log = []
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start: " + "".join(self.log))
        # Keep draining stderr so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True)
        self._drain.start()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(timeout=5)
        self.proc.stderr.close()
        return self.proc.returncode

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        status, text = request(self.port, "GET", "/metrics", raw=True)
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def request(port, method, path, body=None, headers=None, raw=False, timeout=120):
    """Returns (status, parsed JSON or text). `body`: dict (sent as JSON) or str/bytes (sent as is)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", errors="replace")
    conn.close()
    if raw:
        return resp.status, text
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def post(port, path, body, **kw):
    return request(port, "POST", path, body, **kw)


class StreamCutShort(AssertionError):
    """A 200 stream that ended without a finish_reason and "data: [DONE]"."""


def stream(port, path, body, stop_after=None, timeout=120):
    """POSTs with "stream": true and reads server-sent events. Returns (status, events, done) where
    events are the parsed JSON payloads and done says whether "data: [DONE]" arrived. With
    `stop_after`, closes the connection after that many events (a client that goes away).
    Without it, a 200 stream that ends before a chunk with a finish_reason and [DONE] raises
    StreamCutShort: a client cannot tell such a stream from a complete answer by its text."""
    body = dict(body, stream=True)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        text = resp.read().decode()
        conn.close()
        return resp.status, [json.loads(text)], False
    assert resp.getheader("Content-Type", "").startswith("text/event-stream"), resp.getheader("Content-Type")
    events, done = [], False
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if not line.startswith("data: "):
            continue  # blank separators and ": keep-alive" comments
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            break
        events.append(json.loads(payload))
        if stop_after is not None and len(events) >= stop_after:
            break
    conn.close()
    if stop_after is None:
        finished = any(c.get("finish_reason") for e in events for c in e.get("choices", []))
        if not (done and finished):
            raise StreamCutShort(f"the stream ended without {'[DONE]' if finished else 'a finish_reason'}: {events[-3:]}")
    return resp.status, events, done


def stream_text(events, chat):
    parts = []
    for e in events:
        for c in e.get("choices", []):
            parts.append(c["delta"].get("content", "") if chat else c["text"])
    return "".join(parts)


NGINX = __import__("shutil").which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NginxProc:
    """Debian's nginx with deploy/nginx.conf in front of two replicas (upstream ports a, b), on a free
    loopback port (`port`), one foreground process in a temporary prefix; ready when /health answers
    200 through it. Raises AssertionError when nginx exits or does not become ready in 20 s."""

    def __init__(self, a, b, prefix_name="kvslim-nginx-"):
        import tempfile
        self.prefix = tempfile.mkdtemp(prefix=prefix_name)
        self.proc = None
        for d in ("logs", "tmp"):
            os.makedirs(os.path.join(self.prefix, d))
        with open(os.path.join(SRC, "deploy", "nginx.conf")) as f:
            conf = f.read()
        self.port = free_port()
        conf = conf.replace("127.0.0.1:8081", f"127.0.0.1:{a}").replace("127.0.0.1:8082", f"127.0.0.1:{b}")
        conf = conf.replace("listen 127.0.0.1:8080", f"listen 127.0.0.1:{self.port}")
        if ":808" in re.sub(r"#.*", "", conf):
            raise AssertionError("deploy/nginx.conf has an address this helper does not replace")
        path = os.path.join(self.prefix, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        # One process in the foreground: no user switch, nothing left behind.
        self.proc = subprocess.Popen([NGINX, "-p", self.prefix, "-c", path, "-g", "daemon off; master_process off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 20
        while True:
            try:
                if request(self.port, "GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
            if self.proc.poll() is not None:
                raise AssertionError("nginx exited: " + self.proc.stderr.read())
            if time.time() > deadline:
                raise AssertionError("nginx did not answer /health within 20 s")

    def close(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc.stderr.close()
        __import__("shutil").rmtree(self.prefix, ignore_errors=True)


#!/usr/bin/env python3
"""Two `kvslim serve` replicas behind Debian's nginx with deploy/nginx.conf, all on loopback.
Exits 77 (ctest: skipped) with a message when nginx is not installed; CI installs it."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import SRC, ServerProc, post, request, stream, stream_text  # noqa: E402

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx(unittest.TestCase):
    def test_two_replicas(self):
        a = ServerProc("--parallel", 2, "--temp", 0, "-c", 256, "--chat-template", "chatml")
        b = ServerProc("--parallel", 2, "--temp", 0, "-c", 256, "--chat-template", "chatml")
        prefix = tempfile.mkdtemp(prefix="kvslim-nginx-")
        nginx = None
        try:
            for d in ("logs", "tmp"):
                os.makedirs(os.path.join(prefix, d))
            with open(os.path.join(SRC, "deploy", "nginx.conf")) as f:
                conf = f.read()
            port = free_port()
            conf = conf.replace("127.0.0.1:8081", f"127.0.0.1:{a.port}").replace("127.0.0.1:8082", f"127.0.0.1:{b.port}")
            conf = conf.replace("listen 127.0.0.1:8080", f"listen 127.0.0.1:{port}")
            self.assertNotIn(":808", re.sub(r"#.*", "", conf))  # every address replaced
            path = os.path.join(prefix, "nginx.conf")
            with open(path, "w") as f:
                f.write(conf)
            # One process in the foreground: no user switch, nothing left behind.
            nginx = subprocess.Popen([NGINX, "-p", prefix, "-c", path, "-g", "daemon off; master_process off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 20
            while time.time() < deadline:
                try:
                    if request(port, "GET", "/health", timeout=2)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.05)
                if nginx.poll() is not None:
                    self.fail("nginx exited: " + nginx.stderr.read())
            body = {"prompt": "Once upon a time", "max_tokens": 12}
            solo = post(a.port, "/v1/completions", body)[1]["choices"][0]["text"]

            def one(i):
                if i % 4 == 0:
                    s, ev, done = stream(port, "/v1/completions", body)
                    return (s if done else -1), stream_text(ev, False)
                s, j = post(port, "/v1/completions", body)
                return s, j["choices"][0]["text"] if s == 200 else j

            with ThreadPoolExecutor(8) as ex:
                results = list(ex.map(one, range(24)))
            self.assertEqual([s for s, _ in results], [200] * 24)
            self.assertEqual({t for _, t in results}, {solo})
            served = [srv.metrics()["kvslim_requests_finished_total"] for srv in (a, b)]
            self.assertEqual(sum(served), 25)  # 24 through nginx + 1 straight to a
            self.assertGreater(served[1], 0)  # both replicas took traffic
            self.assertGreater(served[0], 1)
            # Errors pass through with their status and body.
            s, j = post(port, "/v1/completions", {"prompt": ""})
            self.assertEqual(s, 400)
            self.assertEqual(j["error"]["param"], "prompt")
        finally:
            if nginx:
                nginx.terminate()
                try:
                    nginx.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    nginx.kill()
                nginx.stderr.close()
            a.close()
            b.close()
            shutil.rmtree(prefix, ignore_errors=True)


if __name__ == "__main__":
    if NGINX is None:
        print("SKIPPED: nginx is not installed (apt-get install nginx; CI installs it from .ci/packages.txt)")
        sys.exit(77)
    unittest.main()

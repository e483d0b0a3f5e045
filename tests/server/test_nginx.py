#!/usr/bin/env python3
"""Two `kvslim serve` replicas behind Debian's nginx with deploy/nginx.conf, all on loopback.
Exits 77 (ctest: skipped) with a message when nginx is not installed; CI installs it."""
import os
import subprocess
import sys
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import NGINX, NginxProc, ServerProc, post, request, stream, stream_text  # noqa: E402





class Nginx(unittest.TestCase):
    def test_two_replicas(self):
        a = ServerProc("--parallel", 2, "--temp", 0, "-c", 256, "--chat-template", "chatml")
        b = ServerProc("--parallel", 2, "--temp", 0, "-c", 256, "--chat-template", "chatml")
        nginx = None
        try:
            nginx = NginxProc(a.port, b.port)
            port = nginx.port
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
                nginx.close()
            a.close()
            b.close()


if __name__ == "__main__":
    if NGINX is None:
        print("SKIPPED: nginx is not installed (apt-get install nginx; CI installs it from .ci/packages.txt)")
        sys.exit(77)
    unittest.main()

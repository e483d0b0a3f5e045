#!/usr/bin/env python3
"""bench/serve_client.py (the throughput client used against kvslim serve and llama-server):
its token accounting against a real `kvslim serve`, the request body it sends, its CPU-time
reader against os.times(), and a failed request raising. Standard library only.
    KVSLIM=build/kvslim python3 tests/server/test_serve_client.py"""
import http.server
import json
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import serve_client  # noqa: E402
from serve_util import ServerProc  # noqa: E402


class FakeServer(http.server.ThreadingHTTPServer):
    """Answers /v1/completions with `max_tokens` tokens (or a 503 when `fail`), recording bodies."""

    def __init__(self, fail=False):
        self.bodies, self.fail = [], fail
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append((self.path, body))
                status = 503 if outer.fail else 200
                out = ({"error": {"message": "busy"}} if outer.fail else
                       {"choices": [{"text": "x"}], "usage": {"completion_tokens": body["max_tokens"]}})
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.shutdown()
        self.server_close()


class Client(unittest.TestCase):
    def test_against_kvslim_serve(self):
        srv = ServerProc("--parallel", 3, "-c", 128, "--temp", 0)
        try:
            r = serve_client.measure(f"http://127.0.0.1:{srv.port}", 3, prompt="Once upon a time",
                                     short=2, long=7, pid=srv.proc.pid)
        finally:
            srv.close()
        # 3 requests x 2 and x 7 tokens (the model rarely ends a story in 7 tokens; if it did the
        # round would say so in short_requests and the expected counts below would not hold).
        self.assertEqual(r["short"]["short_requests"], 0)
        self.assertEqual(r["long"]["short_requests"], 0)
        self.assertEqual(r["short"]["tokens"], 3 * 2)
        self.assertEqual(r["long"]["tokens"], 3 * 7)
        self.assertEqual(r["decode_tokens"], 3 * (7 - 2))
        self.assertEqual(r["concurrency"], 3)
        # CPU time is counted in clock ticks (10 ms): this tiny model's rounds may read 0.
        self.assertGreaterEqual(r["long"]["cpu_s"], 0.0)
        self.assertIn("decode_tps_per_cpu_s", r)

    def test_request_body_and_counts(self):
        fake = FakeServer()
        try:
            r = serve_client.measure(fake.url, 4, prompt="p", short=5, long=9)
        finally:
            fake.close()
        self.assertEqual(len(fake.bodies), 8)
        for path, body in fake.bodies:
            self.assertEqual(path, "/v1/completions")
            self.assertEqual((body["prompt"], body["temperature"], body["stream"]), ("p", 0, False))
            self.assertIs(body["ignore_eos"], True)
            self.assertIs(body["cache_prompt"], False)
        self.assertEqual(sorted(b["max_tokens"] for _, b in fake.bodies), [5] * 4 + [9] * 4)
        self.assertEqual(r["decode_tokens"], 4 * (9 - 5))
        self.assertNotIn("decode_tps_per_cpu_s", r)  # no pid given

    def test_failed_request_raises(self):
        fake = FakeServer(fail=True)
        try:
            with self.assertRaisesRegex(RuntimeError, "2 of 2 requests failed"):
                serve_client.one_round(fake.url, 2, "p", 3)
        finally:
            fake.close()

    def test_cpu_seconds_matches_os_times(self):
        x = 0
        for i in range(2_000_000):  # some CPU time of our own
            x += i
        t = os.times()
        got = serve_client.cpu_seconds(os.getpid())
        # The same kernel counters (clock ticks), read a moment apart.
        self.assertAlmostEqual(got, t.user + t.system, delta=0.05)
        self.assertIsNone(serve_client.cpu_seconds(None))


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Stored contexts in `kvslim serve`: prefix reuse, multi-turn reuse, /v1/contexts, the memory tier's
limits, and the directory and Redis tiers shared by replicas.

The reference for every answer from a stored context is the uncached run with the same split: the
stored tokens compressed on their own, everything after them appended uncompressed (a request with
"question" and "cache_prompt": false)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import NGINX, NginxProc, ServerProc, free_port, post, request  # noqa: E402

DOC = ("Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
       "friends. One day she found a big red ball under a tree.")
PRESS = ["--press", "snapkv", "--compression-ratio", "0.5", "--chunk-size", "32"]
REDIS = shutil.which("redis-server")


def text(j):
    c = j["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def complete(port, **body):
    body.setdefault("max_tokens", 12)
    body.setdefault("temperature", 0)
    s, j = post(port, "/v1/completions", body)
    assert s == 200, j
    return j


class Reuse(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = ServerProc("--temp", 0, "-c", 512, "--parallel", 4, *PRESS)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def test_same_context_new_question(self):
        p = self.srv.port
        first = complete(p, prompt=DOC, question=" Lily said")
        self.assertEqual(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        before = self.srv.metrics()
        second = complete(p, prompt=DOC, question=" The ball was")
        n_doc = complete(p, prompt=DOC, max_tokens=1, cache_prompt=False)["usage"]["prompt_tokens"]
        reference = complete(p, prompt=DOC, question=" The ball was", cache_prompt=False)
        self.assertEqual(reference["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(second["usage"]["prompt_tokens"], reference["usage"]["prompt_tokens"])
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.assertEqual(cached, n_doc)
        self.assertEqual(text(second), text(reference))
        # The press acted on the stored context only: the figures are the context's.
        self.assertEqual(second["usage"]["entries_kept"], reference["usage"]["entries_kept"])
        after = self.srv.metrics()
        self.assertEqual(after["kvslim_context_prefill_tokens_saved_total"] - before["kvslim_context_prefill_tokens_saved_total"],
                         cached)
        self.assertEqual(after['kvslim_context_hits_total{tier="memory"}'] - before['kvslim_context_hits_total{tier="memory"}'],
                         1)

    def test_a_longer_prompt_is_not_split_at_a_stored_context(self):
        # Splitting would leave the extension uncompressed, which the request's press was not asked
        # to do: the longer prompt is compressed whole, as without stored contexts. Sent as the
        # question, the extension reuses the stored context.
        p = self.srv.port
        doc = DOC.replace("Lily", "Mia")
        n_doc = complete(p, prompt=doc, max_tokens=1)["usage"]["prompt_tokens"]  # stores doc
        longer = complete(p, prompt=doc + " Mia ran to the ball")
        self.assertEqual(longer["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(text(longer), text(complete(p, prompt=doc + " Mia ran to the ball", cache_prompt=False)))
        asked = complete(p, prompt=doc, question=" Mia ran to the ball")
        self.assertEqual(asked["usage"]["prompt_tokens_details"]["cached_tokens"], n_doc)
        self.assertEqual(text(asked), text(complete(p, prompt=doc, question=" Mia ran to the ball", cache_prompt=False)))

    def test_another_press_or_cache_type_is_not_reused(self):
        p = self.srv.port
        doc = DOC.replace("Lily", "Zoe")
        complete(p, prompt=doc, max_tokens=1)
        for other in ({"press": "knorm"}, {"compression_ratio": 0.25}, {"cache_type_k": "q8_0"}):
            j = complete(p, prompt=doc, **other)
            self.assertEqual(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0, other)

    def test_cache_prompt_false_neither_reads_nor_stores(self):
        p = self.srv.port
        doc = DOC.replace("Lily", "Ann")
        before = self.srv.metrics()["kvslim_context_stored_total"]
        complete(p, prompt=doc, cache_prompt=False)
        complete(p, prompt=doc, cache_prompt=False)
        self.assertEqual(self.srv.metrics()["kvslim_context_stored_total"], before)

    def test_concurrent_requests_build_once(self):
        p = self.srv.port
        doc = " ".join([DOC.replace("Lily", "Sue")] * 6)  # several chunks: the others arrive while it builds
        before = self.srv.metrics()["kvslim_context_stored_total"]
        with ThreadPoolExecutor(3) as ex:
            answers = list(ex.map(lambda q: complete(p, prompt=doc, question=q), [" Sue", " The", " Then"]))
        # One context stored (the document); the three answers stored no conversation (completions).
        self.assertEqual(self.srv.metrics()["kvslim_context_stored_total"] - before, 1)
        self.assertEqual(sorted(a["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for a in answers),
                         [False, True, True])
        for a, q in zip(answers, [" Sue", " The", " Then"]):
            self.assertEqual(text(a), text(complete(p, prompt=doc, question=q, cache_prompt=False)))


class MultiTurn(unittest.TestCase):
    def test_next_turn_prefills_only_its_message(self):
        # Without a press the stored conversation is the full cache: the next turn's answer must be
        # the one of the whole conversation prefilled from scratch.
        srv = ServerProc("--temp", 0, "-c", 512, "--chat-template", "chatml")
        try:
            p = srv.port
            turn1 = [{"role": "user", "content": "Tell me a story about a cat."}]
            s, a1 = post(p, "/v1/chat/completions", {"messages": turn1, "max_tokens": 12, "temperature": 0})
            self.assertEqual(s, 200, a1)
            n1 = a1["usage"]["prompt_tokens"]
            turn2 = turn1 + [{"role": "assistant", "content": text(a1)}, {"role": "user", "content": "And then?"}]
            s, a2 = post(p, "/v1/chat/completions", {"messages": turn2, "max_tokens": 12, "temperature": 0})
            self.assertEqual(s, 200, a2)
            cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"]
            self.assertGreater(cached, n1)  # the first answer's tokens too
            self.assertLess(cached, a2["usage"]["prompt_tokens"])
            s, cold = post(p, "/v1/chat/completions",
                           {"messages": turn2, "max_tokens": 12, "temperature": 0, "cache_prompt": False})
            self.assertEqual(text(a2), text(cold))
        finally:
            srv.close()


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvslim-ctx-")
        cls.srv = ServerProc("--temp", 0, "-c", 512, "--context-dir", cls.dir, "--chunk-size", "32")

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def build(self, **body):
        s, j = post(self.srv.port, "/v1/contexts", body)
        self.assertEqual(s, 200, j)
        return j

    def test_build_answer_get_delete(self):
        p = self.srv.port
        spec = {"press": "knorm", "compression_ratio": 0.5, "cache_type_k": "q8_0", "cache_type_v": "q8_0"}
        c = self.build(prompt=DOC, **spec)
        self.assertEqual(c["object"], "context")
        self.assertEqual(c["cache_type"], "k=q8_0 v=q8_0")
        self.assertTrue(c["press"].startswith("knorm"))
        self.assertLess(c["kv_bytes"], c["full_f16_bytes"] * 0.5)
        self.assertAlmostEqual(c["compression_ratio"], 1 - c["entries_kept"] / c["entries_total"])
        j = complete(p, context_id=c["id"], question=" She kicked")
        ref = complete(p, prompt=DOC, question=" She kicked", cache_prompt=False, **spec)
        self.assertEqual(text(j), text(ref))
        self.assertEqual(j["usage"]["prompt_tokens_details"]["cached_tokens"], c["tokens"])
        self.assertEqual(j["usage"]["prompt_tokens"], ref["usage"]["prompt_tokens"])
        # Building it again finds it.
        self.assertEqual(self.build(prompt=DOC, **spec)["tier"], "memory")
        s, g = request(p, "GET", f"/v1/contexts/{c['id']}")
        self.assertEqual((s, g["tokens"], g["kv_bytes"]), (200, c["tokens"], c["kv_bytes"]))
        s, lst = request(p, "GET", "/v1/contexts")
        self.assertIn(c["id"], [x["id"] for x in lst["data"]])
        s, d = request(p, "DELETE", f"/v1/contexts/{c['id']}")
        self.assertEqual((s, d["deleted"]), (200, True))
        for method, path in (("GET", f"/v1/contexts/{c['id']}"), ("DELETE", f"/v1/contexts/{c['id']}")):
            s, e = request(p, method, path)
            self.assertEqual((s, e["error"]["code"]), (404, "context_not_found"))
        s, e = post(p, "/v1/completions", {"context_id": c["id"], "question": " x"})
        self.assertEqual((s, e["error"]["param"]), (404, "context_id"))

    def test_refusals(self):
        p = self.srv.port
        s, e = post(p, "/v1/contexts", {"prompt": DOC, "press": "h2o", "compression_ratio": 0.5})
        self.assertEqual((s, e["error"]["param"]), (400, "press"))
        self.assertIn("cannot be stored", e["error"]["message"])
        s, e = post(p, "/v1/contexts", {"prompt": DOC, "question": " x"})
        self.assertEqual((s, e["error"]["param"]), (400, "question"))
        c = self.build(prompt=DOC)
        s, e = post(p, "/v1/completions", {"context_id": c["id"], "question": " x", "press": "knorm"})
        self.assertEqual((s, e["error"]["param"]), (400, "press"))
        s, e = post(p, f"/v1/contexts/{c['id']}/save", {"filename": "../escape.kvc"})
        self.assertEqual((s, e["error"]["param"]), (400, "filename"))
        s, e = post(p, "/v1/contexts/restore", {"filename": "absent.kvc"})
        self.assertEqual((s, e["error"]["code"]), (404, "context_not_found"))
        with open(os.path.join(self.dir, "junk.kvc"), "wb") as f:
            f.write(b"not a context")
        s, e = post(p, "/v1/contexts/restore", {"filename": "junk.kvc"})
        self.assertEqual((s, e["error"]["param"]), (400, "filename"))
        self.assertIn("not a kvslim context file", e["error"]["message"])

    def test_save_and_restore_by_name(self):
        p = self.srv.port
        c = self.build(prompt=DOC.replace("Lily", "Kim"), press="knorm", compression_ratio=0.5)
        s, sv = post(p, f"/v1/contexts/{c['id']}/save", {"filename": "kim.kvc"})
        self.assertEqual(s, 200, sv)
        self.assertEqual(sv["bytes"], os.path.getsize(os.path.join(self.dir, "kim.kvc")))
        before = complete(p, context_id=c["id"], question=" Kim")
        request(p, "DELETE", f"/v1/contexts/{c['id']}")
        s, r = post(p, "/v1/contexts/restore", {"filename": "kim.kvc"})
        self.assertEqual((s, r["id"]), (200, c["id"]))
        self.assertEqual(text(complete(p, context_id=r["id"], question=" Kim")), text(before))


class Memory(unittest.TestCase):
    def test_limit_and_kv_budget(self):
        # Each stored context of ~40 tokens (stories260K, f16) holds ~30 KB; the limit keeps two or three.
        srv = ServerProc("--temp", 0, "-c", 256, "--context-cache", "100000", "--kv-budget", "300000",
                         "--parallel", 1)
        try:
            p = srv.port
            for i in range(6):
                complete(p, prompt=DOC.replace("Lily", f"Girl{i}"), max_tokens=2)
            m = srv.metrics()
            self.assertLessEqual(m['kvslim_context_bytes{tier="memory"}'], 100000)
            self.assertGreater(m["kvslim_context_evictions_total"], 0)
            # A request needing most of the KV budget evicts stored contexts instead of waiting.
            j = complete(p, prompt=DOC, max_tokens=120)
            self.assertEqual(j["choices"][0]["finish_reason"] in ("length", "stop"), True)
            m2 = srv.metrics()
            self.assertGreater(m2["kvslim_context_evictions_total"], m["kvslim_context_evictions_total"])
        finally:
            srv.close()

    def test_memory_counted_is_memory_held(self):
        """Regression: the memory tier counted entries' bytes only, while a small stored context holds
        2.5 times that (whole key tiles, growth room, tables), so --context-cache let RSS grow far past
        it. Now what it counts is within 25% of the RSS the contexts take."""
        srv = ServerProc("-c", 256, "-t", 1)
        try:
            def rss_anon():
                with open(f"/proc/{srv.proc.pid}/status") as f:
                    return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
            complete(srv.port, prompt="warm up", max_tokens=2)
            r0, c0 = rss_anon(), srv.metrics()['kvslim_context_bytes{tier="memory"}']
            for i in range(800):
                complete(srv.port, prompt=f"Once upon a time number {i} there was a cat", max_tokens=1)
            grown = (rss_anon() - r0) * 1024
            counted = srv.metrics()['kvslim_context_bytes{tier="memory"}'] - c0
            self.assertEqual(srv.metrics()["kvslim_contexts_in_memory"], 801)
            self.assertGreater(counted, 0.75 * grown)
            self.assertLess(counted, 1.25 * grown)
        finally:
            srv.close()

    def test_requests_from_one_context_count_it_once(self):
        """Four requests answering from one stored context read its entries in place: each answer is
        the uncached run's, and while they run the shared entries count once in kv_bytes_in_use."""
        srv = ServerProc("--temp", 0, "-c", 512, "--parallel", 4)
        try:
            p = srv.port
            doc = " ".join([DOC] * 6)
            s, c = post(p, "/v1/contexts", {"prompt": doc})
            self.assertEqual(s, 200, c)
            questions = [" Lily said", " The ball was", " Her friends", " One day"]
            refs = [text(complete(p, prompt=doc, question=q, cache_prompt=False, max_tokens=40)) for q in questions]
            samples = []
            done = []

            def poll():
                while not done:
                    m = srv.metrics()
                    samples.append((m["kvslim_requests_processing"], m["kvslim_kv_bytes_shared"],
                                    m["kvslim_kv_bytes_in_use"]))

            with ThreadPoolExecutor(5) as ex:
                poller = ex.submit(poll)
                answers = list(ex.map(lambda q: complete(p, context_id=c["id"], question=q, max_tokens=40), questions))
                done.append(True)
                poller.result()
            self.assertEqual([text(a) for a in answers], refs)
            for a in answers:
                self.assertEqual(a["usage"]["prompt_tokens_details"]["cached_tokens"], c["tokens"])
                self.assertGreater(a["usage"]["kv_bytes_shared"], 0)
                self.assertLessEqual(a["usage"]["kv_bytes_shared"], c["kv_bytes"])
                self.assertGreater(a["usage"]["kv_bytes_final"], a["usage"]["kv_bytes_shared"])
            busy = [x for x in samples if x[0] >= 2 and x[1] > 0]
            for n, shared, in_use in busy:
                self.assertLessEqual(shared, c["kv_bytes"])  # once, however many requests read it
                self.assertLess(in_use, n * c["kv_bytes"])   # n copies would hold n times it
            m = srv.metrics()
            self.assertEqual((m["kvslim_kv_bytes_shared"], m["kvslim_kv_bytes_in_use"]), (0, 0))
        finally:
            srv.close()

    def test_off(self):
        srv = ServerProc("--temp", 0, "-c", 256, "--context-cache", "0")
        try:
            complete(srv.port, prompt=DOC)
            j = complete(srv.port, prompt=DOC)
            self.assertEqual(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            s, e = post(srv.port, "/v1/contexts", {"prompt": DOC})
            self.assertEqual(s, 400)
        finally:
            srv.close()


class RedisProc:
    def __init__(self, port=None):
        self.dir = tempfile.mkdtemp(prefix="kvslim-redis-")
        self.port = port or free_port()
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import socket
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def close(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Tiers(unittest.TestCase):
    def test_directory_shared_by_two_replicas(self):
        d = tempfile.mkdtemp(prefix="kvslim-ctxdir-")
        a = ServerProc("--temp", 0, "-c", 512, "--context-dir", d, *PRESS)
        b = ServerProc("--temp", 0, "-c", 512, "--context-dir", d, *PRESS)
        try:
            complete(a.port, prompt=DOC, question=" Lily")
            deadline = time.time() + 10
            while a.metrics()['kvslim_context_stores_total{tier="dir"}'] < 1 and time.time() < deadline:
                time.sleep(0.05)
            j = complete(b.port, prompt=DOC, question=" The ball")
            self.assertGreater(j["usage"]["prompt_tokens_details"]["cached_tokens"], 30)
            self.assertEqual(b.metrics()['kvslim_context_hits_total{tier="dir"}'], 1)
            ref = complete(b.port, prompt=DOC, question=" The ball", cache_prompt=False)
            self.assertEqual(text(j), text(ref))
        finally:
            a.close()
            b.close()
            shutil.rmtree(d, ignore_errors=True)

    @unittest.skipIf(REDIS is None or NGINX is None, "redis-server or nginx is not installed")
    def test_redis_behind_nginx_and_killed(self):
        redis = RedisProc()
        url = f"redis://127.0.0.1:{redis.port}"
        common = ("--temp", 0, "-c", 512, "--context-store", url, "--context-timeout", "0.5", *PRESS)
        a = ServerProc(*common)
        b = ServerProc(*common)
        nginx = None
        try:
            nginx = NginxProc(a.port, b.port)
            built = post(a.port, "/v1/contexts", {"prompt": DOC})[1]
            deadline = time.time() + 10
            while a.metrics()['kvslim_context_stores_total{tier="redis"}'] < 1 and time.time() < deadline:
                time.sleep(0.05)
            # Answered through the other replica without prefilling the document.
            j = complete(b.port, context_id=built["id"], question=" The ball")
            self.assertEqual(j["usage"]["prompt_tokens_details"]["cached_tokens"], built["tokens"])
            self.assertEqual(b.metrics()['kvslim_context_hits_total{tier="redis"}'], 1)
            ref = complete(a.port, prompt=DOC, question=" The ball", cache_prompt=False)
            self.assertEqual(text(j), text(ref))
            # Through nginx, with Redis killed: answers unchanged, errors counted, nothing hangs.
            redis.close()
            doc2 = DOC.replace("Lily", "Eve")
            expect = text(complete(a.port, prompt=doc2, question=" Eve", cache_prompt=False))
            with ThreadPoolExecutor(4) as ex:
                got = list(ex.map(lambda _: text(complete(nginx.port, prompt=doc2, question=" Eve")), range(8)))
            self.assertEqual(set(got), {expect})
            errors = sum(s.metrics()['kvslim_context_errors_total{tier="redis"}'] for s in (a, b))
            self.assertGreater(errors, 0)
        finally:
            if nginx:
                nginx.close()
            a.close()
            b.close()
            if redis.proc.poll() is None:
                redis.close()


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""`kvslim serve` over real HTTP on loopback (standard library client): every endpoint, streaming,
every bad request, identical greedy outputs for identical concurrent requests, no cross-talk,
cancellation, limits, the KV budget, and a bounded load test. Run one class per ctest test:
    KVSLIM=build/kvslim python3 tests/server/test_serve.py Endpoints"""
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import KVSLIM, MODEL, ServerProc, StreamCutShort, post, request, stream, stream_text  # noqa: E402

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."


def generate_cli(prompt, n, *extra):
    """Greedy continuation from `kvslim generate` (the CLI's own path), as an independent reference."""
    out = subprocess.run([KVSLIM, "generate", "-m", MODEL, "-p", prompt, "--temp", "0", "-n", str(n), *extra],
                         capture_output=True, text=True, check=True).stdout
    out = out.split("\n\n--- kvslim ---")[0]
    if out.endswith("\n"):  # generate ends its text with a newline
        out = out[:-1]
    return out[len(prompt):] if out.startswith(prompt) else out


class Endpoints(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = ServerProc("--parallel", 4, "--temp", 0, "-c", 256, "--chat-template", "chatml",
                             "--max-body", 4096, "--timeout", 60)
        cls.port = cls.srv.port

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def complete(self, **body):
        status, j = post(self.port, "/v1/completions", body)
        self.assertEqual(status, 200, j)
        return j

    def test_health(self):
        status, j = request(self.port, "GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(j["status"], "ok")
        self.assertEqual(j["slots_idle"] + j["slots_processing"], 4)

    def test_models(self):
        status, j = request(self.port, "GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(j["object"], "list")
        self.assertEqual([m["id"] for m in j["data"]], ["stories260K.gguf"])
        self.assertEqual(j["data"][0]["object"], "model")
        self.assertEqual(j["data"][0]["meta"]["n_ctx"], 256)
        self.assertEqual(j["data"][0]["meta"]["chat_template"], "chatml")

    def test_metrics(self):
        before = self.srv.metrics()
        self.complete(prompt="Once", max_tokens=5)
        # The engine counts a request before it hands out the response: the scrape right after sees it.
        after = self.srv.metrics()
        for name in ["kvslim_requests_finished_total", "kvslim_tokens_generated_total", "kvslim_kv_bytes_in_use",
                     "kvslim_kv_bytes_saved", "kvslim_requests_queued", "kvslim_prompt_tokens_per_second",
                     "kvslim_decode_tokens_per_second", "kvslim_kv_budget_bytes"]:
            self.assertIn(name, after)
        self.assertGreaterEqual(after["kvslim_requests_finished_total"], before["kvslim_requests_finished_total"] + 1)
        self.assertGreaterEqual(after["kvslim_tokens_generated_total"], before["kvslim_tokens_generated_total"] + 5)
        status, text = request(self.port, "GET", "/metrics", raw=True)
        self.assertIn("# TYPE kvslim_requests_finished_total counter", text)

    def test_completion_shape_and_usage(self):
        j = self.complete(prompt=STORY, max_tokens=8)
        self.assertEqual(j["object"], "text_completion")
        self.assertTrue(j["id"].startswith("cmpl-"))
        self.assertEqual(j["model"], "stories260K.gguf")
        c = j["choices"][0]
        self.assertEqual(c["index"], 0)
        self.assertEqual(c["finish_reason"], "length")
        self.assertIsInstance(c["text"], str)
        u = j["usage"]
        self.assertEqual(u["completion_tokens"], 8)
        self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 8)
        # stories260K: 5 layers x 4 KV heads; no press keeps every entry.
        self.assertEqual(u["entries_total"], u["prompt_tokens"] * 20)
        self.assertEqual(u["entries_kept"], u["entries_total"])
        self.assertEqual(u["compression_ratio"], 0.0)
        self.assertEqual(u["kv_bytes"], u["kv_full_f16_bytes"])

    def test_press_per_request_measured(self):
        long_prompt = " ".join([STORY] * 4)
        full = self.complete(prompt=long_prompt, max_tokens=1)["usage"]
        pressed = self.complete(prompt=long_prompt, max_tokens=1, press="knorm", compression_ratio=0.5)["usage"]
        n = pressed["prompt_tokens"]
        # The design's rule: each segment keeps floor(n * (1 - r)) entries.
        kept = (n * 1) // 2
        self.assertEqual(pressed["entries_kept"], kept * 20)
        self.assertAlmostEqual(pressed["compression_ratio"], 1 - kept / n, places=6)
        self.assertLess(pressed["kv_bytes"], full["kv_bytes"])
        self.assertTrue(pressed["press"].startswith("knorm"), pressed["press"])
        q8 = self.complete(prompt=long_prompt, max_tokens=1, cache_type_k="q8_0", cache_type_v="q8_0")["usage"]
        self.assertLess(q8["kv_bytes"], full["kv_bytes"])

    def test_request_compression_ratio_counts_decode_eviction(self):
        """The whole request's ratio, measured when it ended: a press that evicts while decoding
        removes more than its prefill compression did, and usage says so."""
        u = self.complete(prompt=" ".join([STORY] * 2), max_tokens=32, temperature=0,
                          press="threshold(knorm):tau=-4,window=8,decode=1")["usage"]
        run = u["prompt_tokens"] + u["completion_tokens"] - 1  # the last sampled token is never run
        self.assertEqual(u["entries_seen"], run * 20)
        self.assertAlmostEqual(u["request_compression_ratio"], 1 - u["entries_now"] / u["entries_seen"], places=12)
        self.assertGreater(u["request_compression_ratio"], u["compression_ratio"])
        full = self.complete(prompt=STORY, max_tokens=4)["usage"]
        self.assertEqual(full["request_compression_ratio"], 0.0)
        self.assertEqual(full["entries_now"], full["entries_seen"])

    def test_greedy_equals_generate_cli(self):
        j = self.complete(prompt=STORY, max_tokens=24, temperature=0)
        self.assertEqual(j["choices"][0]["text"], generate_cli(STORY, 24))

    def test_prompt_as_tokens(self):
        j = self.complete(prompt=[1, 400, 300, 500], max_tokens=6)
        self.assertEqual(j["usage"]["prompt_tokens"], 4)
        self.assertEqual(j["usage"]["completion_tokens"], 6)

    def test_token_ids_outside_the_vocabulary(self):
        """Regression: ids were narrowed to 32 bits, so 2^32 + 5 was served as token 5 and 2^63 as 0."""
        for ids, index, bad in (([1, 4294967301], 1, 4294967301), ([9223372036854775808], 0, 9223372036854775808),
                                ([1, 2, 18446744073709551615], 2, 18446744073709551615), ([5, -1], 1, -1),
                                ([1, 512], 1, 512)):  # stories260K's vocabulary has 512 tokens
            with self.subTest(ids=ids):
                status, j = post(self.port, "/v1/completions", {"prompt": ids, "max_tokens": 2})
                self.assertEqual(status, 400, j)
                self.assertEqual(j["error"]["param"], "prompt")
                self.assertEqual(j["error"]["message"],
                                 f"prompt[{index}]: token id {bad} is outside the vocabulary 0..511")
        self.complete(prompt=[1, 511], max_tokens=2)

    def test_stop_string(self):
        text = self.complete(prompt=STORY, max_tokens=32)["choices"][0]["text"]
        stop = text[10:14]
        j = self.complete(prompt=STORY, max_tokens=32, stop=[stop, "zzzz"])
        self.assertEqual(j["choices"][0]["text"], text[:text.find(stop)])
        self.assertEqual(j["choices"][0]["finish_reason"], "stop")
        status, events, done = stream(self.port, "/v1/completions", {"prompt": STORY, "max_tokens": 32, "stop": stop})
        self.assertTrue(done)
        self.assertEqual(stream_text(events, False), text[:text.find(stop)])

    def test_max_tokens_zero(self):
        j = self.complete(prompt=STORY, max_tokens=0)
        self.assertEqual(j["choices"][0]["text"], "")
        self.assertEqual(j["choices"][0]["finish_reason"], "length")
        self.assertEqual(j["usage"]["completion_tokens"], 0)

    def test_completion_stream(self):
        body = {"prompt": STORY, "max_tokens": 20}
        whole = self.complete(**body)["choices"][0]["text"]
        status, events, done = stream(self.port, "/v1/completions", dict(body, stream_options={"include_usage": True}))
        self.assertEqual(status, 200)
        self.assertTrue(done)
        self.assertEqual(stream_text(events, False), whole)
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
        self.assertEqual(events[-1]["choices"], [])
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 20)
        for e in events[:-2]:
            self.assertIsNone(e["choices"][0]["finish_reason"])

    def test_chat(self):
        body = {"messages": [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon"}],
                "max_tokens": 16}
        status, j = post(self.port, "/v1/chat/completions", body)
        self.assertEqual(status, 200, j)
        self.assertEqual(j["object"], "chat.completion")
        self.assertEqual(j["choices"][0]["message"]["role"], "assistant")
        whole = j["choices"][0]["message"]["content"]
        # The prompt is the ChatML text: the bundled vocabulary spells its markers as plain text.
        status, ref = post(self.port, "/v1/completions",
                           {"prompt": "<|im_start|>system\nTell a story.<|im_end|>\n<|im_start|>user\nOnce upon"
                                      "<|im_end|>\n<|im_start|>assistant\n", "max_tokens": 16})
        self.assertEqual(ref["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"])
        self.assertEqual(ref["choices"][0]["text"], whole)
        status, events, done = stream(self.port, "/v1/chat/completions", body)
        self.assertTrue(done)
        self.assertEqual(events[0]["object"], "chat.completion.chunk")
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(stream_text(events, True), whole)
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "length")
        self.assertEqual(events[-1]["choices"][0]["delta"], {})
        # max_completion_tokens (OpenAI's newer name) wins over the deprecated max_tokens when both
        # are sent (it was the other way round).
        status, j = post(self.port, "/v1/chat/completions", dict(body, max_completion_tokens=5))
        self.assertEqual(status, 200, j)
        self.assertEqual(j["usage"]["completion_tokens"], 5)

    def test_generate_chat_uses_the_same_template(self):
        status, j = post(self.port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Once upon"}], "max_tokens": 12})
        self.assertEqual(status, 200, j)
        self.assertEqual(generate_cli("Once upon", 12, "--chat-template", "chatml"),
                         j["choices"][0]["message"]["content"])
        # llama.cpp's -cnv is --chat.
        self.assertEqual(generate_cli("Once upon", 12, "-cnv", "--chat-template", "chatml"),
                         j["choices"][0]["message"]["content"])

    def test_bad_requests(self):
        cases = [
            ("/v1/completions", "not json{", None),
            ("/v1/completions", "[1, 2]", None),
            ("/v1/completions", {}, "prompt"),
            ("/v1/completions", {"prompt": ""}, "prompt"),
            ("/v1/completions", {"prompt": 5}, "prompt"),
            ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
            ("/v1/completions", {"prompt": [999999]}, "prompt"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "max_tokens": 100000}, "max_tokens"),
            ("/v1/completions", {"prompt": "hi", "temperature": 3}, "temperature"),
            ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, "temperature"),
            ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p"),
            ("/v1/completions", {"prompt": "hi", "top_k": -3}, "top_k"),
            ("/v1/completions", {"prompt": "hi", "n": 2}, "n"),
            ("/v1/completions", {"prompt": "hi", "stream": "yes"}, "stream"),
            ("/v1/completions", {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
            ("/v1/completions", {"prompt": "hi", "stop": 7}, "stop"),
            ("/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
            ("/v1/completions", {"prompt": "hi", "press": "nosuchpress"}, "press"),
            ("/v1/completions", {"prompt": "hi", "press": "snapkv:window=x"}, "press"),
            ("/v1/completions", {"prompt": "hi", "press": 3}, "press"),
            ("/v1/completions", {"prompt": "hi", "press": "snapkv", "compression_ratio": 1.5}, "compression_ratio"),
            ("/v1/completions", {"prompt": "hi", "compression_ratio": "half"}, "compression_ratio"),
            ("/v1/completions", {"prompt": "hi", "cache_type_k": "q3_x"}, "cache_type_k"),
            ("/v1/completions", {"prompt": "hi", "cache_type_v": 8}, "cache_type_v"),
            ("/v1/completions", {"prompt": "word " * 400}, "prompt"),
            ("/v1/chat/completions", {}, "messages"),
            ("/v1/chat/completions", {"messages": []}, "messages"),
            ("/v1/chat/completions", {"messages": "hi"}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
            ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "messages[0].content[0].type"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "question": "q"}, "question"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
        ]
        for path, body, param in cases:
            with self.subTest(body=body):
                status, j = post(self.port, path, body)
                self.assertEqual(status, 400, j)
                self.assertIn("error", j)
                self.assertEqual(j["error"]["type"], "invalid_request_error")
                self.assertEqual(j["error"]["param"], param, j)
                self.assertTrue(j["error"]["message"])
                if param:
                    self.assertIn(param.split("[")[0], j["error"]["message"])
        status, j = post(self.port, "/v1/completions", {"prompt": "word " * 400})
        self.assertEqual(j["error"]["code"], "context_length_exceeded")
        status, j = request(self.port, "GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("/v1/nothing", j["error"]["message"])
        status, j = post(self.port, "/v1/completions", {"prompt": "x" * 5000})
        self.assertEqual(status, 413)
        self.assertIn("4096", j["error"]["message"])
        # Still up and serving.
        self.complete(prompt="Once", max_tokens=2)

    def test_identical_concurrent_greedy(self):
        body = {"prompt": STORY, "max_tokens": 24}
        solo = self.complete(**body)["choices"][0]["text"]
        with ThreadPoolExecutor(8) as ex:
            results = list(ex.map(lambda _: post(self.port, "/v1/completions", body), range(8)))
        for status, j in results:
            self.assertEqual(status, 200, j)
            self.assertEqual(j["choices"][0]["text"], solo)

    def test_no_cross_talk(self):
        prompts = ["Once upon a time", "The cat sat", "Tom had a red ball", "It was a sunny day",
                   "Lily and Ben went", "The dog ran to", "Mom said to", "In the big forest"]
        solo = [self.complete(prompt=p, max_tokens=16, press="knorm" if i % 2 else "none",
                              compression_ratio=0.3)["choices"][0]["text"] for i, p in enumerate(prompts)]

        def one(i):
            if i % 3 == 0:
                s, ev, done = stream(self.port, "/v1/completions", {"prompt": prompts[i], "max_tokens": 16,
                                                                   "press": "knorm" if i % 2 else "none",
                                                                   "compression_ratio": 0.3})
                return stream_text(ev, False)
            s, j = post(self.port, "/v1/completions", {"prompt": prompts[i], "max_tokens": 16,
                                                       "press": "knorm" if i % 2 else "none", "compression_ratio": 0.3})
            return j["choices"][0]["text"]

        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(one, range(len(prompts))))
        self.assertEqual(got, solo)
        self.assertGreater(len(set(solo)), 4)  # the prompts do lead to different texts

    def test_cancel_on_disconnect(self):
        before = self.srv.metrics()["kvslim_requests_cancelled_total"]
        status, events, done = stream(self.port, "/v1/completions", {"prompt": STORY, "max_tokens": 200,
                                                                    "temperature": 1.0, "seed": 1},
                                      stop_after=1)
        self.assertEqual(status, 200)
        self.assertFalse(done)
        deadline = time.time() + 20
        while time.time() < deadline:
            m = self.srv.metrics()
            if m["kvslim_requests_cancelled_total"] >= before + 1 or m["kvslim_requests_processing"] == 0:
                break
            time.sleep(0.05)
        # Either cancelled, or it had already finished all 200 tokens before the socket closed.
        m = self.srv.metrics()
        self.assertEqual(m["kvslim_requests_processing"], 0)
        self.complete(prompt="Once", max_tokens=2)


class ChatJinja(unittest.TestCase):
    """A template of no family kvslim renders itself (Gemma's turn markers), from --chat-template-file,
    rendered by the Jinja engine; expected prompt text derived by hand from the template."""
    TEMPLATE = ("{{ bos_token }}{% for m in messages %}"
                "{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
                "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix=f"kvslim_jinja_{os.getpid()}_")
        cls.path = os.path.join(cls.dir, "turns.jinja")
        with open(cls.path, "w") as f:
            f.write(cls.TEMPLATE)
        cls.srv = ServerProc("--temp", 0, "-c", 256, "--chat-template-file", cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_rendered_by_jinja(self):
        body = {"messages": [{"role": "user", "content": " Once upon "}, {"role": "assistant", "content": "a time"},
                             {"role": "user", "content": "go on"}], "max_tokens": 12}
        status, j = post(self.srv.port, "/v1/chat/completions", body)
        self.assertEqual(status, 200, j)
        # The BOS text leads the rendering and becomes the BOS token (the completion adds its own).
        text = ("<start_of_turn>user\nOnce upon<end_of_turn>\n<start_of_turn>model\na time<end_of_turn>\n"
                "<start_of_turn>user\ngo on<end_of_turn>\n<start_of_turn>model\n")
        status, ref = post(self.srv.port, "/v1/completions", {"prompt": text, "max_tokens": 12})
        self.assertEqual(status, 200, ref)
        self.assertEqual(ref["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"])
        self.assertEqual(ref["choices"][0]["text"], j["choices"][0]["message"]["content"])
        # The CLI reads the same file the same way.
        status, one = post(self.srv.port, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": " Once upon "}], "max_tokens": 12})
        self.assertEqual(status, 200, one)
        by_file = generate_cli(" Once upon ", 12, "--chat-template-file", self.path)
        by_text = generate_cli("<start_of_turn>user\nOnce upon<end_of_turn>\n<start_of_turn>model\n", 12)
        self.assertEqual(by_file, by_text)
        self.assertEqual(by_file, one["choices"][0]["message"]["content"])

    def test_template_error_is_400(self):
        status, j = post(self.srv.port, "/v1/chat/completions",
                         {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                          "max_tokens": 2})
        self.assertEqual(status, 400, j)
        self.assertIn("System role not supported", j["error"]["message"])
        self.assertEqual(j["error"]["param"], "messages")


class Limits(unittest.TestCase):
    def test_api_key(self):
        srv = ServerProc("--api-key", "sekret", "--temp", 0, "-np", 2)  # llama-server's -np
        try:
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
            self.assertEqual(status, 401)
            self.assertEqual(j["error"]["type"], "authentication_error")
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2},
                             headers={"Authorization": "Bearer wrong"})
            self.assertEqual(status, 401)
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2},
                             headers={"Authorization": "Bearer sekret"})
            self.assertEqual(status, 200, j)
            self.assertEqual(request(srv.port, "GET", "/health")[0], 200)
        finally:
            srv.close()

    def test_request_errors_are_4xx_and_the_server_stays_up(self):
        """Regressions: a Q-filters file of another model killed the server (std::terminate from a pool
        worker at -t 2); chat on a model without a chat template answered 500 with a hint that did not
        work (it now gets ChatML, as from llama-server); compression_ratio without a press answered 200
        and removed nothing."""
        tmp = tempfile.mkdtemp(prefix=f"kvslim_qf_{os.getpid()}_")
        qf = os.path.join(tmp, "other.gguf")
        subprocess.run([KVSLIM, "qfilter-calibrate", "-m", os.path.join(os.path.dirname(MODEL), "retrieval.gguf"),
                        "-f", os.path.join(os.path.dirname(MODEL), "story.txt"), "-o", qf],
                       capture_output=True, check=True)
        srv = ServerProc("--temp", 0, "-c", 256, "-t", 2,  # stories260K has no tokenizer.chat_template
                         "--press-files-dir", tmp)
        try:
            for name in (qf, "other.gguf"):  # absolute, or relative to --press-files-dir
                status, j = post(srv.port, "/v1/completions",
                                 {"prompt": STORY, "max_tokens": 2, "press": "qfilter:filters=" + name,
                                  "compression_ratio": 0.5})
                self.assertEqual(status, 400, j)
                self.assertIn("do not fit the model", j["error"]["message"])
            # Regression: a request could make the server open any path.
            for name in ("/etc/passwd", "../" + os.path.basename(tmp) + "/../x.gguf", "/nonexistent/y.gguf"):
                status, j = post(srv.port, "/v1/completions",
                                 {"prompt": STORY, "max_tokens": 2, "press": "qfilter:filters=" + name})
                self.assertEqual(status, 400, j)
                self.assertIn("not under the press files directory", j["error"]["message"])
            os.symlink("/etc/passwd", os.path.join(tmp, "link.gguf"))
            status, j = post(srv.port, "/v1/completions",
                             {"prompt": STORY, "max_tokens": 2, "press": "qfilter:filters=link.gguf"})
            self.assertEqual(status, 400, j)
            self.assertIn("not under the press files directory", j["error"]["message"])
            # A model without a chat template gets ChatML (llama-server's fallback), with a warning at start.
            status, j = post(srv.port, "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            self.assertEqual(status, 200, j)
            self.assertEqual(j["usage"]["completion_tokens"], 2)
            self.assertEqual(generate_cli("Hi", 2, "--chat-template", "chatml"), j["choices"][0]["message"]["content"])
            warning = [line for line in srv.log if line.startswith("warning:")]
            self.assertEqual(len(warning), 1, srv.log)
            self.assertIn("no tokenizer.chat_template", warning[0])
            self.assertIn("ChatML", warning[0])
            status, j = request(srv.port, "GET", "/v1/models")
            self.assertEqual(j["data"][0]["meta"]["chat_template"], "chatml")
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2, "compression_ratio": 0.9})
            self.assertEqual(status, 400, j)
            self.assertEqual(j["error"]["param"], "compression_ratio")
            self.assertIn("press", j["error"]["message"])
            # A press that keeps by its own parameters does not take a ratio (it was silently unused).
            status, j = post(srv.port, "/v1/completions",
                             {"prompt": "Once", "max_tokens": 2, "press": "think", "compression_ratio": 0.5})
            self.assertEqual(status, 400, j)
            self.assertEqual(j["error"]["param"], "compression_ratio")
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
            self.assertEqual(status, 200, j)
            self.assertIsNone(srv.proc.poll())
        finally:
            srv.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_press_file_that_is_not_a_regular_file(self):
        """Regression: a FIFO in --press-files-dir blocked its request forever (open waited for a writer)."""
        tmp = tempfile.mkdtemp(prefix=f"kvslim_fifo_{os.getpid()}_")
        os.mkfifo(os.path.join(tmp, "filters.gguf"))
        os.mkdir(os.path.join(tmp, "adir.gguf"))
        srv = ServerProc("--temp", 0, "-c", 256, "--press-files-dir", tmp)
        try:
            for name in ("filters.gguf", "adir.gguf"):
                status, j = post(srv.port, "/v1/completions",
                                 {"prompt": STORY, "max_tokens": 2, "press": "qfilter:filters=" + name}, timeout=10)
                self.assertEqual(status, 400, j)
                self.assertEqual(j["error"]["param"], "press")
                self.assertIn(f"filters={os.path.join(os.path.realpath(tmp), name)}: not a regular file",
                              j["error"]["message"])
            self.assertEqual(post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})[0], 200)
        finally:
            srv.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_requests_name_no_press_file_without_press_files_dir(self):
        srv = ServerProc("--temp", 0, "-c", 256)
        try:
            status, j = post(srv.port, "/v1/completions",
                             {"prompt": STORY, "max_tokens": 2, "press": "qfilter:filters=/etc/passwd"})
            self.assertEqual(status, 400, j)
            self.assertIn("--press-files-dir", j["error"]["message"])
            self.assertEqual(j["error"]["param"], "press")
        finally:
            srv.close()

    def test_kv_budget(self):
        # stories260K: 20 segments x 36 B per f16 entry = 720 B per token; 0.05 MiB holds ~72 tokens.
        # A request reserves its peak: what the press kept so far plus one uncompressed chunk.
        # --kv-budget is a SIZE, read as generate's (a unit; a bare number is bytes).
        srv = ServerProc("--kv-budget", "0.05MiB", "--temp", 0, "-c", 512, "--chunk-size", 16)
        try:
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 300})
            self.assertEqual(status, 503, j)
            self.assertEqual(j["error"]["code"], "kv_budget_exceeded")
            self.assertIn("budget", j["error"]["message"])
            # A press cannot lower the peak of a prompt that fits one chunk: the message says when it can.
            self.assertIn("prompts longer than the server's --chunk-size, 16 tokens", j["error"]["message"])
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8})
            self.assertEqual(status, 200, j)
            # The same long request fits once a press shrinks what it keeps.
            long_prompt = " ".join([STORY] * 3)
            status, j = post(srv.port, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
            self.assertEqual(status, 503, j)
            status, j = post(srv.port, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4,
                                                           "press": "knorm", "compression_ratio": 0.75})
            self.assertEqual(status, 200, j)
            self.assertEqual(srv.metrics()["kvslim_kv_budget_bytes"], 52428)  # floor(0.05 x 2^20)
        finally:
            srv.close()

    def test_queue_full(self):
        srv = ServerProc("--parallel", 1, "--queue", 0, "-c", 512, "--temp", 0)
        try:
            results = []

            def long_one():
                results.append(post(srv.port, "/v1/completions", {"prompt": STORY, "max_tokens": 400}))

            t = threading.Thread(target=long_one)
            t.start()
            deadline = time.time() + 20
            while srv.metrics()["kvslim_requests_processing"] == 0 and time.time() < deadline and t.is_alive():
                time.sleep(0.001)
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
            t.join()
            self.assertEqual(results[0][0], 200)
            if status == 503:
                self.assertEqual(j["error"]["code"], "queue_full")
            else:  # the long request finished before this one arrived (a very fast machine)
                self.assertEqual(status, 200)
            self.assertGreaterEqual(srv.metrics().get('kvslim_requests_rejected_total{status="503",reason="queue_full"}', 0),
                                    1 if status == 503 else 0)
        finally:
            srv.close()


def raw_exchange(port, data, timeout=5.0):
    """Sends bytes on a new connection and returns everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


class Reliability(unittest.TestCase):
    """Slow and half-sent requests, the request size limit, start-up and shutdown as a load
    balancer sees them, and refusals counted by reason."""

    def test_half_sent_requests_do_not_starve_the_server(self):
        # Regression: ~80 connections that sent half a header held every HTTP worker for the 30 s
        # read timeout, and /health went unanswered.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 1200:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        srv = ServerProc("--parallel", 2, "--queue", 4, "-c", 256, "--temp", 0)
        held = []
        try:
            for i in range(500):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                if i % 2:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")  # half a header
                else:  # a whole header and half its body
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 40\r\n\r\n{\"prompt\": \"Once")
                held.append(s)
            t0 = time.time()
            status, j = request(srv.port, "GET", "/health", timeout=1.0)
            self.assertEqual(status, 200, j)
            self.assertLess(time.time() - t0, 1.0)
            status, j = post(srv.port, "/v1/completions", {"prompt": STORY, "max_tokens": 8}, timeout=5)
            self.assertEqual(status, 200, j)
            self.assertEqual(j["usage"]["completion_tokens"], 8)
            s, events, done = stream(srv.port, "/v1/completions", {"prompt": STORY, "max_tokens": 8}, timeout=5)
            self.assertEqual((s, done), (200, True))
            # None of the half-sent requests reached a handler.
            self.assertEqual(srv.metrics()["kvslim_requests_finished_total"], 2)
        finally:
            for s in held:
                s.close()
            srv.close()

    def test_header_and_body_timeouts(self):
        srv = ServerProc("-c", 256, "--header-timeout", 0.5, "--body-timeout", 0.5)
        try:
            t0 = time.time()
            out = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n")
            self.assertTrue(out.startswith(b"HTTP/1.1 408 "), out)
            self.assertIn(b"--header-timeout", out)
            self.assertLess(time.time() - t0, 3)
            out = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{")
            self.assertTrue(out.startswith(b"HTTP/1.1 408 "), out)
            self.assertIn(b"--body-timeout", out)
            # An idle connection is closed without a response.
            self.assertEqual(raw_exchange(srv.port, b""), b"")
            # Keep-alive: two requests on one connection, the second after the first's response.
            out = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                         b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            self.assertEqual(out.count(b"HTTP/1.1 200 OK"), 2, out)
            m = srv.metrics()
            self.assertEqual(m['kvslim_requests_rejected_total{status="408",reason="header_timeout"}'], 1)
            self.assertEqual(m['kvslim_requests_rejected_total{status="408",reason="body_timeout"}'], 1)
        finally:
            srv.close()

    def test_oversized_content_length_refused_before_the_body(self):
        # Regression: a Content-Length of 10^12 held a worker for 35 s before its 413.
        srv = ServerProc("-c", 256, "--max-body", 4096)
        try:
            t0 = time.time()
            out = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                         b"Content-Length: 1000000000000\r\n\r\n{\"prompt\": ")
            self.assertLess(time.time() - t0, 1.0)
            head, _, body = out.partition(b"\r\n\r\n")
            self.assertTrue(head.startswith(b"HTTP/1.1 413 "), out)
            j = json.loads(body)
            self.assertIn("1000000000000", j["error"]["message"])
            self.assertIn("4096", j["error"]["message"])
            out = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12x\r\n\r\n")
            self.assertTrue(out.startswith(b"HTTP/1.1 400 "), out)
            # A chunked body would be read by a worker a chunk at a time: refused, naming Content-Length.
            out = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                                         b"\r\n\r\n5\r\n{\"pro")
            self.assertTrue(out.startswith(b"HTTP/1.1 411 "), out)
            self.assertIn(b"Content-Length", out)
            self.assertEqual(post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})[0], 200)
        finally:
            srv.close()

    def test_health_is_503_until_the_model_is_loaded(self):
        srv = ServerProc("-c", 256, "--temp", 0, env={"KVSLIM_TEST_LOAD_DELAY_MS": "3000"}, ready=False)
        try:
            status, j = request(srv.port, "GET", "/health", timeout=2)
            self.assertEqual((status, j), (503, {"status": "loading"}))
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2}, timeout=2)
            self.assertEqual(status, 503, j)
            self.assertEqual(j["error"]["code"], "model_loading")
            deadline = time.time() + 30
            while request(srv.port, "GET", "/health", timeout=2)[0] != 200:
                self.assertLess(time.time(), deadline)
                time.sleep(0.05)
            status, j = post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})
            self.assertEqual(status, 200, j)
            self.assertEqual(srv.close(), 0)
        finally:
            srv.close()

    def test_sigterm_drains_running_requests(self):
        srv = ServerProc("--parallel", 2, "-c", 512, "--temp", 0, "--drain-timeout", 60)
        try:
            body = {"prompt": STORY, "max_tokens": 400, "temperature": 1.0, "seed": 3}
            # The whole answers, from the server before any shutdown, to compare against.
            want = post(srv.port, "/v1/completions", body)[1]["choices"][0]["text"]
            results = {}
            t1 = threading.Thread(target=lambda: results.update(plain=post(srv.port, "/v1/completions", body)))
            t2 = threading.Thread(target=lambda: results.update(streamed=stream(srv.port, "/v1/completions", body)))
            t1.start()
            t2.start()
            deadline = time.time() + 20
            while srv.metrics()["kvslim_requests_processing"] < 2 and time.time() < deadline:
                time.sleep(0.002)
            srv.proc.send_signal(signal.SIGTERM)
            t1.join()
            t2.join()
            self.assertEqual(srv.proc.wait(timeout=30), 0)
            status, j = results["plain"]
            self.assertEqual(status, 200, j)
            self.assertEqual(j["choices"][0]["text"], want)
            status, events, done = results["streamed"]  # stream() checked its finish_reason and [DONE]
            self.assertEqual(stream_text(events, False), want)
            with self.assertRaises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", srv.port), timeout=2)
            srv.close()
            self.assertIn("kvslim serve: stopped\n", srv.log)
            # Both were still running when the signal came (each takes a few hundred ms); the count may
            # also hold the last /metrics poll, answered but not yet handed back by its worker.
            drained = [int(m.group(1)) for m in map(lambda l: re.match(r"kvslim serve: draining (\d+) requests", l),
                                                    srv.log) if m]
            self.assertEqual(len(drained), 1, srv.log)
            self.assertGreaterEqual(drained[0], 2, srv.log)
        finally:
            srv.close()

    def test_drain_timeout_ends_what_is_left_with_503(self):
        srv = ServerProc("--parallel", 1, "--queue", 16, "-c", 512, "--temp", 0, "--drain-timeout", 0.2)
        try:
            body = {"prompt": STORY, "max_tokens": 400}
            with ThreadPoolExecutor(8) as ex:
                futures = [ex.submit(post, srv.port, "/v1/completions", body) for _ in range(8)]
                deadline = time.time() + 20
                while time.time() < deadline:  # all 8 in: 1 running, 7 queued (~0.25 s each)
                    m = srv.metrics()
                    if m["kvslim_requests_queued"] + m["kvslim_requests_processing"] == 8:
                        break
                    time.sleep(0.002)
                srv.proc.send_signal(signal.SIGTERM)
                answers = [f.result() for f in futures]
            self.assertEqual(srv.proc.wait(timeout=30), 0)
            cut = [j for status, j in answers if status == 503]
            self.assertTrue(cut, answers)
            for j in cut:
                self.assertEqual(j["error"]["code"], "shutting_down")
            for status, j in answers:
                self.assertIn(status, (200, 503), j)
        finally:
            srv.close()

    def test_refusals_counted_by_reason(self):
        srv = ServerProc("-c", 256, "--parallel", 1, "--queue", 0)
        try:
            self.assertEqual(post(srv.port, "/v1/completions", {"prompt": "hi", "max_tokens": -1})[0], 400)
            self.assertEqual(post(srv.port, "/v1/completions", {"prompt": [1, 4294967301]})[0], 400)
            self.assertEqual(post(srv.port, "/v1/completions", {"prompt": [1, 4294967301]})[0], 400)
            self.assertEqual(post(srv.port, "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})[0], 400)
            self.assertEqual(request(srv.port, "GET", "/nothing")[0], 404)
            m = srv.metrics()
            self.assertEqual(m['kvslim_requests_rejected_total{status="400",reason="max_tokens"}'], 1)
            self.assertEqual(m['kvslim_requests_rejected_total{status="400",reason="prompt"}'], 2)
            self.assertEqual(m['kvslim_requests_rejected_total{status="400",reason="messages[].content"}'], 1)
            self.assertEqual(m['kvslim_requests_rejected_total{status="404",reason="endpoint"}'], 1)
            self.assertEqual(m["kvslim_requests_failed_total"], 0)
        finally:
            srv.close()


class Load(unittest.TestCase):
    def test_100_concurrent(self):
        srv = ServerProc("--parallel", 8, "--queue", 128, "-c", 256, "--temp", 0)
        try:
            post(srv.port, "/v1/completions", {"prompt": "Once", "max_tokens": 4})
            idle = srv.rss_kib()
            prompts = [f"{STORY} Number {i}." for i in range(100)]

            def one(i):
                body = {"prompt": prompts[i], "max_tokens": 24 + i % 9,
                        "press": ["none", "knorm", "snapkv", "streaming_llm"][i % 4], "compression_ratio": 0.5}
                if i % 5 == 0:
                    s, ev, done = stream(srv.port, "/v1/completions", body)
                    return s if done else -1
                return post(srv.port, "/v1/completions", body)[0]

            with ThreadPoolExecutor(100) as ex:
                statuses = list(ex.map(one, range(100)))
            self.assertEqual(statuses, [200] * 100)
            m = srv.metrics()
            self.assertGreaterEqual(m["kvslim_requests_finished_total"], 101)
            self.assertEqual(m["kvslim_requests_failed_total"], 0)
            self.assertEqual(m["kvslim_kv_bytes_in_use"], 0)
            self.assertEqual(m["kvslim_kv_bytes_reserved"], 0)
            after = srv.rss_kib()
            # Caches are freed when a request ends: RSS returns near its idle level.
            self.assertLess(after, idle + 32 * 1024, (idle, after))
        finally:
            self.assertEqual(srv.close(), 0)


if __name__ == "__main__":
    unittest.main()

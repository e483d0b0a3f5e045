#!/usr/bin/env python3
"""bench/bench_compare.py (kvslim bench against llama-bench, alternating, with the speed
targets): against the real kvslim on the bundled stories260K model and a stand-in llama-bench
(a script written here that prints fixed rates in llama-bench's JSON and its --progress lines,
sleeping between the depth run and the generation run), so every expected value below is known
from the stand-in's settings or from kvslim's own JSON. Standard library only.
    KVSLIM=build/kvslim python3 tests/bench/test_bench_compare.py"""
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import bench_compare  # noqa: E402

KVSLIM = os.environ.get("KVSLIM", os.path.join(SRC, "build", "kvslim"))
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
DRIVER = os.path.join(SRC, "bench", "bench_compare.py")

# The stand-in: t/s by test kind and -fa value; appends "<monotonic time> <args>" to $STUB_LOG.
STUB = r'''#!/usr/bin/env python3
import json, os, sys, time
a = sys.argv[1:]
def val(flag, default):
    return a[a.index(flag) + 1] if flag in a else default
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(f"{time.monotonic()} {' '.join(a)}\n")
if os.environ.get("STUB_FAIL"):
    sys.exit(3)
p, n, d = int(val("-p", "512")), int(val("-n", "128")), int(val("-d", "0"))
rows = []
for fa in val("-fa", "0").split(","):
    if d > 0:
        sys.stderr.write("llama-bench: benchmark 1/1: depth run 1/1\n"); sys.stderr.flush()
        time.sleep(float(os.environ.get("STUB_FILL_S", "0")))
    if p > 0:
        rows.append({"n_prompt": p, "n_gen": 0, "n_depth": d, "flash_attn": int(fa),
                     "avg_ts": float(os.environ["STUB_PP_TS"]) * (1.5 if fa == "1" else 1.0)})
    if n > 0:
        sys.stderr.write("llama-bench: benchmark 1/1: generation run 1/1\n"); sys.stderr.flush()
        rows.append({"n_prompt": 0, "n_gen": n, "n_depth": d, "flash_attn": int(fa),
                     "avg_ts": float(os.environ["STUB_TG_TS"]) * (2.0 if fa == "1" else 1.0)})
print(json.dumps(rows))
'''


class BenchCompare(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="bench_compare_")
        self.stub = os.path.join(self.dir, "llama-bench")
        with open(self.stub, "w") as f:
            f.write(STUB)
        os.chmod(self.stub, os.stat(self.stub).st_mode | stat.S_IXUSR)
        self.log = os.path.join(self.dir, "stub.log")
        self.env = dict(os.environ, STUB_LOG=self.log, STUB_PP_TS="1000", STUB_TG_TS="100")

    def drive(self, *extra, env=None):
        cmd = [sys.executable, DRIVER, "--kvslim", KVSLIM, "--llama-bench", self.stub, "--q8_0", MODEL,
               "--out", os.path.join(self.dir, "out"), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env=env or self.env, timeout=300)

    def records(self):
        with open(os.path.join(self.dir, "out", "results.json")) as f:
            return json.load(f)["records"]

    def test_short_group_ratios_and_order(self):
        r = self.drive("--groups", "short", "--rounds", "2", "--reps", "1", "--prompt", "32", "--short-depth", "32",
                       "--n-gen", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = self.records()
        self.assertEqual([(x["test"], x["round"]) for x in recs],
                         [("pp32", 1), ("decode at 32", 1), ("pp32", 2), ("decode at 32", 2)])
        for x in recs:
            part = "pp" if x["test"] == "pp32" else "tg"
            with open(os.path.join(self.dir, "out", "raw", f"native-short-q8_0-r{x['round']}-kvslim-{part}.json")) as f:
                kv = json.load(f)
            test = "pp32" if x["test"] == "pp32" else "tg4 @ d32"
            own = [row["avg_ts"] for row in kv if row["test"] == test]
            self.assertEqual(x["kvslim_ts"], own[0])
            # The stand-in's -fa 1 rates (1.5 x 1000 for pp, 2 x 100 for decode) are its faster ones.
            self.assertEqual(x["llama_ts"], 1500.0 if x["test"] == "pp32" else 200.0)
            self.assertAlmostEqual(x["ratio"], own[0] / x["llama_ts"])
            self.assertIsNone(x["target"])  # targets belong to 512, not to these small sizes
            self.assertEqual(x["llama_fa"], 1)
            self.assertEqual(x["model_type"], "f32")  # stories260K is f32, passed here as --q8_0
        # Round 1 runs kvslim first, round 2 llama-bench first.
        with open(self.log) as f:
            calls = [float(line.split()[0]) for line in f]
        self.assertEqual(len(calls), 4)  # a pp and a decode call a round
        raw = os.path.join(self.dir, "out", "raw")
        k1 = os.path.getmtime(os.path.join(raw, "native-short-q8_0-r1-kvslim-tg.json"))  # kvslim's last in round 1
        k2 = os.path.getmtime(os.path.join(raw, "native-short-q8_0-r2-kvslim-pp.json"))  # its first in round 2
        now_minus_mono = time.time() - time.monotonic()
        self.assertLess(k1, calls[0] + now_minus_mono)
        self.assertGreater(k2, calls[3] + now_minus_mono)
        with open(os.path.join(self.dir, "out", "summary.md")) as f:
            text = f.read()
        self.assertIn("| pp32 | native | q8_0 | 1 |", text)
        self.assertIn("the file's weights are f32, not q8_0", text)
        lo, hi = sorted(x["ratio"] for x in recs if x["test"] == "pp32")
        self.assertIn(f"| pp32 | native | q8_0 | 2 | {lo:.2f}x - {hi:.2f}x |  |", text)
        self.assertIn("0 of 0 targets met", text)
        # A second run into the same folder would mix its raw files with these: refused.
        r = self.drive("--groups", "short")
        self.assertEqual(r.returncode, 2)
        self.assertIn("raw/ already holds an earlier run's files", r.stderr)

    def test_depth_group_times_llama_fill_from_progress_lines(self):
        env = dict(self.env, STUB_FILL_S="0.5")
        r = self.drive("--groups", "d64", "--rounds", "1", "--depth-n-gen", "4", "--chunk-size", "16", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = {x["test"]: x for x in self.records()}
        fill = recs["prefill of 64"]
        # 64 tokens over the stand-in's 0.5 s sleep (plus process and pipe latency).
        self.assertGreater(fill["llama_fill_s"], 0.5)
        self.assertLess(fill["llama_fill_s"], 0.75)
        self.assertAlmostEqual(fill["llama_ts"], 64 / fill["llama_fill_s"])
        full = recs["decode at 64, full f16 cache"]
        snap = recs["decode at 64, SnapKV 0.75 (llama.cpp: full cache)"]
        self.assertEqual(full["llama_ts"], 100.0)  # --llama-fa-depth 0 only
        self.assertEqual(snap["llama_ts"], 100.0)  # against llama.cpp's full cache
        with open(os.path.join(self.dir, "out", "raw", "native-d64-q8_0-r1-kvslim.json")) as f:
            kv = json.load(f)
        snap_rows = [row for row in kv if row["test"] == "tg4 @ d64" and row["press"].startswith("snapkv")]
        self.assertEqual(snap["kvslim_ts"], snap_rows[0]["avg_ts"])

    def test_depth_group_with_a_budget_on_the_other_model(self):
        r = self.drive("--groups", "d64", "--rounds", "1", "--depth-n-gen", "4", "--chunk-size", "16",
                       "--q4_k_m", MODEL, "--depth-model", "q4_k_m", "--depth-budget", "24")
        self.assertEqual(r.returncode, 0, r.stderr)
        recs = {x["test"]: x for x in self.records()}
        budget = recs["decode at 64, SnapKV budget 24 (llama.cpp: full cache)"]
        self.assertEqual(budget["model"], "q4_k_m")
        self.assertIsNone(budget["target"])  # budget targets are set at 32,768 only
        with open(os.path.join(self.dir, "out", "raw", "native-d64-q4_k_m-r1-kvslim.json")) as f:
            kv = json.load(f)
        rows = [row for row in kv if row["test"] == "tg4 @ d64" and row["press"].startswith("snapkv")]
        self.assertIn("budget=24", rows[0]["press"])
        self.assertEqual(budget["kvslim_ts"], rows[0]["avg_ts"])
        # The budgeted cache holds 24 entries per KV head after the 64-token fill, the full one 64.
        self.assertLess(rows[0]["kv_bytes"], [row for row in kv if row["test"] == "tg4 @ d64"
                                              and row["press"] == "none"][0]["kv_bytes"])
        r = self.drive("--groups", "d64", "--depth-model", "q4_k_m")
        self.assertEqual(r.returncode, 2)
        self.assertIn("the dN groups need --q4_k_m", r.stderr)

    def test_targets_at_their_bounds(self):
        # pp512's target is 1.2x: 120 against 100 meets it, 119 does not.
        self.assertTrue(bench_compare.ratio_record("pp512", "native", "q8_0", 1, 120.0, 100.0, 1.2)["met"])
        self.assertFalse(bench_compare.ratio_record("pp512", "native", "q8_0", 1, 119.0, 100.0, 1.2)["met"])
        self.assertEqual(bench_compare.PREFILL_TARGETS[16384], 2.0)
        self.assertEqual(bench_compare.SNAPKV_TARGETS[16384], 3.0)
        self.assertEqual(bench_compare.PREFILL_TARGETS[32768], 2.5)
        self.assertEqual(bench_compare.DECODE_TARGETS[32768], 2.5)
        self.assertEqual(bench_compare.BUDGET_TARGETS[32768], 4.0)

    def test_failed_run_and_bad_arguments(self):
        r = self.drive("--groups", "short", "--rounds", "1", "--reps", "1", "--prompt", "32", "--short-depth", "32",
                       "--n-gen", "4", env=dict(self.env, STUB_FAIL="1"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("llama-bench exited 3", r.stderr)
        with open(os.path.join(self.dir, "out", "summary.md")) as f:
            self.assertIn("**1 failed run(s)**", f.read())
        with open(os.path.join(self.dir, "out", "results.json")) as f:
            self.assertEqual(len(json.load(f)["failures"]), 1)
        r = self.drive("--levels", "avx3")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown level 'avx3'", r.stderr)
        r = self.drive("--groups", "d4k")
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown group 'd4k'", r.stderr)
        r = self.drive("--prompt", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--prompt 0: must be >= 1", r.stderr)
        r = subprocess.run([sys.executable, DRIVER, "--kvslim", KVSLIM, "--llama-bench", self.stub, "--q8_0", MODEL,
                            "--out", os.path.join(self.stub, "sub")], capture_output=True, text=True, env=self.env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot create the output folder", r.stderr)
        r = subprocess.run([sys.executable, DRIVER, "--kvslim", KVSLIM, "--llama-bench", self.dir, "--q8_0", MODEL,
                            "--out", self.dir], capture_output=True, text=True, env=self.env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not an executable file", r.stderr)
        r = subprocess.run([sys.executable, DRIVER, "--kvslim", KVSLIM, "--llama-bench", self.stub, "--q8_0",
                            os.path.join(self.dir, "missing.gguf"), "--out", self.dir],
                           capture_output=True, text=True, env=self.env)
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing.gguf: no such file", r.stderr)


if __name__ == "__main__":
    unittest.main()

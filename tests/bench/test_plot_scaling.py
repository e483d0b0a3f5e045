#!/usr/bin/env python3
"""bench/plot_scaling.py (prefill time against context length): exponents of hand-built curves
whose exponents are known (t = c n is 1, t = c n^2 is 2, a curve that doubles its time per
doubling then quadruples it is 1 then 2), the fit over the lengths from --min-tokens, the SVG that
gnuplot writes, and the errors on bad input. Standard library only.
    python3 tests/bench/test_plot_scaling.py"""
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import plot_scaling  # noqa: E402

HEADER = "model,cache,tokens,fill_seconds\n"


class PlotScaling(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            rc = plot_scaling.main(list(args))
        return rc, out.getvalue(), err.getvalue()

    def test_exponents_of_known_curves(self):
        # linear: 1 s per 1,000 tokens; quadratic: 1 s at 1,000 tokens; kink: 10, 20, 80 s.
        rows = [("m", "linear", n, n / 1000.0) for n in (1000, 2000, 4000, 8000)]
        rows += [("m", "quadratic", n, (n / 1000.0) ** 2) for n in (1000, 2000, 4000)]
        rows += [("m", "kink", n, t) for n, t in ((1000, 10.0), (2000, 20.0), (4000, 80.0))]
        cs = plot_scaling.curves(rows)
        for k in plot_scaling.pairwise_exponents(cs[("m", "linear")]):
            self.assertAlmostEqual(k, 1.0, places=12)
        for k in plot_scaling.pairwise_exponents(cs[("m", "quadratic")]):
            self.assertAlmostEqual(k, 2.0, places=12)
        kink = plot_scaling.pairwise_exponents(cs[("m", "kink")])
        self.assertAlmostEqual(kink[0], 1.0, places=12)
        self.assertAlmostEqual(kink[1], 2.0, places=12)
        self.assertAlmostEqual(plot_scaling.fitted_exponent(cs[("m", "linear")]), 1.0, places=12)
        # Over ln n = 0, ln 2, ln 4 (times 1000) with ln t = ln 10 + 0, ln 2, 3 ln 2: the slope of
        # the least-squares line through (0, 0), (1, 1), (2, 3) in units of ln 2 is 1.5.
        self.assertAlmostEqual(plot_scaling.fitted_exponent(cs[("m", "kink")]), 1.5, places=12)
        # From 2,000 tokens only the last two points count: 2.
        self.assertAlmostEqual(plot_scaling.fitted_exponent(cs[("m", "kink")], 2000), 2.0, places=12)
        self.assertIsNone(plot_scaling.fitted_exponent(cs[("m", "kink")], 4000))

    def test_rows_are_sorted_by_length(self):
        path = self.write("r.csv", HEADER + "m,c,4000,16\nm,c,1000,1\nm,c,2000,4\n")
        cs = plot_scaling.curves(plot_scaling.read_records([path]))
        self.assertEqual([n for n, _ in cs[("m", "c")]], [1000, 2000, 4000])
        self.assertEqual(plot_scaling.pairwise_exponents(cs[("m", "c")]), [2.0, 2.0])

    def test_table_and_svg(self):
        path = self.write("r.csv", HEADER + "Q8_0,full f16,8192,40\nQ8_0,full f16,16384,160\n"
                          "Q8_0,snapkv budget 2048,8192,30\nQ8_0,snapkv budget 2048,16384,60\n")
        svg = os.path.join(self.tmp, "out.svg")
        if shutil.which("gnuplot") is None:
            self.skipTest("gnuplot is not on PATH (Debian package gnuplot-nox)")
        rc, out, err = self.run_main(path, "--out", svg)
        self.assertEqual(rc, 0, err)
        self.assertIn("| Q8_0 | full f16 | 8,192, 16,384 | 2.00 | 2.00 |", out)
        self.assertIn("| Q8_0 | snapkv budget 2048 | 8,192, 16,384 | 1.00 | 1.00 |", out)
        with open(svg) as f:
            text = f.read()
        self.assertTrue(text.lstrip().startswith("<?xml") or "<svg" in text[:400])
        # The key names each curve with its exponent; the underscore stays a character (noenhanced).
        self.assertIn("Q8_0, full f16 (k = 2.00)", text)
        self.assertIn("Q8_0, snapkv budget 2048 (k = 1.00)", text)

    def test_bad_input_names_file_line_and_column(self):
        missing = self.write("missing.csv", "model,cache,tokens\nm,c,1000\n")
        rc, _, err = self.run_main(missing)
        self.assertEqual(rc, 2)
        self.assertIn("missing.csv: no column 'fill_seconds'", err)
        text = self.write("text.csv", HEADER + "m,c,1000,1\nm,c,2000,slow\n")
        rc, _, err = self.run_main(text)
        self.assertEqual(rc, 2)
        self.assertIn("text.csv:3: column 'fill_seconds' is 'slow', not a number", err)
        zero = self.write("zero.csv", HEADER + "m,c,0,1\n")
        rc, _, err = self.run_main(zero)
        self.assertEqual(rc, 2)
        self.assertIn("zero.csv:2: column 'tokens' is 0; it must be positive", err)
        twice = self.write("twice.csv", HEADER + "m,c,1000,1\nm,c,1000,2\n")
        rc, _, err = self.run_main(twice)
        self.assertEqual(rc, 2)
        self.assertIn("m, c: two records at 1000 tokens", err)
        rc, _, err = self.run_main(os.path.join(self.tmp, "absent.csv"))
        self.assertEqual(rc, 2)
        self.assertIn("absent.csv: cannot read", err)

    def test_command_line(self):
        path = self.write("r.csv", HEADER + "m,c,1000,1\nm,c,2000,2\n")
        r = subprocess.run([sys.executable, os.path.join(SRC, "bench", "plot_scaling.py"), path],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| m | c | 1,000, 2,000 | 1.00 | 1.00 |", r.stdout)
        r = subprocess.run([sys.executable, os.path.join(SRC, "bench", "plot_scaling.py"), path, "--min-tokens", "x"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--min-tokens", r.stderr)


if __name__ == "__main__":
    unittest.main()

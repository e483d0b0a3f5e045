#!/usr/bin/env python3
"""Prefill time against context length: the fitted exponent of each curve and a log-log plot.

    python3 bench/plot_scaling.py bench/results/long_context.csv --out docs/eval/long_context_fill_time.svg

Reads CSV records with at least the columns `model`, `cache`, `tokens` and `fill_seconds` (one row
per run; bench/results/long_context.csv holds the measured ones). Each (model, cache) pair is a
curve. For each curve it prints, as a Markdown table, the exponent k of time ~ n^k between each pair
of consecutive lengths, ln(t2 / t1) / ln(n2 / n1), and the least-squares slope of ln t against ln n
over the lengths of at least --min-tokens. Linear time gives k = 1, attention over a full cache
tends to k = 2. With --out it draws the curves on log-log axes with gnuplot (Debian: gnuplot-nox)
as SVG. Standard library only; exits 2 with a message naming the file, line and column on bad input.
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile

REQUIRED = ("model", "cache", "tokens", "fill_seconds")


class InputError(Exception):
    pass


def read_records(paths):
    """[(model, cache, tokens, seconds)] from the CSV files; InputError names file, line, column."""
    rows = []
    for path in paths:
        try:
            f = open(path, newline="")
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror})")
        with f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            for c in REQUIRED:
                if c not in cols:
                    raise InputError(f"{path}: no column '{c}' (columns: {', '.join(cols) or 'none'})")
            for line, r in enumerate(reader, start=2):
                vals = {}
                for c, kind in (("tokens", int), ("fill_seconds", float)):
                    text = (r.get(c) or "").strip()
                    try:
                        v = kind(text)
                    except ValueError:
                        raise InputError(f"{path}:{line}: column '{c}' is '{text}', not a number")
                    if not v > 0 or math.isinf(v):
                        raise InputError(f"{path}:{line}: column '{c}' is {text}; it must be positive")
                    vals[c] = v
                rows.append((r["model"].strip(), r["cache"].strip(), vals["tokens"], vals["fill_seconds"]))
    if not rows:
        raise InputError(f"{', '.join(paths)}: no records")
    return rows


def curves(rows):
    """{(model, cache): [(tokens, seconds)] sorted by tokens}; a repeated length is an error."""
    out = {}
    for model, cache, n, t in rows:
        pts = out.setdefault((model, cache), [])
        if any(p[0] == n for p in pts):
            raise InputError(f"{model}, {cache}: two records at {n} tokens")
        pts.append((n, t))
    for pts in out.values():
        pts.sort()
    return out


def pairwise_exponents(pts):
    """k between consecutive points: ln(t2 / t1) / ln(n2 / n1)."""
    return [math.log(t2 / t1) / math.log(n2 / n1) for (n1, t1), (n2, t2) in zip(pts, pts[1:])]


def fitted_exponent(pts, min_tokens=0):
    """Least-squares slope of ln t against ln n over the points of at least min_tokens (None with
    fewer than two)."""
    sel = [(math.log(n), math.log(t)) for n, t in pts if n >= min_tokens]
    if len(sel) < 2:
        return None
    mx = sum(x for x, _ in sel) / len(sel)
    my = sum(y for _, y in sel) / len(sel)
    sxx = sum((x - mx) ** 2 for x, _ in sel)
    return sum((x - mx) * (y - my) for x, y in sel) / sxx


def table(cs, min_tokens):
    lines = ["| model | cache | lengths | k between consecutive lengths | fitted k (from %s tokens) |" % f"{min_tokens:,}",
             "|---|---|---|---|---|"]
    for (model, cache), pts in cs.items():
        k = fitted_exponent(pts, min_tokens)
        lines.append("| %s | %s | %s | %s | %s |" % (
            model, cache, ", ".join(f"{n:,}" for n, _ in pts),
            ", ".join(f"{v:.2f}" for v in pairwise_exponents(pts)) or "-",
            "-" if k is None else f"{k:.2f}"))
    return "\n".join(lines)


def gp_quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plot(cs, min_tokens, out, title):
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        raise InputError("gnuplot is not on PATH (Debian package gnuplot-nox); leave out --out to print the exponents only")
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, ((model, cache), pts) in enumerate(cs.items()):
            data = os.path.join(tmp, f"c{i}.dat")
            with open(data, "w") as f:
                for n, t in pts:
                    f.write(f"{n} {t / 60.0}\n")
            k = fitted_exponent(pts, min_tokens)
            label = f"{model}, {cache}" + ("" if k is None else f" (k = {k:.2f})")
            plots.append(f"{gp_quote(data)} using 1:2 with linespoints lw 2 pt 7 title {gp_quote(label)}")
        script = "\n".join([
            "set terminal svg size 900,600 dynamic noenhanced font 'sans,12' background '#ffffff'",
            f"set output {gp_quote(out)}",
            f"set title {gp_quote(title)}",
            "set logscale xy 2",
            "set xlabel 'context tokens'",
            "set ylabel 'prefill time (minutes)'",
            "set format x '%.0f'",
            "set grid",
            "set key outside below center vertical Left reverse samplen 3",
            "plot " + ", ".join(plots),
        ])
        r = subprocess.run([gnuplot], input=script, text=True, capture_output=True)
        if r.returncode != 0:
            raise InputError(f"gnuplot failed: {r.stderr.strip()}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+", help="CSV records (model, cache, tokens, fill_seconds, ...)")
    ap.add_argument("--out", help="SVG to write (gnuplot); without it only the exponents are printed")
    ap.add_argument("--min-tokens", type=int, default=0, help="smallest length in the fitted exponent")
    ap.add_argument("--title", default="Prefill time against context length")
    a = ap.parse_args(argv)
    try:
        cs = curves(read_records(a.csv))
        print(table(cs, a.min_tokens))
        if a.out:
            plot(cs, a.min_tokens, a.out, a.title)
            print(f"plot: {a.out}")
    except InputError as e:
        print(f"plot_scaling.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

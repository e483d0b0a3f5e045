#!/usr/bin/env python3
"""The plots of `kvslim eval` as a reader gets them.

Runs a small sweep of each kind (fidelity with LMBA, niah, ruler with two tasks) on the bundled
story model with `--plot-format svg`, then reads every SVG gnuplot wrote:

- every <text> lies inside the canvas (its extent estimated as characters x 0.6 x font size,
  placed by its text-anchor, turned with its rotation);
- the plotting area (gnuplot's border, a closed rectangle path) keeps at least 70% of the canvas
  width, and no legend entry overlaps it or another text;
- every count in a title or legend (n=K, n=A-B, "mean of K samples") equals the count of the
  records in the same run's samples.jsonl that the title or entry describes.

Exit 0 when all hold, 1 with one line per problem otherwise, 77 (skipped) without gnuplot.
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
CHAR = 0.6  # estimated glyph width / font size


def run(cmd, log):
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        with open(log) as f:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {rc}:\n{f.read()}")


def canvas(root):
    vb = root.get("viewBox")
    if vb:
        x, y, w, h = (float(v) for v in vb.split())
        return x, y, x + w, y + h
    return 0.0, 0.0, float(root.get("width").rstrip("px")), float(root.get("height").rstrip("px"))


def transform_of(el):
    """(dx, dy, rotation in degrees) of an element's transform attribute."""
    t = el.get("transform", "")
    dx = dy = rot = 0.0
    m = re.search(r"translate\(\s*([-\d.eE]+)[ ,]+([-\d.eE]+)\s*\)", t)
    if m:
        dx, dy = float(m.group(1)), float(m.group(2))
    m = re.search(r"rotate\(\s*([-\d.eE]+)", t)
    if m:
        rot = float(m.group(1)) % 360
    return dx, dy, rot


class Text:
    def __init__(self, s, x, y, size, anchor, rot, group):
        self.s, self.x, self.y, self.size, self.anchor, self.rot, self.group = s, x, y, size, anchor, rot, group
        w = len(s) * CHAR * size
        lo = {"start": 0.0, "middle": -w / 2, "end": -w}.get(anchor, 0.0)
        along = (lo, lo + w)  # along the text's direction, from its anchor point
        across = (-0.8 * size, 0.25 * size)  # ascent above the baseline, descent below
        if abs(rot) < 1:
            self.box = (x + along[0], y + across[0], x + along[1], y + across[1])
        elif abs(rot - 270) < 1:  # reads upwards; the glyphs' tops point left
            self.box = (x + across[0], y - along[1], x + across[1], y - along[0])
        elif abs(rot - 90) < 1:  # reads downwards; the glyphs' tops point right
            self.box = (x - across[1], y + along[0], x - across[0], y + along[1])
        else:
            raise ValueError(f"text {s!r} rotated by {rot} degrees")

    def __repr__(self):
        return f"{self.s!r} at ({self.x:.1f}, {self.y:.1f})"


def texts_and_frame(root):
    """Every non-empty <text> (position from the enclosing translations, font size and anchor
    inherited) and the plot border: the largest closed axis-aligned rectangle path outside the
    plot groups (gnuplot_plot_N), where bars and boxes are drawn."""
    texts, rects = [], []

    def walk(el, x, y, rot, size, anchor, group):
        dx, dy, r = transform_of(el)
        x, y, rot = x + dx, y + dy, (rot + r) % 360
        if el.get("font-size"):
            size = float(el.get("font-size"))
        anchor = el.get("text-anchor", anchor)
        if el.get("id", "").startswith("gnuplot_plot_"):
            group = el.get("id")
        tag = el.tag.replace(SVG, "")
        if tag == "text":
            s = "".join(el.itertext())
            if s.strip():
                texts.append(Text(s, x + float(el.get("x", 0)), y + float(el.get("y", 0)), size, anchor, rot, group))
            return
        if tag == "path" and group is None and el.get("d"):
            pts = [tuple(float(v) for v in p.split(",")) for p in re.findall(r"[-\d.]+,[-\d.]+", el.get("d"))]
            if (len(pts) == 5 and pts[0] == pts[4] and len({p[0] for p in pts}) == 2 and len({p[1] for p in pts}) == 2
                    and el.get("d").strip().endswith("Z")):
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
                rects.append((min(xs), min(ys), max(xs), max(ys)))
        for c in el:
            if c.tag.replace(SVG, "") not in ("defs", "title", "desc"):
                walk(c, x, y, rot, size, anchor, group)

    walk(root, 0.0, 0.0, 0.0, 12.0, "start", None)
    frame = max(rects, key=lambda r: (r[2] - r[0]) * (r[3] - r[1])) if rects else None
    return texts, frame


def overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def key_titles(gp_path):
    """The legend entries: the `title "..."` of the script's plot command."""
    with open(gp_path) as f:
        plot = [l for l in f if l.startswith("plot ")]
    out = []
    for line in plot:
        for m in re.finditer(r'title "((?:[^"\\]|\\.)*)"', line):
            out.append(re.sub(r"\\(.)", r"\1", m.group(1)))
    return out


def n_range(text):
    m = re.search(r"\bn=(\d+)(?:-(\d+))?", text)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2) or m.group(1))


def file_safe(s):
    return "".join(c if c.isalnum() or c in ".-_" else "_" for c in s)


def is_baseline(spec):
    return spec.split(":")[0] == "none"


def expected(name, records):
    """The counts a plot's title and its full-cache legend entry describe: (title's (lo, hi),
    legend's count or None, the title's phrase)."""
    tasks = [r for r in records if r["kind"] == "task"]
    fid = [r for r in records if r["kind"] == "fidelity"]
    att = [r for r in records if r["kind"] == "attention"]

    def span(groups):
        c = collections.Counter(groups)
        return (min(c.values()), max(c.values())) if c else (0, 0)

    if name == "lmba":
        return (len(att), len(att)), None, "samples"
    m = re.match(r"(niah|needle_kept)_(.+)_(\d\.\d\d)$", name)
    if m:
        rs = [r for r in tasks if file_safe(r["press_spec"]) == m.group(2) and f"{r['ratio']:.2f}" == m.group(3)]
        return span((r["length"], r["depth"]) for r in rs), None, "per cell"
    if fid:
        rs = fid
        if name.startswith("kl_"):  # a KL of 0 has no place on the log axis
            rs = [r for r in fid if sum(x["kl"] for x in fid if (x["press_spec"], x["ratio"]) ==
                                        (r["press_spec"], r["ratio"])) > 0]
    else:
        rs = tasks
        m = re.match(r"score_vs_ratio_(.+)$", name)
        if m:
            rs = [r for r in tasks if r["task"] == m.group(1)]
    base = [r for r in rs if is_baseline(r["press_spec"])]
    return span((r["press_spec"], r["ratio"]) for r in rs), (len(base) if base else None), "per point"


def check_dir(d, problems):
    with open(os.path.join(d, "samples.jsonl")) as f:
        records = [json.loads(l) for l in f if l.strip()]
    svgs = sorted(p for p in os.listdir(d) if p.endswith(".svg"))
    for svg in svgs:
        where = os.path.join(os.path.basename(d), svg)
        name = svg[:-4]

        def bad(msg):
            problems.append(f"{where}: {msg}")

        root = ET.parse(os.path.join(d, svg)).getroot()
        x0, y0, x1, y1 = canvas(root)
        texts, frame = texts_and_frame(root)
        for t in texts:
            b = t.box
            if b[0] < x0 or b[1] < y0 or b[2] > x1 or b[3] > y1:
                bad(f"text {t} (estimated extent {tuple(round(v) for v in b)}) leaves the canvas "
                    f"{(x0, y0, x1, y1)}")
        if frame is None:
            bad("no plot border found")
            continue
        if frame[2] - frame[0] < 0.7 * (x1 - x0):
            bad(f"the plotting area is {frame[2] - frame[0]:.0f} of the canvas's {x1 - x0:.0f} px wide (< 70%)")
        keys = key_titles(os.path.join(d, svg + ".gp"))
        legend = [t for t in texts if t.s.strip() in [k.strip() for k in keys]]
        if len(legend) != len(keys):
            bad(f"legend entries {keys} but found {legend} in the SVG")
        for t in legend:
            if overlap(t.box, frame):
                bad(f"legend entry {t} overlaps the plotting area {tuple(round(v) for v in frame)}")
            for o in texts:
                if o is not t and overlap(t.box, o.box):
                    bad(f"legend entry {t} overlaps the text {o}")
        # The title: the texts above the plotting area, top to bottom.
        title = " ".join(t.s.strip() for t in sorted(texts, key=lambda t: t.y) if t.box[3] <= frame[1])
        want_n, want_base, phrase = expected(name, records)
        if phrase == "samples":
            m = re.search(r"mean of (\d+) samples", title)
            got = (int(m.group(1)),) * 2 if m else None
        else:
            got = n_range(title)
            if phrase not in title:
                bad(f"title {title!r} does not say '{phrase}'")
        if got is None:
            bad(f"title {title!r} gives no count")
        elif got != want_n:
            bad(f"title {title!r} gives n={got[0]}-{got[1]}, the records give n={want_n[0]}-{want_n[1]}")
        for t in legend:
            if t.s.strip().startswith("full cache"):
                n = n_range(t.s)
                if n is None or want_base is None or n != (want_base, want_base):
                    bad(f"legend entry {t.s.strip()!r}: the records hold {want_base} full-cache runs")
    return svgs


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kvslim", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--keep", help="write the results here and keep them")
    a = ap.parse_args()
    if shutil.which("gnuplot") is None:
        print("SKIP: gnuplot is not on PATH (Debian package gnuplot-nox)")
        return 77
    out = a.keep or tempfile.mkdtemp(prefix="kvslim_eval_plots_")
    os.makedirs(out, exist_ok=True)
    common = ["--no-progress", "--plot-format", "svg"]
    sweeps = {
        "fidelity": ["fidelity", "--press", "streaming_llm", "knorm", "--ratios", "0.25,0.5", "--samples", "2",
                     "--context-tokens", "32", "--continuation-tokens", "8", "--lmba-window", "8"],
        "niah": ["niah", "--lengths", "48,64", "--depths", "0,1", "--samples", "2", "--press", "streaming_llm",
                 "--ratios", "0.5", "-n", "2"],
        "ruler": ["ruler", "--tasks", "niah_single,niah_multikey", "--lengths", "192", "--samples", "2", "--press",
                  "streaming_llm", "--ratios", "0.5", "-n", "2"],
    }
    # The plots each sweep must write, so a missing one cannot pass unnoticed.
    want = {
        "fidelity": {"kl_vs_ratio", "kl_vs_memory", "top1_vs_ratio", "ppl_vs_ratio", "lmba"},
        "niah": {"score_vs_ratio", "score_vs_memory", "niah_streaming_llm_0.50", "needle_kept_streaming_llm_0.50",
                 "niah_none_0.00", "needle_kept_none_0.00"},
        "ruler": {"score_vs_ratio", "score_vs_memory", "score_vs_ratio_niah_single", "score_vs_ratio_niah_multikey"},
    }
    problems = []
    try:
        for kind, args in sweeps.items():
            d = os.path.join(out, kind)
            shutil.rmtree(d, ignore_errors=True)
            run([a.kvslim, "eval"] + args[:1] + ["-m", a.model] + args[1:] + common + ["-o", d], d + ".log")
            svgs = check_dir(d, problems)
            missing = want[kind] - {s[:-4] for s in svgs}
            if missing:
                problems.append(f"{kind}: plots missing: {sorted(missing)}")
            print(f"{kind}: {len(svgs)} plots checked")
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
    for p in problems:
        print("FAIL:", p)
    print(f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Pareto fronts of `kvslim eval fidelity` summaries: memory ratio against KL and against top-1.

Usage: bench/latent/pareto.py DIR_OR_CSV...   (each DIR searched for */summary.csv; a CSV with a `run`
column, as bench/results/latent_story_fidelity.csv, names each row's sweep by it)

Reads every summary.csv row (press spec, ratio, KL, top-1 agreement, memory ratios), drops the
full-cache baseline, and prints
  - the front of (memory ratio after compression, KL): rows no other row beats on both;
  - the front of (memory ratio after compression, top-1 agreement);
  - for the story model's targets (docs/LATENT.md), the smallest memory ratio meeting each.
"Memory ratio after compression" is the CSV's prefill_memory_ratio (the compressed context's
cache bytes over its f16 cache bytes, shared calibrated bases excluded); memory_ratio (at the end
of the run, with the uncompressed teacher-forced tokens) is printed next to it.
"""
import csv
import glob
import os
import sys


def rows(paths):
    out = []
    for p in paths:
        files = [p] if p.endswith(".csv") else sorted(glob.glob(os.path.join(p, "**", "summary.csv"), recursive=True))
        for f in files:
            for r in csv.DictReader(open(f)):
                if r["press_spec"] == "none":
                    continue
                out.append(dict(spec=r["press_spec"], ratio=float(r["ratio"]), kl=float(r["kl"]),
                                top1=float(r["top1_agreement"]), mem=float(r["prefill_memory_ratio"]),
                                end=float(r["memory_ratio"]),
                                src=r.get("run") or os.path.basename(os.path.dirname(f))))
    return out


def show(r):
    return "| {} | {} | {:g} | {:.3g} | {:.4f} | {:.4f} | {:.4f} |".format(r["src"], r["spec"], r["ratio"], r["kl"],
                                                                        r["top1"], r["mem"], r["end"])


def main():
    rs = rows(sys.argv[1:] or ["eval-out/story_pareto"])
    head = ("| run (its cache types) | press | ratio | KL (nats) | top-1 | memory ratio after compression | at the end |\n"
            "|---|---|---|---|---|---|---|")
    # Walking memory upward, a row joins the front when its KL is lower than every row of smaller
    # or equal memory (a row of equal memory and lower KL replaces the previous one).
    print("Front: memory ratio vs KL (KL falling as memory grows)")
    print(head)
    kl_front = []
    for r in sorted(rs, key=lambda r: (r["mem"], r["kl"])):
        while kl_front and kl_front[-1]["kl"] >= r["kl"] and kl_front[-1]["mem"] >= r["mem"]:
            kl_front.pop()
        if not kl_front or r["kl"] < kl_front[-1]["kl"]:
            kl_front.append(r)
    for r in kl_front:
        print(show(r))
    print("\nFront: memory ratio vs top-1 (top-1 rising with memory)")
    print(head)
    t_front = []
    for r in sorted(rs, key=lambda r: (r["mem"], -r["top1"])):
        if not t_front or r["top1"] > t_front[-1]["top1"]:
            t_front.append(r)
    for r in t_front:
        print(show(r))
    print("\nSmallest memory ratio (after compression) meeting each target")
    for name, ok in [("KL <= 0.01 and top-1 >= 0.99", lambda r: r["kl"] <= 0.01 and r["top1"] >= 0.99),
                     ("KL <= 0.01", lambda r: r["kl"] <= 0.01), ("top-1 >= 0.99", lambda r: r["top1"] >= 0.99),
                     ("KL <= 0.05", lambda r: r["kl"] <= 0.05)]:
        m = [r for r in rs if ok(r)]
        if not m:
            print("- {}: none".format(name))
            continue
        r = min(m, key=lambda r: (r["mem"], r["kl"]))
        print("- {}: {:.4f} ({}: {} at {:g}: KL {:.3g}, top-1 {:.4f})".format(name, r["mem"], r["src"], r["spec"],
                                                                            r["ratio"], r["kl"], r["top1"]))


if __name__ == "__main__":
    main()

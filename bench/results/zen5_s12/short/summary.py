#!/usr/bin/env python3
"""Per round and file: kvslim (pp512, tg32 @ d512 mean) against llama.cpp's better of -fa 0 / -fa 1."""
import json, re, sys, os
O = os.path.dirname(os.path.abspath(__file__))
def llama(path):
    best = {}
    for line in open(path):
        m = re.search(r'\|\s+(pp512|tg32) @ d512 \|\s+([\d.]+)', line)
        if m: best[m.group(1)] = max(best.get(m.group(1), 0), float(m.group(2)))
    return best
def kvslim(path):
    r = {}
    for t in json.load(open(path)):
        if t['test'].startswith('pp512'): r['pp512'] = t['avg_ts']
        if t['test'].startswith('tg32'): r['tg32'] = t['avg_ts']; r['tg32med'] = t['median_token_ts']
    return r
for rnd in (1, 2):
    for m in ('q8_0', 'q4_k_m'):
        for kl, ll in (('avx512', 'native'), ('avx2', 'avx2')):
            try:
                k = kvslim(f'{O}/r{rnd}-kvslim-{kl}-{m}.json'); l = llama(f'{O}/r{rnd}-llama-{ll}-{m}.md')
            except (OSError, ValueError):
                continue
            print(f"round {rnd} {m:7s} kvslim {kl:6s} / llama {ll:6s}: pp512 {k['pp512']:.1f} / {l['pp512']:.1f} = {k['pp512']/l['pp512']:.2f}; "
                  f"decode@512 {k['tg32']:.1f} (median {k['tg32med']:.1f}) / {l['tg32']:.1f} = {k['tg32']/l['tg32']:.2f}")

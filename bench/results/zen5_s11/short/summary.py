#!/usr/bin/env python3
"""Summarizes run.sh's outputs: per round and model, kvslim (each level) and llama.cpp (native, AVX2 build; the
better of -fa 0/1) t/s for pp512 and tg32 at depth 512, and the ratios taken within the round."""
import glob, os, re, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

def kv(path):
    out = {}
    for line in open(path):
        cells = [c.strip() for c in line.split('|')]
        if len(cells) > 9 and cells[7] in ('pp512', 'tg32 @ d512'):
            out[cells[7][:2]] = float(cells[8].split()[0])
    return out

def ll(path):
    best = {}
    for line in open(path):
        cells = [c.strip() for c in line.split('|')]
        for c in cells:
            if c in ('pp512', 'tg32 @ d512'):
                v = float(cells[-2].split()[0])
                best[c[:2]] = max(best.get(c[:2], 0), v)
    return best

rounds = sorted({re.search(r'-r(\d+)\.txt$', f).group(1) for f in glob.glob(f'{d}/kv-*-r*.txt')})
for t in ('q8_0', 'q4_k_m'):
    for r in rounds:
        k = {lv: kv(f'{d}/kv-{lv}-{t}-r{r}.txt') for lv in ('avx512', 'avx2', 'avxvnni') if os.path.exists(f'{d}/kv-{lv}-{t}-r{r}.txt')}
        l = {}
        for b in ('native', 'avx2'):
            l[b] = {}
            for kind in ('pp', 'tg'):
                p = f'{d}/ll-{b}-{kind}-{t}-r{r}.txt'
                if os.path.exists(p): l[b].update(ll(p))
        for test in ('pp', 'tg'):
            row = [f'{t} r{r} {test}']
            for lv, base in (('avx512', 'native'), ('avx2', 'avx2'), ('avxvnni', 'avx2')):
                a, b = k.get(lv, {}).get(test), l.get(base, {}).get(test)
                if a and b: row.append(f'kvslim {lv} {a:.1f} / llama {base} {b:.1f} = {a / b:.2f}')
            print(' | '.join(row))

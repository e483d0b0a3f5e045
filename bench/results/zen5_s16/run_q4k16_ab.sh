#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, DAMON on as given: Q4_K_M decode at depth 512,
# kvslim with the q6_K layout change (s16a, 2e5dc4b-era) and with 16-row q4_K blocks at AVX-512 as well (s16c), alternating,
# AVX-512 and forced AVX2, --floor (read rate timed around each test).
# File: kvslim synth --shape tinyllama-1.1b --type q4_k_m in /dev/shm/kv.
O=${O:-/tmp/s16ab3}; mkdir -p $O; M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3; do
  for k in s16a s16c; do
    for lvl in avx512 avx2; do
      echo "[$(date -u '+%T')] round $r $k $lvl" >> $O/log
      KVSLIM_SIMD=$lvl taskset -c 0,1 /work/ext/kvslim-$k bench -m $M -p 0 --depth 512 -n 32 -r 1 -t 2 --no-progress --floor \
        > $O/$k-$lvl-r$r.txt 2>&1
    done
  done
done

#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, DAMON on as given: Q4_K_M decode at depth 512,
# kvslim before (d2f8c08, session 15: same weight kernels as 769c9a5) and after the q6_K layout change
# (/work/ext/kvslim-s16a), alternating, AVX-512 and forced AVX2, --floor (read rate timed around each test).
# File: kvslim synth --shape tinyllama-1.1b --type q4_k_m in /dev/shm/kv.
O=${O:-/tmp/s16ab}; mkdir -p $O; M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3; do
  for k in s15 s16a; do
    for lvl in avx512 avx2; do
      echo "[$(date -u '+%T')] round $r $k $lvl" >> $O/log
      KVSLIM_SIMD=$lvl taskset -c 0,1 /work/ext/kvslim-$k bench -m $M -p 0 --depth 512 -n 32 -r 1 -t 2 --no-progress --floor \
        > $O/$k-$lvl-r$r.txt 2>&1
    done
  done
done

#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, DAMON on as given: Q4_K_M decode at depth 512,
# two kvslim builds alternating (3 rounds), at the AVX-512 level and forced AVX2, --floor (the read rate timed
# around each test). File: kvslim synth --shape tinyllama-1.1b --type q4_k_m in /dev/shm/kv.
# Usage: run_q4km_decode_ab.sh BUILD_A BUILD_B (binaries /work/ext/kvslim-BUILD); outputs in $O.
#   q6k_ab/:              O=/tmp/s16ab  run_q4km_decode_ab.sh s15 s16a   (d2f8c08 -> d0f060a, q6_K reading order)
#   q4k16_all_levels_ab/: O=/tmp/s16ab2 run_q4km_decode_ab.sh s16a s16b  (16-row q4_K at every level, not kept)
#   q4k16_ab/:            O=/tmp/s16ab3 run_q4km_decode_ab.sh s16a s16c  (16-row q4_K at AVX-512 only, 5dd41bd)
O=${O:-/tmp/s16ab}; mkdir -p $O; M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3; do
  for k in "$1" "$2"; do
    for lvl in avx512 avx2; do
      echo "[$(date -u '+%T')] round $r $k $lvl" >> $O/log
      KVSLIM_SIMD=$lvl taskset -c 0,1 /work/ext/kvslim-$k bench -m $M -p 0 --depth 512 -n 32 -r 1 -t 2 --no-progress --floor \
        > $O/$k-$lvl-r$r.txt 2>&1
    done
  done
done

#!/bin/bash
# Q4_K_M decode at depth 512, AVX-512, before (c2ab449's StreamPrefetch: 6 KiB ahead into L1) and after (12 KiB into
# L2 and 3 KiB into L1, plus each q6_K block's header lines), alternating; 2 threads.
O=${O:-.}; M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3 4 5; do
  for v in before after; do
    echo "[$(date -u '+%T')] $v r$r" >> $O/log
    KVSLIM_SIMD=avx512 taskset -c 0,1 /tmp/kvslim_$v bench -m $M -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/$v-r$r.txt 2>&1
  done
done

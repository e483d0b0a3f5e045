#!/bin/bash
# Q4_K_M decode at depth 512, AVX2 (KVSLIM_SIMD=avx2), old (c2ab449 kernels) and new (two 8-row blocks per step at one token) alternating.
O=${O:-.}; M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3 4; do
  for v in old new; do
    echo "[$(date -u '+%T')] $v r$r" >> $O/log
    KVSLIM_SIMD=avx2 taskset -c 0,1 /tmp/kvslim_$v bench -m $M -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/$v-r$r.txt 2>&1
  done
done

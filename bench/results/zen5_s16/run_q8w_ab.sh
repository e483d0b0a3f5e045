#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, DAMON on as given: Q8_0 decode at depth 512 at the
# AVX-512 level, kvslim 5dd41bd (s16c, 8-row q8_0 blocks) and with 16-row q8_0 blocks at AVX-512 (s16d),
# alternating, --floor. File: kvslim synth --shape tinyllama-1.1b --type q8_0 in /dev/shm/kv.
O=${O:-/tmp/s16q8}; mkdir -p $O; M=/dev/shm/kv/tinyllama-q8_0.gguf
for r in 1 2 3 4; do
  for k in s16c s16d; do
    echo "[$(date -u '+%T')] round $r $k" >> $O/log
    taskset -c 0,1 /work/ext/kvslim-$k bench -m $M -p 0 --depth 512 -n 32 -r 1 -t 2 --no-progress --floor > $O/$k-r$r.txt 2>&1
  done
done

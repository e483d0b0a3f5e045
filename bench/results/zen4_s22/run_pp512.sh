#!/bin/bash
# Session 22, AMD EPYC Zen 4 (family 25, Genoa), 2 threads, one engine at a time, DAMON off: pp512 from an empty
# cache only (after the int16 q8_0 prefill products at AVX2), two rounds, kvslim (K) at AVX-512 and forced AVX2
# against llama.cpp (L: unslothai/llama.cpp mirror d32676d77; build/ native, build-avx2/ AVX2-only), -fa 0 and 1.
# Synth TinyLlama Q8_0 and Q4_K_M in /dev/shm/kv.
O=${O:-/tmp/s22pp}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}
for r in 1 2; do
  for m in q8_0 q4_k_m; do
    M=/dev/shm/kv/tinyllama-$m.gguf
    for p in avx512:build avx2:build-avx2; do
      lvl=${p%%:*}; b=${p##*:}
      echo "[$(date -u '+%T')] $m $lvl round $r" >> $O/log
      KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -p 512 -n 0 -r 3 -t 2 --no-progress > $O/kvslim-$lvl-$m-r$r.txt 2>&1
      taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -p 512 -n 0 -r 2 -fa 0,1 -o md > $O/llama-$b-$m-r$r.md 2>/dev/null
    done
  done
done
echo "[$(date -u '+%T')] done" >> $O/log

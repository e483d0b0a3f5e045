#!/bin/bash
# Session 12, AMD EPYC Zen 5, 2 threads, alternating engines per round: kvslim avx512 / llama native / kvslim avx2 / llama avx2,
# pp512 and tg32 at depth 512, Q8_0 and Q4_K_M from /dev/shm. llama.cpp both -fa 0 and -fa 1 (the better counts).
O=/tmp/s12/short; K=/work/ext/kvslim-s12b; L=/work/ext/llama-up
for r in 1 2; do
 for m in q8_0 q4_k_m; do
  M=/dev/shm/kv/tinyllama-$m.gguf
  taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --json $O/r$r-kvslim-avx512-$m.json > $O/r$r-kvslim-avx512-$m.txt 2>&1
  taskset -c 0,1 $L/build/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/r$r-llama-native-$m.md 2>/dev/null
  KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --json $O/r$r-kvslim-avx2-$m.json > $O/r$r-kvslim-avx2-$m.txt 2>&1
  taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/r$r-llama-avx2-$m.md 2>/dev/null
 done
done
echo done > $O/done

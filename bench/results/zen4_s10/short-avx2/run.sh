#!/bin/bash
# Alternating short tests, 2 threads, AVX2 on both sides on a Zen 4: kvslim with KVSLIM_SIMD=avx2 vs llama.cpp
# (upstream 82bb48500) built with GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C/BMI2 and no AVX-512; same files in /dev/shm/kv.
O=/tmp/s10/short-avx2; K=${K:-/work/build/rel/kvslim}; L=/work/ext/llama-up/build-avx2/bin/llama-bench
cd /dev/shm/kv
for round in 1 2 3; do
 for t in q8_0 q4_k_m; do
  echo "== $(date +%T) round $round $t kvslim load $(cut -d' ' -f1 /proc/loadavg)"
  KVSLIM_SIMD=avx2 $K bench -m tinyllama-$t.gguf -p 512 --depth 512 -n 16 -t 2 -r 3 --no-progress > $O/kv-$t-r$round.txt 2>&1
  echo "== $(date +%T) round $round $t llama load $(cut -d' ' -f1 /proc/loadavg)"
  $L -m tinyllama-$t.gguf -t 2 -p 512 -n 16 -d 0,512 -fa 0,1 -r 3 -o md > $O/ll-$t-r$round.txt 2>&1
 done
done
echo done $(date +%T)

#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, one engine at a time, DAMON on as given.
# kvslim 5dd41bd (/work/ext/kvslim-s16c); llama.cpp 82bb48500 built outside the repository: build (native,
# AVX-512) and build-avx2. Q4_K_M and Q8_0 synth TinyLlama files (kvslim synth --shape tinyllama-1.1b) in /dev/shm/kv.
# pp512 and decode at depth 512 (kvslim --floor: the read rate timed around each decode test); llama.cpp -fa 0,1.
O=${O:-/tmp/s16short}; mkdir -p $O; K=/work/ext/kvslim-s16c; L=/work/ext/llama-up
for m in q4_k_m q8_0; do
  M=/dev/shm/kv/tinyllama-$m.gguf
  for r in 1 2; do
    echo "[$(date -u '+%T')] $m round $r" >> $O/log
    taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx512-$m-r$r.txt 2>&1
    taskset -c 0,1 $L/build/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-native-$m-r$r.md 2>/dev/null
    KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx2-$m-r$r.txt 2>&1
    taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-avx2-$m-r$r.md 2>/dev/null
  done
done
echo "[$(date -u '+%T')] done" >> $O/log

#!/bin/bash
# Session 21, AMD EPYC Zen 4 (family 25, Genoa), 2 threads, one engine at a time, DAMON off: Q4_K_M decode at depth 512
# only, three more rounds after run_short (bench/results/zen5_s20/run_short.sh, run here with O=.../short), kvslim
# (K, this session's build) at AVX-512 and forced AVX2 against llama.cpp (unslothai/llama.cpp mirror d32676d77)
# native and AVX2-only builds (L = the llama.cpp directory). Synth TinyLlama Q4_K_M in /dev/shm/kv.
O=${O:-/tmp/s21tg}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}
M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in 1 2 3; do
  echo "[$(date -u +%T)] round $r" >> $O/log
  taskset -c 0,1 $K bench -m $M -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx512-r$r.txt 2>&1
  taskset -c 0,1 $L/build/bin/llama-bench -m $M -t 2 -p 0 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-native-r$r.md 2>/dev/null
  KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx2-r$r.txt 2>&1
  taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -p 0 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-avx2-r$r.md 2>/dev/null
done

#!/bin/bash
# Session 17, AMD EPYC Zen 5 (family 26 model 2), 2 threads. kvslim 9089483 (bench --floor with a read pass after
# every decode token). Synth TinyLlama-1.1B-shape files (kvslim synth --shape tinyllama-1.1b --vocab-from
# ggml-vocab-llama-spm.gguf, llama.cpp's vocabulary file) in /dev/shm/kv. Decode at depth 512, AVX-512 and AVX2 (KVSLIM_SIMD=avx2) alternating.
K=${K:-build/kvslim}; O=${O:-/tmp/s17floor}; mkdir -p $O
for r in 1 2 3; do
  for m in q4_k_m q8_0; do
    M=/dev/shm/kv/tinyllama-$m.gguf
    taskset -c 0,1 $K bench -m $M -p 0 --depth 512 -n 128 -r 1 -t 2 --no-progress --floor > $O/avx512-$m-r$r.txt 2>&1
    KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 0 --depth 512 -n 128 -r 1 -t 2 --no-progress --floor > $O/avx2-$m-r$r.txt 2>&1
  done
done

#!/bin/bash
# Session 20, AMD EPYC Zen 5 (family 26), 2 threads, one engine at a time, DAMON off.
# kvslim: this session's build (K); llama.cpp: unslothai/llama.cpp mirror d32676d77 built outside the
# repository, target llama-bench: build/ with GGML_NATIVE=ON (AVX-512), build-avx2/ with GGML_NATIVE=OFF and
# AVX/AVX2/FMA/F16C/BMI2 on, the AVX-512 and AVX-VNNI options off (L = the llama.cpp directory). Q4_K_M and Q8_0 synth TinyLlama files
# (kvslim synth --shape tinyllama-1.1b) in /dev/shm/kv. pp512 and decode at depth 512 (kvslim --floor).
O=${O:-/tmp/s20short}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}
for r in 1 2; do
  for m in q4_k_m q8_0; do
    M=/dev/shm/kv/tinyllama-$m.gguf
    echo "[$(date -u '+%T')] $m round $r" >> $O/log
    taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx512-$m-r$r.txt 2>&1
    taskset -c 0,1 $L/build/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-native-$m-r$r.md 2>/dev/null
    KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/kvslim-avx2-$m-r$r.txt 2>&1
    taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-avx2-$m-r$r.md 2>/dev/null
  done
done
echo "[$(date -u '+%T')] done" >> $O/log
# llama-bench's pp512 in the runs above is at depth 512 (-d applies to every test); the prefill of 512
# tokens from an empty cache, as kvslim's pp512, once more per build and file:
for m in q4_k_m q8_0; do
  for b in build build-avx2; do
    taskset -c 0,1 $L/$b/bin/llama-bench -m /dev/shm/kv/tinyllama-$m.gguf -t 2 -p 512 -n 0 -r 2 -fa 0,1 -o md > $O/llama-$b-$m-pp512-d0.md 2>/dev/null
  done
done
echo "[$(date -u '+%T')] pp512 at depth 0 done" >> $O/log

#!/bin/bash
# Session 24, AMD EPYC Zen 4 (family 25, Genoa), 2 threads, one engine at a time, DAMON off: the AVX2 prefill of
# 16,384 tokens (full f16 cache) and decode after it, kvslim (K, forced AVX2) and llama.cpp (L: unslothai/llama.cpp
# mirror d32676d77, build-avx2/ AVX2-only, -fa 0: its faster setting at this depth, session 23) alternating in the
# order K L K L K L, so that every kvslim run has a llama.cpp run on each side but the first. llama.cpp's untimed
# depth fill is timed from its progress lines by phasetime.py. Synth TinyLlama Q8_0 in /dev/shm/kv.
O=${O:-/tmp/s24d16k}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}; N=${N:-3}
M=/dev/shm/kv/tinyllama-q8_0.gguf; PT="$(dirname "$0")/../depth16384_avx2/phasetime.py"
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
kv() { lg "start kvslim $1"; KVSLIM_SIMD=avx2 /usr/bin/time -v -o $O/kvslim-avx2-$1.time taskset -c 0,1 $K bench -m $M \
  -r 1 -t 2 --no-progress --floor -p 0 --depth 16384 -n 16 --press none --json $O/kvslim-avx2-$1.json \
  > $O/kvslim-avx2-$1.txt 2>&1; lg "end kvslim $1 rc=$?"; }
ll() { lg "start llama fa0 $1"; /usr/bin/time -v -o $O/llama-avx2-fa0-$1.time python3 $PT $O/llama-avx2-fa0-$1.log -- \
  taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress \
  -o md > $O/llama-avx2-fa0-$1.md; lg "end llama fa0 $1"; }
for i in $(seq 1 $N); do kv $i; ll $i; done
lg done

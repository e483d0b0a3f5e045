#!/bin/bash
# Session 23: one more llama.cpp (-fa 0, its faster setting at this depth in run_d16384_pairs.sh) and kvslim AVX2
# prefill of 16,384 tokens after run_d16384_pairs.sh, in the order L, K, L (same method and files).
O=${O:-/tmp/s23d16k}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}
M=/dev/shm/kv/tinyllama-q8_0.gguf; PT="$(dirname "$0")/../depth16384_avx2/phasetime.py"
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
kv() { lg "start kvslim $1"; KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor -p 0 \
  --depth 16384 -n 16 --press none --json $O/kvslim-avx2-$1.json > $O/kvslim-avx2-$1.txt 2>&1; lg "end kvslim $1 rc=$?"; }
ll() { lg "start llama fa0 $1"; python3 $PT $O/llama-avx2-fa0-$1.log -- taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M \
  -t 2 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress -o md > $O/llama-avx2-fa0-$1.md; lg "end llama fa0 $1"; }
ll 2; kv 4; ll 3
lg done

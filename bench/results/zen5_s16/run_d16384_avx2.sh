#!/bin/bash
# Session 16, AMD EPYC Zen 5 (family 26 model 2), 2 threads, one engine at a time, DAMON on as given: decode at
# depth 16,384 at the AVX2 level (the target closest to its bound in session 14: mean 1.77x, median 2.24x), full
# f16 cache and SnapKV 0.75 (chunks of 1,024), kvslim 751eb62 (/work/ext/kvslim-s16f, KVSLIM_SIMD=avx2) against
# llama.cpp 82bb48500 build-avx2 (-fa 0; its untimed depth fill timed by phasetime.py). Q8_0 synth TinyLlama in /dev/shm.
O=${O:-/tmp/s16d16k}; mkdir -p $O; K=/work/ext/kvslim-s16f; L=/work/ext/llama-up; M=/dev/shm/kv/tinyllama-q8_0.gguf
cp "$(dirname "$0")/../depth16384_avx2/phasetime.py" $O/
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
kv() { n=$1; shift; lg "start kvslim avx2 $n"; KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor --json $O/kvslim-avx2-$n.json "$@" > $O/kvslim-avx2-$n.txt 2>&1; lg "end kvslim avx2 $n rc=$?"; }
kv d16384-full -p 0 --depth 16384 -n 16 --press none
lg "start llama build-avx2 d16384"
python3 $O/phasetime.py $O/llama-build-avx2-d16384.log -- taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress -o md > $O/llama-build-avx2-d16384.md
lg "end llama build-avx2 d16384"
kv d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
lg done

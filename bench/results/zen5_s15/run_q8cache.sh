#!/bin/bash
# Session 15, AMD EPYC Zen 5 (family 26 model 2), 2 threads, one engine at a time, DAMON on as given.
# Decode at depth 4,096 with a q8_0 KV cache against an f16 one: kvslim before (/work/ext/kvslim-s14,
# a33c1c8, same attention as b8742ce) and after (/work/ext/kvslim-s15, this session), llama.cpp
# 82bb48500 (-fa 1: llama.cpp needs flash attention for a quantized V cache). Q8_0 synth TinyLlama-1.1B
# in /dev/shm/kv. AVX2 rows: KVSLIM_SIMD=avx2 and llama.cpp's build-avx2.
O=${O:-/tmp/s15}; L=/work/ext/llama-up; M=/dev/shm/kv/tinyllama-q8_0.gguf
mkdir -p $O
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) damon $(cat /sys/kernel/mm/damon/admin/kdamonds/0/state)] $*" >> $O/log; }
kv() { bin=$1; lvl=$2; ct=$3; lg "start $bin $lvl $ct"; KVSLIM_SIMD=$lvl taskset -c 0,1 /work/ext/$bin bench -m $M -r 1 -t 2 --no-progress -p 0 --depth 4096 -n 16 --press none -ctk $ct -ctv $ct --json $O/$bin-$lvl-$ct.json > $O/$bin-$lvl-$ct.txt 2>&1; lg "end rc=$?"; }
ll() { b=$1; ct=$2; lg "start llama $b $ct"; taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -fa 1 -ctk $ct -ctv $ct -p 0 -n 16 -d 4096 -r 1 -o md > $O/llama-$b-$ct.md 2>/dev/null; lg "end llama"; }
for p in avx512:build avx2:build-avx2; do
  lvl=${p%%:*}; b=${p##*:}
  kv kvslim-s15 $lvl q8_0
  kv kvslim-s14 $lvl q8_0
  kv kvslim-s15 $lvl f16
  ll $b q8_0
  ll $b f16
done
lg done

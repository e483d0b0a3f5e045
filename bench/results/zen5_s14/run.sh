#!/bin/bash
# Session 14, AMD EPYC Zen 5 (family 26 model 2), 2 threads, one engine at a time, DAMON on as given.
# kvslim a33c1c8 (/work/ext/kvslim-s14: this session's decode changes); llama.cpp 82bb48500: build (native,
# AVX-512) and build-avx2; -fa 0 at depth, -fa 0,1 for the short tests. kvslim decode rows with --floor.
# Files: kvslim synth --shape tinyllama-1.1b --type q8_0|q4_k_m in /dev/shm/kv.
# phasetime.py: bench/results/depth16384_avx2/phasetime.py, copied into $O before the run.
O=/tmp/s14/out; K=/work/ext/kvslim-s14; L=/work/ext/llama-up
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) damon $(cat /sys/kernel/mm/damon/admin/kdamonds/0/state)] $*" >> $O/log; }
kv() { lvl=$1; n=$2; shift 2; lg "start kvslim $lvl $n"; KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor --json $O/kvslim-$lvl-$n.json "$@" > $O/kvslim-$lvl-$n.txt 2>&1; lg "end kvslim $lvl $n rc=$?"; }
ll() { b=$1; d=$2; lg "start llama $b d$d"; python3 $O/phasetime.py $O/llama-$b-d$d.log -- taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d $d -r 1 --no-warmup --progress -o md > $O/llama-$b-d$d.md; lg "end llama $b d$d"; }
for m in q8_0 q4_k_m; do
  M=/dev/shm/kv/tinyllama-$m.gguf
  lg "short $m"
  taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor --json $O/short-kvslim-avx512-$m.json > $O/short-kvslim-avx512-$m.txt 2>&1
  taskset -c 0,1 $L/build/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/short-llama-native-$m.md 2>/dev/null
  KVSLIM_SIMD=avx2 taskset -c 0,1 $K bench -m $M -p 512 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor --json $O/short-kvslim-avx2-$m.json > $O/short-kvslim-avx2-$m.txt 2>&1
  taskset -c 0,1 $L/build-avx2/bin/llama-bench -m $M -t 2 -p 512 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/short-llama-avx2-$m.md 2>/dev/null
done
M=/dev/shm/kv/tinyllama-q8_0.gguf
for p in avx2:build-avx2 avx512:build; do
  lvl=${p%%:*}; b=${p##*:}
  kv $lvl d4096-full -p 0 --depth 4096 -n 16 --press none
  ll $b 4096
  kv $lvl d4096-snap -p 0 --depth 4096 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
done
# 16,384 at the AVX2 level only (its decode ratio, 2.14x in session 13, was the one closest to its target).
kv avx2 d16384-full -p 0 --depth 16384 -n 16 --press none
ll build-avx2 16384
kv avx2 d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
lg done

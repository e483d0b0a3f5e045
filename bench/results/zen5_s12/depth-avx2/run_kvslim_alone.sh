#!/bin/bash
# Session 12, AMD EPYC Zen 5, kvslim decode tests at depth, level avx2, one thread (no llama.cpp running; the other level's kvslim script on the other core, compute-bound fills).
O=/tmp/s12/depth-avx2/alone; K=/work/ext/kvslim-s12b; M=/dev/shm/kv/tinyllama-q8_0.gguf; CORE=${CORE:-1}
mkdir -p $O
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; KVSLIM_SIMD=avx2 /usr/bin/time -v taskset -c $CORE $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run d4096-full -p 0 --depth 4096 -n 16 --press none
run d4096-snap -p 0 --depth 4096 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run d16384-full -p 0 --depth 16384 -n 16 --press none
lg "kvslim done"

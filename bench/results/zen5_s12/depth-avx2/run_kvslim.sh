#!/bin/bash
# Session 12, AMD EPYC Zen 5 (family 26 model 2), kvslim 511462e at KVSLIM_SIMD=avx2, one thread on core 1, beside run_llama.sh on core 0.
O=/tmp/s12/depth-avx2; K=/work/ext/kvslim-s12; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; KVSLIM_SIMD=avx2 /usr/bin/time -v taskset -c 1 $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run d16384-full -p 0 --depth 16384 -n 16 --press none
run d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run d4096-full -p 0 --depth 4096 -n 16 --press none
run d4096-snap -p 0 --depth 4096 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run pp4096 -p 4096 --depth 0 -n 0 --press none
lg "kvslim done"

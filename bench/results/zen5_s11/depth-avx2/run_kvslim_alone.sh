#!/bin/bash
# Session 11: kvslim's depth tests again, each alone on the machine (nothing on the other core), because beside
# llama.cpp's 16K fill (which streams its full score matrices) kvslim's decode at depth ran 2-3x slower than its
# median suggests. Same binary, level and thread as run_kvslim.sh.
O=/tmp/s11/depth-alone; K=${K:-/work/ext/kvslim-s11/kvslim}; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; KVSLIM_SIMD=avx2 /usr/bin/time -v taskset -c 1 $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run d4096-full -p 0 --depth 4096 -n 32 --press none
run d4096-snap -p 0 --depth 4096 -n 32 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run d16384-full -p 0 --depth 16384 -n 16 --press none
run d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024

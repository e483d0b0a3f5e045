#!/bin/bash
# Session 9: kvslim 3e02ac2 (T1 prefetch) depth 16,384 full cache and SnapKV, alone on core 1 (core 0 idle or light editing).
O=/work/ext/d-s9; K=/work/ext/kvslim-s9-3e02ac2; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; /usr/bin/time -v taskset -c 1 $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run 3e02ac2-d16384-full -p 0 --depth 16384 -n 16 --press none
run 3e02ac2-d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
run 3e02ac2-d4096-snap -p 0 --depth 4096 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024

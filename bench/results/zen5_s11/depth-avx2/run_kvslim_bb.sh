#!/bin/bash
# Session 11: after dbd86be (KV buffers grown by realloc), kvslim's full-cache decode tests again, alone on the
# machine, same level and thread as run_kvslim.sh.
O=/tmp/s11/depth-bb; K=${K:-/work/ext/kvslim-s11/kvslim-bb}; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; KVSLIM_SIMD=avx2 /usr/bin/time -v taskset -c 1 $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run d4096-full -p 0 --depth 4096 -n 32 --press none
run d16384-full -p 0 --depth 16384 -n 16 --press none

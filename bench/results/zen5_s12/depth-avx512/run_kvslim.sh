#!/bin/bash
# Session 12, AMD EPYC Zen 5 (family 26 model 2), kvslim 598d9f7 (AVX-512 attention kernels) at its native level (avx512), one thread on core 1, beside run_llama.sh on core 0: prefill tests only (decode tests run alone, run_kvslim_alone.sh).
O=/tmp/s12/depth-avx512; K=/work/ext/kvslim-s12b; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
run() { n=$1; shift; lg "start kvslim $n"; /usr/bin/time -v taskset -c 1 $K bench -m $M -r 1 -t 1 --no-progress --json $O/kvslim-$n.json "$@" > $O/kvslim-$n.txt 2> $O/kvslim-$n.time; lg "end kvslim $n rc=$?"; }
run pp16384 -p 16384 --depth 0 -n 0 --press none
run pp4096 -p 4096 --depth 0 -n 0 --press none
lg "kvslim done"

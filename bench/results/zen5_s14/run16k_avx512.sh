#!/bin/bash
# Session 14, second run (10:30 UTC): depth 16,384 at the AVX-512 level, as run.sh's AVX2 16K part (same binaries).
O=/tmp/s14b/out; K=/work/ext/kvslim-s14; L=/work/ext/llama-up; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg) damon $(cat /sys/kernel/mm/damon/admin/kdamonds/0/state)] $*" >> $O/log; }
kv() { lvl=$1; n=$2; shift 2; lg "start kvslim $lvl $n"; KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor --json $O/kvslim-$lvl-$n.json "$@" > $O/kvslim-$lvl-$n.txt 2>&1; lg "end kvslim $lvl $n rc=$?"; }
ll() { b=$1; d=$2; lg "start llama $b d$d"; python3 $O/phasetime.py $O/llama-$b-d$d.log -- taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d $d -r 1 --no-warmup --progress -o md > $O/llama-$b-d$d.md; lg "end llama $b d$d"; }
kv avx512 d16384-full -p 0 --depth 16384 -n 16 --press none
ll build 16384
kv avx512 d16384-snap -p 0 --depth 16384 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
lg done

#!/bin/bash
# Session 20, AMD EPYC Zen 5 (family 26), 2 threads, one engine at a time, DAMON off: decode at depth 4,096
# (full f16 cache and SnapKV 0.75 with compression after every 1,024-token chunk), kvslim (K, this session's
# build) at AVX-512 and forced AVX2 against llama.cpp (unslothai/llama.cpp mirror d32676d77) native and AVX2-only
# builds (-fa 0, its untimed depth fill timed by phasetime.py from bench/results/depth16384_avx2/). Q8_0 synth
# TinyLlama in /dev/shm/kv.
O=${O:-/tmp/s20d4k}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}; M=/dev/shm/kv/tinyllama-q8_0.gguf
cp "$(dirname "$0")/../depth16384_avx2/phasetime.py" $O/
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
kv() { lvl=$1; n=$2; shift 2; lg "start kvslim $lvl $n"; KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor --json $O/kvslim-$lvl-$n.json "$@" > $O/kvslim-$lvl-$n.txt 2>&1; lg "end kvslim $lvl $n rc=$?"; }
ll() { b=$1; d=$2; lg "start llama $b d$d"; python3 $O/phasetime.py $O/llama-$b-d$d.log -- taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d $d -r 1 --no-warmup --progress -o md > $O/llama-$b-d$d.md; lg "end llama $b d$d"; }
for p in avx512:build avx2:build-avx2; do
  lvl=${p%%:*}; b=${p##*:}
  kv $lvl d4096-full -p 0 --depth 4096 -n 16 --press none
  ll $b 4096
  kv $lvl d4096-snap -p 0 --depth 4096 -n 16 --press snapkv --compression-ratio 0.75 --chunk-size 1024
done
lg done

#!/bin/bash
# Session 21, AMD EPYC Zen 4 (family 25, Genoa), 2 threads, one engine at a time, DAMON off: decode at depth
# $DEPTH (default 16,384) with the full f16 cache and with SnapKV 0.75 (compression after every 1,024-token
# chunk), kvslim (K) at the levels in $LEVELS (default avx512) against llama.cpp (L: unslothai/llama.cpp mirror
# d32676d77; build/ native, build-avx2/ AVX2-only), -fa 0, its untimed depth fill timed from its progress lines
# by phasetime.py (bench/results/depth16384_avx2/). Q8_0 synth TinyLlama in /dev/shm/kv.
DEPTH=${DEPTH:-16384}; LEVELS=${LEVELS:-avx512}
O=${O:-/tmp/s21d$DEPTH}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}
M=/dev/shm/kv/tinyllama-q8_0.gguf; PT="$(dirname "$0")/../depth16384_avx2/phasetime.py"
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
for lvl in $LEVELS; do
  b=build; [ $lvl = avx2 ] && b=build-avx2
  for press in none snapkv; do
    args=(--press none); [ $press = snapkv ] && args=(--press snapkv --compression-ratio 0.75 --chunk-size 1024)
    lg "start kvslim $lvl $press"
    KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -r 1 -t 2 --no-progress --floor -p 0 --depth $DEPTH -n 16 \
      "${args[@]}" --json $O/kvslim-$lvl-$press.json > $O/kvslim-$lvl-$press.txt 2>&1
    lg "end kvslim $lvl $press rc=$?"
  done
  lg "start llama $b"
  python3 $PT $O/llama-$b.log -- taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -fa 0 -p 0 -n 16 -d $DEPTH -r 1 \
    --no-warmup --progress -o md > $O/llama-$b.md
  lg "end llama $b"
done
lg done

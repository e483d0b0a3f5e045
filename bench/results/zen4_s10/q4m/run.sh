#!/bin/bash
# Q4_K_M only, 2 threads, alternating: kvslim avx512 (native), llama.cpp native, kvslim KVSLIM_SIMD=avx2, llama.cpp
# build-avx2. pp512 at depth 0 and decode at 512; llama.cpp -fa 0,1 (better counts).
O=/tmp/s10/q4m; K=/work/ext/kvslim-s10; LN=/work/ext/llama-up/build/bin/llama-bench; LA=/work/ext/llama-up/build-avx2/bin/llama-bench
M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in $(seq ${R:-2}); do
  for lv in avx512 avx2; do
    L=$LN; [ $lv = avx2 ] && L=$LA
    echo "== $(date +%T) r$r $lv kvslim"; KVSLIM_SIMD=$lv $K bench -m $M -p 512 --depth 512 -n 32 -t 2 -r 3 --no-progress > $O/kv-$lv-r$r.txt 2>&1
    echo "== $(date +%T) r$r $lv llama"; $L -m $M -t 2 -p 512 -n 0 -d 0 -fa 0,1 -r 3 -o md > $O/ll-$lv-pp-r$r.txt 2>&1
    $L -m $M -t 2 -p 0 -n 32 -d 512 -fa 0,1 -r 3 -o md > $O/ll-$lv-tg-r$r.txt 2>&1
  done
done
echo "== $(date +%T) done"

#!/bin/bash
# Q4_K_M decode at 512 only, 2 threads, alternating: kvslim avx512 / llama.cpp native / kvslim avx2 / llama.cpp build-avx2.
O=/tmp/s10/q4d; K=/work/ext/kvslim-s10; LN=/work/ext/llama-up/build/bin/llama-bench; LA=/work/ext/llama-up/build-avx2/bin/llama-bench
M=/dev/shm/kv/tinyllama-q4_k_m.gguf
for r in $(seq ${R:-4}); do
  for lv in avx512 avx2; do
    L=$LN; [ $lv = avx2 ] && L=$LA
    echo "== $(date +%T) r$r $lv"
    KVSLIM_SIMD=$lv $K bench -m $M -p 0 --depth 512 -n 32 -t 2 -r 3 --no-progress > $O/kv-$lv-r$r.txt 2>&1
    $L -m $M -t 2 -p 0 -n 32 -d 512 -fa 0,1 -r 3 -o md > $O/ll-$lv-r$r.txt 2>&1
  done
done
echo "== $(date +%T) done"

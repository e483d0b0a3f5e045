#!/bin/bash
# Session 11, AMD EPYC Zen 5 (family 26 model 2), 2 threads, models in /dev/shm, alternating in each round:
# kvslim at avx512 (native), llama.cpp native (GGML_NATIVE: AVX-512 + AVX-VNNI), kvslim at KVSLIM_SIMD=avx2,
# llama.cpp build-avx2 (GGML_NATIVE=OFF, AVX2/FMA/F16C/BMI2 only), kvslim at KVSLIM_SIMD=avxvnni.
# pp512 at depth 0 and decode (tg32) at depth 512; llama.cpp -fa 0,1 (the better counts).
O=${O:-/tmp/s11/short}; K=/work/ext/kvslim-s11/kvslim; LN=/work/ext/llama-up/build/bin/llama-bench
LA=/work/ext/llama-up/build-avx2/bin/llama-bench
for r in $(seq ${R:-2}); do
  for t in q8_0 q4_k_m; do
    M=/dev/shm/kv/tinyllama-$t.gguf
    for step in kv-avx512 ll-native kv-avx2 ll-avx2 kv-avxvnni; do
      echo "== $(date -u +%T) r$r $t $step load $(cut -d' ' -f1 /proc/loadavg)"
      case $step in
        kv-*) KVSLIM_SIMD=${step#kv-} $K bench -m $M -p 512 --depth 512 -n 32 -t 2 -r 3 --no-progress > $O/$step-$t-r$r.txt 2>&1 ;;
        ll-*) L=$LN; [ $step = ll-avx2 ] && L=$LA
              $L -m $M -t 2 -p 512 -n 0 -d 0 -fa 0,1 -r 3 -o md > $O/$step-pp-$t-r$r.txt 2>&1
              $L -m $M -t 2 -p 0 -n 32 -d 512 -fa 0,1 -r 3 -o md > $O/$step-tg-$t-r$r.txt 2>&1 ;;
      esac
    done
  done
done
echo "== $(date -u +%T) done"

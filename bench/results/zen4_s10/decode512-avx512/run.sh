#!/bin/bash
# Alternating decode@512 Q4_K_M, 2 threads: kvslim (new), kvslim (base = main 91e137a), llama.cpp 82bb48500
O=/tmp/s10/e2e; L=/work/ext/llama-up/build/bin/llama-bench; T=${T:-q4_k_m}
cd /dev/shm/kv
for r in $(seq ${R:-3}); do
  for v in new base; do
    K=/work/build/rel/kvslim; [ $v = base ] && K=/tmp/s10/v/base/kvslim
    $K bench -m tinyllama-$T.gguf -p 0 --depth 512 -n 32 -t 2 -r 3 --no-progress > $O/$v-$T-r$r.txt 2>&1
    echo "r$r $(date +%T) $v $(grep -o 'tg32 @ d512 |[^|]*' $O/$v-$T-r$r.txt | head -1)"
  done
  $L -m tinyllama-$T.gguf -t 2 -p 0 -n 32 -d 512 -fa 0,1 -r 3 -o md > $O/ll-$T-r$r.txt 2>&1
  echo "r$r $(date +%T) llama $(grep tg32 $O/ll-$T-r$r.txt | awk -F'|' '{print $7, $9}' | tr '\n' ' ')"
done

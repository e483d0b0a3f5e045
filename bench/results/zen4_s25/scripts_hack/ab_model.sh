#!/bin/bash
O=${O:-/work/s25/model_ab}; mkdir -p $O; K=/work/build/rel/kvslim
for r in $(seq 1 ${R:-3}); do
  for m in q4_k_m q8_0; do
    for lvl in avx512 avx2; do
      for v in pf nopf; do
        if [ $v = nopf ]; then export XA1=0 XS=0; else unset XA1 XS; fi
        KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m /dev/shm/kv/tinyllama-$m.gguf -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/$m-$lvl-$v-r$r.txt 2>&1
        echo "r$r $m $lvl $v $(grep -o 'tg32 @ d512: [0-9.]*' $O/$m-$lvl-$v-r$r.txt | head -1) | $(grep -o 'paired read floor.*' $O/$m-$lvl-$v-r$r.txt | grep -o '[0-9]*% median token.*GB/s)')" >> $O/summary
      done
    done
  done
done

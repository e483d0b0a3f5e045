#!/bin/bash
# M: the synth file (q4_k_m, default, or q8_0 for own_acts_ab/summary_q8_0.txt). XQ=1 selected the old path in the
# temporary build (see ../notes.txt section 6).
O=${O:-/work/s25/qab}; mkdir -p $O; K=/work/build/rel/kvslim
for r in $(seq 1 ${R:-8}); do
  for lvl in avx512 avx2; do
    for v in old new; do
      if [ $v = old ]; then export XQ=1; else unset XQ; fi
      KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m /dev/shm/kv/tinyllama-${M:-q4_k_m}.gguf -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress --floor > $O/$lvl-$v-r$r.txt 2>&1
      echo "r$r $lvl $v $(grep -o 'tg32 @ d512: [0-9.]*' $O/$lvl-$v-r$r.txt | head -1) | $(grep -o '[0-9]*% median token / [0-9]*% total' $O/$lvl-$v-r$r.txt) | $(grep -o 'reads [0-9.-]* GB/s' $O/$lvl-$v-r$r.txt) | $(grep -o 'hand-off.*: [0-9]* / [0-9]* ns' $O/$lvl-$v-r$r.txt | grep -o '[0-9]* / [0-9]* ns')" >> $O/summary
    done
  done
done

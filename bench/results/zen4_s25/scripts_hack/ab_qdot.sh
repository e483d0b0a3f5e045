#!/bin/bash
# one thread, streamed: none vs ahead alternating
O=/work/s25/qdot_ab.txt
for r in $(seq 1 ${R:-20}); do
  for p in none ahead; do
    line="$(date -u +%T) r$r $p:"
    for t in "q4_K 131072" "q6_K 78120" "q8_0 65536"; do set -- $t
      line="$line $1 $(KVSLIM_PREFETCH=$p taskset -c 0 /work/build/rel/qdot_bench $1 $2 2048 1 5 2>&1 | tail -1 | grep -o '[0-9.]* GMAC/s' | cut -d' ' -f1)"
    done
    echo "$line" >> $O
  done
done

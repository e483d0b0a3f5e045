#!/bin/bash
O=/work/s25/gsb2; mkdir -p $O
for r in $(seq 1 ${R:-8}); do
  for c in none ahead; do
    if [ $c = none ]; then export XN=1 XS=0; else unset XN XS; fi
    taskset -c 0,1 /work/build/rel/gemv_stream_bench 2 4 > $O/r$r-$c.txt 2>&1
    awk -v c="$c" -v r=$r '/^ +[0-9]+ /{rd+=$5; tm+=$10; n++} END{printf "r%d %s read %.1f tm-gemv/read %.3f\n", r, c, rd/n, tm/n}' $O/r$r-$c.txt >> $O/summary
  done
done

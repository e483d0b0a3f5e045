#!/bin/bash
# rotate prefetch configs through gemv_stream_bench; log tm-gemv/read and read GB/s
O=/work/s25/gsb; mkdir -p $O
for r in $(seq 1 ${R:-8}); do
  for c in "4 0" "2 8" "4 12" "2 16"; do
    set -- $c
    XA1=$1 XA2=$2 taskset -c 0,1 /work/build/rel/gemv_stream_bench 2 4 > $O/r$r-$1-$2.txt 2>&1
    awk -v c="$1/$2" -v r=$r '/^ +[0-9]+ /{rd+=$5; tm+=$10; n++} END{printf "r%d %s read %.1f tm-gemv/read %.3f\n", r, c, rd/n, tm/n}' $O/r$r-$1-$2.txt >> $O/summary
  done
done

#!/bin/bash
# Decode A/B at depth 4,096: main f29c9ff (session 7's quiet-run binary) vs ebad3a5, both at once on the two cores,
# cores swapped in the second round. One thread each, Q8_0 in /dev/shm.
M=/dev/shm/kvslim-speed/tinyllama-q8_0.gguf; O=/work/ext/dec-ab-s8; mkdir -p $O
B=/work/ext/kvslim-final-f29c9ff; N=/work/ext/kvslim-s8-ebad3a5
run() { taskset -c $2 $1 bench -m $M -p 0 --depth 4096 -n 32 -r 1 -t 1 --no-progress --json $O/$3.json > $O/$3.txt 2>&1; }
for r in 1 2; do
  if [ $r = 1 ]; then cb=0; cn=1; else cb=1; cn=0; fi
  echo "[$(date -u '+%T') load $(cut -d' ' -f1-3 /proc/loadavg)] round $r" >> $O/log
  run $B $cb base-r$r & run $N $cn new-r$r & wait
done
echo "[$(date -u '+%T')] done" >> $O/log

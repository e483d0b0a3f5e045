#!/bin/bash
# Q4_K_M only, 3 more alternating rounds, final binary.
O=/tmp/s9/short3; K=/work/ext/kvslim-s9-2710293; L=/work/ext/llama-up/build/bin/llama-bench
cd /dev/shm/kv
for round in 4 5 6; do t=q4_k_m
  echo "== $(date +%T) round $round $t kvslim load $(cut -d' ' -f1 /proc/loadavg)"
  $K bench -m tinyllama-$t.gguf -p 512 --depth 512 -n 16 -t 2 -r 3 --no-progress > $O/kv-$t-r$round.txt 2>&1
  echo "== $(date +%T) round $round $t llama load $(cut -d' ' -f1 /proc/loadavg)"
  $L -m tinyllama-$t.gguf -t 2 -p 512 -n 16 -d 0,512 -fa 0,1 -r 3 -o md > $O/ll-$t-r$round.txt 2>&1
done
echo done $(date +%T)

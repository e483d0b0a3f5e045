#!/bin/bash
# Depth 16,384, Q8_0, one thread, kvslim bench (binary $K): the fill of 16,384 tokens ("fill d16384",
# the prefill of 16,384 tokens) and 16 decode steps, full f16 cache, then SnapKV 0.75 with compression
# after every 1,024-token chunk. Each under /usr/bin/time -v (process CPU time, peak RSS).
M=/dev/shm/kvslim-speed/tinyllama-q8_0.gguf; O=/work/ext/d16384
K=${K:-/work/ext/kvslim-speed-748e204}; TAG=${TAG:-748e204}
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
full() { /usr/bin/time -v $K bench -m $M -p 0 --depth 16384 -n 16 -r 1 -t 1 --press none --no-progress --json $O/kvslim-$TAG-full.json > $O/kvslim-$TAG-full.txt 2> $O/kvslim-$TAG-full.time; }
snap() { /usr/bin/time -v $K bench -m $M -p 0 --depth 16384 -n 16 -r 1 -t 1 --press snapkv --compression-ratio 0.75 --chunk-size 1024 --no-progress --json $O/kvslim-$TAG-snap.json > $O/kvslim-$TAG-snap.txt 2> $O/kvslim-$TAG-snap.time; }
pp() { /usr/bin/time -v $K bench -m $M -p 16384 --depth 0 -n 0 -r 1 -t 1 --press none --no-progress > $O/kvslim-$TAG-pp.txt 2> $O/kvslim-$TAG-pp.time; }
for s in ${STEPS:-full snap}; do lg "start kvslim $TAG $s"; $s; lg "end kvslim $TAG $s rc=$?"; done

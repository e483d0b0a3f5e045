#!/bin/bash
# Session 7: depth 16,384, Q8_0, one thread, kvslim bench (binary $K), as bench/results/depth16384_avx2/run_kvslim.sh.
M=/dev/shm/kvslim-speed/tinyllama-q8_0.gguf; O=${O:-/work/ext/d16384-s7}
K=${K:-/work/ext/kvslim-speed-676b21c}; TAG=${TAG:-676b21c}
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
full() { /usr/bin/time -v $K bench -m $M -p 0 --depth 16384 -n 16 -r 1 -t 1 --press none --no-progress --json $O/kvslim-$TAG-full.json > $O/kvslim-$TAG-full.txt 2> $O/kvslim-$TAG-full.time; }
snap() { /usr/bin/time -v $K bench -m $M -p 0 --depth 16384 -n 16 -r 1 -t 1 --press snapkv --compression-ratio 0.75 --chunk-size 1024 --no-progress --json $O/kvslim-$TAG-snap.json > $O/kvslim-$TAG-snap.txt 2> $O/kvslim-$TAG-snap.time; }
for s in ${STEPS:-full snap}; do lg "start kvslim $TAG $s"; $s; lg "end kvslim $TAG $s rc=$?"; done

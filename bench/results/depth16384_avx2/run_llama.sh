#!/bin/bash
# Depth 16,384, Q8_0, one thread, llama.cpp 91f8c9c5f llama-bench, flash attention off (its faster CPU
# setting at depth). Each run under phasetime.py: stderr progress lines stamped with UTC, load average
# and the process CPU time so far; total CPU from wait4 at exit.
M=/dev/shm/kvslim-speed/tinyllama-q8_0.gguf; O=/work/ext/d16384
L=/work/ext/llama.cpp-91f8c9c5f/build/bin/llama-bench
P="python3 $O/phasetime.py"
dec() { $P $O/llama-tg16-d16384-fa0.log -- $L -m $M -t 1 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress -o md > $O/llama-tg16-d16384-fa0.md; }
pp()  { $P $O/llama-pp16384-fa0.log -- $L -m $M -t 1 -fa 0 -p 16384 -n 0 -r 1 --no-warmup --progress -o md > $O/llama-pp16384-fa0.md; }
for s in ${STEPS:-dec pp}; do echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] start $s" >> $O/log; $s; echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] end $s rc=$?" >> $O/log; done

#!/bin/bash
# Session 7: depth 16,384, Q8_0, one thread, llama.cpp 91f8c9c5f llama-bench -fa 0 under phasetime.py.
M=/dev/shm/kvslim-speed/tinyllama-q8_0.gguf; O=${O:-/work/ext/d16384-s7}
L=/work/ext/llama.cpp-91f8c9c5f/build/bin/llama-bench
P="python3 $O/phasetime.py"
echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] start llama dec" >> $O/log
$P $O/llama-tg16-d16384-fa0.log -- $L -m $M -t 1 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress -o md > $O/llama-tg16-d16384-fa0.md
echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] end llama dec rc=$?" >> $O/log

#!/bin/bash
# Session 12, AMD EPYC Zen 5, llama.cpp upstream 82bb48500 build (GGML_NATIVE=ON: -march=native), one thread on core 0, -fa 0.
O=/tmp/s12/depth-avx512; L=/work/ext/llama-up/build/bin/llama-bench; M=/dev/shm/kv/tinyllama-q8_0.gguf
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
lg "start llama d16384"; python3 $O/phasetime.py $O/llama-tg16-d16384-fa0.log -- taskset -c 0 $L -m $M -t 1 -fa 0 -p 0 -n 16 -d 16384 -r 1 --no-warmup --progress -o md > $O/llama-tg16-d16384-fa0.md; lg "end llama d16384"
lg "start llama d4096"; python3 $O/phasetime.py $O/llama-tg16-d4096-fa0.log -- taskset -c 0 $L -m $M -t 1 -fa 0 -p 0 -n 16 -d 4096 -r 1 --no-warmup --progress -o md > $O/llama-tg16-d4096-fa0.md; lg "end llama d4096"
lg "start llama pp4096"; /usr/bin/time -v taskset -c 0 $L -m $M -t 1 -fa 0 -p 4096 -n 0 -r 1 --no-warmup -o md > $O/llama-pp4096-fa0.md 2> $O/llama-pp4096-fa0.time; lg "end llama pp4096"
lg "start llama d4096 fa1"; python3 $O/phasetime.py $O/llama-tg16-d4096-fa1.log -- taskset -c 0 $L -m $M -t 1 -fa 1 -p 0 -n 16 -d 4096 -r 1 --no-warmup --progress -o md > $O/llama-tg16-d4096-fa1.md; lg "end llama d4096 fa1"
lg "start llama pp4096 fa1"; /usr/bin/time -v taskset -c 0 $L -m $M -t 1 -fa 1 -p 4096 -n 0 -r 1 --no-warmup -o md > $O/llama-pp4096-fa1.md 2> $O/llama-pp4096-fa1.time; lg "end llama pp4096 fa1"
lg "llama done"

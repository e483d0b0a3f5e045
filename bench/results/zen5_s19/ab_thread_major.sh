#!/bin/bash
# One binary, decode at 512 (Q4_K_M in /dev/shm/kv), alternating the packing: usage ab_thread_major.sh ROUNDS KVSLIM_BINARY
# usage: dec2.sh ROUNDS BIN : alternates KVSLIM_THREAD_MAJOR=0 and default
n=$1; b=$2; shift 2
for i in $(seq $n); do for tm in 0 1; do
  out=$(KVSLIM_THREAD_MAJOR=$tm taskset -c 0,1 $b bench -m /dev/shm/kv/tinyllama-q4_k_m.gguf -p 0 --depth 512 -n 64 -t 2 -r 2 --floor "$@" 2>&1)
  ts=$(echo "$out" | grep 'tg64' | awk -F'|' '{print $9}' | awk '{print $1}')
  pf=$(echo "$out" | grep 'paired read floor' | grep -o '[0-9]*% median token / [0-9]*% total' | tr -d '%' | awk '{print $1, $5}')
  gb=$(echo "$out" | grep '^read floor' | grep -o 'at [0-9.]* GB/s' | awk '{print $2}')
  echo "tm=$tm $ts $gb $pf"
done; done

#!/bin/bash
# Alternating A/B of two kvslim binaries on Q4_K_M (or M=...) decode at depth 512, 2 threads, with the
# paired read floor and the thread hand-off of every run. A=, B= binaries; N= rounds; O= output folder.
set -u
M=${M:-/dev/shm/kv/tinyllama-q4_k_m.gguf}
N=${N:-6}
O=${O:-ab}
mkdir -p "$O"
for i in $(seq 1 "$N"); do
  for side in A B; do
    bin=${!side}
    "$bin" bench -m "$M" -p 0 --depth 512 -n 32 -r 2 -t 2 --floor > "$O/$side.$i.txt" 2>&1
    t=$(grep -m1 'tg32' "$O/$side.$i.txt" | awk -F'|' '{print $9}')
    pf=$(grep -m1 '^paired' "$O/$side.$i.txt" | grep -o '[0-9]*% median token')
    ho=$(grep -m1 '^thread hand-off' "$O/$side.$i.txt" | grep -o '[0-9]* / [0-9]* ns')
    echo "round $i $side t/s $t paired $pf hand-off $ho"
  done
done | tee "$O/summary.txt"

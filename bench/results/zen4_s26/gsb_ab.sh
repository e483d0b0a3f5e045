#!/bin/bash
# Alternates gemv_stream_bench (2 threads, 4 passes) built against several libraries: B="dir1 dir2 ..."
# (each holding a gemv_stream_bench; tools/build_kv_tools.sh DIR builds it), N rounds. Prints each
# run's mean read GB/s, thread-major plain reads / read and the engine's products / read. The
# placement of the VM's two vCPUs (one chiplet or two) shows in the read rate: ~33-38 GB/s on one,
# 60-70 on two (session 25's notes); pingpong.c measures the hand-off directly.
set -u
for i in $(seq 1 "${N:-8}"); do
  for d in $B; do
    r=$("$d/gemv_stream_bench" 2 4 2>&1 | awk '$1 ~ /^[0-9]+$/ {rd+=$5; tm+=$10; tmaj+=$8; n++}
        END {printf "read %.1f tmajor/read %.2f tm-gemv/read %.2f", rd/n, tmaj/n, tm/n}')
    echo "$i $d $r"
  done
done

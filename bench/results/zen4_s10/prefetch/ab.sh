#!/bin/bash
# ab.sh ROUNDS variants... : best mbench pass GB/s per variant per round (alternating)
# mbench: an earlier form of tools/gemv_stream_bench.cpp (no read pass; mode all|q4|q6), built by variant.sh
R=$1; shift
for r in $(seq $R); do line="r$r"; for v in "$@"; do b=$(/tmp/s10/v/$v/mbench 2 4 all | tail -3 | grep -o '[0-9.]* GB/s' | sort -n | tail -1); line="$line $v=$b"; done; echo $line; done

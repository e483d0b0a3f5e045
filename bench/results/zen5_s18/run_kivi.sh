#!/bin/sh
# Decode with a KIVI cache before and after the in-place KIVI attention (session 18), and with the
# full f16 cache, at one depth, alternating binaries and SIMD levels, 2 threads.
# Usage: OLD=<kvslim before> NEW=<kvslim after> M=<model.gguf> D=<depth> O=<out dir> [ROUNDS=2] [LEVELS="avx512 avx2"] run_kivi.sh
set -e
: "${OLD:?}" "${NEW:?}" "${M:?}" "${D:?}" "${O:?}"
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-"avx512 avx2"}
mkdir -p "$O"
for r in $(seq 1 "$ROUNDS"); do
  for lv in $LEVELS; do
    for b in old new; do
      bin=$OLD; [ "$b" = new ] && bin=$NEW
      KVSLIM_SIMD=$lv taskset -c 0,1 "$bin" bench -m "$M" -p 0 --depth "$D" -n 32 -r 1 -t 2 --kivi-bits 4 \
        > "$O/kivi4-$lv-$b-d$D-r$r.txt" 2>&1
    done
    KVSLIM_SIMD=$lv taskset -c 0,1 "$NEW" bench -m "$M" -p 0 --depth "$D" -n 32 -r 1 -t 2 > "$O/f16-$lv-d$D-r$r.txt" 2>&1
  done
done

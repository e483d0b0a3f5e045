#!/bin/bash
# Session 25, AMD EPYC Zen 4 (family 25), 2 threads, one engine at a time, DAMON off: rounds of decode at depth 512
# for Q4_K_M and Q8_0, kvslim (K) at each weight prefetch setting in PF (default "none ahead": this CPU's default,
# then the setting before 8fd07c8; PF=none for placement/, run after 81048ae, whose --floor names the threads'
# placement), at AVX-512 and forced AVX2, against llama.cpp (L: unslothai/llama.cpp mirror
# d32676d77; build/ native, build-avx2/ AVX2-only; -fa 0 and 1). kvslim --floor: the read rate around every token.
# Synth TinyLlama files in /dev/shm/kv.
O=${O:-/tmp/s25short}; mkdir -p $O; K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}; N=${N:-3}
lg() { echo "[$(date -u '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg)] $*" >> $O/log; }
for r in $(seq 1 $N); do
  for m in q4_k_m q8_0; do
    M=/dev/shm/kv/tinyllama-$m.gguf
    for p in avx512:build avx2:build-avx2; do
      lvl=${p%%:*}; b=${p##*:}
      for pf in ${PF:-none ahead}; do
        lg "$m $lvl prefetch $pf round $r"
        KVSLIM_PREFETCH=$pf KVSLIM_SIMD=$lvl taskset -c 0,1 $K bench -m $M -p 0 --depth 512 -n 32 -r 2 -t 2 --no-progress \
          --floor > $O/kvslim-$lvl-$pf-$m-r$r.txt 2>&1
      done
      lg "$m llama.cpp $b round $r"
      taskset -c 0,1 $L/$b/bin/llama-bench -m $M -t 2 -p 0 -n 32 -d 512 -r 2 -fa 0,1 -o md > $O/llama-$b-$m-r$r.md 2>/dev/null
    done
  done
done
lg done

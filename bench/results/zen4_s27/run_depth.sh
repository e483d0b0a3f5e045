#!/bin/bash
# Session 27, AMD EPYC Zen 4 (family 25), 2 threads, DAMON off: the depth groups of bench_compare.py, run after
# the short group (python3 bench/bench_compare.py ... --groups short --levels native,avx2 --rounds 3 --out short).
# K: kvslim binary; L: llama.cpp checkout (unslothai/llama.cpp mirror d32676d77) with build/ and build-avx2/;
# synth TinyLlama Q8_0 in /dev/shm/kv; O: output folder.
cd "$(dirname "$0")/../../.." || exit 1
K=${K:-/work/build/rel/kvslim}; L=${L:-/work/ext/llama}; O=${O:-/tmp/s27}
C="python3 bench/bench_compare.py --kvslim $K --llama-bench $L/build/bin/llama-bench --llama-bench-avx2 $L/build-avx2/bin/llama-bench --q8_0 /dev/shm/kv/tinyllama-q8_0.gguf"
$C --groups d4096 --levels native,avx2 --rounds 2 --out $O/d4096 > $O/d4096.log 2>&1
$C --groups d16384 --levels avx2 --rounds 2 --out $O/d16384 > $O/d16384.log 2>&1

#!/bin/sh
# Builds the measurement tools (tools/kv_*.cpp, tools/qdot_bench.cpp, tools/gemv_stream_bench.cpp) against the library of a build directory
# (default build-kvquant; configure and build its kvslim_lib target first).
set -e
cd "$(dirname "$0")/.."
B=${1:-build-kvquant}
# The library loads OpenBLAS itself on first use (src/kernels/blas_loader.cpp); only its headers.
for t in kv_attention_bench kv_fidelity qdot_bench gemv_stream_bench; do
  g++ -std=gnu++20 -O2 -Iinclude -Isrc "tools/$t.cpp" -o "$B/$t" \
    -Wl,--whole-archive "$B/libkvslim.a" -Wl,--no-whole-archive \
    -I/usr/include/$(gcc -print-multiarch)/openblas-pthread -ldl \
    $(pkg-config --libs libpcre2-8 cpp-httplib libcrypto hiredis) -lfmt -lpthread
done

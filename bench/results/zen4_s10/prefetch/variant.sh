#!/bin/bash
# variant.sh NAME "extra defines" : builds /tmp/s10/v/NAME/{qdot_bench,mbench,kvslim}
set -e
N=$1; D=$2; B=/work/build/rel; O=/tmp/s10/v/$N; mkdir -p $O; cd /work/main
for f in quant_dot_avx512 quant_dot_avx2; do
/usr/bin/c++ -DFMT_SHARED -DKVSLIM_VERSION=\"0.1.0\" -I/work/main/include -I/work/main/src -isystem /usr/include/x86_64-linux-gnu/openblas-pthread -O2 -DNDEBUG -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare -std=gnu++20 $D -c src/kernels/$f.cpp -o $O/$f.cpp.o
done
cp $B/libkvslim.a $O/lib.a; (cd $O && ar r lib.a quant_dot_avx512.cpp.o quant_dot_avx2.cpp.o)
L="$O/lib.a $(pkg-config --libs openblas libpcre2-8 cpp-httplib libcrypto) -lfmt -lpthread"
g++ -std=gnu++20 -O2 -Iinclude -Isrc tools/qdot_bench.cpp -o $O/qdot_bench -Wl,--whole-archive $O/lib.a -Wl,--no-whole-archive $(pkg-config --libs openblas libpcre2-8 cpp-httplib libcrypto) -lfmt -lpthread
# mbench.cpp is not kept (see ab.sh)
g++ -std=gnu++20 -O2 -Iinclude -Isrc /tmp/s10/mbench.cpp -o $O/mbench $L
cd /work/build/rel && sed -e "s# libkvslim.a # $O/lib.a #" -e "s#-o kvslim #-o $O/kvslim #" CMakeFiles/kvslim.dir/link.txt | sh

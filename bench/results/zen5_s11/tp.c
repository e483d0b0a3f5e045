#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define R12(OP) OP" %12,%0,%0\n\t" OP" %12,%1,%1\n\t" OP" %12,%2,%2\n\t" OP" %12,%3,%3\n\t" OP" %12,%4,%4\n\t" OP" %12,%5,%5\n\t" \
                OP" %12,%6,%6\n\t" OP" %12,%7,%7\n\t" OP" %12,%8,%8\n\t" OP" %12,%9,%9\n\t" OP" %12,%10,%10\n\t" OP" %12,%11,%11\n\t"
#define BENCH(NAME, OP) { __m256i a0=_mm256_set1_epi8(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0,a10=a0,a11=a0; __m256i b=_mm256_set1_epi8(1); \
  double t=now(); long m=50000000; for(long i=0;i<m;i++){ __asm__ volatile(R12(OP) R12(OP) R12(OP) R12(OP) : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9),"+x"(a10),"+x"(a11) : "x"(b)); } \
  double dt=now()-t; printf("%-12s %.2f G/s\n", NAME, m*48/dt/1e9); sink+=_mm256_extract_epi32(a0,0)+_mm256_extract_epi32(a11,0);}
int sink;
__attribute__((target("avx2,fma,avxvnni"))) int main(){
  BENCH("vpaddd", "vpaddd");
  BENCH("vpmaddubsw", "vpmaddubsw");
  BENCH("vpmaddwd", "vpmaddwd");
  BENCH("vpsignb", "vpsignb");
  BENCH("vfmadd231ps", "vfmadd231ps");
  BENCH("vpdpbusd", "vpdpbusd");
  BENCH("vpshufb", "vpshufb");
  return sink;
}

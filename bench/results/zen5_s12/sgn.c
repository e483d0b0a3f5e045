#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// ymm15 = |w|, ymm14 = s (sign mask), ymm13 = w, ymm12 = ones16; per pair: a in ymm(k), acc in ymm(k+4)
#define SIGN(A,T,C) "vpsignb %%ymm13," A "," T "\n\t vpmaddubsw " T ",%%ymm15," T "\n\t vpmaddwd %%ymm12," T "," T "\n\t vpaddd " T "," C "," C "\n\t"
#define XORS(A,T,C) "vpxor %%ymm14," A "," T "\n\t vpsubb %%ymm14," T "," T "\n\t vpmaddubsw " T ",%%ymm15," T "\n\t vpmaddwd %%ymm12," T "," T "\n\t vpaddd " T "," C "," C "\n\t"
#define XSH(A,T,C) "vpxor %%ymm14," A "," T "\n\t vpsubb %%ymm14," T "," T "\n\t vpmaddubsw " T ",%%ymm15," T "\n\t vpslld $16," T ",%%ymm11\n\t vpsrad $16,%%ymm11,%%ymm11\n\t vpsrad $16," T "," T "\n\t vpaddd %%ymm11," C "," C "\n\t vpaddd " T "," C "," C "\n\t"
#define FOUR(M) M("%%ymm0","%%ymm4","%%ymm8") M("%%ymm1","%%ymm5","%%ymm9") M("%%ymm2","%%ymm6","%%ymm10") M("%%ymm3","%%ymm7","%%ymm0")
#define RUN(NAME, M) { double t=now(); long m=20000000; for(long i=0;i<m;i++){ __asm__ volatile(FOUR(M) FOUR(M) :::"xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11"); } double dt=now()-t; printf("%-12s %.2f pairs/ns  cycles/pair@3.5 %.2f\n", NAME, m*8.0/dt/1e9, dt*3.5e9/(m*8.0));}
int main(){ RUN("sign", SIGN); RUN("xor+sub", XORS); RUN("xor+shift", XSH); RUN("sign", SIGN); RUN("xor+sub", XORS); return 0; }

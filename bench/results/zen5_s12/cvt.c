#include <stdio.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define F12 "vfmadd231ps %%ymm14,%%ymm15,%%ymm0\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm1\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm2\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm3\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm4\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm5\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm6\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm7\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm8\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm9\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm10\n\t vfmadd231ps %%ymm14,%%ymm15,%%ymm11\n\t"
#define C1 "vcvtph2ps (%0),%%ymm12\n\t"
#define C1R "vcvtph2ps %%xmm13,%%ymm12\n\t"
#define B1 "vbroadcastss (%0),%%ymm12\n\t"
#define E1 "vmaxps %%ymm14,%%ymm15,%%ymm12\n\t"
#define T1 "vunpcklps %%ymm14,%%ymm15,%%ymm12\n\t"
#define RUN(NAME, BODY, NF, NX) { unsigned short buf[64]={0}; double t=now(); long m=20000000; for(long i=0;i<m;i++){ __asm__ volatile(BODY :: "r"(buf) : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","memory"); } double dt=now()-t; printf("%-28s fma %.2f G/s  other %.2f G/s  cycles/iter@3.46 %.2f\n", NAME, m*(double)NF/dt/1e9, m*(double)NX/dt/1e9, dt*3.46e9/m);}
int main(){
  RUN("fma only x2", F12 F12, 24, 0);
  RUN("cvt(mem) only x8", C1 C1 C1 C1 C1 C1 C1 C1, 0, 8);
  RUN("cvt(reg) only x8", C1R C1R C1R C1R C1R C1R C1R C1R, 0, 8);
  RUN("24 fma + 6 cvt(mem)", F12 C1 C1 C1 F12 C1 C1 C1, 24, 6);
  RUN("24 fma + 6 cvt(reg)", F12 C1R C1R C1R F12 C1R C1R C1R, 24, 6);
  RUN("24 fma + 12 cvt(mem)", F12 C1 C1 C1 C1 C1 C1 F12 C1 C1 C1 C1 C1 C1, 24, 12);
  RUN("24 fma + 6 max", F12 E1 E1 E1 F12 E1 E1 E1, 24, 6);
  RUN("24 fma + 6 unpck", F12 T1 T1 T1 F12 T1 T1 T1, 24, 6);
  return 0;
}

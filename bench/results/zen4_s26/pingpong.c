// One-way hand-off of a cache line between cpu0 and cpu1 (tens of ns: one chiplet; ~170: two).
// gcc -O2 pingpong.c -o pingpong -lpthread
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <time.h>
static _Atomic long flag __attribute__((aligned(64)));
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
#define N 200000
static void* other(void* a){pin(1);for(long i=0;i<N;i++){while(atomic_load(&flag)!=2*i+1);atomic_store(&flag,2*i+2);}return 0;}
int main(){pthread_t t;pin(0);pthread_create(&t,0,other,0);double t0=now();for(long i=0;i<N;i++){atomic_store(&flag,2*i+1);while(atomic_load(&flag)!=2*i+2);}double t1=now();pthread_join(t,0);printf("handoff %.0f ns\n",(t1-t0)/N/2*1e9);}

// Plain read bandwidth: THREADS threads sum a 512 MiB buffer with AVX-512 loads, four times, and print
// GB/s (docs/benchmarks/notes.md, stop 53: whether streaming the weights is bound by the memory).
//   gcc -O2 -mavx512f -pthread tools/bench/read-bandwidth.c -o target/read-bandwidth && target/read-bandwidth 2
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#define N (512UL<<20)
static char *buf; static int nth;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* rd(void*a){long id=(long)a; size_t per=N/nth; __m512i acc=_mm512_setzero_si512();
 for(size_t i=id*per;i<(id+1)*per;i+=64) acc=_mm512_add_epi32(acc,_mm512_load_si512(buf+i));
 int r[16]; _mm512_storeu_si512(r,acc); return (void*)(long)r[0];}
int main(int c,char**v){nth=c>1?atoi(v[1]):1; if(nth<1||nth>8){fprintf(stderr,"threads: 1 to 8\n");return 2;} buf=aligned_alloc(64,N); memset(buf,1,N);
 for(int rep=0;rep<4;rep++){pthread_t t[8]; double s=now(); for(long i=0;i<nth;i++)pthread_create(&t[i],0,rd,(void*)i); for(int i=0;i<nth;i++)pthread_join(t[i],0); double e=now(); printf("%d threads: %.1f GB/s\n",nth,N/(e-s)/1e9);} }

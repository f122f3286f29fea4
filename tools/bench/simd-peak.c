// The peak rate of one core's 512-bit multiply-add instructions, for reading the kernels' profiles
// against (docs/benchmarks.md, issue 26): 12 independent accumulator registers per instruction, so
// only the instruction's throughput bounds the loop. f32 `vfmadd` (16 products), `vpdpbusd` (64
// u8 x s8 products), `vdpbf16ps` (32 bf16 products). Needs a CPU with AVX-512F, VNNI and BF16:
//   gcc -O2 -mavx512f -mavx512bw -mavx512vnni -mavx512bf16 tools/bench/simd-peak.c -o target/simd-peak
//   target/simd-peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 100000000L
#define REP(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11)
int main(void){
  { __m512 x=_mm512_set1_ps(1.0000001f), y=_mm512_set1_ps(0.9999999f);
#define D(i) __m512 a##i=_mm512_set1_ps((float)i);
  REP(D)
  double t0=now();
  for(long n=0;n<N;n++){
#define F(i) a##i=_mm512_fmadd_ps(x,y,a##i);
    REP(F) }
  double t1=now();
#define S(i) s+=_mm512_reduce_add_ps(a##i);
  float s=0; REP(S)
  printf("f32 vfmadd zmm: %.2f G instr/s = %.1f G MAC/s (%g)\n", 12*N/(t1-t0)/1e9, 16*12*N/(t1-t0)/1e9, s); }
  { __m512i u=_mm512_set1_epi8(3), w=_mm512_set1_epi8(2);
#define DI(i) __m512i b##i=_mm512_set1_epi32(i);
  REP(DI)
  double t0=now();
  for(long n=0;n<N;n++){
#define FI(i) b##i=_mm512_dpbusd_epi32(b##i,u,w);
    REP(FI) }
  double t1=now();
#define SI(i) s+=_mm512_reduce_add_epi32(b##i);
  int s=0; REP(SI)
  printf("vpdpbusd zmm: %.2f G instr/s = %.1f G MAC/s (%d)\n", 12*N/(t1-t0)/1e9, 64*12*N/(t1-t0)/1e9, s); }
  { __m512 x=_mm512_set1_ps(1.0000001f), y=_mm512_set1_ps(0.9999999f);
    __m512bh p=_mm512_cvtne2ps_pbh(x,y), q=_mm512_cvtne2ps_pbh(y,x);
#define DB(i) __m512 c##i=_mm512_set1_ps((float)i);
  REP(DB)
  double t0=now();
  for(long n=0;n<N;n++){
#define FB(i) c##i=_mm512_dpbf16_ps(c##i,p,q);
    REP(FB) }
  double t1=now();
#define SB(i) s+=_mm512_reduce_add_ps(c##i);
  float s=0; REP(SB)
  printf("vdpbf16ps zmm: %.2f G instr/s = %.1f G MAC/s (%g)\n", 12*N/(t1-t0)/1e9, 32*12*N/(t1-t0)/1e9, s); }
  return 0;
}

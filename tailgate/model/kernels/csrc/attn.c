/* Decode attention straight from the paged KV pool (fp32 or fp16 pools, AVX2 + FMA + F16C).
 *
 * Each decode row attends over its own key slots, read in place: no gather of K/V into a
 * [B, Hkv, W, D] copy and no padding mask. With torch, the gather (F.embedding) and the masked
 * SDPA over the padded width took ~50 ms of a 186 ms decode step of 16 rows x 256 keys on AMD
 * EPYC (Gemma 3 270M); the keys and values themselves are ~4 MB a layer.
 * Work splits over (row, kv head); each reads every key once for its group of query heads
 * (grouped-query attention). A row's result does not depend on the other rows of the batch.
 * The kernel is bound by reading the pool (16 rows x 257 keys: ~8.4 MB a layer of fp32 K and V,
 * ~0.78 ms a layer, ~11 GB/s on AMD EPYC), so the q8 plan keeps its pools in fp16 (as llama.cpp's
 * default f16 cache does) and converts 8 values at a time with F16C; the arithmetic stays fp32.
 * Per key, K and V are loaded and converted once for the whole group of query heads, the dot
 * products run as independent FMA chains, the softmax's exponentials 8 at a time, and values
 * accumulate in registers per page of keys. 18 layers of 16 rows x 257 fp16 keys (Gemma 3 270M,
 * Intel Xeon, 2 threads; /tmp bench, three alternating pairs): 14.4-16.3 -> 10.2-11.5 ms with
 * each row's keys its own (read from memory), 11.1-13.4 -> 4.9-5.9 ms with keys in cache.
 * Prefetching K ahead and V during the score pass (attn_body.h): 10.7-13.3 -> 6.4-9.4 ms (caches
 * flushed between steps). The body is written once (attn_body.h) and built twice: 8-float AVX2
 * vectors, and 16-float AVX-512 ones for CPUs that have them (half the instructions per key).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define PREFETCH_KEYS 8 /* 4 KB ahead at d = 256 in fp16; 4 was slower, 16 no better */
#define VTILE 16        /* keys per value tile: one KV page */

/* Ask for two key rows of `bytes` each, a cache line at a time. */
static inline __attribute__((always_inline)) void prefetch_row(const char* a, const char* b, int64_t bytes) {
  for (int64_t c = 0; c < bytes; c += 64) {
    _mm_prefetch(a + c, _MM_HINT_T0);
    _mm_prefetch(b + c, _MM_HINT_T0);
  }
}

/* ---- 8 floats: AVX2 + FMA + F16C ---- */

/* 8 pool values from element offset i: fp16 (half != 0) or fp32. */
static inline __attribute__((always_inline)) __m256 load8(const void* pool, int64_t i, int half) {
  return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)pool + i)))
              : _mm256_loadu_ps((const float*)pool + i);
}

static inline float hmax8(__m256 v) {
  float t[8], m = -INFINITY;
  _mm256_storeu_ps(t, v);
  for (int i = 0; i < 8; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

#define VEC __m256
#define LANES 8
#define FN(name) name##_8
#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vbcast(p) _mm256_broadcast_ss(p)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vmax(a, b) _mm256_max_ps(a, b)
#define vloadkv(pool, i, half) load8(pool, i, half)
#define vhsum(v) hsum8(v)
#define vhmax(v) hmax8(v)
#define vmin(a, b) _mm256_min_ps(a, b)
#define vfnma(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define vround(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define vzero_below(x, lo, v) _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), v)
#include "attn_body.h"
#undef VEC
#undef LANES
#undef FN
#undef vzero
#undef vset1
#undef vload
#undef vstore
#undef vbcast
#undef vfma
#undef vadd
#undef vsub
#undef vmul
#undef vmax
#undef vloadkv
#undef vhsum
#undef vhmax
#undef vmin
#undef vfnma
#undef vround
#undef vpow2
#undef vzero_below

/* ---- 16 floats: AVX-512 (F, BW, DQ, VL); chosen in Python from the CPU's flags ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")

static inline __attribute__((always_inline)) __m512 load16(const void* pool, int64_t i, int half) {
  return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)pool + i)))
              : _mm512_loadu_ps((const float*)pool + i);
}

#define VEC __m512
#define LANES 16
#define FN(name) name##_16
#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vbcast(p) _mm512_set1_ps(*(p))
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vmax(a, b) _mm512_max_ps(a, b)
#define vloadkv(pool, i, half) load16(pool, i, half)
#define vhsum(v) _mm512_reduce_add_ps(v)
#define vhmax(v) _mm512_reduce_max_ps(v)
#define vmin(a, b) _mm512_min_ps(a, b)
#define vfnma(a, b, c) _mm512_fnmadd_ps(a, b, c)
#define vround(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define vzero_below(x, lo, v) _mm512_maskz_mov_ps((__mmask16)~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), v)
#include "attn_body.h"
#pragma GCC pop_options

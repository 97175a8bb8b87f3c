/* Paged attention straight from the KV pool (fp32 or fp16 pools, AVX2 + FMA + F16C; AVX-512 too).
 *
 * Each row attends over its own key slots, read in place: no gather of K/V into a [B, Hkv, W, D]
 * copy and no padding mask. With torch, the gather (F.embedding) and the masked SDPA over the
 * padded width took ~50 ms of a 186 ms decode step of 16 rows x 256 keys on AMD EPYC (Gemma 3
 * 270M). The kernel is bound by reading the pool, so the q8 plan keeps its pools in fp16 (as
 * llama.cpp's default f16 cache does), converted 8 or 16 values at a time with F16C; the
 * arithmetic stays fp32.
 *
 * Work splits over (row, span of keys), every head of the row in one task (attn_body.h): a pool
 * slot's record holds all kv heads (hkv x d values), so a task reads whole records, a KV page
 * (16 slots, contiguous) at a time, K and V of the page together, with the next page fetched
 * ahead. Before, a task was (row, kv head) and read d of every hkv x d values of each record: at
 * Llama 3.2 1B's shape (8 kv heads of 64) 128 of every 1024 bytes, and the pool came in at
 * ~10 GB/s where the matmuls read 30 (AMD EPYC Zen 4: 16 rows x 512 keys, 1.7 ms a layer, while
 * the same tasks over contiguous records took 1.2). Keys are scored 4 (AVX2: 2) at a time against
 * 4 query heads of a kv head, and the 16 dot products' lanes summed in one transposing tree.
 * The softmax runs per page with a running max (flash decoding); a row's spans depend on its
 * length alone (up to 8 of at least 64 keys) and merge in order. The body is written once
 * (attn_body.h) and built twice: 8-float AVX2 vectors, and 16-float AVX-512 ones for CPUs that
 * have them (half the instructions per key).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define VTILE 16 /* keys per tile: one KV page */
/* CALL(JB) for a block of `left` query heads of one kv head, at most 4, with JB a constant (the
 * passes keep 4 x JB accumulators in registers). */
#define BY_HEADS(left, CALL)                    \
  switch ((left) >= 4 ? 4 : (int)(left)) {      \
    case 4: CALL(4); break;                     \
    case 3: CALL(3); break;                     \
    case 2: CALL(2); break;                     \
    default: CALL(1); break;                    \
  }
#define ATTN_MAX_SPANS 8
#define ATTN_MIN_SPAN 64
/* The split rows' partial results held at once; rows beyond wait for the next group (a barrier).
 * 512 prompt rows at Gemma 3 270M's shape, Zen 4: 512 KB 3.93-3.97 ms, 4 MB 3.81-3.82, 16 MB
 * 4.43-4.48 (the scratch outgrew the caches), the (row, kv head) kernel 3.76-3.78. */
#define ATTN_GROUP_BYTES (4 << 20)

/* Keys per span of a row of n keys: a whole number of pages, at most ATTN_MAX_SPANS spans, and at
 * least ATTN_MIN_SPAN keys: each span costs a merge and a page's softmax bookkeeping, which prompt
 * rows (short, many, their keys in cache) pay without needing the split. 512 prompt rows at 1B's
 * shape, Zen 4: 32 keys 11.3-11.4 ms, 64 11.1-11.2, 128 10.7-11.1, the (row, kv head) kernel
 * before 10.7-11.5; a decode row of 512 keys still gets 8 spans. */
static inline int64_t attn_span_len(int64_t n) {
  const int64_t per = (n + ATTN_MAX_SPANS - 1) / ATTN_MAX_SPANS, len = (per + 15) / 16 * 16;
  return len < ATTN_MIN_SPAN ? ATTN_MIN_SPAN : len;
}

static inline int64_t attn_spans(int64_t n) { return n <= 0 ? 1 : (n + attn_span_len(n) - 1) / attn_span_len(n); }

/* Ask for two key rows of `bytes` each into L2, a cache line at a time. Into L1 (T0) the same
 * prefetches ran 1.45-1.68 ms against 1.06-1.25 (16 rows x 512 keys at Llama 3.2 1B's shape, Zen 4,
 * two threads, the pool read from memory): each L1 miss holds one of the core's few miss buffers. */
static inline __attribute__((always_inline)) void prefetch_row(const char* a, const char* b, int64_t bytes) {
  for (int64_t c = 0; c < bytes; c += 64) {
    _mm_prefetch(a + c, _MM_HINT_T1);
    _mm_prefetch(b + c, _MM_HINT_T1);
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

/* s[i] = the sum of a[i]'s 8 lanes, i < 8: pairwise horizontal adds, then the halves. */
static inline __attribute__((always_inline)) void sums8(const __m256* a, float* s) {
  const __m256 h0 = _mm256_hadd_ps(a[0], a[1]), h1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h2 = _mm256_hadd_ps(a[4], a[5]), h3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 lo = _mm256_hadd_ps(h0, h1), hi = _mm256_hadd_ps(h2, h3); /* per 128-bit half: a0..3, a4..7 */
  _mm256_storeu_ps(s, _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31)));
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
#define KB 2 /* 8 accumulators: 16 ymm registers hold them, the keys and a query chunk */
#define vsums(acc, s) sums8(acc, s)
#define VNC 2 /* value chunks a pass: 2 x 4 heads of accumulators */
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
#undef KB
#undef vsums
#undef VNC

/* ---- 16 floats: AVX-512 (F, BW, DQ, VL); chosen in Python from the CPU's flags ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")

static inline __attribute__((always_inline)) __m512 load16(const void* pool, int64_t i, int half) {
  return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)pool + i)))
              : _mm512_loadu_ps((const float*)pool + i);
}

/* s[i] = the sum of a[i]'s 16 lanes, i < 16, in four levels of shuffles and adds: 128-bit
 * quarters, then lanes within them. Fed in transposed order (A) so that lane 4q + i of the result,
 * which sums input 4i + q, is a[4q + i]'s sum. */
static inline __attribute__((always_inline)) void sums16(const __m512* a, float* s) {
#define A(m) a[(((m) & 3) << 2) | ((m) >> 2)]
  __m512 x[8], y[4];
  for (int i = 0; i < 8; ++i) /* quarters 0+2 and 1+3: two inputs a vector */
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(A(2 * i), A(2 * i + 1), 0x44),
                         _mm512_shuffle_f32x4(A(2 * i), A(2 * i + 1), 0xEE));
#undef A
  for (int i = 0; i < 4; ++i) /* one quarter an input */
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
  const __m512 z0 = _mm512_add_ps(_mm512_unpacklo_ps(y[0], y[1]), _mm512_unpackhi_ps(y[0], y[1]));
  const __m512 z1 = _mm512_add_ps(_mm512_unpacklo_ps(y[2], y[3]), _mm512_unpackhi_ps(y[2], y[3]));
  _mm512_storeu_ps(s, _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(z0), _mm512_castps_pd(z1))),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(z0), _mm512_castps_pd(z1)))));
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
#define KB 4
#define vsums(acc, s) sums16(acc, s)
#define VNC 4
#include "attn_body.h"
#pragma GCC pop_options

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
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* 8 pool values from element offset i: fp16 (half != 0) or fp32. */
static inline __attribute__((always_inline)) __m256 load8(const void* pool, int64_t i, int half) {
  return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)pool + i)))
              : _mm256_loadu_ps((const float*)pool + i);
}

/* e^x for 8 floats: Cephes' expf (x = n ln2 + r, |r| <= ln2/2, a degree-5 polynomial for e^r,
 * times 2^n through the exponent bits); within ~2 ulp of expf. Inputs below -87.3 give 0, NaN
 * stays NaN. The
 * scalar expf per score was ~40 % of the kernel (16 rows x 257 keys x 4 heads, Xeon, cached KV). */
static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  /* max/min return their second operand when one is NaN: x second, so a NaN score stays NaN
   * (as expf keeps it, and as the sampler then reports) whatever its position in the row */
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* In place: p[t] = e^(p[t] - max) / sum, 8 at a time (the tail through expf). */
static inline void softmax(float* p, int64_t n) {
  int64_t t = 0;
  __m256 vm = _mm256_set1_ps(-INFINITY);
  for (; t + 8 <= n; t += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(p + t));
  float tmp[8], mx = -INFINITY, sum = 0.0f;
  _mm256_storeu_ps(tmp, vm);
  for (int i = 0; i < 8; ++i) mx = tmp[i] > mx ? tmp[i] : mx;
  for (; t < n; ++t) mx = p[t] > mx ? p[t] : mx;
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 vs = _mm256_setzero_ps();
  for (t = 0; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), vmx));
    _mm256_storeu_ps(p + t, e);
    vs = _mm256_add_ps(vs, e);
  }
  for (int64_t u = t; u < n; ++u) sum += (p[u] = expf(p[u] - mx));
  sum += hsum8(vs);
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (t = 0; t + 8 <= n; t += 8) _mm256_storeu_ps(p + t, _mm256_mul_ps(_mm256_loadu_ps(p + t), inv));
  for (; t < n; ++t) p[t] *= 1.0f / sum;
}

#define PREFETCH_KEYS 8 /* 4 KB ahead at d = 256 in fp16; 4 was slower, 16 no better */

/* Ask for two key rows of `bytes` each, a cache line at a time. */
static inline __attribute__((always_inline)) void prefetch_row(const char* a, const char* b, int64_t bytes) {
  for (int64_t c = 0; c < bytes; c += 64) {
    _mm_prefetch(a + c, _MM_HINT_T0);
    _mm_prefetch(b + c, _MM_HINT_T0);
  }
}

/* Scores of JB query heads (rows qr + j*d) against every key of one kv head, two keys at a
 * time: K is loaded and converted once for the JB heads, and the 2 x JB accumulators are
 * independent FMA chains (one chain per dot product was latency-bound: ~4x slower). */
static inline __attribute__((always_inline)) void scores(const float* qr, const void* kpool, const void* vpool, int half,
                                                          const int64_t* sl, int64_t n, int64_t hkv, int64_t h,
                                                          int64_t d, float scale, float* p, int64_t w, const int JB) {
  int64_t t = 0;
  const int64_t esz = half ? 2 : 4;
  for (; t + 1 < n; t += 2) {
    const int64_t k0 = (sl[t] * hkv + h) * d, k1 = (sl[t + 1] * hkv + h) * d;
    /* The pool is read page by page in the rows' own slot order, so the hardware prefetcher
     * loses the stream at every page edge: fetch K a few keys ahead, and this key's V now so the
     * value pass finds it in cache (both streams in flight at once instead of one after the
     * other). 18 layers x 16 rows x 257 fp16 keys, Intel Xeon (AMX), 2 threads, caches flushed
     * between steps, alternating runs: 10.7-13.3 -> 6.4-9.4 ms. */
    if (t + PREFETCH_KEYS + 1 < n)
      prefetch_row((const char*)kpool + (sl[t + PREFETCH_KEYS] * hkv + h) * d * esz,
                   (const char*)kpool + (sl[t + PREFETCH_KEYS + 1] * hkv + h) * d * esz, d * esz);
    prefetch_row((const char*)vpool + k0 * esz, (const char*)vpool + k1 * esz, d * esz);

    __m256 a0[4], a1[4];
    for (int j = 0; j < JB; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
      const __m256 x0 = load8(kpool, k0 + i, half), x1 = load8(kpool, k1 + i, half);
      for (int j = 0; j < JB; ++j) {
        const __m256 qv = _mm256_loadu_ps(qr + j * d + i);
        a0[j] = _mm256_fmadd_ps(qv, x0, a0[j]);
        a1[j] = _mm256_fmadd_ps(qv, x1, a1[j]);
      }
    }
    for (int j = 0; j < JB; ++j) {
      p[j * w + t] = hsum8(a0[j]) * scale;
      p[j * w + t + 1] = hsum8(a1[j]) * scale;
    }
  }
  for (; t < n; ++t) {
    const int64_t k0 = (sl[t] * hkv + h) * d;
    __m256 a0[4];
    for (int j = 0; j < JB; ++j) a0[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
      const __m256 x0 = load8(kpool, k0 + i, half);
      for (int j = 0; j < JB; ++j) a0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + j * d + i), x0, a0[j]);
    }
    for (int j = 0; j < JB; ++j) p[j * w + t] = hsum8(a0[j]) * scale;
  }
}

/* o_j = sum_t p[j][t] V_t for JB heads. Keys go in tiles of 16 (one KV page, 8 KB of fp16
 * values at d = 256, read from memory once and then from L1); within a tile, 16 output floats
 * of the JB heads at a time stay in registers across its keys, and each V chunk is loaded and
 * converted once for the JB heads. (Registers across *all* keys instead read V in 32-byte
 * pieces 16 times over: strided, and twice as slow once the pool is not in cache.) */
#define VTILE 16
static inline __attribute__((always_inline)) void values(const float* p, int64_t w, const void* vpool, int half,
                                                          const int64_t* sl, int64_t n, int64_t hkv, int64_t h,
                                                          int64_t d, float* o, const int JB) {
  memset(o, 0, (size_t)(JB * d) * sizeof(float));
  for (int64_t t0 = 0; t0 < n; t0 += VTILE) {
    const int64_t t1 = t0 + VTILE < n ? t0 + VTILE : n;
    int64_t i0 = 0;
    for (; i0 + 16 <= d; i0 += 16) {
      __m256 a0[4], a1[4];
      for (int j = 0; j < JB; ++j) {
        a0[j] = _mm256_loadu_ps(o + j * d + i0);
        a1[j] = _mm256_loadu_ps(o + j * d + i0 + 8);
      }
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t v = (sl[t] * hkv + h) * d + i0;
        const __m256 x0 = load8(vpool, v, half), x1 = load8(vpool, v + 8, half);
        for (int j = 0; j < JB; ++j) {
          const __m256 pv = _mm256_broadcast_ss(p + j * w + t);
          a0[j] = _mm256_fmadd_ps(pv, x0, a0[j]);
          a1[j] = _mm256_fmadd_ps(pv, x1, a1[j]);
        }
      }
      for (int j = 0; j < JB; ++j) {
        _mm256_storeu_ps(o + j * d + i0, a0[j]);
        _mm256_storeu_ps(o + j * d + i0 + 8, a1[j]);
      }
    }
    if (i0 < d) { /* d % 16 == 8 */
      __m256 a0[4];
      for (int j = 0; j < JB; ++j) a0[j] = _mm256_loadu_ps(o + j * d + i0);
      for (int64_t t = t0; t < t1; ++t) {
        const __m256 x0 = load8(vpool, (sl[t] * hkv + h) * d + i0, half);
        for (int j = 0; j < JB; ++j) a0[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j * w + t), x0, a0[j]);
      }
      for (int j = 0; j < JB; ++j) _mm256_storeu_ps(o + j * d + i0, a0[j]);
    }
  }
}

/* q [b, hq, d]; pools [slots, hkv, d]; slots [b, w] (row i uses its first lens[i]); out [b, hq, d].
 * d must be a multiple of 8 and hq a multiple of hkv. Returns 0, or -1 without scratch memory.
 * Always inlined with a constant `half`, so each exported variant has its own loads; the query
 * heads of a kv head go through in blocks of up to 4 (a constant block size per call, so the
 * accumulators stay in registers). */
static inline __attribute__((always_inline)) int attend(const float* q, const void* kpool, const void* vpool,
                                                        int half, const int64_t* slots, const int64_t* lens,
                                                        int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d,
                                                        float scale, float* out) {
  const int64_t g = hq / hkv;
  int failed = 0;
#pragma omp parallel
  {
    float* p = malloc((size_t)(g * w) * sizeof(float));
    if (!p) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < b * hkv; ++task) {
      if (!p) continue;
      const int64_t row = task / hkv, h = task % hkv, n = lens[row];
      const int64_t* sl = slots + row * w;
      const float* qr = q + (row * hq + h * g) * d;
      float* o = out + (row * hq + h * g) * d;
      for (int64_t j0 = 0; j0 < g; j0 += 4) {
        const float* qj = qr + j0 * d;
        float* pj = p + j0 * w;
        switch (g - j0 >= 4 ? 4 : (int)(g - j0)) {
          case 4: scores(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 4); break;
          case 3: scores(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 3); break;
          case 2: scores(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 2); break;
          default: scores(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 1); break;
        }
      }
      for (int64_t j = 0; j < g; ++j) softmax(p + j * w, n);
      for (int64_t j0 = 0; j0 < g; j0 += 4) {
        const float* pj = p + j0 * w;
        float* oj = o + j0 * d;
        switch (g - j0 >= 4 ? 4 : (int)(g - j0)) {
          case 4: values(pj, w, vpool, half, sl, n, hkv, h, d, oj, 4); break;
          case 3: values(pj, w, vpool, half, sl, n, hkv, h, d, oj, 3); break;
          case 2: values(pj, w, vpool, half, sl, n, hkv, h, d, oj, 2); break;
          default: values(pj, w, vpool, half, sl, n, hkv, h, d, oj, 1); break;
        }
      }
    }
    free(p);
  }
  return failed ? -1 : 0;
}

int decode_attention(const float* q, const float* kpool, const float* vpool, const int64_t* slots,
                     const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d, float scale,
                     float* out) {
  return attend(q, kpool, vpool, 0, slots, lens, b, w, hq, hkv, d, scale, out);
}

/* The same over fp16 pools (uint16 storage of IEEE half). */
int decode_attention_f16(const float* q, const uint16_t* kpool, const uint16_t* vpool, const int64_t* slots,
                         const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d, float scale,
                         float* out) {
  return attend(q, kpool, vpool, 1, slots, lens, b, w, hq, hkv, d, scale, out);
}

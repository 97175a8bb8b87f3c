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

/* q [b, hq, d]; pools [slots, hkv, d]; slots [b, w] (row i uses its first lens[i]); out [b, hq, d].
 * d must be a multiple of 8 and hq a multiple of hkv. Returns 0, or -1 without scratch memory.
 * Always inlined with a constant `half`, so each exported variant has its own loads. */
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
      /* scores: every key once, against the g query heads that share it */
      for (int64_t t = 0; t < n; ++t) {
        const int64_t k = (sl[t] * hkv + h) * d;
        for (int64_t j = 0; j < g; ++j) {
          __m256 acc = _mm256_setzero_ps();
          for (int64_t i = 0; i < d; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qr + j * d + i), load8(kpool, k + i, half), acc);
          p[j * w + t] = hsum8(acc) * scale;
        }
      }
      /* softmax per head */
      for (int64_t j = 0; j < g; ++j) {
        float* pj = p + j * w;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) mx = pj[t] > mx ? pj[t] : mx;
        for (int64_t t = 0; t < n; ++t) sum += (pj[t] = expf(pj[t] - mx));
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < n; ++t) pj[t] *= inv;
      }
      /* values: every value row once, into the g outputs */
      memset(o, 0, (size_t)(g * d) * sizeof(float));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t v = (sl[t] * hkv + h) * d;
        for (int64_t j = 0; j < g; ++j) {
          const __m256 pv = _mm256_set1_ps(p[j * w + t]);
          float* oj = o + j * d;
          for (int64_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(oj + i, _mm256_fmadd_ps(pv, load8(vpool, v + i, half), _mm256_loadu_ps(oj + i)));
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

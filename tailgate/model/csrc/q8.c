/* q8: y[M,N] = x[M,K] @ W[N,K]^T on AVX2 CPUs, with int8 weights and int8 activations.
 *
 * Both sides are GGUF's Q8_0 layout: int8 values in blocks of 32 inputs, one fp32 scale
 * (amax / 127) per block. The weights are quantized once at load; each activation row at call
 * time. The block dot product is the one llama.cpp's CPU backend uses for Q8_0 x Q8_0: |w| (u8)
 * times sign(w) * x (s8) through vpmaddubsw. Both operands stay within +-127, so the pairwise
 * int16 sums (<= 2 * 127 * 127 = 32258) never saturate -- saturation and per-tensor activation
 * scales are what broke FBGEMM's int8 path on these models (docs/kernels.md).
 * (Tried: int8 sub-scales under one fp32 scale per 64-256 inputs, summing in int32 across them:
 * no faster on Zen 3 and 2-3x the KL on SmolLM2, so every block keeps its own scale.)
 * Each (row, output) sum runs in the same order whatever M is: a row's result does not depend on
 * the batch it rides in.
 *
 * Plain C loaded with ctypes (which releases the GIL), built at first use with the system C
 * compiler in about a second; a torch C++ extension took ~60 s to compile. Threads: OpenMP, which
 * resolves to the libgomp torch has already loaded, so one thread pool serves both.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

#define QK 32

/* One row of k floats -> k/32 int8 blocks, each with its scale amax / 127 (round to nearest). */
static void quantize_row(const float* x, int64_t k, int8_t* q, float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / QK; ++b) {
    const float* p = x + b * QK;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(p + 8 * j);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    d[b] = amax / 127.0f;
    const __m256 mul = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j)
      i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i a = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i*)(q + b * QK), _mm256_permutevar8x32_epi32(a, perm));
  }
}

/* r rows (1..4) of quantized activations against one output channel. Always inlined and called
 * with a constant r, so the row loop unrolls and the accumulators stay in registers (a runtime r
 * measured 1.4x slower). */
static inline __attribute__((always_inline)) void dot_rows(int r, const int8_t* w, const float* wd, const int8_t* a,
                                                           const float* ad, int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i wv = _mm256_loadu_si256((const __m256i*)(w + b * QK));
    const __m256i wa = _mm256_sign_epi8(wv, wv);
    for (int i = 0; i < r; ++i) {
      const __m256i av = _mm256_loadu_si256((const __m256i*)(a + i * k + b * QK));
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(av, wv)), ones);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(wd[b] * ad[i * nb + b]), acc[i]);
    }
  }
  for (int i = 0; i < r; ++i) out[i * ldo] = hsum8(acc[i]);
}

/* W [n, k] fp32 -> q int8 [n, k] and d fp32 [n, k/32]. */
void q8_quantize(const float* w, int64_t n, int64_t k, int8_t* q, float* d) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) quantize_row(w + row * k, k, q + row * k, d + row * (k / QK));
}

/* y [m, n] = x [m, k] @ W^T. Returns 0, or -1 when scratch memory cannot be had. */
int q8_linear(const float* x, int64_t m, int64_t k, const int8_t* q, const float* d, int64_t n, float* y) {
  const int64_t nb = k / QK;
  int8_t* xq = malloc((size_t)(m * k));
  float* xd = malloc((size_t)(m * nb) * sizeof(float));
  if (!xq || !xd) {
    free(xq);
    free(xd);
    return -1;
  }
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t row = 0; row < m; ++row) quantize_row(x + row * k, k, xq + row * k, xd + row * nb);
#pragma omp for schedule(static)
    for (int64_t col = 0; col < n; ++col)
      for (int64_t row = 0; row < m; row += 4) {
#define Q8_ROWS(r) dot_rows(r, q + col * k, d + col * nb, xq + row * k, xd + row * nb, k, y + row * n + col, n)
        switch (m - row) {
          case 1: Q8_ROWS(1); break;
          case 2: Q8_ROWS(2); break;
          case 3: Q8_ROWS(3); break;
          default: Q8_ROWS(4);
        }
#undef Q8_ROWS
      }
  }
  free(xq);
  free(xd);
  return 0;
}

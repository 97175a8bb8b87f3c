/* Small AVX2 helpers shared by the kernels in this directory. */
#ifndef TAILGATE_SIMD_H
#define TAILGATE_SIMD_H
#include <immintrin.h>

/* The sum of the 8 floats of v. */
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

/* The elementwise work of a Gemma step, fused (fp32 arithmetic, AVX2 + FMA + F16C; rows in fp32 or
 * bf16): RMSNorm, residual add + the next norm, q/k norm + rotate-half RoPE, GeGLU, and the fp16
 * KV pages' writes and bf16 gathers.
 *
 * Why: with torch each of these is several small ops (F.rms_norm alone is pow, mean, add, rsqrt,
 * mul, mul on CPU), ~1,100 op calls a step. On AMD EPYC (Zen 3, 2 threads) a decode step of 16 rows
 * spent ~12 ms of its ~96 ms in them -- more than the non-matmul budget of a lean step (1.25x its
 * matmuls). Here each is one call per layer that reads and writes each row once.
 * Every function works row by row in a fixed order, so a row's result does not depend on the
 * other rows of the step (mixed steps stay token-exact against the serial path).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd.h"

/* Below this many floats a call stays on one thread: an OpenMP fork costs more than the work. */
#define PAR_MIN (1 << 15)

/* bf16 rows. On the plans whose dense matmuls run in bf16 (CPUs with AVX-512 BF16) the norms
 * read the matmuls' bf16 outputs and write their bf16 inputs, so the casts around each matmul
 * (five a layer) are gone. The arithmetic stays fp32 and the bits are the casts': bf16 -> fp32 is
 * exact, and fp32 -> bf16 rounds to nearest even as torch's cast does. Plain AVX2 (integer ops),
 * so the file still builds and runs without AVX-512. */
static inline float bf16_to_f32(uint16_t b) {
  union { uint32_t u; float f; } v = {(uint32_t)b << 16};
  return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
  union { float f; uint32_t u; } v = {f};
  if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
  return (uint16_t)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16);
}

static inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

/* 8 floats -> 8 bf16, as f32_to_bf16. */
static inline __m128i bf16x8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(u, bias), 16),
                                       _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
}

/* A row as fp32: itself, or (bf16) widened into buf. */
static inline const float* row_f32(const void* p, int bf16, int64_t n, float* buf) {
  if (!bf16) return (const float*)p;
  const uint16_t* b = (const uint16_t*)p;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(buf + i, load_bf16x8(b + i));
  for (; i < n; ++i) buf[i] = bf16_to_f32(b[i]);
  return buf;
}

/* Where a row's fp32 result goes: out itself, or (bf16) buf, then narrowed by put_row. */
static inline float* out_f32(void* out, int bf16, float* buf) { return bf16 ? buf : (float*)out; }

static inline void put_row(const float* buf, int bf16, int64_t n, void* out) {
  if (!bf16) return;
  uint16_t* o = (uint16_t*)out;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i*)(o + i), bf16x8(_mm256_loadu_ps(buf + i)));
  for (; i < n; ++i) o[i] = f32_to_bf16(buf[i]);
}

/* out[i, :] = pool[idx[i], :] as bf16, the pool fp16 (the q8 plan's KV pages): a walk chunk's keys
 * and values gathered for its bf16 attention in one pass. torch's fp16 -> bf16 cast is scalar:
 * gather + cast took 47 us for 192 rows of 256 against ~9 us for the gather alone (this Xeon).
 * Exact: fp16 -> fp32 is exact, and the rounding to bf16 is the cast's. */
void gather_f16_bf16(const uint16_t* pool, int64_t width, const int64_t* idx, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static) if (n * width >= PAR_MIN)
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* src = pool + idx[i] * width;
    uint16_t* o = out + i * width;
    int64_t j = 0;
    for (; j + 8 <= width; j += 8)
      _mm_storeu_si128((__m128i*)(o + j), bf16x8(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(src + j)))));
    for (; j < width; ++j) o[j] = f32_to_bf16(_cvtsh_ss(src[j]));
  }
}

/* pool[slots[i], :] = fp16(src row i), src fp32 or bf16 (src_bf16), row i at src + i * ld values:
 * a step's new K or V rows into the q8 plan's fp16 pages. torch spends a cast and an index_copy_
 * on it (~70 us for 77 rows of 256 on this Xeon, 36 a step). Rounds to nearest even, as the cast. */
void kv_write_f16(uint16_t* pool, int64_t width, const int64_t* slots, int64_t n, const void* src, int64_t ld,
                  int src_bf16) {
  const int64_t es = src_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (n * width >= PAR_MIN)
  for (int64_t i = 0; i < n; ++i) {
    float buf[src_bf16 ? width : 1];
    const float* r = row_f32((const char*)src + i * ld * es, src_bf16, width, buf);
    uint16_t* o = pool + slots[i] * width;
    int64_t j = 0;
    for (; j + 8 <= width; j += 8)
      _mm_storeu_si128((__m128i*)(o + j), _mm256_cvtps_ph(_mm256_loadu_ps(r + j), _MM_FROUND_TO_NEAREST_INT));
    for (; j < width; ++j) o[j] = _cvtss_sh(r[j], _MM_FROUND_TO_NEAREST_INT);
  }
}

/* 1 / sqrt(mean(x^2) + eps) over n floats. */
static inline float inv_rms(const float* x, int64_t n, float eps) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(v, v, a0);
  }
  float s = hsum8(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * x[i];
  return 1.0f / sqrtf(s / (float)n + eps);
}

/* out = x * r * w over n floats (the order torch's RMSNorm multiplies in). */
static inline void scale_by(const float* x, float r, const float* w, float* out, int64_t n) {
  const __m256 rv = _mm256_set1_ps(r);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), rv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) out[i] = x[i] * r * w[i];
}

/* out[rows, n] = RMSNorm(x) * w. x_bf16 / out_bf16: x / out hold bf16 (else fp32). */
void rms_norm(const void* x, int x_bf16, int64_t rows, int64_t n, const float* w, float eps, void* out,
              int out_bf16) {
  const int64_t xs = x_bf16 ? 2 : 4, os = out_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * n >= PAR_MIN)
  for (int64_t t = 0; t < rows; ++t) {
    float in[x_bf16 ? n : 1], res[out_bf16 ? n : 1];
    const float* xr = row_f32((const char*)x + t * n * xs, x_bf16, n, in);
    void* o = (char*)out + t * n * os;
    scale_by(xr, inv_rms(xr, n, eps), w, out_f32(o, out_bf16, res), n);
    put_row(res, out_bf16, n, o);
  }
}

/* h += RMSNorm(a) * w1 (the residual add after a sandwich norm; a plain h += a where w1 is NULL,
 * a Llama block's); then, when w2 is given, out = RMSNorm(h) * w2 (the next block's input norm).
 * h: [rows, n] fp32; a, out: [rows, n], bf16 where a_bf16 / out_bf16 say so. */
void add_rms_norm(float* h, const void* a, int a_bf16, int64_t rows, int64_t n, const float* w1, const float* w2,
                  float eps, void* out, int out_bf16) {
  const int64_t as = a_bf16 ? 2 : 4, os = out_bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * n >= PAR_MIN)
  for (int64_t t = 0; t < rows; ++t) {
    float in[a_bf16 ? n : 1], res[out_bf16 ? n : 1];
    float* hr = h + t * n;
    const float* ar = row_f32((const char*)a + t * n * as, a_bf16, n, in);
    if (w1) {
      const __m256 rv = _mm256_set1_ps(inv_rms(ar, n, eps));
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(ar + i), rv), _mm256_loadu_ps(w1 + i));
        _mm256_storeu_ps(hr + i, _mm256_add_ps(_mm256_loadu_ps(hr + i), v));
      }
      for (; i < n; ++i) hr[i] += ar[i] * _mm256_cvtss_f32(rv) * w1[i];
    } else {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(hr + i, _mm256_add_ps(_mm256_loadu_ps(hr + i), _mm256_loadu_ps(ar + i)));
      for (; i < n; ++i) hr[i] += ar[i];
    }
    if (w2) {
      void* o = (char*)out + t * n * os;
      scale_by(hr, inv_rms(hr, n, eps), w2, out_f32(o, out_bf16, res), n);
      put_row(res, out_bf16, n, o);
    }
  }
}

/* Per head: y = RMSNorm(x) * w (skipped when w is NULL), then rotate-half RoPE:
 * out = y * cos + [-y[half:], y[:half]] * sin. x: rows of `heads` vectors of d values (bf16 where
 * x_bf16 says so, else fp32), row t at x + t * ldx values (a column slice of the fused qkv output);
 * cos/sin: [rows, d] fp32; out: [rows, heads, d] fp32. d must be even and at most 1024. */
void norm_rope(const void* x, int x_bf16, int64_t ldx, int64_t rows, int64_t heads, int64_t d, const float* w,
               float eps, const float* cos_t, const float* sin_t, float* out) {
  const int64_t xs = x_bf16 ? 2 : 4;
  const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (rows * heads * d >= PAR_MIN)
  for (int64_t task = 0; task < rows * heads; ++task) {
    const int64_t t = task / heads, hd = task % heads;
    const float *c = cos_t + t * d, *s = sin_t + t * d;
    float y[1024];
    const float* v = row_f32((const char*)x + (t * ldx + hd * d) * xs, x_bf16, d, y);
    float* o = out + task * d;
    if (w)
      scale_by(v, inv_rms(v, d, eps), w, y, d);  /* in place when v is y: elementwise */
    else if (v != y)
      for (int64_t i = 0; i < d; ++i) y[i] = v[i];
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
      const __m256 lo = _mm256_loadu_ps(y + i), hi = _mm256_loadu_ps(y + half + i);
      _mm256_storeu_ps(o + i, _mm256_sub_ps(_mm256_mul_ps(lo, _mm256_loadu_ps(c + i)),
                                            _mm256_mul_ps(hi, _mm256_loadu_ps(s + i))));
      _mm256_storeu_ps(o + half + i, _mm256_add_ps(_mm256_mul_ps(hi, _mm256_loadu_ps(c + half + i)),
                                                   _mm256_mul_ps(lo, _mm256_loadu_ps(s + half + i))));
    }
    for (; i < half; ++i) {
      o[i] = y[i] * c[i] - y[half + i] * s[i];
      o[half + i] = y[half + i] * c[half + i] + y[i] * s[half + i];
    }
  }
}

/* e^x for x in [-88, 0] (all tanh needs): 2^n * p(r), r = x - n ln2, degree-6 Taylor polynomial
 * (relative error ~2e-7 over |r| <= ln2 / 2). */
static inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* tanh(u) = sign(u) (1 - t) / (1 + t), t = e^(-2|u|). */
static inline __m256 tanh8(__m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = exp_neg(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 m = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
  return _mm256_or_ps(m, _mm256_and_ps(sign, u));
}

static inline float gelu_tanh1(float g) {
  return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
}

/* gelu_tanh(g) * u, 8 lanes: the one formula both GeGLU entry points use. */
static inline __attribute__((always_inline)) __m256 geglu8(__m256 x, __m256 u) {
  const __m256 k0 = _mm256_set1_ps(0.7978845608f), k1 = _mm256_set1_ps(0.044715f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 inner = _mm256_mul_ps(k0, _mm256_fmadd_ps(_mm256_mul_ps(k1, x), _mm256_mul_ps(x, x), x));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, tanh8(inner))), u);
}

/* silu(g) * u, 8 lanes: g / (1 + e^-g) with e^-|g| from exp_neg (g >= 0: g / (1 + t); g < 0, where
 * e^-g = 1 / t: g t / (1 + t)), so no exponent overflows. exp_neg stops at -87, so past |g| = 87
 * t is 0: silu is then g, or -0 for a very negative g (and NaN for -inf), as torch's. */
static inline __attribute__((always_inline)) __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 na = _mm256_or_ps(g, sign); /* -|g| */
  const __m256 t = _mm256_andnot_ps(_mm256_cmp_ps(na, _mm256_set1_ps(-87.0f), _CMP_LT_OQ), exp_neg(na));
  const __m256 num = _mm256_blendv_ps(g, _mm256_mul_ps(g, t), g); /* the sign bit picks g t */
  return _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(one, t)), u);
}

/* out[rows, f] = act(gu[:, :f]) * gu[:, f:] over the fused gate/up output gu: GeGLU (Gemma's MLP)
 * or, with `silu`, SwiGLU (a Llama-shaped MLP's; one pass where torch's took a split, a silu and a
 * product: ~40 us a layer at one row of Llama 3.2 3B's 8192, AMD EPYC Zen 4). gu and out are fp32,
 * or bf16 where `bf16` says so: on the plans whose dense matmuls are bf16 the gate/up product comes
 * out in bf16 and the down projection takes bf16, so the step's widest tensors skip a cast each way
 * -- with the same bits (bf16 rows widen exactly; the result rounds as the cast did). Inlined into
 * each entry point with `silu` constant. */
static inline __attribute__((always_inline)) void glu_rows(const void* gu, int bf16, int64_t rows, int64_t f,
                                                           void* out, const int silu) {
  const int64_t es = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * f >= PAR_MIN)
  for (int64_t t = 0; t < rows; ++t) {
    float gb[bf16 ? f : 1], ub[bf16 ? f : 1], res[bf16 ? f : 1];
    const char* row = (const char*)gu + t * 2 * f * es;
    const float *g = row_f32(row, bf16, f, gb), *u = row_f32(row + f * es, bf16, f, ub);
    void* o = (char*)out + t * f * es;
    float* of = out_f32(o, bf16, res);
    int64_t i = 0;
    for (; i + 8 <= f; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
      _mm256_storeu_ps(of + i, silu ? swiglu8(gv, uv) : geglu8(gv, uv));
    }
    for (; i < f; ++i) of[i] = (silu ? g[i] / (1.0f + expf(-g[i])) : gelu_tanh1(g[i])) * u[i];
    put_row(res, bf16, f, o);
  }
}

void geglu(const void* gu, int bf16, int64_t rows, int64_t f, void* out) { glu_rows(gu, bf16, rows, f, out, 0); }

void swiglu(const void* gu, int bf16, int64_t rows, int64_t f, void* out) { glu_rows(gu, bf16, rows, f, out, 1); }

/* q8: y[M,N] = x[M,K] @ W[N,K]^T with int8 weights and int8 activations (AVX2; VNNI and AMX below).
 *
 * Both sides are GGUF's Q8_0 quantization: int8 values in blocks of 32 inputs, one fp32 scale
 * (amax / 127) per block. The weights are quantized once at load; each activation row at call
 * time. The 4-wide products are llama.cpp's Q8_0 x Q8_0 trick: |w| (u8) times sign(w) * x (s8)
 * through vpmaddubsw; both operands stay within +-127, so the pairwise int16 sums
 * (<= 2 * 127 * 127 = 32258) never saturate -- saturation and per-tensor activation scales are
 * what broke FBGEMM's int8 path on these models (docs/kernels.md).
 *
 * Layout (why this kernel is 1.5-2x the plain dot product it replaced, AMD EPYC Zen 3): weights
 * are packed in panels of 8 outputs, each 32-byte vector holding 4 consecutive inputs of each of
 * the 8 outputs. One activation dword is broadcast against it, so the 8 lanes of an int32
 * accumulator are 8 different outputs: a block's exact int32 sums need no horizontal add, and the
 * block's two fp32 scales are applied once per 8 outputs (a vector of the panel's weight scales
 * times the row's scale) instead of once per output. Up to 4 rows share each weight vector.
 * Loop order: panels are cut into chunks of <= 128 KB of weights (L2-resident); each group of 4
 * activation rows (L1-resident) sweeps a chunk. The dot product per output measured ~2.3 ms per
 * row of Gemma 3 270M's 18 layers; this one ~1.4 ms, under oneDNN fp32's ~1.7 ms.
 * (Tried: int8 sub-scales under one fp32 scale per 64-256 inputs, summing in int32 across them:
 * no faster on Zen 3 and 2-3x the KL on SmolLM2, so every block keeps its own scale.)
 * Each (row, output) result is the same sequence of operations whatever M is (exact int32 per
 * block, then one FMA per block in block order): a row's result does not depend on its batch.
 *
 * Plain C loaded with ctypes (which releases the GIL), built at first use with the system C
 * compiler in about a second; a torch C++ extension took ~60 s to compile. Threads: OpenMP, which
 * resolves to the libgomp torch has already loaded, so one thread pool serves both.
 */
#define _GNU_SOURCE /* syscall() for the AMX permission */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define QK 32 /* inputs per block */
/* The 16-output panels (AVX-512 VNNI, AMX) prefetch their weights this many bytes ahead (four
 * blocks; into the next panel near a panel's end: panels are contiguous): a small call streams each
 * weight once, and the hardware prefetchers did not keep ahead of it. The 262144 x 640 head, 2
 * threads, alternating runs of a C harness over q8_linear (`/tmp`), min / median ms: AMX at 1 / 16
 * rows 7.05 / 10.5 -> 5.89 / 7.20 and 10.1 / 12.1 -> 8.66 / 9.36 (64 rows, compute-bound, unchanged;
 * 4096 no better than 2048 at K = 2048); AVX-512 VNNI at 1 / 8 rows 5.57 / 6.97 -> 4.61 / 5.86 and
 * 9.06 / 11.0 -> 6.35 / 7.04. (The AVX2 panels, AMD's, are left as measured there.) */
#define Q8_PREFETCH 2048
/* Where the CPU is an AMD EPYC (no AMX: Zen 4 measured, Zen 5 assumed alike), they ask for lines
 * Q8_PREFETCH_FAR ahead into L2 instead (q8_prefetch_far, chosen once by native.load): four blocks
 * ahead into L1 was ~140 ns of a thread's stream, about one trip to memory, so a step's matmuls read
 * ~0.7x the bytes a plain streaming loop does while the same kernel ran ~73 GB/s from L2. Every
 * layer matrix of Llama 3.2 1B's shape, Q4_K_M (head included at 1 row), 2 threads, AMD EPYC family
 * 25 model 17, one process alternating the two per pass (`/tmp` harness over q8_linear_segments),
 * median ratio far / near over 10-16 passes: 1 row 0.93, 4 rows 0.81, 16 rows 0.96, 64 rows 0.97
 * (16 KB into L2 about as good; 4 KB into L1 1.02; 64 KB 0.96). The AMX Xeon keeps what it measured. */
#define Q8_PREFETCH_FAR 32768
static int q8_far = 0;
void q8_prefetch_far(int far) { q8_far = far; }

/* A row count dispatched to a body built for it: CALL(n) with the literal count n, 1 .. 7 (8 above)
 * or 1 .. 15 (16 above), so each count keeps its own accumulators in registers. */
#define CASES_1_7(CALL) \
  case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
  case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break;
#define BY_ROWS_8(r, CALL) \
  switch (r) { CASES_1_7(CALL) default: CALL(8); }
#define BY_ROWS_16(r, CALL)                                                                              \
  switch (r) {                                                                                           \
    CASES_1_7(CALL) case 8: CALL(8); break; case 9: CALL(9); break; case 10: CALL(10); break;            \
    case 11: CALL(11); break; case 12: CALL(12); break; case 13: CALL(13); break; case 14: CALL(14); break; \
    case 15: CALL(15); break; default: CALL(16);                                                         \
  }
#define BY_ROWS_4(r, CALL) \
  switch (r) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; default: CALL(4); }
/* r rows (any count) against a 16-output VNNI panel, n rows a pass (8; 4 for two panels at once:
 * 2 x 4 accumulators of each kind, as 8 of one): ROWS(m) runs m rows from ai (activations), si (the
 * kernel's per-row side array, `per` values a block), di (scales), oi. */
#define PASSES_OF(n, r, side, per, ROWS)                   \
  for (int i0 = 0; i0 < (r); i0 += (n)) {                  \
    const int8_t* ai = a + i0 * k;                         \
    const __typeof__(side) si = (side) + i0 * nb * (per);  \
    const float* di = ad + i0 * nb;                        \
    float* oi = out + i0 * ldo;                            \
    BY_ROWS_##n((r) - i0, ROWS)                            \
  }
/* The wide panels' passes, one panel (8 rows a pass) or, with `pair`, two neighbours (4 rows a pass,
 * PAIR_ROWS): the includer defines ROWS(n, P), its kernel over n rows of P panels. */
#define ONE_PANEL(n) ROWS(n, 1)
#define TWO_PANELS(n) ROWS(n, 2)
#define PANEL_PASSES(pair, r, side, per)       \
  if (pair)                                    \
    PASSES_OF(4, r, side, per, TWO_PANELS)     \
  else                                         \
    PASSES_OF(8, r, side, per, ONE_PANEL)

/* Ask for `bytes` of weights Q8_PREFETCH past w into L1 (Q8_PREFETCH_FAR into L2 where q8_far),
 * a cache line at a time. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void* w, int bytes) {
  if (q8_far)
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char*)w + Q8_PREFETCH_FAR + l, _MM_HINT_T1);
  else
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char*)w + Q8_PREFETCH + l, _MM_HINT_T0);
}
#define NC 8  /* outputs per panel */

/* 8 fp16 scales -> fp32 (exact). */
static inline __m256 load_h8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

/* One row of k floats -> k/32 int8 blocks, each with its scale amax / 127 (round to nearest); where
 * `sums` is given, each block's sum of the bytes stored into sums[b], and where `sums32` is too, its
 * two half sums (inputs 0-15, 16-31) times 32 into sums32[2b], sums32[2b + 1]. The sums had been a
 * scalar loop over every byte after the packing: at 64 rows x 2048 inputs ~100 us of a call's ~109
 * (2 threads, AMD EPYC Zen 5), ~4 ms of a 64-row walk round of Gemma 3 270M; a sum of absolute
 * differences over the offset bytes gives them in a few instructions. */
static void quantize_row(const float* x, int64_t k, int8_t* q, float* d, int32_t* sums, int32_t* sums32) {
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
    const __m256i a = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])), perm);
    _mm256_storeu_si256((__m256i*)(q + b * QK), a);
    if (sums) {
      /* bytes + 128 summed by eights: [0-7, 8-15, 16-23, 24-31] as four 64-bit sums */
      const __m256i s8 = _mm256_sad_epu8(_mm256_xor_si256(a, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
      const __m128i lo = _mm256_castsi256_si128(s8), hi = _mm256_extracti128_si256(s8, 1);
      const int32_t h0 = (int32_t)(_mm_cvtsi128_si64(lo) + _mm_extract_epi64(lo, 1)) - 16 * 128;
      const int32_t h1 = (int32_t)(_mm_cvtsi128_si64(hi) + _mm_extract_epi64(hi, 1)) - 16 * 128;
      sums[b] = h0 + h1;
      if (sums32) sums32[2 * b] = 32 * h0, sums32[2 * b + 1] = 32 * h1;
    }
  }
}

/* W [n, k] fp32 (n % 8 == 0) -> panels: q int8, per 8 outputs and per block, 8 vectors of
 * (8 outputs x 4 inputs); d fp32, per 8 outputs, [k/32][8] scales. Same sizes as [n, k] and [n, k/32]. */
void q8_quantize(const float* w, int64_t n, int64_t k, int8_t* q, float* d) {
  const int64_t nb = k / QK;
#pragma omp parallel
  {
    int8_t* tq = malloc((size_t)(NC * k));
    float* td = malloc((size_t)(NC * nb) * sizeof(float));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < n / NC; ++g) {
      for (int c = 0; c < NC; ++c) quantize_row(w + (g * NC + c) * k, k, tq + c * k, td + c * nb, NULL, NULL);
      int8_t* pq = q + g * NC * k;
      float* pd = d + g * NC * nb;
      for (int64_t b = 0; b < nb; ++b) {
        for (int t = 0; t < 8; ++t)
          for (int c = 0; c < NC; ++c) memcpy(pq + b * 256 + t * 32 + c * 4, tq + c * k + b * QK + t * 4, 4);
        for (int c = 0; c < NC; ++c) pd[b * NC + c] = td[c * nb + b];
      }
    }
    free(tq);
    free(td);
  }
}

/* r rows (1..4) against one panel of 8 outputs. Always inlined and called with a constant r, so
 * the row loops unroll and the accumulators stay in registers. */
static inline __attribute__((always_inline)) void panel_rows(int r, const int half, const int8_t* w, const void* wd,
                                                             const int8_t* a, const float* ad, int64_t k, float* out,
                                                             int64_t ldo) {
  const int64_t nb = k / QK;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    const int8_t* wb = w + b * 256;
    for (int t = 0; t < 8; ++t) {
      const __m256i wv = _mm256_loadu_si256((const __m256i*)(wb + 32 * t));
      const __m256i wa = _mm256_sign_epi8(wv, wv);
      for (int i = 0; i < r; ++i) {
        int32_t v;
        memcpy(&v, a + i * k + b * QK + 4 * t, 4);
        const __m256i av = _mm256_set1_epi32(v);
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(av, wv)), ones));
      }
    }
    const __m256 dw = half ? load_h8((const uint16_t*)wd + NC * b) : _mm256_loadu_ps((const float*)wd + NC * b);
    for (int i = 0; i < r; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(ad[i * nb + b])), acc[i]);
  }
  for (int i = 0; i < r; ++i) _mm256_storeu_ps(out + i * ldo, acc[i]);
}

/* The 5-bit panels (code 5: a GGUF Q5_0 matrix's own values, csrc/blocks.c gq_q5_0_panels): per
 * block of 8 outputs x 32 inputs, 4 vectors of nibbles (vector t's in the low nibbles of vector
 * t % 4, t >= 4 in the high ones), one of fifth bits (bit t of byte j: vector t's), and 8 fp16
 * scales d; each value is d * (u - 16), u in 0..31. u goes to vpmaddubsw unsigned as it is, against
 * the activations signed: no sign step, and a pair's sum (<= 2 * 31 * 127) leaves room to add four
 * vectors' in int16 before widening; the row's block sum times 16 (xs) takes the offset off. The
 * int32 block sums are exact, then the same float steps as the int8 panels': the same result as
 * int8 panels holding u - 16 with scale d. 0.69 bytes a weight against the int8 panels' 1.125. */
static inline __attribute__((always_inline)) void q5_rows(int r, const uint8_t* w, const uint16_t* wd,
                                                          const int8_t* a, const int32_t* xs, const float* ad,
                                                          int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * 160;
    const __m256i hb = _mm256_loadu_si256((const __m256i*)(wb + 128));
    __m256i s[4];
    for (int i = 0; i < r; ++i) s[i] = _mm256_set1_epi32(-16 * xs[i * nb + b]);
#define Q5_STEP(t)                                                                                           \
  do {                                                                                                       \
    const __m256i nib = _mm256_loadu_si256((const __m256i*)(wb + 32 * ((t) & 3)));                           \
    const __m256i lo = (t) < 4 ? _mm256_and_si256(nib, lo4) : _mm256_and_si256(_mm256_srli_epi16(nib, 4), lo4); \
    const __m256i hi = (t) < 4 ? _mm256_slli_epi16(hb, 4 - ((t) & 3)) : _mm256_srli_epi16(hb, (t) - 4);      \
    const __m256i u = _mm256_or_si256(lo, _mm256_and_si256(hi, bit4));                                      \
    for (int i = 0; i < r; ++i) {                                                                            \
      int32_t v;                                                                                             \
      memcpy(&v, a + i * k + b * QK + 4 * (t), 4);                                                           \
      p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(u, _mm256_set1_epi32(v)));                          \
    }                                                                                                        \
  } while (0)
    {
      __m256i p[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      Q5_STEP(0);
      Q5_STEP(1);
      Q5_STEP(2);
      Q5_STEP(3);
      for (int i = 0; i < r; ++i) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(p[i], ones));
    }
    {
      __m256i p[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      Q5_STEP(4);
      Q5_STEP(5);
      Q5_STEP(6);
      Q5_STEP(7);
      for (int i = 0; i < r; ++i) s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(p[i], ones));
    }
#undef Q5_STEP
    const __m256 dw = load_h8(wd + NC * b);
    for (int i = 0; i < r; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(ad[i * nb + b])), acc[i]);
  }
  for (int i = 0; i < r; ++i) _mm256_storeu_ps(out + i * ldo, acc[i]);
}

/* The 4-bit panels (code 6: a GGUF Q4_K matrix's own values, csrc/blocks.c gq_q4_k_panels): per
 * block of 8 outputs x 32 inputs, the nibbles as in the 5-bit panels, then 8 scales and 8 mins (a
 * byte each); per 256 inputs, 8 d and 8 dmin (fp16). Each value is (d * scale) * u - dmin * min, u
 * in 0..15: u goes to vpmaddubsw unsigned, the 8 vectors' pair sums (<= 2 * 15 * 127 each) add up
 * in int16, and the row's block sum (xs) times dmin * min takes the mins off: per block and row,
 * acc += float(sum u x) * (d * scale * dx) - dmin * min * (dx * xs). */
static inline __attribute__((always_inline)) void q4k_rows(int r, const uint8_t* w, const uint16_t* wd,
                                                           const int8_t* a, const int32_t* xs, const float* ad,
                                                           int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 dv = _mm256_setzero_ps(), mv = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * 144;
    if (b % 8 == 0) {
      dv = load_h8(wd + (b / 8) * 16);
      mv = load_h8(wd + (b / 8) * 16 + 8);
    }
    __m256i p[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
#define Q4_STEP(t)                                                                                           \
  do {                                                                                                       \
    const __m256i nib = _mm256_loadu_si256((const __m256i*)(wb + 32 * ((t) & 3)));                           \
    const __m256i u = (t) < 4 ? _mm256_and_si256(nib, lo4) : _mm256_and_si256(_mm256_srli_epi16(nib, 4), lo4); \
    for (int i = 0; i < r; ++i) {                                                                            \
      int32_t v;                                                                                             \
      memcpy(&v, a + i * k + b * QK + 4 * (t), 4);                                                           \
      p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(u, _mm256_set1_epi32(v)));                          \
    }                                                                                                        \
  } while (0)
    Q4_STEP(0);
    Q4_STEP(1);
    Q4_STEP(2);
    Q4_STEP(3);
    Q4_STEP(4);
    Q4_STEP(5);
    Q4_STEP(6);
    Q4_STEP(7);
#undef Q4_STEP
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(wb + 128))));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(wb + 136))));
    const __m256 dw = _mm256_mul_ps(dv, sc), mw = _mm256_mul_ps(mv, mn);
    for (int i = 0; i < r; ++i) {
      const float dx = ad[i * nb + b];
      const __m256i s = _mm256_madd_epi16(p[i], ones);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[i]);
      acc[i] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(dx * (float)xs[i * nb + b]), acc[i]);
    }
  }
  for (int i = 0; i < r; ++i) _mm256_storeu_ps(out + i * ldo, acc[i]);
}

/* The 6-bit panels on AVX2 (code 10): the 16-output panels of a Q6_K matrix's own values (code 9,
 * csrc/blocks.c gq_q6_k_wide; layout at wide6_rows below) read as two 8-output halves, `half` the
 * one here: each 64-byte vector's 32 bytes of that half, its 8 scales, its 8 d. u (0..63) goes to
 * vpmaddubsw unsigned; a pair's sum is at most 2 * 63 * 128 in size, so two vectors' add in int16
 * before widening; the two half blocks' exact int32 sums lose their offset through x32 (32 * the
 * activation half's sum) and meet their scales in int32, then the int8 panels' fp32 step:
 * acc += float(S) * (d * dx), so the result is code 9's bit for bit. 0.82 bytes a weight, the
 * file's, where the int8 panels AVX2 had made of Q6_K read 1.125. */
#define W6B 416 /* bytes per 16-output 6-bit block */
static inline __attribute__((always_inline)) __m256i high2_8(const __m256i h, const int s) {
  const __m256i m = _mm256_set1_epi8(0x30);
  return _mm256_and_si256(s == 0 ? _mm256_slli_epi16(h, 4) : s == 1 ? _mm256_slli_epi16(h, 2) : s == 2 ? h : _mm256_srli_epi16(h, 2), m);
}

static inline __attribute__((always_inline)) void q6h_rows(int r, const int half, const uint8_t* w,
                                                           const uint16_t* wd, const int8_t* a, const int32_t* x32,
                                                           const float* ad, int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 dv = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * W6B + 32 * half;
    if (!half) prefetch_ahead(w + b * W6B, W6B);
    if (b % 8 == 0) dv = load_h8(wd + (b / 8) * 16 + 8 * half);
    const __m256i h0 = _mm256_loadu_si256((const __m256i*)(wb + 256)), h1 = _mm256_loadu_si256((const __m256i*)(wb + 320));
    __m256i ul[4], uh[4];
    for (int t = 0; t < 4; ++t) {
      const __m256i nib = _mm256_loadu_si256((const __m256i*)(wb + 64 * t));
      ul[t] = _mm256_or_si256(_mm256_and_si256(nib, lo4), high2_8(h0, t));
      uh[t] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(nib, 4), lo4), high2_8(h1, t));
    }
    const uint8_t* sc = w + b * W6B + 384 + 8 * half;
    const __m256i c0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)sc));
    const __m256i c1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(sc + 16)));
    for (int i = 0; i < r; ++i) {
      const int8_t* ai = a + i * k + b * QK;
      int32_t v[8];
      memcpy(v, ai, 32); /* v[t]: inputs 4t..4t+3 */
#define PAIR(u, t0, t1) \
  _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[t0], _mm256_set1_epi32(v[(t0) + o])), \
                                     _mm256_maddubs_epi16(u[t1], _mm256_set1_epi32(v[(t1) + o]))), ones)
      int o = 0;
      const __m256i s0 = _mm256_add_epi32(PAIR(ul, 0, 1), PAIR(ul, 2, 3));
      o = 4;
      const __m256i s1 = _mm256_add_epi32(PAIR(uh, 0, 1), PAIR(uh, 2, 3));
#undef PAIR
      const int32_t* xh = x32 + (i * nb + b) * 2;
      const __m256i S = _mm256_add_epi32(_mm256_mullo_epi32(c0, _mm256_sub_epi32(s0, _mm256_set1_epi32(xh[0]))),
                                         _mm256_mullo_epi32(c1, _mm256_sub_epi32(s1, _mm256_set1_epi32(xh[1]))));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(dv, _mm256_set1_ps(ad[i * nb + b])), acc[i]);
    }
  }
  for (int i = 0; i < r; ++i) _mm256_storeu_ps(out + i * ldo, acc[i]);
}

/* The same panel with one VNNI instruction per (4 inputs x 8 outputs x row) instead of four
 * (sign, maddubs, madd, add): vpdpbusd multiplies unsigned by signed bytes, so these panels hold
 * the weights offset to unsigned (w + 128, at load: q8_offset) and take the activations as they
 * are; sum (w + 128) x = sum w x + 128 sum x, and the row's block sum of x (xs) takes the excess
 * off. The int32 block sums are exact either way, so the result is bit for bit the AVX2 panel's.
 * This one is AVX-VNNI (256-bit, VEX: Alder Lake, Zen 5); AVX-512 VNNI CPUs take the panel below. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,avxvnni")
static void panel_avxvnni(int r, const uint8_t* w, const float* wd, const int8_t* a, const int32_t* xs, const float* ad,
                          int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    __m256i s[4];
    for (int i = 0; i < 4; ++i) s[i] = _mm256_set1_epi32(i < r ? -128 * xs[i * nb + b] : 0);
    const uint8_t* wb = w + b * 256;
    for (int t = 0; t < 8; ++t) {
      const __m256i wv = _mm256_loadu_si256((const __m256i*)(wb + 32 * t));
      for (int i = 0; i < 4 && i < r; ++i) {
        int32_t v;
        memcpy(&v, a + i * k + b * QK + 4 * t, 4);
        s[i] = _mm256_dpbusd_avx_epi32(s[i], wv, _mm256_set1_epi32(v));
      }
    }
    const __m256 dw = _mm256_loadu_ps(wd + NC * b);
    for (int i = 0; i < 4 && i < r; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), _mm256_mul_ps(dw, _mm256_set1_ps(ad[i * nb + b])), acc[i]);
  }
  for (int i = 0; i < r; ++i) _mm256_storeu_ps(out + i * ldo, acc[i]);
}
#pragma GCC pop_options

/* AVX-512 VNNI (Ice Lake and later Xeons, Zen 4): panels of 16 outputs (two of the 8-output
 * panels interleaved at load, in native.q8_quantize), so one 64-byte vector holds 4 inputs of all 16 and one
 * vpdpbusd does 16 x 4 products per row: per block and row, 8 of them against one scale step
 * (convert, multiply, fma) on 16 outputs. (Tried first: the 8-output panels two vectors at a time,
 * activations expanded to match; the per-block work on 8 outputs then cost as much as the
 * products: head at 16 rows 27 ms against the 256-bit panel's 33.) Up to 8 rows share each weight
 * load (32 registers). Same exact int32 block sums and the same float steps per output in block
 * order: bit for bit the AVX2 panel's result. */
#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#define NW 16 /* outputs per wide panel */
/* P (1 or 2) neighbouring panels at once, panel p's weights `wstep` bytes and scales `dstep` floats
 * after panel 0's, its outputs NW floats after: each activation broadcast feeds P products. Two
 * panels of 4 rows beat one panel of 8 by ~13 % on AMD EPYC Zen 5 (a one-core C loop over the
 * 4-bit body, 16 panels of K = 2048 in L2: 55-57 -> 61-63 % of the core's vpdpbusd peak): half the
 * broadcasts per product. Every output's operations are the single panel's, in the same order. */
static inline __attribute__((always_inline)) void wide_rows(const int r, const int P, const uint8_t* w,
                                                            const float* wd, const int8_t* a, const int32_t* xs,
                                                            const float* ad, int64_t k, float* out, int64_t ldo,
                                                            int64_t wstep, int64_t dstep) {
  const int64_t nb = k / QK;
  __m512 acc[8];
  for (int i = 0; i < r * P; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i s[8];
    for (int i = 0; i < r; ++i)
      for (int p = 0; p < P; ++p) s[i * P + p] = _mm512_set1_epi32(-128 * xs[i * nb + b]);
    for (int p = 0; p < P; ++p) prefetch_ahead(w + p * wstep + b * NW * QK, NW * QK);
    for (int t = 0; t < 8; ++t) {
      __m512i wv[2];
      for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_si512((const void*)(w + p * wstep + b * NW * QK + 64 * t));
      for (int i = 0; i < r; ++i) {
        int32_t v;
        memcpy(&v, a + i * k + b * QK + 4 * t, 4);
        const __m512i x = _mm512_set1_epi32(v);
        for (int p = 0; p < P; ++p) s[i * P + p] = _mm512_dpbusd_epi32(s[i * P + p], wv[p], x);
      }
    }
    for (int p = 0; p < P; ++p) {
      const __m512 dw = _mm512_loadu_ps(wd + p * dstep + NW * b);
      for (int i = 0; i < r; ++i)
        acc[i * P + p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i * P + p]), _mm512_mul_ps(dw, _mm512_set1_ps(ad[i * nb + b])),
                                         acc[i * P + p]);
    }
  }
  for (int i = 0; i < r; ++i)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + i * ldo + p * NW, acc[i * P + p]);
}

/* r rows (any count) against one 16-output panel, or two neighbours with `pair`. */
static void panel_wide(int r, int pair, const uint8_t* w, const float* wd, const int8_t* a, const int32_t* xs,
                       const float* ad, int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
#define ROWS(n, P) wide_rows(n, P, w, wd, ai, si, di, k, oi, ldo, NW * k, NW * nb)
  PANEL_PASSES(pair, r, xs, 1)
#undef ROWS
}

/* The wide 4-bit panels (codes 7 and 8: a GGUF Q4_K matrix's own values in 16-output panels, two of
 * the 8-output 4-bit panels interleaved at load, blocks.py wide_q4k): per block of 16 outputs x 32
 * inputs, 4 vectors of 64 bytes of nibbles (vector t's low nibbles: inputs 4t..4t+3 of each output,
 * its high ones inputs 4t+16..4t+19), then 16 scales and 16 mins (a byte each), 288 bytes; per 256
 * inputs 16 d and 16 dmin (fp16). u (0..15) is vpdpbusd's unsigned operand as it is, the
 * activations its signed one: no offset, no sign step. The int32 block sums are exact and the float
 * steps per output are q4k_rows' in the same order, so the result is the AVX2 4-bit panel's bit for
 * bit, at 0.56 bytes a weight where the int8 panels read 1.125 (the bytes a decode step streams). */
#define W4B 288 /* bytes per 16-output 4-bit block */
static inline __attribute__((always_inline)) void wide4_rows(const int r, const int P, const uint8_t* w,
                                                             const uint16_t* wd, const int8_t* a, const float* xm,
                                                             const float* ad, int64_t k, float* out, int64_t ldo,
                                                             int64_t wstep, int64_t dstep) {
  const int64_t nb = k / QK;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  __m512 acc[8], dv[2], mv[2];
  for (int i = 0; i < r * P; ++i) acc[i] = _mm512_setzero_ps();
  for (int p = 0; p < P; ++p) dv[p] = mv[p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * W4B;
    for (int p = 0; p < P; ++p) prefetch_ahead(wb + p * wstep, W4B);
    if (b % 8 == 0)
      for (int p = 0; p < P; ++p) {
        const uint16_t* d = wd + p * dstep + (b / 8) * 32;
        dv[p] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)d));
        mv[p] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(d + 16)));
      }
    __m512i s[8];
    for (int i = 0; i < r * P; ++i) s[i] = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
      __m512i ul[2], uh[2];
      for (int p = 0; p < P; ++p) {
        const __m512i nib = _mm512_loadu_si512((const void*)(wb + p * wstep + 64 * t));
        ul[p] = _mm512_and_si512(nib, lo4), uh[p] = _mm512_and_si512(_mm512_srli_epi16(nib, 4), lo4);
      }
      for (int i = 0; i < r; ++i) {
        int32_t vl, vh;
        memcpy(&vl, a + i * k + b * QK + 4 * t, 4);
        memcpy(&vh, a + i * k + b * QK + 4 * t + 16, 4);
        const __m512i xl = _mm512_set1_epi32(vl), xh = _mm512_set1_epi32(vh);
        for (int p = 0; p < P; ++p) {
          s[i * P + p] = _mm512_dpbusd_epi32(s[i * P + p], ul[p], xl);
          s[i * P + p] = _mm512_dpbusd_epi32(s[i * P + p], uh[p], xh);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      const uint8_t* wp = wb + p * wstep;
      const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wp + 256))));
      const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wp + 272))));
      const __m512 dw = _mm512_mul_ps(dv[p], sc), mw = _mm512_mul_ps(mv[p], mn);
      for (int i = 0; i < r; ++i) {
        const float dx = ad[i * nb + b];
        __m512 c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i * P + p]), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[i * P + p]);
        acc[i * P + p] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(xm[i * nb + b]), c);
      }
    }
  }
  for (int i = 0; i < r; ++i)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + i * ldo + p * NW, acc[i * P + p]);
}

/* The wide 6-bit panels (code 9: a GGUF Q6_K matrix's own values, csrc/blocks.c gq_q6_k_wide): per
 * block the 4-bit panels' nibble vectors, 2 vectors of the high bit pairs (moved to bits 4-5 by a
 * shift and a mask), and two int8 scales per output (inputs 0..15 and 16..31). u (0..63) goes to
 * vpdpbusd unsigned; the two halves' exact int32 sums take the offset off through the activation
 * half's sum times 32 (x32, made once per call) and are combined with their scales in int32
 * (|sc (s - 32 xs)| <= 128 * 16 * 32 * 127: exact), then one fp32 step per block as the int8
 * panels': acc += float(S) * (d * dx). 0.82 bytes a weight, the file's, where int8 panels read 1.125. */
static inline __attribute__((always_inline)) __m512i high2(const __m512i h, const int s) {
  const __m512i m = _mm512_set1_epi8(0x30);
  return _mm512_and_si512(s == 0 ? _mm512_slli_epi16(h, 4) : s == 1 ? _mm512_slli_epi16(h, 2) : s == 2 ? h : _mm512_srli_epi16(h, 2), m);
}

static inline __attribute__((always_inline)) void wide6_rows(const int r, const uint8_t* w, const uint16_t* wd,
                                                             const int8_t* a, const int32_t* x32, const float* ad,
                                                             int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  __m512 acc[8], dv = _mm512_setzero_ps();
  for (int i = 0; i < r; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w + b * W6B;
    prefetch_ahead(wb, W6B);
    if (b % 8 == 0) dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wd + (b / 8) * 16)));
    __m512i s0[8], s1[8];
    for (int i = 0; i < r; ++i) s0[i] = s1[i] = _mm512_setzero_si512();
    const __m512i h0 = _mm512_loadu_si512((const void*)(wb + 256)), h1 = _mm512_loadu_si512((const void*)(wb + 320));
    for (int t = 0; t < 4; ++t) {
      const __m512i nib = _mm512_loadu_si512((const void*)(wb + 64 * t));
      const __m512i ul = _mm512_or_si512(_mm512_and_si512(nib, lo4), high2(h0, t));
      const __m512i uh = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(nib, 4), lo4), high2(h1, t));
      for (int i = 0; i < r; ++i) {
        int32_t vl, vh;
        memcpy(&vl, a + i * k + b * QK + 4 * t, 4);
        memcpy(&vh, a + i * k + b * QK + 4 * t + 16, 4);
        s0[i] = _mm512_dpbusd_epi32(s0[i], ul, _mm512_set1_epi32(vl));
        s1[i] = _mm512_dpbusd_epi32(s1[i], uh, _mm512_set1_epi32(vh));
      }
    }
    const __m512i c0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wb + 384)));
    const __m512i c1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(wb + 400)));
    for (int i = 0; i < r; ++i) {
      const int32_t* xh = x32 + (i * nb + b) * 2;
      const __m512i S = _mm512_add_epi32(_mm512_mullo_epi32(c0, _mm512_sub_epi32(s0[i], _mm512_set1_epi32(xh[0]))),
                                         _mm512_mullo_epi32(c1, _mm512_sub_epi32(s1[i], _mm512_set1_epi32(xh[1]))));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(dv, _mm512_set1_ps(ad[i * nb + b])), acc[i]);
    }
  }
  for (int i = 0; i < r; ++i) _mm512_storeu_ps(out + i * ldo, acc[i]);
}

/* r rows (any count) against one wide 6-bit panel. */
static void panel_wide6(int r, const uint8_t* w, const uint16_t* wd, const int8_t* a, const int32_t* x32,
                        const float* ad, int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
#define ROWS(n, P) wide6_rows(n, w, wd, ai, si, di, k, oi, ldo)
  PASSES_OF(8, r, x32, 2, ONE_PANEL)
#undef ROWS
}

/* r rows (any count) against one wide 4-bit panel, or two neighbours with `pair`. */
static void panel_wide4(int r, int pair, const uint8_t* w, const uint16_t* wd, const int8_t* a, const float* xm,
                        const float* ad, int64_t k, float* out, int64_t ldo) {
  const int64_t nb = k / QK;
#define ROWS(n, P) wide4_rows(n, P, w, wd, ai, si, di, k, oi, ldo, NW * k * 9 / 16, NW * (k / 256) * 2)
  PANEL_PASSES(pair, r, xm, 1)
#undef ROWS
}
#pragma GCC pop_options

/* AMX (Sapphire Rapids and later Xeons): one tile instruction multiplies 16 rows x 32 inputs of
 * activations by one block of a 16-output panel (its 8 x 64 bytes are exactly the B tile's layout),
 * signed by signed (tdpbssd), so the weights stay as quantized; the 16 x 16 exact int32 block sums
 * go through memory to the same per-block scale step as the other panels, in block order: bit for
 * bit their result. What remains per block is that scale step (16 rows x 16 outputs), not the
 * products. Linux hands out the tile state only on request (q8_amx_init); each thread loads the
 * tile configuration at the start of every call, since oneDNN's own AMX kernels run on the same
 * threads with theirs (and load their own before use, so the tiles are not released after). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
int q8_amx_init(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1; }

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl,amx-tile,amx-int8")
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* tmm0-3: C (rows x 16 int32), tmm4-5: A (rows x 32 bytes), tmm6-7: B (8 x 64 bytes). */
static void amx_configure(int rows) {
  tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 4; ++t) c.rows[t] = (uint8_t)rows, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = (uint8_t)rows, c.colsb[t] = QK;
  for (int t = 6; t < 8; ++t) c.rows[t] = QK / 4, c.colsb[t] = 64;
  /* GCC 12's _tile_loadconfig tells the compiler it reads only the first 8 bytes of the
   * configuration, so without this barrier the stores above are dropped (and ldtilecfg faults). */
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&c);
}

/* Scale step of one block for R rows: acc[i] += float(sums[i]) * (dw * ad[i]). */
static inline __attribute__((always_inline)) void amx_scale(const int R, __m512* acc, const int32_t* sums,
                                                            const float* wd, const float* ad, int64_t nb, int64_t b) {
  const __m512 dw = _mm512_loadu_ps(wd + NW * b);
  for (int i = 0; i < R; ++i)
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)(sums + 16 * i))),
                             _mm512_mul_ps(dw, _mm512_set1_ps(ad[i * nb + b])), acc[i]);
}

/* Issue the products of blocks b and b + 1 into tiles C0/C1 or C2/C3 (literal tile numbers: the
 * intrinsics paste them into the instruction). */
#define AMX_PAIR(CA, CB, b)                                       \
  do {                                                            \
    prefetch_ahead(w + (b) * NW * QK, 2 * NW * QK);             \
    _tile_zero(CA);                                               \
    _tile_zero(CB);                                               \
    _tile_loadd(4, a + (b) * QK, k);                              \
    _tile_loadd(6, w + (b) * NW * QK, 64);                        \
    _tile_dpbssd(CA, 4, 6);                                       \
    _tile_loadd(5, a + ((b) + 1) * QK, k);                        \
    _tile_loadd(7, w + ((b) + 1) * NW * QK, 64);                  \
    _tile_dpbssd(CB, 5, 7);                                       \
  } while (0)

/* The pipelined sweep over a panel's blocks that both tile kernels share: the next pair of blocks
 * is in the tiles while this pair's sums, stored to memory, go through the scale step (storing and
 * reading back at once stalled). PAIR(CA, CB, b) issues blocks b, b + 1 into C tiles CA, CB (literal
 * tile numbers: the intrinsics paste them into the instruction); ONE(b) issues an odd last block
 * into tile 0; SCALE(s, b) takes block b's sums s into acc. Expects nb, pairs, acc, sums in scope. */
#define AMX_SWEEP(PAIR, ONE, SCALE)                 \
  do {                                              \
    if (pairs > 0) PAIR(0, 1, 0);                   \
    for (int64_t p = 0; p < pairs; ++p) {           \
      const int64_t b = 2 * p;                      \
      if (p % 2 == 0) {                             \
        _tile_stored(0, sums, 64);                  \
        _tile_stored(1, sums + 256, 64);            \
        if (p + 1 < pairs) PAIR(2, 3, b + 2);       \
      } else {                                      \
        _tile_stored(2, sums, 64);                  \
        _tile_stored(3, sums + 256, 64);            \
        if (p + 1 < pairs) PAIR(0, 1, b + 2);       \
      }                                             \
      SCALE(sums, b);                               \
      SCALE(sums + 256, b + 1);                     \
    }                                               \
    if (nb % 2) {                                   \
      _tile_zero(0);                                \
      ONE(nb - 1);                                  \
      _tile_stored(0, sums, 64);                    \
      SCALE(sums, nb - 1);                          \
    }                                               \
  } while (0)

#define AMX_ONE(b)                        \
  do {                                    \
    _tile_loadd(4, a + (b) * QK, k);      \
    _tile_loadd(6, w + (b) * NW * QK, 64); \
    _tile_dpbssd(0, 4, 6);                \
  } while (0)
#define AMX_SCALE(s, b) amx_scale(R, acc, s, wd, ad, nb, b)

/* 16 activation rows (a: stride k; rows past R are zeros) against one 16-output panel; R rows
 * kept (AMX_SWEEP). */
static inline __attribute__((always_inline)) void amx_rows(const int R, const int8_t* w, const float* wd,
                                                           const int8_t* a, const float* ad, int64_t k, float* out,
                                                           int64_t ldo, int32_t* sums) {
  const int64_t nb = k / QK, pairs = nb / 2;
  __m512 acc[16];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  AMX_SWEEP(AMX_PAIR, AMX_ONE, AMX_SCALE);
  for (int i = 0; i < R; ++i) _mm512_storeu_ps(out + i * ldo, acc[i]);
}
#undef AMX_ONE
#undef AMX_SCALE
#undef AMX_PAIR

static void panel_amx(int r, const int8_t* w, const float* wd, const int8_t* a, const float* ad, int64_t k, float* out,
                      int64_t ldo, int32_t* sums) {
#define ROWS(n) amx_rows(n, w, wd, a, ad, k, out, ldo, sums)
  BY_ROWS_16(r, ROWS)
#undef ROWS
}

/* The wide 4-bit panels on AMX: each block's nibbles unpacked to bytes in a 512-byte buffer, which
 * is then exactly a B tile (row t: inputs 4t..4t+3 of the 16 outputs), multiplied signed
 * (activations) by unsigned (u) through tdpbsud; the exact int32 sums go through memory to the
 * 4-bit panels' scale step (wide4_rows'), in block order: the same bits. Pipelined as amx_rows: the
 * next pair of blocks is unpacked and in the tiles while this pair is scaled. */
static inline __attribute__((always_inline)) void unpack4(const uint8_t* wb, uint8_t* buf) {
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < 4; ++t) {
    const __m512i nib = _mm512_loadu_si512((const void*)(wb + 64 * t));
    _mm512_store_si512((void*)(buf + 64 * t), _mm512_and_si512(nib, lo4));
    _mm512_store_si512((void*)(buf + 64 * (t + 4)), _mm512_and_si512(_mm512_srli_epi16(nib, 4), lo4));
  }
}

static inline __attribute__((always_inline)) void amx4_scale(const int R, __m512* acc, const int32_t* sums,
                                                             const uint8_t* wb, const uint16_t* wd, const float* xm,
                                                             const float* ad, int64_t nb, int64_t b) {
  const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wd + (b / 8) * 32)));
  const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wd + (b / 8) * 32 + 16)));
  const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 256))));
  const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 272))));
  const __m512 dw = _mm512_mul_ps(dv, sc), mw = _mm512_mul_ps(mv, mn);
  for (int i = 0; i < R; ++i) {
    const float dx = ad[i * nb + b];
    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)(sums + 16 * i))),
                             _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[i]);
    acc[i] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(xm[i * nb + b]), acc[i]);
  }
}

#define AMX4_PAIR(CA, CB, b)                                     \
  do {                                                           \
    prefetch_ahead(w + (b) * W4B, 2 * W4B);                      \
    unpack4(w + (b) * W4B, buf);                                 \
    unpack4(w + ((b) + 1) * W4B, buf + 512);                     \
    _tile_zero(CA);                                              \
    _tile_zero(CB);                                              \
    _tile_loadd(4, a + (b) * QK, k);                             \
    _tile_loadd(6, buf, 64);                                     \
    _tile_dpbsud(CA, 4, 6);                                      \
    _tile_loadd(5, a + ((b) + 1) * QK, k);                       \
    _tile_loadd(7, buf + 512, 64);                               \
    _tile_dpbsud(CB, 5, 7);                                      \
  } while (0)

#define AMX4_ONE(b)                   \
  do {                                \
    unpack4(w + (b) * W4B, buf);      \
    _tile_loadd(4, a + (b) * QK, k);  \
    _tile_loadd(6, buf, 64);          \
    _tile_dpbsud(0, 4, 6);            \
  } while (0)
#define AMX4_SCALE(s, b) amx4_scale(R, acc, s, w + (b) * W4B, wd, xm, ad, nb, b)

static inline __attribute__((always_inline)) void amx4_rows(const int R, const uint8_t* w, const uint16_t* wd,
                                                            const int8_t* a, const float* xm, const float* ad,
                                                            int64_t k, float* out, int64_t ldo, int32_t* sums,
                                                            uint8_t* buf) {
  const int64_t nb = k / QK, pairs = nb / 2;
  __m512 acc[16];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  AMX_SWEEP(AMX4_PAIR, AMX4_ONE, AMX4_SCALE);
  for (int i = 0; i < R; ++i) _mm512_storeu_ps(out + i * ldo, acc[i]);
}
#undef AMX4_ONE
#undef AMX4_SCALE
#undef AMX4_PAIR
#undef AMX_SWEEP

static void panel_amx4(int r, const uint8_t* w, const uint16_t* wd, const int8_t* a, const float* xm,
                       const float* ad, int64_t k, float* out, int64_t ldo, int32_t* sums, uint8_t* buf) {
#define ROWS(n) amx4_rows(n, w, wd, a, xm, ad, k, out, ldo, sums, buf)
  BY_ROWS_16(r, ROWS)
#undef ROWS
}

/* A call of fewer than 16 rows runs tiles of that many rows (at 1 row, 16 made the head 2x slower). */
static void amx_begin(int64_t m) { amx_configure(m < 16 ? (int)m : 16); }
#pragma GCC pop_options

/* Panels for the VNNI kernels: weights offset to unsigned bytes (w + 128), in place. */
void q8_offset(int8_t* q, int64_t bytes) {
  for (int64_t i = 0; i < bytes; ++i) q[i] = (int8_t)((uint8_t)q[i] ^ 0x80);
}

/* Below this many rows a call's wide 4-bit panels run on AVX-512 VNNI on an AMX CPU too (the two
 * give the same bits, so the cut moves no result): unpacking a block into a tile costs as much as its
 * products at a few rows. */
#define AMX4_ROWS 12
/* From this many rows a call's VNNI panels go two at a time (panel_wide's and panel_wide4's `pair`).
 * Measured on AMD EPYC Zen 5 (Gemma 3 270M's 18 layers, 2 threads, old / new alternated twice, ms):
 * pairs from 4 rows: 64 rows 17.0 / 16.1 -> 14.4 / 14.9, 256 rows 59.5 / 58.8 -> 51.5 / 53.9, 16
 * rows even, but 4 and 8 rows 2.8 / 3.6 -> 3.2 / 4.0 (a decode step streams its weights once, and
 * two streams a panel pair did not keep up), so calls under 16 rows keep one panel at a time; at 16:
 * 64 rows 15.8 / 16.8 -> 14.8 / 15.1, 256 rows 60.5 / 62.0 -> 56.5 / 53.4, 1-16 rows even. Llama 3.2
 * 1B's shape (4-bit panels at K = 2048 / 8192, already near the core's vpdpbusd rate): 64 rows
 * 120.6 / 118.3 -> 116.3 / 117.5. */
#define PAIR_ROWS 16

/* y [m, n] = x [m, k] @ W^T, W's outputs in `nseg` segments of seg_n[s] outputs each (n their sum),
 * segment s in panels of form codes[s] at seg_q[s], seg_d[s]. The 8-output (AVX2) forms: 0 int8
 * panels (fp32 scales), 4 the same with fp16 scales (a Q8_0 matrix moved as stored), 5 the 5-bit
 * panels (a Q5_0 matrix as stored, fp16 scales), 6 the 4-bit panels (a Q4_K matrix as stored); 1
 * AVX-VNNI (weights offset by q8_offset), the only segment. The 16-output forms (interleaved at
 * load): 2 AVX-512 VNNI int8 (offset weights), 3 AMX int8, 7 the 4-bit panels on AVX-512 VNNI, 8
 * the same bytes on AMX (tiles from AMX4_ROWS rows up), 9 the 6-bit panels (AVX-512 VNNI at every
 * row count). Codes 0, 4, 5 and 6 mix, and so do 2, 3,
 * 7, 8 and 9: a fused matrix whose parts the file stores in different formats. `tile8` / `tile4`:
 * how many leading rows the code-3 / code-8 segments take on BF16 tiles (tiles_bf16.c): the rows
 * of a step's long prompt segments, put first (runtime/context.py; 0 where the caller does not
 * say; native.py TILE_ROWS_INT8 / _4BIT), so no row's bits depend on its neighbours. Returns 0, or
 * -1 when scratch memory cannot be had. */
int prompt_tiles_bf16(const float* x, int64_t tile8, int64_t tile4, int64_t k, int nseg, const void* const* seg_q,
                      const void* const* seg_d, const int64_t* seg_n, const int* codes, float* y, int64_t n);

int q8_linear_seg(const float* x, int64_t m, int64_t k, int nseg, const void* const* seg_q, const void* const* seg_d,
                  const int64_t* seg_n, const int* codes, float* y, int64_t n, int64_t tile8, int64_t tile4) {
  if (m == 0) return 0; /* a step that samples no row (its head call is empty): a 0-row tile faults */
  /* rows [0, tiled8) of the code-3 segments and [0, tiled4) of the code-8 ones go to the BF16
   * tiles, after the int8 pass */
  const int64_t tiled8 = tile8 < m ? tile8 : m, tiled4 = tile4 < m ? tile4 : m;
  int wide = 0, amx = 0, sums_needed = 0, four = 0, six = 0;
  for (int s = 0; s < nseg; ++s) {
    four |= codes[s] == 7 || codes[s] == 8; /* the wide 4-bit panels read dx * xs, one float per row and block */
    six |= codes[s] == 9 || codes[s] == 10; /* the 6-bit ones 32 * the sum of each half block, int32 */
    wide |= codes[s] == 2 || codes[s] == 3 || (codes[s] >= 7 && codes[s] <= 9);
    amx |= codes[s] == 3 || codes[s] == 8;
    /* the VNNI panels take off the offset weights' excess, the 5- and 4-bit panels the offset or mins */
    sums_needed |= codes[s] == 1 || codes[s] == 2 || codes[s] >= 5;
  }
  const int vnni = codes[0] == 1 ? 1 : 0; /* AVX-VNNI: the only segment */
  const int64_t nb = k / QK;
  const int64_t mp = amx ? (m + 15) / 16 * 16 : m; /* AMX reads whole 16-row tiles: zero rows pad */
  const int offset = sums_needed;
  int8_t* xq = malloc((size_t)(mp * k));
  float* xd = malloc((size_t)(mp * nb) * sizeof(float));
  int32_t* xs = offset ? malloc((size_t)(m * nb) * sizeof(int32_t)) : NULL;
  float* xm = four ? malloc((size_t)(m * nb) * sizeof(float)) : NULL;
  int32_t* x32 = six ? malloc((size_t)(m * nb * 2) * sizeof(int32_t)) : NULL;
  if (!xq || !xd || (offset && !xs) || (four && !xm) || (six && !x32)) {
    free(xq);
    free(xd);
    free(xs);
    free(xm);
    free(x32);
    return -1;
  }
  memset(xq + m * k, 0, (size_t)((mp - m) * k));
  memset(xd + m * nb, 0, (size_t)((mp - m) * nb) * sizeof(float));
  const int nc = wide ? NW : NC; /* outputs per panel */
  int64_t seg_g[8]; /* the first panel of each segment, and the end */
  seg_g[0] = 0;
  for (int s = 0; s < nseg && s < 7; ++s) seg_g[s + 1] = seg_g[s] + seg_n[s] / nc;
#pragma omp parallel
  {
    int32_t* sums = amx ? aligned_alloc(64, 2 * 256 * sizeof(int32_t)) : NULL;
    uint8_t* buf = amx ? aligned_alloc(64, 1024) : NULL; /* two blocks of unpacked 4-bit weights */
    if (amx) amx_begin(m);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < m; ++row) {
      quantize_row(x + row * k, k, xq + row * k, xd + row * nb, offset ? xs + row * nb : NULL,
                   six ? x32 + row * nb * 2 : NULL);
      for (int64_t b = 0; four && b < nb; ++b) xm[row * nb + b] = xd[row * nb + b] * (float)xs[row * nb + b];
    }
    const int64_t groups = n / nc;
    /* Chunks of panels: at most 128 KB of weights, and at least 4 chunks per thread for balance. */
    int64_t cg = (128 * 1024) / (nc * k);
    const int64_t fair = groups / (4 * omp_get_num_threads());
    if (cg > fair) cg = fair;
    if (cg < 1) cg = 1;
    /* Row blocks of 64: a block's activations (<= 128 KB at K = 2048) stay in L2 across chunks. */
    for (int64_t r0 = 0; r0 < m; r0 += 64) {
      const int64_t r1 = r0 + 64 < m ? r0 + 64 : m;
#pragma omp for schedule(static)
      for (int64_t c0 = 0; c0 < groups; c0 += cg) {
        const int64_t c1 = c0 + cg < groups ? c0 + cg : groups;
        const int step = amx ? 16 : wide ? 8 : 4; /* rows sharing each weight load */
        for (int64_t row = r0; row < r1; row += step)
          for (int64_t g = c0; g < c1; ++g) {
            const int r = r1 - row < step ? (int)(r1 - row) : step;
            if (vnni == 1) {
              panel_avxvnni(r, (const uint8_t*)seg_q[0] + g * NC * k, (const float*)seg_d[0] + g * NC * nb,
                            xq + row * k, xs + row * nb, xd + row * nb, k, y + row * n + g * NC, n);
              continue;
            }
            int sg = 0;
            while (sg + 1 < nseg && g >= seg_g[sg + 1]) ++sg;
            const int64_t gl = g - seg_g[sg];
            if (wide) {
              /* the rows here that the BF16 tiles do not take: [r0, row + r) */
              const int64_t tiled = codes[sg] == 3 ? tiled8 : codes[sg] == 8 ? tiled4 : 0;
              const int64_t r0 = row > tiled ? row : tiled;
              if (r0 >= row + r) continue;
              const int rn = (int)(row + r - r0);
              /* two neighbouring panels of one segment at once (wide_rows' P) where enough rows
               * share them: the AVX-512 VNNI int8 and 4-bit forms */
              const int pair = m >= PAIR_ROWS && g + 1 < c1 && g + 1 < seg_g[sg + 1] &&
                               (codes[sg] == 2 || (codes[sg] == 7 || (codes[sg] == 8 && rn < AMX4_ROWS)));
              const int8_t* a0 = xq + r0 * k;
              const float* d0 = xd + r0 * nb;
              float* out = y + r0 * n + g * NW;
              if (codes[sg] == 9) {
                const uint8_t* w6 = (const uint8_t*)seg_q[sg] + gl * NW * k * 13 / 16;
                const uint16_t* d6 = (const uint16_t*)seg_d[sg] + gl * NW * (k / 256);
                panel_wide6(rn, w6, d6, a0, x32 + r0 * nb * 2, d0, k, out, n);
              } else if (codes[sg] >= 7) {
                const uint8_t* w4 = (const uint8_t*)seg_q[sg] + gl * NW * k * 9 / 16;
                const uint16_t* d4 = (const uint16_t*)seg_d[sg] + gl * NW * (k / 256) * 2;
                if (codes[sg] == 8 && rn >= AMX4_ROWS)
                  panel_amx4(rn, w4, d4, a0, xm + r0 * nb, d0, k, out, n, sums, buf);
                else
                  panel_wide4(rn, pair, w4, d4, a0, xm + r0 * nb, d0, k, out, n);
              } else {
                const uint8_t* wg = (const uint8_t*)seg_q[sg] + gl * NW * k;
                const float* dg = (const float*)seg_d[sg] + gl * NW * nb;
                if (codes[sg] == 3)
                  panel_amx(rn, (const int8_t*)wg, dg, a0, d0, k, out, n, sums);
                else
                  panel_wide(rn, pair, wg, dg, a0, xs + r0 * nb, d0, k, out, n);
              }
              g += pair; /* its neighbour is done too */
              continue;
            }
            float* out = y + row * n + g * NC;
            const int8_t* xa = xq + row * k;
            const float* xda = xd + row * nb;
            if (codes[sg] == 6) {
              const uint8_t* w4 = (const uint8_t*)seg_q[sg] + gl * NC * k * 9 / 16;
              const uint16_t* d4 = (const uint16_t*)seg_d[sg] + gl * NC * (k / 256) * 2;
              const int32_t* xsa = xs + row * nb;
              switch (r1 - row) {
                case 1: q4k_rows(1, w4, d4, xa, xsa, xda, k, out, n); break;
                case 2: q4k_rows(2, w4, d4, xa, xsa, xda, k, out, n); break;
                case 3: q4k_rows(3, w4, d4, xa, xsa, xda, k, out, n); break;
                default: q4k_rows(4, w4, d4, xa, xsa, xda, k, out, n);
              }
              continue;
            }
            if (codes[sg] == 10) { /* half gl % 2 of the 16-output 6-bit panel gl / 2 */
              const uint8_t* w6 = (const uint8_t*)seg_q[sg] + (gl / 2) * k * 13; /* 16 outputs x 13/16 byte */
              const uint16_t* d6 = (const uint16_t*)seg_d[sg] + (gl / 2) * (k / 16); /* 16 d per 256 inputs */
              const int32_t* x32a = x32 + row * nb * 2;
              const int h = (int)(gl % 2);
              switch (r1 - row) {
                case 1: q6h_rows(1, h, w6, d6, xa, x32a, xda, k, out, n); break;
                case 2: q6h_rows(2, h, w6, d6, xa, x32a, xda, k, out, n); break;
                case 3: q6h_rows(3, h, w6, d6, xa, x32a, xda, k, out, n); break;
                default: q6h_rows(4, h, w6, d6, xa, x32a, xda, k, out, n);
              }
              continue;
            }
            if (codes[sg] == 5) {
              const uint8_t* w5 = (const uint8_t*)seg_q[sg] + gl * NC * k * 5 / 8;
              const uint16_t* d5 = (const uint16_t*)seg_d[sg] + gl * NC * nb;
              const int32_t* xsa = xs + row * nb;
              switch (r1 - row) {
                case 1: q5_rows(1, w5, d5, xa, xsa, xda, k, out, n); break;
                case 2: q5_rows(2, w5, d5, xa, xsa, xda, k, out, n); break;
                case 3: q5_rows(3, w5, d5, xa, xsa, xda, k, out, n); break;
                default: q5_rows(4, w5, d5, xa, xsa, xda, k, out, n);
              }
              continue;
            }
            const int8_t* w8 = (const int8_t*)seg_q[sg] + gl * NC * k;
            if (codes[sg] == 4) {
              const uint16_t* dh = (const uint16_t*)seg_d[sg] + gl * NC * nb;
              switch (r1 - row) {
                case 1: panel_rows(1, 1, w8, dh, xa, xda, k, out, n); break;
                case 2: panel_rows(2, 1, w8, dh, xa, xda, k, out, n); break;
                case 3: panel_rows(3, 1, w8, dh, xa, xda, k, out, n); break;
                default: panel_rows(4, 1, w8, dh, xa, xda, k, out, n);
              }
              continue;
            }
            const float* df = (const float*)seg_d[sg] + gl * NC * nb;
            switch (r1 - row) {
              case 1: panel_rows(1, 0, w8, df, xa, xda, k, out, n); break;
              case 2: panel_rows(2, 0, w8, df, xa, xda, k, out, n); break;
              case 3: panel_rows(3, 0, w8, df, xa, xda, k, out, n); break;
              default: panel_rows(4, 0, w8, df, xa, xda, k, out, n);
            }
          }
      }
    }
    free(sums);
    free(buf);
  }
  free(xq);
  free(xd);
  free(xs);
  free(xm);
  free(x32);
  return prompt_tiles_bf16(x, tiled8, tiled4, k, nseg, seg_q, seg_d, seg_n, codes, y, n);
}

/* One segment (q8_linear_seg): y [m, n] = x [m, k] @ W^T, W in panels of form `vnni` (its code). */
int q8_linear(const float* x, int64_t m, int64_t k, const int8_t* q, const void* d, int64_t n, float* y, int vnni,
              int64_t tile8, int64_t tile4) {
  const void* qs[1] = {q};
  const void* ds[1] = {d};
  const int64_t ns[1] = {n};
  const int cs[1] = {vnni};
  return q8_linear_seg(x, m, k, 1, qs, ds, ns, cs, y, n, tile8, tile4);
}

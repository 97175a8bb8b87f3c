/* GGUF weights as stored: y[M, N] = x[M, K] @ W[N, K]^T straight from the file's quantized blocks,
 * and rows of W dequantized to fp32 (the embedding lookup, the wider forms made at load).
 *
 * Block formats read here (llama.cpp's ggml types; a row of W is K/32 or K/256 consecutive blocks):
 *   Q4_0  18 B / 32: fp16 d, 16 B of nibbles             w = d (q - 8)
 *   Q4_1  20 B / 32: fp16 d, fp16 m, 16 B of nibbles     w = d q + m
 *   Q5_0  22 B / 32: fp16 d, 32 high bits, 16 B nibbles  w = d (q - 16)
 *   Q5_1  24 B / 32: fp16 d, fp16 m, 32 high bits, nib.  w = d q + m
 *   Q8_0  34 B / 32: fp16 d, 32 int8                     w = d q
 *   Q4_K 144 B / 256: fp16 d, fp16 dmin, 12 B of 6-bit (scale, min) for 8 sub-blocks of 32,
 *                     128 B of nibbles                    w = d sc q - dmin m
 *   Q5_K 176 B / 256: as Q4_K plus 32 B of fifth bits
 *   Q6_K 210 B / 256: 128 B low nibbles, 64 B of 2-bit highs, 16 int8 scales (one per 16), fp16 d
 *                                                         w = d sc (q - 32)
 * In a 32-value block of Q4_0/1 and Q5_0/1, value j < 16 is byte j's low nibble and j >= 16 byte
 * (j-16)'s high nibble; Q4_K/Q5_K hold sub-blocks 2c and 2c+1 in the low and high nibbles of the
 * same 32 bytes.
 *
 * The matmul quantizes each activation row once per call to int8 in blocks of 32 with an fp32 scale
 * (amax / 127, round to nearest: the q8 kernel's activations, csrc/q8.c) and keeps each block's
 * scaled sum, so a weight format's additive part (its minimum, or its -8 / -16 / -32 offset) costs
 * one scalar multiply-add per block. Each 32-value weight block is unpacked once into bytes and
 * shared by up to 4 activation rows: unsigned 4-6 bit values go straight into vpmaddubsw (u8 x s8;
 * pair sums <= 2 * 63 * 127, no saturation); int8 weights (Q8_0) and Q6_K's signed q - 32 move their
 * sign onto the activation first. Q6_K's two 16-value scales multiply in the vpmaddwd step.
 * Small calls are bound by streaming the weights, and these blocks are 0.56-1.06 bytes per weight.
 *
 * Each (row, output) result is the same sequence of operations whatever M is (exact int32 per block,
 * one FMA per block in block order, one horizontal sum): a row's result does not depend on its batch.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };
#define QB 32     /* values per activation block */
#define CHUNK 16  /* outputs per parallel work item */

static inline float h2f(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/* Bytes a row of k values takes in type t (0: a type this file does not read). */
int64_t gq_row_bytes(int t, int64_t k) {
  switch (t) {
    case T_Q4_0: return k / 32 * 18;
    case T_Q4_1: return k / 32 * 20;
    case T_Q5_0: return k / 32 * 22;
    case T_Q5_1: return k / 32 * 24;
    case T_Q8_0: return k / 32 * 34;
    case T_Q4_K: return k / 256 * 144;
    case T_Q5_K: return k / 256 * 176;
    case T_Q6_K: return k / 256 * 210;
    default: return 0;
  }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block: sub-blocks 0-3 keep
 * theirs in the low 6 bits of bytes j and j+4; 4-7 in the nibbles of byte j+4 plus the top 2 bits
 * of bytes j-4 (scale) and j (min). */
static inline void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* ---- dequantization (scalar: the embedding's few rows per step and one-time work at load) ---- */

/* The Q6_K scale index of half h (16 inputs) of block b (32 inputs) within its super-block. */
static inline int idx16(int64_t b, int h) { return 2 * (int)(b % 8) + h; }

static void deq_row(int t, const uint8_t* r, int64_t k, float* y) {
  if (t == T_Q8_0 || t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1) {
    const int64_t bs = gq_row_bytes(t, 32);
    for (int64_t b = 0; b < k / 32; ++b, r += bs, y += 32) {
      const float d = h2f(r);
      if (t == T_Q8_0) {
        for (int j = 0; j < 32; ++j) y[j] = d * (float)(int8_t)r[2 + j];
        continue;
      }
      const int has_min = t == T_Q4_1 || t == T_Q5_1, five = t == T_Q5_0 || t == T_Q5_1;
      const float m = has_min ? h2f(r + 2) : (five ? -16.0f * d : -8.0f * d);
      uint32_t qh = 0;
      if (five) memcpy(&qh, r + 2 + 2 * has_min, 4);
      const uint8_t* qs = r + 2 + 2 * has_min + 4 * five;
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 15) | (five ? ((qh >> j) & 1) << 4 : 0);
        const int hi = (qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0);
        y[j] = d * lo + m;
        y[j + 16] = d * hi + m;
      }
    }
  } else if (t == T_Q4_K || t == T_Q5_K) {
    const int five = t == T_Q5_K;
    const int64_t bs = gq_row_bytes(t, 256);
    for (int64_t b = 0; b < k / 256; ++b, r += bs) {
      const float d = h2f(r), dmin = h2f(r + 2);
      const uint8_t* sc = r + 4;
      const uint8_t* qh = r + 16;
      const uint8_t* qs = r + 16 + 32 * five;
      for (int c = 0; c < 4; ++c, qs += 32) {
        for (int half = 0; half < 2; ++half) {
          int s, mn;
          k_scale_min(sc, 2 * c + half, &s, &mn);
          const float ds = d * s, dm = dmin * mn;
          for (int l = 0; l < 32; ++l) {
            int q = half ? qs[l] >> 4 : qs[l] & 15;
            if (five) q |= ((qh[l] >> (2 * c + half)) & 1) << 4;
            *y++ = ds * q - dm;
          }
        }
      }
    }
  } else if (t == T_Q6_K) {
    for (int64_t b = 0; b < k / 256; ++b, r += 210) {
      const float d = h2f(r + 208);
      const int8_t* sc = (const int8_t*)(r + 192);
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = r + 64 * n;
        const uint8_t* qh = r + 128 + 32 * n;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          y[l] = d * sc[8 * n + is] * ((((ql[l] & 15) | ((qh[l] & 3) << 4))) - 32);
          y[l + 32] = d * sc[8 * n + is + 2] * (((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
          y[l + 64] = d * sc[8 * n + is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          y[l + 96] = d * sc[8 * n + is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        y += 128;
      }
    }
  }
}

/* rows[i] of the matrix w (n rows of k values, type t) -> out[i, :] fp32; rows == NULL: all n in order. */
void gq_dequantize(const uint8_t* w, int t, int64_t k, const int64_t* rows, int64_t n, float* out) {
  const int64_t rb = gq_row_bytes(t, k);
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) deq_row(t, w + (rows ? rows[i] : i) * rb, k, out + i * k);
}

/* Q8_0 rows w [n, k] (n % 8 == 0) -> the q8 kernel's AVX2 panels (csrc/q8.c, q8_quantize's layout:
 * per 8 rows and block, 8 vectors of 4 inputs x 8 rows; the 8 rows' scales side by side), by moving
 * the bytes instead of dequantizing and quantizing again. q8_quantize, given a Q8_0 block's values
 * d q (exact in fp32), finds amax = |d| max|q| and gives back |d| and sign(d) q exactly when
 * max|q| = 127, which llama.cpp's and gguf's Q8_0 quantizers always write (d = amax / 127), and
 * d = 0, q = 0 for a block whose values are all zero. So the panels moved here are bit for bit
 * q8_quantize's of the dequantized rows, unless some block is of neither kind (max|q| < 127, a q of
 * -128, a scale that is not finite): then this returns 1 and the caller quantizes the rows itself. */
int gq_q8_0_panels(const uint8_t* w, int64_t n, int64_t k, int8_t* q, void* d, int half) {
  const int64_t nb = k / 32, rb = nb * 34;
  int bad = 0;
  for (int64_t g = 0; g < n / 8; ++g) { /* one thread: bound by memory, ~1.3 ms per 4096 rows of 640 */
    int8_t* pq = q + g * 8 * k;
    float* pd = (float*)d + g * 8 * nb;
    uint16_t* ph = (uint16_t*)d + g * 8 * nb;
    for (int c = 0; c < 8; ++c) {
      const uint8_t* r = w + (g * 8 + c) * rb;
      for (int64_t b = 0; b < nb; ++b, r += 34) {
        const float s = h2f(r);
        __m256i v = _mm256_loadu_si256((const __m256i*)(r + 2));
        const __m256i a = _mm256_abs_epi8(v); /* -128 stays 0x80: 128 as unsigned, caught below */
        __m128i m = _mm_max_epu8(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 8));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 4));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 2));
        m = _mm_max_epu8(m, _mm_srli_si128(m, 1));
        const int top = _mm_cvtsi128_si32(m) & 255;
        float ds = s < 0.0f ? -s : s;
        if (!(ds <= 65504.0f) || (top != 127 && top != 0 && ds != 0.0f)) { /* inf or nan; max|q| < 127 */
          bad = 1;
          continue;
        }
        if (top == 0 || ds == 0.0f) {
          v = _mm256_setzero_si256();
          ds = 0.0f;
        } else if (s < 0.0f) {
          v = _mm256_sub_epi8(_mm256_setzero_si256(), v);
        }
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i*)lanes, v);
        for (int t = 0; t < 8; ++t) memcpy(pq + b * 256 + t * 32 + c * 4, &lanes[t], 4);
        if (half) { /* |d| as stored (fp16), sign bit cleared; a zeroed block's scale is +0 */
          uint16_t h;
          memcpy(&h, r, 2);
          ph[b * 8 + c] = ds == 0.0f ? 0 : (uint16_t)(h & 0x7fff);
        } else {
          pd[b * 8 + c] = ds;
        }
      }
    }
  }
  return bad;
}

/* rows[i] of a matrix held in AVX2 panels (q, d as above; k values a row) -> out[i, :] fp32, each
 * value q * d: a tied embedding read from the head's panels when they hold the blocks' values as
 * stored (then the same bits as gq_dequantize of the blocks: d * q). One thread: a step's rows are
 * a few hundred KB at most. */
void gq_panel_rows(const int8_t* q, const void* d, int64_t k, const int64_t* rows, int64_t n, float* out, int half) {
  const int64_t nb = k / 32;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = rows[i] / 8, c = rows[i] % 8;
    const int8_t* pq = q + g * 8 * k + c * 4;
    const float* pd = (const float*)d + g * 8 * nb + c;
    const uint8_t* ph = (const uint8_t*)((const uint16_t*)d + g * 8 * nb + c);
    float* y = out + i * k;
    for (int64_t b = 0; b < nb; ++b, y += 32) {
      const float s = half ? h2f(ph + 2 * 8 * b) : pd[b * 8];
      for (int t = 0; t < 8; ++t)
        for (int j = 0; j < 4; ++j) y[t * 4 + j] = (float)pq[b * 256 + t * 32 + j] * s;
    }
  }
}

/* Q5_0 rows -> the 5-bit AVX2 panels csrc/q8.c's q5 kernel reads (code 5): the file's own values,
 * moved, none rounded. A Q5_0 block is d (fp16) and 32 values q in 0..31 (low nibbles in qs, fifth
 * bits in qh) standing for d * (q - 16). Per 8 outputs and per block of 32 inputs, in the int8
 * panels' order (vector t = inputs 4t..4t+3 of the 8 outputs, byte 4c + i = output c, input 4t + i):
 * 4 x 32 bytes of nibbles, byte j of vector u holding vector u's value j in its low nibble and
 * vector u + 4's in its high one, then 32 bytes whose bit t of byte j is vector t's value j's fifth
 * bit: 160 bytes for 256 values; and d as stored, [k/32][8] fp16 per 8 outputs. n % 8 == 0. */
void gq_q5_0_panels(const uint8_t* w, int64_t n, int64_t k, uint8_t* q, uint16_t* d) {
  const int64_t nb = k / 32, rb = nb * 22;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < n / 8; ++g) {
    uint8_t u[8][32]; /* [t][4c + i] */
    for (int64_t b = 0; b < nb; ++b) {
      for (int c = 0; c < 8; ++c) {
        const uint8_t* r = w + (g * 8 + c) * rb + b * 22;
        uint32_t qh;
        memcpy(&qh, r + 2, 4);
        for (int j = 0; j < 32; ++j) {
          const int lo = j < 16 ? r[6 + j] & 15 : r[6 + j - 16] >> 4;
          u[j / 4][4 * c + j % 4] = (uint8_t)(lo | (((qh >> j) & 1) << 4));
        }
        memcpy(d + g * 8 * nb + b * 8 + c, r, 2);
      }
      uint8_t* p = q + (g * nb + b) * 160;
      for (int j = 0; j < 32; ++j) {
        uint8_t hb = 0;
        for (int t = 0; t < 4; ++t) p[32 * t + j] = (uint8_t)((u[t][j] & 15) | ((u[t + 4][j] & 15) << 4));
        for (int t = 0; t < 8; ++t) hb |= (uint8_t)(((u[t][j] >> 4) & 1) << t);
        p[128 + j] = hb;
      }
    }
  }
}

/* rows[i] of a matrix in 5-bit panels (as above) -> out[i, :] fp32, each value (q - 16) * d: the
 * blocks' own values (the same bits as gq_dequantize's d * (q - 16)). For the tests. */
void gq_q5_panel_rows(const uint8_t* q, const uint16_t* d, int64_t k, const int64_t* rows, int64_t n, float* out) {
  const int64_t nb = k / 32;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = rows[i] / 8, c = rows[i] % 8;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = q + (g * nb + b) * 160;
      const float s = h2f((const uint8_t*)(d + g * 8 * nb + b * 8 + c));
      for (int t = 0; t < 8; ++t)
        for (int j = 0; j < 4; ++j) {
          const int at = 4 * c + j, nib = t < 4 ? p[32 * t + at] & 15 : p[32 * (t - 4) + at] >> 4;
          const int v = nib | (((p[128 + at] >> t) & 1) << 4);
          out[i * k + b * 32 + 4 * t + j] = (float)(v - 16) * s;
        }
    }
  }
}

/* Q4_K rows -> the 4-bit AVX2 panels csrc/q8.c's q4k kernel reads (code 6): the file's own values,
 * moved. A Q4_K super-block of 256 values is d, dmin (fp16), 8 6-bit (scale, min) pairs and 256
 * nibbles q, standing for d * scale * q - dmin * min per sub-block of 32. Per 8 outputs and per
 * block of 32 inputs (one sub-block): the nibbles as in the 5-bit panels (4 x 32 bytes), then the 8
 * outputs' scales, then their mins (a byte each): 144 bytes for 256 values; and per super-block, in
 * `d`, the 8 outputs' d then their dmin (fp16, as stored): 0.58 bytes a value, the file's 0.56 plus
 * the 6-bit fields widened to bytes. n % 8 == 0, k % 256 == 0. */
void gq_q4_k_panels(const uint8_t* w, int64_t n, int64_t k, uint8_t* q, uint16_t* d) {
  const int64_t nb = k / 32, ns = k / 256, rb = ns * 144;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < n / 8; ++g) {
    uint8_t u[8][32]; /* [t][4c + i] */
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t sb = b / 8;
      const int j = (int)(b % 8);
      uint8_t* p = q + (g * nb + b) * 144;
      for (int c = 0; c < 8; ++c) {
        const uint8_t* r = w + (g * 8 + c) * rb + sb * 144;
        if (j == 0) {
          memcpy(d + (g * ns + sb) * 16 + c, r, 2);
          memcpy(d + (g * ns + sb) * 16 + 8 + c, r + 2, 2);
        }
        int sc, mn;
        k_scale_min(r + 4, j, &sc, &mn);
        p[128 + c] = (uint8_t)sc;
        p[136 + c] = (uint8_t)mn;
        const uint8_t* qs = r + 16 + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) u[l / 4][4 * c + l % 4] = (uint8_t)(j % 2 ? qs[l] >> 4 : qs[l] & 15);
      }
      for (int jj = 0; jj < 32; ++jj)
        for (int t = 0; t < 4; ++t) p[32 * t + jj] = (uint8_t)(u[t][jj] | (u[t + 4][jj] << 4));
    }
  }
}

/* Q6_K rows -> the 6-bit 16-output panels csrc/q8.c's wide6 kernel reads (code 9): the file's own
 * values, moved. A Q6_K super-block of 256 values is 256 6-bit q (low nibbles in ql, high pairs in
 * qh), 16 int8 scales (one per 16 values) and d (fp16), standing for d * scale * (q - 32). Per 16
 * outputs and per block of 32 inputs: 4 vectors of 64 bytes of low nibbles (vector t's low
 * nibbles: inputs 4t..4t+3 of each output, its high ones inputs 4t+16..4t+19), 2 vectors of the
 * high pairs (vector h's byte: bits 2s, 2s+1 hold vector 4h + s's), the 16 outputs' scales of
 * inputs 0..15, then of 16..31 (int8): 416 bytes for 512 values; per super-block, in `d`, the 16
 * outputs' d (fp16, as stored): 0.82 bytes a value, the file's 0.82. n % 16 == 0, k % 256 == 0. */
void gq_q6_k_wide(const uint8_t* w, int64_t n, int64_t k, uint8_t* q, uint16_t* d) {
  const int64_t nb = k / 32, ns = k / 256, rb = ns * 210;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < n / 16; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t sb = b / 8;
      uint8_t* p = q + (g * nb + b) * 416;
      memset(p, 0, 384);
      for (int c = 0; c < 16; ++c) {
        const uint8_t* r = w + (g * 16 + c) * rb + sb * 210;
        if (b % 8 == 0) memcpy(d + (g * ns + sb) * 16 + c, r + 208, 2);
        const int8_t* sc = (const int8_t*)(r + 192);
        for (int j = 0; j < 32; ++j) {
          const int idx = 32 * (int)(b % 8) + j, half = idx / 128, qd = (idx % 128) / 32, l = idx % 32;
          const uint8_t lo = r[64 * half + 32 * (qd & 1) + l];
          const int u = ((qd < 2 ? lo & 15 : lo >> 4) | (((r[128 + 32 * half + l] >> (2 * qd)) & 3) << 4));
          const int t = j / 4, at = 4 * c + j % 4;
          p[64 * (t % 4) + at] |= (uint8_t)((u & 15) << (t < 4 ? 0 : 4));
          p[256 + 64 * (t / 4) + at] |= (uint8_t)((u >> 4) << (2 * (t % 4)));
        }
        p[384 + c] = (uint8_t)sc[idx16(b, 0)];
        p[400 + c] = (uint8_t)sc[idx16(b, 1)];
      }
    }
}

/* rows[i] of a matrix in 6-bit wide panels (as above) -> out[i, :] fp32, each value
 * d * scale * (q - 32) as gq_dequantize computes it: a tied Q6_K table's embedding lookups
 * (blocks.py PanelRows), a few rows a step. */
void gq_q6_k_wide_rows(const uint8_t* q, const uint16_t* d, int64_t k, const int64_t* rows, int64_t n, float* out) {
  const int64_t nb = k / 32, ns = k / 256;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = rows[i] / 16, c = rows[i] % 16;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = q + (g * nb + b) * 416;
      const float dd = h2f((const uint8_t*)(d + (g * ns + b / 8) * 16 + c));
      for (int j = 0; j < 32; ++j) {
        const int t = j / 4, at = 4 * (int)c + j % 4;
        const int lo = t < 4 ? p[64 * t + at] & 15 : p[64 * (t - 4) + at] >> 4;
        const int u = lo | (((p[256 + 64 * (t / 4) + at] >> (2 * (t % 4))) & 3) << 4);
        out[i * k + b * 32 + j] = dd * (int8_t)p[384 + 16 * (j / 16) + c] * (u - 32);
      }
    }
  }
}

/* rows[i] of a matrix in 4-bit Q4_K panels (as above) -> out[i, :] fp32, each value
 * (d * scale) * q - dmin * min as gq_dequantize computes it. For the tests. */
void gq_q4_k_panel_rows(const uint8_t* q, const uint16_t* d, int64_t k, const int64_t* rows, int64_t n, float* out) {
  const int64_t nb = k / 32, ns = k / 256;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = rows[i] / 8, c = rows[i] % 8;
    float* y = out + i * k;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = q + (g * nb + b) * 144;
      const float dd = h2f((const uint8_t*)(d + (g * ns + b / 8) * 16 + c));
      const float dmin = h2f((const uint8_t*)(d + (g * ns + b / 8) * 16 + 8 + c));
      const float ds = dd * p[128 + c], dm = dmin * p[136 + c];
      for (int t = 0; t < 8; ++t)
        for (int jj = 0; jj < 4; ++jj) {
          const int at = 4 * (int)c + jj, v = t < 4 ? p[32 * t + at] & 15 : p[32 * (t - 4) + at] >> 4;
          *y++ = ds * v - dm;
        }
    }
  }
}

/* ---- the activations: int8 blocks of 32, a scale each, and the block's scaled sum ---- */

static void quantize_act(const float* x, int64_t k, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / QB; ++b) {
    const float* p = x + b * QB;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(p + 8 * j);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    const __m256 mul = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i iv[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      iv[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      sum = _mm256_add_epi32(sum, iv[j]);
    }
    const __m256i a = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    _mm256_storeu_si256((__m256i*)(q + b * QB), _mm256_permutevar8x32_epi32(a, perm));
    d[b] = amax / 127.0f;
    s[b] = d[b] * (float)(int)hsum8(_mm256_cvtepi32_ps(sum));
  }
}

/* ---- unpacking one 32-value weight block into 32 bytes ---- */

static inline __m256i nibbles(const uint8_t* qs) { /* 16 B -> low nibbles then high nibbles */
  const __m128i t = _mm_loadu_si128((const __m128i*)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(15));
}

static inline __m256i fifth_bits(const uint8_t* qh) { /* 32 bits -> byte j = 16 if bit j is set */
  uint32_t v;
  memcpy(&v, qh, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* ---- one weight block against R activation rows ---- */

typedef struct {
  const int8_t* q; /* row r's block b at q + r * k + b * 32 */
  const float* d;  /* row r's block b scale at d[r * nb + b] */
  const float* s;  /* and its scaled sum */
  int64_t k, nb;
} Act;

/* Unsigned weight bytes w (0..63): acc[r] += (sum w x) * dw * dx; tail[r] += mw * sx. */
static inline __attribute__((always_inline)) void acc_u(const int R, const Act* a, int64_t b, __m256i w, float dw,
                                                        float mw, __m256* acc, float* tail) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)(a->q + r * a->k + b * QB));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a->d[r * a->nb + b]), acc[r]);
    tail[r] += mw * a->s[r * a->nb + b];
  }
}

/* Signed weight bytes w (-127..127), their pair sums weighted by the int16 lanes of sc (all ones, or
 * Q6_K's two sub-scales): acc[r] += (sum sc w x) * dw * dx. */
static inline __attribute__((always_inline)) void acc_s(const int R, const Act* a, int64_t b, __m256i w, __m256i sc,
                                                        float dw, __m256* acc) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  for (int r = 0; r < R; ++r) {
    const __m256i x = _mm256_loadu_si256((const __m256i*)(a->q + r * a->k + b * QB));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), sc);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a->d[r * a->nb + b]), acc[r]);
  }
}

/* One output row (its bytes at w) against activation rows 0..R-1 of a; results to y[r * ldy]. */
static inline __attribute__((always_inline)) void dot_rows(const int R, int t, const uint8_t* w, const Act* a,
                                                           float* y, int64_t ldy) {
  __m256 acc[4];
  float tail[4] = {0, 0, 0, 0};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t nb = a->nb;
  switch (t) {
    case T_Q8_0:
      for (int64_t b = 0; b < nb; ++b, w += 34)
        acc_s(R, a, b, _mm256_loadu_si256((const __m256i*)(w + 2)), ones, h2f(w), acc);
      break;
    case T_Q4_0:
      for (int64_t b = 0; b < nb; ++b, w += 18) {
        const float d = h2f(w);
        acc_u(R, a, b, nibbles(w + 2), d, -8.0f * d, acc, tail);
      }
      break;
    case T_Q4_1:
      for (int64_t b = 0; b < nb; ++b, w += 20) acc_u(R, a, b, nibbles(w + 4), h2f(w), h2f(w + 2), acc, tail);
      break;
    case T_Q5_0:
      for (int64_t b = 0; b < nb; ++b, w += 22) {
        const float d = h2f(w);
        acc_u(R, a, b, _mm256_or_si256(nibbles(w + 6), fifth_bits(w + 2)), d, -16.0f * d, acc, tail);
      }
      break;
    case T_Q5_1:
      for (int64_t b = 0; b < nb; ++b, w += 24)
        acc_u(R, a, b, _mm256_or_si256(nibbles(w + 8), fifth_bits(w + 4)), h2f(w), h2f(w + 2), acc, tail);
      break;
    case T_Q4_K:
    case T_Q5_K: {
      const int five = t == T_Q5_K;
      const __m256i lo4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
      for (int64_t sb = 0; sb < nb / 8; ++sb, w += five ? 176 : 144) {
        const float d = h2f(w), dmin = h2f(w + 2);
        const __m256i qh = five ? _mm256_loadu_si256((const __m256i*)(w + 16)) : _mm256_setzero_si256();
        const uint8_t* qs = w + 16 + 32 * five;
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
          __m256i q0 = _mm256_and_si256(v, lo4), q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
          if (five) {
            q0 = _mm256_or_si256(q0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
            q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
          }
          int s0, m0, s1, m1;
          k_scale_min(w + 4, 2 * c, &s0, &m0);
          k_scale_min(w + 4, 2 * c + 1, &s1, &m1);
          acc_u(R, a, sb * 8 + 2 * c, q0, d * s0, -dmin * m0, acc, tail);
          acc_u(R, a, sb * 8 + 2 * c + 1, q1, d * s1, -dmin * m1, acc, tail);
        }
      }
      break;
    }
    case T_Q6_K: {
      const __m256i lo4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
      for (int64_t sb = 0; sb < nb / 8; ++sb, w += 210) {
        const float d = h2f(w + 208);
        const int8_t* sc = (const int8_t*)(w + 192);
        for (int n = 0; n < 2; ++n) {
          const __m256i A = _mm256_loadu_si256((const __m256i*)(w + 64 * n));
          const __m256i B = _mm256_loadu_si256((const __m256i*)(w + 64 * n + 32));
          const __m256i H = _mm256_loadu_si256((const __m256i*)(w + 128 + 32 * n));
          __m256i q[4];
          q[0] = _mm256_or_si256(_mm256_and_si256(A, lo4), _mm256_slli_epi16(_mm256_and_si256(H, two), 4));
          q[1] = _mm256_or_si256(_mm256_and_si256(B, lo4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), two), 4));
          q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), lo4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), two), 4));
          q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), lo4),
                                 _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), two), 4));
          for (int j = 0; j < 4; ++j) {
            const int i0 = 8 * n + 2 * j; /* the two 16-value scales of this 32-value block */
            const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[i0 + 1]), _mm_set1_epi16(sc[i0]));
            acc_s(R, a, sb * 8 + 4 * n + j, _mm256_sub_epi8(q[j], off), s, d, acc);
          }
        }
      }
      break;
    }
  }
  for (int r = 0; r < R; ++r) y[r * ldy] = hsum8(acc[r]) + tail[r];
}

static void dot_any(int R, int t, const uint8_t* w, const Act* a, float* y, int64_t ldy) {
  switch (R) { /* constant R: the row loops unroll and the accumulators stay in registers */
    case 1: dot_rows(1, t, w, a, y, ldy); break;
    case 2: dot_rows(2, t, w, a, y, ldy); break;
    case 3: dot_rows(3, t, w, a, y, ldy); break;
    default: dot_rows(4, t, w, a, y, ldy); break;
  }
}

/* y[M, ldy] (columns col[p] .. col[p] + n[p] for each part p) = x[M, K] @ W_p^T, for `parts` weight
 * matrices of n[p] rows each, stored as blocks of type t[p] at w[p] (a fused q/k/v whose parts were
 * stored in different formats is one call). Returns nonzero when scratch memory runs out. */
int gq_linear(const float* x, int64_t m, int64_t k, int parts, const uint8_t* const* w, const int* t,
              const int64_t* n, const int64_t* col, float* y, int64_t ldy) {
  const int64_t nb = k / QB;
  int8_t* xq = malloc((size_t)(m * k));
  float* xd = malloc((size_t)(m * nb) * 2 * sizeof(float));
  if (!xq || !xd) {
    free(xq);
    free(xd);
    return 1;
  }
  float* xs = xd + m * nb;
#pragma omp parallel for schedule(static) if (m > 1)
  for (int64_t r = 0; r < m; ++r) quantize_act(x + r * k, k, xq + r * k, xd + r * nb, xs + r * nb);
  int64_t chunks = 0;
  for (int p = 0; p < parts; ++p) chunks += (n[p] + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int p = 0;
    int64_t cc = c;
    while (cc >= (n[p] + CHUNK - 1) / CHUNK) cc -= (n[p++] + CHUNK - 1) / CHUNK;
    const int64_t rb = gq_row_bytes(t[p], k), o0 = cc * CHUNK, o1 = o0 + CHUNK < n[p] ? o0 + CHUNK : n[p];
    for (int64_t r0 = 0; r0 < m; r0 += 4) {
      const Act a = {xq + r0 * k, xd + r0 * nb, xs + r0 * nb, k, nb};
      const int R = m - r0 < 4 ? (int)(m - r0) : 4;
      for (int64_t o = o0; o < o1; ++o) dot_any(R, t[p], w[p] + o * rb, &a, y + r0 * ldy + col[p] + o, ldy);
    }
  }
  free(xq);
  free(xd);
  return 0;
}

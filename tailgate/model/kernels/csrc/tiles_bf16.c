/* A step's prompt rows against the AMX panels (the wide 4-bit Q4_K ones, the int8 ones) on BF16 tiles.
 *
 * Why: on AMX the 4-bit int8 tile path (q8.c amx4_rows) multiplies 32 inputs per tile op and then
 * sends every block's 16 x 16 int32 sums through memory to a float scale step, so a prompt of 256
 * rows runs at ~0.38 TMAC/s (random Q4_K 8192 x 2048, 11.3 ms, Intel Xeon AMX, 2 threads); with the
 * scale step taken away it was 7.4 ms, with the unpacking too 5.0 ms: the tile units sat idle. Here
 * each panel is dequantized once per call into bf16 B tiles (d * sc * q - dmin * m, rounded to
 * bf16) and the activations are rounded to bf16 once, so the fp32 sums stay in the tiles across a
 * whole chunk of inputs: no per-block float step at all. The int8 panels (code 3: Q6_K and Q8_0
 * matrices, and HF checkpoints' q8) pay the same per-block step in amx_rows and come here too.
 *
 * What it changes: prompt rows are products of bf16-rounded weights and activations (as vLLM's and
 * oneDNN's bf16 paths are) instead of int8 activations in blocks of 32. Only the rows of a prompt
 * segment long enough by its own length come here (native.py TILE_ROWS_INT8 / _4BIT; the step puts
 * them first, runtime/context.py), never decode rows, so no row's bits depend on its neighbours; a
 * prompt's do depend on its chunks' lengths (docs/kernels.md).
 *
 * Loop order per thread (each thread owns a contiguous run of panels, so no two write one output):
 * for each chunk of KC inputs, for each pair of panels, dequantize the pair's chunk (KC * 64 bytes)
 * and sweep every pair of 16-row tiles over it (4 C tiles, 2 A, 2 B: one tile load per product),
 * the partial sums kept in an fp32 buffer between chunks. The chunk's activations, laid out tile by
 * tile (rows 4 KiB apart had 16 rows of a tile in one L1 set: 5.6 -> 5.05 ms at 256 rows), stay in
 * L2 across the panels; the dequantized chunk in L1/L2 across the row tiles. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TQK 32   /* inputs per Q4_K sub-block (one B tile of bf16 pairs) */
#define TNW 16   /* outputs per wide panel */
#define TW4B 288 /* bytes per 16-output 4-bit block (q8.c W4B) */

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16")

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} bf16_tile_config;

/* Every tile 16 rows x 64 bytes: C 16 x 16 fp32; A 16 rows x 32 bf16; B 16 pairs of inputs x 16 outputs. */
static void bf16_configure(void) {
  bf16_tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  __asm__ volatile("" ::: "memory"); /* q8.c amx_configure: GCC 12 would drop the stores */
  _tile_loadconfig(&c);
}

/* vpermw's index that interleaves two rows of 16 bf16: word 2o <- word o, 2o + 1 <- word 16 + o. */
static const uint16_t PAIR[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* Four inputs' values for the 16 outputs (f[i]: input i) as two B tile rows at `row`: inputs 0, 1
 * side by side per output, then 2, 3. */
static inline __attribute__((always_inline)) void store_pairs(uint16_t* row, const __m512* f, const __m512i pair) {
  _mm512_store_si512((void*)row, _mm512_permutexvar_epi16(pair, (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0])));
  _mm512_store_si512((void*)(row + 32), _mm512_permutexvar_epi16(pair, (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2])));
}

/* Blocks [b0, b1) of one wide 4-bit panel (q8.c's layout: per block 4 x 64 nibble bytes, byte 4o + i
 * of vector t holding inputs 4t + i (low nibble) and 4t + 16 + i (high) of output o, then 16
 * sub-scales and 16 mins; per 256 inputs 16 fp16 d then 16 fp16 dmin) as bf16 B tiles, 512 words a
 * block: row r holds inputs 2r and 2r + 1 of the 16 outputs, side by side. */
static void dequant_q4k_panel(const uint8_t* w, const uint16_t* wd, int64_t b0, int64_t b1, uint16_t* out) {
  const __m512i lo4 = _mm512_set1_epi32(0xF);
  const __m512i pair = _mm512_loadu_si512((const void*)PAIR);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = w + b * TW4B;
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wd + (b / 8) * 32)));
    const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(wd + (b / 8) * 32 + 16)));
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 256))));
    const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + 272))));
    const __m512 dw = _mm512_mul_ps(dv, sc), nmw = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(mv, mn));
    uint16_t* ob = out + (b - b0) * 512;
    for (int t = 0; t < 4; ++t) {
      const __m512i nib = _mm512_loadu_si512((const void*)(wb + 64 * t));
      for (int h = 0; h < 2; ++h) { /* low nibbles: inputs 4t..4t+3; high: 4t+16.. */
        const int s = 4 * h;
        __m512 f[4];
        for (int i = 0; i < 4; ++i)
          f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(nib, 8 * i + s), lo4)), dw,
                                 nmw);
        store_pairs(ob + 2 * (t + 4 * h) * 32, f, pair); /* inputs 4t'..4t'+3, t' = t + 4h */
      }
    }
  }
}

/* Blocks [b0, b1) of one 16-output int8 panel (code 3: per block 8 x 64 bytes, byte 4o + i of row t
 * holding input 4t + i of output o, signed; then 16 fp32 scales a block) as bf16 B tiles. */
static void dequant_int8_panel(const int8_t* w, const float* wd, int64_t b0, int64_t b1, uint16_t* out) {
  const __m512i pair = _mm512_loadu_si512((const void*)PAIR);
  for (int64_t b = b0; b < b1; ++b) {
    const __m512 dw = _mm512_loadu_ps(wd + TNW * b);
    uint16_t* ob = out + (b - b0) * 512;
    for (int t = 0; t < 8; ++t) {
      const __m512i v = _mm512_loadu_si512((const void*)(w + b * 512 + 64 * t));
      __m512 f[4];
      for (int i = 0; i < 4; ++i)
        f[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * i), 24)), dw);
      store_pairs(ob + 2 * t * 32, f, pair);
    }
  }
}

/* C tile T in: zero on a chunk's first pass, else the partial sums from the buffer. */
#define C_IN(T, p)                     \
  do {                                 \
    if (first)                         \
      _tile_zero(T);                   \
    else                               \
      _tile_loadd(T, p, ldy);          \
  } while (0)

/* One row tile (two with `rows2`: the second `lda` words on) against one panel's B tiles at ba (two
 * with `two`: the second `ldb` words on) over a chunk's nbc blocks, the sums at ya (stride ldy
 * bytes; the second panel's 16 columns on, the second row tile's 16 rows down). C tiles 0, 1 are
 * row tile 0's, 2, 3 row tile 1's; A in 4, 5; B in 6, 7: with both, one tile load per product.
 * (The flags are the same for a whole sweep: their branches cost nothing beside a 16-cycle product.) */
static void sweep(const int rows2, const int two, const uint16_t* xa, int64_t lda, const uint16_t* ba, int64_t ldb,
                  int64_t nbc, float* ya, int64_t ldy, int first) {
  const uint16_t *xa1 = xa + lda, *bb = ba + ldb;
  float* ya1 = (float*)((char*)ya + 16 * ldy);
  C_IN(0, ya);
  if (two) C_IN(1, ya + TNW);
  if (rows2) C_IN(2, ya1);
  if (rows2 && two) C_IN(3, ya1 + TNW);
  for (int64_t j = 0; j < nbc; ++j) {
    _tile_loadd(4, xa + j * 512, 64);
    _tile_loadd(6, ba + j * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (two) {
      _tile_loadd(7, bb + j * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (rows2) {
      _tile_loadd(5, xa1 + j * 512, 64);
      _tile_dpbf16ps(2, 5, 6);
      if (two) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, ya, ldy);
  if (two) _tile_stored(1, ya + TNW, ldy);
  if (rows2) _tile_stored(2, ya1, ldy);
  if (rows2 && two) _tile_stored(3, ya1 + TNW, ldy);
}
#undef C_IN

/* One panel's blocks [b0, b1) as bf16 B tiles, in its own form. */
static void dequant(int code, const void* w, const void* wd, int64_t b0, int64_t b1, uint16_t* out) {
  if (code == 8)
    dequant_q4k_panel(w, wd, b0, b1, out);
  else
    dequant_int8_panel(w, wd, b0, b1, out);
}

/* y[r, c] for the columns of every AMX segment and its rows r < tile8 (code 3, the int8 panels) or
 * tile4 (code 8, the wide 4-bit panels) (q8.c q8_linear_seg's arguments), x fp32 [>= those rows,
 * k]. Returns 0, or -1 without scratch memory. */
int prompt_tiles_bf16(const float* x, int64_t tile8, int64_t tile4, int64_t k, int nseg, const void* const* seg_q,
                      const void* const* seg_d, const int64_t* seg_n, const int* codes, float* y, int64_t n) {
  const int64_t nb = k / TQK;
  int64_t np = 0, p = 0; /* panels tiled; their most rows */
  for (int s = 0; s < nseg; ++s) {
    const int64_t rows = codes[s] == 3 ? tile8 : codes[s] == 8 ? tile4 : 0;
    if (rows > 0) np += seg_n[s] / TNW, p = rows > p ? rows : p;
  }
  if (np == 0) return 0;
  const int64_t pp = (p + 15) / 16 * 16;
  /* Inputs per chunk: the chunk's activations (pp x KC bf16) at most 1 MiB, so they stay in L2
   * across the panels; as wide as that allows, since each chunk after the first reloads and stores
   * the partial sums (at 256 rows and chunks of 512, that traffic, 8 MiB a pass for 8192 outputs,
   * cost more than the products). */
  int64_t KC = (1 << 19) / pp / 256 * 256;
  if (KC < 256) KC = 256;
  if (KC > k) KC = k;
  uint16_t* xb = aligned_alloc(64, (size_t)(pp * k) * 2);
  float* yt = aligned_alloc(64, (size_t)(pp * np * TNW) * sizeof(float)); /* [pp, np * 16]: the panels' columns */
  const void** pw = malloc((size_t)np * sizeof(*pw));
  const void** pd = malloc((size_t)np * sizeof(*pd));
  int64_t* pc = malloc((size_t)np * sizeof(*pc));
  int64_t* pr = malloc((size_t)np * sizeof(*pr));
  int* pf = malloc((size_t)np * sizeof(*pf));
  if (!xb || !yt || !pw || !pd || !pc || !pr || !pf) {
    free(xb), free(yt), free(pw), free(pd), free(pc), free(pr), free(pf);
    return -1;
  }
  for (int64_t s = 0, at = 0, col = 0; s < nseg; col += seg_n[s], ++s) {
    const int64_t rows = codes[s] == 3 ? tile8 : codes[s] == 8 ? tile4 : 0;
    for (int64_t g = 0; rows > 0 && g < seg_n[s] / TNW; ++g, ++at) {
      if (codes[s] == 8) {
        pw[at] = (const uint8_t*)seg_q[s] + g * TNW * k * 9 / 16;
        pd[at] = (const uint16_t*)seg_d[s] + g * TNW * (k / 256) * 2;
      } else {
        pw[at] = (const int8_t*)seg_q[s] + g * TNW * k;
        pd[at] = (const float*)seg_d[s] + g * TNW * nb;
      }
      pc[at] = col + g * TNW, pr[at] = rows, pf[at] = codes[s];
    }
  }
  const int64_t ldt = np * TNW * (int64_t)sizeof(float);
  int failed = 0;
#pragma omp parallel
  {
    uint16_t* buf = aligned_alloc(64, 2 * (KC / TQK) * 1024);
    if (!buf) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < pp; ++r) { /* row r's 32 inputs of block j go to its tile's row r % 16 */
      const float* xr = x + r * k;
      for (int64_t j = 0; j < k; j += 32) {
        const int64_t c0 = j / KC * KC, w = c0 + KC < k ? KC : k - c0;
        uint16_t* o = xb + c0 * pp + (r / 16) * 16 * w + (j - c0) / TQK * 512 + (r % 16) * 32;
        if (r >= p)
          _mm512_store_si512((void*)o, _mm512_setzero_si512());
        else
          _mm512_store_si512((void*)o,
                             (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + j + 16), _mm512_loadu_ps(xr + j)));
      }
    }
    if (buf) {
      bf16_configure();
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t g0 = np * t / nt, g1 = np * (t + 1) / nt;
      for (int64_t c0 = 0; c0 < k; c0 += KC) {
        const int64_t nbc = (c0 + KC < k ? KC : k - c0) / TQK, b0 = c0 / TQK;
        for (int64_t g = g0; g < g1;) {
          const int two = g + 1 < g1 && pr[g + 1] == pr[g]; /* a pair of panels tiling the same rows */
          const int64_t half = (KC / TQK) * 512, rows = (pr[g] + 15) / 16 * 16;
          dequant(pf[g], pw[g], pd[g], b0, b0 + nbc, buf);
          if (two) dequant(pf[g + 1], pw[g + 1], pd[g + 1], b0, b0 + nbc, buf + half);
          for (int64_t r = 0; r < rows; r += 32) /* row tile r / 16 of the chunk, and the next */
            sweep(r + 16 < rows, two, xb + c0 * pp + r * nbc * TQK, 16 * nbc * TQK, buf, half, nbc,
                  yt + r * np * TNW + g * TNW, ldt, c0 == 0);
          g += two ? 2 : 1;
        }
      }
    }
    free(buf);
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p; ++r)
      for (int64_t g = 0; !failed && g < np; ++g)
        if (r < pr[g]) memcpy(y + r * n + pc[g], yt + r * np * TNW + g * TNW, TNW * sizeof(float));
  }
  free(xb), free(yt), free(pw), free(pd), free(pc), free(pr), free(pf);
  return failed ? -1 : 0;
}
#pragma GCC pop_options

/* A step's layers in one call, for the Llama-shaped families and Gemma 3
 * (runtime/native_layers.py): the same kernels the Python layer loops call (q8_linear_seg,
 * norm_rope, kv_write_f16, the prompt and decode attention, add_rms_norm, swiglu / geglu), in the
 * same order with the same arguments, so the same bits; only the
 * ~190 trips through Python and ctypes a step are gone. Why: a one-row step of Llama 3.2 1B's shape
 * (Q4_K_M, AMD EPYC Zen 4, 2 threads) spent 3.9 of its 25.3 ms outside the native calls, with the
 * second OpenMP thread waiting in libgomp through all of it (docs/kernels.md, "A step's layers in
 * one native call"). Steps with prompt rows (a walk round) came later: in the loop a 64-row round
 * beside 4 streams of Gemma 3 270M took 52.2 ms, in this call 48.2 (Zen 4).
 *
 * The layer table (int64, LAYER_WORDS a layer, built once per runner): for each of the four
 * matrices (q/k/v, o, gate/up, down) its segment count and up to 7 segments of (q, d, outputs,
 * code) as q8_linear_seg takes them; then the attention and MLP norms, the per-head q and k norms
 * (0: none), the layer's fp16 K and V pools, Gemma's post-attention and post-MLP norms (0: none,
 * Llama's plain residual adds) and the layer's KV family (0 global, 1 sliding). */
#include <stdint.h>
#include <stdlib.h>

int q8_linear_seg(const float* x, int64_t m, int64_t k, int nseg, const void* const* seg_q, const void* const* seg_d,
                  const int64_t* seg_n, const int* codes, float* y, int64_t n, int64_t tile8, int64_t tile4);
void norm_rope(const void* x, int x_bf16, int64_t ldx, int64_t rows, int64_t heads, int64_t d, const float* w,
               float eps, const float* cos_t, const float* sin_t, float* out);
void kv_write_f16(uint16_t* pool, int64_t width, const int64_t* slots, int64_t n, const void* src, int64_t ld,
                  int src_bf16);
void add_rms_norm(float* h, const void* a, int a_bf16, int64_t rows, int64_t n, const float* w1, const float* w2,
                  float eps, void* out, int out_bf16);
void swiglu(const void* gu, int bf16, int64_t rows, int64_t f, void* out);
void geglu(const void* gu, int bf16, int64_t rows, int64_t f, void* out);
int decode_attention_f16_8(const float* q, const uint16_t* kpool, const uint16_t* vpool, const int64_t* slots,
                           const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d, float scale,
                           float* out);
int decode_attention_f16_16(const float* q, const uint16_t* kpool, const uint16_t* vpool, const int64_t* slots,
                            const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d,
                            float scale, float* out);
int prompt_attention_8(const float* q, const void* kpool, const void* vpool, int half, const int64_t* slots,
                       const int64_t* starts, const int64_t* lens, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                       float scale, float* out);
int prompt_attention_16(const float* q, const void* kpool, const void* vpool, int half, const int64_t* slots,
                        const int64_t* starts, const int64_t* lens, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                        float scale, float* out);

#define MAX_SEG 7
#define MAT_WORDS (1 + 4 * MAX_SEG)
#define NORMS (4 * MAT_WORDS) /* attn, ffn, q, k norms, k pool, v pool, post-attn, post-ffn norms, family */
#define LAYER_WORDS (NORMS + 9)
/* a KV family's cos, sin, new rows' slots, the decode rows' keys' slots, key counts and width, its
 * prompt segments' count and their table (PROMPT_WORDS each: rows r0, r1, the keys' slots, each
 * row's start and count in them) */
#define FAM_WORDS 8
#define PROMPT_WORDS 5

int step_layer_words(void) { return LAYER_WORDS; }

/* y [m, n] = x [m, k] @ W^T for the matrix at `mat` in a layer's table; n is the segments' sum;
 * tiles[0] / tiles[1] leading rows to the AMX panels' BF16 tiles (q8_linear_seg's tile8 / tile4). */
static int matmul(const int64_t* mat, const float* x, int64_t m, int64_t k, float* y, const int64_t* tiles) {
  const int nseg = (int)mat[0];
  const void* q[MAX_SEG];
  const void* d[MAX_SEG];
  int64_t ns[MAX_SEG], n = 0;
  int codes[MAX_SEG];
  for (int s = 0; s < nseg; ++s) {
    const int64_t* e = mat + 1 + 4 * s;
    q[s] = (const void*)(intptr_t)e[0], d[s] = (const void*)(intptr_t)e[1], ns[s] = e[2], codes[s] = (int)e[3];
    n += ns[s];
  }
  return q8_linear_seg(x, m, k, nseg, q, d, ns, codes, y, n, tiles[0], tiles[1]);
}

/* Every layer of a step of t rows: prompt rows [0, d0) in segments, decode rows [d0, t). h [t, dm]
 * fp32: the residual stream, updated in place; x [t, dm] fp32: the first layer's normed input.
 * fams: per KV family (global, sliding) FAM_WORDS words: cos / sin [t, hd] fp32, each row's new K/V
 * slot [t], the keys each decode row attends over ([t - d0, width] slots, [t - d0] counts), width,
 * and the prompt segments, each through the prompt attention over its keys (as
 * layers.paged_attention calls it). glu: 0 SwiGLU, 1 GeGLU (tanh). tiles: the leading rows every
 * layer matrix runs on the AMX panels' BF16 tiles, as the loop's calls pass them (0, 0 elsewhere).
 * Returns 0, or -1 when scratch memory cannot be had. */
int step_layers(const int64_t* table, int64_t layers, float* h, float* x, int64_t t, int64_t d0, int64_t dm,
                int64_t hq, int64_t hkv, int64_t hd, int64_t ffn, float eps, int glu, const int64_t* fams, float scale,
                int lanes, int64_t tile8, int64_t tile4) {
  const int64_t tiles[2] = {tile8, tile4};
  const int64_t nqkv = (hq + 2 * hkv) * hd;
  float* qkv = malloc((size_t)(t * (nqkv + hq * hd + hkv * hd + hq * hd + dm + 2 * ffn + ffn + dm)) * sizeof(float));
  if (!qkv) return -1;
  float* q = qkv + t * nqkv;
  float* k = q + t * hq * hd;
  float* att = k + t * hkv * hd;
  float* o = att + t * hq * hd;
  float* gu = o + t * dm;
  float* act = gu + t * 2 * ffn;
  float* dn = act + t * ffn;
  int failed = 0;
#define PTR(T, v) ((T)(intptr_t)(v))
/* a kernel that fails (no scratch memory) ends the call there: nothing after it writes K/V or h */
#define RUN(call)                         \
  do {                                    \
    if ((failed = (call) != 0)) goto done; \
  } while (0)
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t* L = table + i * LAYER_WORDS;
    const int64_t* F = fams + L[NORMS + 8] * FAM_WORDS;
    const float *cos_t = PTR(const float*, F[0]), *sin_t = PTR(const float*, F[1]);
    const int64_t* wslots = PTR(const int64_t*, F[2]);
    uint16_t* kp = PTR(uint16_t*, L[NORMS + 4]);
    uint16_t* vp = PTR(uint16_t*, L[NORMS + 5]);
    RUN(matmul(L, x, t, dm, qkv, tiles));
    norm_rope(qkv, 0, nqkv, t, hq, hd, PTR(const float*, L[NORMS + 2]), eps, cos_t, sin_t, q);
    norm_rope(qkv + hq * hd, 0, nqkv, t, hkv, hd, PTR(const float*, L[NORMS + 3]), eps, cos_t, sin_t, k);
    kv_write_f16(kp, hkv * hd, wslots, t, k, hkv * hd, 0);
    kv_write_f16(vp, hkv * hd, wslots, t, qkv + (hq + hkv) * hd, nqkv, 0);
    for (int64_t s = 0; s < F[6]; ++s) { /* the prompt segments, in the step's order */
      const int64_t* P = PTR(const int64_t*, F[7]) + s * PROMPT_WORDS;
      RUN((lanes == 16 ? prompt_attention_16 : prompt_attention_8)(
          q + P[0] * hq * hd, kp, vp, 1, PTR(const int64_t*, P[2]), PTR(const int64_t*, P[3]),
          PTR(const int64_t*, P[4]), P[1] - P[0], hq, hkv, hd, scale, att + P[0] * hq * hd));
    }
    if (t > d0)
      RUN((lanes == 16 ? decode_attention_f16_16 : decode_attention_f16_8)(
          q + d0 * hq * hd, kp, vp, PTR(const int64_t*, F[3]), PTR(const int64_t*, F[4]), t - d0, F[5], hq, hkv, hd,
          scale, att + d0 * hq * hd));
    RUN(matmul(L + MAT_WORDS, att, t, hq * hd, o, tiles));
    add_rms_norm(h, o, 0, t, dm, PTR(const float*, L[NORMS + 6]), PTR(const float*, L[NORMS + 1]), eps, x, 0);
    RUN(matmul(L + 2 * MAT_WORDS, x, t, dm, gu, tiles));
    (glu ? geglu : swiglu)(gu, 0, t, ffn, act);
    RUN(matmul(L + 3 * MAT_WORDS, act, t, ffn, dn, tiles));
    /* the next layer's input norm rides the residual add; after the last, the add alone */
    const float* next = i + 1 < layers ? PTR(const float*, table[(i + 1) * LAYER_WORDS + NORMS]) : NULL;
    add_rms_norm(h, dn, 0, t, dm, PTR(const float*, L[NORMS + 7]), next, eps, next ? x : NULL, 0);
  }
done:
#undef RUN
#undef PTR
  free(qkv);
  return failed ? -1 : 0;
}

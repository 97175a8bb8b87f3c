/* The paged attention's body, included by attn.c once per vector width (see there for the design
 * and its measurements). The includer defines, for its width:
 *   VEC, LANES            the float vector type and its lanes (8 or 16)
 *   KB                    keys scored together (the accumulators are 4 heads x KB keys)
 *   FN(name)              the name with the width's suffix
 *   vzero() vset1(x) vload(p) vstore(p, v) vbcast(p) vfma(a, b, c) vadd vsub vmul vmax
 *   vloadkv(pool, i, half)  LANES pool values from element i, fp16 (half) or fp32, as floats
 *   vhsum(v) vhmax(v)     horizontal sum and max
 *   vmin vfnma(a, b, c) (c - a*b) vround(x) (to nearest) vpow2(n) (2^n for integral n)
 *   vzero_below(x, lo, v) v with the lanes where x < lo set to 0
 *   vsums(acc, s)         s[i] = the sum of acc[i]'s lanes, for the 4 * KB accumulators
 * Every function here is static and always inlined into the width's exported entry points. */

/* e^x lane-wise: Cephes' expf (x = n ln2 + r, |r| <= ln2/2, a degree-5 polynomial for e^r, times
 * 2^n through the exponent bits); within ~2 ulp of expf. Inputs below -87.3 give 0 (-inf too);
 * min/max return their second operand when one is NaN, so with x second a NaN score stays NaN
 * (as expf keeps it, and as the sampler then reports). The scalar expf per score was ~40 % of the
 * kernel (16 rows x 257 keys x 4 heads, Xeon, cached KV). */
static inline __attribute__((always_inline)) VEC FN(exp)(VEC x) {
  const VEC lo = vset1(-87.3f), x0 = x;
  x = vmin(vset1(88.3f), vmax(lo, x));
  const VEC n = vround(vmul(x, vset1(1.44269504088896341f)));
  VEC r = vfnma(n, vset1(0.693359375f), x);
  r = vfnma(n, vset1(-2.12194440e-4f), r);
  VEC y = vset1(1.9875691500e-4f);
  y = vfma(y, r, vset1(1.3981999507e-3f));
  y = vfma(y, r, vset1(8.3334519073e-3f));
  y = vfma(y, r, vset1(4.1665795894e-2f));
  y = vfma(y, r, vset1(1.6666665459e-1f));
  y = vfma(y, r, vset1(5.0000001201e-1f));
  y = vfma(y, vmul(r, r), vadd(r, vset1(1.0f)));
  return vzero_below(x0, lo, vmul(y, vpow2(n)));
}

/* Scores of JB query heads (rows qj + j*d) against KB keys at element offsets ko[k] (+ hoff, the
 * kv head's place in a slot's record): K is loaded and converted once for the JB heads, the
 * 4 x KB dot products are independent FMA chains, and their lanes are summed together at the end
 * (vsums: a transposing tree, ~3 instructions a score where one horizontal sum each took ~9; at
 * d = 64 those sums outnumbered the FMAs two to one). Writes p[j * VTILE + k] for k < valid. */
static inline __attribute__((always_inline)) void FN(score_group)(const float* qj, const void* kpool, int half,
                                                                  const int64_t* ko, int64_t hoff, int64_t d,
                                                                  float scale, float* p, int valid, const int JB) {
  VEC acc[4 * KB];
  for (int a = 0; a < 4 * KB; ++a) acc[a] = vzero();
  for (int64_t i = 0; i < d; i += LANES) {
    VEC x[KB];
    for (int k = 0; k < KB; ++k) x[k] = vloadkv(kpool, ko[k] + hoff + i, half);
    for (int j = 0; j < JB; ++j) {
      const VEC qv = vload(qj + j * d + i);
      for (int k = 0; k < KB; ++k) acc[j * KB + k] = vfma(qv, x[k], acc[j * KB + k]);
    }
  }
  float s[4 * KB];
  vsums(acc, s);
  if (valid == KB) /* constant bounds: unrolled into a few vector stores */
    for (int j = 0; j < JB; ++j)
      for (int k = 0; k < KB; ++k) p[j * VTILE + k] = s[j * KB + k] * scale;
  else
    for (int j = 0; j < JB; ++j)
      for (int k = 0; k < valid; ++k) p[j * VTILE + k] = s[j * KB + k] * scale;
}

/* o_j[i0 .. i0 + NC * LANES) = fac_j * o_j + sum_t p[j][t] V_t over one tile's n keys for JB heads:
 * NC x JB output vectors stay in registers across the tile's keys, each V chunk is loaded and
 * converted once for the JB heads, and each weight broadcast once for the NC chunks. */
static inline __attribute__((always_inline)) void FN(value_chunks)(const float* p, const float* fac,
                                                                   const void* vpool, int half, const int64_t* vo,
                                                                   int64_t n, int64_t hoff, int64_t d, float* o,
                                                                   int64_t i0, const int NC, const int JB) {
  VEC a[4][4];
  for (int j = 0; j < JB; ++j) {
    const VEC f = vset1(fac[j]);
    for (int c = 0; c < NC; ++c) a[c][j] = vmul(f, vload(o + j * d + i0 + c * LANES));
  }
  for (int64_t t = 0; t < n; ++t) {
    const int64_t v = vo[t] + hoff + i0;
    VEC x[4];
    for (int c = 0; c < NC; ++c) x[c] = vloadkv(vpool, v + c * LANES, half);
    for (int j = 0; j < JB; ++j) {
      const VEC pv = vbcast(p + j * VTILE + t);
      for (int c = 0; c < NC; ++c) a[c][j] = vfma(pv, x[c], a[c][j]);
    }
  }
  for (int j = 0; j < JB; ++j)
    for (int c = 0; c < NC; ++c) vstore(o + j * d + i0 + c * LANES, a[c][j]);
}

/* The value pass of one tile for JB heads over all of d: VNC chunks at a time (the registers the
 * width has), then the rest. At d = 256 (Gemma 3 270M) four AVX-512 chunks a pass instead of two
 * took 8 % off the kernel (16 rows x 512 keys, one thread, keys in cache). */
static inline __attribute__((always_inline)) void FN(value_group)(const float* p, const float* fac,
                                                                  const void* vpool, int half, const int64_t* vo,
                                                                  int64_t n, int64_t hoff, int64_t d, float* o,
                                                                  const int JB) {
  int64_t i0 = 0;
  for (; i0 + VNC * LANES <= d; i0 += VNC * LANES) FN(value_chunks)(p, fac, vpool, half, vo, n, hoff, d, o, i0, VNC, JB);
  for (; i0 + 2 * LANES <= d; i0 += 2 * LANES) FN(value_chunks)(p, fac, vpool, half, vo, n, hoff, d, o, i0, 2, JB);
  if (i0 < d) FN(value_chunks)(p, fac, vpool, half, vo, n, hoff, d, o, i0, 1, JB);
}

/* One span of one row, all heads: keys sl[0 .. n), one KV page (VTILE keys) at a time, K and V
 * read from the same records while they are in cache, with a running max per head (the softmax
 * of flash decoding). On return o [hq, d] holds sum_t e^(s_t - m) V_t, m[hh] the max score, l[hh]
 * the sum of e^(s_t - m). The next page's records are fetched while this one is computed (a page
 * is 16 whole records, contiguous in the pool), up to key nf >= n: past the span, into the row's
 * next one. Scratch: p [hq * VTILE + hq] floats. */
static inline __attribute__((always_inline)) void FN(span)(const float* qr, const void* kpool, const void* vpool,
                                                           int half, const int64_t* sl, int64_t n, int64_t nf, int64_t hq,
                                                           int64_t hkv, int64_t d, float scale, float* o, float* m,
                                                           float* l, float* p) {
  const int64_t g = hq / hkv, rec = hkv * d, esz = half ? 2 : 4;
  float* fac = p + hq * VTILE;
  memset(o, 0, (size_t)(hq * d) * sizeof(float));
  for (int64_t hh = 0; hh < hq; ++hh) m[hh] = -INFINITY, l[hh] = 0.0f;
  for (int64_t t0 = 0; t0 < n; t0 += VTILE) {
    const int64_t tn = n - t0 < VTILE ? n - t0 : VTILE;
    int64_t ko[VTILE];
    for (int64_t t = 0; t < VTILE; ++t) ko[t] = sl[t0 + (t < tn ? t : tn - 1)] * rec;
    for (int64_t t = 0; t < tn; t += KB) {
      const int valid = tn - t < KB ? (int)(tn - t) : KB;
      for (int64_t h = 0; h < hkv; ++h) {
        /* the same keys' and head's K and V in the next page, a few lines between the dot products:
         * the whole next page at once (512 lines at 1B's shape) stalled the core on its miss
         * buffers, and fetching two or four pages ahead was slower than one */
        for (int64_t k = t0 + VTILE + t; k < nf && k < t0 + VTILE + t + KB; ++k)
          prefetch_row((const char*)kpool + (sl[k] * rec + h * d) * esz, (const char*)vpool + (sl[k] * rec + h * d) * esz,
                       d * esz);
        for (int64_t j0 = 0; j0 < g; j0 += 4) {
          const float* qj = qr + (h * g + j0) * d;
          float* pj = p + (h * g + j0) * VTILE + t;
#define SCORE(JB) FN(score_group)(qj, kpool, half, ko + t, h * d, d, scale, pj, valid, JB)
          BY_HEADS(g - j0, SCORE);
#undef SCORE
        }
      }
    }
    for (int64_t hh = 0; hh < hq; ++hh) { /* the running softmax: e^(s - m_new), old sums scaled */
      float* ph = p + hh * VTILE;
      for (int64_t t = tn; t < VTILE; ++t) ph[t] = -INFINITY;
      VEC mv = vload(ph);
      for (int64_t t = LANES; t < VTILE; t += LANES) mv = vmax(mv, vload(ph + t));
      const float mt = vhmax(mv), mn = m[hh] > mt ? m[hh] : mt;
      VEC sv = vzero();
      for (int64_t t = 0; t < VTILE; t += LANES) {
        const VEC e = FN(exp)(vsub(vload(ph + t), vset1(mn)));
        vstore(ph + t, e);
        sv = vadd(sv, e);
      }
      fac[hh] = expf(m[hh] - mn);
      l[hh] = l[hh] * fac[hh] + vhsum(sv);
      m[hh] = mn;
    }
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t j0 = 0; j0 < g; j0 += 4) {
        const int64_t hh = h * g + j0;
        const float *pj = p + hh * VTILE, *fj = fac + hh;
        float* oj = o + hh * d;
#define VALUE(JB) FN(value_group)(pj, fj, vpool, half, ko, tn, h * d, d, oj, JB)
        BY_HEADS(g - j0, VALUE);
#undef VALUE
      }
  }
}

/* oh[0 .. d) /= sum (0 when sum is 0: a row of no keys). */
static inline __attribute__((always_inline)) void FN(normalise)(float* oh, float sum, int64_t d) {
  const VEC inv = vset1(sum > 0.0f ? 1.0f / sum : 0.0f);
  for (int64_t i = 0; i < d; i += LANES) vstore(oh + i, vmul(inv, vload(oh + i)));
}

/* The merge of a split row's spans (in span order): out = sum_k e^(m_k - M) o_k / sum_k e^(m_k - M) l_k
 * per head, M the largest of the spans' maxima. */
static inline __attribute__((always_inline)) void FN(merge)(const float* pt, int64_t s, int64_t part, int64_t hq,
                                                            int64_t d, float* o) {
  for (int64_t hh = 0; hh < hq; ++hh) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t k = 0; k < s; ++k) {
      const float mk = pt[k * part + hq * d + hh];
      mx = mk > mx ? mk : mx;
    }
    float* oh = o + hh * d;
    for (int64_t k = 0; k < s; ++k) {
      const float* pk = pt + k * part;
      const float f = expf(pk[hq * d + hh] - mx);
      sum += f * pk[hq * d + hq + hh];
      for (int64_t i = 0; i < d; i += LANES)
        vstore(oh + i, vfma(vset1(f), vload(pk + hh * d + i), k ? vload(oh + i) : vzero()));
    }
    FN(normalise)(oh, sum, d);
  }
}

/* q [b, hq, d]; pools [slots, hkv, d]; row i attends over slots[i * rstride + starts[i] ...] for
 * lens[i] keys (starts NULL: from 0); out [b, hq, d]. Decode rows pass their own slot rows
 * (rstride: the width of slots); prompt rows share one slot vector (rstride 0), each row its causal
 * (and window) range of it. A row's keys split into spans (attn_span_len: from its length alone),
 * one task each, so a lone long row still keeps every thread busy; a row of several spans is then
 * merged in span order. Neither depends on the batch or the thread count, so a row's bits do not,
 * and a prompt row attends exactly as a decode row at its position would. Rows go in groups whose
 * split spans fit the partial results' scratch (ATTN_GROUP_BYTES). d must be a multiple of LANES
 * and hq a multiple of hkv. Returns 0, or -1 without scratch memory. Always inlined with a
 * constant `half`. */
static inline __attribute__((always_inline)) int FN(attend)(const float* q, const void* kpool, const void* vpool,
                                                            int half, const int64_t* slots, const int64_t* starts,
                                                            const int64_t* lens, int64_t b, int64_t rstride,
                                                            int64_t hq, int64_t hkv, int64_t d, float scale,
                                                            float* out) {
  const int64_t part = hq * d + 2 * hq, cap_bytes = ATTN_GROUP_BYTES / (part * (int64_t)sizeof(float));
  const int64_t cap = cap_bytes > ATTN_MAX_SPANS ? cap_bytes : ATTN_MAX_SPANS;
  int64_t nt = 0, ng = 0, split = 0;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t s = attn_spans(lens[r]);
    nt += s, split += s > 1 ? s : 0;
  }
  /* per task: row, span, and its partial's place in the group's scratch (-1: the row's only span);
   * group g is tasks [gs[g], gs[g + 1]) */
  int64_t* tk = malloc((size_t)(3 * nt + b + 1) * sizeof(int64_t));
  float* parts = malloc((size_t)((split < cap ? split : cap) * part + 1) * sizeof(float)); /* no more than used */
  if (!tk || !parts) {
    free(tk);
    free(parts);
    return -1;
  }
  int64_t *trow = tk, *tspan = tk + nt, *tpart = tk + 2 * nt, *gs = tk + 3 * nt;
  for (int64_t r = 0, t = 0, used = 0; r < b; ++r) {
    const int64_t s = attn_spans(lens[r]), more = s > 1 ? s : 0;
    if (r == 0 || used + more > cap) gs[ng++] = t, used = 0;
    for (int64_t k = 0; k < s; ++k, ++t) trow[t] = r, tspan[t] = k, tpart[t] = more ? used + k : -1;
    used += more;
  }
  gs[ng] = nt;
  int failed = 0;
#pragma omp parallel
  {
    float* p = malloc((size_t)(hq * VTILE + 3 * hq) * sizeof(float));
    if (!p) {
#pragma omp atomic write
      failed = 1;
    }
    for (int64_t gi = 0; gi < ng; ++gi) {
      /* guided: each thread takes runs of consecutive tasks (a row's spans in order), so a span's
       * last page fetches the next span's first; one task at a time (dynamic, 1) left every
       * span's first page unfetched: 64 rows x 512 keys at Gemma 3 270M's shape, 2.1-2.3 ms against
       * 1.9 guided, and 1.85-1.95 with no split at all (Zen 4, two threads, pool from memory) */
#pragma omp for schedule(guided)
      for (int64_t t = gs[gi]; t < gs[gi + 1]; ++t) {
        if (!p) continue;
        const int64_t row = trow[t], n = lens[row], len = attn_span_len(n), k0 = tspan[t] * len;
        const int64_t kn = n - k0 < len ? n - k0 : len;
        const int64_t* sl = slots + row * rstride + (starts ? starts[row] : 0) + k0;
        const float* qr = q + row * hq * d;
        if (tpart[t] < 0) { /* the row's only span: accumulate in place, then normalise */
          float *o = out + row * hq * d, *ml = p + hq * VTILE + hq;
          FN(span)(qr, kpool, vpool, half, sl, kn, n - k0, hq, hkv, d, scale, o, ml, ml + hq, p);
          for (int64_t hh = 0; hh < hq; ++hh) FN(normalise)(o + hh * d, ml[hq + hh], d);
        } else {
          float* pt = parts + tpart[t] * part;
          FN(span)(qr, kpool, vpool, half, sl, kn, n - k0, hq, hkv, d, scale, pt, pt + hq * d, pt + hq * d + hq, p);
        }
      }
#pragma omp for schedule(static)
      for (int64_t t = gs[gi]; t < gs[gi + 1]; ++t)
        if (tpart[t] >= 0 && tspan[t] == 0)
          FN(merge)(parts + tpart[t] * part, attn_spans(lens[trow[t]]), part, hq, d, out + trow[t] * hq * d);
    }
    free(p);
  }
  free(tk);
  free(parts);
  return failed ? -1 : 0;
}

int FN(decode_attention)(const float* q, const float* kpool, const float* vpool, const int64_t* slots,
                         const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d, float scale,
                         float* out) {
  return FN(attend)(q, kpool, vpool, 0, slots, NULL, lens, b, w, hq, hkv, d, scale, out);
}

/* The same over fp16 pools (uint16 storage of IEEE half). */
int FN(decode_attention_f16)(const float* q, const uint16_t* kpool, const uint16_t* vpool, const int64_t* slots,
                             const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d,
                             float scale, float* out) {
  return FN(attend)(q, kpool, vpool, 1, slots, NULL, lens, b, w, hq, hkv, d, scale, out);
}

/* Prompt rows (see attend): slots [K] shared, row i over slots[starts[i] .. starts[i] + lens[i]);
 * `half`: fp16 pools. */
int FN(prompt_attention)(const float* q, const void* kpool, const void* vpool, int half, const int64_t* slots,
                         const int64_t* starts, const int64_t* lens, int64_t b, int64_t hq, int64_t hkv, int64_t d,
                         float scale, float* out) {
  return half ? FN(attend)(q, kpool, vpool, 1, slots, starts, lens, b, 0, hq, hkv, d, scale, out)
              : FN(attend)(q, kpool, vpool, 0, slots, starts, lens, b, 0, hq, hkv, d, scale, out);
}

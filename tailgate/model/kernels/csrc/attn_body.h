/* The decode attention's body, included by attn.c once per vector width (see there for the design
 * and its measurements). The includer defines, for its width:
 *   VEC, LANES            the float vector type and its lanes (8 or 16)
 *   FN(name)              the name with the width's suffix
 *   vzero() vset1(x) vload(p) vstore(p, v) vbcast(p) vfma(a, b, c) vadd vsub vmul vmax
 *   vloadkv(pool, i, half)  LANES pool values from element i, fp16 (half) or fp32, as floats
 *   vhsum(v) vhmax(v)     horizontal sum and max
 *   vmin vfnma(a, b, c) (c - a*b) vround(x) (to nearest) vpow2(n) (2^n for integral n)
 *   vzero_below(x, lo, v) v with the lanes where x < lo set to 0
 * Every function here is static and always inlined into the width's exported entry point. */

/* e^x lane-wise: Cephes' expf (x = n ln2 + r, |r| <= ln2/2, a degree-5 polynomial for e^r, times
 * 2^n through the exponent bits); within ~2 ulp of expf. Inputs below -87.3 give 0; min/max
 * return their second operand when one is NaN, so with x second a NaN score stays NaN (as expf
 * keeps it, and as the sampler then reports) whatever its position in the row. The scalar expf
 * per score was ~40 % of the kernel (16 rows x 257 keys x 4 heads, Xeon, cached KV). */
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

/* In place: p[t] = e^(p[t] - max) / sum, LANES at a time (the tail through expf). */
static inline __attribute__((always_inline)) void FN(softmax)(float* p, int64_t n) {
  int64_t t = 0;
  VEC vm = vset1(-INFINITY);
  for (; t + LANES <= n; t += LANES) vm = vmax(vm, vload(p + t));
  float mx = vhmax(vm), sum = 0.0f;
  for (; t < n; ++t) mx = p[t] > mx ? p[t] : mx;
  const VEC vmx = vset1(mx);
  VEC vs = vzero();
  for (t = 0; t + LANES <= n; t += LANES) {
    const VEC e = FN(exp)(vsub(vload(p + t), vmx));
    vstore(p + t, e);
    vs = vadd(vs, e);
  }
  for (int64_t u = t; u < n; ++u) sum += (p[u] = expf(p[u] - mx));
  sum += vhsum(vs);
  const VEC inv = vset1(1.0f / sum);
  for (t = 0; t + LANES <= n; t += LANES) vstore(p + t, vmul(vload(p + t), inv));
  for (; t < n; ++t) p[t] *= 1.0f / sum;
}

/* Scores of JB query heads (rows qr + j*d) against every key of one kv head, two keys at a
 * time: K is loaded and converted once for the JB heads, and the 2 x JB accumulators are
 * independent FMA chains (one chain per dot product was latency-bound: ~4x slower). */
static inline __attribute__((always_inline)) void FN(scores)(const float* qr, const void* kpool, const void* vpool,
                                                             int half, const int64_t* sl, int64_t n, int64_t hkv,
                                                             int64_t h, int64_t d, float scale, float* p, int64_t w,
                                                             const int JB) {
  int64_t t = 0;
  const int64_t esz = half ? 2 : 4;
  for (; t + 1 < n; t += 2) {
    const int64_t k0 = (sl[t] * hkv + h) * d, k1 = (sl[t + 1] * hkv + h) * d;
    /* The pool is read page by page in the rows' own slot order, so the hardware prefetcher
     * loses the stream at every page edge: fetch K a few keys ahead, and this key's V now so the
     * value pass finds it in cache (both streams in flight at once instead of one after the
     * other). */
    if (t + PREFETCH_KEYS + 1 < n)
      prefetch_row((const char*)kpool + (sl[t + PREFETCH_KEYS] * hkv + h) * d * esz,
                   (const char*)kpool + (sl[t + PREFETCH_KEYS + 1] * hkv + h) * d * esz, d * esz);
    prefetch_row((const char*)vpool + k0 * esz, (const char*)vpool + k1 * esz, d * esz);

    VEC a0[4], a1[4];
    for (int j = 0; j < JB; ++j) a0[j] = a1[j] = vzero();
    for (int64_t i = 0; i < d; i += LANES) {
      const VEC x0 = vloadkv(kpool, k0 + i, half), x1 = vloadkv(kpool, k1 + i, half);
      for (int j = 0; j < JB; ++j) {
        const VEC qv = vload(qr + j * d + i);
        a0[j] = vfma(qv, x0, a0[j]);
        a1[j] = vfma(qv, x1, a1[j]);
      }
    }
    for (int j = 0; j < JB; ++j) {
      p[j * w + t] = vhsum(a0[j]) * scale;
      p[j * w + t + 1] = vhsum(a1[j]) * scale;
    }
  }
  for (; t < n; ++t) {
    const int64_t k0 = (sl[t] * hkv + h) * d;
    VEC a0[4];
    for (int j = 0; j < JB; ++j) a0[j] = vzero();
    for (int64_t i = 0; i < d; i += LANES) {
      const VEC x0 = vloadkv(kpool, k0 + i, half);
      for (int j = 0; j < JB; ++j) a0[j] = vfma(vload(qr + j * d + i), x0, a0[j]);
    }
    for (int j = 0; j < JB; ++j) p[j * w + t] = vhsum(a0[j]) * scale;
  }
}

/* o_j = sum_t p[j][t] V_t for JB heads. Keys go in tiles of 16 (one KV page, 8 KB of fp16
 * values at d = 256, read from memory once and then from L1); within a tile, 2 x LANES output
 * floats of the JB heads at a time stay in registers across its keys, and each V chunk is loaded
 * and converted once for the JB heads. (Registers across *all* keys instead read V in small
 * pieces 16 times over: strided, and twice as slow once the pool is not in cache.) */
static inline __attribute__((always_inline)) void FN(values)(const float* p, int64_t w, const void* vpool, int half,
                                                             const int64_t* sl, int64_t n, int64_t hkv, int64_t h,
                                                             int64_t d, float* o, const int JB) {
  memset(o, 0, (size_t)(JB * d) * sizeof(float));
  for (int64_t t0 = 0; t0 < n; t0 += VTILE) {
    const int64_t t1 = t0 + VTILE < n ? t0 + VTILE : n;
    int64_t i0 = 0;
    for (; i0 + 2 * LANES <= d; i0 += 2 * LANES) {
      VEC a0[4], a1[4];
      for (int j = 0; j < JB; ++j) {
        a0[j] = vload(o + j * d + i0);
        a1[j] = vload(o + j * d + i0 + LANES);
      }
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t v = (sl[t] * hkv + h) * d + i0;
        const VEC x0 = vloadkv(vpool, v, half), x1 = vloadkv(vpool, v + LANES, half);
        for (int j = 0; j < JB; ++j) {
          const VEC pv = vbcast(p + j * w + t);
          a0[j] = vfma(pv, x0, a0[j]);
          a1[j] = vfma(pv, x1, a1[j]);
        }
      }
      for (int j = 0; j < JB; ++j) {
        vstore(o + j * d + i0, a0[j]);
        vstore(o + j * d + i0 + LANES, a1[j]);
      }
    }
    if (i0 < d) { /* d % (2 * LANES) == LANES */
      VEC a0[4];
      for (int j = 0; j < JB; ++j) a0[j] = vload(o + j * d + i0);
      for (int64_t t = t0; t < t1; ++t) {
        const VEC x0 = vloadkv(vpool, (sl[t] * hkv + h) * d + i0, half);
        for (int j = 0; j < JB; ++j) a0[j] = vfma(vbcast(p + j * w + t), x0, a0[j]);
      }
      for (int j = 0; j < JB; ++j) vstore(o + j * d + i0, a0[j]);
    }
  }
}

/* q [b, hq, d]; pools [slots, hkv, d]; row i attends over slots[i * rstride + starts[i] ...] for
 * lens[i] keys (starts NULL: from 0), at most w of them; out [b, hq, d]. Decode rows pass their own
 * slot rows (rstride w); prompt rows share one slot vector (rstride 0), each row its causal (and
 * window) range of it, so a prompt row attends exactly as a decode row at its position would.
 * d must be a multiple of LANES and hq a multiple of hkv. Returns 0, or -1 without scratch memory.
 * Always inlined with a constant `half`, so each exported variant has its own loads; the query
 * heads of a kv head go through in blocks of up to 4 (a constant block size per call, so the
 * accumulators stay in registers). */
static inline __attribute__((always_inline)) int FN(attend)(const float* q, const void* kpool, const void* vpool,
                                                            int half, const int64_t* slots, const int64_t* starts,
                                                            const int64_t* lens, int64_t b, int64_t rstride, int64_t w,
                                                            int64_t hq, int64_t hkv, int64_t d, float scale, float* out) {
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
      const int64_t* sl = slots + row * rstride + (starts ? starts[row] : 0);
      const float* qr = q + (row * hq + h * g) * d;
      float* o = out + (row * hq + h * g) * d;
      for (int64_t j0 = 0; j0 < g; j0 += 4) {
        const float* qj = qr + j0 * d;
        float* pj = p + j0 * w;
        switch (g - j0 >= 4 ? 4 : (int)(g - j0)) {
          case 4: FN(scores)(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 4); break;
          case 3: FN(scores)(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 3); break;
          case 2: FN(scores)(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 2); break;
          default: FN(scores)(qj, kpool, vpool, half, sl, n, hkv, h, d, scale, pj, w, 1); break;
        }
      }
      for (int64_t j = 0; j < g; ++j) FN(softmax)(p + j * w, n);
      for (int64_t j0 = 0; j0 < g; j0 += 4) {
        const float* pj = p + j0 * w;
        float* oj = o + j0 * d;
        switch (g - j0 >= 4 ? 4 : (int)(g - j0)) {
          case 4: FN(values)(pj, w, vpool, half, sl, n, hkv, h, d, oj, 4); break;
          case 3: FN(values)(pj, w, vpool, half, sl, n, hkv, h, d, oj, 3); break;
          case 2: FN(values)(pj, w, vpool, half, sl, n, hkv, h, d, oj, 2); break;
          default: FN(values)(pj, w, vpool, half, sl, n, hkv, h, d, oj, 1); break;
        }
      }
    }
    free(p);
  }
  return failed ? -1 : 0;
}

int FN(decode_attention)(const float* q, const float* kpool, const float* vpool, const int64_t* slots,
                         const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d, float scale,
                         float* out) {
  return FN(attend)(q, kpool, vpool, 0, slots, NULL, lens, b, w, w, hq, hkv, d, scale, out);
}

/* The same over fp16 pools (uint16 storage of IEEE half). */
int FN(decode_attention_f16)(const float* q, const uint16_t* kpool, const uint16_t* vpool, const int64_t* slots,
                             const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv, int64_t d,
                             float scale, float* out) {
  return FN(attend)(q, kpool, vpool, 1, slots, NULL, lens, b, w, w, hq, hkv, d, scale, out);
}

/* Prompt rows (see attend): slots [K] shared, row i over slots[starts[i] .. starts[i] + lens[i]),
 * w >= every lens[i]; `half`: fp16 pools. */
int FN(prompt_attention)(const float* q, const void* kpool, const void* vpool, int half, const int64_t* slots,
                         const int64_t* starts, const int64_t* lens, int64_t b, int64_t w, int64_t hq, int64_t hkv,
                         int64_t d, float scale, float* out) {
  return half ? FN(attend)(q, kpool, vpool, 1, slots, starts, lens, b, 0, w, hq, hkv, d, scale, out)
              : FN(attend)(q, kpool, vpool, 0, slots, starts, lens, b, 0, w, hq, hkv, d, scale, out);
}

/* kn_lanes_avx2.c - four rows of a packed symmetric matrix against eight
 * interleaved difference rows (kn_lanes.h).  Multiplies and adds stay
 * separate instructions (the fp-contract pragma: GCC may otherwise fuse
 * them), so each lane rounds as the scalar chain does. */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "kn_lanes.h"

/* acc[g * 8 + r] += c_g[k] * d[k * 8 + r] for k in [k0, k1), with c_g[k]
 * = 2 row[g][k] when dbl (a constant at each call: the branch folds)
 * else row[g][k].  Named registers for the sums (an array may stay in
 * memory). */
static inline __attribute__((always_inline)) void
quad4_run(const double *const row[4], const double *d, size_t k0, size_t k1,
          double acc[4 * KN_QUAD_LANES], int dbl)
{
    const __m256d two = _mm256_set1_pd(2.0);
    __m256d a00 = _mm256_loadu_pd(acc + 0), a01 = _mm256_loadu_pd(acc + 4),
            a10 = _mm256_loadu_pd(acc + 8), a11 = _mm256_loadu_pd(acc + 12),
            a20 = _mm256_loadu_pd(acc + 16), a21 = _mm256_loadu_pd(acc + 20),
            a30 = _mm256_loadu_pd(acc + 24), a31 = _mm256_loadu_pd(acc + 28);
    const double *r0 = row[0], *r1 = row[1], *r2 = row[2], *r3 = row[3];
    for (size_t k = k0; k < k1; k++) {
        __m256d x0 = _mm256_loadu_pd(d + k * KN_QUAD_LANES);
        __m256d x1 = _mm256_loadu_pd(d + k * KN_QUAD_LANES + 4);
        __m256d c0 = _mm256_set1_pd(r0[k]), c1 = _mm256_set1_pd(r1[k]),
                c2 = _mm256_set1_pd(r2[k]), c3 = _mm256_set1_pd(r3[k]);
        if (dbl) {
            c0 = _mm256_mul_pd(two, c0);
            c1 = _mm256_mul_pd(two, c1);
            c2 = _mm256_mul_pd(two, c2);
            c3 = _mm256_mul_pd(two, c3);
        }
        a00 = _mm256_add_pd(a00, _mm256_mul_pd(c0, x0));
        a01 = _mm256_add_pd(a01, _mm256_mul_pd(c0, x1));
        a10 = _mm256_add_pd(a10, _mm256_mul_pd(c1, x0));
        a11 = _mm256_add_pd(a11, _mm256_mul_pd(c1, x1));
        a20 = _mm256_add_pd(a20, _mm256_mul_pd(c2, x0));
        a21 = _mm256_add_pd(a21, _mm256_mul_pd(c2, x1));
        a30 = _mm256_add_pd(a30, _mm256_mul_pd(c3, x0));
        a31 = _mm256_add_pd(a31, _mm256_mul_pd(c3, x1));
    }
    _mm256_storeu_pd(acc + 0, a00);
    _mm256_storeu_pd(acc + 4, a01);
    _mm256_storeu_pd(acc + 8, a10);
    _mm256_storeu_pd(acc + 12, a11);
    _mm256_storeu_pd(acc + 16, a20);
    _mm256_storeu_pd(acc + 20, a21);
    _mm256_storeu_pd(acc + 24, a30);
    _mm256_storeu_pd(acc + 28, a31);
}

void kn_avx2_quad4(const double *const row[4], const double *d, size_t i0,
                   size_t n, double acc[4 * KN_QUAD_LANES])
{
    const __m256d two = _mm256_set1_pd(2.0);
    __m256d a[4][2];
    for (int g = 0; g < 4; g++) {
        size_t i = i0 + (size_t)g;
        __m256d h = _mm256_set1_pd(row[g][i]);
        a[g][0] = _mm256_mul_pd(h, _mm256_loadu_pd(d + i * KN_QUAD_LANES));
        a[g][1] = _mm256_mul_pd(h, _mm256_loadu_pd(d + i * KN_QUAD_LANES + 4));
    }
    /* the staggered start: row i0 + g alone up to column i0 + 3 */
    for (size_t k = i0 + 1; k < i0 + 4; k++) {
        __m256d x0 = _mm256_loadu_pd(d + k * KN_QUAD_LANES);
        __m256d x1 = _mm256_loadu_pd(d + k * KN_QUAD_LANES + 4);
        for (size_t g = 0; i0 + g < k; g++) {
            __m256d c = _mm256_mul_pd(two, _mm256_set1_pd(row[g][k]));
            a[g][0] = _mm256_add_pd(a[g][0], _mm256_mul_pd(c, x0));
            a[g][1] = _mm256_add_pd(a[g][1], _mm256_mul_pd(c, x1));
        }
    }
    for (int g = 0; g < 4; g++) {
        _mm256_storeu_pd(acc + g * KN_QUAD_LANES, a[g][0]);
        _mm256_storeu_pd(acc + g * KN_QUAD_LANES + 4, a[g][1]);
    }
    /* the shared part: all four rows from column i0 + 4 */
    quad4_run(row, d, i0 + 4, n, acc, 1);
}

void kn_avx2_quad4_acc(const double *const row[4], const double *d, size_t k0,
                       size_t k1, double acc[4 * KN_QUAD_LANES])
{
    quad4_run(row, d, k0, k1, acc, 0);
}

void kn_avx2_refit_step(const double *u, const double *a, const double *wd,
                        double *hw, const double w[KN_QUAD_LANES], size_t k0,
                        size_t k1, double sa[KN_QUAD_LANES],
                        double hwi[KN_QUAD_LANES])
{
    __m256d s0 = _mm256_loadu_pd(sa), s1 = _mm256_loadu_pd(sa + 4);
    __m256d h0 = _mm256_loadu_pd(hwi), h1 = _mm256_loadu_pd(hwi + 4);
    __m256d w0 = _mm256_loadu_pd(w), w1 = _mm256_loadu_pd(w + 4);
    for (size_t k = k0; k < k1; k++) {
        __m256d c = _mm256_set1_pd(u[k]);
        const double *ak = a + k * KN_QUAD_LANES, *dk = wd + k * KN_QUAD_LANES;
        double *hk = hw + k * KN_QUAD_LANES;
        s0 = _mm256_add_pd(s0, _mm256_mul_pd(c, _mm256_loadu_pd(ak)));
        s1 = _mm256_add_pd(s1, _mm256_mul_pd(c, _mm256_loadu_pd(ak + 4)));
        h0 = _mm256_add_pd(h0, _mm256_mul_pd(c, _mm256_loadu_pd(dk)));
        h1 = _mm256_add_pd(h1, _mm256_mul_pd(c, _mm256_loadu_pd(dk + 4)));
        _mm256_storeu_pd(hk, _mm256_add_pd(_mm256_loadu_pd(hk), _mm256_mul_pd(w0, c)));
        _mm256_storeu_pd(hk + 4,
                         _mm256_add_pd(_mm256_loadu_pd(hk + 4), _mm256_mul_pd(w1, c)));
    }
    _mm256_storeu_pd(sa, s0);
    _mm256_storeu_pd(sa + 4, s1);
    _mm256_storeu_pd(hwi, h0);
    _mm256_storeu_pd(hwi + 4, h1);
}

void kn_avx2_refit_step2(const double *const u[2], const double *a,
                         const double *wd, double *hw,
                         const double *const w[2], size_t k0, size_t k1,
                         double *const sa[2], double *const hwi[2])
{
    const double *u0 = u[0], *u1 = u[1];
    __m256d s00 = _mm256_loadu_pd(sa[0]), s01 = _mm256_loadu_pd(sa[0] + 4);
    __m256d s10 = _mm256_loadu_pd(sa[1]), s11 = _mm256_loadu_pd(sa[1] + 4);
    __m256d h00 = _mm256_loadu_pd(hwi[0]), h01 = _mm256_loadu_pd(hwi[0] + 4);
    __m256d h10 = _mm256_loadu_pd(hwi[1]), h11 = _mm256_loadu_pd(hwi[1] + 4);
    const __m256d w00 = _mm256_loadu_pd(w[0]), w01 = _mm256_loadu_pd(w[0] + 4);
    const __m256d w10 = _mm256_loadu_pd(w[1]), w11 = _mm256_loadu_pd(w[1] + 4);
    for (size_t k = k0; k < k1; k++) {
        const __m256d c0 = _mm256_set1_pd(u0[k]), c1 = _mm256_set1_pd(u1[k]);
        const double *ak = a + k * KN_QUAD_LANES, *dk = wd + k * KN_QUAD_LANES;
        double *hk = hw + k * KN_QUAD_LANES;
        const __m256d a0 = _mm256_loadu_pd(ak), a1 = _mm256_loadu_pd(ak + 4);
        const __m256d d0 = _mm256_loadu_pd(dk), d1 = _mm256_loadu_pd(dk + 4);
        s00 = _mm256_add_pd(s00, _mm256_mul_pd(c0, a0));
        s01 = _mm256_add_pd(s01, _mm256_mul_pd(c0, a1));
        h00 = _mm256_add_pd(h00, _mm256_mul_pd(c0, d0));
        h01 = _mm256_add_pd(h01, _mm256_mul_pd(c0, d1));
        s10 = _mm256_add_pd(s10, _mm256_mul_pd(c1, a0));
        s11 = _mm256_add_pd(s11, _mm256_mul_pd(c1, a1));
        h10 = _mm256_add_pd(h10, _mm256_mul_pd(c1, d0));
        h11 = _mm256_add_pd(h11, _mm256_mul_pd(c1, d1));
        /* row u0's term first, then u1's: the order of the one-row steps */
        __m256d x0 = _mm256_add_pd(_mm256_loadu_pd(hk), _mm256_mul_pd(w00, c0));
        __m256d x1 = _mm256_add_pd(_mm256_loadu_pd(hk + 4), _mm256_mul_pd(w01, c0));
        _mm256_storeu_pd(hk, _mm256_add_pd(x0, _mm256_mul_pd(w10, c1)));
        _mm256_storeu_pd(hk + 4, _mm256_add_pd(x1, _mm256_mul_pd(w11, c1)));
    }
    _mm256_storeu_pd(sa[0], s00);
    _mm256_storeu_pd(sa[0] + 4, s01);
    _mm256_storeu_pd(sa[1], s10);
    _mm256_storeu_pd(sa[1] + 4, s11);
    _mm256_storeu_pd(hwi[0], h00);
    _mm256_storeu_pd(hwi[0] + 4, h01);
    _mm256_storeu_pd(hwi[1], h10);
    _mm256_storeu_pd(hwi[1] + 4, h11);
}

/* Rows [0, NR) (NR <= 6) x one strip of kn_avx2_gptq_update: live
 * columns of the strip's 8 (8 but at the ragged end, where the other
 * lanes are loaded as 0 and not stored); ed: the rows' errors as doubles
 * (KN_GPTQ_UPDATE_MAX apart).  The chains stay in registers across the
 * block's errors. */
static inline __attribute__((always_inline)) void
gptq_strip(float *W, size_t ldw, int NR, const double *ed, const double *ps,
           size_t ne, int live)
{
    __m256d a[6][2];
    __m256i m = _mm256_setzero_si256();
    if (live < KN_GPTQ_STRIP)
        m = _mm256_cmpgt_epi32(_mm256_set1_epi32(live),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int j = 0; j < NR; j++) {
        float *w = W + (size_t)j * ldw;
        __m256 v = live == KN_GPTQ_STRIP ? _mm256_loadu_ps(w) : _mm256_maskload_ps(w, m);
        a[j][0] = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        a[j][1] = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    }
    for (size_t t = 0; t < ne; t++) {
        __m256d u0 = _mm256_loadu_pd(ps + t * KN_GPTQ_STRIP);
        __m256d u1 = _mm256_loadu_pd(ps + t * KN_GPTQ_STRIP + 4);
        for (int j = 0; j < NR; j++) {
            __m256d e = _mm256_broadcast_sd(ed + (size_t)j * KN_GPTQ_UPDATE_MAX + t);
            a[j][0] = _mm256_fnmadd_pd(e, u0, a[j][0]);
            a[j][1] = _mm256_fnmadd_pd(e, u1, a[j][1]);
        }
    }
    for (int j = 0; j < NR; j++) {
        float *w = W + (size_t)j * ldw;
        __m256 v = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(a[j][0])),
                                        _mm256_cvtpd_ps(a[j][1]), 1);
        if (live == KN_GPTQ_STRIP)
            _mm256_storeu_ps(w, v);
        else
            _mm256_maskstore_ps(w, m, v);
    }
}

void kn_avx2_gptq_update(float *W, size_t ldw, size_t nr, const float *E,
                         size_t lde, const double *P, size_t ne, size_t nc)
{
    double ed[6 * KN_GPTQ_UPDATE_MAX];
    for (size_t r0 = 0; r0 < nr; r0 += 6) {
        int rows = nr - r0 < 6 ? (int)(nr - r0) : 6;
        for (int j = 0; j < rows; j++)
            for (size_t t = 0; t < ne; t++)
                ed[(size_t)j * KN_GPTQ_UPDATE_MAX + t] = E[(r0 + (size_t)j) * lde + t];
        float *Wr = W + r0 * ldw;
        for (size_t c = 0; c < nc; c += KN_GPTQ_STRIP) {
            const double *ps = P + c * ne;
            int live = nc - c < KN_GPTQ_STRIP ? (int)(nc - c) : KN_GPTQ_STRIP;
            if (rows == 6 && live == KN_GPTQ_STRIP)
                gptq_strip(Wr + c, ldw, 6, ed, ps, ne, KN_GPTQ_STRIP);
            else
                gptq_strip(Wr + c, ldw, rows, ed, ps, ne, live);
        }
    }
}

/* The lanes of de < 0 for four columns' step values v (float, widened)
 * against their deq, g and diag. */
static inline __attribute__((always_inline)) __m256d
step_gain(__m128 v, __m128 dq, __m256d g, __m256d hcc)
{
    __m256d dv = _mm256_sub_pd(_mm256_cvtps_pd(v), _mm256_cvtps_pd(dq));
    __m256d a = _mm256_mul_pd(_mm256_mul_pd(dv, dv), hcc);
    __m256d b = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), dv), g);
    return _mm256_cmp_pd(_mm256_sub_pd(a, b), _mm256_setzero_pd(), _CMP_LT_OQ);
}

/* The moving lanes (a bit per column) of four columns at c. */
static inline __attribute__((always_inline)) int
scan4(__m128i code, const float *deq, const double *g, const double *diag,
      size_t c, __m128 scale, __m128i zero, __m128i lo, __m128i hi)
{
    const __m128i one = _mm_set1_epi32(1);
    __m128i cm = _mm_sub_epi32(code, one), cp = _mm_add_epi32(code, one);
    __m128 vm = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(cm, zero)), scale);
    __m128 vp = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(cp, zero)), scale);
    __m128 dq = _mm_loadu_ps(deq + c);
    __m256d gc = _mm256_loadu_pd(g + c), hcc = _mm256_loadu_pd(diag + c);
    __m256d live = _mm256_cmp_pd(hcc, _mm256_setzero_pd(), _CMP_GT_OQ);
    /* in range: cm >= lo and cp <= hi */
    __m128i okm = _mm_xor_si128(_mm_cmpgt_epi32(lo, cm), _mm_set1_epi32(-1));
    __m128i okp = _mm_xor_si128(_mm_cmpgt_epi32(cp, hi), _mm_set1_epi32(-1));
    __m256d mm = _mm256_and_pd(step_gain(vm, dq, gc, hcc),
                               _mm256_castsi256_pd(_mm256_cvtepi32_epi64(okm)));
    __m256d mp = _mm256_and_pd(step_gain(vp, dq, gc, hcc),
                               _mm256_castsi256_pd(_mm256_cvtepi32_epi64(okp)));
    return _mm256_movemask_pd(_mm256_and_pd(live, _mm256_or_pd(mm, mp)));
}

size_t kn_avx2_descend_scan(const int8_t *codes, const float *deq,
                            const double *g, const double *diag, size_t c0,
                            size_t c1, float scale, int zero, int lo, int hi)
{
    const __m128 vs = _mm_set1_ps(scale);
    const __m128i vz = _mm_set1_epi32(zero), vlo = _mm_set1_epi32(lo),
                  vhi = _mm_set1_epi32(hi);
    size_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(codes + c));
        __m128i k0 = _mm_cvtepi8_epi32(b), k1 = _mm_cvtepi8_epi32(_mm_srli_si128(b, 4));
        int m = scan4(k0, deq, g, diag, c, vs, vz, vlo, vhi) |
                scan4(k1, deq, g, diag, c + 4, vs, vz, vlo, vhi) << 4;
        if (m)
            return c + (size_t)__builtin_ctz((unsigned)m);
    }
    for (; c + 4 <= c1; c += 4) {
        int32_t w;
        __builtin_memcpy(&w, codes + c, 4);
        int m = scan4(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(w)), deq, g, diag, c, vs,
                      vz, vlo, vhi);
        if (m)
            return c + (size_t)__builtin_ctz((unsigned)m);
    }
    for (; c < c1; c++) { /* the last columns: the same test in C */
        double hcc = diag[c];
        if (!(hcc > 0.0))
            continue;
        for (int step = -1; step <= 1; step += 2) {
            int k = codes[c] + step;
            if (k < lo || k > hi)
                continue;
            double dv = (double)((float)(k - zero) * scale) - (double)deq[c];
            if (dv * dv * hcc - 2.0 * dv * g[c] < 0.0)
                return c;
        }
    }
    return c1;
}

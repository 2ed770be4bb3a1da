/* kn_rtn_avx2.c - AVX2/F16C bodies of the RTN inner loops (kn_rtn.h).
 * Bitwise the plain loops: _mm256_div_ps is the IEEE float32 division and
 * _mm256_round_ps(.., nearest) is nearbyintf in the default rounding mode;
 * clamping with max/min gives the plain loop's values for finite inputs.
 *
 * The int4 row kernels (kn_avx2_rtn_q4_row, kn_avx2_rtn_q4s_row) take a
 * row's groups eight at a time: the eight ranges in one folded
 * transpose-reduction (ranges8), the eight scales (and Q4's zeros) as
 * lanes of one vector with F16C rounding, then each group's codes 32 at a
 * time (codes32_q4).  The division stays the IEEE one: a reciprocal
 * multiply with an exactness check measured at most ~10 % faster on the
 * kernel (multiply alone, no check), not worth the proof.  Measured
 * (bench_quant --rtn-rows, 1 thread, CPU, load ~7-9): int4-sym g32 went
 * from 1.6 GB/cpu-s (one group at a time through cmp_quant.c) to ~5
 * GB/cpu-s on SmolLM-135M mlp shapes, int4 g32 from ~3 to ~5; a
 * next-row software prefetch did not help. */
#include "kn_rtn.h"

#include <immintrin.h>
#include <string.h>


/* Lanes whose |x| is above FLT_MAX or NaN, as a mask. */
static inline __m256 not_finite(__m256 v)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 fmax = _mm256_set1_ps(3.402823466e38f);
    return _mm256_cmp_ps(_mm256_and_ps(v, absmask), fmax, _CMP_NLE_UQ);
}

int kn_avx2_rtn_to_f32(const void *src, int type, size_t n, float *out)
{
    size_t i = 0;
    __m256 bad = _mm256_setzero_ps();
    if (type == KN_RTN_F16) {
        const uint16_t *h = src;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
            bad = _mm256_or_ps(bad, not_finite(v));
            _mm256_storeu_ps(out + i, v);
        }
    } else if (type == KN_RTN_BF16) {
        const uint16_t *h = src;
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
            __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            bad = _mm256_or_ps(bad, not_finite(v));
            _mm256_storeu_ps(out + i, v);
        }
    } else {
        const float *f = src;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(f + i);
            bad = _mm256_or_ps(bad, not_finite(v));
            _mm256_storeu_ps(out + i, v);
        }
    }
    const uint16_t *h = src;
    const void *rest = type == KN_RTN_F32 ? (const void *)((const float *)src + i)
                                          : (const void *)(h + i);
    int tail = kn_ref_rtn_to_f32(rest, type, n - i, out + i);
    return tail && _mm256_movemask_ps(bad) == 0;
}

static inline void range8(const float *x, size_t n, float *mn, float *mx)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    /* order does not matter for min/max of finite values (zeros are
     * normalized below) */
    __m128 l = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
    l = _mm_min_ps(l, _mm_movehl_ps(l, l));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float a = _mm_cvtss_f32(_mm_min_ss(l, _mm_movehdup_ps(l)));
    float b = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    for (; i < n; i++) {
        a = x[i] < a ? x[i] : a;
        b = x[i] > b ? x[i] : b;
    }
    /* min/max may keep a -0.0 where the plain loop keeps its +0 start */
    *mn = a == 0.0f ? 0.0f : a;
    *mx = b == 0.0f ? 0.0f : b;
}

void kn_avx2_rtn_range(const float *x, size_t n, float *mn, float *mx)
{
    range8(x, n, mn, mx);
}

/* nearbyintf(x / s) of 8 lanes. */
static inline __m256 rdiv(const float *x, __m256 s)
{
    return _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x), s),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

void kn_avx2_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q)
{
    const __m256 s = _mm256_set1_ps(scale);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    /* packs interleave 128-bit lanes; this puts the dwords back in order */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rdiv(x + i, s), lo), hi));
        __m256i b = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rdiv(x + i + 8, s), lo), hi));
        __m256i c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rdiv(x + i + 16, s), lo), hi));
        __m256i d = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(rdiv(x + i + 24, s), lo), hi));
        __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
        __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
        _mm256_storeu_si256((__m256i *)(q + i), bytes);
    }
    kn_ref_rtn_codes_q8(x + i, n - i, scale, q + i);
}

void kn_avx2_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                          uint8_t *out)
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps((float)zero);
    const __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(15.0f);
    /* byte pairs (even, odd) -> even + 16 * odd */
    const __m128i nib = _mm_set1_epi16(0x1001);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 qa = _mm256_add_ps(rdiv(x + i, s), z);
        __m256 qb = _mm256_add_ps(rdiv(x + i + 8, s), z);
        /* max(q, 0) first: it maps a NaN to 0 as the plain loop does */
        __m256i a = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(qa, lo), hi));
        __m256i b = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(qb, lo), hi));
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
        __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w),
                                         _mm256_extracti128_si256(w, 1));
        __m128i pairs = _mm_maddubs_epi16(bytes, nib);
        _mm_storel_epi64((__m128i *)(out + i / 2), _mm_packus_epi16(pairs, pairs));
    }
    kn_ref_rtn_codes_q4(x + i, n - i, scale, zero, out + i / 2);
}

/* Lane j of the result = the min (max) of a[j]'s eight lanes: a transpose
 * folded into the reduction, 7 ops and 14 shuffles for eight vectors
 * instead of eight horizontal reductions. */
static inline __m256 fold8_min(const __m256 *a)
{
    __m256 u0 = _mm256_min_ps(_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    __m256 u1 = _mm256_min_ps(_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    __m256 u2 = _mm256_min_ps(_mm256_unpacklo_ps(a[4], a[5]), _mm256_unpackhi_ps(a[4], a[5]));
    __m256 u3 = _mm256_min_ps(_mm256_unpacklo_ps(a[6], a[7]), _mm256_unpackhi_ps(a[6], a[7]));
    __m256 w0 = _mm256_min_ps(_mm256_shuffle_ps(u0, u1, 0x44), _mm256_shuffle_ps(u0, u1, 0xEE));
    __m256 w1 = _mm256_min_ps(_mm256_shuffle_ps(u2, u3, 0x44), _mm256_shuffle_ps(u2, u3, 0xEE));
    return _mm256_min_ps(_mm256_permute2f128_ps(w0, w1, 0x20),
                         _mm256_permute2f128_ps(w0, w1, 0x31));
}

static inline __m256 fold8_max(const __m256 *a)
{
    __m256 u0 = _mm256_max_ps(_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    __m256 u1 = _mm256_max_ps(_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    __m256 u2 = _mm256_max_ps(_mm256_unpacklo_ps(a[4], a[5]), _mm256_unpackhi_ps(a[4], a[5]));
    __m256 u3 = _mm256_max_ps(_mm256_unpacklo_ps(a[6], a[7]), _mm256_unpackhi_ps(a[6], a[7]));
    __m256 w0 = _mm256_max_ps(_mm256_shuffle_ps(u0, u1, 0x44), _mm256_shuffle_ps(u0, u1, 0xEE));
    __m256 w1 = _mm256_max_ps(_mm256_shuffle_ps(u2, u3, 0x44), _mm256_shuffle_ps(u2, u3, 0xEE));
    return _mm256_max_ps(_mm256_permute2f128_ps(w0, w1, 0x20),
                         _mm256_permute2f128_ps(w0, w1, 0x31));
}

/* The ranges (kn_ref_rtn_range) of groups x[j * g .. + g), j < m <= 8,
 * as lanes of *vmn / *vmx (lanes from m on: +0); x finite.  With eight
 * whole groups of a multiple of 8 the reductions are folded: the order
 * of min/max does not matter for finite values, and adding +0 turns a
 * -0 (which min/max may keep) into the plain loop's +0 start. */
static inline void ranges8(const float *x, uint32_t m, uint32_t g,
                           __m256 *vmn, __m256 *vmx)
{
    if (m == 8 && g % 8 == 0) {
        __m256 lo[8], hi[8];
        for (uint32_t j = 0; j < 8; j++) {
            const float *v = x + (size_t)j * g;
            __m256 l = _mm256_setzero_ps(), h = _mm256_setzero_ps();
            for (uint32_t i = 0; i < g; i += 8) {
                __m256 t = _mm256_loadu_ps(v + i);
                l = _mm256_min_ps(l, t);
                h = _mm256_max_ps(h, t);
            }
            lo[j] = l;
            hi[j] = h;
        }
        *vmn = _mm256_add_ps(fold8_min(lo), _mm256_setzero_ps());
        *vmx = _mm256_add_ps(fold8_max(hi), _mm256_setzero_ps());
        return;
    }
    float mn[8] = {0}, mx[8] = {0};
    for (uint32_t j = 0; j < m; j++)
        range8(x + (size_t)j * g, g, &mn[j], &mx[j]);
    *vmn = _mm256_loadu_ps(mn);
    *vmx = _mm256_loadu_ps(mx);
}

/* kn_ref_rtn_codes_q4 of x[n], n a multiple of 32, scale (!= 0) and zero
 * z in 0..15, into out[n / 2], in fewer ops than kn_avx2_rtn_codes_q4:
 * the rounded quotient r is clamped above at 15 - z in float (min(top,
 * r) keeps a NaN, which converts to INT_MIN as does anything under
 * -2^31), converted, z added in int16 with saturation, and packus clamps
 * below at 0.  r + z is exact wherever it lands in 0..15, so the codes
 * are the plain loop's (which adds z in float, then clamps). */
static inline void codes32_q4(const float *x, size_t n, float scale, int z,
                              uint8_t *out)
{
    const __m256 s = _mm256_set1_ps(scale), top = _mm256_set1_ps((float)(15 - z));
    const __m256i z16 = _mm256_set1_epi16((short)z);
    const __m256i nib = _mm256_set1_epi16(0x1001); /* (even, odd) -> even + 16 odd */
    for (size_t i = 0; i < n; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_min_ps(top, rdiv(x + i, s)));
        __m256i b = _mm256_cvtps_epi32(_mm256_min_ps(top, rdiv(x + i + 8, s)));
        __m256i c = _mm256_cvtps_epi32(_mm256_min_ps(top, rdiv(x + i + 16, s)));
        __m256i d = _mm256_cvtps_epi32(_mm256_min_ps(top, rdiv(x + i + 24, s)));
        /* words, lane 0: x0-3 x8-11 | x16-19 x24-27; lane 1: the rest */
        __m256i ab = _mm256_adds_epi16(_mm256_packs_epi32(a, b), z16);
        __m256i cd = _mm256_adds_epi16(_mm256_packs_epi32(c, d), z16);
        /* output bytes 0 1 4 5 8 9 12 13 (lane 0), 2 3 6 7 10 11 14 15 */
        __m256i m = _mm256_maddubs_epi16(_mm256_packus_epi16(ab, cd), nib);
        m = _mm256_packus_epi16(m, m);
        __m128i o = _mm_unpacklo_epi16(_mm256_castsi256_si128(m),
                                       _mm256_extracti128_si256(m, 1));
        _mm_storeu_si128((__m128i *)(out + i / 2), o);
    }
}

/* One group's codes: all `zero` for scale 0, else as kn_rtn_codes_q4. */
static inline void group_codes(const float *x, uint32_t g, float scale,
                               int zero, uint8_t *out)
{
    if (scale == 0.0f)
        memset(out, zero | zero << 4, g / 2);
    else if (g % 32 == 0)
        codes32_q4(x, g, scale, zero, out);
    else
        kn_avx2_rtn_codes_q4(x, g, scale, zero, out);
}

/* Eight groups' parameters at once: the scalar rule of kn_ref_rtn_q4_row
 * lane by lane (the same division, F16C's round-to-nearest-even is
 * fmt_f32_to_f16's, and unused lanes are computed from zeros and dropped). */
void kn_avx2_rtn_q4_row(const float *x, uint32_t ng, uint32_t g,
                        uint16_t *scales, uint8_t *zeros, uint8_t *out)
{
    const __m256 fifteen = _mm256_set1_ps(15.0f), zero = _mm256_setzero_ps();
    const __m256 fmax = _mm256_set1_ps(65504.0f), fmin = _mm256_set1_ps(-65504.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (uint32_t k0 = 0; k0 < ng; k0 += 8) {
        uint32_t m = ng - k0 < 8 ? ng - k0 : 8;
        float sf[8];
        uint16_t h[8];
        int32_t z[8];
        __m256 vmn, vmx;
        ranges8(x + (size_t)k0 * g, m, g, &vmn, &vmx);
        __m256 s = _mm256_div_ps(_mm256_sub_ps(vmx, vmn), fifteen);
        s = _mm256_max_ps(_mm256_min_ps(s, fmax), fmin);
        __m128i hs = _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        s = _mm256_cvtph_ps(hs);
        __m256 zq = _mm256_round_ps(_mm256_div_ps(_mm256_xor_ps(vmn, sign), s),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        zq = _mm256_min_ps(_mm256_max_ps(zq, zero), fifteen);
        /* s > 0 only; other lanes (s == 0) get zero 0 */
        zq = _mm256_and_ps(zq, _mm256_cmp_ps(s, zero, _CMP_GT_OQ));
        _mm_storeu_si128((__m128i *)h, hs);
        _mm256_storeu_ps(sf, s);
        _mm256_storeu_si256((__m256i *)z, _mm256_cvtps_epi32(zq));
        for (uint32_t j = 0; j < m; j++) {
            uint32_t k = k0 + j;
            scales[k] = h[j];
            zeros[k] = (uint8_t)z[j];
            group_codes(x + (size_t)k * g, g, sf[j], z[j], out + (size_t)k * g / 2);
        }
    }
}

/* kn_ref_rtn_q4s_row with eight groups' scales at once: ext * -0.125 is
 * ext / -8 exactly (both the correctly rounded ext/8, subnormals too),
 * F16C's round-to-nearest-even is fmt_f32_to_f16's, and unused lanes are
 * computed from zeros and dropped. */
void kn_avx2_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g,
                         uint16_t *scales, uint8_t *out)
{
    const __m256 eighth = _mm256_set1_ps(-0.125f);
    const __m256 fmax = _mm256_set1_ps(65504.0f), fmin = _mm256_set1_ps(-65504.0f);
    for (uint32_t k0 = 0; k0 < ng; k0 += 8) {
        uint32_t m = ng - k0 < 8 ? ng - k0 : 8;
        float sf[8];
        uint16_t h[8];
        __m256 vmn, vmx;
        ranges8(x + (size_t)k0 * g, m, g, &vmn, &vmx);
        __m256 neg = _mm256_sub_ps(_mm256_setzero_ps(), vmn); /* -mn, +0 for 0 */
        /* mn where -mn > mx, else mx (also for a tie and for both +0) */
        __m256 ext = _mm256_blendv_ps(vmx, vmn, _mm256_cmp_ps(neg, vmx, _CMP_GT_OQ));
        int tie = _mm256_movemask_ps(_mm256_and_ps(
            _mm256_cmp_ps(neg, vmx, _CMP_EQ_OQ),
            _mm256_cmp_ps(vmx, _mm256_setzero_ps(), _CMP_NEQ_OQ)));
        if (tie) { /* rare: the first of mn and mx wins */
            float e[8], mn[8], mx[8];
            _mm256_storeu_ps(e, ext);
            _mm256_storeu_ps(mn, vmn);
            _mm256_storeu_ps(mx, vmx);
            for (uint32_t j = 0; j < m; j++) {
                if (!(tie >> j & 1))
                    continue;
                const float *v = x + (size_t)(k0 + j) * g;
                for (uint32_t i = 0; i < g; i++)
                    if (v[i] == mx[j] || v[i] == mn[j]) {
                        e[j] = v[i];
                        break;
                    }
            }
            ext = _mm256_loadu_ps(e);
        }
        __m256 s = _mm256_mul_ps(ext, eighth);
        s = _mm256_max_ps(_mm256_min_ps(s, fmax), fmin);
        __m128i hs = _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)h, hs);
        _mm256_storeu_ps(sf, _mm256_cvtph_ps(hs));
        for (uint32_t j = 0; j < m; j++) {
            uint32_t k = k0 + j;
            scales[k] = h[j];
            group_codes(x + (size_t)k * g, g, sf[j], 8, out + (size_t)k * g / 2);
        }
    }
}

/* One half (4 lanes) of kn_rtn_err's step: c += ((imp * d) * d). */
static inline __m256d err_half(__m128 x, __m128 v, __m128 w, int has_imp,
                               __m256d c)
{
    __m256d d = _mm256_sub_pd(_mm256_cvtps_pd(x), _mm256_cvtps_pd(v));
    __m256d t = has_imp ? _mm256_mul_pd(_mm256_cvtps_pd(w), d) : d;
    return _mm256_add_pd(c, _mm256_mul_pd(t, d));
}

void kn_avx2_rtn_err(const float *x, const float *imp, size_t n8, int q8,
                     float scale, int zero, double c[KN_RTN_ERR_LANES])
{
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps((float)zero);
    const __m256 lo = _mm256_set1_ps(q8 ? -127.0f : 0.0f);
    const __m256 hi = _mm256_set1_ps(q8 ? 127.0f : 15.0f);
    __m256d c0 = _mm256_loadu_pd(c), c1 = _mm256_loadu_pd(c + 4);
    for (size_t i = 0; i < n8; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i), v = _mm256_setzero_ps();
        if (scale != 0.0f) {
            __m256 q = rdiv(x + i, s);
            if (!q8)
                q = _mm256_add_ps(q, z);
            /* max first: a NaN quotient becomes lo, as the scalar clamp */
            q = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
            v = q8 ? _mm256_mul_ps(s, q) : _mm256_mul_ps(_mm256_sub_ps(q, z), s);
        }
        __m256 w = imp ? _mm256_loadu_ps(imp + i) : xv;
        c0 = err_half(_mm256_castps256_ps128(xv), _mm256_castps256_ps128(v),
                      _mm256_castps256_ps128(w), imp != NULL, c0);
        c1 = err_half(_mm256_extractf128_ps(xv, 1), _mm256_extractf128_ps(v, 1),
                      _mm256_extractf128_ps(w, 1), imp != NULL, c1);
    }
    _mm256_storeu_pd(c, c0);
    _mm256_storeu_pd(c + 4, c1);
}

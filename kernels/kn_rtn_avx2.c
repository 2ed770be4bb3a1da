/* kn_rtn_avx2.c - AVX2/F16C bodies of the RTN inner loops (kn_rtn.h).
 * Bitwise the plain loops: _mm256_div_ps is the IEEE float32 division and
 * _mm256_round_ps(.., nearest) is nearbyintf in the default rounding mode;
 * clamping with max/min gives the plain loop's values for finite inputs. */
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
        float mn[8] = {0}, mx[8] = {0}, sf[8];
        uint16_t h[8];
        int32_t z[8];
        for (uint32_t j = 0; j < m; j++)
            range8(x + (size_t)(k0 + j) * g, g, &mn[j], &mx[j]);
        __m256 vmn = _mm256_loadu_ps(mn), vmx = _mm256_loadu_ps(mx);
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
            uint8_t *o = out + (size_t)k * g / 2;
            if (sf[j] == 0.0f)
                memset(o, 0, g / 2);
            else
                kn_avx2_rtn_codes_q4(x + (size_t)k * g, g, sf[j], z[j], o);
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
        float mn[8] = {0}, mx[8] = {0}, sf[8];
        uint16_t h[8];
        for (uint32_t j = 0; j < m; j++)
            range8(x + (size_t)(k0 + j) * g, g, &mn[j], &mx[j]);
        __m256 vmn = _mm256_loadu_ps(mn), vmx = _mm256_loadu_ps(mx);
        __m256 neg = _mm256_sub_ps(_mm256_setzero_ps(), vmn); /* -mn, +0 for 0 */
        /* mn where -mn > mx, else mx (also for a tie and for both +0) */
        __m256 ext = _mm256_blendv_ps(vmx, vmn, _mm256_cmp_ps(neg, vmx, _CMP_GT_OQ));
        int tie = _mm256_movemask_ps(_mm256_and_ps(
            _mm256_cmp_ps(neg, vmx, _CMP_EQ_OQ),
            _mm256_cmp_ps(vmx, _mm256_setzero_ps(), _CMP_NEQ_OQ)));
        if (tie) { /* rare: the first of mn and mx wins */
            float e[8];
            _mm256_storeu_ps(e, ext);
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
            uint8_t *o = out + (size_t)k * g / 2;
            if (sf[j] == 0.0f)
                memset(o, 0x88, g / 2); /* every code the zero point 8 */
            else
                kn_avx2_rtn_codes_q4(x + (size_t)k * g, g, sf[j], 8, o);
        }
    }
}

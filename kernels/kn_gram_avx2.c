/* kn_gram_avx2.c - the AVX2/FMA register tile of kn_gram.c (see kn_gram.h):
 * 6 x 16 float sums in twelve ymm registers, one broadcast of A and two
 * loads of B per row step, t ascending; every KN_GRAM_FC tokens the float
 * sums are widened and added to the double tile.  The twelve accumulators
 * are written out as named locals, not an array, so that they stay in
 * registers (cmp_lanes.h measured an array 3x slower with GCC 12). */
#include <immintrin.h>

#include "kn_avx2.h"
#include "kn_gram.h"

_Static_assert(KN_GRAM_MR == 6 && KN_GRAM_NR == 16,
               "the register tile below is 6 x 16");

/* out[k] += the float sums of ymm acc (8 lanes) at out + k, in double. */
static inline void widen_add(double *out, __m256 acc)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(acc));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(acc, 1));
    _mm256_storeu_pd(out, _mm256_add_pd(_mm256_loadu_pd(out), lo));
    _mm256_storeu_pd(out + 4, _mm256_add_pd(_mm256_loadu_pd(out + 4), hi));
}

/* The float sums of m <= KN_GRAM_FC tokens, added to out. */
static void sub_tile(const float *ap, const float *bp, size_t m,
                     double out[KN_GRAM_MR * KN_GRAM_NR])
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00,
           c20 = c00, c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00,
           c50 = c00, c51 = c00;
    for (size_t t = 0; t < m; t++) {
        const float *a = ap + t * KN_GRAM_MR;
        __m256 b0 = _mm256_loadu_ps(bp + t * KN_GRAM_NR);
        __m256 b1 = _mm256_loadu_ps(bp + t * KN_GRAM_NR + 8);
        __m256 x = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(x, b0, c00);
        c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(x, b0, c10);
        c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(x, b0, c20);
        c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(x, b0, c30);
        c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(x, b0, c40);
        c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(x, b0, c50);
        c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    widen_add(out, c00);
    widen_add(out + 8, c01);
    widen_add(out + 16, c10);
    widen_add(out + 24, c11);
    widen_add(out + 32, c20);
    widen_add(out + 40, c21);
    widen_add(out + 48, c30);
    widen_add(out + 56, c31);
    widen_add(out + 64, c40);
    widen_add(out + 72, c41);
    widen_add(out + 80, c50);
    widen_add(out + 88, c51);
}

void kn_avx2_gram_tile(const float *ap, const float *bp, size_t m,
                       double out[KN_GRAM_MR * KN_GRAM_NR])
{
    for (size_t k = 0; k < KN_GRAM_MR * KN_GRAM_NR; k++)
        out[k] = 0.0;
    for (size_t t0 = 0; t0 < m; t0 += KN_GRAM_FC)
        sub_tile(ap + t0 * KN_GRAM_MR, bp + t0 * KN_GRAM_NR,
                 m - t0 < KN_GRAM_FC ? m - t0 : KN_GRAM_FC, out);
}

void kn_avx2_gram_pack_swapped(const float *x, size_t n, size_t m, size_t c0,
                               size_t pw, float *d)
{
    size_t w = n - c0 < pw ? n - c0 : pw;
    /* lanes c < w of a row: whole vectors, then a masked tail */
    size_t whole = w / 8 * 8;
    __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w - whole)),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (size_t t = 0; t < m + (m & 1); t++) {
        size_t src = t ^ 1u;
        float *dt = d + t * pw;
        if (src >= m) {
            for (size_t c = 0; c < pw; c++)
                dt[c] = 0.0f;
            continue;
        }
        const float *r = x + src * n + c0;
        size_t c = 0;
        for (; c < whole; c += 8)
            _mm256_storeu_ps(dt + c, kn_avx2_bf16_round8(_mm256_loadu_ps(r + c)));
        if (c < w)
            _mm256_maskstore_ps(dt + c, tail,
                                kn_avx2_bf16_round8(_mm256_maskload_ps(r + c, tail)));
        for (c = w; c < pw; c++)
            dt[c] = 0.0f;
    }
}

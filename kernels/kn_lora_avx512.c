/* kn_lora_avx512.c - the LoRA delta product with AVX-512 (contract in
 * kn_lora.h; compiled with the AVX-512 flags, called only when
 * kn_cpu_has_avx512()).
 *
 * The AVX2 kernel's 4-row register tile, 16 columns wide (two zmm per
 * row): per k, two loads of R's row k and four broadcasts of L feed eight
 * independent chains of 8 lanes.  Every element is summed exactly as in
 * the scalar reference -- from +0, k ascending, each product rounded,
 * then added (no FMA: the fp-contract pragma keeps GCC from fusing) --
 * and finished as out + coef * sum, so the bits equal kn_ref_lora_rows /
 * kn_ref_lora_rows_add and the AVX2 path for every shape (test_kernels,
 * with and without MC_NO_AVX512).  Column and row tails use masked
 * loads and stores of the same arithmetic instead of a scalar loop.
 *
 * Measured on the Zen 4 development host (512-bit ops double-pumped):
 * 25-27 GFLOP/s per core against the AVX2 tile's 14-15 (5632 x 2048 and
 * 2048 x 5632 at rank 16, 16-row calls as the merge makes them); the
 * wider tile halves the loads, broadcasts and loop overhead per flop,
 * which, not the FP pipes, limited the AVX2 tile. */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "kn_lora.h"

#define JB 256 /* columns per block of R kept in cache (as kn_lora_avx2.c) */

/* The sums of one row's 16 columns into o (lanes in m0 | m1 << 8):
 * stored, or (add) o + coef * sum. */
static inline __attribute__((always_inline)) void
put16(double *o, __m512d c0, __m512d c1, __m512d cv, int add, int full,
      __mmask8 m0, __mmask8 m1)
{
    if (full) {
        if (add) {
            c0 = _mm512_add_pd(_mm512_loadu_pd(o), _mm512_mul_pd(cv, c0));
            c1 = _mm512_add_pd(_mm512_loadu_pd(o + 8), _mm512_mul_pd(cv, c1));
        }
        _mm512_storeu_pd(o, c0);
        _mm512_storeu_pd(o + 8, c1);
        return;
    }
    if (add) {
        c0 = _mm512_add_pd(_mm512_maskz_loadu_pd(m0, o), _mm512_mul_pd(cv, c0));
        c1 = _mm512_add_pd(_mm512_maskz_loadu_pd(m1, o + 8),
                           _mm512_mul_pd(cv, c1));
    }
    _mm512_mask_storeu_pd(o, m0, c0);
    _mm512_mask_storeu_pd(o + 8, m1, c1);
}

/* Rows [0, nrow) of L (nrow <= 4, a constant after inlining), columns
 * [j, j + 16) (lanes beyond cols masked off unless full). */
static inline __attribute__((always_inline)) void
tile(const double *L, const double *R, uint32_t r, size_t cols, size_t j,
     double *o, size_t ldo, __m512d cv, int add, int nrow, int full,
     __mmask8 m0, __mmask8 m1)
{
    __m512d c00 = _mm512_setzero_pd(), c01 = _mm512_setzero_pd();
    __m512d c10 = _mm512_setzero_pd(), c11 = _mm512_setzero_pd();
    __m512d c20 = _mm512_setzero_pd(), c21 = _mm512_setzero_pd();
    __m512d c30 = _mm512_setzero_pd(), c31 = _mm512_setzero_pd();
    for (uint32_t k = 0; k < r; k++) {
        const double *a = R + (size_t)k * cols + j;
        __m512d a0 = full ? _mm512_loadu_pd(a) : _mm512_maskz_loadu_pd(m0, a);
        __m512d a1 = full ? _mm512_loadu_pd(a + 8)
                          : _mm512_maskz_loadu_pd(m1, a + 8);
        __m512d b = _mm512_set1_pd(L[k]);
        c00 = _mm512_add_pd(c00, _mm512_mul_pd(b, a0));
        c01 = _mm512_add_pd(c01, _mm512_mul_pd(b, a1));
        if (nrow > 1) {
            b = _mm512_set1_pd(L[(size_t)r + k]);
            c10 = _mm512_add_pd(c10, _mm512_mul_pd(b, a0));
            c11 = _mm512_add_pd(c11, _mm512_mul_pd(b, a1));
        }
        if (nrow > 2) {
            b = _mm512_set1_pd(L[2 * (size_t)r + k]);
            c20 = _mm512_add_pd(c20, _mm512_mul_pd(b, a0));
            c21 = _mm512_add_pd(c21, _mm512_mul_pd(b, a1));
        }
        if (nrow > 3) {
            b = _mm512_set1_pd(L[3 * (size_t)r + k]);
            c30 = _mm512_add_pd(c30, _mm512_mul_pd(b, a0));
            c31 = _mm512_add_pd(c31, _mm512_mul_pd(b, a1));
        }
    }
    o += j;
    put16(o, c00, c01, cv, add, full, m0, m1);
    if (nrow > 1)
        put16(o + ldo, c10, c11, cv, add, full, m0, m1);
    if (nrow > 2)
        put16(o + 2 * ldo, c20, c21, cv, add, full, m0, m1);
    if (nrow > 3)
        put16(o + 3 * ldo, c30, c31, cv, add, full, m0, m1);
}

/* Rows [i, i + nrow) over columns [jb, je) (je - jb a multiple of 16
 * except at cols, whose tail is masked). */
static inline __attribute__((always_inline)) void
rows_block(const double *L, const double *R, uint32_t r, size_t cols,
           size_t jb, size_t je, double *o, size_t ldo, __m512d cv, int add,
           int nrow)
{
    size_t j = jb;
    for (; j + 16 <= je; j += 16)
        tile(L, R, r, cols, j, o, ldo, cv, add, nrow, 1, 0xff, 0xff);
    if (j < je) {
        size_t n = je - j; /* 1..15 */
        __mmask8 m0 = (__mmask8)(n >= 8 ? 0xff : (1u << n) - 1);
        __mmask8 m1 = (__mmask8)(n > 8 ? (1u << (n - 8)) - 1 : 0);
        tile(L, R, r, cols, j, o, ldo, cv, add, nrow, 0, m0, m1);
    }
}

void kn_avx512_lora_rows(const double *L, const double *R, uint32_t r,
                         size_t cols, size_t nr, double coef, int add,
                         double *out, size_t ldo)
{
    __m512d cv = _mm512_set1_pd(coef);
    size_t nr4 = nr - nr % 4;
    /* Column blocks outermost: a JB-column slice of R is reused by every
     * row tile from cache. */
    for (size_t jb = 0; jb < cols; jb += JB) {
        size_t je = cols - jb > JB ? jb + JB : cols;
        size_t i = 0;
        for (; i < nr4; i += 4)
            rows_block(L + i * r, R, r, cols, jb, je, out + i * ldo, ldo, cv,
                       add, 4);
        switch (nr - nr4) {
        case 3:
            rows_block(L + i * r, R, r, cols, jb, je, out + i * ldo, ldo, cv,
                       add, 3);
            break;
        case 2:
            rows_block(L + i * r, R, r, cols, jb, je, out + i * ldo, ldo, cv,
                       add, 2);
            break;
        case 1:
            rows_block(L + i * r, R, r, cols, jb, je, out + i * ldo, ldo, cv,
                       add, 1);
            break;
        default:
            break;
        }
    }
}

/* kn_avx2_lora_finish eight doubles at a time, the same operations per
 * element: the float32 conversion (round to nearest even), the change
 * |(double)f - base| into the running maximum (finite non-negative values
 * only -- a NaN or infinite result stops the row before it is counted --
 * so the lane order does not change the maximum), and bf16 rounded on the
 * double's bits.  A group with a value out of float range or (bf16) a
 * non-zero value below bf16's normal range goes to the scalar reference,
 * as in the AVX2 path; so does the tail of fewer than eight. */
size_t kn_avx512_lora_finish(const double *d, const float *base, size_t n,
                             int type, void *out, double *maxd)
{
    const __m512d fmax = _mm512_set1_pd(3.4028234663852886e38);
    const __m512d tiny = _mm512_set1_pd(0x1p-126);
    const __m512i half = _mm512_set1_epi64(((int64_t)1 << 44) - 1);
    const __m512i one = _mm512_set1_epi64(1);
    const __m512i keep = _mm512_set1_epi64(~(((int64_t)1 << 45) - 1));
    __m512d mx = _mm512_set1_pd(*maxd);
    size_t es = type == KN_LORA_F32 ? 4 : 2;
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m512d x = _mm512_loadu_pd(d + j);
        __m512d ax = _mm512_abs_pd(x);
        __mmask8 bad = _mm512_cmp_pd_mask(ax, fmax, _CMP_NLE_UQ);
        if (type == KN_LORA_BF16)
            bad |= _mm512_cmp_pd_mask(ax, tiny, _CMP_LT_OQ) &
                   _mm512_cmp_pd_mask(ax, _mm512_setzero_pd(), _CMP_NEQ_OQ);
        if (bad) {
            double m = _mm512_reduce_max_pd(mx);
            size_t k = kn_ref_lora_finish(d + j, base + j, 8, type,
                                          (unsigned char *)out + j * es, &m);
            mx = _mm512_set1_pd(m);
            if (k < 8) {
                *maxd = m;
                return j + k;
            }
            continue;
        }
        __m256 f = _mm512_cvtpd_ps(x);
        __m512d dd = _mm512_abs_pd(_mm512_sub_pd(
            _mm512_cvtps_pd(f), _mm512_cvtps_pd(_mm256_loadu_ps(base + j))));
        mx = _mm512_max_pd(mx, dd);
        if (type == KN_LORA_F32) {
            _mm256_storeu_ps((float *)out + j, f);
            continue;
        }
        /* bf16: the mantissa rounded to 7 bits on the double's bits (ties
         * to even; a carry into the exponent is right too), then the
         * float conversion is exact and bf16 is its top half */
        __m512i u = _mm512_castpd_si512(x);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi64(u, 45), one);
        u = _mm512_and_si512(_mm512_add_epi64(u, _mm512_add_epi64(half, lsb)),
                             keep);
        __m256i b = _mm256_srli_epi32(
            _mm256_castps_si256(_mm512_cvtpd_ps(_mm512_castsi512_pd(u))), 16);
        _mm_storeu_si128((__m128i *)((uint16_t *)out + j),
                         _mm256_cvtepi32_epi16(b));
    }
    double m = _mm512_reduce_max_pd(mx);
    size_t k = kn_ref_lora_finish(d + j, base + j, n - j, type,
                                  (unsigned char *)out + j * es, &m);
    *maxd = m;
    return j + k;
}

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

/* kn_lora_avx2.c - the LoRA delta product with AVX2 (contract in
 * kn_lora.h; compiled with -mavx2 -mfma -mf16c, called only when the CPU
 * has them).
 *
 * A 4-row x 8-column register tile: per k, two loads of R's row k and four
 * broadcasts of L feed eight independent multiply-add chains, so the
 * multiplier and adder ports stay busy instead of waiting on loads and
 * stores of the output.  Multiply and add stay separate instructions (no
 * FMA: the sum must equal the scalar reference bit for bit), hence the
 * fp-contract pragma: GCC would otherwise be free to fuse them in GNU
 * mode. */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "kn_lora.h"

#define RB 4 /* rows per tile */

/* Rows i0 .. i0+RB-1 (all present), columns [j, j + 8). */
static inline void tile4x8(const double *L, const double *R, uint32_t r,
                           size_t cols, size_t j, double *o0, double *o1,
                           double *o2, double *o3)
{
    __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
    __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
    __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
    __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
    for (uint32_t k = 0; k < r; k++) {
        const double *a = R + (size_t)k * cols + j;
        __m256d a0 = _mm256_loadu_pd(a), a1 = _mm256_loadu_pd(a + 4);
        __m256d b;
        b = _mm256_broadcast_sd(L + 0 * (size_t)r + k);
        c00 = _mm256_add_pd(c00, _mm256_mul_pd(b, a0));
        c01 = _mm256_add_pd(c01, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 1 * (size_t)r + k);
        c10 = _mm256_add_pd(c10, _mm256_mul_pd(b, a0));
        c11 = _mm256_add_pd(c11, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 2 * (size_t)r + k);
        c20 = _mm256_add_pd(c20, _mm256_mul_pd(b, a0));
        c21 = _mm256_add_pd(c21, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 3 * (size_t)r + k);
        c30 = _mm256_add_pd(c30, _mm256_mul_pd(b, a0));
        c31 = _mm256_add_pd(c31, _mm256_mul_pd(b, a1));
    }
    _mm256_storeu_pd(o0 + j, c00);
    _mm256_storeu_pd(o0 + j + 4, c01);
    _mm256_storeu_pd(o1 + j, c10);
    _mm256_storeu_pd(o1 + j + 4, c11);
    _mm256_storeu_pd(o2 + j, c20);
    _mm256_storeu_pd(o2 + j + 4, c21);
    _mm256_storeu_pd(o3 + j, c30);
    _mm256_storeu_pd(o3 + j + 4, c31);
}

/* One row, columns [j0, cols): 4-wide, then scalar, same order. */
static void row_tail(const double *Li, const double *R, uint32_t r,
                     size_t cols, size_t j0, double *o)
{
    size_t j = j0;
    for (; j + 4 <= cols; j += 4) {
        __m256d c = _mm256_setzero_pd();
        for (uint32_t k = 0; k < r; k++)
            c = _mm256_add_pd(c, _mm256_mul_pd(_mm256_broadcast_sd(Li + k),
                                               _mm256_loadu_pd(R + (size_t)k * cols + j)));
        _mm256_storeu_pd(o + j, c);
    }
    for (; j < cols; j++) {
        double c = 0;
        for (uint32_t k = 0; k < r; k++) {
            double p = Li[k] * R[(size_t)k * cols + j];
            c += p;
        }
        o[j] = c;
    }
}

void kn_avx2_lora_rows(const double *L, const double *R, uint32_t r,
                       size_t cols, size_t nr, double *out, size_t ldo)
{
    size_t i = 0;
    size_t cols8 = cols & ~(size_t)7;
    for (; i + RB <= nr; i += RB) {
        const double *Li = L + i * r;
        double *o0 = out + i * ldo, *o1 = o0 + ldo, *o2 = o1 + ldo,
               *o3 = o2 + ldo;
        for (size_t j = 0; j < cols8; j += 8)
            tile4x8(Li, R, r, cols, j, o0, o1, o2, o3);
        for (int q = 0; q < RB && cols8 < cols; q++)
            row_tail(Li + (size_t)q * r, R, r, cols, cols8, out + (i + q) * ldo);
    }
    for (; i < nr; i++)
        row_tail(L + i * r, R, r, cols, 0, out + i * ldo);
}

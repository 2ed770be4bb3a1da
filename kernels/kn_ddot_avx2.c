/* kn_ddot_avx2.c - the AVX2/FMA body of the double dot tile (kn_ddot.h):
 * 3 x 4 accumulators of four k-lanes each (twelve ymm registers), three
 * loads of a and one of b live per step, so the tile stays in the sixteen
 * registers.  Named locals, not an array (cmp_lanes.h: an array stays in
 * memory with GCC 12). */
#include <immintrin.h>
#include <math.h>

#include "kn_ddot.h"

_Static_assert(KN_DDOT_MR == 3 && KN_DDOT_NR == 4,
               "the register tile below is 3 x 4");

/* (s0 + s2) + (s1 + s3) of the four lanes, as the reference adds them. */
static inline double lanes_sum(__m256d v)
{
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h));
}

void kn_avx2_ddot_tile(const double *const a[KN_DDOT_MR],
                       const double *const b[KN_DDOT_NR], size_t m,
                       double out[KN_DDOT_MR * KN_DDOT_NR])
{
    const double *a0 = a[0], *a1 = a[1], *a2 = a[2];
    const double *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
    __m256d c00 = _mm256_setzero_pd(), c01 = c00, c02 = c00, c03 = c00,
            c10 = c00, c11 = c00, c12 = c00, c13 = c00, c20 = c00, c21 = c00,
            c22 = c00, c23 = c00;
    size_t m4 = m & ~(size_t)3;
    for (size_t k = 0; k < m4; k += 4) {
        __m256d x0 = _mm256_loadu_pd(a0 + k), x1 = _mm256_loadu_pd(a1 + k),
                x2 = _mm256_loadu_pd(a2 + k);
        __m256d y = _mm256_loadu_pd(b0 + k);
        c00 = _mm256_fmadd_pd(x0, y, c00);
        c10 = _mm256_fmadd_pd(x1, y, c10);
        c20 = _mm256_fmadd_pd(x2, y, c20);
        y = _mm256_loadu_pd(b1 + k);
        c01 = _mm256_fmadd_pd(x0, y, c01);
        c11 = _mm256_fmadd_pd(x1, y, c11);
        c21 = _mm256_fmadd_pd(x2, y, c21);
        y = _mm256_loadu_pd(b2 + k);
        c02 = _mm256_fmadd_pd(x0, y, c02);
        c12 = _mm256_fmadd_pd(x1, y, c12);
        c22 = _mm256_fmadd_pd(x2, y, c22);
        y = _mm256_loadu_pd(b3 + k);
        c03 = _mm256_fmadd_pd(x0, y, c03);
        c13 = _mm256_fmadd_pd(x1, y, c13);
        c23 = _mm256_fmadd_pd(x2, y, c23);
    }
    out[0] = lanes_sum(c00), out[1] = lanes_sum(c01);
    out[2] = lanes_sum(c02), out[3] = lanes_sum(c03);
    out[4] = lanes_sum(c10), out[5] = lanes_sum(c11);
    out[6] = lanes_sum(c12), out[7] = lanes_sum(c13);
    out[8] = lanes_sum(c20), out[9] = lanes_sum(c21);
    out[10] = lanes_sum(c22), out[11] = lanes_sum(c23);
    if (m4 < m)
        for (int r = 0; r < KN_DDOT_MR; r++)
            for (int c = 0; c < KN_DDOT_NR; c++) {
                double t = out[r * KN_DDOT_NR + c];
                for (size_t k = m4; k < m; k++)
                    t = fma(a[r][k], b[c][k], t);
                out[r * KN_DDOT_NR + c] = t;
            }
}

_Static_assert(KN_DAXPY_MR == 4 && KN_DAXPY_NR == 8,
               "the axpy tile below is 4 x 8");

/* Eight accumulators (4 rows x 2 vectors), four broadcasts of w and two
 * loads of b's row i per step. */
void kn_avx2_daxpy_tile(const float *w, size_t ldw, const double *b,
                        size_t ldb, size_t m, double *y, size_t ldy)
{
    double *y0 = y, *y1 = y + ldy, *y2 = y + 2 * ldy, *y3 = y + 3 * ldy;
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    __m256d c00 = _mm256_loadu_pd(y0), c01 = _mm256_loadu_pd(y0 + 4);
    __m256d c10 = _mm256_loadu_pd(y1), c11 = _mm256_loadu_pd(y1 + 4);
    __m256d c20 = _mm256_loadu_pd(y2), c21 = _mm256_loadu_pd(y2 + 4);
    __m256d c30 = _mm256_loadu_pd(y3), c31 = _mm256_loadu_pd(y3 + 4);
    for (size_t i = 0; i < m; i++) {
        const double *bi = b + i * ldb;
        __m256d b0 = _mm256_loadu_pd(bi), b1 = _mm256_loadu_pd(bi + 4);
        __m256d x = _mm256_set1_pd((double)w0[i]);
        c00 = _mm256_fmadd_pd(x, b0, c00);
        c01 = _mm256_fmadd_pd(x, b1, c01);
        x = _mm256_set1_pd((double)w1[i]);
        c10 = _mm256_fmadd_pd(x, b0, c10);
        c11 = _mm256_fmadd_pd(x, b1, c11);
        x = _mm256_set1_pd((double)w2[i]);
        c20 = _mm256_fmadd_pd(x, b0, c20);
        c21 = _mm256_fmadd_pd(x, b1, c21);
        x = _mm256_set1_pd((double)w3[i]);
        c30 = _mm256_fmadd_pd(x, b0, c30);
        c31 = _mm256_fmadd_pd(x, b1, c31);
    }
    _mm256_storeu_pd(y0, c00), _mm256_storeu_pd(y0 + 4, c01);
    _mm256_storeu_pd(y1, c10), _mm256_storeu_pd(y1 + 4, c11);
    _mm256_storeu_pd(y2, c20), _mm256_storeu_pd(y2 + 4, c21);
    _mm256_storeu_pd(y3, c30), _mm256_storeu_pd(y3 + 4, c31);
}

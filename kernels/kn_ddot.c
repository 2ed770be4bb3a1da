/* kn_ddot.c - the double dot tile (kn_ddot.h): dispatch and the scalar
 * reference, which fixes the summation order the AVX2 body follows. */
#include "kn_ddot.h"

#include <math.h>

#include "kn_ops.h"

void kn_ref_ddot_tile(const double *const a[KN_DDOT_MR],
                      const double *const b[KN_DDOT_NR], size_t m,
                      double out[KN_DDOT_MR * KN_DDOT_NR])
{
    size_t m4 = m & ~(size_t)3;
    for (int r = 0; r < KN_DDOT_MR; r++)
        for (int c = 0; c < KN_DDOT_NR; c++) {
            const double *x = a[r], *y = b[c];
            double s[4] = {0.0, 0.0, 0.0, 0.0};
            for (size_t k = 0; k < m4; k += 4)
                for (int q = 0; q < 4; q++)
                    s[q] = fma(x[k + q], y[k + q], s[q]);
            double t = (s[0] + s[2]) + (s[1] + s[3]);
            for (size_t k = m4; k < m; k++)
                t = fma(x[k], y[k], t);
            out[r * KN_DDOT_NR + c] = t;
        }
}

void kn_ddot_tile(const double *a, size_t lda, const double *b, size_t ldb,
                  size_t m, int mr, int nr,
                  double out[KN_DDOT_MR * KN_DDOT_NR])
{
    const double *ar[KN_DDOT_MR], *br[KN_DDOT_NR];
    for (int r = 0; r < KN_DDOT_MR; r++)
        ar[r] = a + (size_t)(r < mr ? r : mr - 1) * lda;
    for (int c = 0; c < KN_DDOT_NR; c++)
        br[c] = b + (size_t)(c < nr ? c : nr - 1) * ldb;
    if (kn_cpu_has_avx2() && !kn_force_scalar())
        kn_avx2_ddot_tile(ar, br, m, out);
    else
        kn_ref_ddot_tile(ar, br, m, out);
}

void kn_ref_daxpy_cols(const float *w, size_t ldw, const double *b, size_t ldb,
                       size_t m, int mr, size_t nc, double *y, size_t ldy)
{
    for (int r = 0; r < mr; r++)
        for (size_t c = 0; c < nc; c++) {
            double t = y[(size_t)r * ldy + c];
            for (size_t i = 0; i < m; i++)
                t = fma((double)w[(size_t)r * ldw + i], b[i * ldb + c], t);
            y[(size_t)r * ldy + c] = t;
        }
}

void kn_daxpy_tile(const float *w, size_t ldw, const double *b, size_t ldb,
                   size_t m, int mr, double *y, size_t ldy)
{
    if (mr == KN_DAXPY_MR && kn_cpu_has_avx2() && !kn_force_scalar())
        kn_avx2_daxpy_tile(w, ldw, b, ldb, m, y, ldy);
    else
        kn_ref_daxpy_cols(w, ldw, b, ldb, m, mr, KN_DAXPY_NR, y, ldy);
}

/*
 * cmp_lanes.h - eight dot products at once, for the calibration's
 * row-by-row double reductions (output errors, the retarget solves).
 *
 * Why: a double sum over one row is a chain of dependent additions, so
 * one row at a time runs at one addition per add latency.  Eight rows
 * that share the coefficients are eight independent chains, and each
 * coefficient is loaded once for all of them.  Every lane performs
 * exactly the operations, in exactly the order, that one row alone would
 * (acc += (m * coef[k]) * x, k ascending, no fused multiply-add), so
 * blocking rows never changes a result.  The accumulators are named
 * locals: held in an array they stay in memory and every addition waits
 * on a store (measured 3x slower with GCC 12 -O2).
 */
#ifndef CMP_LANES_H
#define CMP_LANES_H

#include <stddef.h>

#define CMP_LANES 8

/* For k in [k0, k1) ascending, every lane r < 8:
 *   acc[r] += (m * coef[k]) * (double)x[k * sk + r * sr]
 * m: an exact multiplier (2.0 for a symmetric matrix's off-diagonal,
 * -1.0 for a substitution, where t + (-c) * y is t - c * y exactly).
 * cmp_lanes_dot reads double x, cmp_lanes_dot_f float x (a float weight
 * row promoted as a one-row sum would promote it). */
#define CMP_LANES_DOT_DEFINE(name, xtype)                                     \
    static inline void name(double acc[CMP_LANES], double m,                  \
                            const double *coef, const xtype *x, size_t sk,    \
                            size_t sr, size_t k0, size_t k1)                  \
    {                                                                         \
        double a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3],            \
               a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];            \
        for (size_t k = k0; k < k1; k++) {                                    \
            double c = m * coef[k];                                           \
            const xtype *xk = x + k * sk;                                     \
            a0 += c * (double)xk[0];                                          \
            a1 += c * (double)xk[sr];                                         \
            a2 += c * (double)xk[2 * sr];                                     \
            a3 += c * (double)xk[3 * sr];                                     \
            a4 += c * (double)xk[4 * sr];                                     \
            a5 += c * (double)xk[5 * sr];                                     \
            a6 += c * (double)xk[6 * sr];                                     \
            a7 += c * (double)xk[7 * sr];                                     \
        }                                                                     \
        acc[0] = a0;                                                          \
        acc[1] = a1;                                                          \
        acc[2] = a2;                                                          \
        acc[3] = a3;                                                          \
        acc[4] = a4;                                                          \
        acc[5] = a5;                                                          \
        acc[6] = a6;                                                          \
        acc[7] = a7;                                                          \
    }

CMP_LANES_DOT_DEFINE(cmp_lanes_dot, double)
CMP_LANES_DOT_DEFINE(cmp_lanes_dot_f, float)

/* For k in [0, n), every lane r < 8: x[k * 8 + r] += w[r] * coef[k]
 * (eight interleaved sums of scaled rows, as one row's b += w_i c_i). */
static inline void cmp_lanes_axpy(double *x, const double w[CMP_LANES],
                                  const double *coef, size_t n)
{
    double w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5],
           w6 = w[6], w7 = w[7];
    for (size_t k = 0; k < n; k++) {
        double c = coef[k];
        double *xk = x + k * CMP_LANES;
        xk[0] += w0 * c;
        xk[1] += w1 * c;
        xk[2] += w2 * c;
        xk[3] += w3 * c;
        xk[4] += w4 * c;
        xk[5] += w5 * c;
        xk[6] += w6 * c;
        xk[7] += w7 * c;
    }
}

#endif /* CMP_LANES_H */

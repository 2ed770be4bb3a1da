/* kn_qgemm_finish.h - the last step of the AVX2 integer prefill GEMM
 * (kn_gemm_avx2.c): the float chains of kn_qdot.h's block sums, one per
 * (row, token), written to Y.  Include only from files compiled with
 * -mavx2 -mfma (after kn_internal.h). */
#ifndef KN_QGEMM_FINISH_H
#define KN_QGEMM_FINISH_H

#include <immintrin.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

/* Y[t0 + t][r + i] += acc[t * ld + i] (Q8: times the row scale first, a
 * multiply, then the add: kn_ref_matmul_q's bias + acc * scale) for
 * t < tn, i < R. */
__attribute__((always_inline)) static inline void
kn_qgemm_store(const kn_matrix *W, float *Y, uint32_t r, int R, size_t t0,
                size_t tn, const float *acc, size_t ld)
{
    const float *sc = W->fmt == KN_W_Q8 ? (const float *)W->scales + r : NULL;
    for (size_t t = 0; t < tn; t++) {
        float *y = Y + (t0 + t) * W->rows + r;
        const float *a = acc + t * ld;
        int i = 0;
        for (; i + 8 <= R; i += 8) {
            __m256 v = _mm256_loadu_ps(a + i);
            if (sc)
                v = _mm256_mul_ps(v, _mm256_loadu_ps(sc + i));
            _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), v));
        }
        for (; i < R; i++)
            y[i] += sc ? a[i] * sc[i] : a[i];
    }
}

/* The form before session 10 (8 float lanes per (row, token), summed at
 * the end), NOT kn_qdot.h's block sums: only kn_qgemm_avx512.c still
 * calls it, until its block-sum rewrite; delete it then. */
/* Y[t0 + t][r + i] += the canonical sum of rows r .. r+R-1 for tokens
 * t0 .. t0+tn-1, whose full blocks' 8 float lanes are in acc at
 * ((i * tp + t) * 8): the ragged last block (if any) through the scalar
 * lanes, kn_hsum256, the Q8 row scale. */
__attribute__((always_inline)) static inline void
kn_qgemm_finish(const kn_matrix *W, const uint8_t *xq, const float *xd,
                float *Y, uint32_t r, int R, size_t t0, size_t tn,
                const float *acc, size_t tp)
{
    const uint32_t nbrow = kn_qact_blocks(W->cols), nfull = W->cols / KN_QK;
    const size_t qb = W->fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xstride = (size_t)nbrow * qb;
    for (size_t t = 0; t < tn; t++)
        for (int i = 0; i < R; i++) {
            __m256 a = _mm256_load_ps(acc + ((size_t)i * tp + t) * 8);
            uint32_t ri = r + (uint32_t)i;
            if (nbrow > nfull) { /* ragged last block: the scalar lanes */
                int32_t lane[8];
                const uint8_t *x = xq + (t0 + t) * xstride + (size_t)nfull * qb;
                kn_qdot_lanes(W, ri, nfull, x, lane);
                float d = xd[(t0 + t) * nbrow + nfull];
                a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)lane)),
                                    _mm256_set1_ps(kn_qdot_scale(W, ri, nfull, d)), a);
            }
            float y = kn_hsum256(a);
            if (W->fmt == KN_W_Q8)
                y *= ((const float *)W->scales)[ri];
            Y[(t0 + t) * W->rows + ri] += y;
        }
}

#endif /* KN_QGEMM_FINISH_H */

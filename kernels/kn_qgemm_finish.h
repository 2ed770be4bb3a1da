/* kn_qgemm_finish.h - the last step of the integer prefill GEMMs
 * (kn_gemm_avx2.c's and kn_qgemm_avx512.c's): the ragged last block,
 * the lane sum and the write to Y, shared so that both give the same
 * bits by construction.  Include only from files compiled with -mavx2
 * -mfma (after kn_avx2.h, kn_internal.h and kn_qdot.h). */
#ifndef KN_QGEMM_FINISH_H
#define KN_QGEMM_FINISH_H

#include <immintrin.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

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

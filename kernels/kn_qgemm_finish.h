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

#endif /* KN_QGEMM_FINISH_H */

/* kn_avx2.h - small AVX2 helpers shared by the *_avx2.c kernel files
 * (include only from files compiled with -mavx2 -mfma -mf16c). */
#ifndef KN_AVX2_H
#define KN_AVX2_H

#include <immintrin.h>

/* Sum of 8 lanes in a fixed order: ((a0 + a4) + (a1 + a5)) +
 * ((a2 + a6) + (a3 + a7)); kn_qdot.h's canonical arithmetic names it. */
__attribute__((always_inline)) static inline float kn_hsum256(__m256 v)
{
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}

#endif /* KN_AVX2_H */

/*
 * kn_avx512.h - small AVX-512 helpers shared by the *_avx512.c kernels
 * (include it only from files compiled with the AVX-512 flags).
 */
#ifndef KN_AVX512_H
#define KN_AVX512_H

#include <immintrin.h>

/* kn_hsum256 of the 8 chains in z0..z3 (row pair p in zp: row 2p in the
 * low half, row 2p + 1 in the high half) as one vector of 8 sums, rows in
 * order.  The same additions in the same tree as kn_hsum256 (u = lo + hi;
 * (u0 + u1) + (u2 + u3)), only with commuted operands, so the same bits. */
static inline __attribute__((always_inline)) __m256
kn_hsum8_512(__m512 z0, __m512 z1, __m512 z2, __m512 z3)
{
    /* u of rows 0..3 (lanes of 128 bits), then of rows 4..7 */
    __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(3, 1, 3, 1)));
    /* per lane j: u0 + u1, u2 + u3 of row j, then of row j + 4 */
    __m512 g = _mm512_add_ps(_mm512_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(c, d, _MM_SHUFFLE(3, 1, 3, 1)));
    /* per lane j: row j, row j + 4 (twice) */
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(g, g, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(g, g, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13,
                                          0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, s));
}

#endif /* KN_AVX512_H */

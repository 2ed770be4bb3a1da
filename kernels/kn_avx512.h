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

/* kn_bf16_round's bits of 16 floats, at the top of each 32-bit lane (the
 * low half zero): round to nearest even, subnormals to signed zero, NaN
 * kept quiet (kn_internal.h's kn_bf16_bits, lane by lane). */
static inline __m512i kn_bf16_top512(__m512i u)
{
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    r = _mm512_and_si512(r, top);
    __mmask16 sub = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x00800000));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, sub,
                              _mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)));
    r = _mm512_mask_mov_epi32(r, nan,
                              _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)),
                                               top));
    return r;
}

#endif /* KN_AVX512_H */

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

/* The 32 int4 codes (0..15) of one 16-byte block (element 2i in the low
 * nibble of byte i, kn_quant.h) as unsigned bytes in the nibble order of
 * kn_qdot.h: the low nibbles (even columns) in the low half, the high
 * nibbles (odd columns) in the high half.  One broadcast load, one
 * variable shift, one and: no shuffle. */
__attribute__((always_inline)) static inline __m256i kn_avx2_q4_codes(const void *blk)
{
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)blk));
    return _mm256_and_si256(_mm256_srlv_epi32(raw, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                            _mm256_set1_epi8(0x0f));
}

/* e^x for float lanes (Cephes polynomial, ~1 ulp on [-87, 88]). */
__attribute__((always_inline)) static inline __m256 kn_exp256(__m256 x)
{
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447504f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* kn_bf16_bits of 8 floats (kn_internal.h), lane by lane, as the floats
 * they stand for: round to nearest even, subnormals to signed zero, NaN
 * kept quiet. */
__attribute__((always_inline)) static inline __m256 kn_avx2_bf16_round8(__m256 x)
{
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    __m256i u = _mm256_castps_si256(x);
    __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), top);
    /* magnitudes are below 2^31: signed compares order them */
    __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), mag);
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)),
                           sub);
    r = _mm256_blendv_epi8(
        r, _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), top), nan);
    return _mm256_castsi256_ps(r);
}

#endif /* KN_AVX2_H */

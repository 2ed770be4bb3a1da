/*
 * kn_qdot_avx2.c - AVX2 integer dot products (kn_qdot.h), compiled with
 * -mavx2 -mfma -mf16c and called only when kn_cpu_has_avx2().
 *
 * Per 32-value block, Q4/Q4S: the nibbles unpacked to column order minus
 * the zero (signed bytes in +-15) against int8 activations:
 *   maddubs(|w|, sign(x, w))  -> 16 x int16 pair sums (no saturation)
 *   madd(., 1)                -> 8 x int32: lane l = columns 4l .. 4l+3
 * Q8: the bytes widened to int16 against int16 activations:
 *   madd(w[0..15], x[0..15]) + madd(w[16..31], x[16..31]) -> 8 x int32
 * then acc = fma(float(lanes), scale, acc)
 * which is the canonical arithmetic of kn_qdot.h lane for lane; the ragged
 * last block of a row goes through the scalar lane helper, so the result
 * is bit-identical to kn_ref_matmul_q.
 *
 * A tile is R <= 4 weight rows x TT <= 3 tokens: each weight block is
 * loaded and unpacked once for TT tokens, each activation block once for R
 * rows.  Decode (T = 1) streams 4 rows at once; the 4 x 3 tiles of a
 * longer step re-read the 4 rows from L1 while the tokens go by.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

#define KN_AI __attribute__((always_inline)) static inline
#define KN_QR 4  /* rows per tile */
#define KN_QT 3  /* tokens per tile */

void kn_avx2_qact_quantize_row(const float *x, uint32_t cols, int i16,
                               void *q, float *d)
{
    uint32_t nfull = cols / KN_QK;
    size_t qb = i16 ? 2 * KN_QK : KN_QK;
    float qmax = i16 ? 32767.0f : 127.0f;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (uint32_t b = 0; b < nfull; b++) {
        const float *xb = x + (size_t)b * KN_QK;
        uint8_t *qo = (uint8_t *)q + (size_t)b * qb;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        __m256 m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
            _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float db = amax / qmax, id = db != 0.0f ? 1.0f / db : 0.0f;
        __m256 vid = _mm256_set1_ps(id);
        /* cvtps rounds to nearest even, as nearbyintf does by default */
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
        /* the packs work within 128-bit halves: undo their interleaving */
        __m256i a = _mm256_packs_epi32(i0, i1), c = _mm256_packs_epi32(i2, i3);
        if (i16) {
            _mm256_storeu_si256((__m256i *)qo, _mm256_permute4x64_epi64(a, 0xd8));
            _mm256_storeu_si256((__m256i *)qo + 1, _mm256_permute4x64_epi64(c, 0xd8));
        } else {
            __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, c), perm);
            _mm256_storeu_si256((__m256i *)qo, p);
        }
        d[b] = db;
    }
    if (nfull * KN_QK < cols)
        kn_qact_block(x + (size_t)nfull * KN_QK, cols - nfull * KN_QK, i16,
                      (uint8_t *)q + (size_t)nfull * qb, d + nfull);
}

/* The 32 int4 codes of block b of a row minus the zero, as signed bytes
 * in column order (16 bytes; element 2i in the low nibble of byte i). */
KN_AI __m256i load_w4(const uint8_t *row, uint32_t b, int z)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)(row + (size_t)b * 16));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(raw, m4);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    __m256i w = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    return _mm256_sub_epi8(w, _mm256_set1_epi8((char)z));
}

/* Y[t][r + i] += W[r + i] . Xq[t] for i < R, t0 <= t < t0 + TT. */
KN_AI void qtile(const kn_matrix *W, const uint8_t *xq, const float *xd,
                 float *Y, uint32_t r, size_t t0, int fmt, int R, int TT)
{
    const uint32_t cols = W->cols, rows = W->rows, nb = kn_qact_blocks(cols);
    const uint32_t nfull = cols / KN_QK;
    const int gsh = fmt == KN_W_Q8 ? 0 : __builtin_ctz(W->group) - 5;
    const uint32_t ng = fmt == KN_W_Q8 ? 0 : kn_q4_ngroups(cols, W->group);
    const size_t rbytes = fmt == KN_W_Q8 ? cols : kn_q4_row_bytes(cols);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *wp[KN_QR];
    const uint16_t *sp[KN_QR];
    const uint8_t *zp[KN_QR];
    __m256 acc[KN_QR][KN_QT];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        wp[i] = (const uint8_t *)W->data + (size_t)(r + (uint32_t)i) * rbytes;
        sp[i] = fmt == KN_W_Q8 ? NULL
                               : (const uint16_t *)W->scales + (size_t)(r + (uint32_t)i) * ng;
        zp[i] = fmt == KN_W_Q4 ? W->zeros + (size_t)(r + (uint32_t)i) * ng : NULL;
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            acc[i][t] = _mm256_setzero_ps();
    }
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK; /* int16 / int8 */
    const uint8_t *xr[KN_QT];
    const float *dr[KN_QT];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        xr[t] = xq + (t0 + (size_t)t) * nb * qb;
        dr[t] = xd + (t0 + (size_t)t) * nb;
    }
    for (uint32_t b = 0; b < nfull; b++) {
        __m256i xv[KN_QT], xv2[KN_QT];
        __m256 vd[KN_QT];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m256i *xp = (const __m256i *)(xr[t] + (size_t)b * qb);
            xv[t] = _mm256_loadu_si256(xp);
            if (fmt == KN_W_Q8)
                xv2[t] = _mm256_loadu_si256(xp + 1);
            vd[t] = _mm256_broadcast_ss(dr[t] + b);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            if (fmt == KN_W_Q8) { /* int8 weights x int16 activations */
                __m256i w = _mm256_loadu_si256((const __m256i *)(wp[i] + (size_t)b * 32));
                __m256i wlo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
                __m256i whi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wlo, xv[t]),
                                                 _mm256_madd_epi16(whi, xv2[t]));
                    acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), vd[t], acc[i][t]);
                }
                continue;
            }
            uint32_t g = b >> gsh;
            int z = fmt == KN_W_Q4 ? zp[i][g] : KN_Q4_ZERO_SYM;
            __m256i w = load_w4(wp[i], b, z);
            __m256i aw = _mm256_abs_epi8(w);
            __m256 ws = _mm256_set1_ps(_cvtsh_ss(sp[i][g]));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                __m256i p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], w)), ones);
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                            _mm256_mul_ps(ws, vd[t]), acc[i][t]);
            }
        }
    }
    if (nb > nfull) { /* ragged last block: the scalar lanes */
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                int32_t lane[8];
                kn_qdot_lanes(W, r + (uint32_t)i, nfull, xr[t] + (size_t)nfull * qb, lane);
                __m256 s = _mm256_set1_ps(kn_qdot_scale(W, r + (uint32_t)i, nfull, dr[t][nfull]));
                __m256 f = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)lane));
                acc[i][t] = _mm256_fmadd_ps(f, s, acc[i][t]);
            }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float y = kn_hsum256(acc[i][t]);
            if (fmt == KN_W_Q8)
                y *= ((const float *)W->scales)[r + (uint32_t)i];
            float *o = Y + (t0 + (size_t)t) * rows + r + i;
            *o += y;
        }
}

/* Rows [r0, r1) x all tokens for one format: 4-row blocks, 3-token tiles. */
KN_AI void qrows_fmt(const kn_matrix *W, const uint8_t *xq, const float *xd,
                     size_t T, float *Y, uint32_t r0, uint32_t r1, int fmt)
{
    uint32_t r = r0;
    for (; r + KN_QR <= r1; r += KN_QR) {
        size_t t = 0;
        for (; t + KN_QT <= T; t += KN_QT)
            qtile(W, xq, xd, Y, r, t, fmt, KN_QR, KN_QT);
        if (T - t == 2)
            qtile(W, xq, xd, Y, r, t, fmt, KN_QR, 2);
        else if (T - t == 1)
            qtile(W, xq, xd, Y, r, t, fmt, KN_QR, 1);
    }
    for (; r < r1; r++) {
        size_t t = 0;
        for (; t + KN_QT <= T; t += KN_QT)
            qtile(W, xq, xd, Y, r, t, fmt, 1, KN_QT);
        if (T - t == 2)
            qtile(W, xq, xd, Y, r, t, fmt, 1, 2);
        else if (T - t == 1)
            qtile(W, xq, xd, Y, r, t, fmt, 1, 1);
    }
}

void kn_avx2_matmul_q_rows(const kn_matrix *W, const void *xq,
                           const float *xd, size_t T, float *Y, uint32_t r0,
                           uint32_t r1)
{
    const uint8_t *q = xq;
    switch (W->fmt) {
    case KN_W_Q8: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q8); break;
    case KN_W_Q4: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4); break;
    default: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4S); break;
    }
}

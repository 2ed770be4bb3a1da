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
 * Decode (T <= 8, full blocks): dec1_rows4 streams 4 rows for one token,
 * decn_row one row for all T tokens, both with named accumulators and a
 * software prefetch (see "decode" below).  Longer steps (prefill) use
 * tiles of R <= 4 weight rows x TT <= 3 tokens: each weight block is
 * loaded and unpacked once for TT tokens, each activation block once for
 * R rows, the 4 rows re-read from L1 while the tokens go by.
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

/* ---- decode: T <= 8 --------------------------------------------------------
 * Decode is bound by the weight stream, so these kernels read every weight
 * block from memory once per step for all T tokens, keep the accumulators
 * in named registers (qtile's 2-D array spills them to the stack at -O2:
 * a store and a reload on every FMA), and prefetch the same column of the
 * rows KN_PF_ROWS further on, i.e. the data the next row blocks need: rows
 * are contiguous, so this runs one block of rows ahead of the hardware
 * prefetcher, which rows of a few hundred bytes never let get going.  The
 * arithmetic per output element is qtile's, block for block (kn_qdot.h):
 * the result is bit-identical whichever kernel computes it. */
#define KN_PF_ROWS 8

/* Q8 block b of a row against int16 activations xa (columns 0-15), xb
 * (16-31): the 8 lane sums as floats. */
KN_AI __m256 q8_lanes(const uint8_t *wrow, uint32_t b, __m256i xa, __m256i xb)
{
    __m256i w = _mm256_loadu_si256((const __m256i *)(wrow + (size_t)b * 32));
    __m256i p = _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), xa),
        _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), xb));
    return _mm256_cvtepi32_ps(p);
}

/* Q4/Q4S: the lane sums of unpacked codes w (aw = |w|) against int8 x. */
KN_AI __m256 q4_lanes(__m256i w, __m256i aw, __m256i x)
{
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(
        _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1)));
}

/* Q4/Q4S block b of row pointers (w4 codes, s f16 scales, z zeros or NULL):
 * the codes minus the zero, and the block's f16 scale as a float. */
KN_AI __m256i q4_codes(const uint8_t *w4, const uint8_t *z, uint32_t b,
                       int gsh, int fmt)
{
    return load_w4(w4, b, fmt == KN_W_Q4 ? z[b >> gsh] : KN_Q4_ZERO_SYM);
}

KN_AI void pf_row(const uint8_t *p)
{
    _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* One token, rows r .. r+3: Y[r + i] += W[r + i] . x (cols % 32 == 0). */
KN_AI void dec1_rows4(const kn_matrix *W, const uint8_t *x, const float *xd,
                      float *Y, uint32_t r, int fmt)
{
    const uint32_t nb = W->cols / KN_QK;
    const size_t rb = fmt == KN_W_Q8 ? W->cols : kn_q4_row_bytes(W->cols);
    const size_t bs = fmt == KN_W_Q8 ? 32 : 16;          /* bytes per block */
    const uint32_t lmask = fmt == KN_W_Q8 ? 1 : 3;       /* blocks per line - 1 */
    const size_t pf = KN_PF_ROWS * rb;
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    const uint8_t *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (fmt == KN_W_Q8) {
        for (uint32_t b = 0; b < nb; b++) {
            if ((b & lmask) == 0) {
                size_t o = (size_t)b * bs + pf;
                pf_row(w0 + o), pf_row(w1 + o), pf_row(w2 + o), pf_row(w3 + o);
            }
            const __m256i *xp = (const __m256i *)(x + (size_t)b * 64);
            __m256i xa = _mm256_loadu_si256(xp), xb = _mm256_loadu_si256(xp + 1);
            __m256 d = _mm256_broadcast_ss(xd + b);
            a0 = _mm256_fmadd_ps(q8_lanes(w0, b, xa, xb), d, a0);
            a1 = _mm256_fmadd_ps(q8_lanes(w1, b, xa, xb), d, a1);
            a2 = _mm256_fmadd_ps(q8_lanes(w2, b, xa, xb), d, a2);
            a3 = _mm256_fmadd_ps(q8_lanes(w3, b, xa, xb), d, a3);
        }
        const float *qs = (const float *)W->scales + r;
        Y[r] += kn_hsum256(a0) * qs[0];
        Y[r + 1] += kn_hsum256(a1) * qs[1];
        Y[r + 2] += kn_hsum256(a2) * qs[2];
        Y[r + 3] += kn_hsum256(a3) * qs[3];
        return;
    }
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    const uint16_t *s0 = (const uint16_t *)W->scales + (size_t)r * ng;
    const uint16_t *s1 = s0 + ng, *s2 = s1 + ng, *s3 = s2 + ng;
    const uint8_t *z0 = fmt == KN_W_Q4 ? W->zeros + (size_t)r * ng : NULL;
    const uint8_t *z1 = z0 ? z0 + ng : NULL, *z2 = z0 ? z1 + ng : NULL;
    const uint8_t *z3 = z0 ? z2 + ng : NULL;
    for (uint32_t b = 0; b < nb; b++) {
        if ((b & lmask) == 0) {
            size_t o = (size_t)b * bs + pf;
            pf_row(w0 + o), pf_row(w1 + o), pf_row(w2 + o), pf_row(w3 + o);
        }
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)b * 32));
        __m256 d = _mm256_broadcast_ss(xd + b);
        uint32_t g = b >> gsh;
        __m256i c0 = q4_codes(w0, z0, b, gsh, fmt), c1 = q4_codes(w1, z1, b, gsh, fmt);
        __m256i c2 = q4_codes(w2, z2, b, gsh, fmt), c3 = q4_codes(w3, z3, b, gsh, fmt);
        a0 = _mm256_fmadd_ps(q4_lanes(c0, _mm256_abs_epi8(c0), xv),
                             _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(s0[g])), d), a0);
        a1 = _mm256_fmadd_ps(q4_lanes(c1, _mm256_abs_epi8(c1), xv),
                             _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(s1[g])), d), a1);
        a2 = _mm256_fmadd_ps(q4_lanes(c2, _mm256_abs_epi8(c2), xv),
                             _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(s2[g])), d), a2);
        a3 = _mm256_fmadd_ps(q4_lanes(c3, _mm256_abs_epi8(c3), xv),
                             _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(s3[g])), d), a3);
    }
    Y[r] += kn_hsum256(a0);
    Y[r + 1] += kn_hsum256(a1);
    Y[r + 2] += kn_hsum256(a2);
    Y[r + 3] += kn_hsum256(a3);
}

/* TT <= 8 tokens (a constant after inlining), one row: the row's blocks
 * are loaded and unpacked once for all the tokens (cols % 32 == 0). */
KN_AI void decn_row(const kn_matrix *W, const uint8_t *xq, const float *xd,
                    float *Y, uint32_t r, int fmt, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t rb = fmt == KN_W_Q8 ? W->cols : kn_q4_row_bytes(W->cols);
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xs = (size_t)nb * qb;                   /* bytes per token */
    const size_t bs = fmt == KN_W_Q8 ? 32 : 16;
    const uint32_t lmask = fmt == KN_W_Q8 ? 1 : 3;
    const uint8_t *wr = (const uint8_t *)W->data + (size_t)r * rb;
    const int gsh = fmt == KN_W_Q8 ? 0 : __builtin_ctz(W->group) - 5;
    const uint32_t ng = fmt == KN_W_Q8 ? 0 : kn_q4_ngroups(W->cols, W->group);
    const uint16_t *sr = fmt == KN_W_Q8 ? NULL : (const uint16_t *)W->scales + (size_t)r * ng;
    const uint8_t *zr = fmt == KN_W_Q4 ? W->zeros + (size_t)r * ng : NULL;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        if ((b & lmask) == 0)
            pf_row(wr + (size_t)b * bs + (size_t)KN_PF_ROWS / 2 * rb);
        const uint8_t *xb = xq + (size_t)b * qb;
        if (fmt == KN_W_Q8) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wr + (size_t)b * 32));
            __m256i wlo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
            __m256i whi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const __m256i *xp = (const __m256i *)(xb + (size_t)t * xs);
                __m256i p = _mm256_add_epi32(
                    _mm256_madd_epi16(wlo, _mm256_loadu_si256(xp)),
                    _mm256_madd_epi16(whi, _mm256_loadu_si256(xp + 1)));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                         _mm256_broadcast_ss(xd + (size_t)t * nb + b), acc[t]);
            }
            continue;
        }
        __m256i c = q4_codes(wr, zr, b, gsh, fmt), ac = _mm256_abs_epi8(c);
        __m256 ws = _mm256_set1_ps(_cvtsh_ss(sr[b >> gsh]));
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + (size_t)t * xs));
            acc[t] = _mm256_fmadd_ps(
                q4_lanes(c, ac, xv),
                _mm256_mul_ps(ws, _mm256_broadcast_ss(xd + (size_t)t * nb + b)), acc[t]);
        }
    }
    float qs = fmt == KN_W_Q8 ? ((const float *)W->scales)[r] : 1.0f;
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float y = kn_hsum256(acc[t]);
        if (fmt == KN_W_Q8)
            y *= qs;
        Y[(size_t)t * rows + r] += y;
    }
}

/* Rows [r0, r1) of T <= 8 tokens on full 32-column blocks. */
KN_AI void dec_fmt(const kn_matrix *W, const uint8_t *xq, const float *xd,
                   size_t T, float *Y, uint32_t r0, uint32_t r1, int fmt)
{
    uint32_t r = r0;
    if (T == 1) {
        for (; r + 4 <= r1; r += 4)
            dec1_rows4(W, xq, xd, Y, r, fmt);
        for (; r < r1; r++)
            decn_row(W, xq, xd, Y, r, fmt, 1);
        return;
    }
#define KN_DN(tt)                                                              \
    case tt:                                                                   \
        for (; r < r1; r++)                                                    \
            decn_row(W, xq, xd, Y, r, fmt, tt);                                \
        break;
    switch (T) {
        KN_DN(2) KN_DN(3) KN_DN(4) KN_DN(5) KN_DN(6) KN_DN(7) default: KN_DN(8)
    }
#undef KN_DN
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
    if (T <= 8 && W->cols % KN_QK == 0) {
        switch (W->fmt) {
        case KN_W_Q8: dec_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q8); break;
        case KN_W_Q4: dec_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4); break;
        default: dec_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4S); break;
        }
        return;
    }
    switch (W->fmt) {
    case KN_W_Q8: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q8); break;
    case KN_W_Q4: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4); break;
    default: qrows_fmt(W, q, xd, T, Y, r0, r1, KN_W_Q4S); break;
    }
}

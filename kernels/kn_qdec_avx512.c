/*
 * kn_qdec_avx512.c - integer decode (kn_avx512_matmul_q_dec of
 * kn_internal.h) with AVX-512 VNNI on 256-bit vectors: int4 weights
 * against 1-8 tokens, int8 weights against 2-8 tokens, full blocks;
 * called only when kn_cpu_has_avx512().  Same bits as kn_qdot_avx2.c
 * (kn_qdot.h's canonical arithmetic; test_qdot compares them over ragged
 * shapes).  Split from kn_qgemm_avx512.c (the prefill GEMM), whose header
 * records the measurements of these kernels.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

#define KN_AI __attribute__((always_inline)) static inline

/* ---- decode, 1 token, int4 -------------------------------------------------
 * kn_qdot_avx2.c's dec1_q4_rows with VNNI.  Per block and row it needs
 * kn_qdot.h's 8 exact int32 lane sums of (q - zero) * x; here the
 * unsigned codes c (kn_avx2_q4_codes) go straight into vpdpbusd against
 * the signed activations:
 *   Q4S: p = dpbusd(init, c, x), init = -8 * (lane sums of x), computed
 *        once per block for all the rows: p IS the canonical integer;
 *   Q4:  A = dpbusd(0, c, x); lane = fnmadd(zero, S, A) as the AVX2
 *        kernel (every term an integer below 2^24: exact);
 * then acc = fma((float)p, s_b, acc), s_b = f16 scale * d the same float
 * product, taken from a per-batch table as an embedded broadcast.  So
 * one vpdpbusd replaces maddubs + madd, and the fma loses its separate
 * broadcast (Q4S also the fnmadd). */
#define KN_D1_BLK 8  /* blocks per batch of precomputed s_b */
#define KN_D1_R 8    /* rows per call */
#define KN_D1_PF 8   /* rows ahead for the L2 prefetch */

typedef struct d1_tab {
    _Alignas(32) float s[KN_D1_R][KN_D1_BLK];
    _Alignas(32) float z[KN_D1_R][KN_D1_BLK];
} d1_tab;

/* s_b (and the zero as a float, Q4) of blocks [b0, b0 + n) of R rows. */
KN_AI void d1_tab_fill(d1_tab *P, const uint16_t *s0, const uint8_t *z0,
                       uint32_t ng, const float *xd, uint32_t b0, uint32_t n,
                       int gsh, int R)
{
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint16_t *sr = s0 + (size_t)i * ng;
        const uint8_t *zr = z0 ? z0 + (size_t)i * ng : NULL;
        if (n == KN_D1_BLK && gsh == 0) {
            __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sr + b0)));
            _mm256_store_ps(P->s[i], _mm256_mul_ps(sv, _mm256_loadu_ps(xd + b0)));
            if (zr)
                _mm256_store_ps(P->z[i], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                             _mm_loadl_epi64((const __m128i *)(zr + b0)))));
            continue;
        }
        for (uint32_t k = 0; k < n; k++) {
            uint32_t g = (b0 + k) >> gsh;
            P->s[i][k] = _cvtsh_ss(sr[g]) * xd[b0 + k];
            if (zr)
                P->z[i][k] = (float)zr[g];
        }
    }
}

/* Blocks [b0, b0 + n) of the R rows at w0 (row stride rb). */
KN_AI void d1_run(const uint8_t *w0, size_t rb, const uint8_t *x, uint32_t b0,
                  uint32_t n, const d1_tab *P, int fmt, __m256 *acc, int R)
{
    const __m256i ones = _mm256_set1_epi8(1);
    const uint8_t *p = w0 + (size_t)b0 * 16, *xb = x + (size_t)b0 * KN_QK;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *q = p + (size_t)k * 16;
        if (((b0 + k) & 3) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                _mm_prefetch((const char *)(q + KN_D1_PF * rb + (size_t)i * rb), _MM_HINT_T1);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + (size_t)k * KN_QK));
        __m256i sx = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, xv);
        if (fmt == KN_W_Q4S) {
            __m256i init = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(sx, 3));
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m256i c = kn_avx2_q4_codes(q + (size_t)i * rb);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(init, c, xv)),
                                         _mm256_set1_ps(P->s[i][k]), acc[i]);
            }
        } else {
            __m256 S = _mm256_cvtepi32_ps(sx);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m256i c = kn_avx2_q4_codes(q + (size_t)i * rb);
                __m256 a = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), c, xv));
                acc[i] = _mm256_fmadd_ps(_mm256_fnmadd_ps(_mm256_set1_ps(P->z[i][k]), S, a),
                                         _mm256_set1_ps(P->s[i][k]), acc[i]);
            }
        }
    }
}

/* One token, rows r .. r+R-1: Y[r + i] += W[r + i] . x (cols % 32 == 0). */
KN_AI void dec1_rows(const kn_matrix *W, const uint8_t *x, const float *xd,
                     float *Y, uint32_t r, int fmt, int R)
{
    const uint32_t nb = W->cols / KN_QK;
    const size_t rb = kn_q4_row_bytes(W->cols);
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    const uint16_t *s0 = (const uint16_t *)W->scales + (size_t)r * ng;
    const uint8_t *z0 = fmt == KN_W_Q4 ? W->zeros + (size_t)r * ng : NULL;
    d1_tab P[2];
    __m256 acc[KN_D1_R];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        acc[i] = _mm256_setzero_ps();
    d1_tab_fill(&P[0], s0, z0, ng, xd, 0, nb < KN_D1_BLK ? nb : KN_D1_BLK, gsh, R);
    for (uint32_t b0 = 0, cur = 0; b0 < nb; b0 += KN_D1_BLK, cur ^= 1) {
        const uint32_t n = nb - b0 < KN_D1_BLK ? nb - b0 : KN_D1_BLK;
        if (b0 + KN_D1_BLK < nb) {
            uint32_t b1 = b0 + KN_D1_BLK;
            d1_tab_fill(&P[cur ^ 1], s0, z0, ng, xd, b1,
                        nb - b1 < KN_D1_BLK ? nb - b1 : KN_D1_BLK, gsh, R);
        }
        d1_run(w0, rb, x, b0, n, &P[cur], fmt, acc, R);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        Y[r + (uint32_t)i] += kn_hsum256(acc[i]);
}

KN_AI void dec1_fmt(const kn_matrix *W, const uint8_t *xq, const float *xd,
                    float *Y, uint32_t r0, uint32_t r1, int fmt)
{
    uint32_t r = r0;
    for (; r + KN_D1_R <= r1; r += KN_D1_R)
        dec1_rows(W, xq, xd, Y, r, fmt, KN_D1_R);
    switch (r1 - r) {
    case 7: dec1_rows(W, xq, xd, Y, r, fmt, 7); break;
    case 6: dec1_rows(W, xq, xd, Y, r, fmt, 6); break;
    case 5: dec1_rows(W, xq, xd, Y, r, fmt, 5); break;
    case 4: dec1_rows(W, xq, xd, Y, r, fmt, 4); break;
    case 3: dec1_rows(W, xq, xd, Y, r, fmt, 3); break;
    case 2: dec1_rows(W, xq, xd, Y, r, fmt, 2); break;
    case 1: dec1_rows(W, xq, xd, Y, r, fmt, 1); break;
    default: break;
    }
}

/* ---- decode, 2 <= T <= 8 tokens, int4, with a table of s_b ----------------
 * kn_qdot_avx2.c's decn_row does one row at a time, sign + maddubs + madd
 * per token; here the rows of a pass share each token's biased
 * activation block (xu = x ^ 0x80: one load and one xor for all), and
 * each (row, token) costs one vpdpbusd against the signed codes
 * w = q - zero from the row's init = -128 * (lane sums of w): the same
 * exact lanes.  s_b = scale * d comes from a table built per batch of 8
 * blocks (8 vector multiplies per row and token, the same float
 * products; a ragged last batch with masked loads) as the fma's embedded
 * broadcast: per (row, token, block) vpdpbusd + convert + fma, no
 * multiply and no broadcast.  Passes of 4 rows for TT <= 4 tokens, 2 rows
 * for 5..8 (4 x 8 = 32 accumulators would spill: that is why the table
 * once measured 0.84-1.15x there; 2 x 8 = 16). */
#define KN_DN_MAXR 4

typedef struct dn_tab {
    _Alignas(32) float s[8][KN_DN_MAXR][KN_D1_BLK]; /* [token][row][block] */
} dn_tab;

KN_AI void dn_tab_fill(dn_tab *P, const uint16_t *s0, uint32_t ng,
                       const float *xd, uint32_t nb, uint32_t b0, uint32_t n,
                       int gsh, int R, int TT)
{
#pragma GCC unroll 4
    for (int i = 0; i < R; i++) {
        const uint16_t *sr = s0 + (size_t)i * ng;
        if (gsh == 0) { /* a ragged batch masked: lanes >= n stay unread */
            const __mmask8 m = (__mmask8)((1u << n) - 1);
            __m256 sv = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(m, sr + b0));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++)
                _mm256_store_ps(P->s[t][i], _mm256_mul_ps(sv, _mm256_maskz_loadu_ps(m, xd + (size_t)t * nb + b0)));
            continue;
        }
        for (uint32_t k = 0; k < n; k++) {
            float sc = _cvtsh_ss(sr[(b0 + k) >> gsh]);
            for (int t = 0; t < TT; t++)
                P->s[t][i][k] = sc * xd[(size_t)t * nb + b0 + k];
        }
    }
}

KN_AI void dn_run(const uint8_t *w0, size_t rb, const uint8_t *z0, uint32_t ng,
                  const uint8_t *xq, size_t xs, uint32_t b0, uint32_t n,
                  const dn_tab *P, int gsh, int fmt, __m256 acc[][8], int R, int TT)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 2
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t b = b0 + k;
        __m256i w[KN_DN_MAXR], init[KN_DN_MAXR];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const uint8_t *q = w0 + (size_t)i * rb + (size_t)b * 16;
            if ((b & 3) == 0)
                _mm_prefetch((const char *)(q + KN_D1_PF * rb), _MM_HINT_T1);
            int z = fmt == KN_W_Q4 ? z0[(size_t)i * ng + (b >> gsh)] : KN_Q4_ZERO_SYM;
            w[i] = _mm256_sub_epi8(kn_avx2_q4_codes(q), _mm256_set1_epi8((char)z));
            init[i] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, w[i]));
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m256i xu = _mm256_xor_si256(
                _mm256_loadu_si256((const __m256i *)(xq + (size_t)t * xs + (size_t)b * KN_QK)), bias);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++)
                acc[i][t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(init[i], xu, w[i])),
                    _mm256_set1_ps(P->s[t][i][k]), acc[i][t]);
        }
    }
}

KN_AI void dec_rows_tab(const kn_matrix *W, const uint8_t *xq, const float *xd,
                        float *Y, uint32_t r, int fmt, int R, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t rb = kn_q4_row_bytes(W->cols);
    const size_t xs = (size_t)nb * KN_QK; /* bytes per token */
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    const uint16_t *s0 = (const uint16_t *)W->scales + (size_t)r * ng;
    const uint8_t *z0 = fmt == KN_W_Q4 ? W->zeros + (size_t)r * ng : NULL;
    dn_tab P[2];
    __m256 acc[KN_DN_MAXR][8];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            acc[i][t] = _mm256_setzero_ps();
    dn_tab_fill(&P[0], s0, ng, xd, nb, 0, nb < KN_D1_BLK ? nb : KN_D1_BLK, gsh, R, TT);
    for (uint32_t b0 = 0, cur = 0; b0 < nb; b0 += KN_D1_BLK, cur ^= 1) {
        const uint32_t n = nb - b0 < KN_D1_BLK ? nb - b0 : KN_D1_BLK;
        if (b0 + KN_D1_BLK < nb) {
            uint32_t b1 = b0 + KN_D1_BLK;
            dn_tab_fill(&P[cur ^ 1], s0, ng, xd, nb, b1,
                        nb - b1 < KN_D1_BLK ? nb - b1 : KN_D1_BLK, gsh, R, TT);
        }
        dn_run(w0, rb, z0, ng, xq, xs, b0, n, &P[cur], gsh, fmt, acc, R, TT);
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            Y[(size_t)t * rows + r + (uint32_t)i] += kn_hsum256(acc[i][t]);
}

KN_AI void dec_fmt(const kn_matrix *W, const uint8_t *xq, const float *xd,
                   float *Y, uint32_t r0, uint32_t r1, int fmt, int TT)
{
    uint32_t r = r0;
    if (TT > 4) { /* 4 rows x 5..8 tokens would spill the accumulators */
        for (; r + 2 <= r1; r += 2)
            dec_rows_tab(W, xq, xd, Y, r, fmt, 2, TT);
        if (r < r1)
            dec_rows_tab(W, xq, xd, Y, r, fmt, 1, TT);
        return;
    }
    const int R = 4;
    for (; r + (uint32_t)R <= r1; r += (uint32_t)R)
        dec_rows_tab(W, xq, xd, Y, r, fmt, R, TT);
    switch (r1 - r) {
    case 3: dec_rows_tab(W, xq, xd, Y, r, fmt, 3, TT); break;
    case 2: dec_rows_tab(W, xq, xd, Y, r, fmt, 2, TT); break;
    case 1: dec_rows_tab(W, xq, xd, Y, r, fmt, 1, TT); break;
    default: break;
    }
}

/* ---- decode, 2 <= T <= 8 tokens, int8 -------------------------------------
 * kn_qdot_avx2.c's decn_row does one row at a time: per (token, block)
 * two madd, an add, a broadcast of d, the convert and the fma.  Here a
 * pass of R rows shares each token's activation loads and d, and the
 * lanes take madd + vpdpwssd: lane l = cols 2l, 2l+1 (madd) plus cols
 * 16+2l, 17+2l (the dot-add), the same exact int32 (|sum| < 2^25), so
 * the convert, the fma with d[b], the final kn_hsum256 and the row scale
 * are decn_row's, in its order.  4 rows for TT <= 4 tokens (16
 * accumulators, 8 widened weight vectors), 2 rows for 5..8; leftover
 * rows one at a time.  The weight rows are prefetched into L2 (T1)
 * KN_D1_PF rows ahead, as the int4 kernels do. */
KN_AI void dq8_rows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                    float *Y, uint32_t r, int R, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t rb = W->cols;
    const size_t xs = (size_t)nb * 2 * KN_QK; /* bytes per token */
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    __m256 acc[KN_DN_MAXR][8];
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            acc[i][t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        __m256i wlo[KN_DN_MAXR], whi[KN_DN_MAXR];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const uint8_t *q = w0 + (size_t)i * rb + (size_t)b * 32;
            if ((b & 1) == 0)
                _mm_prefetch((const char *)(q + KN_D1_PF * rb), _MM_HINT_T1);
            __m256i w = _mm256_loadu_si256((const __m256i *)q);
            wlo[i] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
            whi[i] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m256i *xp = (const __m256i *)(xq + (size_t)t * xs + (size_t)b * 2 * KN_QK);
            __m256i xa = _mm256_loadu_si256(xp), xb = _mm256_loadu_si256(xp + 1);
            __m256 d = _mm256_broadcast_ss(xd + (size_t)t * nb + b);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                __m256i p = _mm256_dpwssd_epi32(_mm256_madd_epi16(wlo[i], xa), whi[i], xb);
                acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[i][t]);
            }
        }
    }
    const float *qs = (const float *)W->scales + r;
#pragma GCC unroll 4
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            float y = kn_hsum256(acc[i][t]);
            y *= qs[i];
            Y[(size_t)t * rows + r + (uint32_t)i] += y;
        }
}

KN_AI void dq8_fmt(const kn_matrix *W, const uint8_t *xq, const float *xd,
                   float *Y, uint32_t r0, uint32_t r1, int TT)
{
    const int R = TT > 4 ? 2 : 4;
    uint32_t r = r0;
    for (; r + (uint32_t)R <= r1; r += (uint32_t)R)
        dq8_rows(W, xq, xd, Y, r, R, TT);
    for (; r < r1; r++)
        dq8_rows(W, xq, xd, Y, r, 1, TT);
}

int kn_avx512_matmul_q_dec_ok(const kn_matrix *W, size_t T)
{
    return T >= 1 && T <= 8 && W->cols % KN_QK == 0 &&
           (W->fmt == KN_W_Q4 || W->fmt == KN_W_Q4S || (W->fmt == KN_W_Q8 && T >= 2));
}

void kn_avx512_matmul_q_dec(const kn_matrix *W, const void *xq, const float *xd,
                            size_t T, float *Y, uint32_t r0, uint32_t r1)
{
#define KN_DT(tt)                                                              \
    case tt:                                                                   \
        if (W->fmt == KN_W_Q8)                                                 \
            dq8_fmt(W, xq, xd, Y, r0, r1, tt);                                 \
        else if (W->fmt == KN_W_Q4)                                            \
            dec_fmt(W, xq, xd, Y, r0, r1, KN_W_Q4, tt);                        \
        else                                                                   \
            dec_fmt(W, xq, xd, Y, r0, r1, KN_W_Q4S, tt);                       \
        break;
    if (T == 1) {
        if (W->fmt == KN_W_Q4)
            dec1_fmt(W, xq, xd, Y, r0, r1, KN_W_Q4);
        else
            dec1_fmt(W, xq, xd, Y, r0, r1, KN_W_Q4S);
        return;
    }
    switch (T) {
        KN_DT(2) KN_DT(3) KN_DT(4) KN_DT(5) KN_DT(6) KN_DT(7) default: KN_DT(8)
    }
#undef KN_DT
}

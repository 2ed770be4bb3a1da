/*
 * kn_gemm_avx2.c - the prefill GEMMs of kn_gemm.h (compiled with -mavx2
 * -mfma -mf16c; called only when kn_cpu_has_avx2()).
 *
 * Float activations (kn_gemm_rows): the decode kernels' per-element
 * summation order (kn_gemm.h); only which (row, token) pairs are computed
 * while which data is in which cache changes.  Register tiles are R rows
 * x TT tokens of independent 8-lane accumulators.
 *
 * Quantized activations (kn_gemm_q_rows): kn_qdot.h's block sums, with
 * ROWS in the vector lanes, so one convert + one fma serves 8 (row,
 * token) pairs a block.  The weights stay row-major in the artifact; each
 * 8-row x 32-column block is transposed once per token panel (64 tokens)
 * into an L1 panel where lane i of vector k holds row i's weights at
 * activation positions 4k..4k+3 (int4: unsigned codes 0..15) or columns
 * 2k, 2k+1 (Q8: int16).  Per (8 rows, token, block):
 *   int4  8 x maddubs(codes, the token's 4 activation bytes broadcast),
 *         summed as int16 (|8 x 2 x 15 x 128| < 2^15), madd by 1 to int32,
 *         + madd(-zero, block sum of the activations) = i_b, exact for
 *         every code including -128 (no sign trick);
 *   Q8    16 x madd(int16 weight pairs, the broadcast activation pair),
 *         summed as int32 (|i_b| < 2^27);
 * then (float)i_b by _mm256_cvtepi32_ps (the reference's (float) cast,
 * round to nearest even), s_b = scale x d by one multiply (int4), one fma
 * into the row's float chain, blocks in order; the ragged last block is
 * the chain's last, its missing columns zero in the panel and in the
 * activations.  At the end Q8 multiplies by the row scale, and Y += acc
 * (Y holds bias or 0): the reference's bits (test_qdot checks them).
 * The block chains are kept in order by an empty asm on the accumulator:
 * GCC otherwise reassociates the 16 int32 adds into a tree with every
 * product alive and spills them (Q8 ran at 0.85-1.0x of the old form
 * that way, 1.5-1.7x without the spills).
 * Measured (docs/benchmarks.md, i10_g2; 1 thread, AVX2 path): int4
 * (Q4, Q4S) 2.5-2.9x and Q8 1.5-1.7x the session-9 kernels at T = 128
 * and 512.  The always_inline helpers are instantiated per (format, row
 * groups, tokens) through the switches, so the compiler unrolls every
 * tile.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_gemm.h"
#include "kn_gemm_pf.h"
#include "kn_internal.h"
#include "kn_qdot.h"
#include "kn_qgemm_finish.h"

#define KN_AI __attribute__((always_inline)) static inline

/* ---- float activations --------------------------------------------------- */

#define KN_GEMM_RP 8   /* rows dequantized at once: 8 x KN_KC floats, 16 KiB (L1) */
#define KN_GEMM_TP 128 /* tokens per panel: 128 x KN_KC floats of X, 256 KiB (L2) */
#define KN_GEMM_RB 4   /* register tile: rows */
#define KN_GEMM_TB 3   /* register tile: tokens */
/* Row stride of the dequantized panel: KN_KC plus a cache line, so that
 * the panel's rows do not all fall in the same L1 sets. */
#define KN_GEMM_LDW (KN_KC + 16)

/* kn_hsum256 of a, b, c, d as the 4 lanes of one vector, with the same
 * additions in the same tree (float addition is commutative, so hadd's
 * operand order does not matter): u = lo + hi per vector, then
 * (u0 + u1) + (u2 + u3).  14 instructions for 4 sums instead of 24, and
 * one 4-float update of Y instead of 4 scalar ones. */
KN_AI __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                              _mm256_permute2f128_ps(a, b, 0x31));
    __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20),
                              _mm256_permute2f128_ps(c, d, 0x31));
    __m256 v = _mm256_hadd_ps(ab, cd); /* a A, a B, c A, c B | b .., d .. */
    v = _mm256_hadd_ps(v, v);          /* a, c, a, c | b, d, b, d */
    return _mm_unpacklo_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
}

/* Y[t][i] += dot(wb[i][0..n), X[t][0..n)) for i < R, t < TT: per element
 * one 8-lane chain over the columns in order, hsum, the scalar tail -- the
 * decode kernels' order (kn_ops_avx2.c canon_rows). */
KN_AI void micro(const float *wb, const float *X, size_t ldx, uint32_t n,
                 float *Y, size_t ldy, int R, int TT)
{
    __m256 acc[KN_GEMM_RB][KN_GEMM_TB];
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++)
            acc[i][t] = _mm256_setzero_ps();
    uint32_t nmain = n & ~7u;
    for (uint32_t k = 0; k < nmain; k += 8) {
        __m256 x[KN_GEMM_TB];
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++)
            x[t] = _mm256_loadu_ps(X + (size_t)t * ldx + k);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            __m256 w = _mm256_load_ps(wb + (size_t)i * KN_GEMM_LDW + k);
#pragma GCC unroll 16
            for (int t = 0; t < TT; t++)
                acc[i][t] = _mm256_fmadd_ps(w, x[t], acc[i][t]);
        }
    }
    if (R == 4 && nmain == n) { /* a full tile: 4 rows' sums at once */
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++) {
            float *y = Y + (size_t)t * ldy;
            _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y),
                                        hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t])));
        }
        return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++) {
            float s = kn_hsum256(acc[i][t]);
            for (uint32_t k = nmain; k < n; k++)
                s += wb[(size_t)i * KN_GEMM_LDW + k] * X[(size_t)t * ldx + k];
            Y[(size_t)t * ldy + i] += s;
        }
}

static void micro_any(const float *wb, const float *X, size_t ldx, uint32_t n,
                      float *Y, size_t ldy, int R, int TT)
{
#define KN_MC(r, t)                                                            \
    case (r) * 4 + (t): micro(wb, X, ldx, n, Y, ldy, r, t); break;
    switch (R * 4 + TT) {
        KN_MC(1, 1) KN_MC(1, 2) KN_MC(1, 3) KN_MC(2, 1) KN_MC(2, 2) KN_MC(2, 3)
        KN_MC(3, 1) KN_MC(3, 2) KN_MC(3, 3) KN_MC(4, 1) KN_MC(4, 2)
        default: micro(wb, X, ldx, n, Y, ldy, 4, 3); break;
    }
#undef KN_MC
}

/* One dequantized panel wb (R <= KN_GEMM_RP rows of n columns, row stride
 * KN_GEMM_LDW) times tokens [t0, t1): 3-token tiles, each used for every
 * 4-row tile of the panel while it is in L1.  The Y lines of the next
 * token tile are prefetched (Y is T x rows floats, megabytes, and each
 * tile touches a few bytes of a line per token: no hardware prefetcher
 * sees that pattern), and a few lines of the next weight panel. */
static void panel(const float *wb, int R, const float *X, size_t ldx,
                  uint32_t n, float *Y, size_t ldy, size_t t0, size_t t1,
                  kn_wpf *pf)
{
    size_t t = t0;
    const uint32_t per = pf->total / (uint32_t)((t1 - t0) / KN_GEMM_TB + 1) + 1;
    for (; t + KN_GEMM_TB <= t1; t += KN_GEMM_TB) {
        for (size_t j = t + KN_GEMM_TB; j < t + 2 * KN_GEMM_TB && j < t1; j++) {
            _mm_prefetch((const char *)(Y + j * ldy), _MM_HINT_T0);
            _mm_prefetch((const char *)(Y + j * ldy + (size_t)R - 1), _MM_HINT_T0);
        }
        wpf_some(pf, per);
        for (int i = 0; i < R; i += KN_GEMM_RB) {
            const float *w = wb + (size_t)i * KN_GEMM_LDW;
            const float *x = X + t * ldx;
            float *y = Y + t * ldy + (size_t)i;
            if (R - i >= KN_GEMM_RB)
                micro(w, x, ldx, n, y, ldy, KN_GEMM_RB, KN_GEMM_TB);
            else
                micro_any(w, x, ldx, n, y, ldy, R - i, KN_GEMM_TB);
        }
    }
    if (t < t1)
        for (int i = 0; i < R; i += KN_GEMM_RB)
            micro_any(wb + (size_t)i * KN_GEMM_LDW, X + t * ldx, ldx, n,
                      Y + t * ldy + (size_t)i, ldy,
                      R - i < KN_GEMM_RB ? R - i : KN_GEMM_RB, (int)(t1 - t));
    wpf_some(pf, UINT32_MAX);
}

void kn_gemm_rows(const kn_matrix *W, const float *X, size_t T, float *Y,
                  uint32_t r0, uint32_t r1)
{
    _Alignas(64) float wb[KN_GEMM_RP * KN_GEMM_LDW];
    const uint32_t cols = W->cols, rows = W->rows;
    /* Column blocks outermost: each element receives its KN_KC-block sums
     * in column order, as the decode kernels add them. */
    for (uint32_t c0 = 0; c0 < cols; c0 += KN_KC) {
        uint32_t n = cols - c0 < KN_KC ? cols - c0 : KN_KC;
        for (size_t t0 = 0; t0 < T; t0 += KN_GEMM_TP) {
            size_t t1 = T - t0 < KN_GEMM_TP ? T : t0 + KN_GEMM_TP;
            for (uint32_t r = r0; r < r1; r += KN_GEMM_RP) {
                int R = r1 - r < KN_GEMM_RP ? (int)(r1 - r) : KN_GEMM_RP;
                for (int i = 0; i < R; i++)
                    kn_avx2_dequant_block(W, r + (uint32_t)i, c0, n,
                                          wb + (size_t)i * KN_GEMM_LDW);
                uint32_t rn = r + (uint32_t)R;
                kn_wpf pf = wpf_make(W, rn, rn < r1 ? (int)(r1 - rn < KN_GEMM_RP ? r1 - rn : KN_GEMM_RP) : 0, c0, n);
                panel(wb, R, X + c0, cols, n, Y + r, rows, t0, t1, &pf);
            }
        }
    }
}

/* ---- quantized activations ------------------------------------------------ */

#define KN_QP_RG 8    /* rows of a row group: the 8 lanes of a ymm */
#define KN_QP_NG 2    /* row groups of a weight panel and register tile */
#define KN_QP_TT 3    /* register tile: tokens (x 2 row groups) */
#define KN_QP_RS 64   /* rows whose float accumulators wait in memory */
#define KN_QP_BLK4 32 /* 32-column blocks of a weight panel, int4 */
#define KN_QP_BLK8 16 /* the same, Q8 (twice the bytes a block) */
#define KN_QP_TP 64   /* tokens per panel */

/* One weight panel, up to 16 rows (2 groups of 8) x KN_QP_BLK4 (int4) or
 * KN_QP_BLK8 (Q8) blocks, transposed so that lane i of a vector is row i
 * of its group: per block and group, int4 8 vectors (vector k = the 8
 * rows' unsigned codes at positions 4k .. 4k+3 of kn_qdot.h's nibble
 * order), Q8 16 vectors (vector k = the 8 rows' weights of columns 2k,
 * 2k+1 as int16), at w + ((block * 2 + group) * nk + k) * 32; int4 also
 * the f16 scales as floats and -zero in the low int16 of each lane.  Rows
 * past the matrix are zeros.  20 KiB: in L1 while the tokens go by. */
typedef struct kn_qpanel {
    _Alignas(32) uint8_t w[KN_QP_BLK4 * KN_QP_NG * 8 * 32];
    _Alignas(32) float s[KN_QP_BLK4][KN_QP_NG * KN_QP_RG];
    _Alignas(32) int32_t nz[KN_QP_BLK4][KN_QP_NG * KN_QP_RG];
} kn_qpanel;

/* r[i] = row i's 8 dwords -> r[k] = dword k of rows 0..7. */
KN_AI void t8x8(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* t[2i]: rows 2i, 2i+1 dwords 0, 1 | 4, 5; t[2i+1]: 2, 3 | 6, 7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    /* u[4h + k]: rows 4h .. 4h+3, dword k | dword 4 + k */
    for (int k = 0; k < 4; k++) {
        r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* Unpack and transpose rows r .. r+R-1 (R <= 8) into row group h of P,
 * blocks [b0, b0 + nb).  The ragged last block (cols % 32) is copied into
 * a zeroed buffer first: no read past the row, and its missing columns
 * meet the activations' zero padding. */
static void qpanel_fill(kn_qpanel *P, const kn_matrix *W, uint32_t r, int R,
                        int h, uint32_t b0, uint32_t nb)
{
    const uint32_t cols = W->cols, nfull = cols / KN_QK;
    if (W->fmt == KN_W_Q8) {
        for (uint32_t j = 0; j < nb; j++) {
            const uint32_t b = b0 + j;
            __m256i lo[8], hi[8];
            for (int i = 0; i < KN_QP_RG; i++) {
                __m256i w = _mm256_setzero_si256();
                if (i < R) {
                    const int8_t *src = (const int8_t *)W->data +
                                        (size_t)(r + (uint32_t)i) * cols + (size_t)b * KN_QK;
                    if (b < nfull) {
                        w = _mm256_loadu_si256((const __m256i *)src);
                    } else {
                        _Alignas(32) int8_t tmp[KN_QK] = {0};
                        memcpy(tmp, src, cols - b * KN_QK);
                        w = _mm256_load_si256((const __m256i *)tmp);
                    }
                }
                lo[i] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
                hi[i] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1));
            }
            t8x8(lo);
            t8x8(hi);
            uint8_t *o = P->w + ((size_t)j * KN_QP_NG + (size_t)h) * 16 * 32;
            for (int k = 0; k < 8; k++) {
                _mm256_store_si256((__m256i *)(o + k * 32), lo[k]);
                _mm256_store_si256((__m256i *)(o + (8 + k) * 32), hi[k]);
            }
        }
        return;
    }
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(cols, W->group);
    const size_t rb = kn_q4_row_bytes(cols);
    for (uint32_t j = 0; j < nb; j++) {
        const uint32_t b = b0 + j;
        __m256i c[8];
        float *s = P->s[j] + h * KN_QP_RG;
        int32_t *nz = P->nz[j] + h * KN_QP_RG;
        for (int i = 0; i < KN_QP_RG; i++) {
            if (i >= R) {
                c[i] = _mm256_setzero_si256();
                s[i] = 0.0f;
                nz[i] = 0;
                continue;
            }
            const size_t ri = r + (uint32_t)i, gi = ri * ng + (b >> gsh);
            const uint8_t *src = (const uint8_t *)W->data + ri * rb + (size_t)b * 16;
            if (b < nfull) {
                c[i] = kn_avx2_q4_codes(src);
            } else {
                uint8_t tmp[16] = {0};
                memcpy(tmp, src, rb - (size_t)b * 16);
                c[i] = kn_avx2_q4_codes(tmp);
            }
            int z = W->fmt == KN_W_Q4 ? W->zeros[gi] : KN_Q4_ZERO_SYM;
            s[i] = _cvtsh_ss(((const uint16_t *)W->scales)[gi]);
            nz[i] = (int32_t)(uint16_t)(int16_t)-z;
        }
        t8x8(c);
        uint8_t *o = P->w + ((size_t)j * KN_QP_NG + (size_t)h) * 8 * 32;
        for (int k = 0; k < 8; k++)
            _mm256_store_si256((__m256i *)(o + k * 32), c[k]);
    }
}

/* The 8 int32 sums of the quads (4 bytes) of one int8 activation block. */
KN_AI __m256i quad_sums(const uint8_t *x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1),
                                                  _mm256_loadu_si256((const __m256i *)x)),
                             _mm256_set1_epi16(1));
}

/* sx[t][j] = the sum of the 32 int8 activations of token t, block b0 + j
 * (t < tn, j < nb; xq at the panel's first token): the int4 kernels'
 * zero correction.  Eight blocks at a time through an hadd tree. */
static void qsums(const uint8_t *xq, size_t xstride, uint32_t b0, uint32_t nb,
                  size_t tn, int32_t (*sx)[KN_QP_BLK4])
{
    for (size_t t = 0; t < tn; t++) {
        const uint8_t *x = xq + t * xstride + (size_t)b0 * KN_QK;
        uint32_t j = 0;
        for (; j + 8 <= nb; j += 8) {
            __m256i v[8];
            for (int k = 0; k < 8; k++)
                v[k] = quad_sums(x + (size_t)(j + (uint32_t)k) * KN_QK);
            __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                           _mm256_hadd_epi32(v[2], v[3]));
            __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                           _mm256_hadd_epi32(v[6], v[7]));
            /* g0: blocks 0..3's low-lane sums | their high-lane sums */
            __m256i v8 = _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                                          _mm256_permute2x128_si256(g0, g1, 0x31));
            _mm256_storeu_si256((__m256i *)&sx[t][j], v8);
        }
        for (; j < nb; j++) {
            __m256i v = quad_sums(x + (size_t)j * KN_QK);
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            sx[t][j] = _mm_cvtsi128_si32(h);
        }
    }
}

KN_AI __m256i bcast32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* acc[u * KN_QP_RS + 8 h + i] (u < TT tokens, h < NG row groups, i < 8
 * rows; in memory between column panels) += blocks [0, nb) of panel P,
 * the blocks b0 .. of the activations of tokens xq, xq + xstride, ...
 * (scales xd, xd + nbrow, ...; int4: block sums sx[u][j]): kn_qdot.h's
 * block sums, one float chain per lane.  Per (8 rows, token, block) int4
 * takes 8 maddubs of the unsigned codes against the token's 4 activation
 * bytes broadcast, summed as int16 (|8 x 2 x 15 x 128| < 2^15), one madd
 * to int32, one madd for -zero x (block sum) -- i_b exact for every code,
 * -128 too --, then convert, multiply s_b = scale x d, fma; Q8 16 madd of
 * int16 pairs summed as int32, convert, fma.  A broadcast serves NG row
 * groups. */
KN_AI void qmicro(const kn_qpanel *P, const uint8_t *xq, size_t xstride,
                  const float *xd, uint32_t nbrow, const int32_t (*sx)[KN_QP_BLK4],
                  uint32_t b0, uint32_t nb, float *acc, int q8, int NG, int TT)
{
    const size_t qb = q8 ? 2 * KN_QK : KN_QK;
    const int nk = q8 ? 16 : 8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[KN_QP_NG][KN_QP_TT];
    const uint8_t *xr[KN_QP_TT];
    const float *dr[KN_QP_TT];
#pragma GCC unroll 8
    for (int u = 0; u < TT; u++) {
        xr[u] = xq + (size_t)u * xstride + (size_t)b0 * qb;
        dr[u] = xd + (size_t)u * nbrow + b0;
#pragma GCC unroll 2
        for (int h = 0; h < NG; h++)
            a[h][u] = _mm256_load_ps(acc + (size_t)u * KN_QP_RS + (size_t)h * KN_QP_RG);
    }
    for (uint32_t j = 0; j < nb; j++) {
        const uint8_t *wj = P->w + (size_t)j * KN_QP_NG * (size_t)nk * 32;
        __m256i p[KN_QP_NG][KN_QP_TT];
#pragma GCC unroll 16
        for (int k = 0; k < nk; k++) {
            __m256i w[KN_QP_NG];
#pragma GCC unroll 2
            for (int h = 0; h < NG; h++)
                w[h] = _mm256_load_si256((const __m256i *)(wj + ((size_t)h * nk + k) * 32));
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++) {
                __m256i x = bcast32(xr[u] + (size_t)j * qb + 4 * k);
#pragma GCC unroll 2
                for (int h = 0; h < NG; h++) {
                    if (q8) {
                        __m256i m = _mm256_madd_epi16(w[h], x);
                        p[h][u] = k ? _mm256_add_epi32(p[h][u], m) : m;
                    } else {
                        __m256i m = _mm256_maddubs_epi16(w[h], x);
                        p[h][u] = k ? _mm256_add_epi16(p[h][u], m) : m;
                    }
                    /* keep the chain: GCC's reassociation would make it a
                     * tree with every product alive, and spill them */
                    __asm__("" : "+x"(p[h][u]));
                }
            }
        }
        if (q8) {
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++) {
                const __m256 d = _mm256_broadcast_ss(dr[u] + j);
#pragma GCC unroll 2
                for (int h = 0; h < NG; h++)
                    a[h][u] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[h][u]), d, a[h][u]);
            }
            continue;
        }
#pragma GCC unroll 8
        for (int u = 0; u < TT; u++) {
            const __m256 d = _mm256_broadcast_ss(dr[u] + j);
            const __m256i sxu = _mm256_set1_epi32(sx[u][j]);
#pragma GCC unroll 2
            for (int h = 0; h < NG; h++) {
                const __m256 s = _mm256_load_ps(P->s[j] + h * KN_QP_RG);
                const __m256i nz = _mm256_load_si256((const __m256i *)(P->nz[j] + h * KN_QP_RG));
                __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(p[h][u], ones),
                                                               _mm256_madd_epi16(nz, sxu)));
                a[h][u] = _mm256_fmadd_ps(f, _mm256_mul_ps(s, d), a[h][u]);
            }
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < TT; u++)
#pragma GCC unroll 2
        for (int h = 0; h < NG; h++)
            _mm256_store_ps(acc + (size_t)u * KN_QP_RS + (size_t)h * KN_QP_RG, a[h][u]);
}

static void qmicro_any(const kn_qpanel *P, const uint8_t *xq, size_t xstride,
                       const float *xd, uint32_t nbrow,
                       const int32_t (*sx)[KN_QP_BLK4], uint32_t b0,
                       uint32_t nb, float *acc, int q8, int NG, int TT)
{
#define KN_QM(f, g, t)                                                         \
    case (f) * 32 + (g) * 8 + (t):                                             \
        qmicro(P, xq, xstride, xd, nbrow, sx, b0, nb, acc, f, g, t);           \
        break;
    switch (q8 * 32 + NG * 8 + TT) {
        KN_QM(0, 1, 1) KN_QM(0, 1, 2) KN_QM(0, 1, 3)
        KN_QM(0, 2, 1) KN_QM(0, 2, 2) KN_QM(0, 2, 3)
        KN_QM(1, 1, 1) KN_QM(1, 1, 2) KN_QM(1, 1, 3)
        KN_QM(1, 2, 1) KN_QM(1, 2, 2) KN_QM(1, 2, 3)
    default: break;
    }
#undef KN_QM
}

/* Token panels of KN_QP_TP outermost; in each, rows in groups of
 * KN_QP_RS whose float accumulators (16 KiB) wait in memory while the
 * column panels go by in block order (the chain's order); per column
 * panel the int4 block sums of the panel's tokens once (shared by up to
 * 64 rows), then per 16 rows the weights transposed into P and every
 * token tile against them. */
void kn_gemm_q_rows(const kn_matrix *W, const void *xqv, const float *xd,
                    size_t T, float *Y, uint32_t r0, uint32_t r1)
{
    kn_qpanel P;
    _Alignas(32) float acc[KN_QP_TP * KN_QP_RS];
    _Alignas(32) int32_t sx[KN_QP_TP][KN_QP_BLK4];
    const uint8_t *xq = xqv;
    const int q8 = W->fmt == KN_W_Q8;
    const uint32_t nbrow = kn_qact_blocks(W->cols), blk = q8 ? KN_QP_BLK8 : KN_QP_BLK4;
    const size_t xstride = (size_t)nbrow * (q8 ? 2 * KN_QK : KN_QK);
    const size_t tt = KN_QP_TT;
    for (size_t t0 = 0; t0 < T; t0 += KN_QP_TP) {
        const size_t tn = T - t0 < KN_QP_TP ? T - t0 : KN_QP_TP;
        const uint8_t *xt = xq + t0 * xstride;
        const float *dt = xd + t0 * nbrow;
        for (uint32_t rs = r0; rs < r1; rs += KN_QP_RS) {
            const int RS = r1 - rs < KN_QP_RS ? (int)(r1 - rs) : KN_QP_RS;
            memset(acc, 0, sizeof acc);
            /* the Y lines written at the end, a cache miss each otherwise */
            for (size_t t = 0; t < tn; t++)
                for (int i = 0; i < RS; i += 16)
                    _mm_prefetch((const char *)(Y + (t0 + t) * W->rows + rs + (uint32_t)i),
                                 _MM_HINT_T1);
            for (uint32_t b0 = 0; b0 < nbrow; b0 += blk) {
                const uint32_t nb = nbrow - b0 < blk ? nbrow - b0 : blk;
                if (!q8)
                    qsums(xt, xstride, b0, nb, tn, sx);
                const int pr_rows = KN_QP_NG * KN_QP_RG;
                for (int g = 0; g < RS; g += pr_rows) {
                    const int R = RS - g < pr_rows ? RS - g : pr_rows;
                    const int NG = (R + KN_QP_RG - 1) / KN_QP_RG;
                    for (int h = 0; h < NG; h++) {
                        int Rh = R - h * KN_QP_RG;
                        qpanel_fill(&P, W, rs + (uint32_t)(g + h * KN_QP_RG),
                                    Rh < KN_QP_RG ? Rh : KN_QP_RG, h, b0, nb);
                    }
                    /* the next panel's weights: the next rows, else the
                     * next column panel, else the next row group */
                    uint32_t pr = rs + (uint32_t)(g + pr_rows), pb = b0, pe = rs + (uint32_t)RS;
                    if (g + pr_rows >= RS) {
                        pr = rs, pb = b0 + nb;
                        if (pb >= nbrow)
                            pr = pe, pb = 0, pe = r1;
                    }
                    const uint32_t pn = nbrow - pb < blk ? nbrow - pb : blk;
                    kn_wpf pf = wpf_make(W, pr, pr < pe ? (int)(pe - pr < (uint32_t)pr_rows ? pe - pr : (uint32_t)pr_rows) : 0,
                                         pb * KN_QK, pn * KN_QK);
                    const uint32_t per = pf.total / (uint32_t)((tn + tt - 1) / tt) + 1;
                    for (size_t t = 0; t < tn; t += tt) {
                        const int TT = tn - t < tt ? (int)(tn - t) : (int)tt;
                        wpf_some(&pf, per);
                        qmicro_any(&P, xt + t * xstride, xstride, dt + t * nbrow, nbrow,
                                   sx + t, b0, nb, acc + t * KN_QP_RS + (size_t)g, q8, NG, TT);
                    }
                }
            }
            kn_qgemm_store(W, Y, rs, RS, t0, tn, acc, KN_QP_RS);
        }
    }
}

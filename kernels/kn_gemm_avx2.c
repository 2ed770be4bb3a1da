/*
 * kn_gemm_avx2.c - the prefill GEMMs of kn_gemm.h (compiled with -mavx2
 * -mfma -mf16c; called only when kn_cpu_has_avx2()).
 *
 * Both keep the decode kernels' per-element summation order (kn_gemm.h)
 * and change only which (row, token) pairs are computed while which data
 * is in which cache.  Register tiles are R rows x TT tokens of independent
 * 8-lane accumulators; the always_inline helpers are instantiated per
 * (format, R, TT) through the switches, so the compiler unrolls every tile.
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

#define KN_QP_ROWS 4   /* weight rows unpacked at once */
#define KN_QP_BLK 64   /* 32-column blocks unpacked at once */
#define KN_QP_TP 64    /* tokens per panel */
#define KN_QP_TMAX 3   /* widest register tile: tokens (qmicro says which) */
#define KN_QP_TB8 2    /* register tile, Q8: tokens */
#define KN_QP_TB4 3    /* register tile, Q4/Q4S: tokens */

/* 4 rows x 64 blocks of unpacked weights: Q4/Q4S |w| and w as signed
 * bytes (64 bytes a block), Q8 the bytes widened to int16 (64 bytes); the
 * blocks' f16 scales as floats (Q4/Q4S).  16.5 KiB: stays in L1 while the
 * token tiles go by. */
typedef struct kn_qpanel {
    _Alignas(64) uint8_t w[KN_QP_ROWS][KN_QP_BLK][64];
    float s[KN_QP_ROWS][KN_QP_BLK];
} kn_qpanel;

/* Unpack rows r .. r+R-1, full blocks [b0, b0 + nb) into P. */
KN_AI void qpanel_fill(kn_qpanel *P, const kn_matrix *W, uint32_t r, int R,
                       uint32_t b0, uint32_t nb, int fmt)
{
    const uint32_t cols = W->cols;
    const int gsh = fmt == KN_W_Q8 ? 0 : __builtin_ctz(W->group) - 5;
    const uint32_t ng = fmt == KN_W_Q8 ? 0 : kn_q4_ngroups(cols, W->group);
    const size_t rbytes = fmt == KN_W_Q8 ? cols : kn_q4_row_bytes(cols);
    for (int i = 0; i < R; i++) {
        const uint8_t *row = (const uint8_t *)W->data + (size_t)(r + (uint32_t)i) * rbytes;
        for (uint32_t j = 0; j < nb; j++) {
            uint32_t b = b0 + j;
            __m256i *o = (__m256i *)P->w[i][j];
            if (fmt == KN_W_Q8) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(row + (size_t)b * 32));
                _mm256_store_si256(o, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)));
                _mm256_store_si256(o + 1, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)));
                continue;
            }
            size_t gi = (size_t)(r + (uint32_t)i) * ng + (b >> gsh);
            int z = fmt == KN_W_Q4 ? W->zeros[gi] : KN_Q4_ZERO_SYM;
            __m256i w = _mm256_sub_epi8(kn_avx2_q4_codes(row + (size_t)b * 16),
                                        _mm256_set1_epi8((char)z));
            _mm256_store_si256(o, _mm256_abs_epi8(w));
            _mm256_store_si256(o + 1, w);
            P->s[i][j] = _cvtsh_ss(((const uint16_t *)W->scales)[gi]);
        }
    }
}

/* acc[i][t] (8 floats each, in memory between calls) += blocks [0, nb)
 * of panel P against tokens t0 .. t0+TT-1 at blocks b0 ..: kn_qdot.h's
 * canonical arithmetic, block after block.
 *
 * What bounds it (measured on Zen 3, the machine class of
 * docs/benchmarks.md): the FMA, the float multiply, maddubs, madd, and
 * for the most part sign and the broadcasts, all share the two FMA pipes,
 * while the int32 add and the int->float convert go elsewhere.  Per block,
 * row and token Q8 needs madd + madd + fma (the token's broadcast shared
 * by the rows) and Q4 sign + maddubs + madd + mul (s_b = scale * d) + fma:
 * ~5 pipe ops per 32 multiply-adds against 4 for float FMA (8 a pipe op),
 * so int4 runs near the float GEMM's rate and no faster.  (Taking the
 * scale product out of the loop -- a table of s_b, broadcast from L1 --
 * measured the same: the broadcast costs what the multiply did.)  The tile
 * is KN_QP_ROWS rows x TT tokens, TT <= KN_QP_TB8 = 2 for Q8 (4 x 3 needs
 * 12 accumulators + 6 inputs + 3 scales and spilled; 4 x 2 measured
 * 1.05-1.27x faster at -O2 and -O3) and KN_QP_TB4 = 3 for Q4 (4 x 2 was
 * as fast at -O2 but 0.90-0.94x at -O3, which the Release build uses).
 */
KN_AI void qmicro(const kn_qpanel *P, const uint8_t *xq, const float *xd,
                  size_t xstride, uint32_t nbrow, uint32_t b0, uint32_t nb,
                  float *acc, size_t t0, int fmt, int R, int TT)
{
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 a[KN_QP_ROWS][KN_QP_TMAX];
    const uint8_t *xr[KN_QP_TMAX];
    const float *dr[KN_QP_TMAX];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        xr[t] = xq + (t0 + (size_t)t) * xstride + (size_t)b0 * qb;
        dr[t] = xd + (t0 + (size_t)t) * nbrow + b0;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a[i][t] = _mm256_load_ps(acc + ((size_t)i * KN_QP_TP + t0 + (size_t)t) * 8);
    }
    for (uint32_t j = 0; j < nb; j++) {
        __m256i xv[KN_QP_TMAX], xv2[KN_QP_TMAX];
        __m256 vd[KN_QP_TMAX];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m256i *xp = (const __m256i *)(xr[t] + (size_t)j * qb);
            xv[t] = _mm256_loadu_si256(xp);
            if (fmt == KN_W_Q8)
                xv2[t] = _mm256_loadu_si256(xp + 1);
            vd[t] = _mm256_broadcast_ss(dr[t] + j);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const __m256i *wp = (const __m256i *)P->w[i][j];
            if (fmt == KN_W_Q8) {
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    __m256i p = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_load_si256(wp), xv[t]),
                        _mm256_madd_epi16(_mm256_load_si256(wp + 1), xv2[t]));
                    a[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), vd[t], a[i][t]);
                }
                continue;
            }
            __m256i aw = _mm256_load_si256(wp), w = _mm256_load_si256(wp + 1);
            __m256 ws = _mm256_broadcast_ss(&P->s[i][j]);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                __m256i p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], w)), ones);
                a[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                          _mm256_mul_ps(ws, vd[t]), a[i][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            _mm256_store_ps(acc + ((size_t)i * KN_QP_TP + t0 + (size_t)t) * 8, a[i][t]);
}

static void qmicro_any(const kn_qpanel *P, const uint8_t *xq, const float *xd,
                       size_t xstride, uint32_t nbrow, uint32_t b0, uint32_t nb,
                       float *acc, size_t t0, int fmt, int R, int TT)
{
#define KN_QM(f, r, t)                                                         \
    case (f) * 64 + (r) * 4 + (t):                                             \
        qmicro(P, xq, xd, xstride, nbrow, b0, nb, acc, t0, f, r, t);           \
        break;
#define KN_QF(f)                                                               \
    KN_QM(f, 1, 1) KN_QM(f, 1, 2) KN_QM(f, 2, 1) KN_QM(f, 2, 2)                \
    KN_QM(f, 3, 1) KN_QM(f, 3, 2) KN_QM(f, 4, 1) KN_QM(f, 4, 2)                \
    KN_QM(f, 1, 3) KN_QM(f, 2, 3) KN_QM(f, 3, 3) KN_QM(f, 4, 3)
    switch (fmt * 64 + R * 4 + TT) {
        KN_QF(KN_W_Q8) KN_QF(KN_W_Q4) KN_QF(KN_W_Q4S)
    default: break;
    }
#undef KN_QF
#undef KN_QM
}

/* Rows r .. r+R-1 x tokens [t0, t1) (t1 - t0 <= KN_QP_TP); rows up to
 * r1 follow (their first weights are prefetched). */
static void qrows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                  float *Y, uint32_t r, int R, uint32_t r1, size_t t0,
                  size_t t1, kn_qpanel *P, float *acc)
{
    const int fmt = W->fmt;
    const uint32_t nbrow = kn_qact_blocks(W->cols), nfull = W->cols / KN_QK;
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xstride = (size_t)nbrow * qb;
    const size_t tn = t1 - t0;
    const size_t tb = fmt == KN_W_Q8 ? KN_QP_TB8 : KN_QP_TB4;
    memset(acc, 0, (size_t)KN_QP_ROWS * KN_QP_TP * 8 * sizeof(float));
    /* The Y lines written at the end, one per token and rows x 4 bytes
     * apart (a cache miss each otherwise): into L2 now, long before. */
    for (size_t t = 0; t < tn; t++)
        _mm_prefetch((const char *)(Y + (t0 + t) * W->rows + r), _MM_HINT_T1);
    for (uint32_t b0 = 0; b0 < nfull; b0 += KN_QP_BLK) {
        uint32_t nb = nfull - b0 < KN_QP_BLK ? nfull - b0 : KN_QP_BLK;
        switch (fmt) {
        case KN_W_Q8: qpanel_fill(P, W, r, R, b0, nb, KN_W_Q8); break;
        case KN_W_Q4: qpanel_fill(P, W, r, R, b0, nb, KN_W_Q4); break;
        default: qpanel_fill(P, W, r, R, b0, nb, KN_W_Q4S); break;
        }
        /* the next panel's weights: the rest of these rows, or the
         * next rows' first blocks */
        uint32_t bn = b0 + nb, rn = r + (uint32_t)R;
        kn_wpf pf = bn < nfull
                        ? wpf_make(W, r, R, bn * KN_QK, KN_QK * (nfull - bn < KN_QP_BLK ? nfull - bn : KN_QP_BLK))
                        : wpf_make(W, rn, rn < r1 ? (int)(r1 - rn < KN_QP_ROWS ? r1 - rn : KN_QP_ROWS) : 0,
                                   0, KN_QK * (nfull < KN_QP_BLK ? nfull : KN_QP_BLK));
        uint32_t per = pf.total / (uint32_t)((tn + tb - 1) / tb) + 1;
        for (size_t t = 0; t < tn; t += tb) {
            int TT = tn - t < tb ? (int)(tn - t) : (int)tb;
            wpf_some(&pf, per);
            qmicro_any(P, xq + t0 * xstride, xd + t0 * nbrow, xstride, nbrow,
                       b0, nb, acc, t, fmt, R, TT);
        }
    }
    kn_qgemm_finish(W, xq, xd, Y, r, R, t0, tn, acc, KN_QP_TP);
}

void kn_gemm_q_rows(const kn_matrix *W, const void *xq, const float *xd,
                    size_t T, float *Y, uint32_t r0, uint32_t r1)
{
    kn_qpanel P;
    _Alignas(64) float acc[KN_QP_ROWS * KN_QP_TP * 8];
    for (size_t t0 = 0; t0 < T; t0 += KN_QP_TP) {
        size_t t1 = T - t0 < KN_QP_TP ? T : t0 + KN_QP_TP;
        for (uint32_t r = r0; r < r1; r += KN_QP_ROWS) {
            int R = r1 - r < KN_QP_ROWS ? (int)(r1 - r) : KN_QP_ROWS;
            qrows(W, xq, xd, Y, r, R, r1, t0, t1, &P, acc);
        }
    }
}

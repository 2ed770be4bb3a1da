/*
 * kn_gemm_avx512.c - the float prefill GEMM of kn_gemm.h with AVX-512
 * (compiled with -mavx512f/bw/dq/vl/vnni as well; kn_ops.c calls it only
 * when kn_cpu_has_avx512()).
 *
 * THE invariant (kn_gemm.h): an output element has the bits the decode
 * kernels and kn_gemm_avx2.c give it -- per KN_KC-column block one 8-lane
 * FMA chain over the block's columns in order, kn_hsum256's tree, the
 * scalar tail, added to Y.  A 16-lane chain would sum in another order,
 * so a zmm here holds TWO independent 8-lane chains: rows i and i+1 of
 * one token, in its low and high 256-bit halves.  The dequantized panel
 * is stored row-pair-interleaved so that one 64-byte load gives
 * w[i][k..k+8) and w[i+1][k..k+8), and x[t][k..k+8) is broadcast to both
 * halves (vbroadcastf32x8): lane j of each half then does exactly the
 * AVX2 kernel's fma(w[k+j], x[k+j], acc), column block after column
 * block.  kn_hsum8_512 (kn_avx512.h) reduces 8 such chains with
 * kn_hsum256's additions (same
 * operands, same tree; only commuted), and the scalar tail is the same C.
 *
 * Why that keeps the bits: the FMAs, the reduction's additions and the
 * tail are the AVX2 kernel's, operand for operand (float addition
 * commutes, so the reduction may pair the operands in other registers);
 * the panel holds the values kn_avx2_dequant_block gives (F16/BF16/F32
 * are converted straight from W by the same exact conversions, the other
 * formats go through kn_avx2_dequant_block itself); the scalar tail is
 * the same C, compiled without contraction (-std=c11).  test_prefill
 * compares this kernel with the AVX2 one bit for bit (every format,
 * ragged rows, columns and tokens, 1 and 2 threads).
 *
 * What changes is the register tile: 32 zmm registers hold 4 row pairs
 * x KN_G5_TB tokens of accumulators (8 rows x 6 tokens = 48 chains in 24
 * registers, against 4 x 3 = 12 chains in the AVX2 kernel), so a column
 * step costs 4 weight loads + 6 broadcasts per 24 FMAs (AVX2: 4 + 3 per
 * 12), and the reduction runs 8 rows at once (14 instructions for 8 sums,
 * hsum4 in the AVX2 file takes 14 for 4).  Zen 4 runs a zmm FMA as two
 * ymm halves, so the FLOP rate per instruction is the same; the gain is
 * in loads, reductions and loop overhead per FMA.
 *
 * Measured (bench_gemm --threads 1 --cpu --no-slices, this Zen 4 VM,
 * interleaved with MC_NO_AVX512=1, docs/benchmarks.md i7_gemm512) at the
 * SmolLM-135M and TinyLlama-1.1B shapes, f16 and f32 alike: best round
 * against best round 1.03-1.14x at T = 512, 0.99-1.08x at T = 128 (the
 * AVX2 kernel was already at 76-91 % of the core's FMA peak, this one
 * reaches 86-93 %); medians 1.15-1.41x at T = 512, because the AVX2
 * kernel's figure drops more when the shared machine is loaded.
 * Tile and panels were chosen by A/B (f16, load 7-9): 4 x 5 ran as 4 x 6;
 * 2 x 8, and 3 x 7 (with the per-element reduction), 10-15 % slower;
 * 8-32-row x 64-512-token panels within noise of each other.  What the
 * rest costs could not be counted (this VM exposes no hardware counters to
 * perf); the per-block reductions are ~5 % of the instructions.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx512.h"
#include "kn_avx2.h"
#include "kn_gemm.h"
#include "kn_gemm_pf.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

#define KN_G5_PB 4   /* register tile: row pairs (8 rows) */
#define KN_G5_TB 6   /* register tile: tokens */
#define KN_G5_RP 8   /* rows dequantized at once: one register tile, 16.3 KiB (L1) */
#define KN_G5_TP 256 /* tokens per panel: 256 x KN_KC floats of X, 512 KiB (L2) */
/* Floats per row pair of the panel: two rows of KN_KC columns, plus a
 * cache line so that the pairs do not all fall in the same L1 sets.
 * Element (2p + h, k) lies at p * KN_G5_LDP + (k / 8) * 16 + h * 8 + k % 8. */
#define KN_G5_LDP (2 * KN_KC + 16)

/* Y[t][i] += dot(w[i][0..n), X[t][0..n)) for i < R (R <= 2P: the panel's
 * rows from wi on, a phantom zero row making up an odd R), t < TT. */
KN_AI void micro(const float *wi, const float *X, size_t ldx, uint32_t n,
                 float *Y, size_t ldy, int R, int P, int TT)
{
    __m512 acc[KN_G5_PB][KN_G5_TB];
#pragma GCC unroll 16
    for (int p = 0; p < P; p++)
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++)
            acc[p][t] = _mm512_setzero_ps();
    uint32_t nmain = n & ~7u;
    for (uint32_t k = 0; k < nmain; k += 8) {
        __m512 x[KN_G5_TB];
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++)
            x[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(X + (size_t)t * ldx + k));
#pragma GCC unroll 16
        for (int p = 0; p < P; p++) {
            __m512 w = _mm512_load_ps(wi + (size_t)p * KN_G5_LDP + 2 * (size_t)k);
#pragma GCC unroll 16
            for (int t = 0; t < TT; t++)
                acc[p][t] = _mm512_fmadd_ps(w, x[t], acc[p][t]);
        }
    }
    if (P == 4 && R == 8 && nmain == n) { /* a full tile: 8 rows' sums at once */
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++) {
            float *y = Y + (size_t)t * ldy;
            _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y),
                                              kn_hsum8_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t])));
        }
        return;
    }
    /* Ragged tiles: the chains through memory (exact), one element at a
     * time -- rare, so kept small rather than unrolled. */
    _Alignas(64) float a[KN_G5_PB][KN_G5_TB][16];
#pragma GCC unroll 16
    for (int p = 0; p < P; p++)
#pragma GCC unroll 16
        for (int t = 0; t < TT; t++)
            _mm512_store_ps(a[p][t], acc[p][t]);
    const float *tail = wi + (size_t)(nmain / 8) * 16;
#pragma GCC unroll 1
    for (int i = 0; i < R; i++)
#pragma GCC unroll 1
        for (int t = 0; t < TT; t++) {
            float s = kn_hsum256(_mm256_load_ps(a[i / 2][t] + (i & 1) * 8));
            const float *w = tail + (size_t)(i / 2) * KN_G5_LDP + (size_t)(i & 1) * 8;
#pragma GCC unroll 1
            for (uint32_t k = nmain; k < n; k++)
                s += w[k - nmain] * X[(size_t)t * ldx + k];
            Y[(size_t)t * ldy + (size_t)i] += s;
        }
}

_Static_assert(KN_G5_PB == 4 && KN_G5_TB == 6, "micro_any's cases and kn_hsum8_512 assume 4 x 6");

static void micro_any(const float *wi, const float *X, size_t ldx, uint32_t n,
                      float *Y, size_t ldy, int R, int TT)
{
#define KN_MC(p, t)                                                            \
    case (p) * 8 + (t): micro(wi, X, ldx, n, Y, ldy, R, p, t); break;
    switch ((R + 1) / 2 * 8 + TT) {
        KN_MC(1, 1) KN_MC(1, 2) KN_MC(1, 3) KN_MC(1, 4) KN_MC(1, 5) KN_MC(1, 6)
        KN_MC(2, 1) KN_MC(2, 2) KN_MC(2, 3) KN_MC(2, 4) KN_MC(2, 5) KN_MC(2, 6)
        KN_MC(3, 1) KN_MC(3, 2) KN_MC(3, 3) KN_MC(3, 4) KN_MC(3, 5) KN_MC(3, 6)
        KN_MC(4, 1) KN_MC(4, 2) KN_MC(4, 3) KN_MC(4, 4) KN_MC(4, 5)
        default: micro(wi, X, ldx, n, Y, ldy, R, 4, 6); break;
    }
#undef KN_MC
}

/* Columns [c, c + 8) of rows a (low half) and b (high half) of an F16 or
 * BF16 matrix as one vector: exact conversions, the values deq8 in
 * kn_ops_avx2.c gives (and kn_w_at). */
KN_AI __m512 pair8(const kn_matrix *W, uint32_t a, uint32_t b, uint32_t c, int fmt)
{
    size_t cols = W->cols;
    const uint16_t *d = W->data;
    __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(d + a * cols + c))),
        _mm_loadu_si128((const __m128i *)(d + b * cols + c)), 1);
    if (fmt == KN_W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The whole 8-column chunks of rows r .. r+R-1 (R even) of a float matrix
 * into the panel, straight from W: two rows a vector. */
KN_AI void fill_pairs(const kn_matrix *W, uint32_t r, int R, uint32_t c0,
                      uint32_t nfull, float *wi, int fmt)
{
    for (int i = 0; i < R; i += 2) {
        float *o = wi + (size_t)(i / 2) * KN_G5_LDP;
        uint32_t a = r + (uint32_t)i;
        if (fmt == KN_W_F32) { /* two 32-byte copies: no insert */
            const float *da = (const float *)W->data + (size_t)a * W->cols + c0;
            const float *db = da + W->cols;
            for (uint32_t c = 0; c < nfull; c++) {
                _mm256_store_ps(o + (size_t)c * 16, _mm256_loadu_ps(da + 8 * c));
                _mm256_store_ps(o + (size_t)c * 16 + 8, _mm256_loadu_ps(db + 8 * c));
            }
            continue;
        }
        for (uint32_t c = 0; c < nfull; c++)
            _mm512_store_ps(o + (size_t)c * 16, pair8(W, a, a + 1, c0 + 8 * c, fmt));
    }
}

/* Rows r .. r+R-1, columns [c0, c0 + n) of W into the row-pair panel wi
 * (tmp: KN_KC floats, 64-byte aligned); an odd R's last pair gets a zero
 * high half (its sums are computed and dropped). */
static void panel_fill(const kn_matrix *W, uint32_t r, int R, uint32_t c0,
                       uint32_t n, float *wi, float *tmp)
{
    const uint32_t nfull = n / 8, nch = (n + 7) / 8;
    int i = 0;
    if (n == nfull * 8) { /* float formats, whole chunks: no buffer */
        int even = R & ~1;
        switch (W->fmt) {
        case KN_W_F32: fill_pairs(W, r, even, c0, nfull, wi, KN_W_F32); i = even; break;
        case KN_W_F16: fill_pairs(W, r, even, c0, nfull, wi, KN_W_F16); i = even; break;
        case KN_W_BF16: fill_pairs(W, r, even, c0, nfull, wi, KN_W_BF16); i = even; break;
        default: break;
        }
    }
    for (; i < R; i++) {
        kn_avx2_dequant_block(W, r + (uint32_t)i, c0, n, tmp);
        float *o = wi + (size_t)(i / 2) * KN_G5_LDP + (size_t)(i & 1) * 8;
        for (uint32_t c = 0; c < nfull; c++)
            _mm256_store_ps(o + (size_t)c * 16, _mm256_load_ps(tmp + (size_t)c * 8));
        for (uint32_t k = nfull * 8; k < n; k++)
            o[(size_t)nfull * 16 + (k - nfull * 8)] = tmp[k];
    }
    if (R & 1) {
        float *o = wi + (size_t)(R / 2) * KN_G5_LDP + 8;
        for (uint32_t c = 0; c < nch; c++)
            _mm256_store_ps(o + (size_t)c * 16, _mm256_setzero_ps());
    }
}

/* One panel wi (R <= KN_G5_RP rows of n columns) times tokens [t0, t1):
 * KN_G5_TB-token tiles, each used for every 8-row tile of the panel while
 * it is in L1; the next tile's Y lines and a few lines of the next weight
 * panel prefetched (kn_gemm_avx2.c's panel says why). */
static void panel(const float *wi, int R, const float *X, size_t ldx,
                  uint32_t n, float *Y, size_t ldy, size_t t0, size_t t1,
                  kn_wpf *pf)
{
    size_t t = t0;
    const uint32_t per = pf->total / (uint32_t)((t1 - t0) / KN_G5_TB + 1) + 1;
    for (; t + KN_G5_TB <= t1; t += KN_G5_TB) {
        for (size_t j = t + KN_G5_TB; j < t + 2 * KN_G5_TB && j < t1; j++) {
            _mm_prefetch((const char *)(Y + j * ldy), _MM_HINT_T0);
            _mm_prefetch((const char *)(Y + j * ldy + (size_t)R - 1), _MM_HINT_T0);
        }
        wpf_some(pf, per);
        for (int i = 0; i < R; i += 2 * KN_G5_PB) {
            const float *w = wi + (size_t)(i / 2) * KN_G5_LDP;
            const float *x = X + t * ldx;
            float *y = Y + t * ldy + (size_t)i;
            if (R - i >= 2 * KN_G5_PB)
                micro(w, x, ldx, n, y, ldy, 2 * KN_G5_PB, KN_G5_PB, KN_G5_TB);
            else
                micro_any(w, x, ldx, n, y, ldy, R - i, KN_G5_TB);
        }
    }
    if (t < t1)
        for (int i = 0; i < R; i += 2 * KN_G5_PB)
            micro_any(wi + (size_t)(i / 2) * KN_G5_LDP, X + t * ldx, ldx, n,
                      Y + t * ldy + (size_t)i, ldy,
                      R - i < 2 * KN_G5_PB ? R - i : 2 * KN_G5_PB, (int)(t1 - t));
    wpf_some(pf, UINT32_MAX);
}

void kn_gemm_rows_avx512(const kn_matrix *W, const float *X, size_t T,
                         float *Y, uint32_t r0, uint32_t r1)
{
    _Alignas(64) float wi[KN_G5_RP / 2 * KN_G5_LDP];
    _Alignas(64) float tmp[KN_KC];
    const uint32_t cols = W->cols, rows = W->rows;
    /* Column blocks outermost: each element receives its KN_KC-block sums
     * in column order, as the decode kernels add them. */
    for (uint32_t c0 = 0; c0 < cols; c0 += KN_KC) {
        uint32_t n = cols - c0 < KN_KC ? cols - c0 : KN_KC;
        for (size_t t0 = 0; t0 < T; t0 += KN_G5_TP) {
            size_t t1 = T - t0 < KN_G5_TP ? T : t0 + KN_G5_TP;
            for (uint32_t r = r0; r < r1; r += KN_G5_RP) {
                int R = r1 - r < KN_G5_RP ? (int)(r1 - r) : KN_G5_RP;
                panel_fill(W, r, R, c0, n, wi, tmp);
                uint32_t rn = r + (uint32_t)R;
                kn_wpf pf = wpf_make(W, rn, rn < r1 ? (int)(r1 - rn < KN_G5_RP ? r1 - rn : KN_G5_RP) : 0, c0, n);
                panel(wi, R, X + c0, cols, n, Y + r, rows, t0, t1, &pf);
            }
        }
    }
}

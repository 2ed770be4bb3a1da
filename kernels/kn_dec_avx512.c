/*
 * kn_dec_avx512.c - the 2-8-token float decode of kn_avx2_matmul_rows with
 * AVX-512 (compiled with -mavx512f/bw/dq/vl/vnni as well; kn_ops.c calls it
 * only when kn_cpu_has_avx512(), for F32, F16, BF16 and Q8 weights and
 * 2 <= T <= KN_GEMM_MIN_T; T = 1 and int4 stay on the AVX2 kernel).
 *
 * THE invariant (kn_ops_avx2.c, canon_blk; kn_gemm.h): an output element
 * has the bits canon_blk gives it -- per KN_KC-column block one 8-lane FMA
 * chain over the block's whole 8-column groups in order, kn_hsum256's
 * tree, the scalar tail (kn_dequant_span values, scalar C), added to Y in
 * block order.  As in kn_gemm_avx512.c a zmm holds TWO independent 8-lane
 * chains, rows i and i+1 of one token in its low and high halves: the
 * weights w[i][k..k+8) and w[i+1][k..k+8) are converted into one zmm, and
 * x[t][k..k+8) is broadcast to both halves (vbroadcastf32x8), so lane j of
 * each half does exactly canon_blk's fma(w[k+j], x[k+j], acc).  kn_hsum8_512
 * reduces 8 chains with kn_hsum256's additions (same operands, same tree,
 * only commuted); the chains of a token group smaller than 4 are reduced
 * by kn_hsum256 itself.
 *
 * Why the weights are the same values: F16 (vcvtph2ps), BF16 (<< 16) and
 * F32 are exact conversions, as deq8's; Q8 is (float)q times the row
 * scale, the one rounding deq8 does (the multiplication commutes).  The
 * 8-column groups past the last 32 (which canon_blk takes from
 * kn_dequant_span) get the same values, because kn_dequant_span gives
 * kn_w_at's values, which equal deq8's (kn_ops_avx2.c's header).
 * test_prefill compares this kernel with the AVX2 one bit for bit.
 *
 * What changes is the register tile: 3 row pairs (6 rows) x up to 8
 * tokens = 24 zmm accumulators (48 chains; canon_blk has 3 rows x 4
 * tokens = 12), so each converted weight vector feeds all T tokens (the
 * AVX2 kernel converts every weight again for each group of 4 tokens)
 * and each broadcast feeds 3 FMAs.  The column block stays the outer loop
 * (canon_fmt says why) and the L2 (T1) prefetch of the rows KN_D5_PF on
 * is canon_blk's (its comment says why Zen 4 needs it).
 *
 * Measured (bench_gemm --threads 1 --cpu --no-slices --fmt f16, GMAC per
 * CPU-second, 7 interleaved rounds against MC_NO_AVX512=1 in one binary,
 * medians, load average 4.5-5.5, docs/benchmarks.md i8_f16dec): TinyLlama
 * shapes 1.40-1.59x at T = 2 and 8 (q/o at T = 8: 36.1 vs 22.7 GMAC/s,
 * 64 % of the FMA peak), 1.13-1.54x at T = 4; SmolLM shapes 0.97-1.40x
 * (576-row matrices are small enough that the AVX2 kernel was not far
 * off).  f32 at T = 8, tiny shapes: 1.17-1.25x (5 rounds).  KN_D5_PF
 * 12 against canon_blk's 8 (5 rounds, load 2.7): gate/up and down 5-12 %
 * faster at T = 2, 4, 8, q/o 2048x2048 as fast at T = 8 but 13-29 % slower
 * at T = 2-4.  Not tried for lack of time: 2 row pairs (4 x 8) instead of
 * 3, T = 1.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx512.h"
#include "kn_avx2.h"
#include "kn_gemm.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

#define KN_D5_P 3   /* row pairs per register tile */
#define KN_D5_PF 12 /* prefetch distance in rows (two tiles on) */

int kn_dec_avx512_supported(const kn_matrix *W)
{
    return W->fmt == KN_W_F32 || W->fmt == KN_W_F16 || W->fmt == KN_W_BF16 ||
           W->fmt == KN_W_Q8;
}

/* Columns [c, c + 8) of rows a (low half) and b (high half) as one vector
 * of the values deq8 gives (Q8: times the rows' scales in qs). */
KN_AI __m512 pair8(const uint8_t *a, const uint8_t *b, uint32_t c, __m512 qs, int fmt)
{
    switch (fmt) {
    case KN_W_F32:
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)a + c)),
                                  _mm256_loadu_ps((const float *)b + c), 1);
    case KN_W_Q8: {
        __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(a + c)),
                                       _mm_loadl_epi64((const __m128i *)(b + c)));
        return _mm512_mul_ps(qs, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    default: { /* F16, BF16 */
        __m256i h = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)a + c))),
            _mm_loadu_si128((const __m128i *)((const uint16_t *)b + c)), 1);
        if (fmt == KN_W_F16)
            return _mm512_cvtph_ps(h);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    }
}

/* Column block [c0, c0 + KN_KC) of rows r .. r+R-1 (R <= 2P; an odd R's
 * last pair repeats its row in the high half, whose sums are dropped),
 * every token t < T: Y[t][row] += the block's sum, canon_blk's bits. */
KN_AI void blk(const kn_matrix *W, const float *X, float *Y, uint32_t r, int R,
               uint32_t c0, int fmt, int P, int T)
{
    const uint32_t cols = W->cols, rows = W->rows;
    const size_t esz = fmt == KN_W_F32 ? 4 : fmt == KN_W_Q8 ? 1 : 2;
    const size_t rowb = (size_t)cols * esz;
    const uint8_t *base = W->data;
    const float *sc = fmt == KN_W_Q8 ? W->scales : NULL;
    const uint8_t *pa[KN_D5_P], *pb[KN_D5_P];
    __m512 qs[KN_D5_P];
    #pragma GCC unroll 16
    for (int p = 0; p < P; p++) {
        uint32_t a = r + 2 * (uint32_t)p, b = 2 * p + 1 < R ? a + 1 : a;
        pa[p] = base + (size_t)a * rowb;
        pb[p] = base + (size_t)b * rowb;
        qs[p] = fmt == KN_W_Q8
            ? _mm512_insertf32x8(_mm512_set1_ps(sc[a]), _mm256_set1_ps(sc[b]), 1)
            : _mm512_setzero_ps();
    }
    const uint32_t n = cols - c0 < KN_KC ? cols - c0 : KN_KC;
    const uint32_t n32 = n & ~31u, n8 = n & ~7u;
    /* canon_blk's prefetch: the same columns KN_D5_PF rows on, one line
     * per 32 columns and row (two for f32), into L2. */
    const size_t pf = KN_D5_PF * rowb;
    __m512 acc[KN_D5_P][8];
    #pragma GCC unroll 16
    for (int p = 0; p < P; p++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            acc[p][t] = _mm512_setzero_ps();
    const float *Xc = X + c0;
    for (uint32_t k = 0; k < n32; k += 32) {
        #pragma GCC unroll 16
        for (int i = 0; i < R && i < 2 * KN_D5_P; i++) {
            const uint8_t *pr = base + (size_t)(r + (uint32_t)i) * rowb +
                                (size_t)(c0 + k) * esz + pf;
            _mm_prefetch((const char *)pr, _MM_HINT_T1);
            if (fmt == KN_W_F32)
                _mm_prefetch((const char *)pr + 64, _MM_HINT_T1);
        }
        #pragma GCC unroll 16
        for (int kk = 0; kk < 32; kk += 8) {
            __m512 w[KN_D5_P];
            #pragma GCC unroll 16
            for (int p = 0; p < P; p++)
                w[p] = pair8(pa[p], pb[p], c0 + k + (uint32_t)kk, qs[p], fmt);
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                __m512 x = _mm512_broadcast_f32x8(
                    _mm256_loadu_ps(Xc + (size_t)t * cols + k + (uint32_t)kk));
                #pragma GCC unroll 16
                for (int p = 0; p < P; p++)
                    acc[p][t] = _mm512_fmadd_ps(w[p], x, acc[p][t]);
            }
        }
    }
    for (uint32_t k = n32; k < n8; k += 8) { /* whole groups past the last 32 */
        __m512 w[KN_D5_P];
        #pragma GCC unroll 16
        for (int p = 0; p < P; p++)
            w[p] = pair8(pa[p], pb[p], c0 + k, qs[p], fmt);
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            __m512 x = _mm512_broadcast_f32x8(_mm256_loadu_ps(Xc + (size_t)t * cols + k));
            #pragma GCC unroll 16
            for (int p = 0; p < P; p++)
                acc[p][t] = _mm512_fmadd_ps(w[p], x, acc[p][t]);
        }
    }
    /* s[p][t][h]: the hsum of row 2p + h, token t */
    float s[KN_D5_P][8][2];
    #pragma GCC unroll 16
    for (int p = 0; p < P; p++) {
        int t = 0;
        #pragma GCC unroll 16
        for (; t + 4 <= T; t += 4) {
            float v[8];
            _mm256_storeu_ps(v, kn_hsum8_512(acc[p][t], acc[p][t + 1], acc[p][t + 2], acc[p][t + 3]));
            #pragma GCC unroll 16
            for (int j = 0; j < 4; j++) {
                s[p][t + j][0] = v[2 * j];
                s[p][t + j][1] = v[2 * j + 1];
            }
        }
        #pragma GCC unroll 16
        for (; t < T; t++) {
            s[p][t][0] = kn_hsum256(_mm512_castps512_ps256(acc[p][t]));
            s[p][t][1] = kn_hsum256(_mm512_extractf32x8_ps(acc[p][t], 1));
        }
    }
    float tw[2 * KN_D5_P][8];
    if (n > n8)
        for (int i = 0; i < R; i++)
            kn_dequant_span(W, r + (uint32_t)i, c0 + n8, n - n8, tw[i]);
    #pragma GCC unroll 16
    for (int i = 0; i < 2 * P; i++) {
        if (i >= R)
            break;
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            float v = s[i / 2][t][i & 1];
            for (uint32_t k = n8; k < n; k++)
                v += tw[i][k - n8] * X[(size_t)t * cols + c0 + k];
            Y[(size_t)t * rows + r + (uint32_t)i] += v;
        }
    }
}

/* Rows [r0, r1), tokens [0, T), column block outermost (canon_fmt). */
KN_AI void dec_fmt(const kn_matrix *W, const float *X, float *Y, uint32_t r0,
                   uint32_t r1, int fmt, int T)
{
    const uint32_t tile = 2 * KN_D5_P;
    for (uint32_t c0 = 0; c0 < W->cols; c0 += KN_KC) {
        uint32_t r = r0;
        for (; r1 - r >= tile; r += tile)
            blk(W, X, Y, r, (int)tile, c0, fmt, KN_D5_P, T);
        switch (r1 - r) {
        case 1: case 2: blk(W, X, Y, r, (int)(r1 - r), c0, fmt, 1, T); break;
        case 3: case 4: blk(W, X, Y, r, (int)(r1 - r), c0, fmt, 2, T); break;
        case 5: blk(W, X, Y, r, 5, c0, fmt, 3, T); break;
        default: break;
        }
    }
}

_Static_assert(KN_D5_P == 3 && KN_GEMM_MIN_T == 8, "dec_fmt's cases assume 3 pairs, T <= 8");

KN_AI void dec_t(const kn_matrix *W, const float *X, size_t T, float *Y,
                 uint32_t r0, uint32_t r1, int fmt)
{
    switch (T) {
    case 2: dec_fmt(W, X, Y, r0, r1, fmt, 2); break;
    case 3: dec_fmt(W, X, Y, r0, r1, fmt, 3); break;
    case 4: dec_fmt(W, X, Y, r0, r1, fmt, 4); break;
    case 5: dec_fmt(W, X, Y, r0, r1, fmt, 5); break;
    case 6: dec_fmt(W, X, Y, r0, r1, fmt, 6); break;
    case 7: dec_fmt(W, X, Y, r0, r1, fmt, 7); break;
    default: dec_fmt(W, X, Y, r0, r1, fmt, 8); break;
    }
}

void kn_dec_rows_avx512(const kn_matrix *W, const float *X, size_t T,
                        float *Y, uint32_t r0, uint32_t r1)
{
    switch (W->fmt) {
    case KN_W_F32: dec_t(W, X, T, Y, r0, r1, KN_W_F32); break;
    case KN_W_F16: dec_t(W, X, T, Y, r0, r1, KN_W_F16); break;
    case KN_W_BF16: dec_t(W, X, T, Y, r0, r1, KN_W_BF16); break;
    default: dec_t(W, X, T, Y, r0, r1, KN_W_Q8); break;
    }
}

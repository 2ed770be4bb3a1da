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
 * each half does exactly canon_blk's fma(w[k+j], x[k+j], acc).  Per
 * token, kn_hsum8_512 of the three pairs' chains reduces them with
 * kn_hsum256's additions (same operands, same tree, only commuted), and
 * the tail and Y's addition follow canon_blk's order.
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
 * and each broadcast feeds 3 FMAs.  Unlike canon_fmt, the row tile is the
 * outer loop (each tile's rows read whole, every column block in order;
 * Y takes the blocks' sums in the same order either way): with all T
 * tokens in one tile the weights need no reuse from L1, the T x cols
 * inputs (up to 180 KiB) are read from L2, and the tile's bytes are one
 * sequential stream, prefetched as one into L2 KN_D5_PF rows on (blk).
 * Measured against the column block outermost (session 26, TinyLlama
 * f16, bench_vs tg8, interleaved pairs): 73-75 -> 78-80 tok/s, and the
 * one-stream prefetch 78.5 -> 81.9.
 *
 * Code size: ONE copy of the tile per format.  The token count is a
 * runtime value: each 8-column step jumps into the unrolled sequence of
 * tokens 7 .. 0 (toks, a switch that falls through), so the accumulators
 * keep constant indices and stay in registers for every T; a short row
 * tile (the last 1-5 rows of a range) repeats its last row in the missing
 * slots and masks their sums off.  The first version (branch i8_f16dec,
 * 3327046) specialized 4 formats x 7 token counts x 4 tile shapes, 1.6 MB
 * of text that took over 10 minutes to compile under ASan and was
 * reverted (4e6912e); this one is 21.9 KB of text (Release, -O3; 20.3
 * KB at -O2) and compiles in 14-16 CPU seconds under ASan + UBSan.
 *
 * Measured (docs/benchmarks.md, i9_f16dec; bench_gemm --fmt f16, 1
 * thread, GMAC per CPU-second, 7 rounds interleaved with MC_NO_AVX512=1
 * in one binary and with the first version's build, medians, load 1.2):
 * TinyLlama shapes 1.51-1.70x the AVX2 kernel at T = 2 and 8, 1.23-1.33x
 * at T = 4; SmolLM shapes 1.30-1.54x; the first version 1.17-1.58x and
 * 1.10-1.39x in the same rounds (the jump costs nothing measurable);
 * TinyLlama T = 3, 5, 6, 7: 1.28-2.10x (first version 1.15-1.53x).  One
 * accumulator still spills at T = 8 (a memory operand on one chain).
 * KN_D5_PF 12 against canon_blk's 8 (first version, 5 rounds, load
 * 2.7): gate/up and down 5-12 % faster at T = 2, 4, 8, q/o 2048x2048 as
 * fast at T = 8 but 13-29 % slower at T = 2-4.  Not tried: 2 row pairs
 * (4 x 8) instead of 3.  T = 1 stays on canon_rows: a one-token kernel
 * here taking one row's four column blocks at once (two per zmm, two rows
 * a pass) measured 6 % slower on one core (session 26, dropped).
 */
#include <immintrin.h>

#include "kn_avx512.h"
#include "kn_avx2.h"
#include "kn_gemm.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

#define KN_D5_P 3   /* row pairs per register tile (6 rows) */
#define KN_D5_T 8   /* tokens per register tile: KN_GEMM_MIN_T */
#define KN_D5_PF 12 /* prefetch distance in rows (two tiles on) */

_Static_assert(KN_D5_T == KN_GEMM_MIN_T, "one tile holds every decode token");

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

/* acc[p][t] += w[p] * x[t][0 .. 8) (both halves) for token t: one chain
 * step of rows 2p, 2p + 1. */
KN_AI void tok(__m512 acc[KN_D5_P][KN_D5_T], const __m512 w[KN_D5_P],
               const float *x, int t)
{
    __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(x));
    #pragma GCC unroll 16
    for (int p = 0; p < KN_D5_P; p++)
        acc[p][t] = _mm512_fmadd_ps(w[p], v, acc[p][t]);
}

/* The step of every token t < T (2 <= T <= 8; x: token 0's 8 inputs, ld:
 * floats between tokens).  T is a runtime count, not a template: a jump
 * into the unrolled token sequence (Duff's device; T is the same for the
 * whole call, so the jump predicts), which keeps all 24 accumulators in
 * registers with one copy of the code for every T. */
KN_AI void toks(__m512 acc[KN_D5_P][KN_D5_T], const __m512 w[KN_D5_P],
                const float *x, size_t ld, size_t T)
{
    switch (T) {
    default: tok(acc, w, x + 7 * ld, 7); __attribute__((fallthrough));
    case 7: tok(acc, w, x + 6 * ld, 6); __attribute__((fallthrough));
    case 6: tok(acc, w, x + 5 * ld, 5); __attribute__((fallthrough));
    case 5: tok(acc, w, x + 4 * ld, 4); __attribute__((fallthrough));
    case 4: tok(acc, w, x + 3 * ld, 3); __attribute__((fallthrough));
    case 3: tok(acc, w, x + 2 * ld, 2); __attribute__((fallthrough));
    case 2: tok(acc, w, x + 1 * ld, 1); __attribute__((fallthrough));
    case 1: tok(acc, w, x, 0);
    }
}

/* Column block [c0, c0 + KN_KC) of rows r .. r+R-1 (1 <= R <= 6), tokens
 * [0, T): Y[t][row] += the block's sum, canon_blk's bits.  A short tile
 * (R < 6, the last of a row range) repeats its last row in the missing
 * slots and drops their sums: one code path for every tile. */
KN_AI void blk(const kn_matrix *W, const float *X, size_t T, float *Y,
               uint32_t r, uint32_t R, uint32_t c0, int fmt)
{
    const uint32_t cols = W->cols, rows = W->rows;
    const size_t esz = fmt == KN_W_F32 ? 4 : fmt == KN_W_Q8 ? 1 : 2;
    const size_t rowb = (size_t)cols * esz;
    const uint8_t *base = W->data;
    const float *sc = fmt == KN_W_Q8 ? W->scales : NULL;
    const uint8_t *pa[KN_D5_P], *pb[KN_D5_P];
    __m512 qs[KN_D5_P];
    #pragma GCC unroll 16
    for (uint32_t p = 0; p < KN_D5_P; p++) {
        uint32_t a = r + (2 * p < R ? 2 * p : R - 1);
        uint32_t b = r + (2 * p + 1 < R ? 2 * p + 1 : R - 1);
        pa[p] = base + (size_t)a * rowb;
        pb[p] = base + (size_t)b * rowb;
        qs[p] = fmt == KN_W_Q8
            ? _mm512_insertf32x8(_mm512_set1_ps(sc[a]), _mm256_set1_ps(sc[b]), 1)
            : _mm512_setzero_ps();
    }
    const uint32_t n = cols - c0 < KN_KC ? cols - c0 : KN_KC;
    const uint32_t n32 = n & ~31u, n8 = n & ~7u;
    /* Into L2 (T1), KN_D5_PF rows on; lstep: bytes of 32 columns of a
     * row (f32 takes two lines, Q8 half of one). */
    const size_t pf = KN_D5_PF * rowb, lstep = 32 * esz;
    __m512 acc[KN_D5_P][KN_D5_T];
    #pragma GCC unroll 16
    for (int p = 0; p < KN_D5_P; p++)
        #pragma GCC unroll 16
        for (int t = 0; t < KN_D5_T; t++)
            acc[p][t] = _mm512_setzero_ps();
    const float *Xc = X + c0;
    for (uint32_t k = 0; k < n32; k += 32) {
        /* The tile's R rows are contiguous and dec_fmt reads them whole
         * before the next tile, so prefetch them as ONE stream: the
         * R x lstep bytes these 32 columns take, at their position in
         * the tile.  The hardware prefetcher alone does little here (a
         * batch-1 trial kernel went from ~20 to 8.7 tok/s on TinyLlama
         * f16 with its prefetches made useless), and the same lines
         * fetched row by row (6 streams) measured 4 % slower at T = 8
         * (docs/benchmarks.md, session 26). */
        const char *q = (const char *)base + (size_t)r * rowb +
                        (size_t)(c0 + k) * esz * R + pf;
        #pragma GCC unroll 16
        for (int p = 0; p < KN_D5_P; p++) {
            const char *qa = q + (size_t)(2 * p) * lstep;
            const char *qb = q + (size_t)(2 * p + 1) * lstep;
            _mm_prefetch(qa, _MM_HINT_T1);
            _mm_prefetch(qb, _MM_HINT_T1);
            if (fmt == KN_W_F32) {
                _mm_prefetch(qa + 64, _MM_HINT_T1);
                _mm_prefetch(qb + 64, _MM_HINT_T1);
            }
        }
        #pragma GCC unroll 16
        for (uint32_t kk = 0; kk < 32; kk += 8) {
            __m512 w[KN_D5_P];
            #pragma GCC unroll 16
            for (int p = 0; p < KN_D5_P; p++)
                w[p] = pair8(pa[p], pb[p], c0 + k + kk, qs[p], fmt);
            toks(acc, w, Xc + k + kk, cols, T);
        }
    }
    for (uint32_t k = n32; k < n8; k += 8) { /* whole groups past the last 32 */
        __m512 w[KN_D5_P];
        #pragma GCC unroll 16
        for (int p = 0; p < KN_D5_P; p++)
            w[p] = pair8(pa[p], pb[p], c0 + k, qs[p], fmt);
        toks(acc, w, Xc + k, cols, T);
    }
    /* s[t]: kn_hsum8_512 of the three pairs' chains of token t, the
     * block's sums of rows r .. r+5 in order (each chain kn_hsum256's
     * bits whatever its neighbours; the fourth operand is a dummy).  The
     * loop is unrolled to constant indices, so the accumulators stay in
     * registers, and stops at T. */
    float s[KN_D5_T][8];
    #pragma GCC unroll 16
    for (int t = 0; t < KN_D5_T; t++) {
        if ((size_t)t >= T)
            break;
        _mm256_storeu_ps(s[t], kn_hsum8_512(acc[0][t], acc[1][t], acc[2][t], acc[2][t]));
    }
    if (n > n8) { /* canon_blk's scalar tail, added to each sum in order */
        float tw[2 * KN_D5_P][8];
        for (uint32_t i = 0; i < R; i++)
            kn_dequant_span(W, r + i, c0 + n8, n - n8, tw[i]);
        for (size_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < R; i++)
                for (uint32_t k = n8; k < n; k++)
                    s[t][i] += tw[i][k - n8] * X[t * cols + c0 + k];
    }
    /* Y[t][r + i] += s[t][i] for the R real rows, under a mask */
    const __mmask8 m = (__mmask8)((1u << R) - 1);
    for (size_t t = 0; t < T; t++) {
        float *y = Y + t * rows + r;
        _mm256_mask_storeu_ps(y, m, _mm256_add_ps(_mm256_maskz_loadu_ps(m, y),
                                                  _mm256_loadu_ps(s[t])));
    }
}

/* Rows [r0, r1), tokens [0, T), row tile outermost (see the top).  Not
 * inlined into one another: one copy per format. */
KN_AI void dec_fmt(const kn_matrix *W, const float *X, size_t T, float *Y,
                   uint32_t r0, uint32_t r1, int fmt)
{
    const uint32_t tile = 2 * KN_D5_P;
    for (uint32_t r = r0; r < r1; r += tile)
        for (uint32_t c0 = 0; c0 < W->cols; c0 += KN_KC)
            blk(W, X, T, Y, r, r1 - r < tile ? r1 - r : tile, c0, fmt);
}

void kn_dec_rows_avx512(const kn_matrix *W, const float *X, size_t T,
                        float *Y, uint32_t r0, uint32_t r1)
{
    switch (W->fmt) {
    case KN_W_F32: dec_fmt(W, X, T, Y, r0, r1, KN_W_F32); break;
    case KN_W_F16: dec_fmt(W, X, T, Y, r0, r1, KN_W_F16); break;
    case KN_W_BF16: dec_fmt(W, X, T, Y, r0, r1, KN_W_BF16); break;
    default: dec_fmt(W, X, T, Y, r0, r1, KN_W_Q8); break;
    }
}

/*
 * kn_ops_avx2.c - AVX2/FMA/F16C kernels (compiled with -mavx2 -mfma -mf16c;
 * kn_ops.c calls them only when kn_cpu_has_avx2()).
 *
 * Matmul has two shapes of work:
 *  - decode (T <= 8 tokens): memory bound at T = 1.  Each weight row is
 *    streamed once, dequantized 8 columns at a time in registers and
 *    multiplied into the tokens while it is in registers; a row tile is
 *    read whole before the next, so the weights are one stream
 *    (canon_fmt).
 *  - prefill (T > 8): compute bound, the GEMM of kn_gemm_avx2.c, which
 *    dequantizes through kn_avx2_dequant_block below.
 * Dequantized values equal kn_w_at()'s exactly (same float products), so
 * results differ from the references only in summation order, and both
 * paths use the SAME order for every output element (see canon_rows): a
 * row's result does not depend on T or on the thread split, which is what
 * makes a sequence bit-identical alone or in a batch.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_avx2.h"
#include "kn_internal.h"

#define KN_PF_ROWS 8 /* decode: prefetch distance in rows (canon_rows) */
#define KN_AI __attribute__((always_inline)) static inline

/* ---- weight access --------------------------------------------------------- */

/* Per-row pointers and constants of one matrix row. */
typedef struct kn_rowp {
    const uint8_t *data;     /* start of the row's data */
    const uint16_t *scales;  /* Q4: the row's group scales */
    const uint8_t *zeros;    /* Q4: the row's zeros */
    float qscale;            /* Q8: the row's scale */
} kn_rowp;

KN_AI kn_rowp row_ptrs(const kn_matrix *W, uint32_t r, int fmt)
{
    kn_rowp rp = { 0 };
    size_t cols = W->cols;
    switch (fmt) {
    case KN_W_F32: rp.data = (const uint8_t *)W->data + (size_t)r * cols * 4; break;
    case KN_W_F16: case KN_W_BF16:
        rp.data = (const uint8_t *)W->data + (size_t)r * cols * 2; break;
    case KN_W_Q8:
        rp.data = (const uint8_t *)W->data + (size_t)r * cols;
        rp.qscale = ((const float *)W->scales)[r];
        break;
    default: {
        uint32_t ng = kn_q4_ngroups(W->cols, W->group);
        rp.data = (const uint8_t *)W->data + (size_t)r * kn_q4_row_bytes(W->cols);
        rp.scales = (const uint16_t *)W->scales + (size_t)r * ng;
        if (fmt == KN_W_Q4)
            rp.zeros = W->zeros + (size_t)r * ng;
        break;
    }
    }
    return rp;
}

/* Weights c + 8 kk .. c + 8 kk + 7 of a row (c a multiple of 32,
 * c + 32 <= cols, kk < 4).  Q8 gives the raw integers (the caller applies
 * the row scale); Q4/Q4S: 4 bytes broadcast to 8 lanes, shifted 0..28. */
KN_AI __m256 deq8(const kn_rowp *rp, uint32_t c, int kk, int gshift, int fmt)
{
    switch (fmt) {
    case KN_W_F32: return _mm256_loadu_ps((const float *)rp->data + c + 8 * kk);
    case KN_W_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128(
            (const __m128i *)((const uint16_t *)rp->data + c + 8 * kk)));
    case KN_W_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
            (const __m128i *)((const uint16_t *)rp->data + c + 8 * kk))), 16));
    case KN_W_Q8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64((const __m128i *)((const int8_t *)rp->data + c + 8 * kk))));
    default: { /* Q4, Q4S */
        uint32_t g = c >> gshift;
        int z = fmt == KN_W_Q4 ? rp->zeros[g] : KN_Q4_ZERO_SYM;
        int32_t u;
        memcpy(&u, rp->data + c / 2 + 4 * kk, 4);
        __m256i q = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(u), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
            _mm256_set1_epi32(0xf));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(z))),
                             _mm256_set1_ps(_cvtsh_ss(rp->scales[g])));
    }
    }
}

/* Weights c .. c+31 of a row into w[4] (deq8 four times). */
KN_AI void deq32(const kn_rowp *rp, uint32_t c, int gshift, int fmt, __m256 w[4])
{
    #pragma GCC unroll 16
    for (int kk = 0; kk < 4; kk++)
        w[kk] = deq8(rp, c, kk, gshift, fmt);
}

int kn_avx2_matmul_supported(const kn_matrix *W)
{
    if (W->layout != KN_LAYOUT_ROWS)
        return 0; /* panels: the scalar path (kn_pack16.h) */
    switch (W->fmt) {
    case KN_W_F32: case KN_W_F16: case KN_W_BF16: case KN_W_Q8: return 1;
    case KN_W_Q4: case KN_W_Q4S:
        return W->group == 32 || W->group == 64 || W->group == 128;
    default: return 0;
    }
}

/* ---- decode, row-invariant ------------------------------------------------- */

/* The runtime promises that a sequence gives bit-identical results alone or
 * in a batch, so every output element must be summed in one canonical
 * order whatever T is: for each KN_KC column block, one 8-lane chain over
 * the block's columns in order, hsum256, the scalar tail, then added to Y
 * -- exactly the order of kn_gemm_avx2.c's micro-kernel.  This decode path keeps that order
 * but dequantizes in registers (no L1 buffer) and hides the FMA latency
 * with R rows x T tokens independent chains instead of several chains per
 * element.  Since Y takes the blocks' sums in column order whichever loop
 * runs outside, the order of (row tile, column block, token group) visits
 * is free: canon_fmt picks it for the cache (see there). */

/* Column block [c0, c0 + KN_KC) of rows r .. r+R-1 for tokens t0 .. t0+T-1:
 * Y[t][row] += the block's sum.  pf_on: prefetch the rows KN_PF_ROWS on
 * (1: each row's columns; 2: the rows as one stream, when the caller
 * reads the tile's rows whole before the next tile). */
KN_AI void canon_blk(const kn_matrix *W, const float *X, float *Y, uint32_t r,
                     uint32_t c0, size_t t0, int fmt, int R, int T, int pf_on)
{
    uint32_t cols = W->cols, rows = W->rows;
    int gshift = W->group ? __builtin_ctz(W->group) : 0;
    /* Prefetch the same columns KN_PF_ROWS rows on (the rows the next row
     * blocks read; rows are contiguous): one line per 32 columns and row,
     * two for f32.  Short rows otherwise leave the hardware prefetcher
     * too little of each stream to get ahead.  Into L2 (T1), not L1:
     * on Zen 4, with 4 interleaved 1152-byte rows, T0 prefetches read
     * 10 GB/s on one core, T1 ones 19 (a plain sequential read 23); this
     * kernel's f16 GEMV went 9.3 -> 23.4 GB/s (docs/benchmarks.md).
     * With pf_on == 2 the same lines in the order they lie in memory (the
     * tile's rows one after another): TinyLlama f16 batch 1 on one core
     * 12.6-12.8 -> 14.2-15.2 tok/s, at the one-core read probe's rate
     * (session 26). */
    size_t ebits = fmt == KN_W_F32 ? 32 : fmt == KN_W_Q8 ? 8
                 : (fmt == KN_W_F16 || fmt == KN_W_BF16) ? 16 : 4;
    size_t pf = KN_PF_ROWS * (fmt == KN_W_Q4 || fmt == KN_W_Q4S
                                  ? kn_q4_row_bytes(cols) : (size_t)cols * ebits / 8);
    kn_rowp rp[4];
    __m256 qs[4];
    #pragma GCC unroll 16
    for (int i = 0; i < R; i++) {
        rp[i] = row_ptrs(W, r + (uint32_t)i, fmt);
        qs[i] = _mm256_set1_ps(rp[i].qscale);
    }
    const float *Xt = X + t0 * cols;
    float *Yt = Y + t0 * rows;
    uint32_t n = cols - c0 < KN_KC ? cols - c0 : KN_KC;
    uint32_t n32 = n & ~31u, n8 = n & ~7u;
    __m256 acc[4][8];
    #pragma GCC unroll 16
    for (int i = 0; i < R; i++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++)
            acc[i][t] = _mm256_setzero_ps();
    for (uint32_t k = 0; k < n32; k += 32) {
        if (pf_on)
            #pragma GCC unroll 16
            for (int i = 0; i < R; i++) {
                /* pf_on == 2: rows r .. r+R-1 are read whole, one tile
                 * after another (canon_rows), so their bytes are one
                 * stream: its R lines for these 32 columns */
                const uint8_t *a = pf_on == 2
                    ? rp[0].data + (size_t)(c0 + k) * ebits / 8 * (size_t)R +
                          (size_t)i * 4 * ebits + pf
                    : rp[i].data + (size_t)(c0 + k) * ebits / 8 + pf;
                _mm_prefetch((const char *)a, _MM_HINT_T1);
                if (fmt == KN_W_F32)
                    _mm_prefetch((const char *)a + 64, _MM_HINT_T1);
            }
        if (T == 1 && (fmt == KN_W_Q4 || fmt == KN_W_Q4S)) {
            /* one token of int4: a row's 32 weights at once, so the
             * group's zero and scale are read once, not per 8 columns */
            #pragma GCC unroll 16
            for (int i = 0; i < R; i++) {
                __m256 w[4];
                deq32(&rp[i], c0 + k, gshift, fmt, w);
                #pragma GCC unroll 16
                for (int kk = 0; kk < 4; kk++)
                    acc[i][0] = _mm256_fmadd_ps(
                        w[kk], _mm256_loadu_ps(Xt + c0 + k + 8 * kk), acc[i][0]);
            }
            continue;
        }
        /* 8 columns at a time: R weights, then each token's input loaded
         * once for the R rows (R = 3, T = 4: 12 chains + 3 + 1 registers) */
        #pragma GCC unroll 16
        for (int kk = 0; kk < 4; kk++) {
            __m256 w[4];
            #pragma GCC unroll 16
            for (int i = 0; i < R; i++) {
                w[i] = deq8(&rp[i], c0 + k, kk, gshift, fmt);
                if (fmt == KN_W_Q8)
                    w[i] = _mm256_mul_ps(qs[i], w[i]);
            }
            #pragma GCC unroll 16
            for (int t = 0; t < T; t++) {
                __m256 x = _mm256_loadu_ps(Xt + (size_t)t * cols + c0 + k + 8 * kk);
                #pragma GCC unroll 16
                for (int i = 0; i < R; i++)
                    acc[i][t] = _mm256_fmadd_ps(w[i], x, acc[i][t]);
            }
        }
    }
    float tw[4][32];
    if (n > n32) {
        #pragma GCC unroll 16
        for (int i = 0; i < R; i++)
            kn_dequant_span(W, r + (uint32_t)i, c0 + n32, n - n32, tw[i]);
        for (uint32_t k = n32; k < n8; k += 8)
            #pragma GCC unroll 16
            for (int i = 0; i < R; i++)
                #pragma GCC unroll 16
                for (int t = 0; t < T; t++)
                    acc[i][t] = _mm256_fmadd_ps(
                        _mm256_loadu_ps(tw[i] + (k - n32)),
                        _mm256_loadu_ps(Xt + (size_t)t * cols + c0 + k),
                        acc[i][t]);
    }
    #pragma GCC unroll 16
    for (int i = 0; i < R; i++)
        #pragma GCC unroll 16
        for (int t = 0; t < T; t++) {
            float s = kn_hsum256(acc[i][t]);
            for (uint32_t k = n8; k < n; k++)
                s += tw[i][k - n32] * Xt[(size_t)t * cols + c0 + k];
            Yt[(size_t)t * rows + r + (uint32_t)i] += s;
        }
}

/* Rows r .. r+R-1, tokens [t0, t0 + T), every column block in order. */
KN_AI void canon_rows(const kn_matrix *W, const float *X, float *Y,
                      uint32_t r, size_t t0, int fmt, int R, int T)
{
    for (uint32_t c0 = 0; c0 < W->cols; c0 += KN_KC)
        canon_blk(W, X, Y, r, c0, t0, fmt, R, T, 2);
}

/* 3 rows from r, tokens [0, T) of one column block, in token groups of 4
 * (12 chains: with 3 weights and an input, the 16 registers). */
KN_AI void canon_tile3(const kn_matrix *W, const float *X, size_t T, float *Y,
                       uint32_t r, uint32_t c0, int fmt)
{
    size_t t = 0;
    for (; t + 4 <= T; t += 4)
        canon_blk(W, X, Y, r, c0, t, fmt, 3, 4, t == 0 ? 2 : 0);
    switch (T - t) {
    case 3: canon_blk(W, X, Y, r, c0, t, fmt, 3, 3, t == 0 ? 2 : 0); break;
    case 2: canon_blk(W, X, Y, r, c0, t, fmt, 3, 2, t == 0 ? 2 : 0); break;
    case 1: canon_blk(W, X, Y, r, c0, t, fmt, 3, 1, t == 0 ? 2 : 0); break;
    default: break;
    }
}

/* Rows [r0, r1) for T <= 8 tokens, one row tile after another, each over
 * its whole rows, so a thread's weights are one sequential stream and
 * are prefetched as one (canon_blk's pf_on == 2).  One token: tiles of 4
 * rows (the input, a few KiB, stays in L1).  2-8 tokens: tiles of 3 rows,
 * every column block in order, token groups of 4 within a block (the
 * block's dequantized weights reused from L1); the T x cols inputs (180
 * KiB at 8 x 5632) come from L2.  Until session 26 the column block was
 * the outer loop (to keep its T x 512 inputs in L1), which read each row
 * in 512-column pieces across all the rows: TinyLlama f16 batch 8 with
 * AVX2 alone (MC_NO_AVX512=1) went 55.9-57.1 -> 62.3-63.4 tok/s with the
 * tile outermost, interleaved.  Each weight byte still comes from memory
 * once per step. */
KN_AI void canon_fmt(const kn_matrix *W, const float *X, size_t T, float *Y,
                     uint32_t r0, uint32_t r1, int fmt)
{
    uint32_t r4;
    if (T == 1) {
        r4 = r0 + (r1 - r0) / 4 * 4;
        for (uint32_t r = r0; r < r4; r += 4)
            canon_rows(W, X, Y, r, 0, fmt, 4, 1);
    } else {
        r4 = r0 + (r1 - r0) / 3 * 3;
        for (uint32_t r = r0; r < r4; r += 3)
            for (uint32_t c0 = 0; c0 < W->cols; c0 += KN_KC)
                canon_tile3(W, X, T, Y, r, c0, fmt);
    }
#define KN_C1(tt)                                                              \
    case tt:                                                                   \
        for (uint32_t r = r4; r < r1; r++)                                     \
            canon_rows(W, X, Y, r, 0, fmt, 1, tt);                             \
        break;
    switch (T) {
        KN_C1(1) KN_C1(2) KN_C1(3) KN_C1(4) KN_C1(5) KN_C1(6) KN_C1(7)
        default: KN_C1(8)
    }
#undef KN_C1
}

/* ---- dequantized blocks for the prefill GEMM (kn_gemm_avx2.c) ---------------- */

/* Dequantize W[r][c0 .. c0+n) (c0 a multiple of 32) into out. */
KN_AI void deq_block_fmt(const kn_matrix *W, uint32_t r, uint32_t c0, uint32_t n,
                     float *out, int fmt)
{
    kn_rowp rp = row_ptrs(W, r, fmt);
    int gshift = W->group ? __builtin_ctz(W->group) : 0;
    uint32_t nmain = n & ~31u;
    __m256 qs = _mm256_set1_ps(rp.qscale);
    for (uint32_t i = 0; i < nmain; i += 32) {
        __m256 w[4];
        deq32(&rp, c0 + i, gshift, fmt, w);
        #pragma GCC unroll 16
        for (int k = 0; k < 4; k++) {
            if (fmt == KN_W_Q8)
                w[k] = _mm256_mul_ps(qs, w[k]); /* = scale * (float)q */
            _mm256_store_ps(out + i + 8 * k, w[k]);
        }
    }
    if (n > nmain)
        kn_dequant_span(W, r, c0 + nmain, n - nmain, out + nmain);
}

void kn_avx2_dequant_block(const kn_matrix *W, uint32_t r, uint32_t c0,
                           uint32_t n, float *out)
{
    switch (W->fmt) {
    case KN_W_F32: deq_block_fmt(W, r, c0, n, out, KN_W_F32); break;
    case KN_W_F16: deq_block_fmt(W, r, c0, n, out, KN_W_F16); break;
    case KN_W_BF16: deq_block_fmt(W, r, c0, n, out, KN_W_BF16); break;
    case KN_W_Q8: deq_block_fmt(W, r, c0, n, out, KN_W_Q8); break;
    case KN_W_Q4: deq_block_fmt(W, r, c0, n, out, KN_W_Q4); break;
    default: deq_block_fmt(W, r, c0, n, out, KN_W_Q4S); break;
    }
}

void kn_avx2_matmul_rows(const kn_matrix *W, const float *X, size_t T,
                         float *Y, uint32_t r0, uint32_t r1)
{
    switch (W->fmt) {
    case KN_W_F32: canon_fmt(W, X, T, Y, r0, r1, KN_W_F32); break;
    case KN_W_F16: canon_fmt(W, X, T, Y, r0, r1, KN_W_F16); break;
    case KN_W_BF16: canon_fmt(W, X, T, Y, r0, r1, KN_W_BF16); break;
    case KN_W_Q8: canon_fmt(W, X, T, Y, r0, r1, KN_W_Q8); break;
    case KN_W_Q4: canon_fmt(W, X, T, Y, r0, r1, KN_W_Q4); break;
    default: canon_fmt(W, X, T, Y, r0, r1, KN_W_Q4S); break;
    }
}

/* ---- elementwise ---------------------------------------------------------------- */

void kn_avx2_rmsnorm_row(float *out, const float *x, const float *w,
                         size_t n, float eps)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    double ss = kn_hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    __m256 vi = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi),
                                                _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        out[i] = x[i] * inv * w[i];
}

void kn_avx2_silu_mul(float *gate, const float *up, size_t n)
{
    size_t i = 0;
    __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = kn_exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void kn_avx2_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    /* vcvtps2ph rounds to nearest even, overflow to Inf and subnormals as
     * fmt_f32_to_f16 does; only a NaN's payload differs (F16C keeps its
     * top bits, fmt_f32_to_f16 writes the sign and 0x7e00), so NaN lanes
     * are blended to that. */
    size_t i = 0;
    const __m128i qnan = _mm_set1_epi16(0x7e00);
    const __m128i sign = _mm_set1_epi16((short)0x8000);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32),
                                        _mm256_extracti128_si256(nan32, 1));
        __m128i canon = _mm_or_si128(_mm_and_si128(h, sign), qnan);
        h = _mm_blendv_epi8(h, canon, nan16);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = fmt_f32_to_f16(src[i]);
}

void kn_avx2_add(float *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
                                              _mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] += x[i];
}

void kn_avx2_softmax(float *x, size_t n)
{
    if (n == 0)
        return;
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    __m256 vm = _mm256_set1_ps(mx), vs = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = kn_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        vs = _mm256_add_ps(vs, e);
    }
    double sum = kn_hsum256(vs);
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    __m256 inv = _mm256_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++)
        x[i] *= (float)(1.0 / sum);
}

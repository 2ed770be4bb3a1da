/*
 * kn_qdec_avx512.c - integer decode (kn_avx512_matmul_q_dec of
 * kn_internal.h) with AVX-512 VNNI on 256-bit vectors, in kn_qdot.h's
 * block-sum form: Q8, Q4 and Q4S weights, row-major as the artifact
 * stores them, against 1-8 tokens, full blocks (cols % 32 == 0; int4 also
 * cols <= 32768, the stack table of activation sums); called only when
 * kn_cpu_has_avx512(), for the rows [r0, r1) of one thread, Y holding
 * bias or 0 there.
 *
 * Rows in the lanes.  A pass takes 8 weight rows and walks all blocks;
 * per block b it makes one exact int32 per (row, token) in a register
 * whose lane i is row i, so one convert and one fma serve 8 rows:
 * acc[t] = fma(f_b, s_b, acc[t]), the reference's chain (block order,
 * one fma per block, from 0), then Y += acc (Q8: Y += acc * row scale).
 * The integer sums are exact, so the way they are formed does not
 * matter; the float steps are the reference's own, in its order: the
 * bits are kn_ref_matmul_q's (test_qdot, every format, group, T and a
 * thread split, for this path alone).
 *
 * int4: register m < 4 holds rows m (low 128 bits) and m + 4 (high) of
 * the block: their 16 code bytes, one load and an insert; lo = the low
 * nibbles (even columns), hi = the high ones (odd columns).  Each token's
 * activation block is [16 even | 16 odd] (kn_qdot.h's nibble order), so
 * either half broadcast to both 128-bit lanes lines up with lo or hi:
 *   P_m = dpbusd(dpbusd(0, lo_m, xe), hi_m, xo)      (unsigned codes c)
 * gives 4 dwords per row, each an exact sum of 8 products c * x; unpack
 * and add twice (dq_fold4) make [row 0..3 | row 4..7] of S = the sum of
 * c * x over the block.  Q4: i_b = S - z * sx (z the row's zero, sx the
 * block's activation sum, a table per call), taken in float: S, z * sx
 * and i_b are integers below 2^24, so fnmadd(z, sx, (float)S) IS
 * (float)i_b, the reference's f_b, with the code -128 of a non-finite
 * input too.  Q4S: the dot products start from -8 x the activations'
 * dword sums (a table per call, T x blocks <= 2048; past that as Q4 with
 * z = 8), so the fold gives i_b itself (each dword then |.| <= 8 * 8 *
 * 128), one convert: that alone measured 1.07-1.14x at T = 1 (no
 * fnmadd, no zero table).  s_b = f16 scale * d[b], one multiply as
 * kn_qdot_scale; the 8 rows' scales (and Q4 zeros) of 8 groups are
 * converted and transposed 8 x 8 once per 8 groups.
 *
 * int4-sym in 16-row panels (KN_LAYOUT_P16, kn_pack16.h; the CPU
 * runtime's layout on these CPUs): a zmm per 16 rows x 4 code bytes, 8
 * vpdpbusd per (panel, token, block) from -8 x the block sum, no insert,
 * fold or transpose, one stream per thread (dp16_panel).  int8 in
 * panels: per (panel, block) 16 loads of 16 rows x 2 codes widened to
 * int16 and 16 vpdpwssd per token (dp8_panel); SmolLM-shape batch-1
 * decode 1.20x the row layout's (docs/quantization.md).
 *
 * int8: register m holds 8 columns of rows m and m + 4 widened to int16
 * (4 per block); 4 vpdpwssd against the token's 8 activations broadcast
 * give 4 dwords per row (8 products, < 2^25), dq_fold4 makes the exact
 * block sums (< 2^27); the convert rounds as the reference's (float)i_b
 * does (nearest even); s_b = d[b].
 *
 * A pass per 8 rows; a short last one starts at min(r, rows - 8) (rows of
 * a neighbouring thread's range are read, never stored: masked stores);
 * a matrix of fewer than 8 rows takes one row a pass (all lanes read it,
 * lane 0 is stored).  The next pass's rows are prefetched into L2, as a
 * decode streams each matrix once.
 *
 * Measured (docs/benchmarks.md, "i10_d512"; bench_gemm, 1 thread, CPU
 * time, medians of 9 interleaved rounds, TinyLlama and SmolLM shapes,
 * against the kernels before the switch, which kept 8 float lanes per
 * (row, token)): int4 T = 1 1.00-1.07x, T = 2..8 1.25-1.43x; Q8 T = 1
 * (new here; the AVX2 decode before) 1.10-1.17x, T = 2, 4 1.01-1.09x,
 * T = 8 1.23-1.39x.  At T = 1 the row-major layout costs an insert and
 * the nibble split per two (row, block) and the fold per 8: about the 8
 * lanes' convert and fma it saves, so repacked weights (the i9_blocksum
 * prototype's mode 2) are what would gain more there.  Tried and
 * dropped: the fold by packs_epi32 + madd (1-7% slower: the multiply
 * pipes carry the dot products; vphaddd slower still), two blocks a step
 * at T = 1 from one 32-byte load per row (2% slower: the lane shuffles
 * cost more than the inserts), an L1 prefetch (slower).
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

#define KN_AI __attribute__((always_inline)) static inline

#define DQ_R 8       /* rows per pass: the lanes */
#define DQ_PF 8      /* rows ahead for the L2 prefetch: the next pass */
#define DQ_MAXB 1024 /* blocks of the activation-sum table (cols <= 32768) */
#define DQ_MAXI 2048 /* token-blocks of the Q4S start table (32 KiB) */

/* v[i] = row i (8 floats) -> v[k] = element k of the 8 rows. */
KN_AI void dq_t8x8(__m256 v[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        v[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* p[m] = 4 dwords of row m (low 128 bits) and 4 of row m + 4 (high) ->
 * [row 0 .. 3 | row 4 .. 7] of their sums: unpack and add, twice (6
 * shuffles, 3 adds, no multiply: the multiply pipes are busy with the
 * dot products). */
KN_AI __m256i dq_fold4(const __m256i p[4])
{
    __m256i u01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
    __m256i u23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(u01, u23), _mm256_unpackhi_epi64(u01, u23));
}

/* sx[t * nb + b] = (float) the sum of token t's block b (int8). */
static void dq_xsums(const uint8_t *xq, size_t T, uint32_t nb, float *sx)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (size_t t = 0; t < T; t++)
        for (uint32_t b = 0; b < nb; b++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(xq + (t * nb + b) * KN_QK));
            /* sums of x + 128 over 8 bytes, in 4 qwords */
            __m256i s = _mm256_sad_epu8(_mm256_xor_si256(v, bias), _mm256_setzero_si256());
            __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi64(h, _mm_unpackhi_epi64(h, h));
            sx[t * nb + b] = (float)(_mm_cvtsi128_si32(h) - 128 * KN_QK);
        }
}

/* ---- int4, 1 <= TT <= 8 tokens -------------------------------------------- */

/* The 8 lanes of a pass: lane i reads weight row r + i * st (st = 1, or 0
 * for a matrix of fewer than 8 rows: then every lane reads row r and lane
 * 0 is stored), all blocks, TT tokens; Y[t][r + i] += lane i for the
 * lanes in store (a pass may start before the thread's first row: those
 * lanes are computed and not stored). */
KN_AI void dq4_pass(const kn_matrix *W, const uint8_t *xq, const float *xd,
                    const float *sx, const int32_t *ini, float *Y, uint32_t r,
                    uint32_t st, __mmask8 store, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t rb = kn_q4_row_bytes(W->cols), wst = rb * st;
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group), sst = ng * st;
    const int q4 = W->fmt == KN_W_Q4;
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    const uint16_t *s0 = (const uint16_t *)W->scales + (size_t)r * ng;
    const uint8_t *z0 = q4 ? W->zeros + (size_t)r * ng : NULL;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = _mm256_setzero_ps();
    for (uint32_t g0 = 0; g0 < ng; g0 += 8) {
        /* st[k], zt[k]: the 8 rows' scale and zero of group g0 + k */
        const __mmask8 gm = (__mmask8)(ng - g0 >= 8 ? 0xff : (1u << (ng - g0)) - 1);
        __m256 sc[8], zt[8];
        for (int i = 0; i < DQ_R; i++)
            sc[i] = _mm256_cvtph_ps(_mm_maskz_loadu_epi16(gm, s0 + (size_t)i * sst + g0));
        dq_t8x8(sc);
        if (q4) {
            for (int i = 0; i < DQ_R; i++)
                zt[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                    _mm_maskz_loadu_epi8(gm, z0 + (size_t)i * sst + g0)));
            dq_t8x8(zt);
        } else {
            for (int i = 0; i < DQ_R; i++)
                zt[i] = _mm256_set1_ps((float)KN_Q4_ZERO_SYM);
        }
        const uint32_t b1 = ((g0 + 8) << gsh) < nb ? (g0 + 8) << gsh : nb;
        for (uint32_t b = g0 << gsh; b < b1; b++) {
            const uint32_t k = (b >> gsh) - g0;
            if ((b & 3) == 0)
                for (int i = 0; i < DQ_R; i++)
                    _mm_prefetch((const char *)(w0 + (DQ_PF + i) * rb + (size_t)b * 16), _MM_HINT_T1);
            const uint8_t *wb = w0 + (size_t)b * 16;
            __m256i lo[4], hi[4];
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                __m256i raw = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(wb + m * wst))),
                    _mm_loadu_si128((const __m128i *)(wb + (m + 4) * wst)), 1);
                lo[m] = _mm256_and_si256(raw, m4);
                hi[m] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            }
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const uint8_t *xb = xq + ((size_t)t * nb + b) * KN_QK;
                const __m256i xe = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb));
                const __m256i xo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + 16)));
                __m256i p[4];
#pragma GCC unroll 4
                for (int m = 0; m < 4; m++)
                    p[m] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(
                                                   ini ? _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                                             (const __m128i *)(ini + 4 * ((size_t)t * nb + b))))
                                                       : _mm256_setzero_si256(),
                                                   lo[m], xe),
                                               hi[m], xo);
                __m256i s = dq_fold4(p);
                __m256 f = ini ? _mm256_cvtepi32_ps(s)
                               : _mm256_fnmadd_ps(zt[k], _mm256_set1_ps(sx[(size_t)t * nb + b]),
                                                  _mm256_cvtepi32_ps(s));
                acc[t] = _mm256_fmadd_ps(f, _mm256_mul_ps(sc[k], _mm256_set1_ps(xd[(size_t)t * nb + b])),
                                         acc[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float *y = Y + (size_t)t * rows + r;
        _mm256_mask_storeu_ps(y, store, _mm256_add_ps(_mm256_maskz_loadu_ps(store, y), acc[t]));
    }
}

/* Rows [r0, r1) in passes of 8.  A last pass of fewer rows starts at
 * min(r, rows - 8), inside the matrix, and stores only its own rows (it
 * reads rows of a neighbouring thread's range, which that thread writes
 * to Y, never to W); a matrix of fewer than 8 rows takes one row a pass. */
#define DQ_PASSES(call)                                                        \
    do {                                                                       \
        uint32_t r = r0;                                                       \
        for (; r + DQ_R <= r1; r += DQ_R) {                                    \
            const uint32_t rp = r, stp = 1;                                    \
            const __mmask8 sm = 0xff;                                          \
            call;                                                              \
        }                                                                      \
        if (r < r1 && W->rows >= DQ_R) {                                       \
            const uint32_t rp = r < W->rows - DQ_R ? r : W->rows - DQ_R;       \
            const uint32_t stp = 1;                                            \
            const __mmask8 sm = (__mmask8)(((1u << (r1 - rp)) - 1) &            \
                                           (0xffu << (r - rp)));                \
            call;                                                              \
        } else                                                                 \
            for (; r < r1; r++) {                                              \
                const uint32_t rp = r, stp = 0;                                \
                const __mmask8 sm = 1;                                         \
                call;                                                          \
            }                                                                  \
    } while (0)

/* One pass (dq4_pass) for a token count known at run time: one copy of
 * the pass per count, called from the three kinds of pass. */
static void dq4_pass_any(const kn_matrix *W, const uint8_t *xq, const float *xd,
                         const float *sx, const int32_t *ini, float *Y,
                         uint32_t r, uint32_t st, __mmask8 store, int TT)
{
#define DQ4(tt)                                                                \
    case tt:                                                                   \
        if (ini)                                                               \
            dq4_pass(W, xq, xd, NULL, ini, Y, r, st, store, tt);               \
        else                                                                   \
            dq4_pass(W, xq, xd, sx, NULL, Y, r, st, store, tt);                \
        break;
    switch (TT) {
        DQ4(1) DQ4(2) DQ4(3) DQ4(4) DQ4(5) DQ4(6) DQ4(7) default: DQ4(8)
    }
#undef DQ4
}

static void dq4_rows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                     const float *sx, const int32_t *ini, float *Y, uint32_t r0,
                     uint32_t r1, int TT)
{
    DQ_PASSES(dq4_pass_any(W, xq, xd, sx, ini, Y, rp, stp, sm, TT));
}

/* ---- int8, 2 <= TT <= 8 tokens -------------------------------------------- */

/* As dq4_pass: lane i = row r + i * st, stored where store says. */
KN_AI void dq8_pass(const kn_matrix *W, const uint8_t *xq, const float *xd,
                    float *Y, uint32_t r, uint32_t st, __mmask8 store, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t rb = W->cols;
    const size_t xs = (size_t)nb * 2 * KN_QK; /* bytes per token */
    const size_t wst = rb * st;
    const int8_t *w0 = (const int8_t *)W->data + (size_t)r * rb;
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        if ((b & 1) == 0)
            for (int i = 0; i < DQ_R; i++)
                _mm_prefetch((const char *)(w0 + (DQ_PF + i) * rb + (size_t)b * 32), _MM_HINT_T1);
        /* w[m][j]: columns 8j .. 8j+7 of rows m (low) and m + 4 (high) */
        __m256i w[4][4];
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const int8_t *pa = w0 + m * wst + (size_t)b * 32, *pb = pa + 4 * wst;
            __m256i a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)pa));
            __m256i a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(pa + 16)));
            __m256i c0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)pb));
            __m256i c1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(pb + 16)));
            w[m][0] = _mm256_permute2x128_si256(a0, c0, 0x20);
            w[m][1] = _mm256_permute2x128_si256(a0, c0, 0x31);
            w[m][2] = _mm256_permute2x128_si256(a1, c1, 0x20);
            w[m][3] = _mm256_permute2x128_si256(a1, c1, 0x31);
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const uint8_t *xb = xq + (size_t)t * xs + (size_t)b * 2 * KN_QK;
            __m256i x[4], p[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                x[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + 16 * j)));
#pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                __m256i s = _mm256_dpwssd_epi32(_mm256_setzero_si256(), w[m][0], x[0]);
                s = _mm256_dpwssd_epi32(s, w[m][1], x[1]);
                s = _mm256_dpwssd_epi32(s, w[m][2], x[2]);
                p[m] = _mm256_dpwssd_epi32(s, w[m][3], x[3]);
            }
            __m256i s = dq_fold4(p);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(xd[(size_t)t * nb + b]), acc[t]);
        }
    }
    const __m256 qs = _mm256_maskz_loadu_ps(store, (const float *)W->scales + r);
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float *y = Y + (size_t)t * rows + r;
        _mm256_mask_storeu_ps(y, store, _mm256_add_ps(_mm256_maskz_loadu_ps(store, y), _mm256_mul_ps(acc[t], qs)));
    }
}

static void dq8_pass_any(const kn_matrix *W, const uint8_t *xq, const float *xd,
                         float *Y, uint32_t r, uint32_t st, __mmask8 store, int TT)
{
#define DQ8(tt)                                                                \
    case tt: dq8_pass(W, xq, xd, Y, r, st, store, tt); break;
    switch (TT) {
        DQ8(1) DQ8(2) DQ8(3) DQ8(4) DQ8(5) DQ8(6) DQ8(7) default: DQ8(8)
    }
#undef DQ8
}

static void dq8_rows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                     float *Y, uint32_t r0, uint32_t r1, int TT)
{
    DQ_PASSES(dq8_pass_any(W, xq, xd, Y, rp, stp, sm, TT));
}

/* ---- int4-sym panels (KN_LAYOUT_P16), 1 <= TT <= 8 tokens ---------------- */

static inline int32_t dp_ld32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Panel p (rows 16p .. 16p+15 in the 16 lanes of a zmm), all blocks, TT
 * tokens, read as one stream: per group its 16 scales, per block 4 loads
 * of 16 rows x 4 code bytes split into 8 vectors of unsigned codes (low
 * nibbles: positions 4m .. 4m+3, high: 16 + 4m ..), 8 vpdpbusd per token
 * from ini = -8 x the token's block sum (so the sum is i_b itself), one
 * convert and one fma by scale x d: the GEMM's pg_micro on a panel that
 * needs no transpose, the reference's bits. */
KN_AI void dp16_panel(const kn_matrix *W, const uint8_t *xq, const float *xd,
                      const int32_t *ini, float *Y, uint32_t p, int TT)
{
    const uint32_t nb = W->cols / KN_QK, rows = W->rows, bpg = W->group / KN_QK;
    const uint64_t pb = kn_p16_panel_bytes(W->cols, W->group);
    const uint8_t *q = (const uint8_t *)W->data + (size_t)p * pb;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[8], sc = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        if (b % bpg == 0) {
            sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)q));
            q += 32;
        }
        /* 4 KiB ahead into L2, across into the next panel (a thread's
         * panels are one stream); prefetches never fault past the end.
         * 1 KiB into L1 measured no better at TinyLlama's widths. */
        _mm_prefetch((const char *)(q + 4096), _MM_HINT_T1);
        __m512i w[8];
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            __m512i o = _mm512_loadu_si512(q + 64 * m);
            w[m] = _mm512_and_si512(o, m4);
            w[m + 4] = _mm512_and_si512(_mm512_srli_epi32(o, 4), m4);
        }
        q += 256;
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const uint8_t *x = xq + ((size_t)t * nb + b) * KN_QK;
            __m512i sum = _mm512_set1_epi32(ini[(size_t)t * nb + b]);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                sum = _mm512_dpbusd_epi32(sum, w[k], _mm512_set1_epi32(dp_ld32(x + 4 * k)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                     _mm512_mul_ps(sc, _mm512_set1_ps(xd[(size_t)t * nb + b])),
                                     acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float *y = Y + (size_t)t * rows + 16 * (size_t)p;
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), acc[t]));
    }
}

static void dp16_panel_any(const kn_matrix *W, const uint8_t *xq, const float *xd,
                           const int32_t *ini, float *Y, uint32_t p, int TT)
{
#define DP16(tt) case tt: dp16_panel(W, xq, xd, ini, Y, p, tt); break;
    switch (TT) {
        DP16(1) DP16(2) DP16(3) DP16(4) DP16(5) DP16(6) DP16(7) default: DP16(8)
    }
#undef DP16
}

/* ---- int8 panels (KN_LAYOUT_P16), 1 <= TT <= 8 tokens -------------------- */

/* Panel p of a Q8 matrix (rows 16p .. 16p+15 in the lanes), all blocks, TT
 * tokens, one stream: per block 16 loads of 16 rows x 2 codes widened to
 * int16 (vpmovsxbw), each multiplied by the token's 2 int16 activations
 * of that column pair broadcast (vpdpwssd) into NC independent integer
 * chains (NC = 4 at T = 1, where the 16 products of a block would
 * otherwise wait on each other's latency), added exactly (|i_b| < 2^27);
 * then the reference's convert and fma by d, and the row scales at the
 * end: dq8_pass's bits, without its permutes and fold. */
KN_AI void dp8_panel(const kn_matrix *W, const uint8_t *xq, const float *xd,
                     float *Y, uint32_t p, int TT)
{
    enum { NC_MAX = 4 };
    const int NC = TT == 1 ? 4 : TT == 2 ? 2 : 1;
    const uint32_t nb = W->cols / KN_QK, rows = W->rows;
    const size_t xs = (size_t)nb * 2 * KN_QK; /* activation bytes per token */
    const uint8_t *q = (const uint8_t *)W->data + (size_t)p * kn_p16_q8_panel_bytes(W->cols);
    const __m512 rs = _mm512_loadu_ps(q);
    q += 64;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++)
        acc[t] = _mm512_setzero_ps();
    for (uint32_t b = 0; b < nb; b++, q += 512) {
        /* 4 KiB ahead into L2, as dp16_panel: one line per 256 bytes */
        _mm_prefetch((const char *)(q + 4096), _MM_HINT_T1);
        _mm_prefetch((const char *)(q + 4096 + 256), _MM_HINT_T1);
        __m512i s[8][NC_MAX];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                s[t][c] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) {
            const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * k)));
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                const uint8_t *x = xq + (size_t)t * xs + (size_t)b * 2 * KN_QK;
                s[t][k % NC] = _mm512_dpwssd_epi32(s[t][k % NC], w,
                                                   _mm512_set1_epi32(dp_ld32(x + 4 * k)));
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m512i i_b = s[t][0];
#pragma GCC unroll 4
            for (int c = 1; c < NC; c++)
                i_b = _mm512_add_epi32(i_b, s[t][c]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i_b),
                                     _mm512_set1_ps(xd[(size_t)t * nb + b]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float *y = Y + (size_t)t * rows + 16 * (size_t)p;
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_mul_ps(acc[t], rs)));
    }
}

static void dp8_panel_any(const kn_matrix *W, const uint8_t *xq, const float *xd,
                          float *Y, uint32_t p, int TT)
{
#define DP8(tt) case tt: dp8_panel(W, xq, xd, Y, p, tt); break;
    switch (TT) {
        DP8(1) DP8(2) DP8(3) DP8(4) DP8(5) DP8(6) DP8(7) default: DP8(8)
    }
#undef DP8
}

#define DP16_MAXI 8192 /* token-blocks of the panel kernel's start table */

int kn_avx512_matmul_q_dec_ok(const kn_matrix *W, size_t T)
{
    if (W->layout == KN_LAYOUT_P16)
        return T >= 1 && T <= 8 && (W->fmt == KN_W_Q8 || T * (W->cols / KN_QK) <= DP16_MAXI);
    return T >= 1 && T <= 8 && W->cols % KN_QK == 0 &&
           (((W->fmt == KN_W_Q4 || W->fmt == KN_W_Q4S) && W->cols / KN_QK <= DQ_MAXB) ||
            W->fmt == KN_W_Q8);
}

void kn_avx512_matmul_q_dec(const kn_matrix *W, const void *xq, const float *xd,
                            size_t T, float *Y, uint32_t r0, uint32_t r1)
{
    if (W->layout == KN_LAYOUT_P16 && (r0 % 16 || r1 % 16)) {
        kn_ref_matmul_q_rows(W, xq, xd, T, Y, r0, r1); /* not kn_task_rows' */
        return;
    }
    if (W->layout == KN_LAYOUT_P16 && W->fmt == KN_W_Q8) {
        for (uint32_t p = r0 / 16; p < r1 / 16; p++)
            dp8_panel_any(W, xq, xd, Y, p, (int)T);
        return;
    }
    if (W->layout == KN_LAYOUT_P16) {
        /* r0, r1: multiples of 16 (kn_task_rows; rows % 16 == 0) */
        const uint32_t nb = W->cols / KN_QK;
        _Alignas(64) int32_t ini[DP16_MAXI];
        const __m256i ones = _mm256_set1_epi8(1);
        for (size_t i = 0; i < T * nb; i++) {
            __m256i v = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones,
                                            _mm256_loadu_si256((const __m256i *)((const uint8_t *)xq + i * KN_QK)));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            ini[i] = -KN_Q4_ZERO_SYM * _mm_cvtsi128_si32(h);
        }
        for (uint32_t p = r0 / 16; p < r1 / 16; p++)
            dp16_panel_any(W, xq, xd, ini, Y, p, (int)T);
        return;
    }
    if (W->fmt == KN_W_Q8) {
        dq8_rows(W, xq, xd, Y, r0, r1, (int)T);
        return;
    }
    const uint32_t nb = W->cols / KN_QK;
    /* one 32 KiB stack table: Q4S's start values (4 dwords per token and
     * block) or the activation sums (one float per token and block) */
    union {
        _Alignas(16) int32_t ini[4 * DQ_MAXI];
        float sx[8 * DQ_MAXB];
    } tab;
    _Static_assert(sizeof tab.ini == sizeof tab.sx, "one table, two uses");
    if (W->fmt == KN_W_Q4S && T * nb <= DQ_MAXI) {
        /* the dot products start from -8 x the activations' dword sums:
         * the fold then gives i_b itself */
        const __m128i ones = _mm_set1_epi8(1);
        const uint8_t *x = xq;
        for (size_t b = 0; b < T * nb; b++) {
            __m128i v = _mm_dpbusd_epi32(_mm_setzero_si128(), ones,
                                         _mm_loadu_si128((const __m128i *)(x + b * KN_QK)));
            v = _mm_dpbusd_epi32(v, ones, _mm_loadu_si128((const __m128i *)(x + b * KN_QK + 16)));
            _mm_store_si128((__m128i *)(tab.ini + 4 * b), _mm_sub_epi32(_mm_setzero_si128(), _mm_slli_epi32(v, 3)));
        }
        dq4_rows(W, xq, xd, NULL, tab.ini, Y, r0, r1, (int)T);
        return;
    }
    float *sx = tab.sx;
    dq_xsums(xq, T, nb, sx);
    dq4_rows(W, xq, xd, sx, NULL, Y, r0, r1, (int)T);
}

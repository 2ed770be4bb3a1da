/*
 * kn_qdot_avx2.c - AVX2 integer dot products (kn_qdot.h), compiled with
 * -mavx2 -mfma -mf16c and called only when kn_cpu_has_avx2(): the
 * activation quantization (kn_avx2_qact_quantize_row, the same bytes as
 * the scalar one) and kn_avx2_matmul_q_rows, which kn_matmul_q runs for
 * T <= 8 tokens on AVX2-only machines, and with AVX-512 for what the
 * VNNI decode does not take (int8 at T = 1, ragged rows).
 *
 * The product follows kn_qdot.h's block sums with 8 weight rows in the
 * 8 lanes (a pass; the rows of a thread's range in passes of 8, the last
 * pass moved back to end at the matrix's last row and only its own lanes
 * stored).  Per 32-column block and token:
 *   int4 (Q4, Q4S): two rows' 16 code bytes in the two halves of one
 *     register (rows j and j + 4); and 0x0f gives their even columns,
 *     shift-and-and the odd ones, in the activations' nibble order, so
 *     maddubs(codes, x) against x's even (odd) half broadcast to both
 *     halves needs no shuffle.  The codes stay unsigned: per lane 4
 *     products c * x, |.| <= 7680 (maddubs cannot saturate, and the
 *     code -128 of a non-finite input is no special case).  Two
 *     unpack-and-add levels in int16 (sums of 16 products, <= 30720),
 *     one shuffle that puts a row's two halves side by side and one
 *     madd give A = the 8 rows' exact sums of c * x; then
 *     f = A - zero * S in float (S = the block's sum of x, per token and
 *     block, computed once per call when it fits): every term is an
 *     integer below 2^24, so f == (float)i_b exactly.  T = 2 unpacks
 *     each pair's codes once for both tokens; T > 2 a 16-block
 *     sub-chunk of the 8 rows into L1 once for all the tokens.
 *   int8 (Q8): per row madd of the widened bytes against the int16
 *     activations (8 int32 lanes), then an unpack-and-add tree to the 8
 *     exact int32 row sums and one cvt, the same round-to-nearest-even
 *     as the reference's (float)i_b.  T = 2 widens each row once for
 *     both tokens (rows 0-3 of the two tokens in one tree's lanes, then
 *     rows 4-7); T > 2 widens a 16-block sub-chunk of the 8 rows into L1
 *     once, rows j and j + 4 in the two 128-bit lanes against x's
 *     8-column groups broadcast by loads (no x shuffle, no cross-lane
 *     step in the tree).
 *   then acc = fma(f, s_b, acc) for the 8 rows at once, s_b = the f16
 *     scales of the 8 rows (transposed per 64-block chunk; F16C's
 *     conversion is exact) times d[b]: kn_qdot_scale's one multiply.
 * At the end Q8 multiplies by the row scales and Y += acc: Y held the
 * bias, and bias + y is the reference's sum.  The ragged last block of
 * a row goes through the scalar lanes helper, matrices of fewer than 8
 * rows through a scalar loop: the reference's arithmetic, bit for bit.
 *
 * Why rows in the lanes: the former kernels kept 8 float lanes per
 * (row, token) and paid a cvt and an fma per row, token and block (and
 * would now need a horizontal sum per block); here one cvt and one fma
 * serve 8 rows.  hadd is no option on Zen 4 (measured 2 cycles per
 * vphaddd/vphaddw ymm against 0.3 for vpaddd and 0.5 for vpunpck*); a
 * blend-based int32 tree (fewer shuffles, more µops) measured 7 % slower
 * for int8 than the unpack tree.  Measured against the former kernels
 * (1 thread, CPU time, TinyLlama and SmolLM shapes; docs/benchmarks.md
 * "i10_d2"): int4 T = 1 1.23-1.46x, T = 2 1.77-1.93x, T = 4
 * 1.49-1.59x, T = 8 1.73-1.87x; int8 T = 1 1.15-1.21x, T = 2
 * 1.01-1.11x, T = 4 0.97-1.13x (0.97 on the 2048-column matrices: the
 * exact reduction costs more than the former cvt + fma, and 4 tokens
 * amortize the widening little), T = 8 1.11-1.38x.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"
#include "kn_qdot.h"

#define KN_AI __attribute__((always_inline)) static inline

void kn_avx2_qact_quantize_row(const float *x, uint32_t cols, int i16,
                               void *q, float *d)
{
    uint32_t nfull = cols / KN_QK;
    size_t qb = i16 ? 2 * KN_QK : KN_QK;
    float qmax = i16 ? 32767.0f : 127.0f;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i nib = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
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
            /* column order, then the nibble order: each half's even
             * columns before its odd ones, then the halves' evens first */
            __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, c), perm);
            p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p, nib), 0xd8);
            _mm256_storeu_si256((__m256i *)qo, p);
        }
        d[b] = db;
    }
    if (nfull * KN_QK < cols)
        kn_qact_block(x + (size_t)nfull * KN_QK, cols - nfull * KN_QK, i16,
                      (uint8_t *)q + (size_t)nfull * qb, d + nfull);
}

/* ---- the product: block sums with 8 weight rows in the lanes ----------- */

/* Blocks per chunk: the tables below cover a chunk, and for T > 1 the
 * chunk's 8 weight rows (8 KiB int4, 16 KiB int8) stay in L1 while the
 * tokens go by. */
#define KN_D2_CB 64
/* x sums of a whole call kept when T * blocks fit (floats, 16 KiB). */
#define KN_D2_SCAP 4096
/* Blocks of the 8 rows unpacked or widened at a time for T > KN_D2_WT
 * (int8: 8 KiB, int4: 4 KiB). */
#define KN_D2_WB 16
/* Above this many tokens the weights of a sub-chunk are unpacked (int4)
 * or widened (int8) once for all of them (at T = 2 it measured even). */
#define KN_D2_WT 2
/* Rows ahead the weights are prefetched (into L2): the next pass. */
#define KN_PF_ROWS 8

/* Into L2, as kn_ops_avx2.c's decode prefetch (which says why). */
KN_AI void pf_row(const uint8_t *p)
{
    _mm_prefetch((const char *)p, _MM_HINT_T1);
}

/* The line at p of 8 rows rb bytes apart (the next pass's rows). */
KN_AI void d2_pf8(const uint8_t *p, size_t rb)
{
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        pf_row(p + (size_t)i * rb);
}

/* Int4 block b of rows j (lane 0) and j + 4 (lane 1) against one
 * activation block split into xe (positions 0-15, the even columns) and
 * xo (16-31, the odd ones), both broadcast to the two lanes: the codes
 * unsigned (the low nibbles are the even columns, kn_quant.h), so each
 * of the 8 int16 per lane is a sum of 4 products c * x, |.| <= 7680
 * (maddubs cannot saturate: a pair is at most 2 * 15 * 128). */
KN_AI void d2_q4codes(const uint8_t *a, const uint8_t *b, __m256i *lo, __m256i *hi)
{
    const __m256i m = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
        _mm_loadu_si128((const __m128i *)b), 1);
    *lo = _mm256_and_si256(v, m);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
}

KN_AI __m256i d2_q4prod(__m256i lo, __m256i hi, __m256i xe, __m256i xo)
{
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
}

KN_AI __m256i d2_q4pair(const uint8_t *a, const uint8_t *b, __m256i xe, __m256i xo)
{
    __m256i lo, hi;
    d2_q4codes(a, b, &lo, &hi);
    return d2_q4prod(lo, hi, xe, xo);
}

/* The 8 row sums (int32, rows 0..7 in order) of d2_q4pair's p0 (rows 0,
 * 4), p1 (1, 5), p2 (2, 6), p3 (3, 7): two unpack-and-add levels on
 * int16 pairs (sums of 8, then 16 products: |.| <= 30720, no overflow)
 * that leave each row's two partials side by side, and one madd to
 * int32. */
KN_AI __m256i d2_tree16(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    /* lane 0: rows 0 0 1 1 0 0 1 1, lane 1: rows 4 4 5 5 ... */
    __m256i w0 = _mm256_add_epi16(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    /* lane 0: rows 2 2 3 3 ..., lane 1: rows 6 6 7 7 ... */
    __m256i w1 = _mm256_add_epi16(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    /* lane 0: rows 0 0 1 1 2 2 3 3, lane 1: rows 4 4 5 5 6 6 7 7 */
    __m256i x = _mm256_add_epi16(_mm256_unpacklo_epi64(w0, w1), _mm256_unpackhi_epi64(w0, w1));
    return _mm256_madd_epi16(x, _mm256_set1_epi16(1));
}

/* The 8 sums of m[i]'s 8 int32 lanes, in order (exact: kn_qdot.h bounds
 * a block's sum by 2^27). */
KN_AI __m256i d2_tree32(const __m256i m[8])
{
    __m256i a01 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[0], m[1]), _mm256_unpackhi_epi32(m[0], m[1]));
    __m256i a23 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[2], m[3]), _mm256_unpackhi_epi32(m[2], m[3]));
    __m256i a45 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[4], m[5]), _mm256_unpackhi_epi32(m[4], m[5]));
    __m256i a67 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[6], m[7]), _mm256_unpackhi_epi32(m[6], m[7]));
    /* per lane: 0 1 2 3 and 4 5 6 7, each half a row's partial */
    __m256i b0 = _mm256_add_epi32(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
    __m256i b1 = _mm256_add_epi32(_mm256_unpacklo_epi64(a45, a67), _mm256_unpackhi_epi64(a45, a67));
    return _mm256_add_epi32(_mm256_blend_epi32(b0, b1, 0xf0), _mm256_permute2x128_si256(b0, b1, 0x21));
}

/* Q8 block of row w (32 int8) against int16 activations xl (columns
 * 0-15), xh (16-31): 8 int32 lanes of 4 products each. */
KN_AI __m256i d2_q8row(const uint8_t *w, __m256i xl, __m256i xh)
{
    __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
    __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, xl), _mm256_madd_epi16(hi, xh));
}

/* 8 rows of 8 floats transposed in place. */
KN_AI void d2_tr8(__m256 r[8])
{
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* rows 0-3, rows 4-7 */
        u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xee);
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* A chunk's per-group parameters of the pass's 8 rows, rows in the
 * lanes: sc[j][i] = f16 scale of group gA + j of row i as a float (the
 * F16C conversion is exact, so sc * d is kn_qdot_scale's product),
 * zf[j][i] its zero as a float (Q4). */
typedef struct d2_tab {
    _Alignas(32) float sc[KN_D2_CB][8];
    _Alignas(32) float zf[KN_D2_CB][8];
} d2_tab;

/* Groups [gA, gA + n) of the 8 rows with scales s0 + i * ng, zeros
 * z0 + i * ng (NULL: Q4S) into T. */
KN_AI void d2_tab_fill(d2_tab *T, const uint16_t *s0, const uint8_t *z0,
                       size_t ng, uint32_t gA, uint32_t n)
{
    uint32_t j = 0;
    for (; j + 8 <= n; j += 8) { /* 8 groups: a transpose */
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            r[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s0 + (size_t)i * ng + gA + j)));
        d2_tr8(r);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            _mm256_store_ps(T->sc[j + (uint32_t)i], r[i]);
        if (!z0)
            continue;
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            r[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                _mm_loadl_epi64((const __m128i *)(z0 + (size_t)i * ng + gA + j))));
        d2_tr8(r);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            _mm256_store_ps(T->zf[j + (uint32_t)i], r[i]);
    }
    for (; j < n; j++)
        for (int i = 0; i < 8; i++) {
            T->sc[j][i] = _cvtsh_ss(s0[(size_t)i * ng + gA + j]);
            if (z0)
                T->zf[j][i] = (float)z0[(size_t)i * ng + gA + j];
        }
}

/* S[k] = sum of the 32 int8 activations of block k, k < n (x: block 0),
 * as floats (exact: |S| <= 4096). */
KN_AI void d2_xsums(const uint8_t *x, uint32_t n, float *S)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    uint32_t k = 0;
    for (; k + 8 <= n; k += 8) {
        __m256i m[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            m[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(
                ones8, _mm256_loadu_si256((const __m256i *)(x + (size_t)(k + (uint32_t)i) * 32))), ones16);
        _mm256_storeu_ps(S + k, _mm256_cvtepi32_ps(d2_tree32(m)));
    }
    for (; k < n; k++) {
        int s = 0;
        for (int i = 0; i < 32; i++)
            s += ((const int8_t *)x)[(size_t)k * 32 + (size_t)i];
        S[k] = (float)s;
    }
}

/* One pass: rows p .. p+7 (all in the matrix) for T <= 8 tokens, adding
 * lanes [lo, hi) into Y (the others are a neighbour's rows, computed and
 * dropped).  Per block and token, kn_qdot.h's arithmetic with rows in the
 * lanes: A = the 8 exact integer sums of c * x (c the stored code; Q8:
 * w * x); Q4/Q4S f = A - zero * S with S = the block's sum of x, in
 * float: every term is an integer below 2^24, so f == (float)i_b
 * exactly (and the code -128 of a non-finite input is no special case);
 * Q8 f = cvt(A), the same rounding as the reference's (float)i_b; then
 * acc = fma(f, s_b, acc), s_b = scale * d (one multiply).  Sall: the x
 * sums of the call ([T][nb], Q4) or NULL (then per chunk). */
KN_AI void d2_pass(const kn_matrix *W, const uint8_t *xq, const float *xd,
                   size_t T, float *Y, uint32_t p, uint32_t lo, uint32_t hi,
                   int fmt, const float *Sall)
{
    const uint32_t nb = W->cols / KN_QK, nbt = kn_qact_blocks(W->cols);
    const size_t rb = fmt == KN_W_Q8 ? W->cols : kn_q4_row_bytes(W->cols);
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xs = (size_t)nbt * qb;            /* activation bytes per token */
    const size_t bs = fmt == KN_W_Q8 ? 32 : 16;    /* weight bytes per block */
    const uint32_t lmask = fmt == KN_W_Q8 ? 1 : 3; /* blocks per line - 1 */
    const int gsh = fmt == KN_W_Q8 ? 0 : __builtin_ctz(W->group) - 5;
    const size_t ng = fmt == KN_W_Q8 ? 0 : kn_q4_ngroups(W->cols, W->group);
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)p * rb;
    const uint8_t *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
    const size_t r4 = 4 * rb, pf = KN_PF_ROWS * rb;
    const uint16_t *s0 = fmt == KN_W_Q8 ? NULL : (const uint16_t *)W->scales + (size_t)p * ng;
    const uint8_t *z0 = fmt == KN_W_Q4 ? W->zeros + (size_t)p * ng : NULL;
    d2_tab tab;
    _Alignas(32) float Sc[8][KN_D2_CB];
    __m256i cb[KN_D2_WB][8]; /* int4 T > 2: codes of pairs j (lo, hi) */
    __m256 acc[8];
    for (size_t t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    if (fmt == KN_W_Q8 && T == 2) {
        /* both tokens from each widened row: rows 0-3 of tokens 0 and 1
         * in the lanes of one tree, then rows 4-7 */
        __m256 ah[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (uint32_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * 32;
            if ((b & 1) == 0) {
                d2_pf8(w0 + o + pf, rb);
            }
            const __m256i *x0 = (const __m256i *)(xq + (size_t)b * qb);
            const __m256i *x1 = (const __m256i *)(xq + xs + (size_t)b * qb);
            __m256i xl0 = _mm256_loadu_si256(x0), xh0 = _mm256_loadu_si256(x0 + 1);
            __m256i xl1 = _mm256_loadu_si256(x1), xh1 = _mm256_loadu_si256(x1 + 1);
            __m256 s = _mm256_blend_ps(_mm256_broadcast_ss(xd + b),
                                       _mm256_broadcast_ss(xd + nbt + b), 0xf0);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i m[8];
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const uint8_t *w = w0 + (size_t)(4 * h + i) * rb + o;
                    __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
                    __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
                    m[i] = _mm256_add_epi32(_mm256_madd_epi16(lo, xl0), _mm256_madd_epi16(hi, xh0));
                    m[4 + i] = _mm256_add_epi32(_mm256_madd_epi16(lo, xl1), _mm256_madd_epi16(hi, xh1));
                }
                ah[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d2_tree32(m)), s, ah[h]);
            }
        }
        acc[0] = _mm256_permute2f128_ps(ah[0], ah[1], 0x20);
        acc[1] = _mm256_permute2f128_ps(ah[0], ah[1], 0x31);
    } else if (fmt == KN_W_Q8 && T > KN_D2_WT) { /* widened once, for all the tokens */
        /* wb[k][j][q]: columns 8q .. 8q+7 of rows j (lane 0) and j + 4
         * (lane 1), int16, against x's columns 8q .. 8q+7 broadcast to
         * both lanes (a load, no shuffle) */
        _Alignas(32) int16_t wb[KN_D2_WB][4][4][16];
        for (uint32_t b0 = 0; b0 < nb; b0 += KN_D2_WB) {
            const uint32_t n = nb - b0 < KN_D2_WB ? nb - b0 : KN_D2_WB;
            for (uint32_t k = 0; k < n; k++) {
                const size_t o = (size_t)(b0 + k) * 32;
                if (((b0 + k) & 1) == 0) {
                    d2_pf8(w0 + o + pf, rb);
                }
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const uint8_t *w = w0 + (size_t)j * rb + o;
                    __m256i va = _mm256_loadu_si256((const __m256i *)w);
                    __m256i vb = _mm256_loadu_si256((const __m256i *)(w + r4));
                    __m256i t0 = _mm256_unpacklo_epi64(va, vb), t1 = _mm256_unpackhi_epi64(va, vb);
                    __m256i *d = (__m256i *)wb[k][j];
                    _mm256_store_si256(d, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(t0)));
                    _mm256_store_si256(d + 1, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(t1)));
                    _mm256_store_si256(d + 2, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t0, 1)));
                    _mm256_store_si256(d + 3, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t1, 1)));
                }
            }
            for (size_t t = 0; t < T; t++) {
                const uint8_t *xt = xq + t * xs;
                const float *dt = xd + t * nbt;
                __m256 a = acc[t];
                for (uint32_t k = 0; k < n; k++) {
                    const __m128i *xp = (const __m128i *)(xt + (size_t)(b0 + k) * qb);
                    __m256i x[4];
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        x[q] = _mm256_broadcastsi128_si256(_mm_loadu_si128(xp + q));
                    __m256i pr[4];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) {
                        const __m256i *wv = (const __m256i *)wb[k][j];
                        pr[j] = _mm256_add_epi32(
                            _mm256_add_epi32(_mm256_madd_epi16(_mm256_load_si256(wv), x[0]),
                                             _mm256_madd_epi16(_mm256_load_si256(wv + 1), x[1])),
                            _mm256_add_epi32(_mm256_madd_epi16(_mm256_load_si256(wv + 2), x[2]),
                                             _mm256_madd_epi16(_mm256_load_si256(wv + 3), x[3])));
                    }
                    /* lanes: rows 0 1 0 1 | 4 5 4 5, then 2 3 2 3 | 6 7 6 7 */
                    __m256i u = _mm256_add_epi32(_mm256_unpacklo_epi32(pr[0], pr[1]),
                                                 _mm256_unpackhi_epi32(pr[0], pr[1]));
                    __m256i v = _mm256_add_epi32(_mm256_unpacklo_epi32(pr[2], pr[3]),
                                                 _mm256_unpackhi_epi32(pr[2], pr[3]));
                    __m256i A = _mm256_add_epi32(_mm256_unpacklo_epi64(u, v), _mm256_unpackhi_epi64(u, v));
                    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A), _mm256_broadcast_ss(dt + b0 + k), a);
                }
                acc[t] = a;
            }
        }
    }
    for (uint32_t b0 = 0; b0 < nb && !(fmt == KN_W_Q8 && T > 1); b0 += KN_D2_CB) {
        const uint32_t n = nb - b0 < KN_D2_CB ? nb - b0 : KN_D2_CB;
        const uint32_t gA = b0 >> gsh;
        if (fmt != KN_W_Q8) {
            d2_tab_fill(&tab, s0, z0, ng, gA, ((b0 + n - 1) >> gsh) - gA + 1);
            if (!Sall)
                for (size_t t = 0; t < T; t++)
                    d2_xsums(xq + t * xs + (size_t)b0 * qb, n, Sc[t]);
        }
        if (fmt != KN_W_Q8 && T == 2) { /* each pair's codes for both tokens */
            const float *S0 = Sall ? Sall + b0 : Sc[0], *S1 = Sall ? Sall + nb + b0 : Sc[1];
            __m256 a0 = acc[0], a1 = acc[1];
            for (uint32_t k = 0; k < n; k++) {
                const uint32_t b = b0 + k;
                const size_t o = (size_t)b * bs;
                if ((b & lmask) == 0) {
                    d2_pf8(w0 + o + pf, rb);
                }
                const uint8_t *xb0 = xq + (size_t)b * qb, *xb1 = xb0 + xs;
                __m256i xe0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb0));
                __m256i xo0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb0 + 16)));
                __m256i xe1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb1));
                __m256i xo1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb1 + 16)));
                __m256i p0[4], p1[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m256i lo, hi;
                    const uint8_t *w = w0 + (size_t)j * rb + o;
                    d2_q4codes(w, w + r4, &lo, &hi);
                    p0[j] = d2_q4prod(lo, hi, xe0, xo0);
                    p1[j] = d2_q4prod(lo, hi, xe1, xo1);
                }
                const uint32_t j = (b >> gsh) - gA;
                __m256 z = fmt == KN_W_Q4 ? _mm256_load_ps(tab.zf[j])
                                          : _mm256_set1_ps((float)KN_Q4_ZERO_SYM);
                __m256 sc = _mm256_load_ps(tab.sc[j]);
                __m256 f0 = _mm256_fnmadd_ps(z, _mm256_broadcast_ss(S0 + k),
                                             _mm256_cvtepi32_ps(d2_tree16(p0[0], p0[1], p0[2], p0[3])));
                __m256 f1 = _mm256_fnmadd_ps(z, _mm256_broadcast_ss(S1 + k),
                                             _mm256_cvtepi32_ps(d2_tree16(p1[0], p1[1], p1[2], p1[3])));
                a0 = _mm256_fmadd_ps(f0, _mm256_mul_ps(sc, _mm256_broadcast_ss(xd + b)), a0);
                a1 = _mm256_fmadd_ps(f1, _mm256_mul_ps(sc, _mm256_broadcast_ss(xd + nbt + b)), a1);
            }
            acc[0] = a0, acc[1] = a1;
            continue;
        }
        /* int4, T > 2: the codes unpacked once per sub-chunk, for all the tokens */
        const int buf = fmt != KN_W_Q8 && T > KN_D2_WT;
        const uint32_t sub = buf ? KN_D2_WB : n;
        for (uint32_t k0 = 0; k0 < n; k0 += sub) {
            const uint32_t k1 = n - k0 < sub ? n : k0 + sub;
            if (buf)
                for (uint32_t k = k0; k < k1; k++) {
                    const size_t o = (size_t)(b0 + k) * bs;
                    if (((b0 + k) & lmask) == 0) {
                        d2_pf8(w0 + o + pf, rb);
                    }
                    d2_q4codes(w0 + o, w0 + o + r4, &cb[k - k0][0], &cb[k - k0][1]);
                    d2_q4codes(w1 + o, w1 + o + r4, &cb[k - k0][2], &cb[k - k0][3]);
                    d2_q4codes(w2 + o, w2 + o + r4, &cb[k - k0][4], &cb[k - k0][5]);
                    d2_q4codes(w3 + o, w3 + o + r4, &cb[k - k0][6], &cb[k - k0][7]);
                }
            for (size_t t = 0; t < T; t++) {
                const uint8_t *xt = xq + t * xs;
                const float *dt = xd + t * nbt;
                const float *St = Sall ? Sall + t * nb + b0 : Sc[t];
                __m256 a = acc[t];
                for (uint32_t k = k0; k < k1; k++) {
                    const uint32_t b = b0 + k;
                    const size_t o = (size_t)b * bs;
                    if (!buf && t == 0 && (b & lmask) == 0) {
                        d2_pf8(w0 + o + pf, rb);
                    }
                    const uint8_t *xb = xt + (size_t)b * qb;
                    __m256 f, s;
                    if (fmt == KN_W_Q8) {
                        __m256i xl = _mm256_loadu_si256((const __m256i *)xb);
                        __m256i xh = _mm256_loadu_si256((const __m256i *)xb + 1);
                        __m256i m[8];
                        m[0] = d2_q8row(w0 + o, xl, xh);
                        m[1] = d2_q8row(w1 + o, xl, xh);
                        m[2] = d2_q8row(w2 + o, xl, xh);
                        m[3] = d2_q8row(w3 + o, xl, xh);
                        m[4] = d2_q8row(w0 + o + r4, xl, xh);
                        m[5] = d2_q8row(w1 + o + r4, xl, xh);
                        m[6] = d2_q8row(w2 + o + r4, xl, xh);
                        m[7] = d2_q8row(w3 + o + r4, xl, xh);
                        f = _mm256_cvtepi32_ps(d2_tree32(m));
                        s = _mm256_broadcast_ss(dt + b);
                    } else {
                        __m256i xe = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb));
                        __m256i xo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb + 16)));
                        __m256i A;
                        if (buf) {
                            const __m256i *c = cb[k - k0];
                            A = d2_tree16(d2_q4prod(c[0], c[1], xe, xo), d2_q4prod(c[2], c[3], xe, xo),
                                          d2_q4prod(c[4], c[5], xe, xo), d2_q4prod(c[6], c[7], xe, xo));
                        } else {
                            A = d2_tree16(d2_q4pair(w0 + o, w0 + o + r4, xe, xo),
                                          d2_q4pair(w1 + o, w1 + o + r4, xe, xo),
                                          d2_q4pair(w2 + o, w2 + o + r4, xe, xo),
                                          d2_q4pair(w3 + o, w3 + o + r4, xe, xo));
                        }
                        const uint32_t j = (b >> gsh) - gA;
                        __m256 z = fmt == KN_W_Q4 ? _mm256_load_ps(tab.zf[j])
                                                  : _mm256_set1_ps((float)KN_Q4_ZERO_SYM);
                        f = _mm256_fnmadd_ps(z, _mm256_broadcast_ss(St + k), _mm256_cvtepi32_ps(A));
                        s = _mm256_mul_ps(_mm256_load_ps(tab.sc[j]), _mm256_broadcast_ss(dt + b));
                    }
                    a = _mm256_fmadd_ps(f, s, a);
                }
                acc[t] = a;
            }
        }
    }
    if (nbt > nb) /* the ragged last block: the scalar lanes */
        for (size_t t = 0; t < T; t++) {
            _Alignas(32) int32_t ib[8];
            _Alignas(32) float sb[8];
            for (uint32_t i = 0; i < 8; i++) {
                int32_t lane[8];
                kn_qdot_lanes(W, p + i, nb, xq + t * xs + (size_t)nb * qb, lane);
                ib[i] = lane[0] + lane[1] + lane[2] + lane[3] + lane[4] + lane[5] + lane[6] + lane[7];
                sb[i] = kn_qdot_scale(W, p + i, nb, xd[t * nbt + nb]);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)ib)),
                                     _mm256_load_ps(sb), acc[t]);
        }
    for (size_t t = 0; t < T; t++) {
        _Alignas(32) float y[8];
        __m256 v = acc[t];
        if (fmt == KN_W_Q8)
            v = _mm256_mul_ps(v, _mm256_loadu_ps((const float *)W->scales + p));
        _mm256_store_ps(y, v);
        float *yt = Y + t * W->rows + p;
        for (uint32_t i = lo; i < hi; i++)
            yt[i] += y[i];
    }
}

/* Rows [r0, r1) of T <= 8 tokens, passes of 8 rows (W->rows >= 8). */
KN_AI void d2_rows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                   size_t T, float *Y, uint32_t r0, uint32_t r1, int fmt)
{
    const uint32_t nb = W->cols / KN_QK, nbt = kn_qact_blocks(W->cols);
    float Sall[KN_D2_SCAP];
    const int whole = fmt != KN_W_Q8 && T * nb <= KN_D2_SCAP;
    if (whole)
        for (size_t t = 0; t < T; t++)
            d2_xsums(xq + t * (size_t)nbt * KN_QK, nb, Sall + t * nb);
    for (uint32_t r = r0; r < r1; r += 8) {
        uint32_t p = r + 8 <= W->rows ? r : W->rows - 8;
        uint32_t hi = (r1 < p + 8 ? r1 : p + 8) - p;
        d2_pass(W, xq, xd, T, Y, p, r - p, hi, fmt, whole ? Sall : NULL);
    }
}

void kn_avx2_matmul_q_rows(const kn_matrix *W, const void *xq,
                           const float *xd, size_t T, float *Y, uint32_t r0,
                           uint32_t r1)
{
    const uint32_t nbt = kn_qact_blocks(W->cols);
    const size_t xs = (size_t)nbt * (W->fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK);
    const uint8_t *q = xq;
    if (W->rows < 8) {
        kn_ref_matmul_q_rows(W, q, xd, T, Y, r0, r1);
        return;
    }
    for (size_t t0 = 0; t0 < T; t0 += 8) { /* 8 tokens at a time */
        size_t n = T - t0 < 8 ? T - t0 : 8;
        const uint8_t *qt = q + t0 * xs;
        const float *dt = xd + t0 * nbt;
        float *yt = Y + t0 * W->rows;
        switch (W->fmt) {
        case KN_W_Q8: d2_rows(W, qt, dt, n, yt, r0, r1, KN_W_Q8); break;
        case KN_W_Q4: d2_rows(W, qt, dt, n, yt, r0, r1, KN_W_Q4); break;
        default: d2_rows(W, qt, dt, n, yt, r0, r1, KN_W_Q4S); break;
        }
    }
}

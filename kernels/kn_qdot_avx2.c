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

/* The 32 int4 codes of block b of a row minus the zero, as signed bytes
 * in the activations' nibble order (kn_avx2_q4_codes). */
KN_AI __m256i load_w4(const uint8_t *row, uint32_t b, int z)
{
    return _mm256_sub_epi8(kn_avx2_q4_codes(row + (size_t)b * 16),
                           _mm256_set1_epi8((char)z));
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

/* Into L2, as kn_ops_avx2.c's decode prefetch (which says why). */
KN_AI void pf_row(const uint8_t *p)
{
    _mm_prefetch((const char *)p, _MM_HINT_T1);
}

/* Blocks per batch of dec1_q4_rows's block parameters. */
#define KN_D1_BLK 8
#define KN_D1_MAXR 8 /* rows per x load, at most */

/* The parameters of one batch of blocks of R <= 8 rows, as the inner loop
 * wants them: s[i][k] = f16 scale * xd[b0 + k] of row i (kn_qdot.h's s_b,
 * the same float product), z[i][k] = its zero as a float (Q4). */
typedef struct d1_par {
    _Alignas(32) float s[KN_D1_MAXR][KN_D1_BLK];
    _Alignas(32) float z[KN_D1_MAXR][KN_D1_BLK];
} d1_par;

/* Row i's parameters of blocks [b0, b0 + n) (n <= 8) into s, z. */
KN_AI void d1_params(const uint16_t *sr, const uint8_t *zr, const float *xd,
                     uint32_t b0, uint32_t n, int gsh, float *s, float *z)
{
    if (n == KN_D1_BLK && gsh == 0) { /* group 32: one vector each */
        __m256 sv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sr + b0)));
        _mm256_store_ps(s, _mm256_mul_ps(sv, _mm256_loadu_ps(xd + b0)));
        if (zr)
            _mm256_store_ps(z, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                   _mm_loadl_epi64((const __m128i *)(zr + b0)))));
        return;
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t g = (b0 + k) >> gsh;
        s[k] = _cvtsh_ss(sr[g]) * xd[b0 + k];
        if (zr)
            z[k] = (float)zr[g];
    }
}

/* The parameters of blocks [b0, min(b0 + 8, nb)) of R rows into P. */
KN_AI void d1_params_rows(const uint16_t *s0, const uint8_t *z0, uint32_t ng,
                          const float *xd, uint32_t b0, uint32_t nb, int gsh,
                          d1_par *P, int R)
{
    const uint32_t n = nb - b0 < KN_D1_BLK ? nb - b0 : KN_D1_BLK;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        d1_params(s0 + (size_t)i * ng, z0 ? z0 + (size_t)i * ng : NULL, xd, b0, n,
                  gsh, P->s[i], P->z[i]);
}

/* acc + s * (A - z * S) for one block (blk: its 16 bytes), as below; Q4S
 * (z == NULL) subtracts 8 * S. */
KN_AI __m256 d1_row(__m256 acc, const uint8_t *blk, __m256i xv, __m256 S,
                    const float *z, const float *s)
{
    __m256i p = _mm256_maddubs_epi16(kn_avx2_q4_codes(blk), xv);
    __m256 a = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    __m256 zv = z ? _mm256_broadcast_ss(z) : _mm256_set1_ps((float)KN_Q4_ZERO_SYM);
    return _mm256_fmadd_ps(_mm256_fnmadd_ps(zv, S, a), _mm256_broadcast_ss(s), acc);
}

/* Blocks [b0, b0 + n) of the R rows w0 + i * rb with parameters P: n is
 * KN_D1_BLK (a constant: the loop unrolls, every address is a base
 * register plus a constant) or the ragged last batch. */
KN_AI void d1_batch(const uint8_t *w0, size_t rb, const uint8_t *x, uint32_t b0,
                    uint32_t n, const d1_par *P, int asym, __m256 *a, int R)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const size_t pf = KN_PF_ROWS * rb;
    const uint8_t *p = w0 + (size_t)b0 * 16, *xb = x + (size_t)b0 * 32;
#pragma GCC unroll 8
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *q = p + (size_t)k * 16;
        if (((b0 + k) & 3) == 0)
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                pf_row(q + pf + (size_t)i * rb);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + (size_t)k * 32));
        __m256 S = _mm256_cvtepi32_ps(
            _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, xv), ones16));
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a[i] = d1_row(a[i], q + (size_t)i * rb, xv, S, asym ? &P->z[i][k] : NULL,
                          &P->s[i][k]);
    }
}

/* Q4/Q4S, one token, rows r .. r+R-1 (cols % 32 == 0): the batch-1 decode
 * kernel, where int4 is bound by instructions, not bytes.  Per block and
 * row it does what kn_qdot.h's lane sums need and no more:
 *   c = the 32 codes, unsigned, in nibble order (kn_avx2_q4_codes: no
 *       shuffle); A = madd(maddubs(c, x), 1): the lanes of q . x;
 *   S = the lanes of sum x (once per block for the R rows), so
 *   lane = fnmadd(zero, S, A) = A - zero * S: every term is an integer
 *       below 2^24, so this float equals (float) of the canonical integer
 *       lane sum(q - zero) * x exactly (no abs, sign or byte broadcast);
 *   acc = fma(lane, s_b, acc) with s_b from d1_params.
 * Why this order (1 thread, cache-resident 64 x 4096, g32, alternated with
 * the former loop: Q4 21.5 -> 27.0, Q4S 24.8 -> 30.2 Gweights/s;
 * docs/benchmarks.md): the vector ops of a block and row fit in ~2.1
 * cycles on Zen 3's four FP pipes, but the former loop took ~4.8: its
 * block loop ran a variable count with the row pointers, the parameter
 * pointers and x's pointer kept on the stack (reloaded every block, x's
 * advanced by a load-add-store of a stack slot: a chain through memory),
 * and it read each batch's parameters right after storing them.  Now a
 * full batch is a constant 8 blocks, unrolled, every address a register
 * plus a constant; the next batch's parameters are computed before this
 * batch runs (P[2]), so their loads never wait on a store.  What is left
 * (~3.8 cycles) is the block's ~25-cycle dependency chain: each op taken
 * off it (timing only) speeds the loop up; R = 8 rows spills.
 * Bit-identical to the other kernels (test_qdot checks it). */
KN_AI void dec1_q4_rows(const kn_matrix *W, const uint8_t *x, const float *xd,
                        float *Y, uint32_t r, int asym, int R)
{
    const uint32_t nb = W->cols / KN_QK;
    const size_t rb = kn_q4_row_bytes(W->cols);
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    const uint8_t *w0 = (const uint8_t *)W->data + (size_t)r * rb;
    const uint16_t *s0 = (const uint16_t *)W->scales + (size_t)r * ng;
    const uint8_t *z0 = asym ? W->zeros + (size_t)r * ng : NULL;
    d1_par P[2];
    __m256 a[KN_D1_MAXR];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        a[i] = _mm256_setzero_ps();
    d1_params_rows(s0, z0, ng, xd, 0, nb, gsh, &P[0], R);
    for (uint32_t b0 = 0, cur = 0; b0 < nb; b0 += KN_D1_BLK, cur ^= 1) {
        const uint32_t n = nb - b0 < KN_D1_BLK ? nb - b0 : KN_D1_BLK;
        if (b0 + KN_D1_BLK < nb)
            d1_params_rows(s0, z0, ng, xd, b0 + KN_D1_BLK, nb, gsh, &P[cur ^ 1], R);
        if (n == KN_D1_BLK)
            d1_batch(w0, rb, x, b0, KN_D1_BLK, &P[cur], asym, a, R);
        else
            d1_batch(w0, rb, x, b0, n, &P[cur], asym, a, R);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
        Y[r + (uint32_t)i] += kn_hsum256(a[i]);
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
    dec1_q4_rows(W, x, xd, Y, r, fmt == KN_W_Q4, 4);
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

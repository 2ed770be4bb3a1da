/*
 * kn_qgemm_avx512.c - the integer prefill GEMM (kn_avx512_gemm_q_rows,
 * the T > KN_GEMM_MIN_T case of kn_matmul_q) with AVX-512 VNNI on
 * 512-bit vectors; called only when kn_cpu_has_avx512().  Q8, Q4, Q4S;
 * any rows, cols (a ragged last block), T.
 *
 * Block sums with weight ROWS in the 16 lanes of a zmm (as llama.cpp's
 * repacked Q4_0 GEMM): per (16 rows, token, 32-column block) the integer
 * ops leave one exact int32 block sum i_b per lane, and ONE convert, one
 * multiply (s_b) and one fma serve the 16 (row, token) pairs.  That is
 * kn_qdot.h's canonical arithmetic lane for lane: i_b exact, f_b =
 * _mm512_cvtepi32_ps (round to nearest even, as the reference's cast),
 * s_b = scale * d in one float multiply (Q8: d), acc = fma(f_b, s_b, acc)
 * over the blocks in order from 0, then (Q8) acc * row scale, added to Y
 * (which holds the bias or 0: bias + y, as the reference).  So the bits
 * are the reference's (test_qdot: avx512_gemm, gemm_panel_boundaries,
 * the extreme codes at T = 12).
 *
 * The integers, per (16 rows, token, block):
 *   Q4, Q4S: the panel holds, per block and quad k < 8 (positions
 *     4k .. 4k+3 of kn_qdot.h's nibble order), one zmm = 16 rows x 4
 *     UNSIGNED codes q (0..15): the 16 rows' raw code bytes transposed
 *     at dword granularity (8 vpermt2d per 16 rows x block; bytes 4m ..
 *     4m+3 hold quad m in their low nibbles and quad m + 4 in their high
 *     ones, split by and / shift).  8 vpdpbusd (u8 codes
 *     x the token's 4 signed activation bytes as an embedded {1to16}
 *     broadcast: exact, -128 included) give sum q * x; the zero's share
 *     is the initial value: Q4S -8 * sx, Q4 -zero * sx (one vpmulld of
 *     the 16 rows' -zero by sx), sx = the block's activation sum (a
 *     per-call table).  |i_b| <= 32 * 15 * 128 < 2^16: exact.
 *   Q8: the panel holds 16 rows x 2 int16 weights per dword, 16 vpdpwssd
 *     per block against the int16 activations (column order) broadcast
 *     as dwords, in two chains added at the end (exact: |i_b| < 2^27).
 * Q4S and Q8 in 16-row panels (KN_LAYOUT_P16, kn_pack16.h: the CPU
 * runtime's layout on these CPUs) are already transposed: pg_fill loads
 * a Q4S panel's 16 rows x 4 code bytes as they are and splits the
 * nibbles, a Q8 panel's 16 rows x 2 codes and widens them (thread ranges
 * are whole panels; other ranges take the reference).
 * A ragged last block is a panel block like the others: its weight bytes
 * are read with a masked load (no byte past a row's end), the columns
 * past cols get 0 activations (kn_qact_quantize pads) and add nothing.
 *
 * Tiling (the prototype's mode 1, branch i9_blocksum): tokens in panels
 * of up to 128; per panel a table [block][token] of {init, d} (the
 * activation side of the Q4 init and the block scales), so that a tile
 * reads them through one pointer at constant offsets; per 16-row group
 * the weights are transposed 32 blocks (Q4, 16 KiB) or 16 blocks (Q8,
 * 16 KiB) at a time into a stack panel, used by every token tile of the
 * panel; register tiles of 16 rows x 8 tokens (Q4: 8 weight vectors, 8
 * int and 8 float accumulators; Q8: two int chains of 8 and 8 float
 * accumulators); the float accumulators stay in memory ([token][16])
 * between column panels.  A short last tile runs the full tile with the
 * missing tokens pointing at a valid one and a zero table entry (results
 * dropped); a short row group has zero weights and scales in its missing
 * lanes and masked stores.  The activations are read in place
 * (token-major).  Stack: the table at most 128 KiB (the token panel
 * shrinks for wide matrices; cols > 65536 would leave under 8 tokens and
 * take a scalar path instead), the panel 20 KiB, the accumulators 8 KiB.
 * Against 64-token panels, Q8 tiles of 4 tokens and the prototype's
 * transpose of the 32 unpacked codes (24 vpermt2d), this measured
 * 1.00-1.16x (docs/benchmarks.md, i10_p512).
 *
 * Measured (docs/benchmarks.md, i10_p512; bench_gemm, 1 thread, CPU
 * time, medians of 5 interleaved A/B rounds against the 8-lane kernel
 * this replaces, SmolLM and TinyLlama shapes): T = 128/512 int4g32
 * 2.2-2.7x (TinyLlama 63 -> 140-155 GMAC/s), int4ag32 2.0-2.5x, int8
 * 1.6-1.9x; T = 9 1.0-1.7x, T = 12-16 1.2-2.0x.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kn_gemm.h"
#include "kn_internal.h"
#include "kn_qdot.h"

#define KN_AI __attribute__((always_inline)) static inline

#define PG_R 16        /* rows per group: the zmm lanes */
#define PG_BLK4 32     /* blocks per column panel, Q4/Q4S (512 B each) */
#define PG_BLK8 16     /* blocks per column panel, Q8 (1 KiB each) */
#define PG_TP 128      /* tokens per panel, at most */
#define PG_TT4 8       /* register tile, Q4/Q4S: tokens */
#define PG_TT8 8       /* register tile, Q8: tokens */
#define PG_TAB 16384   /* table entries (8 bytes each: 128 KiB) */

/* The activation side of one (block, token): Q4S -8 * sx, Q4 sx (sx the
 * block's activation sum), Q8 unused; d the block scale. */
typedef struct pg_ent {
    int32_t ini;
    float d;
} pg_ent;

typedef struct pg_panel {
    /* Q4/Q4S [block][quad k < 8][row < 16][4 codes]; Q8 [block][pair
     * k < 16][row < 16][2 int16] */
    _Alignas(64) uint8_t w[PG_BLK4 * 512];
    _Alignas(64) float s[PG_BLK4][PG_R];   /* Q4/Q4S: f16 scales as floats */
    _Alignas(64) int32_t nz[PG_BLK4][PG_R]; /* Q4: -zero */
} pg_panel;

/* ---- the transposes: row vectors in, one vector per dword column out ----
 * vpermt2d index tables (0..15 the first source, 16..31 the second). */
static const int32_t pg_q1[2][16] = { /* rows 0..7 of two 4-row vectors: dwords 0, 1 | 2, 3 */
    {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29},
    {2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31}};
static const int32_t pg_q2[2][16] = { /* 8 rows' dword e | 8 more rows' */
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}};

/* r[i] = row i (16 dwords) -> r[k] = every row's dword k: the standard
 * 16 x 16 transpose (unpack 32, unpack 64, two rounds of 128-bit
 * shuffles). */
KN_AI void pg_t16x16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + j]: rows 4i..4i+3, dword j of each 128-bit lane L (column
     * 4L + j) */
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
        t[8 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(t[4 + j], t[12 + j], 0xdd);
    }
}

/* Bytes [0, n) of p (n <= 16 / 32), the rest 0: a ragged last block's
 * weights without reading past the row. */
static inline __mmask16 pg_mask16(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
static inline __mmask32 pg_mask32(size_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
}

/* Unpack rows r .. r+R-1 (R <= 16; the other lanes zero), blocks
 * b0 .. b0+nb-1 (the last one may be ragged). */
static void pg_fill(pg_panel *P, const kn_matrix *W, uint32_t r, int R,
                    uint32_t b0, uint32_t nb)
{
    const uint32_t cols = W->cols;
    if (W->fmt == KN_W_Q8 && W->layout == KN_LAYOUT_P16) {
        /* r a multiple of 16 and R = 16: the panel's column pairs are
         * stored as they are, widened */
        const uint8_t *panel = (const uint8_t *)W->data +
                               (size_t)(r / 16) * kn_p16_q8_panel_bytes(cols);
        for (uint32_t j = 0; j < nb; j++) {
            const uint8_t *src = panel + kn_p16_q8_block_off(b0 + j);
            for (int k = 0; k < 16; k++)
                _mm512_store_si512(P->w + (size_t)j * 1024 + (size_t)k * 64,
                                   _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                       (const __m256i *)(src + 32 * k))));
        }
        return;
    }
    if (W->fmt == KN_W_Q8) {
        for (uint32_t j = 0; j < nb; j++) {
            const size_t c0 = (size_t)(b0 + j) * KN_QK;
            const __mmask32 m = pg_mask32(cols - c0);
            __m512i v[16];
            for (int i = 0; i < PG_R; i++)
                v[i] = i < R ? _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(
                                   m, (const int8_t *)W->data +
                                          (size_t)(r + (uint32_t)i) * cols + c0))
                             : _mm512_setzero_si512();
            pg_t16x16(v);
            for (int k = 0; k < 16; k++)
                _mm512_store_si512(P->w + (size_t)j * 1024 + (size_t)k * 64, v[k]);
        }
        return;
    }
    const int gsh = __builtin_ctz(W->group) - 5;
    const uint32_t ng = kn_q4_ngroups(cols, W->group);
    const size_t rb = kn_q4_row_bytes(cols);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (W->layout == KN_LAYOUT_P16) {
        /* r a multiple of 16 and R = 16 (kn_task_rows, kn_pack16.h): the
         * panel's dword columns are stored as they are, split by nibble */
        const uint8_t *panel = (const uint8_t *)W->data +
                               (size_t)(r / 16) * kn_p16_panel_bytes(cols, W->group);
        for (uint32_t j = 0; j < nb; j++) {
            const uint32_t b = b0 + j;
            const uint8_t *src = panel + kn_p16_block_off(b, W->group);
            _mm512_store_ps(P->s[j], _mm512_cvtph_ps(_mm256_loadu_si256(
                                         (const __m256i *)(panel + kn_p16_scale_off(b >> gsh, W->group)))));
            uint8_t *o = P->w + (size_t)j * 512;
            for (int k = 0; k < 4; k++) {
                __m512i v = _mm512_loadu_si512(src + (size_t)k * 64);
                _mm512_store_si512(o + (size_t)k * 64, _mm512_and_si512(v, m4));
                _mm512_store_si512(o + (size_t)(k + 4) * 64,
                                   _mm512_and_si512(_mm512_srli_epi32(v, 4), m4));
            }
        }
        return;
    }
    const __m512i i10 = _mm512_loadu_si512(pg_q1[0]), i11 = _mm512_loadu_si512(pg_q1[1]);
    const __m512i i20 = _mm512_loadu_si512(pg_q2[0]), i21 = _mm512_loadu_si512(pg_q2[1]);
    for (uint32_t j = 0; j < nb; j++) {
        const uint32_t b = b0 + j;
        const __mmask16 m = pg_mask16(rb - (size_t)b * 16);
        /* Z[a]: rows 4a .. 4a+3, one row's 16 code bytes per 128-bit lane */
        __m512i Z[4];
        for (int a = 0; a < 4; a++) {
            Z[a] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) {
                const int i = 4 * a + q;
                if (i >= R) {
                    P->s[j][i] = 0.0f;
                    P->nz[j][i] = 0;
                    continue;
                }
                const size_t ri = r + (uint32_t)i, gi = ri * ng + (b >> gsh);
                __m128i raw = _mm_maskz_loadu_epi8(m, (const uint8_t *)W->data + ri * rb +
                                                          (size_t)b * 16);
                Z[a] = _mm512_mask_broadcast_i32x4(Z[a], (__mmask16)(0xf << (4 * q)), raw);
                P->s[j][i] = _cvtsh_ss(((const uint16_t *)W->scales)[gi]);
                P->nz[j][i] = W->fmt == KN_W_Q4 ? -(int32_t)W->zeros[gi] : 0;
            }
        }
        /* the 16 x 4 dword transpose: O[m] lane i = row i's bytes 4m ..
         * 4m+3, whose low nibbles are quad m and high ones quad m + 4 */
        __m512i A[2], B[2], O[4];
        A[0] = _mm512_permutex2var_epi32(Z[0], i10, Z[1]);
        A[1] = _mm512_permutex2var_epi32(Z[0], i11, Z[1]);
        B[0] = _mm512_permutex2var_epi32(Z[2], i10, Z[3]);
        B[1] = _mm512_permutex2var_epi32(Z[2], i11, Z[3]);
        for (int h = 0; h < 2; h++) {
            O[2 * h] = _mm512_permutex2var_epi32(A[h], i20, B[h]);
            O[2 * h + 1] = _mm512_permutex2var_epi32(A[h], i21, B[h]);
        }
        uint8_t *o = P->w + (size_t)j * 512;
        for (int k = 0; k < 4; k++) {
            _mm512_store_si512(o + (size_t)k * 64, _mm512_and_si512(O[k], m4));
            _mm512_store_si512(o + (size_t)(k + 4) * 64,
                               _mm512_and_si512(_mm512_srli_epi32(O[k], 4), m4));
        }
    }
}

static inline int32_t pg_ld32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* acc[u * 16 ..] (u < TT) += blocks [0, nb) of panel P against the TT
 * tokens whose activations (at the panel's first block) are xr[u], whose
 * table entries are e[j * es + u] for block j.  The k loop outside the
 * token loop, so that the TT chains interleave and a weight vector is
 * loaded once for TT tokens. */
KN_AI void pg_micro(const pg_panel *P, const uint8_t *const *xr, const pg_ent *e,
                    size_t es, uint32_t nb, float *acc, int fmt, int TT)
{
    __m512 a[PG_TT4];
    const uint8_t *x[PG_TT4];
#pragma GCC unroll 8
    for (int u = 0; u < TT; u++) {
        a[u] = _mm512_load_ps(acc + (size_t)u * PG_R);
        x[u] = xr[u];
    }
    for (uint32_t j = 0; j < nb; j++, e += es) {
        __m512i p[PG_TT4];
        if (fmt == KN_W_Q8) {
            const uint8_t *wp = P->w + (size_t)j * 1024;
            __m512i q[PG_TT4];
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++) {
                p[u] = _mm512_setzero_si512();
                q[u] = _mm512_setzero_si512();
            }
#pragma GCC unroll 16
            for (int k = 0; k < 16; k += 2) {
                __m512i w0 = _mm512_load_si512(wp + (size_t)k * 64);
                __m512i w1 = _mm512_load_si512(wp + (size_t)k * 64 + 64);
#pragma GCC unroll 8
                for (int u = 0; u < TT; u++) {
                    p[u] = _mm512_dpwssd_epi32(p[u], w0, _mm512_set1_epi32(pg_ld32(x[u] + 4 * k)));
                    q[u] = _mm512_dpwssd_epi32(q[u], w1, _mm512_set1_epi32(pg_ld32(x[u] + 4 * k + 4)));
                }
            }
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++) {
                a[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p[u], q[u])),
                                       _mm512_set1_ps(e[u].d), a[u]);
                x[u] += 2 * KN_QK;
            }
            continue;
        }
        const uint8_t *wp = P->w + (size_t)j * 512;
        const __m512 sc = _mm512_load_ps(P->s[j]);
        if (fmt == KN_W_Q4) {
            const __m512i nz = _mm512_load_si512(P->nz[j]);
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++)
                p[u] = _mm512_mullo_epi32(nz, _mm512_set1_epi32(e[u].ini));
        } else {
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++)
                p[u] = _mm512_set1_epi32(e[u].ini);
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m512i w = _mm512_load_si512(wp + (size_t)k * 64);
#pragma GCC unroll 8
            for (int u = 0; u < TT; u++)
                p[u] = _mm512_dpbusd_epi32(p[u], w, _mm512_set1_epi32(pg_ld32(x[u] + 4 * k)));
        }
#pragma GCC unroll 8
        for (int u = 0; u < TT; u++) {
            a[u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[u]),
                                   _mm512_mul_ps(sc, _mm512_set1_ps(e[u].d)), a[u]);
            x[u] += KN_QK;
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < TT; u++)
        _mm512_store_ps(acc + (size_t)u * PG_R, a[u]);
}

/* The tiles of 8 tokens, and of 4 for a short last one (T = 9 would
 * otherwise pay 16 tokens' work). */
static void pg_micro_q8(const pg_panel *P, const uint8_t *const *xr,
                        const pg_ent *e, size_t es, uint32_t nb, float *acc, int TT)
{
    if (TT == 4)
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q8, 4);
    else
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q8, PG_TT8);
}
static void pg_micro_q4(const pg_panel *P, const uint8_t *const *xr,
                        const pg_ent *e, size_t es, uint32_t nb, float *acc, int TT)
{
    if (TT == 4)
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q4, 4);
    else
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q4, PG_TT4);
}
static void pg_micro_q4s(const pg_panel *P, const uint8_t *const *xr,
                         const pg_ent *e, size_t es, uint32_t nb, float *acc, int TT)
{
    if (TT == 4)
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q4S, 4);
    else
        pg_micro(P, xr, e, es, nb, acc, KN_W_Q4S, PG_TT4);
}

/* The table of tokens [t0, t0 + tn) into tab[b * es + t] for every block
 * b; the entries of t in [tn, es) zero (a short tile's missing tokens). */
static void pg_table(const kn_matrix *W, const uint8_t *xq, const float *xd,
                     size_t t0, size_t tn, size_t es, pg_ent *tab)
{
    const uint32_t nbrow = kn_qact_blocks(W->cols);
    const size_t qb = W->fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const __m256i ones = _mm256_set1_epi8(1);
    for (size_t t = 0; t < es; t++)
        for (uint32_t b = 0; b < nbrow; b++) {
            pg_ent *o = tab + (size_t)b * es + t;
            if (t >= tn) {
                o->ini = 0;
                o->d = 0.0f;
                continue;
            }
            const size_t tt = t0 + t;
            o->d = xd[tt * nbrow + b];
            o->ini = 0;
            if (W->fmt == KN_W_Q8)
                continue;
            __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones,
                                            _mm256_loadu_si256((const __m256i *)(
                                                xq + (tt * nbrow + b) * qb)));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            int32_t sx = _mm_cvtsi128_si32(h);
            o->ini = W->fmt == KN_W_Q4S ? -KN_Q4_ZERO_SYM * sx : sx;
        }
}


void kn_avx512_gemm_q_rows(const kn_matrix *W, const void *xqv, const float *xd,
                           size_t T, float *Y, uint32_t r0, uint32_t r1)
{
    const int fmt = W->fmt;
    const uint8_t *xq = xqv;
    const uint32_t nbrow = kn_qact_blocks(W->cols);
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xs = (size_t)nbrow * qb;
    const uint32_t blk = fmt == KN_W_Q8 ? PG_BLK8 : PG_BLK4;
    const size_t tb = fmt == KN_W_Q8 ? PG_TT8 : PG_TT4;
    /* token panel: a multiple of the tile whose table fits */
    size_t tp = PG_TAB / nbrow / tb * tb;
    tp = tp < PG_TP ? tp : PG_TP;
    if (tp == 0 || (W->layout == KN_LAYOUT_P16 && (r0 % PG_R || r1 % PG_R))) {
        kn_ref_matmul_q_rows(W, xq, xd, T, Y, r0, r1); /* panels: whole ones */
        return;
    }
    pg_panel P;
    _Alignas(64) float acc[PG_TP * PG_R];
    pg_ent tab[PG_TAB];
    for (size_t t0 = 0; t0 < T; t0 += tp) {
        const size_t tn = T - t0 < tp ? T - t0 : tp;
        const size_t es = (tn + tb - 1) / tb * tb; /* table stride: whole tiles */
        pg_table(W, xq, xd, t0, tn, es, tab);
        for (uint32_t r = r0; r < r1; r += PG_R) {
            const int R = r1 - r < PG_R ? (int)(r1 - r) : PG_R;
            memset(acc, 0, es * PG_R * sizeof(float));
            for (uint32_t b0 = 0; b0 < nbrow; b0 += blk) {
                const uint32_t nb = nbrow - b0 < blk ? nbrow - b0 : blk;
                pg_fill(&P, W, r, R, b0, nb);
                for (size_t t = 0; t < tn; t += tb) {
                    const int TT = tn - t <= 4 ? 4 : (int)tb;
                    const uint8_t *xr[PG_TT4];
                    for (size_t u = 0; u < tb; u++) {
                        size_t tt = t + u < tn ? t + u : tn - 1;
                        xr[u] = xq + (t0 + tt) * xs + (size_t)b0 * qb;
                    }
                    const pg_ent *e = tab + (size_t)b0 * es + t;
                    float *a = acc + t * PG_R;
                    switch (fmt) {
                    case KN_W_Q8: pg_micro_q8(&P, xr, e, es, nb, a, TT); break;
                    case KN_W_Q4: pg_micro_q4(&P, xr, e, es, nb, a, TT); break;
                    default: pg_micro_q4s(&P, xr, e, es, nb, a, TT); break;
                    }
                }
            }
            /* y = acc (Q8: * row scale); Y += y for the group's R rows */
            const __mmask16 m = (__mmask16)((1u << R) - 1);
            const __m512 rs = fmt == KN_W_Q8 ? _mm512_maskz_loadu_ps(m, kn_q8_scale_ptr(W, r))
                                             : _mm512_setzero_ps();
            for (size_t t = 0; t < tn; t++) {
                __m512 y = _mm512_load_ps(acc + t * PG_R);
                if (fmt == KN_W_Q8)
                    y = _mm512_mul_ps(y, rs);
                float *yp = Y + (t0 + t) * W->rows + r;
                _mm512_mask_storeu_ps(yp, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, yp), y));
            }
        }
    }
}

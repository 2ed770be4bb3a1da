/*
 * kn_qgemm_avx512.c - the integer prefill GEMM (kn_gemm_q_rows of
 * kn_gemm.h) with AVX-512 VNNI, on 256-bit vectors (AVX512VL); called
 * only when kn_cpu_has_avx512().
 *
 * Same bits as kn_gemm_avx2.c: kn_qdot.h's canonical arithmetic needs,
 * per (row, token, 32-column block), the 8 exact int32 lane sums (lane l:
 * the block's positions 4l .. 4l+3) and then fma((float)lane, s_b, acc).
 * Any exact integer computation of those lanes gives the same ints, so
 * the float ops that follow are the AVX2 kernel's, in the same order.
 * What VNNI changes is how many instructions the integers cost:
 *   Q4/Q4S: AVX2 does sign + maddubs + madd per (row, token); here one
 *     vpdpbusd.  vpdpbusd multiplies unsigned by signed bytes, so the
 *     activations go in biased, xu = x + 128 (x ^ 0x80: x is in +-127),
 *     against the signed codes w = q - zero; the bias's share,
 *     128 * (lane sum of w), is subtracted by starting the accumulation
 *     from init = -128 * (lane sum of w), computed once per (row, block)
 *     when the panel is unpacked.  |terms| <= 255 * 15 * 4: exact.
 *   Q8: AVX2 does madd + madd + add; here madd + vpdpwssd.
 * The float part (convert, s_b = scale * d, fma) is unchanged.
 *
 * Tiling as kn_gemm_avx2.c's integer GEMM: 4 weight rows unpacked per
 * panel of 64 blocks (L1), tokens in panels of 64 with their float
 * accumulators in memory between panels, register tiles of 4 rows x TT
 * tokens (32 registers allow TT = 4 for Q4, 3 for Q8).
 *
 * The decode kernels (kn_qdec_avx512.c, split from this file), measured
 * here as they were when written: int4 decode, T <= 8 tokens, full blocks:
 *   T = 1     dec1_rows: 8 rows a pass, unsigned codes straight into
 *             vpdpbusd against the signed x (Q4S from init = -8 * lane
 *             sums of x, shared by the rows), s_b from a per-batch
 *             table as the fma's embedded broadcast;
 *   T = 2..8  dec_rows_tab: biased activations against the signed
 *             codes from each row's init, s_b from a per-batch table
 *             (a ragged last batch filled with masked loads); 4 rows a
 *             pass for T <= 4, 2 rows for T = 5..8 (i8_q4dec8: was
 *             dec_rows2, which multiplied scale * d per (row, token,
 *             block); SmolLM shapes, 1 thread, CPU time, medians of 5
 *             A/B rounds: Q4 1.13-1.24x, Q4S 1.00-1.17x).
 * and int8 decode of T = 2..8 tokens (dq8_rows: passes of 4 rows, 2 for
 * T > 4, each token's activations loaded once per pass, madd + vpdpwssd
 * per (row, token, block) where AVX2's decn_row does two madd and an add).
 * Each gives the canonical integers exactly and then the same float ops
 * (convert, fma with the same s_b product) in the same order: the bits
 * of kn_qdot_avx2.c (test_qdot compares them over ragged shapes).
 * Measured on the Zen 4 host (docs/benchmarks.md, i8_q4s; 1 thread, CPU
 * time, L2/L3-resident matrices, best of 5 A/B rounds against main): Q4S
 * g32 T = 1 1.09-1.52x (TinyLlama shapes 24-25 -> 35-39 GMAC/s in most
 * rounds), Q4 T = 1 1.48-1.52x (medians; AVX2 path as A), T = 2
 * 1.42-1.74x, T = 4 1.12-1.42x; at TinyLlama's size decode is bound by
 * DRAM instead (no end-to-end change at 1 thread there; SmolLM's CPU ms
 * a token 0.96x).  Tried and
 * dropped (no gain at T = 128/512, A/B): a per-tile s_b table in vmicro
 * (takes the multiply out of the loop), the convert replaced by a
 * magic-number subtract (the bias folded into init), token panels of 128
 * with column panels of 32.  The prefill loop runs at ~2 cycles per
 * (row, token, block) where its ops alone take ~1 (vpdpbusd + fma on the
 * FMA pipes, the convert 1 a cycle): what bounds it is not found yet.
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_gemm.h"
#include "kn_internal.h"
#include "kn_qdot.h"
#include "kn_qgemm_finish.h"

#define KN_AI __attribute__((always_inline)) static inline

#define KN_VP_ROWS 4   /* weight rows unpacked at once */
#define KN_VP_BLK 64   /* 32-column blocks unpacked at once */
#define KN_VP_TP 64    /* tokens per panel */
#define KN_VP_TMAX 4   /* widest register tile: tokens */
#define KN_VP_TB8 3    /* register tile, Q8: tokens */
#define KN_VP_TB4 4    /* register tile, Q4/Q4S: tokens */

/* 4 rows x 64 blocks: Q4/Q4S the signed codes w and init (8 int32), Q8
 * the bytes widened to int16; the Q4 blocks' f16 scales as floats. */
typedef struct kn_vpanel {
    _Alignas(64) uint8_t w[KN_VP_ROWS][KN_VP_BLK][64];
    float s[KN_VP_ROWS][KN_VP_BLK];
} kn_vpanel;

KN_AI void vpanel_fill(kn_vpanel *P, const kn_matrix *W, uint32_t r, int R,
                       uint32_t b0, uint32_t nb, int fmt)
{
    const uint32_t cols = W->cols;
    const int gsh = fmt == KN_W_Q8 ? 0 : __builtin_ctz(W->group) - 5;
    const uint32_t ng = fmt == KN_W_Q8 ? 0 : kn_q4_ngroups(cols, W->group);
    const size_t rbytes = fmt == KN_W_Q8 ? cols : kn_q4_row_bytes(cols);
    const __m256i ones = _mm256_set1_epi8(1);
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
            __m256i sw = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, w);
            _mm256_store_si256(o, w);
            _mm256_store_si256(o + 1, _mm256_sub_epi32(_mm256_setzero_si256(),
                                                       _mm256_slli_epi32(sw, 7)));
            P->s[i][j] = _cvtsh_ss(((const uint16_t *)W->scales)[gi]);
        }
    }
}

/* acc[i][t] (8 floats each, in memory between calls) += blocks [0, nb)
 * of panel P against tokens t0 .. t0+TT-1 at blocks b0 .. */
KN_AI void vmicro(const kn_vpanel *P, const uint8_t *xq, const float *xd,
                  size_t xstride, uint32_t nbrow, uint32_t b0, uint32_t nb,
                  float *acc, size_t t0, int fmt, int R, int TT)
{
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    __m256 a[KN_VP_ROWS][KN_VP_TMAX];
    const uint8_t *xr[KN_VP_TMAX];
    const float *dr[KN_VP_TMAX];
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        xr[t] = xq + (t0 + (size_t)t) * xstride + (size_t)b0 * qb;
        dr[t] = xd + (t0 + (size_t)t) * nbrow + b0;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            a[i][t] = _mm256_load_ps(acc + ((size_t)i * KN_VP_TP + t0 + (size_t)t) * 8);
    }
    for (uint32_t j = 0; j < nb; j++) {
        __m256i xv[KN_VP_TMAX], xv2[KN_VP_TMAX];
        __m256 vd[KN_VP_TMAX];
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            const __m256i *xp = (const __m256i *)(xr[t] + (size_t)j * qb);
            if (fmt == KN_W_Q8) {
                xv[t] = _mm256_loadu_si256(xp);
                xv2[t] = _mm256_loadu_si256(xp + 1);
            } else {
                xv[t] = _mm256_xor_si256(_mm256_loadu_si256(xp), bias);
            }
            vd[t] = _mm256_broadcast_ss(dr[t] + j);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            const __m256i *wp = (const __m256i *)P->w[i][j];
            if (fmt == KN_W_Q8) {
                __m256i wlo = _mm256_load_si256(wp), whi = _mm256_load_si256(wp + 1);
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) {
                    __m256i p = _mm256_dpwssd_epi32(_mm256_madd_epi16(wlo, xv[t]),
                                                    whi, xv2[t]);
                    a[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), vd[t], a[i][t]);
                }
                continue;
            }
            __m256i w = _mm256_load_si256(wp), init = _mm256_load_si256(wp + 1);
            __m256 ws = _mm256_broadcast_ss(&P->s[i][j]);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                __m256i p = _mm256_dpbusd_epi32(init, xv[t], w);
                a[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                          _mm256_mul_ps(ws, vd[t]), a[i][t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++)
            _mm256_store_ps(acc + ((size_t)i * KN_VP_TP + t0 + (size_t)t) * 8, a[i][t]);
}

/* Always the full 4-row tile (a short group's missing rows are zero in
 * the panel and their sums are dropped by the finish): 12 copies of
 * vmicro instead of 48, for a quarter of the code and of its compile
 * time; a zero row costs only in a thread's last group of a matrix. */
static void vmicro_any(const kn_vpanel *P, const uint8_t *xq, const float *xd,
                       size_t xstride, uint32_t nbrow, uint32_t b0, uint32_t nb,
                       float *acc, size_t t0, int fmt, int TT)
{
#define KN_VM(f, t)                                                            \
    case (f) * 8 + (t):                                                        \
        vmicro(P, xq, xd, xstride, nbrow, b0, nb, acc, t0, f, KN_VP_ROWS, t);  \
        break;
#define KN_VF(f) KN_VM(f, 1) KN_VM(f, 2) KN_VM(f, 3) KN_VM(f, 4)
    switch (fmt * 8 + TT) {
        KN_VF(KN_W_Q8) KN_VF(KN_W_Q4) KN_VF(KN_W_Q4S)
    default: break;
    }
#undef KN_VF
#undef KN_VM
}

/* Rows r .. r+R-1 x tokens [t0, t1) (t1 - t0 <= KN_VP_TP). */
static void vrows(const kn_matrix *W, const uint8_t *xq, const float *xd,
                  float *Y, uint32_t r, int R, size_t t0, size_t t1,
                  kn_vpanel *P, float *acc)
{
    const int fmt = W->fmt;
    const uint32_t nbrow = kn_qact_blocks(W->cols), nfull = W->cols / KN_QK;
    const size_t qb = fmt == KN_W_Q8 ? 2 * KN_QK : KN_QK;
    const size_t xstride = (size_t)nbrow * qb;
    const size_t tn = t1 - t0;
    const size_t tb = fmt == KN_W_Q8 ? KN_VP_TB8 : KN_VP_TB4;
    const size_t rbytes = fmt == KN_W_Q8 ? W->cols : kn_q4_row_bytes(W->cols);
    memset(acc, 0, (size_t)KN_VP_ROWS * KN_VP_TP * 8 * sizeof(float));
    for (int i = R; i < KN_VP_ROWS; i++) { /* vmicro_any's zero rows */
        memset(P->w[i], 0, sizeof P->w[i]);
        memset(P->s[i], 0, sizeof P->s[i]);
    }
    for (size_t t = 0; t < tn; t++)
        _mm_prefetch((const char *)(Y + (t0 + t) * W->rows + r), _MM_HINT_T1);
    for (uint32_t b0 = 0; b0 < nfull; b0 += KN_VP_BLK) {
        uint32_t nb = nfull - b0 < KN_VP_BLK ? nfull - b0 : KN_VP_BLK;
        switch (fmt) {
        case KN_W_Q8: vpanel_fill(P, W, r, R, b0, nb, KN_W_Q8); break;
        case KN_W_Q4: vpanel_fill(P, W, r, R, b0, nb, KN_W_Q4); break;
        default: vpanel_fill(P, W, r, R, b0, nb, KN_W_Q4S); break;
        }
        /* the next 4 rows' first lines, for the next call's first panel
         * (rows are a few hundred bytes: the hardware prefetcher does
         * not follow the jump from one 4-row group to the next) */
        if (b0 + nb >= nfull)
            for (int i = 0; i < KN_VP_ROWS; i++)
                for (size_t o = 0; o < rbytes && o < 1024; o += 64)
                    _mm_prefetch((const char *)((uintptr_t)W->data +
                                                (r + (size_t)R + (size_t)i) * rbytes + o),
                                 _MM_HINT_T1);
        for (size_t t = 0; t < tn; t += tb) {
            int TT = tn - t < tb ? (int)(tn - t) : (int)tb;
            vmicro_any(P, xq + t0 * xstride, xd + t0 * nbrow, xstride, nbrow,
                       b0, nb, acc, t, fmt, TT);
        }
    }
    kn_qgemm_finish(W, xq, xd, Y, r, R, t0, tn, acc, KN_VP_TP);
}

void kn_avx512_gemm_q_rows(const kn_matrix *W, const void *xq, const float *xd,
                           size_t T, float *Y, uint32_t r0, uint32_t r1)
{
    kn_vpanel P;
    _Alignas(64) float acc[KN_VP_ROWS * KN_VP_TP * 8];
    for (size_t t0 = 0; t0 < T; t0 += KN_VP_TP) {
        size_t t1 = T - t0 < KN_VP_TP ? T : t0 + KN_VP_TP;
        for (uint32_t r = r0; r < r1; r += KN_VP_ROWS) {
            int R = r1 - r < KN_VP_ROWS ? (int)(r1 - r) : KN_VP_ROWS;
            vrows(W, xq, xd, Y, r, R, t0, t1, &P, acc);
        }
    }
}


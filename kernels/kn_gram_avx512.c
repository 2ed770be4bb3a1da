/* kn_gram_avx512.c - the AVX-512 register tile of kn_gram.c (see
 * kn_gram.h): up to 12 x 32 float sums in 24 zmm registers over up to two
 * A panels (6 rows each) and two B panels (16 columns each) of the packing
 * the AVX2 tile uses, so the packing and the scratch do not change.
 *
 * Same bits as the AVX2 tile: an outer-product tile computes each element
 * (i, j) as its own chain of float fused multiply-adds a[t][i] * b[t][j]
 * over the tokens t ascending, restarted every KN_GRAM_FC tokens, each
 * chain's float sum widened (exactly) and added in double to a tile
 * element that starts at +0.0, chunk after chunk in order; the width of
 * the vectors and the number of rows and columns in the tile change which
 * lanes compute an element, not its operations.  Zen 4 runs a zmm FMA as
 * two 256-bit halves, so the gain is not the FMA rate (the AVX2 tile is at
 * the FMA peak already) but fewer instructions and loads per multiply-add
 * (12 broadcasts and 2 loads per 24 FMAs of 16 lanes, against 6 and 2 per
 * 12 FMAs of 8) and half the panel bytes read per multiply-add.
 *
 * Measured (bench_gram, one thread, CPU time, 8192 tokens in 512-token
 * calls, medians of 11 interleaved rounds, load 4-5 on 2 vCPUs, Zen 4):
 * against the AVX2 tile with the same blocking 1.00-1.07x (576) and
 * 1.04-1.07x (1536); together with the blocking of kn_gram.c against the
 * code before it 1.2-1.27x (576) and 1.12-1.25x (1536).  A tile of 12 x
 * 32 at 512 tokens runs near the machine's FMA peak (~50 G multiply-adds
 * per second and core, ymm or zmm); what remains is adding the tiles to
 * h or c and the packing (kn_gram.h). */
#include <immintrin.h>

#include "kn_avx512.h"
#include "kn_gram.h"

_Static_assert(KN_GRAM_MR == 6 && KN_GRAM_NR == 16,
               "a B panel is one zmm wide; the A panels 6 rows");
_Static_assert(KN_GRAM_TILE512_NC == 2 * KN_GRAM_NR,
               "the tile's double rows are two B panels wide");


/* out[0..15] += the 16 float sums of acc, in double. */
static inline void widen_add(double *out, __m512 acc)
{
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(acc));
    __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(acc, 1));
    _mm512_storeu_pd(out, _mm512_add_pd(_mm512_loadu_pd(out), lo));
    _mm512_storeu_pd(out + 8, _mm512_add_pd(_mm512_loadu_pd(out + 8), hi));
}

/* The float sums of m <= KN_GRAM_FC tokens of the 12 x 32 tile, added to
 * out.  The 24 accumulators are named locals (an array of them stayed in
 * memory with GCC 12, as cmp_lanes.h found for the AVX2 tile). */
static void sub_tile(const float *ap0, const float *ap1, const float *bp0,
                     const float *bp1, size_t m, double *out)
{
    __m512 z = _mm512_setzero_ps();
    __m512 c00a = z, c00b = z, c01a = z, c01b = z, c02a = z, c02b = z,
           c03a = z, c03b = z, c04a = z, c04b = z, c05a = z, c05b = z,
           c06a = z, c06b = z, c07a = z, c07b = z, c08a = z, c08b = z,
           c09a = z, c09b = z, c10a = z, c10b = z, c11a = z, c11b = z;
    for (size_t t = 0; t < m; t++) {
        const float *a0 = ap0 + t * KN_GRAM_MR, *a1 = ap1 + t * KN_GRAM_MR;
        __m512 b0 = _mm512_loadu_ps(bp0 + t * KN_GRAM_NR);
        __m512 b1 = _mm512_loadu_ps(bp1 + t * KN_GRAM_NR);
        __m512 x;
        x = _mm512_set1_ps(a0[0]);
        c00a = _mm512_fmadd_ps(x, b0, c00a);
        c00b = _mm512_fmadd_ps(x, b1, c00b);
        x = _mm512_set1_ps(a0[1]);
        c01a = _mm512_fmadd_ps(x, b0, c01a);
        c01b = _mm512_fmadd_ps(x, b1, c01b);
        x = _mm512_set1_ps(a0[2]);
        c02a = _mm512_fmadd_ps(x, b0, c02a);
        c02b = _mm512_fmadd_ps(x, b1, c02b);
        x = _mm512_set1_ps(a0[3]);
        c03a = _mm512_fmadd_ps(x, b0, c03a);
        c03b = _mm512_fmadd_ps(x, b1, c03b);
        x = _mm512_set1_ps(a0[4]);
        c04a = _mm512_fmadd_ps(x, b0, c04a);
        c04b = _mm512_fmadd_ps(x, b1, c04b);
        x = _mm512_set1_ps(a0[5]);
        c05a = _mm512_fmadd_ps(x, b0, c05a);
        c05b = _mm512_fmadd_ps(x, b1, c05b);
        x = _mm512_set1_ps(a1[0]);
        c06a = _mm512_fmadd_ps(x, b0, c06a);
        c06b = _mm512_fmadd_ps(x, b1, c06b);
        x = _mm512_set1_ps(a1[1]);
        c07a = _mm512_fmadd_ps(x, b0, c07a);
        c07b = _mm512_fmadd_ps(x, b1, c07b);
        x = _mm512_set1_ps(a1[2]);
        c08a = _mm512_fmadd_ps(x, b0, c08a);
        c08b = _mm512_fmadd_ps(x, b1, c08b);
        x = _mm512_set1_ps(a1[3]);
        c09a = _mm512_fmadd_ps(x, b0, c09a);
        c09b = _mm512_fmadd_ps(x, b1, c09b);
        x = _mm512_set1_ps(a1[4]);
        c10a = _mm512_fmadd_ps(x, b0, c10a);
        c10b = _mm512_fmadd_ps(x, b1, c10b);
        x = _mm512_set1_ps(a1[5]);
        c11a = _mm512_fmadd_ps(x, b0, c11a);
        c11b = _mm512_fmadd_ps(x, b1, c11b);
    }
    widen_add(out + 0 * KN_GRAM_TILE512_NC, c00a);
    widen_add(out + 0 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c00b);
    widen_add(out + 1 * KN_GRAM_TILE512_NC, c01a);
    widen_add(out + 1 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c01b);
    widen_add(out + 2 * KN_GRAM_TILE512_NC, c02a);
    widen_add(out + 2 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c02b);
    widen_add(out + 3 * KN_GRAM_TILE512_NC, c03a);
    widen_add(out + 3 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c03b);
    widen_add(out + 4 * KN_GRAM_TILE512_NC, c04a);
    widen_add(out + 4 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c04b);
    widen_add(out + 5 * KN_GRAM_TILE512_NC, c05a);
    widen_add(out + 5 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c05b);
    widen_add(out + 6 * KN_GRAM_TILE512_NC, c06a);
    widen_add(out + 6 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c06b);
    widen_add(out + 7 * KN_GRAM_TILE512_NC, c07a);
    widen_add(out + 7 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c07b);
    widen_add(out + 8 * KN_GRAM_TILE512_NC, c08a);
    widen_add(out + 8 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c08b);
    widen_add(out + 9 * KN_GRAM_TILE512_NC, c09a);
    widen_add(out + 9 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c09b);
    widen_add(out + 10 * KN_GRAM_TILE512_NC, c10a);
    widen_add(out + 10 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c10b);
    widen_add(out + 11 * KN_GRAM_TILE512_NC, c11a);
    widen_add(out + 11 * KN_GRAM_TILE512_NC + KN_GRAM_NR, c11b);
}

void kn_avx512_gram_tile(const float *ap, int na, const float *bp, int nb,
                         size_t m, size_t kc, double out[KN_GRAM_TILE512])
{
    /* a missing second panel repeats the first: its sums are computed
     * and not used (edges only: a width not a multiple of 12 rows or 32
     * columns, the triangle's diagonal) */
    const float *ap1 = na == 2 ? ap + KN_GRAM_MR * kc : ap;
    const float *bp1 = nb == 2 ? bp + KN_GRAM_NR * kc : bp;
    for (size_t k = 0; k < KN_GRAM_TILE512; k++)
        out[k] = 0.0;
    for (size_t t0 = 0; t0 < m; t0 += KN_GRAM_FC)
        sub_tile(ap + t0 * KN_GRAM_MR, ap1 + t0 * KN_GRAM_MR,
                 bp + t0 * KN_GRAM_NR, bp1 + t0 * KN_GRAM_NR,
                 m - t0 < KN_GRAM_FC ? m - t0 : KN_GRAM_FC, out);
}

/* ---- the bfloat16 tile (kn_gram_tri_bf16) -------------------------------- */

void kn_avx512_bf16_pairs(const float *lo, const float *hi, size_t n,
                          uint32_t *out)
{
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff
                                  : (__mmask16)((1u << (n - j)) - 1u);
        __m512i l = kn_bf16_top512(_mm512_maskz_loadu_epi32(k, lo + j));
        __m512i h = hi ? kn_bf16_top512(_mm512_maskz_loadu_epi32(k, hi + j))
                       : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(out + j, k,
                                 _mm512_or_si512(h, _mm512_srli_epi32(l, 16)));
    }
}

/* vdpbf16ps needs AVX512_BF16 beyond this file's flags: the functions that
 * use it carry the target themselves, and run only when
 * kn_cpu_has_avx512bf16(). */
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

/* c += the pair products of the broadcast pair a against b (16 lanes). */
#define DP(c, a, b) c = _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))

/* The float sums of `pairs` <= KN_GRAM_FC / 2 token pairs of the 12 x 32
 * tile, added to out (sub_tile's structure, one pair per step). */
static BF16_TARGET void sub_tile_bf16(const uint32_t *ap0, const uint32_t *ap1,
                                      const uint32_t *bp0, const uint32_t *bp1,
                                      size_t pairs, double *out)
{
    __m512 z = _mm512_setzero_ps();
    __m512 c00a = z, c00b = z, c01a = z, c01b = z, c02a = z, c02b = z,
           c03a = z, c03b = z, c04a = z, c04b = z, c05a = z, c05b = z,
           c06a = z, c06b = z, c07a = z, c07b = z, c08a = z, c08b = z,
           c09a = z, c09b = z, c10a = z, c10b = z, c11a = z, c11b = z;
    for (size_t p = 0; p < pairs; p++) {
        const uint32_t *a0 = ap0 + p * KN_GRAM_MR, *a1 = ap1 + p * KN_GRAM_MR;
        __m512i b0 = _mm512_loadu_si512(bp0 + p * KN_GRAM_NR);
        __m512i b1 = _mm512_loadu_si512(bp1 + p * KN_GRAM_NR);
        __m512i x;
        x = _mm512_set1_epi32((int)a0[0]);
        DP(c00a, x, b0);
        DP(c00b, x, b1);
        x = _mm512_set1_epi32((int)a0[1]);
        DP(c01a, x, b0);
        DP(c01b, x, b1);
        x = _mm512_set1_epi32((int)a0[2]);
        DP(c02a, x, b0);
        DP(c02b, x, b1);
        x = _mm512_set1_epi32((int)a0[3]);
        DP(c03a, x, b0);
        DP(c03b, x, b1);
        x = _mm512_set1_epi32((int)a0[4]);
        DP(c04a, x, b0);
        DP(c04b, x, b1);
        x = _mm512_set1_epi32((int)a0[5]);
        DP(c05a, x, b0);
        DP(c05b, x, b1);
        x = _mm512_set1_epi32((int)a1[0]);
        DP(c06a, x, b0);
        DP(c06b, x, b1);
        x = _mm512_set1_epi32((int)a1[1]);
        DP(c07a, x, b0);
        DP(c07b, x, b1);
        x = _mm512_set1_epi32((int)a1[2]);
        DP(c08a, x, b0);
        DP(c08b, x, b1);
        x = _mm512_set1_epi32((int)a1[3]);
        DP(c09a, x, b0);
        DP(c09b, x, b1);
        x = _mm512_set1_epi32((int)a1[4]);
        DP(c10a, x, b0);
        DP(c10b, x, b1);
        x = _mm512_set1_epi32((int)a1[5]);
        DP(c11a, x, b0);
        DP(c11b, x, b1);
    }
    __m512 acc[24] = {c00a, c00b, c01a, c01b, c02a, c02b, c03a, c03b,
                      c04a, c04b, c05a, c05b, c06a, c06b, c07a, c07b,
                      c08a, c08b, c09a, c09b, c10a, c10b, c11a, c11b};
    for (int k = 0; k < 24; k++)
        widen_add(out + (k / 2) * KN_GRAM_TILE512_NC + (k % 2) * KN_GRAM_NR,
                  acc[k]);
}
#undef DP

void kn_avx512bf16_gram_tile(const uint32_t *ap, int na, const uint32_t *bp,
                             int nb, size_t pairs, size_t kcp,
                             double out[KN_GRAM_TILE512])
{
    const uint32_t *ap1 = na == 2 ? ap + KN_GRAM_MR * kcp : ap;
    const uint32_t *bp1 = nb == 2 ? bp + KN_GRAM_NR * kcp : bp;
    const size_t fc = KN_GRAM_FC / 2;
    for (size_t k = 0; k < KN_GRAM_TILE512; k++)
        out[k] = 0.0;
    for (size_t p0 = 0; p0 < pairs; p0 += fc)
        sub_tile_bf16(ap + p0 * KN_GRAM_MR, ap1 + p0 * KN_GRAM_MR,
                      bp + p0 * KN_GRAM_NR, bp1 + p0 * KN_GRAM_NR,
                      pairs - p0 < fc ? pairs - p0 : fc, out);
}

/*
 * kn_attn_avx512.c - the block step of kn_attn_avx2.c's tiled attention
 * with AVX-512 (compiled with -mavx512f/bw/dq/vl/vnni as well;
 * kn_avx2_attend_tile calls it only when kn_cpu_has_avx512()).
 *
 * THE invariant is kn_attn_avx2.c's: a row's arithmetic depends only on
 * its query, its position and the cache, and is the per-row arithmetic
 * written in that file's header.  Every step here is that arithmetic
 * lane for lane, so the bits are the AVX2 kernel's:
 *   - a score is one FMA chain over d in the lane of its position; a zmm
 *     holds 16 positions' lanes (the AVX2 kernel 8), so each chain is the
 *     same sequence of FMAs, then the same division by sqrt(head_dim);
 *   - the block max is exact (any order; NaN lanes skipped as there);
 *   - exp512 is kn_exp256's polynomial, operation for operation, on 16
 *     lanes (min, max, fma, floor, fnmadd, cvtps (round to nearest), shift,
 *     mul: all exact-per-lane IEEE operations);
 *   - l adds the block's four 8-lane p vectors in order and kn_hsum256's
 *     tree, taken from the halves of the two zmm;
 *   - an output value is o * c then one FMA per attended position, j
 *     ascending, in the lane of its d (16 d's per zmm instead of 8), and
 *     masked lanes are never stored.
 * test_prefill compares this path with the AVX2 one bit for bit.
 *
 * What changes is the register tile: 32 zmm registers hold KN_FA5_RS
 * rows x 32 positions of scores (16 chains; one K^T load feeds KN_FA5_RS
 * FMAs) and KN_FA5_RV rows x 64 output values of P.V (16 chains; one V
 * load per KN_FA5_RV FMAs).  Zen 4 runs a zmm FMA as two ymm halves, so
 * the gain is in loads, registers and instructions per FMA.
 *
 * Measured (bench_attention, 1 thread, CPU time, medians of 7 interleaved
 * rounds, load 4.6-4.9, head_dim 64, f16 KV; docs/benchmarks.md i8_attn):
 * against main's kernel 1.54-1.67x on 128/512-token prompts, 1.65-1.93x
 * on 2048 tokens (31-32 GMAC per CPU-second, main 17-19), decode 1.15-
 * 1.56x; the AVX2 path alone 1.21-1.47x.  Tile sizes by A/B (4 rounds):
 * 8 score rows vs 4: 1.00-1.16x on long prompts; 6 P.V rows vs 4: 0.85-
 * 0.97x.  What is left: ~15 % of the time is the tile's K/V conversion
 * and transposition in kn_avx2_attend_tile (perf, cpu-clock: stalls on
 * the f16 rows even with the next block prefetched; KV-head-major tile
 * order did not help), ~13 % the exp polynomial and the divisions.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kn_avx2.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

#define KN_FA5_RS 8
#define KN_FA5_RV 4

/* kn_exp256 on 16 lanes: the same operations in the same order. */
KN_AI __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365447504f));
    __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                _mm512_set1_ps(0.5f));
    fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* Scores of R rows (t->act[i0 ..]): 32 lanes of each in two zmm. */
KN_AI void scores_rows(const kn_fa_tile *t, uint32_t i0, const int R,
                       const float *kt, uint32_t hd, __m512 root, int inv_root,
                       float (*sc)[KN_FA_B])
{
    __m512 s[KN_FA5_RS][2];
    const float *q[KN_FA5_RS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        q[r] = t->q[t->act[i0 + (uint32_t)r]];
        s[r][0] = s[r][1] = _mm512_setzero_ps();
    }
    for (uint32_t d = 0; d < hd; d++) {
        const float *k = kt + (size_t)d * KN_FA_B;
        __m512 k0 = _mm512_load_ps(k), k1 = _mm512_load_ps(k + 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 qd = _mm512_set1_ps(q[r][d]);
            s[r][0] = _mm512_fmadd_ps(qd, k0, s[r][0]);
            s[r][1] = _mm512_fmadd_ps(qd, k1, s[r][1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *o = sc[t->act[i0 + (uint32_t)r]];
        _mm512_store_ps(o, inv_root ? _mm512_mul_ps(s[r][0], root)
                                    : _mm512_div_ps(s[r][0], root));
        _mm512_store_ps(o + 16, inv_root ? _mm512_mul_ps(s[r][1], root)
                                         : _mm512_div_ps(s[r][1], root));
    }
}

/* Row r's online-softmax step (kn_attn_avx2.c's softmax_row): sc's
 * attended lanes become p, m and l are updated, c is returned. */
static float softmax_row(kn_fa_tile *t, uint32_t r, float *sc)
{
    int ja = t->ja[r], je = t->je[r];
    uint32_t bits = (uint32_t)(((uint64_t)2 << je) - ((uint64_t)1 << ja));
    __mmask16 k0 = (__mmask16)bits, k1 = (__mmask16)(bits >> 16);
    __m512 s0 = _mm512_load_ps(sc), s1 = _mm512_load_ps(sc + 16);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    mx = _mm512_mask_max_ps(mx, k0, s0, mx);
    mx = _mm512_mask_max_ps(mx, k1, s1, mx);
    float bmax = _mm512_reduce_max_ps(mx);
    float mo = t->m[r];
    float mn = bmax > mo ? bmax : mo;
    /* expf(+0) is 1 exactly: skip the call when the max stays. */
    float c = mo == -INFINITY ? 0.0f : mo == mn && mn < INFINITY ? 1.0f : expf(mo - mn);
    __m512 vm = _mm512_set1_ps(mn);
    __m512 p0 = _mm512_maskz_mov_ps(k0, exp512(_mm512_sub_ps(_mm512_mask_blend_ps(k0, vm, s0), vm)));
    __m512 p1 = _mm512_maskz_mov_ps(k1, exp512(_mm512_sub_ps(_mm512_mask_blend_ps(k1, vm, s1), vm)));
    _mm512_store_ps(sc, p0);
    _mm512_store_ps(sc + 16, p1);
    __m256 bs = _mm256_add_ps(_mm256_setzero_ps(), _mm512_castps512_ps256(p0));
    bs = _mm256_add_ps(bs, _mm512_extractf32x8_ps(p0, 1));
    bs = _mm256_add_ps(bs, _mm512_castps512_ps256(p1));
    bs = _mm256_add_ps(bs, _mm512_extractf32x8_ps(p1, 1));
    t->l[r] = t->l[r] * c + kn_hsum256(bs);
    t->m[r] = mn;
    return c;
}

/* o = o * c + sum_j p_j v_j (j ascending) for R rows attending the same
 * lanes: 64 output values of each at a time. */
KN_AI void pv_rows(const kn_fa_tile *t, uint32_t i0, const int R,
                   const float (*sc)[KN_FA_B], const float *cf,
                   const float *vb, size_t ld, uint32_t hd)
{
    const float *p[KN_FA5_RV];
    float *o[KN_FA5_RV];
    __m512 vc[KN_FA5_RV];
    int ja = t->ja[t->act[i0]], je = t->je[t->act[i0]];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        uint32_t row = t->act[i0 + (uint32_t)r];
        p[r] = sc[row];
        o[r] = t->o[row];
        vc[r] = _mm512_set1_ps(cf[row]);
    }
    uint32_t dmain = hd & ~7u;
    for (uint32_t d0 = 0; d0 < dmain; d0 += 64) {
        /* zmm v covers d0 + 16 v ..; km[v]: its lanes below dmain (V rows
         * are padded to 16 floats, so V loads may run past dmain). */
        __mmask16 km[4];
        __m512 acc[KN_FA5_RV][4];
#pragma GCC unroll 4
        for (uint32_t v = 0; v < 4; v++) {
            uint32_t b = d0 + 16 * v, n = b >= dmain ? 0 : dmain - b > 16 ? 16 : dmain - b;
            km[v] = (__mmask16)((1u << n) - 1u);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (uint32_t v = 0; v < 4; v++)
                acc[r][v] = _mm512_mul_ps(_mm512_maskz_loadu_ps(km[v], o[r] + d0 + 16 * v), vc[r]);
        if (km[2]) {
            for (int j = ja; j <= je; j++) {
                const float *vr = vb + (size_t)j * ld + d0;
                __m512 v0 = _mm512_load_ps(vr), v1 = _mm512_load_ps(vr + 16);
                __m512 v2 = _mm512_load_ps(vr + 32), v3 = _mm512_load_ps(vr + 48);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m512 pj = _mm512_set1_ps(p[r][j]);
                    acc[r][0] = _mm512_fmadd_ps(pj, v0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(pj, v1, acc[r][1]);
                    acc[r][2] = _mm512_fmadd_ps(pj, v2, acc[r][2]);
                    acc[r][3] = _mm512_fmadd_ps(pj, v3, acc[r][3]);
                }
            }
        } else {
            for (int j = ja; j <= je; j++) {
                const float *vr = vb + (size_t)j * ld + d0;
                __m512 v0 = _mm512_load_ps(vr), v1 = _mm512_load_ps(vr + 16);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    __m512 pj = _mm512_set1_ps(p[r][j]);
                    acc[r][0] = _mm512_fmadd_ps(pj, v0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(pj, v1, acc[r][1]);
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (uint32_t v = 0; v < 4; v++)
                _mm512_mask_storeu_ps(o[r] + d0 + 16 * v, km[v], acc[r][v]);
    }
    for (int r = 0; r < R; r++)
        for (uint32_t d = dmain; d < hd; d++) {
            float s = o[r][d] * cf[t->act[i0 + (uint32_t)r]];
            for (int j = ja; j <= je; j++)
                s = fmaf(p[r][j], vb[(size_t)j * ld + d], s);
            o[r][d] = s;
        }
}

void kn_avx512_attend_block(kn_fa_tile *t, const float *kt, const float *vb,
                            size_t ld, uint32_t hd)
{
    _Alignas(64) float sc[KN_FA_M][KN_FA_B];
    float cf[KN_FA_M];
    int inv_root;
    const __m512 root = _mm512_set1_ps(kn_fa_root(hd, &inv_root));
    uint32_t i = 0, n = t->nact;
    for (; i + KN_FA5_RS <= n; i += KN_FA5_RS)
        scores_rows(t, i, KN_FA5_RS, kt, hd, root, inv_root, sc);
    if (n - i >= 4) {
        scores_rows(t, i, 4, kt, hd, root, inv_root, sc);
        i += 4;
    }
    switch (n - i) {
    case 3: scores_rows(t, i, 3, kt, hd, root, inv_root, sc); break;
    case 2: scores_rows(t, i, 2, kt, hd, root, inv_root, sc); break;
    case 1: scores_rows(t, i, 1, kt, hd, root, inv_root, sc); break;
    default: break;
    }
    for (i = 0; i < n; i++)
        cf[t->act[i]] = softmax_row(t, t->act[i], sc[t->act[i]]);
    for (i = 0; i < n;) {
        uint32_t e = i + 1, r0 = t->act[i];
        while (e < n && t->ja[t->act[e]] == t->ja[r0] && t->je[t->act[e]] == t->je[r0])
            e++;
        for (; i + KN_FA5_RV <= e; i += KN_FA5_RV)
            pv_rows(t, i, KN_FA5_RV, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd);
        switch (e - i) {
        case 3: pv_rows(t, i, 3, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd); break;
        case 2: pv_rows(t, i, 2, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd); break;
        case 1: pv_rows(t, i, 1, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd); break;
        default: break;
        }
        i = e;
    }
}

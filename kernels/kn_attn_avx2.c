/*
 * kn_attn_avx2.c - attention in tiles, flash-attention style on the CPU
 * (compiled with -mavx2 -mfma -mf16c; kn_attention calls it only when
 * kn_cpu_has_avx2()).
 *
 * A tile is the query rows of up to KN_FA_M / group consecutive tokens of
 * one sequence times the group query heads that share one KV head.  The
 * tile walks the cached positions in blocks of KN_FA_B, each K and V row
 * converted to float32 once per block (into L1) and used by every row of
 * the tile, with an online softmax: no score row longer than a block, and
 * K/V are read once per tile instead of once per (token, head).
 *
 * The invariant (a sequence alone or in a batch, 1 or 2 threads: the same
 * bits): a row's arithmetic depends only on its query, its position and
 * the cache, never on the other rows of its tile.  Blocks are aligned to
 * absolute positions (multiples of KN_FA_B), so a row sees the same blocks
 * in any tile; per block and row:
 *   s_j   = (q . k_j, one FMA chain over d = 0 .. head_dim-1 in the lane
 *           of position j; K transposed per block) / sqrt(head_dim)
 *   m'    = max(m, max_j s_j);  c = expf(m - m')  (0 for the first block)
 *   p_j   = kn_exp256(s_j - m') lanes by j - block start, 0 where not attended
 *   l     = l * c + hsum(sum of the block's 4 p vectors in order)
 *   o     = o * c + sum_j p_j v_j   (j ascending; o lives in the output row)
 * and at the end o *= 1 / l.  Decode (one token) runs the same code, so a
 * prompt row and a decode row of the same position agree bit for bit.
 *
 * Register blocking across rows (the speed; the bits stay): per block the
 * scores are computed KN_FA_RS rows at a time (2 rows x 32 positions = 8
 * chains; one K^T load feeds 2 FMAs, each row's chain over d unchanged),
 * the softmax row by row, and P.V KN_FA_RV rows x 32 output values at a
 * time over runs of rows that attend the same lanes (all rows of a token
 * do; in off-diagonal blocks all rows of the tile), each output value's
 * chain over j unchanged.  Rows of a run with different lanes are never
 * blocked together: an extra "0 * v" term could turn a -0 into +0 (and
 * unconverted V lanes are not finite).  Exact shortcuts: the block max
 * is taken in vectors (exact; NaN lanes skipped as by the scalar loop;
 * only a zero's sign can differ, and m only enters exp(s - m) and
 * expf(m - m'), where +-0 give the same bits); expf(m - m') is not called
 * when m' = m (expf(+0) = 1 and o * 1 = o); x / sqrt(head_dim) is
 * x * 2^-k when sqrt(head_dim) = 2^k (head_dim 64: the same correctly
 * rounded value).  The driver counts ring slots up (one division per
 * block) and prefetches the next block's K/V rows into L2.  With AVX-512
 * the block step is kn_attn_avx512.c's (the same arithmetic, 8 rows of
 * scores and 4 rows x 64 outputs of P.V per register tile).
 *
 * Measured (bench_attention, 1 thread, CPU time, medians of 7
 * interleaved rounds, load 4.6-4.9, head_dim 64, f16 KV; docs/
 * benchmarks.md i8_attn): this AVX2 path 1.21-1.47x main's kernel (19-25
 * GMAC per CPU-second against 15-19), the AVX-512 one 1.54-1.93x.  Main's
 * bits are kept: bench_attention --dump (every KV type, head_dim 13/64/
 * 128, groups 1-8, windows, ring wrap) gives equal files from main's
 * build and from this one, with and without MC_NO_AVX512.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

/* Ring slot's K or V row of head kvh as float32, as kn_kv_at() gives. */
KN_AI void kv_row_f32(const kn_kv *kv, const void *base, const float *scale,
                      uint64_t slot, uint32_t kvh, float *out)
{
    uint32_t hd = kv->head_dim, d = 0;
    size_t off = (size_t)slot * kv->n_kv_heads * hd + (size_t)kvh * hd;
    switch (kv->type) {
    case KN_KV_F32:
        for (; d < hd; d++)
            out[d] = ((const float *)base)[off + d];
        break;
    case KN_KV_F16: {
        const uint16_t *p = (const uint16_t *)base + off;
        for (; d + 8 <= hd; d += 8)
            _mm256_store_ps(out + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + d))));
        for (; d < hd; d++)
            out[d] = _cvtsh_ss(p[d]);
        break;
    }
    default: {
        const int8_t *p = (const int8_t *)base + off;
        __m256 s = _mm256_set1_ps(scale[slot * kv->n_kv_heads + kvh]);
        for (; d + 8 <= hd; d += 8)
            _mm256_store_ps(out + d, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                        _mm_loadl_epi64((const __m128i *)(p + d))))));
        for (; d < hd; d++)
            out[d] = scale[slot * kv->n_kv_heads + kvh] * (float)p[d];
        break;
    }
    }
}

/* Prefetch ring slot's K or V row of head kvh into L2 (the next block's
 * rows are fetched while this block computes). */
KN_AI void kv_row_prefetch(const kn_kv *kv, const void *base, const float *scale,
                           uint64_t slot, uint32_t kvh)
{
    size_t es = kv->type == KN_KV_F32 ? 4 : kv->type == KN_KV_F16 ? 2 : 1;
    size_t off = ((size_t)slot * kv->n_kv_heads * kv->head_dim +
                  (size_t)kvh * kv->head_dim) * es;
    size_t n = (size_t)kv->head_dim * es;
    const char *p = (const char *)base + off;
    for (size_t b = 0; b < n; b += 64)
        _mm_prefetch(p + b, _MM_HINT_T1);
    _mm_prefetch(p + n - 1, _MM_HINT_T1);
    if (scale)
        _mm_prefetch((const char *)(scale + slot * kv->n_kv_heads + kvh), _MM_HINT_T1);
}

/* dst[i][j] = src[j][i] for an 8 x 8 block (row strides ls, ld). */
KN_AI void transpose8(const float *src, size_t ls, float *dst, size_t ld)
{
    __m256 r[8], t[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_load_ps(src + (size_t)i * ls);
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        _mm256_store_ps(dst + (size_t)i * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_store_ps(dst + (size_t)(i + 4) * ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* Rows blocked per register tile: the score step holds KN_FA_RS rows x
 * 32 positions (8 chains: one K^T load feeds KN_FA_RS FMAs), the P.V step
 * KN_FA_RV rows x 32 output values. */
#define KN_FA_RS 2
#define KN_FA_RV 2

/* Scores of R rows (t->act[i0 ..]) for the block: one FMA chain over
 * d per lane, / sqrt(head_dim), into sc[row][lane].  root: sqrt(head_dim),
 * or its reciprocal when inv_root (see attn_root). */
KN_AI void scores_rows(const kn_fa_tile *t, uint32_t i0, const int R,
                       const float *kt, uint32_t hd, __m256 root, int inv_root,
                       float (*sc)[KN_FA_B])
{
    __m256 s[KN_FA_RS][4];
    const float *q[KN_FA_RS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        q[r] = t->q[t->act[i0 + (uint32_t)r]];
        s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_ps();
    }
    for (uint32_t d = 0; d < hd; d++) {
        const float *k = kt + (size_t)d * KN_FA_B;
        __m256 k0 = _mm256_load_ps(k), k1 = _mm256_load_ps(k + 8);
        __m256 k2 = _mm256_load_ps(k + 16), k3 = _mm256_load_ps(k + 24);
        /* Keep each K^T vector in a register: GCC would otherwise fold
         * the load into every row's FMA and load it R times. */
        __asm__("" : "+x"(k0), "+x"(k1), "+x"(k2), "+x"(k3));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 qd = _mm256_broadcast_ss(q[r] + d);
            s[r][0] = _mm256_fmadd_ps(qd, k0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(qd, k1, s[r][1]);
            s[r][2] = _mm256_fmadd_ps(qd, k2, s[r][2]);
            s[r][3] = _mm256_fmadd_ps(qd, k3, s[r][3]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *o = sc[t->act[i0 + (uint32_t)r]];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++)
            _mm256_store_ps(o + 8 * v, inv_root ? _mm256_mul_ps(s[r][v], root)
                                                : _mm256_div_ps(s[r][v], root));
    }
}

/* Row r's online-softmax step: its scores sc (lanes ja .. je attended)
 * become p (0 at the unattended lanes ja .. je needs; the others keep the
 * score), m and l are updated, and the factor c for o is returned. */
static float softmax_row(kn_fa_tile *t, uint32_t r, float *sc)
{
    int ja = t->ja[r], je = t->je[r];
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lo = _mm256_set1_epi32(ja - 1), hi = _mm256_set1_epi32(je + 1);
    __m256 ins[KN_FA_B / 8];
    /* The block max over the attended lanes.  max_ps(s, acc) keeps acc
     * where s is NaN, as the scalar "s > bmax ? s : bmax" does, and max is
     * exact, so only the sign of a zero max could differ from the scalar
     * loop's -- and m only enters exp(s - m) and expf(m - m'), where +0
     * and -0 give the same bits. */
    __m256 mx = _mm256_set1_ps(-INFINITY);
#pragma GCC unroll 4
    for (int g = 0; g < KN_FA_B; g += 8) {
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(g), lane);
        ins[g / 8] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx, lo),
                                                          _mm256_cmpgt_epi32(hi, idx)));
        __m256 sv = _mm256_blendv_ps(mx, _mm256_load_ps(sc + g), ins[g / 8]);
        mx = _mm256_max_ps(sv, mx);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float bmax = _mm_cvtss_f32(h);
    float mo = t->m[r];
    float mn = bmax > mo ? bmax : mo;
    /* expf(+0) is 1 exactly: skip the call when the max stays. */
    float c = mo == -INFINITY ? 0.0f : mo == mn && mn < INFINITY ? 1.0f : expf(mo - mn);
    __m256 vm = _mm256_set1_ps(mn), bs = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int g = 0; g < KN_FA_B; g += 8) {
        __m256 p = _mm256_setzero_ps();
        if (g + 7 >= ja && g <= je) {
            __m256 sv = _mm256_blendv_ps(vm, _mm256_load_ps(sc + g), ins[g / 8]);
            p = _mm256_and_ps(kn_exp256(_mm256_sub_ps(sv, vm)), ins[g / 8]);
            _mm256_store_ps(sc + g, p);
        }
        bs = _mm256_add_ps(bs, p);
    }
    t->l[r] = t->l[r] * c + kn_hsum256(bs);
    t->m[r] = mn;
    return c;
}

/* o = o * c + sum_j p_j v_j (j = ja .. je ascending) for R rows
 * (t->act[i0 ..]) that attend the same lanes: 32 output values of each
 * at a time, one V load per R FMAs. */
KN_AI void pv_rows(const kn_fa_tile *t, uint32_t i0, const int R,
                   const float (*sc)[KN_FA_B], const float *cf,
                   const float *vb, size_t ld, uint32_t hd)
{
    const float *p[KN_FA_RV];
    float *o[KN_FA_RV];
    __m256 vc[KN_FA_RV];
    int ja = t->ja[t->act[i0]], je = t->je[t->act[i0]];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        uint32_t row = t->act[i0 + (uint32_t)r];
        p[r] = sc[row];
        o[r] = t->o[row];
        vc[r] = _mm256_set1_ps(cf[row]);
    }
    uint32_t dmain = hd & ~7u;
    for (uint32_t d0 = 0; d0 < dmain; d0 += 32) {
        uint32_t nv = (dmain - d0) / 8 < 4 ? (dmain - d0) / 8 : 4;
        __m256 acc[KN_FA_RV][4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (uint32_t v = 0; v < 4; v++)
                acc[r][v] = v < nv ? _mm256_mul_ps(_mm256_loadu_ps(o[r] + d0 + 8 * v), vc[r])
                                   : _mm256_setzero_ps();
        for (int j = ja; j <= je; j++) {
            const float *vr = vb + (size_t)j * ld + d0;
            __m256 vv[4];
#pragma GCC unroll 4
            for (uint32_t v = 0; v < 4; v++)
                vv[v] = v < nv ? _mm256_load_ps(vr + 8 * v) : _mm256_setzero_ps();
            __asm__("" : "+x"(vv[0]), "+x"(vv[1]), "+x"(vv[2]), "+x"(vv[3]));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256 pj = _mm256_broadcast_ss(p[r] + j);
#pragma GCC unroll 4
                for (uint32_t v = 0; v < 4; v++)
                    if (v < nv)
                        acc[r][v] = _mm256_fmadd_ps(pj, vv[v], acc[r][v]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (uint32_t v = 0; v < 4; v++)
                if (v < nv)
                    _mm256_storeu_ps(o[r] + d0 + 8 * v, acc[r][v]);
    }
    for (int r = 0; r < R; r++)
        for (uint32_t d = dmain; d < hd; d++) {
            float s = o[r][d] * cf[t->act[i0 + (uint32_t)r]];
            for (int j = ja; j <= je; j++)
                s = fmaf(p[r][j], vb[(size_t)j * ld + d], s);
            o[r][d] = s;
        }
}

/* The AVX2 block step: scores KN_FA_RS rows at a time, the softmax row
 * by row, P.V KN_FA_RV rows at a time over runs of rows that attend the
 * same lanes (the rows of one token always do). */
static void attend_block(kn_fa_tile *t, const float *kt, const float *vb,
                         size_t ld, uint32_t hd)
{
    _Alignas(32) float sc[KN_FA_M][KN_FA_B];
    float cf[KN_FA_M];
    int inv_root;
    const __m256 root = _mm256_set1_ps(kn_fa_root(hd, &inv_root));
    uint32_t i = 0, n = t->nact;
    for (; i + KN_FA_RS <= n; i += KN_FA_RS)
        scores_rows(t, i, KN_FA_RS, kt, hd, root, inv_root, sc);
    for (; i < n; i++)
        scores_rows(t, i, 1, kt, hd, root, inv_root, sc);
    for (i = 0; i < n; i++)
        cf[t->act[i]] = softmax_row(t, t->act[i], sc[t->act[i]]);
    for (i = 0; i < n;) {
        uint32_t e = i + 1, r0 = t->act[i];
        while (e < n && t->ja[t->act[e]] == t->ja[r0] && t->je[t->act[e]] == t->je[r0])
            e++;
        for (; i + KN_FA_RV <= e; i += KN_FA_RV)
            pv_rows(t, i, KN_FA_RV, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd);
        for (; i < e; i++)
            pv_rows(t, i, 1, (const float (*)[KN_FA_B])sc, cf, vb, ld, hd);
    }
}

int kn_avx2_attn_tiled_ok(const kn_kv *kv, uint32_t n_heads)
{
    uint32_t grp = n_heads / kv->n_kv_heads;
    return kv->head_dim <= KN_FA_HD && grp >= 1 && grp <= KN_FA_M;
}

void kn_avx2_attend_tile(const kn_kv *kv, const float *q, size_t t0,
                         size_t tn, uint32_t n_heads, uint32_t kvh,
                         int64_t pos0, uint64_t window, float *out, int avx512)
{
    _Alignas(64) float kb[KN_FA_B * KN_FA_HD];
    _Alignas(64) float vb[KN_FA_B * KN_FA_HD];
    /* K transposed (8 x 8 blocks of kb); positions of a block that no row
     * attends keep whatever was there (finite: kb is zeroed once) and are
     * masked out of the softmax. */
    _Alignas(64) float kt[KN_FA_HD * KN_FA_B];
    kn_fa_tile t;
    const uint32_t hd = kv->head_dim, grp = n_heads / kv->n_kv_heads;
    const size_t nrow = tn * grp;
    const size_t ld = ((size_t)hd + 15) & ~(size_t)15; /* 64-byte rows */
    memset(kb, 0, (size_t)KN_FA_B * ld * sizeof(float));
    int64_t rpos[KN_FA_M], rfirst[KN_FA_M]; /* row r's position, first */
    for (size_t r = 0; r < nrow; r++) {
        size_t qi = (t0 + r / grp) * n_heads + kvh * grp + r % grp;
        rpos[r] = pos0 + (int64_t)(t0 + r / grp);
        rfirst[r] = kn_attn_first(rpos[r], window);
        t.q[r] = q + qi * hd;
        t.o[r] = out + qi * hd;
        t.m[r] = -INFINITY;
        t.l[r] = 0.0f;
        for (uint32_t d = 0; d < hd; d++)
            t.o[r][d] = 0.0f;
    }
    int64_t plo = pos0 + (int64_t)t0, phi = plo + (int64_t)tn - 1;
    int64_t jlo = kn_attn_first(plo, window);
    for (int64_t jb = jlo - jlo % KN_FA_B; jb <= phi; jb += KN_FA_B) {
        int64_t j0 = jb > jlo ? jb : jlo;
        int64_t j1 = jb + KN_FA_B - 1 < phi ? jb + KN_FA_B - 1 : phi;
        /* Ring slots counted up (one division per block, not per row). */
        uint64_t slot = (uint64_t)j0 % kv->cap;
        for (int64_t j = j0; j <= j1; j++) {
            kv_row_f32(kv, kv->k, kv->k_scale, slot, kvh, kb + (size_t)(j - jb) * ld);
            kv_row_f32(kv, kv->v, kv->v_scale, slot, kvh, vb + (size_t)(j - jb) * ld);
            slot = slot + 1 == kv->cap ? 0 : slot + 1;
        }
        for (int64_t j = j1 + 1; j <= j1 + KN_FA_B && j <= phi; j++) {
            kv_row_prefetch(kv, kv->k, kv->k_scale, slot, kvh);
            kv_row_prefetch(kv, kv->v, kv->v_scale, slot, kvh);
            slot = slot + 1 == kv->cap ? 0 : slot + 1;
        }
        for (size_t d0 = 0; d0 < hd; d0 += 8)
            for (size_t g = 0; g < KN_FA_B; g += 8)
                transpose8(kb + g * ld + d0, ld, kt + d0 * KN_FA_B + g, KN_FA_B);
        t.nact = 0;
        for (size_t r = 0; r < nrow; r++) {
            int64_t p = rpos[r], first = rfirst[r];
            int64_t a = first > jb ? first : jb;
            int64_t e = p < jb + KN_FA_B - 1 ? p : jb + KN_FA_B - 1;
            if (a > e)
                continue;
            t.ja[r] = (uint8_t)(a - jb);
            t.je[r] = (uint8_t)(e - jb);
            t.act[t.nact++] = (uint8_t)r;
        }
        if (avx512)
            kn_avx512_attend_block(&t, kt, vb, ld, hd);
        else
            attend_block(&t, kt, vb, ld, hd);
    }
    for (size_t r = 0; r < nrow; r++) {
        float inv = 1.0f / t.l[r];
        for (uint32_t d = 0; d < hd; d++)
            t.o[r][d] *= inv;
    }
}

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
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kn_avx2.h"
#include "kn_internal.h"

#define KN_AI __attribute__((always_inline)) static inline

/* Position j's K or V row of head kvh as float32, as kn_kv_at() gives. */
KN_AI void kv_row_f32(const kn_kv *kv, const void *base, const float *scale,
                      int64_t j, uint32_t kvh, float *out)
{
    uint32_t hd = kv->head_dim, d = 0;
    uint64_t slot = (uint64_t)j % kv->cap;
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

/* One row's update for the block starting at position jb whose attended
 * positions are [a, e] (jb <= a <= e < jb + KN_FA_B).  kt: the block's K
 * transposed, [head_dim][KN_FA_B]; vb: its V rows [KN_FA_B][ld]; o: the
 * output row (the running sum); m, l: the row's running max and
 * denominator. */
static void row_block(const float *q, const float *kt, const float *vb,
                      size_t ld, uint32_t hd, int64_t jb, int64_t a,
                      int64_t e, __m256 root, float *o, float *m, float *l)
{
    _Alignas(32) float sc[KN_FA_B];
    int ja = (int)(a - jb), je = (int)(e - jb);
    /* 32 scores at once, lane = position: a plain FMA chain over d. */
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (uint32_t d = 0; d < hd; d++) {
        __m256 qd = _mm256_broadcast_ss(q + d);
        const float *k = kt + (size_t)d * KN_FA_B;
        s0 = _mm256_fmadd_ps(qd, _mm256_load_ps(k), s0);
        s1 = _mm256_fmadd_ps(qd, _mm256_load_ps(k + 8), s1);
        s2 = _mm256_fmadd_ps(qd, _mm256_load_ps(k + 16), s2);
        s3 = _mm256_fmadd_ps(qd, _mm256_load_ps(k + 24), s3);
    }
    _mm256_store_ps(sc, _mm256_div_ps(s0, root));
    _mm256_store_ps(sc + 8, _mm256_div_ps(s1, root));
    _mm256_store_ps(sc + 16, _mm256_div_ps(s2, root));
    _mm256_store_ps(sc + 24, _mm256_div_ps(s3, root));
    float bmax = -INFINITY;
    for (int j = ja; j <= je; j++)
        bmax = sc[j] > bmax ? sc[j] : bmax;
    float mn = bmax > *m ? bmax : *m;
    float c = *m == -INFINITY ? 0.0f : expf(*m - mn);
    __m256 vm = _mm256_set1_ps(mn), bs = _mm256_setzero_ps();
    for (int g = 0; g < KN_FA_B; g += 8) {
        __m256 p = _mm256_setzero_ps();
        if (g + 7 >= ja && g <= je) {
            __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(g),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            __m256i in = _mm256_and_si256(
                _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(ja - 1)),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(je + 1), idx));
            __m256 sv = _mm256_blendv_ps(vm, _mm256_load_ps(sc + g), _mm256_castsi256_ps(in));
            p = _mm256_and_ps(kn_exp256(_mm256_sub_ps(sv, vm)), _mm256_castsi256_ps(in));
            _mm256_store_ps(sc + g, p);
        }
        bs = _mm256_add_ps(bs, p);
    }
    *l = *l * c + kn_hsum256(bs);
    *m = mn;
    __m256 vc = _mm256_set1_ps(c);
    uint32_t dmain = hd & ~7u;
    /* 64 output values at a time in 8 registers, positions in order. */
    for (uint32_t d0 = 0; d0 < dmain; d0 += 64) {
        uint32_t nv = (dmain - d0) / 8 < 8 ? (dmain - d0) / 8 : 8;
        __m256 acc[8];
#pragma GCC unroll 8
        for (uint32_t v = 0; v < 8; v++)
            acc[v] = v < nv ? _mm256_mul_ps(_mm256_loadu_ps(o + d0 + 8 * v), vc)
                            : _mm256_setzero_ps();
        for (int j = ja; j <= je; j++) {
            __m256 pj = _mm256_set1_ps(sc[j]);
            const float *vr = vb + (size_t)j * ld + d0;
#pragma GCC unroll 8
            for (uint32_t v = 0; v < 8; v++)
                if (v < nv)
                    acc[v] = _mm256_fmadd_ps(pj, _mm256_load_ps(vr + 8 * v), acc[v]);
        }
#pragma GCC unroll 8
        for (uint32_t v = 0; v < 8; v++)
            if (v < nv)
                _mm256_storeu_ps(o + d0 + 8 * v, acc[v]);
    }
    for (uint32_t d = dmain; d < hd; d++) {
        float s = o[d] * c;
        for (int j = ja; j <= je; j++)
            s = fmaf(sc[j], vb[(size_t)j * ld + d], s);
        o[d] = s;
    }
}

int kn_avx2_attn_tiled_ok(const kn_kv *kv, uint32_t n_heads)
{
    uint32_t grp = n_heads / kv->n_kv_heads;
    return kv->head_dim <= KN_FA_HD && grp >= 1 && grp <= KN_FA_M;
}

void kn_avx2_attend_tile(const kn_kv *kv, const float *q, size_t t0,
                         size_t tn, uint32_t n_heads, uint32_t kvh,
                         int64_t pos0, uint64_t window, float *out)
{
    _Alignas(64) float kb[KN_FA_B * KN_FA_HD];
    _Alignas(64) float vb[KN_FA_B * KN_FA_HD];
    /* K transposed (8 x 8 blocks of kb); positions of a block that no row
     * attends keep whatever was there (finite: kb is zeroed once) and are
     * masked out of the softmax. */
    _Alignas(64) float kt[KN_FA_HD * KN_FA_B];
    float m[KN_FA_M], l[KN_FA_M];
    const uint32_t hd = kv->head_dim, grp = n_heads / kv->n_kv_heads;
    const size_t nrow = tn * grp;
    /* Divide by sqrt(head_dim), as the references do (see attend_scalar). */
    const __m256 root = _mm256_set1_ps(sqrtf((float)hd));
    const size_t ld = ((size_t)hd + 15) & ~(size_t)15; /* 64-byte rows */
    memset(kb, 0, (size_t)KN_FA_B * ld * sizeof(float));
    for (size_t r = 0; r < nrow; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        float *o = out + ((t0 + r / grp) * n_heads + kvh * grp + r % grp) * hd;
        for (uint32_t d = 0; d < hd; d++)
            o[d] = 0.0f;
    }
    int64_t plo = pos0 + (int64_t)t0, phi = plo + (int64_t)tn - 1;
    int64_t jlo = kn_attn_first(plo, window);
    for (int64_t jb = jlo - jlo % KN_FA_B; jb <= phi; jb += KN_FA_B) {
        int64_t j0 = jb > jlo ? jb : jlo;
        int64_t j1 = jb + KN_FA_B - 1 < phi ? jb + KN_FA_B - 1 : phi;
        for (int64_t j = j0; j <= j1; j++) {
            kv_row_f32(kv, kv->k, kv->k_scale, j, kvh, kb + (size_t)(j - jb) * ld);
            kv_row_f32(kv, kv->v, kv->v_scale, j, kvh, vb + (size_t)(j - jb) * ld);
        }
        for (size_t d0 = 0; d0 < hd; d0 += 8)
            for (size_t g = 0; g < KN_FA_B; g += 8)
                transpose8(kb + g * ld + d0, ld, kt + d0 * KN_FA_B + g, KN_FA_B);
        for (size_t r = 0; r < nrow; r++) {
            int64_t p = plo + (int64_t)(r / grp);
            int64_t first = kn_attn_first(p, window);
            int64_t a = first > jb ? first : jb;
            int64_t e = p < jb + KN_FA_B - 1 ? p : jb + KN_FA_B - 1;
            if (a > e)
                continue;
            size_t qi = (t0 + r / grp) * n_heads + kvh * grp + r % grp;
            row_block(q + qi * hd, kt, vb, ld, hd, jb, a, e, root,
                      out + qi * hd, &m[r], &l[r]);
        }
    }
    for (size_t r = 0; r < nrow; r++) {
        float *o = out + ((t0 + r / grp) * n_heads + kvh * grp + r % grp) * hd;
        float inv = 1.0f / l[r];
        for (uint32_t d = 0; d < hd; d++)
            o[d] *= inv;
    }
}

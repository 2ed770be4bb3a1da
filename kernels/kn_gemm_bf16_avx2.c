/*
 * kn_gemm_bf16_avx2.c - kn_gemm_bf16.h's AVX2 path: vdpbf16ps's chains as
 * float FMAs, 16 rows x 4 tokens per tile.
 *
 * A bfloat16 x bfloat16 product is exact in float, so fma(w, x, S) is
 * vdpbf16ps's "add the exact product, round once"; the caller sets
 * MXCSR's FTZ and DAZ for its flushes.  The panel holds each pair's
 * column 2p + 1 before column 2p (16 rows each, as floats), so a pair
 * step is two FMAs per row vector in vdpbf16ps's order.  Weights are
 * converted 8 x 8 at a time and transposed in registers.
 */
#include <immintrin.h>

#include "kn_avx2.h"
#include "kn_gemm_bf16.h"
#include "kn_internal.h"

/* Row r's codes (or float weights rounded to bfloat16) of columns
 * [c, c + 8) as floats, c + 8 <= cols, the 8 columns in one group. */
static inline __m256 codes8(const kn_matrix *W, uint32_t r, uint32_t c)
{
    if (W->fmt == KN_W_F32)
        return kn_avx2_bf16_round8(
            _mm256_loadu_ps((const float *)W->data + (size_t)r * W->cols + c));
    if (W->fmt == KN_W_Q8) {
        const int8_t *row = (const int8_t *)W->data + (size_t)r * W->cols;
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(row + c));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    const uint8_t *row = (const uint8_t *)W->data + (size_t)r * kn_q4_row_bytes(W->cols);
    int32_t four;
    memcpy(&four, row + c / 2, 4);
    __m128i b = _mm_cvtsi32_si128(four);
    __m256i v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    v = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)),
                         _mm256_set1_epi32(15));
    int z = W->fmt == KN_W_Q4S
                ? KN_Q4_ZERO_SYM
                : W->zeros[(size_t)r * kn_q4_ngroups(W->cols, W->group) + c / W->group];
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(z)));
}

/* The 8 x 8 transpose of r0..r7 in place. */
static inline void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* Where column k (of the span) of row half h goes: pair k / 2, the odd
 * column first. */
static inline float *slot(float *w, uint32_t k, uint32_t h)
{
    return w + (k / 2) * 32 + ((k & 1u) ? 0 : 16) + 8 * h;
}

void kn_avx2_gemm_bf16_pack(const kn_matrix *W, uint32_t r0, uint32_t nr,
                            uint32_t c0, uint32_t span, float *w, float *s)
{
    uint32_t full = nr == 16 ? span & ~7u : 0;
    for (uint32_t h = 0; h < 2 && full; h++)
        for (uint32_t k = 0; k < full; k += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = codes8(W, r0 + 8 * h + (uint32_t)i, c0 + k);
            transpose8(v);
            for (uint32_t i = 0; i < 8; i++)
                _mm256_store_ps(slot(w, k + i, h), v[i]);
        }
    /* ragged rows or columns: one code at a time, zero past them */
    uint32_t pairs = (span + 1) / 2;
    for (uint32_t k = full; k < 2 * pairs; k++)
        for (uint32_t j = 0; j < 16; j++)
            slot(w, k, j / 8)[j % 8] =
                j < nr && k < span ? kn_bf16_weight(W, r0 + j, c0 + k) : 0.0f;
    uint32_t bc = kn_bf16_block_cols(W);
    for (uint32_t b = 0; b * bc < span; b++)
        for (uint32_t j = 0; j < 16; j++)
            s[b * 16 + j] = j < nr ? kn_bf16_scale(W, r0 + j, c0 + b * bc) : 0.0f;
}

#define STEP(t, a, b)                                                  \
    do {                                                               \
        __m256 xo = _mm256_broadcast_ss(x##t + 2 * p + 1);             \
        __m256 xe = _mm256_broadcast_ss(x##t + 2 * p);                 \
        a = _mm256_fmadd_ps(wo0, xo, a);                               \
        b = _mm256_fmadd_ps(wo1, xo, b);                               \
        a = _mm256_fmadd_ps(we0, xe, a);                               \
        b = _mm256_fmadd_ps(we1, xe, b);                               \
    } while (0)
/* A full panel takes plain loads and stores: masked stores are slow on
 * AMD (microcoded), and every panel but a matrix's last is full. */
#define FLUSH(t, a, b)                                                         \
    do {                                                                       \
        if (nt > t) {                                                          \
            float *yt = Y + t * ystride;                                       \
            if (nr == 16) {                                                    \
                _mm256_storeu_ps(yt, _mm256_fmadd_ps(sa, a, _mm256_loadu_ps(yt)));  \
                _mm256_storeu_ps(yt + 8, _mm256_fmadd_ps(sb, b,                \
                                 _mm256_loadu_ps(yt + 8)));                    \
            } else {                                                           \
                _mm256_maskstore_ps(yt, m0, _mm256_fmadd_ps(sa, a,             \
                                    _mm256_maskload_ps(yt, m0)));              \
                _mm256_maskstore_ps(yt + 8, m1, _mm256_fmadd_ps(sb, b,         \
                                    _mm256_maskload_ps(yt + 8, m1)));          \
            }                                                                  \
        }                                                                      \
    } while (0)

void kn_avx2_gemm_bf16_tile(const kn_bf16_panel *P, const float *x,
                            size_t xstride, size_t nt, float *Y,
                            size_t ystride, uint32_t nr)
{
    const float *x0 = x, *x1 = x + (nt > 1 ? xstride : 0),
                *x2 = x + (nt > 2 ? 2 * xstride : 0),
                *x3 = x + (nt > 3 ? 3 * xstride : 0);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nr - 8), lane);
    const float *w = P->w;
    for (size_t p0 = 0, blk = 0; p0 < P->pairs; p0 += P->bpairs, blk++) {
        size_t p1 = P->pairs - p0 < P->bpairs ? P->pairs : p0 + P->bpairs;
        __m256 z = _mm256_setzero_ps();
        __m256 a0 = z, b0 = z, a1 = z, b1 = z, a2 = z, b2 = z, a3 = z, b3 = z;
        for (size_t p = p0; p < p1; p++) {
            __m256 wo0 = _mm256_load_ps(w + p * 32), wo1 = _mm256_load_ps(w + p * 32 + 8);
            __m256 we0 = _mm256_load_ps(w + p * 32 + 16), we1 = _mm256_load_ps(w + p * 32 + 24);
            STEP(0, a0, b0);
            STEP(1, a1, b1);
            STEP(2, a2, b2);
            STEP(3, a3, b3);
        }
        __m256 sa = _mm256_load_ps(P->s + blk * 16), sb = _mm256_load_ps(P->s + blk * 16 + 8);
        FLUSH(0, a0, b0);
        FLUSH(1, a1, b1);
        FLUSH(2, a2, b2);
        FLUSH(3, a3, b3);
    }
}

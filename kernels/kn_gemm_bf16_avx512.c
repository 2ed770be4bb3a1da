/*
 * kn_gemm_bf16_avx512.c - kn_gemm_bf16.h's AVX512_BF16 path: the packing
 * of activations and weight panels, and the 32-row x 6-token tile of
 * vdpbf16ps chains.
 *
 * A zmm lane is an output row: weight word p of lane j holds row j's
 * codes of columns 2p (low) and 2p + 1 (high) as bfloat16, the token's
 * word p is broadcast, and vdpbf16ps adds, per lane, the high product and
 * then the low one to that row's chain: the order kn_gemm_bf16.h fixes.
 * The panel is packed once per 256-column span for all of a call's
 * tokens: each row's 32-column chunks are converted to words in a
 * row-major buffer and gathered into lanes (the gathers cost a few
 * percent of the span's products at 512 tokens).
 */
#include <immintrin.h>
#include <string.h>

#include "kn_avx512.h"
#include "kn_gemm_bf16.h"
#include "kn_internal.h"

/* vdpbf16ps needs AVX512_BF16 beyond this file's flags: the tile carries
 * the target itself and runs only when kn_cpu_has_avx512bf16(). */
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

/* The floats x[i] for lanes i in k, rounded to bfloat16 words (kn_bf16_bits),
 * the other lanes zero. */
static inline __m256i words16(const float *x, __mmask16 k)
{
    __m512i t = kn_bf16_top512(_mm512_maskz_loadu_epi32(k, x));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(t, 16));
}

/* The lanes of a 16-lane mask for the n (<= 16) elements left. */
static inline __mmask16 lanes16(uint32_t n)
{
    return n >= 16 ? (__mmask16)0xffffu : (__mmask16)((1u << n) - 1u);
}

void kn_avx512_bf16_row(const float *x, uint32_t cols, uint16_t *out)
{
    for (uint32_t j = 0; j < cols; j += 16) {
        __mmask16 k = lanes16(cols - j);
        _mm256_mask_storeu_epi16(out + j, k, words16(x + j, k));
    }
}

/* Row r's codes of columns [c, c + 32) (c a multiple of 32, so one
 * group) as 16-bit integers, columns at or past cols zero. */
static inline __m512i codes32(const kn_matrix *W, uint32_t r, uint32_t c)
{
    uint32_t n = W->cols - c < 32 ? W->cols - c : 32;
    __mmask32 k = n == 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
    if (W->fmt == KN_W_Q8) {
        const int8_t *row = (const int8_t *)W->data + (size_t)r * W->cols;
        return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(k, row + c));
    }
    const uint8_t *row = (const uint8_t *)W->data + (size_t)r * kn_q4_row_bytes(W->cols);
    uint32_t nb = (n + 1) / 2;
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << nb) - 1u), row + c / 2);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
    __m256i q = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    int z = W->fmt == KN_W_Q4S
                ? KN_Q4_ZERO_SYM
                : W->zeros[(size_t)r * kn_q4_ngroups(W->cols, W->group) + c / W->group];
    __m512i v = _mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16((short)z));
    return _mm512_maskz_mov_epi16(k, v);
}

/* 32 small integers (16-bit lanes) as bfloat16 words, in order (exact:
 * each has at most 8 significant bits). */
static inline __m512i words32(__m512i v)
{
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(v)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(v, 1)));
    __m256i a = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
    __m256i b = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Row r's float weights of columns [c, c + 32) rounded to bfloat16
 * words, columns at or past cols zero. */
static inline __m512i floats32(const kn_matrix *W, uint32_t r, uint32_t c)
{
    const float *row = (const float *)W->data + (size_t)r * W->cols + c;
    uint32_t n = W->cols - c;
    __m256i lo = words16(row, lanes16(n));
    __m256i hi = words16(row + 16, n > 16 ? lanes16(n - 16) : 0);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

void kn_avx512bf16_gemm_pack(const kn_matrix *W, uint32_t r0, uint32_t nr,
                             uint32_t c0, uint32_t span, uint32_t *w,
                             float *s)
{
    enum { PAIRS = KN_BF16_KC / 2 };
    _Alignas(64) uint32_t rowmajor[32 * PAIRS];
    uint32_t pairs = (span + 1) / 2, chunks = (span + 31) / 32;
    for (uint32_t j = 0; j < 32; j++)
        for (uint32_t k = 0; k < chunks; k++) {
            __m512i v = j >= nr                ? _mm512_setzero_si512()
                        : W->fmt == KN_W_F32 ? floats32(W, r0 + j, c0 + 32 * k)
                                             : words32(codes32(W, r0 + j, c0 + 32 * k));
            _mm512_store_si512(rowmajor + j * PAIRS + 16 * k, v);
        }
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8,
                                                             9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(PAIRS));
    for (uint32_t p = 0; p < pairs; p++) {
        __m512i at = _mm512_add_epi32(idx, _mm512_set1_epi32((int)p));
        _mm512_store_si512(w + p * 32, _mm512_i32gather_epi32(at, rowmajor, 4));
        _mm512_store_si512(w + p * 32 + 16,
                           _mm512_i32gather_epi32(at, rowmajor + 16 * PAIRS, 4));
    }
    uint32_t bc = kn_bf16_block_cols(W);
    for (uint32_t b = 0; b * bc < span; b++)
        for (uint32_t j = 0; j < 32; j++)
            s[b * 32 + j] = j < nr ? kn_bf16_scale(W, r0 + j, c0 + b * bc) : 0.0f;
}

#define DP(c, a, b) c = _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
/* token t's two chains (a, b: rows 0-15, 16-31) from word p */
#define STEP(t, a, b)                                             \
    do {                                                          \
        __m512i xv = _mm512_set1_epi32((int)x##t[p]);             \
        DP(a, wa, xv);                                            \
        DP(b, wb, xv);                                            \
    } while (0)
/* y = fma(s, S, y) for token t's rows */
#define FLUSH(t, a, b)                                                       \
    do {                                                                     \
        if (nt > t) {                                                        \
            float *yt = Y + t * ystride;                                     \
            _mm512_mask_storeu_ps(yt, m0, _mm512_fmadd_ps(sa, a,             \
                                  _mm512_maskz_loadu_ps(m0, yt)));          \
            _mm512_mask_storeu_ps(yt + 16, m1, _mm512_fmadd_ps(sb, b,        \
                                  _mm512_maskz_loadu_ps(m1, yt + 16)));     \
        }                                                                    \
    } while (0)

BF16_TARGET void kn_avx512bf16_gemm_tile(const kn_bf16_panel *P, const uint32_t *x,
                                         size_t xstride, size_t nt, float *Y,
                                         size_t ystride, uint32_t nr)
{
    /* tokens past nt repeat token 0; their sums are not stored */
    const uint32_t *x0 = x, *x1 = x + (nt > 1 ? xstride : 0),
                   *x2 = x + (nt > 2 ? 2 * xstride : 0),
                   *x3 = x + (nt > 3 ? 3 * xstride : 0),
                   *x4 = x + (nt > 4 ? 4 * xstride : 0),
                   *x5 = x + (nt > 5 ? 5 * xstride : 0);
    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr >= 32 ? (__mmask16)0xffff
                         : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u) : 0;
    const uint32_t *w = P->w;
    for (size_t p0 = 0, blk = 0; p0 < P->pairs; p0 += P->bpairs, blk++) {
        size_t p1 = P->pairs - p0 < P->bpairs ? P->pairs : p0 + P->bpairs;
        __m512 z = _mm512_setzero_ps();
        __m512 a0 = z, b0 = z, a1 = z, b1 = z, a2 = z, b2 = z, a3 = z, b3 = z,
               a4 = z, b4 = z, a5 = z, b5 = z;
        for (size_t p = p0; p < p1; p++) {
            __m512i wa = _mm512_load_si512(w + p * 32);
            __m512i wb = _mm512_load_si512(w + p * 32 + 16);
            STEP(0, a0, b0);
            STEP(1, a1, b1);
            STEP(2, a2, b2);
            STEP(3, a3, b3);
            STEP(4, a4, b4);
            STEP(5, a5, b5);
        }
        __m512 sa = _mm512_load_ps(P->s + blk * 32);
        __m512 sb = _mm512_load_ps(P->s + blk * 32 + 16);
        FLUSH(0, a0, b0);
        FLUSH(1, a1, b1);
        FLUSH(2, a2, b2);
        FLUSH(3, a3, b3);
        FLUSH(4, a4, b4);
        FLUSH(5, a5, b5);
    }
}

/* The AVX2 emulation's arithmetic with AVX-512 F, for CPUs with AVX-512
 * but not AVX512_BF16 (Skylake-SP to Ice Lake): the AVX2 path's panels
 * (16 rows, floats, the odd column before the even one), one zmm per
 * token, up to KN_BF16_NT512F tokens; each chain takes the odd column's
 * exact product and then the even one's, one rounding each, as
 * kn_avx2_gemm_bf16_tile does (FTZ and DAZ set by the caller). */
void kn_avx512_gemm_bf16_emu_tile(const kn_bf16_panel *P, const float *x,
                                  size_t xstride, size_t nt, float *Y,
                                  size_t ystride, uint32_t nr)
{
    enum { NT = KN_BF16_NT512F };
    const float *xt[NT];
    for (size_t t = 0; t < NT; t++)
        xt[t] = x + (t < nt ? t : 0) * xstride;
    const __mmask16 m = lanes16(nr);
    const float *w = P->w;
    for (size_t p0 = 0, blk = 0; p0 < P->pairs; p0 += P->bpairs, blk++) {
        size_t p1 = P->pairs - p0 < P->bpairs ? P->pairs : p0 + P->bpairs;
        __m512 a[NT];
        for (size_t t = 0; t < NT; t++)
            a[t] = _mm512_setzero_ps();
        for (size_t p = p0; p < p1; p++) {
            const __m512 wo = _mm512_load_ps(w + p * 32);
            const __m512 we = _mm512_load_ps(w + p * 32 + 16);
            for (size_t t = 0; t < NT; t++) {
                a[t] = _mm512_fmadd_ps(wo, _mm512_set1_ps(xt[t][2 * p + 1]), a[t]);
                a[t] = _mm512_fmadd_ps(we, _mm512_set1_ps(xt[t][2 * p]), a[t]);
            }
        }
        const __m512 s = _mm512_load_ps(P->s + blk * 16);
        for (size_t t = 0; t < nt; t++) {
            float *yt = Y + t * ystride;
            _mm512_mask_storeu_ps(yt, m,
                                  _mm512_fmadd_ps(s, a[t], _mm512_maskz_loadu_ps(m, yt)));
        }
    }
}

/*
 * kn_internal.h - helpers shared by the kernel files (not a public API).
 *
 * Scalar element access for every weight format, exactly as kn_quant.h
 * defines it, so the references, the scalar fallbacks and the row lookup
 * dequantize identically: Q8 w = scale * (float)q, Q4 w = (float)(q - z) *
 * scale, in float32.  The AVX2 paths compute the same float products.
 */
#ifndef KN_INTERNAL_H
#define KN_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_ops.h"

/* Byte k of row r's int4 codes (the row layout's data[r][k]), in either
 * layout (kn_quant.h). */
static inline uint8_t kn_q4_byte(const kn_matrix *W, uint32_t r, uint32_t k)
{
    if (W->layout == KN_LAYOUT_P16) {
        uint32_t b = k / 16, kb = k % 16;
        const uint8_t *panel = (const uint8_t *)W->data +
                               (size_t)(r / 16) * kn_p16_panel_bytes(W->cols, W->group);
        return panel[kn_p16_block_off(b, W->group) + (kb / 4) * 64 + (r % 16) * 4 + kb % 4];
    }
    return ((const uint8_t *)W->data)[(size_t)r * kn_q4_row_bytes(W->cols) + k];
}

/* Row r's int8 code of column c and its scale, in either layout
 * (kn_quant.h). */
static inline int8_t kn_q8_code(const kn_matrix *W, uint32_t r, uint32_t c)
{
    if (W->layout == KN_LAYOUT_P16) {
        const int8_t *panel = (const int8_t *)W->data +
                              (size_t)(r / 16) * kn_p16_q8_panel_bytes(W->cols);
        return panel[kn_p16_q8_block_off(c / 32) + ((c % 32) / 2) * 32 + (r % 16) * 2 + c % 2];
    }
    return ((const int8_t *)W->data)[(size_t)r * W->cols + c];
}
/* Where row r's f32 scale is; the scales of the rows after it up to the
 * end of its 16-row panel follow it (all of them in the row layout). */
static inline const float *kn_q8_scale_ptr(const kn_matrix *W, uint32_t r)
{
    if (W->layout == KN_LAYOUT_P16)
        return (const float *)(const void *)((const uint8_t *)W->data +
                                             (size_t)(r / 16) * kn_p16_q8_panel_bytes(W->cols)) +
               r % 16;
    return (const float *)W->scales + r;
}
static inline float kn_q8_scale(const kn_matrix *W, uint32_t r)
{
    return *kn_q8_scale_ptr(W, r);
}

/* The bfloat16 bits of x (kn_gram.h, kn_gemm_bf16.h): round to nearest
 * even, float and bfloat16 subnormals to signed zero (DAZ: a float below
 * FLT_MIN never rounds up into the normal range here), NaN kept quiet.
 * Branch-free selects, so that the packing loops vectorize. */
static inline uint32_t kn_bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t mag = u & 0x7fffffffu;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    r = mag < 0x00800000u ? (u >> 16) & 0x8000u : r;
    r = mag > 0x7f800000u ? (u >> 16) | 0x0040u : r;
    return r;
}

/* The f16 bits of row r's scale of group j, in either layout. */
static inline uint16_t kn_q4_scale_bits(const kn_matrix *W, uint32_t r, uint32_t j)
{
    if (W->layout == KN_LAYOUT_P16) {
        const uint8_t *panel = (const uint8_t *)W->data +
                               (size_t)(r / 16) * kn_p16_panel_bytes(W->cols, W->group);
        uint16_t v;
        memcpy(&v, panel + kn_p16_scale_off(j, W->group) + (r % 16) * 2, 2);
        return v;
    }
    return ((const uint16_t *)W->scales)[(size_t)r * kn_q4_ngroups(W->cols, W->group) + j];
}

static inline float kn_q4_at(const kn_matrix *W, uint32_t r, uint32_t c)
{
    uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    uint8_t b = kn_q4_byte(W, r, c / 2);
    int q = (c & 1) ? (b >> 4) : (b & 15);
    size_t gi = (size_t)r * ng + c / W->group;
    int z = W->fmt == KN_W_Q4 ? W->zeros[gi] : KN_Q4_ZERO_SYM;
    float s = fmt_f16_to_f32(kn_q4_scale_bits(W, r, c / W->group));
    return (float)(q - z) * s;
}

/* W[r][c] as float32. */
static inline float kn_w_at(const kn_matrix *W, uint32_t r, uint32_t c)
{
    size_t i = (size_t)r * W->cols + c;
    switch (W->fmt) {
    case KN_W_F32: return ((const float *)W->data)[i];
    case KN_W_F16: return fmt_f16_to_f32(((const uint16_t *)W->data)[i]);
    case KN_W_BF16: return fmt_bf16_to_f32(((const uint16_t *)W->data)[i]);
    case KN_W_Q8: return kn_q8_scale(W, r) * (float)kn_q8_code(W, r, c);
    case KN_W_Q4: case KN_W_Q4S: return kn_q4_at(W, r, c);
    default: return 0.0f;
    }
}

/* Dequantize W[r][c0 .. c0+n) into out[n] (scalar). */
void kn_dequant_span(const kn_matrix *W, uint32_t r, uint32_t c0, uint32_t n,
                     float *out);

/* Stored KV element (head-major within a slot) as float32. */
static inline float kn_kv_at(const kn_kv *kv, const void *base,
                             const float *scale, uint64_t slot, uint32_t h,
                             uint32_t d)
{
    size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    size_t i = (size_t)slot * w + (size_t)h * kv->head_dim + d;
    switch (kv->type) {
    case KN_KV_F32: return ((const float *)base)[i];
    case KN_KV_F16: return fmt_f16_to_f32(((const uint16_t *)base)[i]);
    case KN_KV_I8:
        return scale[(size_t)slot * kv->n_kv_heads + h] *
               (float)((const int8_t *)base)[i];
    default: return 0.0f;
    }
}

/* Floats of scratch one attention thread uses for up to nctx positions:
 * the score row and two head_dim vectors, each rounded to 16 floats so
 * every part stays 64-byte aligned relative to the scratch base. */
static inline uint64_t kn_attn_thread_floats(uint64_t nctx, uint32_t head_dim)
{
    return ((nctx + 15) & ~(uint64_t)15) + 2 * (((uint64_t)head_dim + 15) & ~(uint64_t)15);
}

/* First attended position for a query at position p. */
static inline int64_t kn_attn_first(int64_t p, uint64_t window)
{
    if (window == 0 || (uint64_t)p < window)
        return 0;
    return p - (int64_t)window + 1;
}

/* The rows [*r0, *r1) thread tid of nth computes in a matmul: contiguous
 * ranges, multiples of 16 (the AVX2 row blocks are 4, the AVX-512 ones 8
 * or 16, a KN_LAYOUT_P16 panel 16), so each thread streams its own part
 * of the matrix and writes its own outputs (a range's output is whole
 * cache lines).  Returns 0 when the thread has no rows.  Y rows of the
 * range are set to bias (or 0) for T tokens. */
static inline int kn_task_rows(float *Y, size_t T, uint32_t rows,
                               const float *bias, int tid, int nth,
                               uint32_t *r0, uint32_t *r1)
{
    uint32_t chunk = (uint32_t)(((uint64_t)rows + (uint64_t)nth - 1) / (uint64_t)nth);
    chunk = (chunk + 15) & ~15u;
    uint64_t a = (uint64_t)chunk * (uint64_t)tid;
    if (a >= rows)
        return 0;
    *r0 = (uint32_t)a;
    *r1 = a + chunk > rows ? rows : (uint32_t)(a + chunk);
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = *r0; r < *r1; r++)
            Y[t * rows + r] = bias ? bias[r] : 0.0f;
    return 1;
}

/* ---- AVX2 entry points (kn_ops_avx2.c; only call when kn_cpu_has_avx2()) */

/* The column block of the float products' canonical order: an output
 * element is summed KN_KC columns at a time (one 8-lane chain, hsum, tail),
 * by the decode kernels and the prefill GEMM alike (kn_gemm.h). */
#define KN_KC 512

/* Y rows [r0, r1) of every token, T <= KN_GEMM_MIN_T (the decode kernels;
 * kn_gemm_rows takes longer steps); Y already holds bias or 0 there. */
void kn_avx2_matmul_rows(const kn_matrix *W, const float *X, size_t T,
                         float *Y, uint32_t r0, uint32_t r1);
/* W[r][c0 .. c0+n) as float32 into out (c0 a multiple of 32, out 32-byte
 * aligned), the same values as kn_w_at(). */
void kn_avx2_dequant_block(const kn_matrix *W, uint32_t r, uint32_t c0,
                           uint32_t n, float *out);
/* 1 if kn_avx2_matmul_rows handles this matrix (format and group). */
int kn_avx2_matmul_supported(const kn_matrix *W);
/* kn_avx2_matmul_rows's bits for 2 <= T <= KN_GEMM_MIN_T with AVX-512
 * (kn_dec_avx512.c; only call when kn_cpu_has_avx512() and
 * kn_dec_avx512_supported(W): F32, F16, BF16, Q8). */
void kn_dec_rows_avx512(const kn_matrix *W, const float *X, size_t T,
                        float *Y, uint32_t r0, uint32_t r1);
int kn_dec_avx512_supported(const kn_matrix *W);
void kn_avx2_rmsnorm_row(float *out, const float *x, const float *w,
                         size_t n, float eps);
void kn_avx2_silu_mul(float *gate, const float *up, size_t n);
void kn_avx2_add(float *y, const float *x, size_t n);
/* fmt_f32_to_f16 of n values, bit for bit (the KV cache's stores). */
void kn_avx2_f32_to_f16(uint16_t *dst, const float *src, size_t n);
/* Tiled (flash-style) attention, kn_attn_avx2.c: positions per K/V
 * block, query rows per tile at most, largest head_dim (stack buffers). */
#define KN_FA_B 32
#define KN_FA_M 64
#define KN_FA_HD 256
/* 1 if kn_avx2_attend_tile takes this cache and head count. */
int kn_avx2_attn_tiled_ok(const kn_kv *kv, uint32_t n_heads);
/* Attention of tokens [t0, t0 + tn) (at positions pos0 + t) for the query
 * heads of KV head kvh; q, out: [T][n_heads][head_dim] of the whole call.
 * Writes only those rows of out.  (tn * group <= KN_FA_M.)  avx512: run
 * the blocks with kn_avx512_attend_block (only when kn_cpu_has_avx512();
 * the same bits). */
void kn_avx2_attend_tile(const kn_kv *kv, const float *q, size_t t0,
                         size_t tn, uint32_t n_heads, uint32_t kvh,
                         int64_t pos0, uint64_t window, float *out,
                         int avx512);
/* The scores' divisor sqrt(head_dim) (the references divide by it, see
 * kn_ops.c's attend_scalar), or its reciprocal with *inv = 1 when that is
 * a power of two (head_dim 4^k, e.g. 64): x * 2^-k and x / 2^k are the
 * same correctly rounded value, and a multiply is cheaper. */
static inline float kn_fa_root(uint32_t head_dim, int *inv)
{
    float root = sqrtf((float)head_dim);
    int e;
    *inv = frexpf(root, &e) == 0.5f;
    return *inv ? 1.0f / root : root;
}
/* One tile's state while it walks the K/V blocks (kn_attn_avx2.c). */
typedef struct kn_fa_tile {
    const float *q[KN_FA_M]; /* row r's query, [head_dim] */
    float *o[KN_FA_M];       /* row r's output row, the running sum */
    float m[KN_FA_M];        /* row r's running max (-inf: no block yet) */
    float l[KN_FA_M];        /* row r's running denominator */
    uint8_t ja[KN_FA_M];     /* this block: row r attends lanes ja .. je */
    uint8_t je[KN_FA_M];
    uint8_t act[KN_FA_M];    /* this block: the rows that attend a lane, */
    uint32_t nact;           /* ascending; rows of one token adjacent */
} kn_fa_tile;
/* One K/V block's update of the tile's active rows: kt is the block's K
 * transposed, [head_dim][KN_FA_B]; vb its V rows, [KN_FA_B][ld] (ld a
 * multiple of 16, 64-byte aligned).  The arithmetic of kn_attn_avx2.c's
 * header, row for row (kn_attn_avx512.c; only when kn_cpu_has_avx512()). */
void kn_avx512_attend_block(kn_fa_tile *t, const float *kt, const float *vb,
                            size_t ld, uint32_t hd);
void kn_avx2_softmax(float *x, size_t n);

/* ---- integer dot products (kn_qdot.h) ------------------------------------ */

/* The stored integer of W[r][c] for Q8/Q4/Q4S: q, q - zero, q - 8. */
static inline int kn_w_int(const kn_matrix *W, uint32_t r, uint32_t c)
{
    if (W->fmt == KN_W_Q8)
        return kn_q8_code(W, r, c);
    uint8_t b = kn_q4_byte(W, r, c / 2);
    int q = (c & 1) ? (b >> 4) : (b & 15);
    int z = W->fmt == KN_W_Q4
                ? W->zeros[(size_t)r * kn_q4_ngroups(W->cols, W->group) + c / W->group]
                : KN_Q4_ZERO_SYM;
    return q - z;
}

/* Nibble order of an int8 activation block (kn_qdot.h): column i of the
 * block sits at position kn_qact_i8_pos(i); position o holds column
 * kn_qact_i8_col(o). */
static inline uint32_t kn_qact_i8_pos(uint32_t i)
{
    return (i & 1) ? 16 + i / 2 : i / 2;
}
static inline uint32_t kn_qact_i8_col(uint32_t o)
{
    return o < 16 ? 2 * o : 2 * (o - 16) + 1;
}

/* The 8 lane sums of block b of row r against the block's 32 activations
 * (xq: int8 for Q4/Q4S, int16 for Q8; the lanes of kn_qdot.h; columns
 * past cols count 0).  Scalar: the reference, and the AVX2 path's ragged
 * last block. */
static inline void kn_qdot_lanes(const kn_matrix *W, uint32_t r, uint32_t b,
                                 const void *xq, int32_t lane[8])
{
    for (int l = 0; l < 8; l++) {
        int32_t s = 0;
        for (int k = 0; k < 4; k++) {
            /* o: the position in the block's activations; c its column */
            uint32_t o = W->fmt == KN_W_Q8 ? (uint32_t)(2 * l + (k & 1) + 16 * (k >> 1))
                                           : (uint32_t)(4 * l + k);
            uint32_t c = 32 * b + (W->fmt == KN_W_Q8 ? o : kn_qact_i8_col(o));
            if (c >= W->cols)
                continue;
            int x = W->fmt == KN_W_Q8 ? ((const int16_t *)xq)[o]
                                      : ((const int8_t *)xq)[o];
            s += kn_w_int(W, r, c) * x;
        }
        lane[l] = s;
    }
}

/* The float scale of block b of row r for an activation scale xd. */
static inline float kn_qdot_scale(const kn_matrix *W, uint32_t r, uint32_t b,
                                  float xd)
{
    if (W->fmt == KN_W_Q8)
        return xd;
    return fmt_f16_to_f32(kn_q4_scale_bits(W, r, 32 * b / W->group)) * xd;
}

/* Rows [r0, r1) of kn_matmul_q for T tokens; Y already holds bias or 0.
 * (kn_qdot_avx2.c; only call when kn_cpu_has_avx2().) */
void kn_avx2_matmul_q_rows(const kn_matrix *W, const void *xq,
                           const float *xd, size_t T, float *Y, uint32_t r0,
                           uint32_t r1);
/* kn_gemm_q_rows (kn_gemm.h) with AVX-512 VNNI, the same bits
 * (kn_qgemm_avx512.c; only call when kn_cpu_has_avx512()). */
void kn_avx512_gemm_q_rows(const kn_matrix *W, const void *xq, const float *xd,
                           size_t T, float *Y, uint32_t r0, uint32_t r1);
/* Rows [r0, r1) of kn_matmul_q for 1 <= T <= 8 tokens, full blocks
 * (kn_avx512_matmul_q_dec_ok says which formats and sizes), the same bits
 * as kn_avx2_matmul_q_rows (kn_qdec_avx512.c; only call when
 * kn_cpu_has_avx512()). */
int kn_avx512_matmul_q_dec_ok(const kn_matrix *W, size_t T);
void kn_avx512_matmul_q_dec(const kn_matrix *W, const void *xq, const float *xd,
                            size_t T, float *Y, uint32_t r0, uint32_t r1);
/* Y[t][r] += W[r] . Xq[t] for rows [r0, r1), t < T, in the scalar
 * reference's arithmetic (kn_qdot.c): the SIMD kernels' fallback for the
 * shapes they do not take (xq: the quantized rows, xd: their scales). */
void kn_ref_matmul_q_rows(const kn_matrix *W, const uint8_t *xq,
                          const float *xd, size_t T, float *Y, uint32_t r0,
                          uint32_t r1);
/* One activation block of n <= 32 values (zero-padded to 32), scalar;
 * q: int8 [32] (i16 = 0) or int16 [32] (i16 = 1). */
void kn_qact_block(const float *x, uint32_t n, int i16, void *q, float *d);
void kn_avx2_qact_quantize_row(const float *x, uint32_t cols, int i16,
                               void *q, float *d);

#endif /* KN_INTERNAL_H */

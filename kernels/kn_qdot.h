/*
 * kn_qdot.h - integer dot products: int8 / int4 weights against activations
 * quantized to int8 in blocks of 32 (as llama.cpp's q8_0 x q4_0 path), so
 * a quantized matrix is multiplied without dequantizing it to float.
 *
 * Activations (kn_qact_quantize): each row of cols floats is cut into
 * nb = ceil(cols / 32) blocks (the last one zero-padded); block b gets a
 * float scale d and integers q = nearbyint(x * (1 / d)) in float32, of the
 * kind the weights need (kn_qact_kind_of):
 *   KN_QACT_I8  (Q4, Q4S weights) d = max|x| / 127,   q int8 in +-127
 *   KN_QACT_I16 (Q8 weights)      d = max|x| / 32767, q int16 in +-32767
 * (d = 0 for an all-zero block).  An I8 block is stored in nibble order:
 * position i < 16 holds column 2i, position 16 + i column 2i + 1, the
 * order in which the int4 codes come out of their bytes (kn_quant.h: 2i
 * in the low nibble of byte i) with an and and a shift, no shuffle.
 * int8 x int8 would be as fast for Q8, but
 * on stories260k it moves the logits by 0.6x what int8 per-row weights
 * do (KLD 0.017 vs 0.028); int16 activations make that negligible.
 * Buffer layout for T rows:  q[T][nb * 32] (int8 or int16), then
 * float d[T][nb]  (kn_qact_bytes).
 *
 * The product, for weight row r and token t -- THE canonical arithmetic
 * ("block sums"), which the scalar reference (kn_ref_matmul_q), the AVX2
 * paths (kn_qdot_avx2.c decode, kn_gemm_avx2.c prefill) and the AVX-512
 * VNNI paths (kn_qdec_avx512.c decode, kn_qgemm_avx512.c prefill) all
 * follow exactly, so they agree bit for bit:
 *   w[c]  = the stored integer: Q8 q, Q4 q - zero, Q4S q - 8
 *   acc   = 0 (one float32)
 *   for each block b in order:
 *     i_b = sum over the block's columns of w[c] * q[c]   (exact int32:
 *           |i_b| < 2^16 for int4, < 2^27 for Q8; the zero padding of a
 *           ragged last block adds nothing)
 *     f_b = (float)i_b, rounded to nearest even (exact for int4; Q8 may
 *           round past 2^24: _mm*_cvtepi32_ps does the same)
 *     s_b = d[b] (Q8)  or  f16 scale[r][32b / group] * d[b] (Q4, Q4S),
 *           one float multiply
 *     acc = fma(f_b, s_b, acc)
 *   y = acc;  Q8: y *= row scale;   Y[t][r] = bias[r] + y   (bias 0 if NULL)
 * One float chain per (row, token) and one fma per block: kernels keep
 * rows (or tokens) in the vector lanes and reduce each block's integers
 * to one exact sum, as llama.cpp's repacked Q4_0 does.  (Until session 10
 * the form kept 8 float lanes per (row, token) and summed them at the
 * end; the block sums cost one fma per block instead of one per lane
 * group and measured 1.2-2.5x at prefill; docs/quantization.md has what
 * the change moved in the logits.)
 * Every output element depends only on its own row of activations and its
 * weight row, never on T or on the thread split: a sequence gives the same
 * logits alone or in a batch, whatever the thread count.
 *
 * What it changes against the float path (kn_matmul): the activation
 * rounding, a relative error of about 1/254 of each block's largest value;
 * docs/quantization.md has the KL divergence it adds on stories260k.
 * Exact work (calibration statistics, `mcompile eval`) keeps kn_matmul:
 * kn_block_forward uses this path only when its scratch asks for it.
 */
#ifndef KN_QDOT_H
#define KN_QDOT_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"

#define KN_QK 32 /* activation block (values); the lanes above assume 32 */

/* Blocks per row of cols values. */
static inline uint32_t kn_qact_blocks(uint32_t cols)
{
    return (cols + KN_QK - 1) / KN_QK;
}

typedef enum kn_qact_kind {
    KN_QACT_I8 = 0,   /* int8 per block, for Q4/Q4S weights */
    KN_QACT_I16 = 1,  /* int16 per block, for Q8 weights */
} kn_qact_kind;

static inline kn_qact_kind kn_qact_kind_of(const kn_matrix *W)
{
    return W->fmt == KN_W_Q8 ? KN_QACT_I16 : KN_QACT_I8;
}

/* Bytes of T quantized rows of cols values: T * nb * (32 * 1 or 2 + 4). */
static inline uint64_t kn_qact_bytes(kn_qact_kind k, uint64_t T, uint32_t cols)
{
    uint64_t qb = k == KN_QACT_I16 ? 2 * KN_QK : KN_QK;
    return T * kn_qact_blocks(cols) * (qb + sizeof(float));
}

/* 1 if W can be multiplied by kn_matmul_q: Q8, or Q4/Q4S whose group is a
 * power of two >= 32 (the activation block must not straddle two groups,
 * and the kernels find a block's group by a shift). */
int kn_qdot_supported(const kn_matrix *W);

/* 1 when the integer path is switched off for the whole process: by
 * kn_set_float_dot(1) or MC_FLOAT_DOT=1 in the environment (to measure
 * what the integer path changes, or to rule it out). */
int kn_float_dot(void);
void kn_set_float_dot(int on);

/* Quantize X [T][cols] into buf (kn_qact_bytes(k, T, cols) bytes, 4-byte
 * aligned; must not overlap X).  Same bytes with and without AVX2. */
void kn_qact_quantize(kn_qact_kind k, const float *X, size_t T, uint32_t cols,
                      void *buf);
void kn_ref_qact_quantize(kn_qact_kind k, const float *X, size_t T,
                          uint32_t cols, void *buf);
/* kn_qact_quantize's bytes, the rows split over pool's threads when there
 * are enough of them (a prefill); pool may be NULL. */
void kn_qact_quantize_pool(kn_pool *pool, kn_qact_kind k, const float *X,
                           size_t T, uint32_t cols, void *buf);

/* Y[t][r] = bias[r] + W[r] . Xq[t] (canonical arithmetic above) for t < T.
 * Xq: kn_qact_quantize(kn_qact_kind_of(W)) of T rows of W->cols values;
 * Y: [T][rows]; bias may be NULL.  Preconditions: kn_qdot_supported(W);
 * Q4 zeros <= 15 (the artifact loader checks them). */
void kn_matmul_q(kn_pool *p, const kn_matrix *W, const void *Xq, size_t T,
                 float *Y, const float *bias);
void kn_ref_matmul_q(const kn_matrix *W, const void *Xq, size_t T, float *Y,
                     const float *bias);

/* kn_matmul_q for n matrices of one activation kind sharing Xq, in jobs
 * of KN_MATMUL_MULTI_MAX over the pool (as kn_matmul_multi): the same
 * bits as n kn_matmul_q calls (kn_matmul_q is the n = 1 case). */
void kn_matmul_q_multi(kn_pool *p, int n, const kn_matrix *const W[],
                       const void *Xq, size_t T, float *const Y[],
                       const float *const B[]);

#endif /* KN_QDOT_H */

/*
 * kn_gemm.h - prefill matrix products: the T > KN_GEMM_MIN_T case of
 * kn_matmul (float activations) and kn_matmul_q (int8/int16 activation
 * blocks, kn_qdot.h), as cache-tiled, register-blocked GEMMs: AVX2
 * (kn_gemm_avx2.c), each with an AVX-512 twin giving the same bits (the
 * float one kn_gemm_avx512.c, the integer one kn_avx512_gemm_q_rows in
 * kn_qgemm_avx512.c, VNNI); the dispatchers in kn_ops.c / kn_qdot.c call
 * these when kn_cpu_has_avx2() (the AVX-512 ones when kn_cpu_has_avx512()
 * too) and keep their scalar paths otherwise.
 *
 * THE invariant: an output element has the same bits as the decode
 * kernels give it (T <= KN_GEMM_MIN_T), because a sequence must give the
 * same logits alone or in a batch, and a batch step mixes one sequence's
 * prompt rows with another's decode rows (T then depends on the mix).  So
 * these kernels change the loop order over (rows, tokens, column blocks)
 * for the caches, never the order in which one element is summed:
 *  - float: for each KN_KC-column block, one 8-lane FMA chain over the
 *    block's columns in order, kn_hsum256, the scalar tail, added to Y
 *    (the order kn_ops_avx2.c's decode path follows);
 *  - integer: kn_qdot.h's canonical arithmetic (block sums: per 32-column
 *    block one exact int32 sum, one fma with the block's scale, on one
 *    float chain per row and token).
 * test_kernels_quant and test_qdot check it for every T and thread count.
 *
 * Tiling (float): X is read in panels of KN_GEMM_TP tokens (L2), the
 * weights dequantized KN_GEMM_RP rows x KN_KC columns at a time into a
 * stack buffer (L1) reused by every token of the panel, and the product
 * done in 4-row x 3-token register tiles (12 accumulators).  The next
 * weight panel and the next token tile's lines of Y are prefetched in
 * software: both are strided, and waited on otherwise.  The AVX-512
 * kernel tiles the same way with 256-token panels and 8-row x 6-token
 * register tiles, each zmm holding two rows' 8-lane chains (its header
 * says why those are the AVX2 kernel's chains exactly).
 * Tiling (integer): 4 weight rows are unpacked once per token panel into a
 * stack buffer of signed bytes (|w| and w for maddubs/sign; Q8 widened to
 * int16) with their block scales as floats, then multiplied into 4-row x
 * 2-token (Q8) or 4 x 3 (Q4) register tiles (kn_gemm_avx2.c's qmicro
 * says why); the nibble
 * unpacking is paid once per panel instead of once per token tile, and
 * the next panel's weight bytes are prefetched while this one is used.
 */
#ifndef KN_GEMM_H
#define KN_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"

/* Steps of more tokens than this go through the GEMMs. */
#define KN_GEMM_MIN_T 8

/* Rows [r0, r1) of Y [T][rows] += W X^T for T tokens, float activations
 * X [T][cols]; Y already holds the bias or 0 there.  Precondition:
 * kn_avx2_matmul_supported(W), T > KN_GEMM_MIN_T, AVX2 present. */
void kn_gemm_rows(const kn_matrix *W, const float *X, size_t T, float *Y,
                  uint32_t r0, uint32_t r1);
/* kn_gemm_rows with AVX-512 (kn_gemm_avx512.c): the same contract and
 * the same bits.  Precondition: as kn_gemm_rows, and kn_cpu_has_avx512(). */
void kn_gemm_rows_avx512(const kn_matrix *W, const float *X, size_t T,
                         float *Y, uint32_t r0, uint32_t r1);

/* Rows [r0, r1) of Y += W Xq^T for T quantized activation rows (xq: the
 * integers [T][nb * 32] of kn_qact_kind_of(W), xd: the scales [T][nb]).
 * Precondition: kn_qdot_supported(W), T > KN_GEMM_MIN_T, AVX2 present. */
void kn_gemm_q_rows(const kn_matrix *W, const void *xq, const float *xd,
                    size_t T, float *Y, uint32_t r0, uint32_t r1);

#endif /* KN_GEMM_H */

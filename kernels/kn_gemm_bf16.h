/*
 * kn_gemm_bf16.h - the calibration's linears with bfloat16 products:
 * Y = W X^T for int8 / int4 weight codes (exact in bfloat16), or float
 * weights rounded to bfloat16, and activations rounded to bfloat16, the
 * products summed in float as
 * AVX512_BF16's vdpbf16ps sums them (twice the multiply-adds of a float
 * FMA per instruction), the scales applied after.
 *
 * Why: the calibration's quantized pass (the states x_q that the next
 * linears' Hessians come from) is about half of its forward work.  Its
 * weights are codes times scales, so only the activations lose bits when
 * they are rounded to bfloat16, and measured (docs/benchmarks.md, session
 * 14's simulation) that moves the calibrated KLD by -1 %.  The full-
 * precision pass takes the float weights' form where the user or the
 * int4 default asks (--calib-full-pass: the weights lose bits too, which
 * int4's error hides and int8's does not).  Every runtime path keeps its
 * float or integer arithmetic: nothing here is used outside the
 * calibration.
 *
 * The arithmetic, which every path below gives to the bit:
 *  - an activation x becomes bfloat16 by round to nearest even, a float
 *    or bfloat16 subnormal becoming signed zero (kn_gram.h's rounding);
 *  - a weight becomes its code c: q (KN_W_Q8), q - zero (KN_W_Q4),
 *    q - 8 (KN_W_Q4S), an integer of at most 8 bits, exact in bfloat16;
 *    a KN_W_F32 weight is rounded to bfloat16 as an activation is;
 *  - the columns split into blocks: Q4 / Q4S groups, 128 columns for Q8
 *    and F32 (the last block may be shorter; a missing odd column is
 *    zero);
 *  - per output element and block, a float chain S from +0 over the
 *    block's column pairs (2p, 2p + 1) in order, adding c * x of column
 *    2p + 1 and then of column 2p, each product exact and each add rounded
 *    once, a result below FLT_MIN flushed to zero (vdpbf16ps's order and
 *    its DAZ / FTZ);
 *  - y = fma(scale, S, y) per block in order, y starting at Y's value
 *    (the bias or 0), with DAZ and FTZ; F32's scale is 1.
 * Paths: AVX512_BF16 (kn_gemm_bf16_avx512.c) when kn_cpu_has_avx512bf16();
 * the same chains as float FMAs with MXCSR's FTZ and DAZ set, with
 * AVX-512 F when kn_cpu_has_avx512() (kn_avx512_gemm_bf16_emu_tile) or
 * AVX2 (kn_gemm_bf16_avx2.c) when kn_cpu_has_avx2(); the scalar loop of
 * kn_gemm_bf16.c otherwise, which flushes by hand.  test_gemm_bf16 checks
 * them against each other and against kn_ref_matmul_bf16.
 */
#ifndef KN_GEMM_BF16_H
#define KN_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"

/* Columns of a Q8 block (chain) and of a packed weight span. */
#define KN_BF16_Q8_BLOCK 128
#define KN_BF16_KC 256

/* Columns of one of W's chains (a block above): the int4 group, or
 * KN_BF16_Q8_BLOCK for int8. */
static inline uint32_t kn_bf16_block_cols(const kn_matrix *W)
{
    return W->fmt == KN_W_Q8 || W->fmt == KN_W_F32 ? KN_BF16_Q8_BLOCK : W->group;
}

/* Whether W takes this path: F32 or Q8 in the row layout, or Q4 / Q4S in
 * the row layout with a group that divides KN_BF16_KC.  (kn_block.c
 * sends F32 here only at kn_block_scratch.bf16_dot 2.) */
int kn_bf16_dot_supported(const kn_matrix *W);

/* The packed activations of T rows of cols columns: on the AVX512_BF16
 * path row t's bfloat16 values as 16-bit words at [t * stride], so that
 * 32-bit word p holds columns 2p (low half) and 2p + 1 (high half); on
 * the others the same values as floats at [t * stride]; stride =
 * kn_bf16_act_stride(cols), a zero after an odd cols.  Which path runs is
 * the CPU's (kn_cpu_has_avx512bf16(), kn_cpu_has_avx2(),
 * kn_force_scalar()) at the time of the call: pack and multiply under the
 * same settings. */
static inline size_t kn_bf16_act_stride(uint32_t cols)
{
    return (size_t)cols + (cols & 1u);
}
uint64_t kn_bf16_act_bytes(size_t T, uint32_t cols);

/* Round X [T][cols] into xb (kn_bf16_act_bytes(T, cols) bytes). */
void kn_bf16_act_pack(const float *X, size_t T, uint32_t cols, void *xb);

/* Y[i] = X W[i]^T + B[i] (B[i] may be NULL) for n matrices that
 * kn_bf16_dot_supported, all of xb's cols columns, sharing the packed
 * input xb of T rows: kn_matmul_multi's contract and job split. */
void kn_matmul_bf16_multi(kn_pool *p, int n, const kn_matrix *const W[],
                          const void *xb, size_t T, float *const Y[],
                          const float *const B[]);

/* The plain reference of the arithmetic above (element by element, the
 * flushes by hand) on the unrounded X; the tests compare with it. */
void kn_ref_matmul_bf16(const kn_matrix *W, const float *X, size_t T,
                        float *Y, const float *bias);

/* ---- internal: the tiles of the two vector paths ---- */

/* The bfloat16 weight of W[r][c] (c < cols) as a float: the integer code,
 * or the float weight rounded; and the scale of row r's block that holds
 * column c (1 for float weights). */
float kn_bf16_weight(const kn_matrix *W, uint32_t r, uint32_t c);
float kn_bf16_scale(const kn_matrix *W, uint32_t r, uint32_t c);

/* Packed weights of a panel of rows over one KN_BF16_KC span: the codes
 * and each block's scale, in the layout of the path's tile. */
typedef struct kn_bf16_panel {
    const void *w;      /* AVX512_BF16: uint32 [pairs][32] (row j in lane j
                           of two zmm: column 2p low, 2p + 1 high); AVX2:
                           float [pairs][2][16] (column 2p + 1's 16 rows,
                           then column 2p's) */
    const float *s;     /* [blocks][32 or 16] */
    size_t pairs;       /* pairs in the span */
    size_t bpairs;      /* pairs per block (the last may be fewer) */
} kn_bf16_panel;

#define KN_BF16_NT512 6      /* tokens per AVX512_BF16 tile */
#define KN_BF16_NT2 4        /* tokens per AVX2 tile */
#define KN_BF16_NT512F 8     /* tokens per AVX-512 F (emulation) tile */

/* Pack rows [r0, r0 + nr) (nr <= 32 / 16) of W over columns [c0, c0 +
 * span) (c0 a multiple of KN_BF16_KC, span <= KN_BF16_KC) into the path's
 * panel buffers: w (KN_BF16_KC / 2 * 32 words / floats), s
 * (KN_BF16_KC / 32 * 32 floats), rows past nr zero. */
void kn_avx512bf16_gemm_pack(const kn_matrix *W, uint32_t r0, uint32_t nr,
                             uint32_t c0, uint32_t span, uint32_t *w,
                             float *s);
void kn_avx2_gemm_bf16_pack(const kn_matrix *W, uint32_t r0, uint32_t nr,
                            uint32_t c0, uint32_t span, float *w, float *s);

/* Y[t * ystride + j] for j < nr and tokens t < nt (<= the path's tile;
 * token t's activations at x + t * xstride (words / floats), the span's
 * first column at 0): every block of the panel in order, y = fma(s, S,
 * y).  Run with MXCSR's FTZ and DAZ set. */
void kn_avx512bf16_gemm_tile(const kn_bf16_panel *P, const uint32_t *x,
                             size_t xstride, size_t nt, float *Y,
                             size_t ystride, uint32_t nr);
void kn_avx2_gemm_bf16_tile(const kn_bf16_panel *P, const float *x,
                            size_t xstride, size_t nt, float *Y,
                            size_t ystride, uint32_t nr);
/* The AVX2 tile's arithmetic and panels with AVX-512 F, where the CPU has
 * AVX-512 but not AVX512_BF16. */
void kn_avx512_gemm_bf16_emu_tile(const kn_bf16_panel *P, const float *x,
                                  size_t xstride, size_t nt, float *Y,
                                  size_t ystride, uint32_t nr);

/* kn_bf16_act_pack's words of one row with AVX-512 F/BW. */
void kn_avx512_bf16_row(const float *x, uint32_t cols, uint16_t *out);

#endif /* KN_GEMM_BF16_H */

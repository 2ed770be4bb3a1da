/*
 * cmp_gptq.h - GPTQ: quantization with second-order error compensation
 * (Frantar et al. 2022), as ../shared/REFERENCE.md describes it.
 *
 * For one linear layer W [rows][cols] and the Hessian of its inputs
 * H = (2/n) sum_t x_t x_t^T [cols][cols] (accumulated in double by
 * cmp_hessian_*):
 *   1. dead inputs (H_jj == 0): H_jj = 1 and W[:, j] = 0;
 *   2. act-order (optional): columns visited by descending diag(H);
 *   3. H += lambda I, lambda = damp * mean(diag H) (damp 0.01), multiplied
 *      by 10 while the Cholesky factorization fails (at most 6 times);
 *   4. U = upper Cholesky factor of H^-1;
 *   5. columns in blocks of 128: quantize column i, e = (w_i - q_i) / U_ii,
 *      update the block's later columns by e * U[i, ...]; after the block,
 *      propagate its errors to all later columns.
 * Group parameters (Q4/Q4S) come from the already-updated weights at each
 * group start (ragged last groups included; the block size is a multiple of
 * every group size, so a group never straddles a block).  With act-order
 * AND groups the parameters are computed up front from the (dead-zeroed)
 * original weights in ORIGINAL column order ("static groups"), so the
 * kn_quant.h layout, whose groups are consecutive original columns, stays
 * valid; only the visiting order changes.  Q8 takes one parameter set per
 * row from the row before any update.
 *
 * Memory: the function allocates (mc_malloc) a float copy of W, double
 * H work space [cols][cols] x 2 and small vectors; it never changes H or W.
 */
#ifndef CMP_GPTQ_H
#define CMP_GPTQ_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_quant.h"
#include "mc_error.h"

/* Running sum of x x^T over calibration tokens for one input width. */
typedef struct cmp_hessian {
    uint32_t cols;    /* input width */
    uint64_t n;       /* tokens added */
    double *h;        /* [cols][cols] sum x x^T; only the upper triangle
                         (j >= i) is maintained */
    double *xt;       /* scratch [cols][64]: a chunk of tokens, transposed */
} cmp_hessian;

/* Allocate a zeroed accumulator (h->h owned; free with cmp_hessian_free). */
mc_status cmp_hessian_init(cmp_hessian *h, uint32_t cols, mc_error *err);
void cmp_hessian_free(cmp_hessian *h);  /* NULL and zeroed structs are fine */
/* Add T rows of X [T][cols]. */
void cmp_hessian_add(cmp_hessian *h, const float *X, size_t T);
/* The mean of x_j^2 over the tokens added (the imatrix diagonal), into
 * out [cols]; zeros when n == 0. */
void cmp_hessian_diag_mean(const cmp_hessian *h, float *out);

typedef struct cmp_gptq_opts {
    double damp;        /* relative dampening; 0 -> 0.01 */
    int act_order;      /* 1: descending diag(H) order (static groups) */
    uint32_t block;     /* columns per lazy-update block; 0 -> 128 */
    int search_params;  /* 1: choose group parameters with the imatrix
                           search of cmp_quant_choose (diag H as importance);
                           0: plain min/max as in the reference GPTQ */
} cmp_gptq_opts;

/* Quantize w [rows][cols] with GPTQ into out (checked as cmp_qbuf_check).
 * h: the accumulated Hessian (h->cols == out->cols, h->n may be 0: then
 * every column is dead and the result is all zeros).  opts NULL =
 * defaults.  deq (optional, [rows][cols]) receives the dequantized result.
 * *damp_used (optional) receives the final lambda / mean(diag).  Returns
 * MC_ERR_NOMEM, MC_ERR_INVALID_ARG, MC_ERR_NONFINITE (weights or a Hessian
 * that stays indefinite after raising the dampening). */
mc_status cmp_gptq_quantize(const float *w, const cmp_hessian *h,
                            const cmp_gptq_opts *opts, cmp_qbuf *out,
                            float *deq, double *damp_used, mc_error *err);

/* Refit the scales of an already quantized q [rows][cols] (codes and
 * zero points kept) to the target weight w [rows][cols] under the full
 * Hessian h: per row, the scales s minimizing tr((w - Q(s)) H (w - Q(s))^T)
 * solve a (groups x groups) linear system; each row keeps whichever of the
 * old and the refit scales (rounded to their stored precision) gives the
 * smaller error, so the error never grows.  After GPTQ this recovers part
 * of what fixing the group parameters at each group start lost.  deq
 * (optional) receives the dequantized result.  Cost per row: one pass
 * over H's upper triangle (cols^2 / 2, contiguous) + groups^3; work space
 * groups^2 + cols doubles.  MC_ERR_NOMEM, MC_ERR_INVALID_ARG (widths
 * differ). */
mc_status cmp_gptq_refit_scales(const float *w, const cmp_hessian *h,
                                cmp_qbuf *q, float *deq, mc_error *err);

/* Output error of a replacement weight: tr((W - Q) Hs (W - Q)^T) where Hs is
 * the Hessian sum (= sum_t ||(W - Q) x_t||^2 over the added tokens).  w, q:
 * [rows][cols] float32; q NULL means zeros (then the result is the output
 * energy tr(W H W^T)).  Double accumulation; NaN if work space for a width
 * over 1024 cannot be allocated. */
double cmp_hessian_output_error(const cmp_hessian *h, const float *w,
                                const float *q, uint32_t rows);

/* Least-squares retargeting for inputs that already carry the error of
 * earlier quantized blocks: with x_f the full-precision model's input and
 * x_q the partly quantized model's input for the same token, returns
 *   W* = argmin_V sum_t ||W x_f - V x_q||^2 = W C (Hq + lambda I)^-1,
 * C = sum x_f x_q^T (c: [cols][cols] row-major, full), Hq = hq's sum,
 * lambda = damp * mean(diag Hq).  Since the residual of W* is orthogonal to
 * x_q, sum ||W x_f - Q x_q||^2 = const + tr((W* - Q) Hq (W* - Q)^T): GPTQ on
 * W* with Hq then minimizes the error against the full-precision outputs
 * (the "asymmetric calibration" of GPTAQ).  w, out: [rows][cols] (may not
 * alias).  MC_ERR_NOMEM, or MC_ERR_NONFINITE if Hq stays indefinite. */
mc_status cmp_gptq_retarget(const cmp_hessian *hq, const double *c,
                            const float *w, uint32_t rows, double damp,
                            float *out, mc_error *err);

#endif /* CMP_GPTQ_H */

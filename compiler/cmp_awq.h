/*
 * cmp_awq.h - AWQ: activation-aware per-input-channel scaling with a
 * clipping search (Lin et al. 2023; docs/quantization.md, "Methods").
 *
 * For a group of linears sharing one input X (q/k/v after the input norm;
 * gate/up after the post-attention norm; down after up; o after v):
 *   s_x[j] = mean |x_j| over the calibration tokens;
 *   for alpha in 0, 0.05, ..., 0.95: s = max(s_x^alpha, 1e-4),
 *     s /= sqrt(max(s) min(s)); quantize W diag(s) with RTN, and measure
 *     the output error sum_t ||x_t W^T - (x_t / s) Q(W diag(s))^T||^2;
 *   keep the alpha with the smallest error (alpha 0, s = 1, is plain RTN,
 *   so the search never loses to RTN).
 * The output error is computed exactly from the Hessian sum H = sum x x^T
 * (cmp_hessian, shared with GPTQ): err = tr(D H D^T), D = W - Q(W s)/s.
 * That uses every calibration token at a cost of rows*cols^2 per alpha
 * instead of tokens*rows*cols.
 *
 * Applying s keeps the full-precision function: W <- W diag(s) and the
 * producer of X divides by s: the RMSNorm weight (q/k/v, gate/up), the rows
 * (and bias) of up_proj (for down, since silu(g) * (u / s) = (silu(g) * u)
 * / s), or the rows of v_proj for o_proj.  The v fold is only valid when
 * every query head reads its own v head (kv_heads == heads): under GQA one
 * v row feeds several query heads' o columns, which would need equal scales
 * within a group, so the caller skips o_proj scaling then (as AutoAWQ does
 * when the v and o shapes differ).
 *
 * Clipping: afterwards, per row and group of the scaled weight, the range
 * max|w| is shrunk by 0, 5, ..., 45 % (weights clamped to +-max) and the
 * shrink with the smallest partial output error d^T H_gg d (d the error of
 * that group against the unclipped weights, H in the scaled input space)
 * is kept.  AutoAWQ skips q/k clipping; the caller decides.
 */
#ifndef CMP_AWQ_H
#define CMP_AWQ_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_gptq.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "mc_error.h"

/* One linear of a group: w [rows][cols] float32 (borrowed). */
typedef struct cmp_awq_linear {
    const float *w;
    uint32_t rows;
} cmp_awq_linear;

/* The alpha grid: alpha = k * CMP_AWQ_ALPHA_STEP for k < CMP_AWQ_ALPHAS
 * (0, 0.05, ..., 0.95); the coarse walk tries every CMP_AWQ_COARSE_STEP-th
 * point (k = 0, 3, ..., 18), then the points within two steps of the best
 * of those: 11 errors instead of 20, the same pick wherever the error is
 * unimodal along the grid. */
#define CMP_AWQ_ALPHA_STEP 0.05
#define CMP_AWQ_ALPHAS 20
#define CMP_AWQ_COARSE_STEP 3

/* How cmp_awq_search runs (NULL: one thread, the full grid). */
typedef struct cmp_awq_search_opts {
    kn_pool *pool; /* threads over each linear's rows (cmp_par_rows), or
                      NULL; the result does not depend on it, bit for bit:
                      every row's error is formed as alone and the rows are
                      added in order */
    int coarse;    /* 1: the coarse walk of the grid (above) */
    uint32_t sample_rows; /* 0: every row's error is measured.  Else a
                             linear of at least 2 * sample_rows rows is
                             measured on every stride-th row, stride =
                             min(CMP_AWQ_MAX_STRIDE, rows / sample_rows),
                             its error scaled by stride (an estimate of
                             the whole sum: the grid point it picks can
                             differ from the whole rows' pick where two
                             points are within the sample's noise) */
} cmp_awq_search_opts;

/* The calibration's sample (cmp_calib_layer.c, cmp_calib_group.c): 128
 * rows at least, every fourth row at most.  The grid is a third of the
 * calibration's search time at SmolLM2 widths when every row counts. */
#define CMP_AWQ_SAMPLE_ROWS 128
#define CMP_AWQ_MAX_STRIDE 4

/* Search the AWQ scales of a group of n linears over input width h->cols.
 * xabs: mean |x_j| [cols].  fmt/group: the target format.  s_out [cols]
 * receives the best scales (all 1 if alpha 0 wins); *alpha_out and
 * *err_out (both optional) the chosen alpha and its output error (summed
 * over the linears), *err0_out (optional) the error at alpha 0 (RTN).
 * Cost: rows * cols^2 per linear and grid point tried (rows / stride
 * with so->sample_rows), split over the pool's threads.  Allocates work
 * space (MC_ERR_NOMEM; cmp_awq_search_work_bytes). */
mc_status cmp_awq_search(const cmp_hessian *h, const float *xabs,
                         const cmp_awq_linear *lin, size_t n, kn_wformat fmt,
                         uint32_t group, const cmp_awq_search_opts *so,
                         float *s_out, double *alpha_out, double *err_out,
                         double *err0_out, mc_error *err);
/* Peak bytes cmp_awq_search allocates with `threads` threads (the pool's;
 * 1 for none) for linears of at most maxrows rows over cols inputs: the
 * scales (cols floats), the row errors (maxrows doubles), and per thread a
 * float copy of c rows (c = min(its share of the rows, whole blocks of
 * CMP_OERR_ROWS, maxrows with one thread; max(1, CMP_GPTQ_CHUNK_BYTES /
 * (threads * cols * 4)))) and the tiled error's work space
 * (cmp_qform_work_doubles(cols, c) doubles):
 *   cols * 4 + maxrows * 8 + threads * (c * cols * 4 + work * 8),
 * each of the four allocations at least 1 byte; when sample_rows (the
 * search's opts) samples a linear of maxrows rows, a second float copy of
 * c rows per thread (the sampled rows gathered). */
uint64_t cmp_awq_search_work_bytes(uint32_t maxrows, uint32_t cols, int threads,
                                   uint32_t sample_rows);

/* Clipping search on a weight already in the scaled space, in place:
 * w [rows][cols] is clamped per row and group (per row for Q8) to the best
 * shrunk range.  hs: the Hessian of the scaled inputs (see
 * cmp_awq_scale_hessian).  Returns MC_OK or MC_ERR_NOMEM. */
mc_status cmp_awq_clip(const cmp_hessian *hs, float *w, uint32_t rows,
                       kn_wformat fmt, uint32_t group, mc_error *err);
/* Peak bytes cmp_awq_clip allocates: one clipped group (span floats) and
 * its error (span doubles), span = cols for Q8, group otherwise:
 * span * 12, each allocation at least 1 byte. */
uint64_t cmp_awq_clip_work_bytes(uint32_t cols, kn_wformat fmt,
                                 uint32_t group);

/* Folding helpers.  All modify in place. */
/* w [rows][cols] <- w diag(s). */
void cmp_awq_scale_cols(float *w, uint32_t rows, uint32_t cols,
                        const float *s);
/* v[j] /= s[j] for n values (a norm weight, or a bias). */
void cmp_awq_div_vec(float *v, const float *s, uint32_t n);
/* Rows of w [rows][cols] divided: w[r][:] /= s[r] (prev linear's rows). */
void cmp_awq_div_rows(float *w, uint32_t rows, uint32_t cols, const float *s);
/* hs = diag(1/s) h diag(1/s) (the Hessian of x / s); hs initialized by the
 * caller with the same cols (cmp_hessian_init).  Allocates nothing. */
void cmp_awq_scale_hessian(const cmp_hessian *h, const float *s,
                           cmp_hessian *hs);

#endif /* CMP_AWQ_H */

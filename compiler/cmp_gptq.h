/*
 * cmp_gptq.h - GPTQ: quantization with second-order error compensation
 * (Frantar et al. 2022; docs/quantization.md, "Methods").
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
 * Steps 3-4 run in ONE [cols][cols] double matrix, in place (see
 * cmp_gptq_hinv_factor): with J the index reversal and H' the dampened,
 * permuted Hessian, chol(J H' J) = L L^T gives H'^-1 = (J L^-1 J)^T
 * (J L^-1 J), so U = J L^-1 J, an upper triangular matrix with a positive
 * diagonal: the (unique) upper Cholesky factor of H'^-1.
 *
 * Memory (why the layout is what it is): a 70B model has inputs 28672
 * wide, where one full [cols][cols] double matrix is 6.1 GiB.  The Hessian
 * sum therefore keeps only its upper triangle, packed (half that), and
 * GPTQ's work space holds one full matrix (U) plus a float copy of a chunk
 * of W's rows (rows are independent once U is known) and O(cols) vectors;
 * cmp_*_work_bytes give the exact peak each call allocates, for memory
 * estimates.  No function here changes H or W.
 */
#ifndef CMP_GPTQ_H
#define CMP_GPTQ_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_lanes.h"
#include "cmp_par.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "mc_error.h"

/* Running sum of x x^T over calibration tokens for one input width.
 * The sum is symmetric, so only its upper triangle is stored, packed row
 * by row: row i holds elements (i, i), (i, i+1), .., (i, cols-1)
 * contiguously from index cmp_hessian_row_offset(cols, i); cols*(cols+1)/2
 * doubles in all.  Rows stay contiguous, so the accumulation and every
 * reader that walks the upper triangle by rows keep unit stride. */
typedef struct cmp_hessian {
    uint32_t cols;    /* input width */
    uint64_t n;       /* tokens added */
    double *h;        /* packed upper triangle of sum x x^T,
                         [cols*(cols+1)/2] (layout above) */
    float *xt;        /* scratch for the blocked sums: a chunk of tokens
                         packed, kn_gram_scratch_floats(cols) floats */
    int bf16;         /* 1: cmp_hessian_add* sums bfloat16 products
                         (kn_gram_tri_bf16, the calibration's default);
                         0 after cmp_hessian_init: float products */
} cmp_hessian;

/* Index in h->h of element (i, i), the start of packed row i (i <= cols;
 * i == cols gives the total count).  i*cols - i*(i-1)/2, written as
 * i*(2 cols + 1 - i)/2 so that no term wraps at i = 0; the product is even
 * (one of its factors always is) and at most cols*(cols+1), twice the
 * packed count, so it fits size_t for any Hessian that can be allocated
 * (cols = 65536: about 2^32).  Element (i, j), j >= i, is at
 * cmp_hessian_row_offset(cols, i) + (j - i). */
static inline size_t cmp_hessian_row_offset(uint32_t cols, uint32_t i)
{
    return (size_t)i * (2 * (size_t)cols + 1 - i) / 2;
}

/* Allocate a zeroed accumulator (h->h owned; free with cmp_hessian_free). */
mc_status cmp_hessian_init(cmp_hessian *h, uint32_t cols, mc_error *err);
void cmp_hessian_free(cmp_hessian *h);  /* NULL and zeroed structs are fine */
/* Exact bytes cmp_hessian_init allocates for cols: the packed sum
 * (cols*(cols+1)/2 doubles) plus the xt scratch
 * (kn_gram_scratch_floats(cols) floats, about cols * 1 KiB). */
uint64_t cmp_hessian_bytes(uint32_t cols);
/* Zero the sum and the token count (keeps the allocation). */
void cmp_hessian_reset(cmp_hessian *h);
/* Add T rows of X [T][cols]: a blocked float GEMM per chunk of
 * KN_GRAM_KC tokens, each chunk's float sums added to the double sums
 * (kn_gram.h: relative error of a 128-term float dot product per chunk,
 * not growing with the tokens).  Each call starts a new chunk. */
void cmp_hessian_add(cmp_hessian *h, const float *X, size_t T);
/* The same with the tiles split over the pool's threads (p NULL = the
 * calling thread): the same sums, bit for bit. */
void cmp_hessian_add_par(kn_pool *p, cmp_hessian *h, const float *X, size_t T);
/* c [width][width] += sum_t xf[t] xq[t]^T (c[i][j] += xf[t][i] xq[t][j])
 * for T tokens of xf, xq [T][width], as cmp_hessian_add sums (kn_gram.h:
 * float within a chunk of tokens, double across chunks), the tiles split
 * over the pool's threads (p NULL = the calling thread; the same sums for
 * any pool).  xt: scratch of kn_gram_scratch_floats(width) floats (a
 * Hessian's xt of this width serves).  bf16: bfloat16 products
 * (kn_gram_cross_bf16), as a Hessian with bf16 set sums. */
void cmp_cross_add(kn_pool *p, double *c, const float *xf, const float *xq,
                   size_t T, uint32_t width, float *xt, int bf16);
/* Element (i, j) of the symmetric sum, i and j in any order (< cols).
 * For tests and slow paths; hot loops walk the packed rows. */
double cmp_hessian_get(const cmp_hessian *h, uint32_t i, uint32_t j);
/* Set element (i, j) (and so (j, i)) of the sum to v; for tests that build
 * a Hessian by hand. */
void cmp_hessian_set(cmp_hessian *h, uint32_t i, uint32_t j, double v);
/* The mean of x_j^2 over the tokens added (the imatrix diagonal), into
 * out [cols]; zeros when n == 0. */
void cmp_hessian_diag_mean(const cmp_hessian *h, float *out);

/* GPTQ's factor of one Hessian (cmp_gptq_hinv_factor with its column
 * order and the dampening that succeeded), made once and given to every
 * cmp_gptq_quantize on that Hessian with the same act-order (the linears
 * of a group share their input; the calibration's second pass repeats
 * the first's factor): the results are bit for bit those of quantize's
 * own factor. */
typedef struct cmp_gptq_factor {
    uint32_t cols;      /* width of the Hessian */
    int act_order;      /* 1: perm is the descending diag(H) order */
    double damp;        /* relative dampening used (after any raising) */
    double *U;          /* [cols][cols] as cmp_gptq_hinv_factor (owned) */
    uint32_t *perm;     /* [cols] column order (owned) */
} cmp_gptq_factor;

/* Make *f for h (damp: relative dampening, 0 -> 0.01, raised x10 on
 * failure as quantize does); seconds added to *factor_s (optional).
 * MC_ERR_NOMEM, MC_ERR_INVALID_ARG, MC_ERR_NONFINITE; *f is empty on
 * failure.  Holds cmp_gptq_factor_bytes(cols) (and transient scratch of
 * cols * 20 bytes while it works). */
mc_status cmp_gptq_factor_make(const cmp_hessian *h, double damp, int act_order,
                               kn_pool *pool, cmp_clock *factor_s,
                               cmp_gptq_factor *f, mc_error *err);
void cmp_gptq_factor_free(cmp_gptq_factor *f); /* NULL / empty: no-op */
uint64_t cmp_gptq_factor_bytes(uint32_t cols);

typedef struct cmp_gptq_opts {
    double damp;        /* relative dampening; 0 -> 0.01 */
    int act_order;      /* 1: descending diag(H) order (static groups) */
    uint32_t block;     /* columns per lazy-update block; 0 -> 128 */
    int search_params;  /* 1: choose group parameters with the imatrix
                           search of cmp_quant_choose (diag H as importance);
                           0: plain min/max as in the reference GPTQ */
    int keep_params;    /* 1: out already holds every group's parameters
                           (scale, zero point): keep them and choose only
                           the codes (a second pass after
                           cmp_gptq_refit_scales) */
    uint32_t chunk_rows; /* rows of W updated per pass (the float work copy
                            holds this many); 0 -> as many as fit in
                            CMP_GPTQ_CHUNK_BYTES (at least 1).  The result
                            does not depend on it: once U is known, rows are
                            independent. */
    kn_pool *pool;      /* threads for the rows once U is known (each its
                           own chunk of CMP_GPTQ_CHUNK_BYTES / threads);
                           NULL = the calling thread.  The result does not
                           depend on it. */
    cmp_clock *factor_s; /* optional: seconds spent factorizing H (the
                           inverse factor, dampening retries included) are
                           added here, for the per-phase report */
    const cmp_gptq_factor *factor; /* optional, borrowed: h's factor made
                           with this act_order (damp then comes from it);
                           quantize does not factorize (nor allocate U) */
} cmp_gptq_opts;

/* Bytes of the float work copy of W that cmp_gptq_quantize (and cmp_awq_search)
 * hold at once by default: 64 MiB, small next to U and large enough
 * that every pass covers hundreds of rows even at 28672 columns. */
#define CMP_GPTQ_CHUNK_BYTES ((uint64_t)64 << 20)

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
/* Peak bytes cmp_gptq_quantize allocates for a rows x cols matrix with
 * default chunk_rows (block 0 -> 128) and T = threads (>= 1): with c =
 * chunk rows per thread, b = block,
 *   cols^2 * 8            U (one matrix, factorized in place)
 *   + T * c * cols * 4    each thread's float work copy of c rows of W
 *   + T * c * b * 4       each thread's block of scaled errors
 *   + T * b * 256 * 8     each thread's panel of U (the trailing
 *                         update's 256-column chunk)
 *   + cols * 28           diag, inversion row (doubles); perm, argsort
 *                         scratch, importance (4 bytes each)
 *   + T * cols * 4        each thread's row buffer
 *   + 4 * T * 8           the per-thread tables (T > 1 only)
 * c = min(ceil(rows / T), max(1, CMP_GPTQ_CHUNK_BYTES / (cols * 4) / T)).
 * Exact when block is a multiple of 128, the default included (int4
 * groups are 32, 64 or 128, so quantize runs such a block as given); for
 * other blocks quantize rounds up to a multiple of the group, which this
 * does not know, so it rounds up to a multiple of 128: an upper bound.
 * Each allocation counts at least 1 byte (mc_malloc(0) takes 1). */
uint64_t cmp_gptq_work_bytes(uint32_t rows, uint32_t cols, uint32_t block,
                             int threads);

/* Steps 3-4, exposed so that tests can check them against a plain
 * reference: a [cols][cols] (cols = h->cols, row-major) receives in its
 * upper triangle U, the upper Cholesky factor of (P^T H P + lambda I)^-1
 * (U^T U = that inverse, diagonal > 0), and zeros below the diagonal.  H is
 * h's sum with dead diagonal entries (H_jj == 0) taken as 1; P permutes
 * rows and columns: index i of the permuted matrix is original index
 * perm[i] (perm NULL = identity).  row: scratch [cols] doubles.  Works in
 * a alone (no allocation): J P^T H P J into the lower triangle, the
 * blocked lower Cholesky in place, L^T mirrored above it, X = L^-1 into the
 * lower triangle (its diagonal in row; cmp_chol.h: every inner loop reads
 * rows), then the index reversal into the upper triangle.  pool (NULL =
 * the calling thread) splits each block step's rows over its threads; the
 * result does not depend on it.
 * Returns MC_OK, or MC_ERR_NONFINITE if the matrix is not
 * (numerically) positive definite or the factor overflows; a is then
 * unspecified. */
mc_status cmp_gptq_hinv_factor(const cmp_hessian *h, const uint32_t *perm,
                               double lambda, double *a, double *row,
                               kn_pool *pool, mc_error *err);

/* MC_OK when q passes cmp_qbuf_check and is as wide as h; else the
 * error (MC_ERR_INVALID_ARG naming the two widths). */
mc_status cmp_hessian_check_qbuf(const cmp_hessian *h, const cmp_qbuf *q,
                                 mc_error *err);

/* Refit the scales of an already quantized q [rows][cols] (codes and
 * zero points kept) to the target weight w [rows][cols] under the full
 * Hessian h: per row, the scales s minimizing tr((w - Q(s)) H (w - Q(s))^T)
 * solve a (groups x groups) linear system; each row keeps whichever of the
 * old and the refit scales (rounded to their stored precision) gives the
 * smaller error, so the error never grows.  After GPTQ this recovers part
 * of what fixing the group parameters at each group start lost.  deq
 * (optional) receives the dequantized result.  Cost: cols^2 / 2 per row
 * in one tiled pass over H's upper triangle per 4 * CMP_LANES rows, which
 * share it (cmp_gptq_refit_sums_tiled), + groups^3 per row; work space
 * (cmp_gptq_refit_work_bytes) holds each of those rows' groups^2 sums.  pool (NULL = the calling thread)
 * splits the rows over its threads (cmp_par.h); the result does not
 * depend on it.  MC_ERR_NOMEM, MC_ERR_INVALID_ARG (widths differ). */
mc_status cmp_gptq_refit_scales(const float *w, const cmp_hessian *h,
                                cmp_qbuf *q, float *deq, kn_pool *pool,
                                mc_error *err);
/* H w kept between the scale refits of one target w under one Hessian:
 * the refit forms H w and the codes' sums in the same pass, and H w is a
 * function of w and H alone, so a later refit of the same pair (after a
 * second GPTQ pass or the code descent changed the codes) forms only the
 * codes' sums, a third of the work.  hw: cmp_gptq_refit_hw_bytes(rows,
 * cols) bytes, owned by the caller; ready: 0 until the first refit
 * through it filled it (it is then read, never written).  Reuse it only
 * for the same w and h: nothing checks that. */
typedef struct cmp_refit_hw {
    double *hw;
    int ready;
} cmp_refit_hw;

/* Bytes of a cmp_refit_hw's hw for a [rows][cols] matrix: rows rounded
 * up to CMP_LANES (8), doubles (at least 1 byte). */
uint64_t cmp_gptq_refit_hw_bytes(uint32_t rows, uint32_t cols);

/* cmp_gptq_refit_scales through the cache hwc (NULL: none, the same
 * call); the same bits either way. */
mc_status cmp_gptq_refit_scales_cached(const float *w, const cmp_hessian *h,
                                       cmp_qbuf *q, float *deq, cmp_refit_hw *hwc,
                                       kn_pool *pool, mc_error *err);
/* Peak bytes cmp_gptq_refit_scales allocates with `threads` threads
 * (groups = parameter sets per row, 1 for Q8; L = 4 * CMP_LANES, the
 * rows of one tiled pass), each thread its own set: threads * (cols * L *
 * 40 + groups^2 * (L + 1) * 8 + groups * (24 + L * sizeof(cmp_qparam)))
 * plus the sets' table, each allocation at least 1 byte. */
uint64_t cmp_gptq_refit_work_bytes(uint32_t cols, uint32_t groups, int threads);

/* Output error of a replacement weight: tr((W - Q) Hs (W - Q)^T) where Hs is
 * the Hessian sum (= sum_t ||(W - Q) x_t||^2 over the added tokens).  w, q:
 * [rows][cols] float32; q NULL means zeros (then the result is the output
 * energy tr(W H W^T)).  Double accumulation; NaN if work space for a width
 * over 512 cannot be allocated. */
double cmp_hessian_output_error(const cmp_hessian *h, const float *w,
                                const float *q, uint32_t rows);
/* Rows whose output errors are computed together (one pass over H for
 * all of them); the scratch holds this many difference rows. */
#define CMP_OERR_ROWS 8u
/* Peak bytes cmp_hessian_output_error allocates: 0 up to 512 columns (its
 * difference rows live on the stack), cols * CMP_OERR_ROWS * 8 above. */
uint64_t cmp_hessian_output_error_work_bytes(uint32_t cols);
/* The same error without allocating: adds the rows' terms to *total in
 * the order cmp_hessian_output_error sums them, so splitting the rows
 * into consecutive calls gives the same sum, bit for bit (each row's
 * term does not depend on the rows computed with it).  d: scratch
 * [CMP_OERR_ROWS * cols] doubles. */
void cmp_hessian_output_error_add(const cmp_hessian *h, const float *w,
                                  const float *q, uint32_t rows, double *d,
                                  double *total);
/* Each row's term alone: terms[r] (r < rows) is what
 * cmp_hessian_output_error_add adds for row r, whatever rows are computed
 * with it, so a caller that adds them in row order gets its total bit for
 * bit.  d: scratch [CMP_OERR_ROWS * cols] doubles. */
void cmp_hessian_output_error_terms(const cmp_hessian *h, const float *w,
                                    const float *q, uint32_t rows, double *d,
                                    double *terms);

/* cmp_hessian_output_error with H tiled over chunks of rows
 * (cmp_qform_sym_par, cmp_qform.h) and the rows split over the pool's
 * threads (cmp_par.h); the same value, bit for bit, as
 * cmp_hessian_output_error for any pool (each row's term is formed as
 * alone and the terms are added in row order).  NaN if work space cannot
 * be allocated. */
double cmp_hessian_output_error_par(kn_pool *p, const cmp_hessian *h,
                                    const float *w, const float *q,
                                    uint32_t rows);
/* Peak bytes it allocates: cmp_qform_par_work_bytes (rows * 8 for the
 * terms and each thread's chunk of rows and tile). */
uint64_t cmp_hessian_output_error_par_work_bytes(uint32_t cols, uint32_t rows,
                                                 int threads);

/* Least-squares retargeting for inputs that already carry the error of
 * earlier quantized blocks: with x_f the full-precision model's input and
 * x_q the partly quantized model's input for the same token, returns
 *   W* = argmin_V sum_t ||W x_f - V x_q||^2 = W C (Hq + lambda I)^-1,
 * C = sum x_f x_q^T (c: [cols][cols] row-major, full), Hq = hq's sum,
 * lambda = damp * mean(diag Hq).  Since the residual of W* is orthogonal to
 * x_q, sum ||W x_f - Q x_q||^2 = const + tr((W* - Q) Hq (W* - Q)^T): GPTQ on
 * W* with Hq then minimizes the error against the full-precision outputs
 * (the "asymmetric calibration" of GPTAQ).  w, out: [rows][cols] (may not
 * alias).  pool (NULL = the calling thread) splits the rows over its
 * threads; the result does not depend on it.  MC_ERR_NOMEM, or
 * MC_ERR_NONFINITE if Hq stays indefinite. */
mc_status cmp_gptq_retarget(const cmp_hessian *hq, const double *c,
                            const float *w, uint32_t rows, double damp,
                            float *out, kn_pool *pool, mc_error *err);
/* The same from W C given (wc: [rows][cols], e.g. sum y_f x_q^T with y_f
 * = W x_f the linear's full-precision outputs): W* = W C (Hq + lambda
 * I)^-1 without the product. */
mc_status cmp_gptq_retarget_wc(const cmp_hessian *hq, const double *wc,
                               uint32_t rows, double damp, float *out,
                               kn_pool *pool, mc_error *err);

/* Rows of W retargeted together: their products with C and their solves
 * share each pass over C and the factor (192 rows: a thread's block of
 * right-hand sides, 22 MB at 14336 columns). */
#define CMP_RETARGET_ROWS 192u
/* Peak bytes cmp_gptq_retarget allocates with `threads` threads: one
 * [cols][cols] double matrix (the Cholesky factor of Hq + lambda I, in
 * place, mirrored into the upper triangle) and each thread's block of
 * rows in double: cols^2 * 8 + threads * cols * CMP_RETARGET_ROWS * 8. */
uint64_t cmp_gptq_retarget_work_bytes(uint32_t cols, int threads);

#endif /* CMP_GPTQ_H */

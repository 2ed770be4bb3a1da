/*
 * cmp_gptq_internal.h - helpers shared by the files of the GPTQ module
 * (cmp_hessian.c: the statistics and output errors; cmp_gptq.c: the
 * factor and the column loop; cmp_gptq_fit.c: the retarget and the scale
 * refit).  Not a public API: cmp_gptq.h is the module's contract.
 */
#ifndef CMP_GPTQ_INTERNAL_H
#define CMP_GPTQ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_gptq.h"
#include "kn_ops.h"

/* Work (multiply-adds) below which a step (a chunk of statistics, a
 * column of a Cholesky factor, a row of an inverse) stays on the calling
 * thread: waking the pool costs microseconds. */
#define PAR_MIN_WORK ((size_t)1 << 16)

/* Packed row i as an array indexed by the column: hrow(h, i)[j] is element
 * (i, j) for j >= i.  Stays inside the allocation: the offset, row_offset
 * - i, is >= 0 for every i < cols. */
static inline double *hrow(const cmp_hessian *h, size_t i)
{
    return h->h + cmp_hessian_row_offset(h->cols, (uint32_t)i) - i;
}

static inline double hdiag(const cmp_hessian *h, size_t i)
{
    return h->h[cmp_hessian_row_offset(h->cols, (uint32_t)i)];
}

/* Element (i, j) of the symmetric sum, either order. */
static inline double hsym(const cmp_hessian *h, size_t i, size_t j)
{
    return i <= j ? hrow(h, i)[j] : hrow(h, j)[i];
}

/* Bytes mc_malloc takes for a request: 0 counts as 1. */
static inline uint64_t req(uint64_t bytes)
{
    return bytes ? bytes : 1;
}

/* In-place lower Cholesky of the n x n symmetric a (lower triangle read
 * and written; upper left alone): cmp_chol_lower, blocked, each block
 * step's rows split over p's threads (the same bits on any number).  0 on
 * success, -1 if not positive definite. */
int cmp_gptq_cholesky_lower(double *a, size_t n, kn_pool *p);

/* The scale refit's sums (cmp_gptq_fit.c): for one block of CMP_LANES
 * rows, a, wd [cols][CMP_LANES] (codes at unit scale, weights; span
 * columns per group, G groups) -> M [CMP_LANES][G][G] (a_g^T H a_k per
 * lane) and hw [cols][CMP_LANES] (H w).  _ref: one pass over H per
 * block, the reference; _tiled: nb blocks (arrays [nb][..] of the sizes
 * above; sap, hwp: scratch as hw) over a tiled H, the reference's bits;
 * hw_given: hw holds H w on entry (left as it is) and only M is formed. */
void cmp_gptq_refit_sums_ref(const cmp_hessian *h, uint32_t span, uint32_t G,
                             const double *a, const double *wd, double *M,
                             double *hw);
void cmp_gptq_refit_sums_tiled(const cmp_hessian *h, uint32_t span, uint32_t G,
                               uint32_t nb, const double *a, const double *wd,
                               double *M, double *hw, double *sap, double *hwp,
                               int hw_given);

#endif /* CMP_GPTQ_INTERNAL_H */

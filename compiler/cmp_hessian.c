/* cmp_hessian.c - the Hessian sums of GPTQ and the output errors they
 * measure (see cmp_gptq.h). */
#include "cmp_gptq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmp_gptq_internal.h"
#include "cmp_lanes.h"
#include "cmp_par.h"
#include "cmp_qform.h"
#include "kn_gram.h"
#include "kn_lanes.h"
#include "kn_ops.h"
#include "mc_alloc.h"

uint64_t cmp_hessian_bytes(uint32_t cols)
{
    return (uint64_t)cols * (cols + 1) / 2 * sizeof(double) +
           kn_gram_scratch_floats(cols) * sizeof(float);
}

mc_status cmp_hessian_init(cmp_hessian *h, uint32_t cols, mc_error *err)
{
    memset(h, 0, sizeof *h);
    if (cols == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "cols", -1,
                       "Hessian of zero columns");
    h->cols = cols;
    /* The count cols*(cols+1)/2 is below 2^63 for any uint32_t cols;
     * mc_zeroed checks count * 8 against SIZE_MAX (zeros written now:
     * the sums' threads read each line before they add to it). */
    uint64_t packed = (uint64_t)cols * (cols + 1) / 2;
    if (packed <= SIZE_MAX)
        h->h = mc_zeroed((size_t)packed, sizeof(double));
    h->xt = mc_malloc_array((size_t)kn_gram_scratch_floats(cols), sizeof(float));
    if (!h->h || !h->xt) {
        cmp_hessian_free(h);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "hessian", -1,
                       "cannot allocate the %u-wide Hessian (%.3g GiB)", cols,
                       (double)cmp_hessian_bytes(cols) / (1u << 30));
    }
    return MC_OK;
}

void cmp_hessian_free(cmp_hessian *h)
{
    if (!h)
        return;
    mc_free(h->h);
    mc_free(h->xt);
    h->h = NULL;
    h->xt = NULL;
}

void cmp_hessian_reset(cmp_hessian *h)
{
    memset(h->h, 0, cmp_hessian_row_offset(h->cols, h->cols) * sizeof(double));
    h->n = 0;
}

double cmp_hessian_get(const cmp_hessian *h, uint32_t i, uint32_t j)
{
    return hsym(h, i, j);
}

void cmp_hessian_set(cmp_hessian *h, uint32_t i, uint32_t j, double v)
{
    if (i <= j)
        hrow(h, i)[j] = v;
    else
        hrow(h, j)[i] = v;
}

void cmp_hessian_add_par(kn_pool *p, cmp_hessian *h, const float *X, size_t T)
{
    if (h->bf16)
        kn_gram_tri_bf16(p, h->h, X, T, h->cols, h->xt);
    else
        kn_gram_tri(p, h->h, X, T, h->cols, h->xt);
    h->n += T;
}

void cmp_hessian_add(cmp_hessian *h, const float *X, size_t T)
{
    cmp_hessian_add_par(NULL, h, X, T);
}

void cmp_cross_add(kn_pool *p, double *c, const float *xf, const float *xq,
                   size_t T, uint32_t width, float *xt, int bf16)
{
    if (bf16)
        kn_gram_cross_bf16(p, c, xf, xq, T, width, xt);
    else
        kn_gram_cross(p, c, xf, xq, T, width, xt);
}

void cmp_hessian_diag_mean(const cmp_hessian *h, float *out)
{
    for (size_t j = 0; j < h->cols; j++)
        out[j] = h->n ? (float)(hdiag(h, j) / (double)h->n) : 0.0f;
}

/* The output-error terms of rows [r0, r0 + nr) (nr <= CMP_OERR_ROWS) into
 * s[0 .. nr).  The rows' differences are interleaved in d
 * (d[j * CMP_OERR_ROWS + r]): each packed Hessian row is read once for all
 * of them, and their sums are independent chains where one row's sum is a
 * chain of dependent additions.  Every row's own operations and their
 * order are those of one row alone, so a term does not depend on the rows
 * computed with it.  Unused lanes of a short block hold zeros. */
static void oerr_block(const cmp_hessian *h, const float *w, const float *q,
                       uint32_t r0, uint32_t nr, double *d, double *s)
{
    enum { B = CMP_OERR_ROWS };
    _Static_assert(CMP_OERR_ROWS == CMP_LANES && CMP_LANES == KN_QUAD_LANES,
                   "one row per lane");
    size_t n = h->cols;
    for (size_t j = 0; j < n; j++)
        for (uint32_t r = 0; r < B; r++) {
            size_t at = (size_t)(r0 + r) * n + j;
            d[j * B + r] = r < nr ? (double)w[at] - (q ? q[at] : 0.0f) : 0.0;
        }
    double acc_s[B] = {0};
    size_t i = 0;
    if (kn_cpu_has_avx2() && !kn_force_scalar())
        for (; i + 4 <= n; i += 4) {
            /* four rows of H at once, each lane as below (kn_lanes.h) */
            int live = 0;
            for (uint32_t r = 0; r < 4 * B; r++)
                live |= d[i * B + r] != 0.0;
            if (!live)
                continue;
            const double *rows[4] = {hrow(h, i), hrow(h, i + 1),
                                     hrow(h, i + 2), hrow(h, i + 3)};
            double acc[4 * B];
            kn_avx2_quad4(rows, d, i, n, acc);
            for (uint32_t g = 0; g < 4; g++)
                for (uint32_t r = 0; r < B; r++)
                    if (d[(i + g) * B + r] != 0.0)
                        acc_s[r] += d[(i + g) * B + r] * acc[g * B + r];
        }
    for (; i < n; i++) {
        const double *di = d + i * B;
        int live = 0;
        for (uint32_t r = 0; r < B; r++)
            live |= di[r] != 0.0;
        if (!live)
            continue;
        const double *row = hrow(h, i);
        double acc[B];
        for (uint32_t r = 0; r < B; r++)
            acc[r] = row[i] * di[r];
        cmp_lanes_dot(acc, 2.0, row, d, B, 1, i + 1, n);
        for (uint32_t r = 0; r < B; r++)
            if (di[r] != 0.0)
                acc_s[r] += di[r] * acc[r];
    }
    for (uint32_t r = 0; r < nr; r++)
        s[r] = acc_s[r];
}

void cmp_hessian_output_error_add(const cmp_hessian *h, const float *w,
                                  const float *q, uint32_t rows, double *d,
                                  double *total)
{
    for (uint32_t r0 = 0; r0 < rows; r0 += CMP_OERR_ROWS) {
        uint32_t nr = rows - r0 < CMP_OERR_ROWS ? rows - r0 : CMP_OERR_ROWS;
        double s[CMP_OERR_ROWS];
        oerr_block(h, w, q, r0, nr, d, s);
        for (uint32_t r = 0; r < nr; r++)
            *total += s[r];
    }
}

void cmp_hessian_output_error_terms(const cmp_hessian *h, const float *w,
                                    const float *q, uint32_t rows, double *d,
                                    double *terms)
{
    for (uint32_t r0 = 0; r0 < rows; r0 += CMP_OERR_ROWS) {
        uint32_t nr = rows - r0 < CMP_OERR_ROWS ? rows - r0 : CMP_OERR_ROWS;
        oerr_block(h, w, q, r0, nr, d, terms + r0);
    }
}

/* Widths up to this keep the difference rows on the stack (32 KiB). */
#define OERR_STACK (4096 / CMP_OERR_ROWS)

uint64_t cmp_hessian_output_error_work_bytes(uint32_t cols)
{
    return cols <= OERR_STACK ? 0
                              : (uint64_t)cols * CMP_OERR_ROWS * sizeof(double);
}

double cmp_hessian_output_error(const cmp_hessian *h, const float *w,
                                const float *q, uint32_t rows)
{
    size_t n = h->cols;
    double total = 0.0;
    double d[OERR_STACK * CMP_OERR_ROWS];
    double *dd = n <= OERR_STACK ? d
                                 : mc_malloc_array(n * CMP_OERR_ROWS, sizeof(double));
    if (!dd)
        return NAN;
    cmp_hessian_output_error_add(h, w, q, rows, dd, &total);
    if (dd != d)
        mc_free(dd);
    return total;
}

uint64_t cmp_hessian_output_error_par_work_bytes(uint32_t cols, uint32_t rows,
                                                 int threads)
{
    return cmp_qform_par_work_bytes(cols, rows, threads);
}

double cmp_hessian_output_error_par(kn_pool *p, const cmp_hessian *h,
                                    const float *w, const float *q,
                                    uint32_t rows)
{
    return cmp_qform_sym_par(p, h, w, q, rows);
}

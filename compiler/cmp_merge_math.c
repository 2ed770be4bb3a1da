/* cmp_merge_math.c - the merged values of one tensor, row by row, in double
 * precision (see cmp_merge.h for the formulas).
 *
 * Row i of the merged tensor needs only row i of the base, B's row i (or,
 * for deltas stored transposed, column i of A) and all of A (or B).  DoRA
 * norms per row are local to the row; norms per column (embeddings,
 * [in, out] weights) are computed in a first pass over all rows, once per
 * such op, so rows can still be produced in any chunking. */
#include "cmp_merge_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"

typedef struct prep_op {
    double *A;    /* [r, a_cols] */
    double *B;    /* [b_rows, r] */
    double *mag;  /* DoRA magnitude, or NULL */
    double *bias; /* BIAS_ADD: lora_B.bias */
    double *colf; /* DoRA per-column factor m_j / ||V col j|| */
    uint32_t r;
    uint64_t a_cols;
} prep_op;

struct merge_prep {
    const merge_tensor *t;
    prep_op *ops;
    double *d, *tmp, *acol; /* cols, cols, r_max */
    float *fbuf, *fbase;    /* cols */
};

void cmp_merge_release_(cmp_merge *m)
{
    struct merge_prep *p = m->prep;
    if (!p)
        return;
    for (size_t i = 0; p->t && p->ops && i < p->t->n_ops; i++) {
        mc_free(p->ops[i].A);
        mc_free(p->ops[i].B);
        mc_free(p->ops[i].mag);
        mc_free(p->ops[i].bias);
        mc_free(p->ops[i].colf);
    }
    mc_free(p->ops);
    mc_free(p->d);
    mc_free(p->tmp);
    mc_free(p->acol);
    mc_free(p->fbuf);
    mc_free(p->fbase);
    mc_free(p);
    m->prep = NULL;
}

/* All of t converted to a new double array, or NULL (out of memory). */
static double *to_double(const fmt_st_tensor *t)
{
    double *d = mc_malloc_array(t->nelem ? t->nelem : 1, sizeof *d);
    if (!d)
        return NULL;
    float buf[1024];
    size_t es = fmt_dtype_size(t->dtype);
    for (uint64_t i = 0; i < t->nelem; i += 1024) {
        size_t k = t->nelem - i < 1024 ? (size_t)(t->nelem - i) : 1024;
        fmt_to_f32(t->dtype, (const unsigned char *)t->data + i * es, buf, k);
        for (size_t j = 0; j < k; j++)
            d[i + j] = buf[j];
    }
    return d;
}

/* Load row i of src (cols elements of its float dtype) as float. */
static void load_row(const fmt_st_tensor *src, uint64_t i, uint64_t cols,
                     float *out)
{
    size_t es = fmt_dtype_size(src->dtype);
    fmt_to_f32(src->dtype, (const unsigned char *)src->data + i * cols * es,
               out, (size_t)cols);
}

/* Merged row i into p->d.  If stop_at < n_ops, stop at that (DoRA
 * per-column) op after forming V = W + delta and add V^2 into sumsq. */
static void compute_row(struct merge_prep *p, uint64_t i, uint64_t rows,
                        uint64_t cols, size_t stop_at, double *sumsq)
{
    const merge_tensor *t = p->t;
    double *d = p->d, *tmp = p->tmp;
    load_row(t->src, i, cols, p->fbase);
    for (uint64_t j = 0; j < cols; j++)
        d[j] = p->fbase[j];
    for (size_t s = 0; s < t->n_ops; s++) {
        const merge_op *op = &t->ops[s];
        const prep_op *po = &p->ops[s];
        if (op->kind == OP_REPLACE) {
            load_row(op->rep, i, cols, p->fbuf);
            for (uint64_t j = 0; j < cols; j++)
                d[j] = p->fbuf[j];
            continue;
        }
        if (op->kind == OP_BIAS_ADD) {
            for (uint64_t j = 0; j < cols; j++)
                d[j] += op->coef * po->bias[i * cols + j];
            continue;
        }
        uint32_t r = po->r;
        if (!op->transposed) { /* tmp = B[i, :] @ A */
            memset(tmp, 0, cols * sizeof *tmp);
            for (uint32_t k = 0; k < r; k++) {
                double b = po->B[i * r + k];
                const double *a = po->A + (uint64_t)k * cols;
                for (uint64_t j = 0; j < cols; j++)
                    tmp[j] += b * a[j];
            }
        } else { /* tmp[j] = sum_k B[j, k] * A[k, i] */
            for (uint32_t k = 0; k < r; k++)
                p->acol[k] = po->A[(uint64_t)k * rows + i];
            for (uint64_t j = 0; j < cols; j++) {
                const double *b = po->B + j * r;
                double acc = 0;
                for (uint32_t k = 0; k < r; k++)
                    acc += b[k] * p->acol[k];
                tmp[j] = acc;
            }
        }
        for (uint64_t j = 0; j < cols; j++)
            d[j] += op->coef * tmp[j];
        if (s == stop_at) {
            for (uint64_t j = 0; j < cols; j++)
                sumsq[j] += d[j] * d[j];
            return;
        }
        if (!op->dora)
            continue;
        if (op->transposed) {
            for (uint64_t j = 0; j < cols; j++)
                d[j] *= po->colf[j];
        } else {
            double ss = 0;
            for (uint64_t j = 0; j < cols; j++)
                ss += d[j] * d[j];
            double f = po->mag[i] / sqrt(ss);
            for (uint64_t j = 0; j < cols; j++)
                d[j] *= f;
        }
    }
}

static mc_status prepare(cmp_merge *m, const merge_tensor *t, mc_error *err)
{
    if (m->prep && m->prep->t == t)
        return MC_OK;
    cmp_merge_release_(m);
    uint64_t rows, cols;
    cmp_merge_dims_(t->src, &rows, &cols);
    struct merge_prep *p = mc_calloc(1, sizeof *p);
    if (!p)
        return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1, "out of memory");
    m->prep = p;
    p->t = t;
    uint32_t rmax = 1;
    size_t c = cols ? (size_t)cols : 1;
    p->ops = mc_calloc(t->n_ops ? t->n_ops : 1, sizeof *p->ops);
    p->d = mc_malloc_array(c, sizeof(double));
    p->tmp = mc_malloc_array(c, sizeof(double));
    p->fbuf = mc_malloc_array(c, sizeof(float));
    p->fbase = mc_malloc_array(c, sizeof(float));
    int ok = p->ops && p->d && p->tmp && p->fbuf && p->fbase;
    for (size_t s = 0; ok && s < t->n_ops; s++) {
        const merge_op *op = &t->ops[s];
        prep_op *po = &p->ops[s];
        if (op->kind == OP_BIAS_ADD) {
            ok = (po->bias = to_double(op->mod->b_bias)) != NULL;
        } else if (op->kind == OP_DELTA) {
            po->r = (uint32_t)op->mod->A->shape[0];
            po->a_cols = op->mod->A->shape[1];
            rmax = po->r > rmax ? po->r : rmax;
            ok = (po->A = to_double(op->mod->A)) &&
                 (po->B = to_double(op->mod->B)) &&
                 (!op->dora || (po->mag = to_double(op->mod->magnitude)));
        }
    }
    ok = ok && (p->acol = mc_malloc_array(rmax, sizeof(double)));
    if (!ok)
        return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1,
                       "out of memory preparing the adapters of this tensor");
    /* Column norms, one pass per DoRA op whose norm runs down columns. */
    for (size_t s = 0; s < t->n_ops; s++) {
        const merge_op *op = &t->ops[s];
        if (op->kind != OP_DELTA || !op->dora || !op->transposed)
            continue;
        double *colf = mc_calloc(c, sizeof *colf);
        if (!colf)
            return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1,
                           "out of memory");
        for (uint64_t i = 0; i < rows; i++)
            compute_row(p, i, rows, cols, s, colf);
        for (uint64_t j = 0; j < cols; j++)
            colf[j] = p->ops[s].mag[j] / sqrt(colf[j]);
        p->ops[s].colf = colf;
    }
    return MC_OK;
}

mc_status cmp_merge_rows_(cmp_merge *m, const merge_tensor *t, uint64_t row0,
                          uint64_t nrows, float *out, mc_error *err)
{
    uint64_t rows, cols;
    cmp_merge_dims_(t->src, &rows, &cols);
    if (row0 > rows || nrows > rows - row0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, t->name, -1,
                       "rows out of range");
    if (t->n_ops == 0) { /* untouched (or an untied copy): convert only */
        size_t es = fmt_dtype_size(t->src->dtype);
        fmt_to_f32(t->src->dtype,
                   (const unsigned char *)t->src->data + row0 * cols * es, out,
                   (size_t)(nrows * cols));
        return MC_OK;
    }
    mc_status st = prepare(m, t, err);
    if (st)
        return st;
    struct merge_prep *p = m->prep;
    double maxd = m->max_abs_delta;
    for (uint64_t i = row0; i < row0 + nrows; i++) {
        compute_row(p, i, rows, cols, (size_t)-1, NULL);
        float *o = out + (i - row0) * cols;
        for (uint64_t j = 0; j < cols; j++) {
            if (!isfinite(p->d[j]) || fabs(p->d[j]) > 3.4028234663852886e38)
                return mc_fail(err, MC_ERR_NONFINITE, NULL, t->name, -1,
                               "merged value at row %llu, column %llu is "
                               "not finite in float32 (a DoRA norm of zero, "
                               "or an adapter too large for the base)",
                               (unsigned long long)i, (unsigned long long)j);
            o[j] = (float)p->d[j];
            double dd = fabs((double)o[j] - (double)p->fbase[j]);
            if (dd > maxd)
                maxd = dd;
        }
    }
    m->max_abs_delta = maxd;
    return MC_OK;
}

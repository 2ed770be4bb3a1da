/* cmp_merge_math.c - the merged values of one tensor, a block of rows at a
 * time, in double precision (see cmp_merge.h for the formulas).
 *
 * Row i of the merged tensor needs only row i of the base and row i of
 * each delta.  A delta is written as L @ R with L [rows, r] and R [r, cols]:
 * L = B, R = A for a delta stored as B @ A, and L = A^T, R = B^T for one
 * stored transposed (embeddings, [in, out] weights), so one blocked kernel
 * (kn_lora_rows, the same summation order everywhere) serves both.  DoRA
 * norms per row are local to the row; norms per column are computed in a
 * first pass over all rows, once per such op, so rows can still be
 * produced in any chunking and on any number of threads with the same
 * result.  Each element is rounded once, from the double, to the output
 * dtype. */
#include "cmp_merge_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cmp_par.h"
#include "kn_lora.h"
#include "mc_alloc.h"

/* Rows computed together: the delta kernel reuses each cached slice of
 * R across them.  The writer's chunks are multiples of this times the
 * thread count (CMP_MERGE_CHUNK_ROWS) so threads get equal shares. */
#define ROW_BLOCK CMP_MERGE_ROW_BLOCK

typedef struct prep_op {
    double *L;    /* [rows, r] */
    double *R;    /* [r, cols] */
    double *mag;  /* DoRA magnitude, or NULL */
    double *bias; /* BIAS_ADD: lora_B.bias */
    double *colf; /* DoRA per-column factor m_j / ||V col j|| */
    uint32_t r;
} prep_op;

/* Scratch of one thread. */
typedef struct prep_slot {
    double *d, *tmp;     /* ROW_BLOCK x cols */
    double *w0, *v;      /* cols: base row before the deltas, DoRA's V */
    float *fbase, *fbuf; /* ROW_BLOCK x cols, cols */
    double maxd;         /* max |merged - base| of the rows done */
    uint64_t bad_row, bad_col; /* first non-finite result */
    int bad;
} prep_slot;

struct merge_prep {
    const merge_tensor *t;
    prep_op *ops;
    prep_slot *slots;
    int n_slots;
};

static void free_slot(prep_slot *s)
{
    mc_free(s->d);
    mc_free(s->tmp);
    mc_free(s->w0);
    mc_free(s->v);
    mc_free(s->fbase);
    mc_free(s->fbuf);
}

void cmp_merge_release_(cmp_merge *m)
{
    struct merge_prep *p = m->prep;
    if (!p)
        return;
    for (size_t i = 0; p->t && p->ops && i < p->t->n_ops; i++) {
        mc_free(p->ops[i].L);
        mc_free(p->ops[i].R);
        mc_free(p->ops[i].mag);
        mc_free(p->ops[i].bias);
        mc_free(p->ops[i].colf);
    }
    for (int s = 0; p->slots && s < p->n_slots; s++)
        free_slot(&p->slots[s]);
    mc_free(p->slots);
    mc_free(p->ops);
    mc_free(p);
    m->prep = NULL;
}

/* All of t converted to a new double array, transposed when rows > 0
 * (t is then [rows, cols] and the result [cols, rows]).  NULL: out of
 * memory. */
static double *to_double(const fmt_st_tensor *t, uint64_t rows, uint64_t cols)
{
    double *d = mc_malloc_array(t->nelem ? t->nelem : 1, sizeof *d);
    if (!d)
        return NULL;
    float buf[1024];
    size_t es = fmt_dtype_size(t->dtype);
    for (uint64_t i = 0; i < t->nelem; i += 1024) {
        size_t k = t->nelem - i < 1024 ? (size_t)(t->nelem - i) : 1024;
        fmt_to_f32(t->dtype, (const unsigned char *)t->data + i * es, buf, k);
        for (size_t j = 0; j < k; j++) {
            uint64_t e = i + j;
            d[rows ? (e % cols) * rows + e / cols : e] = buf[j];
        }
    }
    return d;
}

/* Load rows [i, i + n) of src (cols elements each, its float dtype). */
static void load_rows(const fmt_st_tensor *src, uint64_t i, uint64_t n,
                      uint64_t cols, float *out)
{
    size_t es = fmt_dtype_size(src->dtype);
    fmt_to_f32(src->dtype, (const unsigned char *)src->data + i * cols * es,
               out, (size_t)(n * cols));
}

/* Merged rows [i0, i0 + n) into s->d (n <= ROW_BLOCK).  If stop_at is an
 * op index, stop there after forming that DoRA op's V = W0 + delta, and
 * add V^2 into sumsq (per column).
 *
 * DoRA follows PEFT 0.21 (its forward and merge_and_unload agree): the
 * norm is that of V = W0 + its own delta, W0 being the base (after
 * modules_to_save / base_layer copies), not of what earlier adapters
 * added; the factor m/||V|| then scales everything so far plus the delta:
 * W = m/||V|| (W + delta).  When no delta came before, W + delta is V. */
static void compute_rows(const struct merge_prep *p, prep_slot *s, uint64_t i0,
                         uint64_t n, uint64_t cols, size_t stop_at,
                         double *sumsq)
{
    const merge_tensor *t = p->t;
    load_rows(t->src, i0, n, cols, s->fbase);
    for (uint64_t q = 0; q < n * cols; q++)
        s->d[q] = s->fbase[q];
    int pristine = 1; /* only copies so far: d is W0 */
    for (size_t k = 0; k < t->n_ops; k++) {
        const merge_op *op = &t->ops[k];
        const prep_op *po = &p->ops[k];
        if (op->kind == OP_REPLACE) {
            for (uint64_t q = 0; q < n; q++) {
                load_rows(op->rep, i0 + q, 1, cols, s->fbuf);
                for (uint64_t j = 0; j < cols; j++)
                    s->d[q * cols + j] = s->fbuf[j];
            }
            continue;
        }
        if (op->kind == OP_BIAS_ADD) {
            for (uint64_t q = 0; q < n; q++)
                for (uint64_t j = 0; j < cols; j++)
                    s->d[q * cols + j] += op->coef * po->bias[(i0 + q) * cols + j];
            pristine = 0;
            continue;
        }
        int apart = op->dora && !pristine; /* the delta is needed alone */
        if (apart)
            kn_lora_rows(po->L + i0 * po->r, po->R, po->r, (size_t)cols,
                         (size_t)n, s->tmp, (size_t)cols);
        else /* d += coef * delta */
            kn_lora_rows_add(po->L + i0 * po->r, po->R, po->r, (size_t)cols,
                             (size_t)n, op->coef, s->d, (size_t)cols);
        for (uint64_t q = 0; q < n; q++) {
            double *d = s->d + q * cols;
            const double *tmp = s->tmp + q * cols;
            const double *V = d; /* W0 + delta, whose norm DoRA takes */
            if (apart) {
                /* DoRA after other deltas: d no longer holds W0, so
                 * rebuild it from the base rows. */
                double *w0 = s->w0, *v = s->v;
                for (uint64_t j = 0; j < cols; j++)
                    w0[j] = s->fbase[q * cols + j];
                for (size_t kk = 0; kk < k; kk++)
                    if (t->ops[kk].kind == OP_REPLACE) {
                        load_rows(t->ops[kk].rep, i0 + q, 1, cols, s->fbuf);
                        for (uint64_t j = 0; j < cols; j++)
                            w0[j] = s->fbuf[j];
                    }
                for (uint64_t j = 0; j < cols; j++)
                    v[j] = w0[j] + op->coef * tmp[j];
                V = v;
            }
            if (k == stop_at) {
                for (uint64_t j = 0; j < cols; j++)
                    sumsq[j] += V[j] * V[j];
                continue;
            }
            if (!op->dora)
                continue;
            double f = 0;
            if (!op->transposed) {
                double ss = 0;
                for (uint64_t j = 0; j < cols; j++)
                    ss += V[j] * V[j];
                f = po->mag[i0 + q] / sqrt(ss);
            }
            for (uint64_t j = 0; j < cols; j++) {
                double x = apart ? d[j] + op->coef * tmp[j] : d[j];
                d[j] = x * (op->transposed ? po->colf[j] : f);
            }
        }
        if (k == stop_at)
            return;
        pristine = 0;
    }
}

static int alloc_slot(prep_slot *s, uint64_t cols)
{
    size_t c = cols ? (size_t)cols : 1;
    s->d = mc_malloc_array(c * ROW_BLOCK, sizeof(double));
    s->tmp = mc_malloc_array(c * ROW_BLOCK, sizeof(double));
    s->w0 = mc_malloc_array(c, sizeof(double));
    s->v = mc_malloc_array(c, sizeof(double));
    s->fbase = mc_malloc_array(c * ROW_BLOCK, sizeof(float));
    s->fbuf = mc_malloc_array(c, sizeof(float));
    return s->d && s->tmp && s->w0 && s->v && s->fbase && s->fbuf;
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
    int nth = m->threads;
    p->ops = mc_calloc(t->n_ops ? t->n_ops : 1, sizeof *p->ops);
    p->slots = mc_calloc((size_t)nth, sizeof *p->slots);
    int ok = p->ops && p->slots;
    if (ok)
        p->n_slots = nth;
    for (int s = 0; ok && s < nth; s++)
        ok = alloc_slot(&p->slots[s], cols);
    for (size_t s = 0; ok && s < t->n_ops; s++) {
        const merge_op *op = &t->ops[s];
        prep_op *po = &p->ops[s];
        if (op->kind == OP_BIAS_ADD) {
            ok = (po->bias = to_double(op->mod->b_bias, 0, 0)) != NULL;
        } else if (op->kind == OP_DELTA) {
            const fmt_st_tensor *A = op->mod->A, *B = op->mod->B;
            po->r = (uint32_t)A->shape[0];
            /* transposed: L = A^T [a_cols, r], R = B^T [r, b_rows] */
            po->L = op->transposed ? to_double(A, A->shape[0], A->shape[1])
                                   : to_double(B, 0, 0);
            po->R = op->transposed ? to_double(B, B->shape[0], B->shape[1])
                                   : to_double(A, 0, 0);
            ok = po->L && po->R &&
                 (!op->dora || (po->mag = to_double(op->mod->magnitude, 0, 0)));
        }
    }
    if (!ok)
        return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1,
                       "out of memory preparing the adapters of this tensor");
    /* Column norms, one pass per DoRA op whose norm runs down columns. */
    for (size_t s = 0; s < t->n_ops; s++) {
        const merge_op *op = &t->ops[s];
        if (op->kind != OP_DELTA || !op->dora || !op->transposed)
            continue;
        double *colf = mc_calloc(cols ? (size_t)cols : 1, sizeof *colf);
        if (!colf)
            return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1,
                           "out of memory");
        for (uint64_t i = 0; i < rows; i += ROW_BLOCK)
            compute_rows(p, &p->slots[0], i,
                         rows - i < ROW_BLOCK ? rows - i : ROW_BLOCK, cols, s,
                         colf);
        for (uint64_t j = 0; j < cols; j++)
            colf[j] = p->ops[s].mag[j] / sqrt(colf[j]);
        p->ops[s].colf = colf;
    }
    return MC_OK;
}

typedef struct rows_job {
    cmp_merge *m;
    uint64_t row0, nrows, cols;
    fmt_dtype dt;
    void *out;
    _Atomic uint64_t next;   /* next row block to take */
    _Atomic int stop;        /* a thread met a value out of range */
} rows_job;

/* Threads take row blocks in turn from j->next, so a thread that shares
 * its core with the writer thread (or anything else) takes fewer blocks
 * instead of holding up the others at the join: with fixed halves the
 * other core idled for the difference after every chunk.  A block's
 * values do not depend on the thread that computes it, nor on nth. */
static void rows_worker(void *ctx, int tid, int nth)
{
    rows_job *j = ctx;
    struct merge_prep *p = j->m->prep;
    prep_slot *s = &p->slots[tid];
    (void)nth;
    uint64_t nb = (j->nrows + ROW_BLOCK - 1) / ROW_BLOCK;
    size_t es = fmt_dtype_size(j->dt);
    uint64_t cols = j->cols;
    int type = j->dt == FMT_DT_F32    ? KN_LORA_F32
               : j->dt == FMT_DT_BF16 ? KN_LORA_BF16
                                      : KN_LORA_F16;
    for (;;) {
        /* Blocks are taken in ascending order and each is finished once
         * taken, so when a thread stops at a bad value every lower block
         * still gets done: the lowest bad row over the slots is the first
         * in row order, whatever the timing. */
        if (atomic_load_explicit(&j->stop, memory_order_relaxed))
            break;
        uint64_t b = atomic_fetch_add_explicit(&j->next, 1,
                                               memory_order_relaxed);
        if (b >= nb)
            break;
        uint64_t i = j->row0 + b * ROW_BLOCK;
        uint64_t end = j->row0 + j->nrows;
        uint64_t n = end - i < ROW_BLOCK ? end - i : ROW_BLOCK;
        compute_rows(p, s, i, n, cols, (size_t)-1, NULL);
        size_t k = (size_t)(n * cols);
        size_t at = kn_lora_finish(s->d, s->fbase, k, type,
                                   (unsigned char *)j->out +
                                       (i - j->row0) * cols * es,
                                   &s->maxd);
        if (at < k) {
            s->bad = 1;
            s->bad_row = i + at / cols;
            s->bad_col = at % cols;
            atomic_store_explicit(&j->stop, 1, memory_order_relaxed);
        }
    }
}

mc_status cmp_merge_rows_(cmp_merge *m, const merge_tensor *t, uint64_t row0,
                          uint64_t nrows, fmt_dtype dt, void *out,
                          mc_error *err)
{
    uint64_t rows, cols;
    cmp_merge_dims_(t->src, &rows, &cols);
    if (row0 > rows || nrows > rows - row0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, t->name, -1,
                       "rows out of range");
    if (t->n_ops == 0) { /* untouched (or an untied copy): convert only;
                          * float -> dt is the one rounding */
        size_t es = fmt_dtype_size(t->src->dtype);
        const unsigned char *src =
            (const unsigned char *)t->src->data + row0 * cols * es;
        size_t n = (size_t)(nrows * cols);
        if (dt == FMT_DT_F32) {
            fmt_to_f32(t->src->dtype, src, out, n);
            return MC_OK;
        }
        float buf[1024];
        size_t os = fmt_dtype_size(dt);
        for (size_t i = 0; i < n; i += 1024) {
            size_t k = n - i < 1024 ? n - i : 1024;
            fmt_to_f32(t->src->dtype, src + i * es, buf, k);
            fmt_from_f32(dt, buf, (unsigned char *)out + i * os, k);
        }
        return MC_OK;
    }
    mc_status st = prepare(m, t, err);
    if (st)
        return st;
    struct merge_prep *p = m->prep;
    for (int s = 0; s < p->n_slots; s++) {
        p->slots[s].bad = 0;
        p->slots[s].maxd = m->max_abs_delta;
    }
    rows_job job = {m, row0, nrows, cols, dt, out, 0, 0};
    /* One block or less: not worth starting threads. */
    if (nrows <= ROW_BLOCK || p->n_slots == 1)
        rows_worker(&job, 0, 1);
    else
        cmp_par_spawn(p->n_slots, rows_worker, &job);
    const prep_slot *first = NULL; /* the lowest bad row (rows_worker) */
    for (int s = 0; s < p->n_slots; s++) {
        const prep_slot *sl = &p->slots[s];
        if (sl->bad && (!first || sl->bad_row < first->bad_row))
            first = sl;
        if (sl->maxd > m->max_abs_delta)
            m->max_abs_delta = sl->maxd;
    }
    if (first)
        return mc_fail(err, MC_ERR_NONFINITE, NULL, t->name, -1,
                       "merged value at row %llu, column %llu is "
                       "not finite in float32 (a DoRA norm of zero, "
                       "or an adapter too large for the base)",
                       (unsigned long long)first->bad_row,
                       (unsigned long long)first->bad_col);
    return MC_OK;
}

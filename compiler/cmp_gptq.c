/* cmp_gptq.c - GPTQ error-compensating quantization: the inverse factor
 * and the column loop (see cmp_gptq.h). */
#include "cmp_gptq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmp_chol.h"
#include "cmp_gptq_internal.h"
#include "cmp_lanes.h"
#include "cmp_par.h"
#include "kn_gram.h"
#include "kn_lanes.h"
#include "mc_alloc.h"

/* The blocked factorization (cmp_chol.h); kept under this name for the
 * retarget, which shares it. */
int cmp_gptq_cholesky_lower(double *a, size_t n, kn_pool *p)
{
    return cmp_chol_lower(a, n, p);
}

/* The fill of cmp_gptq_hinv_factor's lower triangle, split over threads
 * by area (row i holds i + 1 elements): under act-order each element is
 * a random read of the packed H, seconds at 14336 wide on one thread. */
typedef struct hinv_fill {
    const cmp_hessian *h;
    const uint32_t *perm;
    double lambda, *a;
    size_t n;
} hinv_fill;

static size_t fill_split(size_t n, int t, int nth)
{
    return t >= nth ? n : (size_t)((double)n * sqrt((double)t / nth));
}

static void hinv_fill_rows(void *ctx, int tid, int nth)
{
    const hinv_fill *f = ctx;
    const cmp_hessian *h = f->h;
    const uint32_t *perm = f->perm;
    size_t n = f->n;
    /* R = J P^T H' P J into the lower triangle: R[i][j] = H'[p(n-1-i)]
     * [p(n-1-j)].  Without a permutation, row i of R reads packed row
     * n-1-i backwards, contiguously. */
    size_t i0 = fill_split(n, tid, nth), i1 = fill_split(n, tid + 1, nth);
    for (size_t i = i0; i < i1; i++) {
        size_t pi = perm ? perm[n - 1 - i] : n - 1 - i;
        double *ai = f->a + i * n;
        for (size_t j = 0; j < i; j++) {
            size_t pj = perm ? perm[n - 1 - j] : n - 1 - j;
            ai[j] = hsym(h, pi, pj);
        }
        double d = hdiag(h, pi);
        ai[i] = (d == 0.0 ? 1.0 : d) + f->lambda;
    }
}

mc_status cmp_gptq_hinv_factor(const cmp_hessian *h, const uint32_t *perm,
                               double lambda, double *a, double *row,
                               kn_pool *pool, mc_error *err)
{
    size_t n = h->cols;
    hinv_fill fill = {h, perm, lambda, a, n};
    int T = cmp_par_threads(pool);
    if (T > 1 && n >= 512)
        cmp_par_spawn(T, hinv_fill_rows, &fill);
    else
        hinv_fill_rows(&fill, 0, 1);
    if (cmp_gptq_cholesky_lower(a, n, pool) != 0)
        return mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                       "not positive definite");
    /* L^T into the upper triangle, so that the inverse reads rows only
     * (cmp_chol_invert_lower); X = L^-1 then fills the strictly lower
     * triangle and its diagonal goes to row. */
    cmp_chol_mirror_upper(a, n);
    cmp_chol_invert_lower(a, row, n, pool);
    /* R = L L^T, so H'^-1 = J R^-1 J = (J L^-1 J)^T (J L^-1 J): U = J L^-1 J
     * is upper triangular with a positive diagonal, i.e. the upper Cholesky
     * factor of H'^-1.  U[n-1-i][n-1-j] = L^-1[i][j]: each strictly lower
     * element moves to its mirror in the strictly upper triangle (L^T's,
     * no longer needed; source row forwards, target row backwards, both
     * contiguous), the diagonal comes from row reversed, and the lower
     * part is cleared.
     * A huge L^-1 (a barely definite H') counts as a failure, so the caller
     * raises the dampening as it does for a failed factorization. */
    int finite = 1;
    for (size_t i = 1; i < n; i++) {
        const double *li = a + i * n;
        double *ui = a + (n - 1 - i) * n;
        for (size_t j = 0; j < i; j++) {
            finite &= isfinite(li[j]);
            ui[n - 1 - j] = li[j];
        }
    }
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(row[i]);
        a[(n - 1 - i) * n + (n - 1 - i)] = row[i];
    }
    for (size_t i = 1; i < n; i++)
        memset(a + i * n, 0, i * sizeof(double));
    if (!finite)
        return mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                       "inverse factor overflows");
    return MC_OK;
}

/* Indices 0..n-1 sorted by descending key, stable (ties keep column
 * order, so act-order is deterministic). */
static void argsort_desc(const double *key, uint32_t *idx, uint32_t *tmp,
                         size_t n)
{
    for (size_t i = 0; i < n; i++)
        idx[i] = (uint32_t)i;
    /* bottom-up merge sort, stable */
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n;
            size_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = key[idx[b]] > key[idx[a]] ? idx[b++] : idx[a++];
            while (a < mid)
                tmp[o++] = idx[a++];
            while (b < hi)
                tmp[o++] = idx[b++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

/* Columns per chunk of the column loop's trailing update (a multiple of
 * KN_GPTQ_STRIP). */
#define GPTQ_CC 256

/* Work space of one cmp_gptq_quantize call, shared with
 * cmp_gptq_work_bytes so the estimate cannot drift from the code. */
typedef struct gptq_sizes {
    size_t chunk;  /* rows per pass (W copy and E) */
    size_t block;  /* columns per lazy-update block, as run */
} gptq_sizes;

static gptq_sizes gptq_plan(size_t rows, size_t cols, uint32_t block,
                            uint32_t span, uint32_t chunk_rows, int threads)
{
    gptq_sizes z;
    size_t T = threads > 1 ? (size_t)threads : 1;
    z.block = block ? block : 128;
    /* Block must hold whole groups (ragged last group aside). */
    if (span && z.block % span != 0)
        z.block = (z.block + span - 1) / span * span;
    /* the threads share CMP_GPTQ_CHUNK_BYTES; none needs more rows than
     * its share of the matrix */
    if (chunk_rows)
        z.chunk = chunk_rows;
    else
        z.chunk = cols ? CMP_GPTQ_CHUNK_BYTES / (cols * sizeof(float)) / T : rows;
    if (z.chunk == 0)
        z.chunk = 1;
    size_t share = (rows + T - 1) / T;
    if (z.chunk > share)
        z.chunk = share ? share : 1;
    return z;
}

uint64_t cmp_gptq_work_bytes(uint32_t rows, uint32_t cols, uint32_t block,
                             int threads)
{
    /* span 128: a multiple of every int4 group, so the block is as run
     * whenever it already holds whole groups, and an upper bound if not. */
    uint64_t T = threads > 1 ? (uint64_t)threads : 1;
    gptq_sizes z = gptq_plan(rows, cols, block, 128, 0, (int)T);
    uint64_t n = cols;
    return T * req(z.chunk * n * sizeof(float)) +     /* W, per thread */
           req(n * n * sizeof(double)) +              /* A: H, L, then U */
           2 * req(n * sizeof(double)) +              /* diag, inversion row */
           3 * req(n * 4) +                           /* perm, tmp, imp */
           T * req(n * 4) +                           /* gbuf, per thread */
           T * req(z.chunk * z.block * sizeof(float)) + /* E, per thread */
           T * req(z.block * GPTQ_CC * sizeof(double)) + /* U panel, per thread */
           (T > 1 ? 4 * req(T * sizeof(void *)) : 0); /* their tables */
}

/* What every thread of the row loop reads, and its own buffers. */
typedef struct gptq_job {
    const float *w;
    const cmp_hessian *h;
    const cmp_gptq_opts *o;
    cmp_qbuf *out;
    const double *U;
    const uint32_t *perm;
    const float *imp;
    size_t n, block, chunk;
    uint32_t span, ng;
    int static_params;
    float **W, **E, **gbuf; /* [threads] */
    double **P;              /* [threads] */
} gptq_job;

/* Index in a kn_lanes.h panel of ne rows of the value of row k, column c. */
static inline size_t panel_at(size_t ne, size_t k, size_t c)
{
    return (c / KN_GPTQ_STRIP * ne + k) * KN_GPTQ_STRIP + c % KN_GPTQ_STRIP;
}

/* u's ne rows (stride ldu) of nc columns into the panel P (kn_lanes.h),
 * the last strip padded with zeros. */
static void gptq_panel(const double *u, size_t ldu, size_t ne, size_t nc,
                       double *P)
{
    size_t ns = (nc + KN_GPTQ_STRIP - 1) / KN_GPTQ_STRIP;
    for (size_t s = 0; s < ns; s++)
        for (size_t k = 0; k < ne; k++) {
            double *p = P + (s * ne + k) * KN_GPTQ_STRIP;
            const double *uk = u + k * ldu + s * KN_GPTQ_STRIP;
            size_t live = nc - s * KN_GPTQ_STRIP;
            for (size_t l = 0; l < KN_GPTQ_STRIP; l++)
                p[l] = l < live ? uk[l] : 0.0;
        }
}

/* Rows [ra, rb) in chunks of j->chunk: with U fixed, each row's updates
 * read only that row, so any split gives exactly the whole-matrix
 * result. */
static void gptq_rows(void *ctx, uint32_t ra, uint32_t rb, int slot)
{
    const gptq_job *j = ctx;
    const cmp_gptq_opts *o = j->o;
    const cmp_hessian *h = j->h;
    cmp_qbuf *out = j->out;
    kn_wformat fmt = out->fmt;
    size_t n = j->n, block = j->block, span = j->span;
    uint32_t ng = j->ng;
    const uint32_t *perm = j->perm;
    const float *imp = j->imp;
    const double *U = j->U;
    float *W = j->W[slot], *E = j->E[slot], *gbuf = j->gbuf[slot];
    double *P = j->P[slot];
    int avx = kn_cpu_has_avx2() && !kn_force_scalar();
    for (size_t r0 = ra; r0 < rb; r0 += j->chunk) {
        size_t R = rb - r0 < j->chunk ? rb - r0 : j->chunk;
        memcpy(W, j->w + r0 * n, R * n * sizeof(float));
        for (size_t c = 0; c < n; c++)
            if (hdiag(h, c) == 0.0)
                for (size_t r = 0; r < R; r++)
                    W[r * n + c] = 0.0f;
        if (j->static_params && !o->keep_params)
            for (size_t r = 0; r < R; r++)
                for (uint32_t g = 0; g < ng; g++) {
                    size_t c0 = (size_t)g * span, m = n - c0 < span ? n - c0 : span;
                    cmp_qbuf_set_param(out, (uint32_t)(r0 + r), g,
                                       cmp_quant_choose(fmt, W + r * n + c0,
                                                        o->search_params ? imp + c0 : NULL, m));
                }
        /* Permute W's columns in place (row by row through gbuf). */
        if (o->act_order)
            for (size_t r = 0; r < R; r++) {
                for (size_t c = 0; c < n; c++)
                    gbuf[c] = W[r * n + perm[c]];
                memcpy(W + r * n, gbuf, n * sizeof(float));
            }

        for (size_t i1 = 0; i1 < n; i1 += block) {
            size_t i2 = i1 + block < n ? i1 + block : n;
            for (size_t i = i1; i < i2; i++) {
                size_t oc = perm[i]; /* original column */
                if (!j->static_params && !o->keep_params && oc % span == 0) {
                    /* Without act-order perm is the identity: columns
                     * i .. i+span of W are the group, already updated. */
                    size_t m = n - i < span ? n - i : span;
                    for (size_t r = 0; r < R; r++)
                        cmp_qbuf_set_param(out, (uint32_t)(r0 + r), (uint32_t)(oc / span),
                                           cmp_quant_choose(fmt, W + r * n + i,
                                                            o->search_params ? imp + i : NULL, m));
                }
                double d = U[i * n + i];
                const double *urow = U + i * n;
                for (size_t r = 0; r < R; r++) {
                    cmp_qparam p = cmp_qbuf_get_param(out, (uint32_t)(r0 + r),
                                                      (uint32_t)(oc / span));
                    float x = W[r * n + i];
                    int q = cmp_quant_code(fmt, p, x);
                    float v = cmp_quant_value(fmt, p, q);
                    cmp_qbuf_set_code(out, (uint32_t)(r0 + r), (uint32_t)oc, q);
                    double e = ((double)x - v) / d;
                    E[r * block + (i - i1)] = (float)e;
                    float *wr = W + r * n;
                    for (size_t c = i + 1; c < i2; c++)
                        wr[c] -= (float)(e * urow[c]);
                }
            }
            /* The block's errors to all later columns, in column chunks of
             * GPTQ_CC: the chunk of the block's U rows is copied into a
             * panel of 8-column strips (block x GPTQ_CC doubles, 256
             * KiB, kn_lanes.h) that stays in L2 for all R rows; each
             * value takes the block's errors as one chain of double fused
             * multiply-adds, k ascending, rounded to float once
             * (kn_avx2_gptq_update with AVX2, the loop below without: the
             * same bits). */
            size_t ne = i2 - i1;
            for (size_t c0 = i2; c0 < n; c0 += GPTQ_CC) {
                size_t nc = n - c0 < GPTQ_CC ? n - c0 : GPTQ_CC;
                gptq_panel(U + i1 * n + c0, n, ne, nc, P);
                if (avx && ne <= KN_GPTQ_UPDATE_MAX) {
                    kn_avx2_gptq_update(W + c0, n, R, E, block, P, ne, nc);
                    continue;
                }
                for (size_t r = 0; r < R; r++) {
                    float *wr = W + r * n + c0;
                    for (size_t c = 0; c < nc; c++) {
                        double acc = wr[c];
                        for (size_t k = 0; k < ne; k++)
                            acc = fma(-(double)E[r * block + k], P[panel_at(ne, k, c)], acc);
                        wr[c] = (float)acc;
                    }
                }
            }
        }
    }
}

/* GPTQ's factor of h into A [n][n] and its column order into perm [n]:
 * diag (scratch [n]) is H's diagonal with dead inputs (H_jj == 0) at 1, as
 * the dampening and act-order see it (the dead columns' weights are zeroed
 * per chunk by the column loop); lambda = *damp x mean(diag), raised x10
 * while the factorization fails (*damp: the one used).  trow, tmp:
 * scratch [n].  The factorization's seconds go to *factor_s (optional). */
static mc_status factor_into(const cmp_hessian *h, double *damp, int act_order,
                             kn_pool *pool, double *A, uint32_t *perm,
                             double *diag, double *trow, uint32_t *tmp,
                             cmp_clock *factor_s, mc_error *err)
{
    size_t n = h->cols;
    double mean = 0.0;
    for (size_t j = 0; j < n; j++) {
        diag[j] = hdiag(h, j);
        if (diag[j] == 0.0)
            diag[j] = 1.0;
        mean += diag[j];
    }
    mean /= (double)n;
    if (act_order)
        argsort_desc(diag, perm, tmp, n);
    else
        for (size_t j = 0; j < n; j++)
            perm[j] = (uint32_t)j;
    int ok = 0;
    cmp_clock tf = cmp_par_clock();
    for (int attempt = 0; attempt < 7 && !ok; attempt++) {
        if (cmp_gptq_hinv_factor(h, perm, *damp * mean, A, trow, pool, NULL) == MC_OK)
            ok = 1;
        else
            *damp *= 10.0;
    }
    if (factor_s)
        cmp_par_clock_add(factor_s, tf);
    if (!ok)
        return mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                       "Hessian is not positive definite even with dampening "
                       "%g x mean diagonal", *damp / 10.0);
    return MC_OK;
}

uint64_t cmp_gptq_factor_bytes(uint32_t cols)
{
    uint64_t n = cols;
    return req(n * n * sizeof(double)) + req(n * sizeof(uint32_t));
}

mc_status cmp_gptq_factor_make(const cmp_hessian *h, double damp, int act_order,
                               kn_pool *pool, cmp_clock *factor_s,
                               cmp_gptq_factor *f, mc_error *err)
{
    memset(f, 0, sizeof *f);
    if (!h || !h->h || h->cols == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "hessian", -1,
                       "no Hessian to factorize");
    size_t n = h->cols;
    f->cols = h->cols;
    f->act_order = act_order != 0;
    f->damp = damp > 0.0 ? damp : 0.01;
    f->U = mc_malloc_array(n * n, sizeof(double));
    f->perm = mc_malloc_array(n, sizeof(uint32_t));
    double *diag = mc_malloc_array(n, sizeof(double));
    double *trow = mc_malloc_array(n, sizeof(double));
    uint32_t *tmp = mc_malloc_array(n, sizeof(uint32_t));
    mc_status st = MC_OK;
    if (!f->U || !f->perm || !diag || !trow || !tmp)
        st = mc_fail(err, MC_ERR_NOMEM, NULL, "gptq", -1,
                     "cannot allocate a %zu-wide GPTQ factor", n);
    else
        st = factor_into(h, &f->damp, f->act_order, pool, f->U, f->perm, diag,
                         trow, tmp, factor_s, err);
    mc_free(diag);
    mc_free(trow);
    mc_free(tmp);
    if (st != MC_OK)
        cmp_gptq_factor_free(f);
    return st;
}

void cmp_gptq_factor_free(cmp_gptq_factor *f)
{
    if (!f)
        return;
    mc_free(f->U);
    mc_free(f->perm);
    memset(f, 0, sizeof *f);
}

mc_status cmp_gptq_quantize(const float *w, const cmp_hessian *h,
                            const cmp_gptq_opts *opts, cmp_qbuf *out,
                            float *deq, double *damp_used, mc_error *err)
{
    mc_status st = cmp_qbuf_check(out, err);
    if (st != MC_OK)
        return st;
    if (!h || !h->h || h->cols != out->cols)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "hessian", -1,
                       "Hessian width %u does not match %u columns",
                       h ? h->cols : 0, out->cols);
    cmp_gptq_opts o = {0.01, 0, 128, 0, 0};
    if (opts)
        o = *opts;
    if (o.damp <= 0.0)
        o.damp = 0.01;
    kn_wformat fmt = out->fmt;
    size_t rows = out->rows, n = out->cols;
    uint32_t span = cmp_qbuf_span(out), ng = cmp_qbuf_nparams(out);
    int T = cmp_par_threads(o.pool);
    gptq_sizes z = gptq_plan(rows, n, o.block, fmt == KN_W_Q8 ? 0 : span,
                             o.chunk_rows, T);
    size_t block = z.block, chunk = z.chunk;

    /* With a factor given (opts.factor), U and the order come from it. */
    const cmp_gptq_factor *fac = o.factor;
    if (fac && (fac->cols != n || fac->act_order != (o.act_order != 0)))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "gptq", -1,
                       "the given factor is %u wide (act-order %d), not %zu (%d)",
                       fac->cols, fac->act_order, n, o.act_order != 0);
    for (size_t i = 0; i < rows * n; i++)
        if (!isfinite(w[i])) {
            char where[64];
            snprintf(where, sizeof where, "row %zu col %zu", i / n, i % n);
            return mc_fail(err, MC_ERR_NONFINITE, NULL, where, -1,
                           "weight is not finite");
        }

    /* Everything is allocated up front and stays live to the end: the sum
     * is what cmp_gptq_work_bytes reports. */
    float *Wone = NULL, *Eone = NULL, *gone = NULL;
    double *Pone = NULL;
    float **Wt = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &Wone;
    float **Et = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &Eone;
    float **gt = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &gone;
    double **Pt = T > 1 ? mc_calloc((size_t)T, sizeof(double *)) : &Pone;
    int have = Wt && Et && gt && Pt;
    for (int t = 0; have && t < T; t++) {
        Wt[t] = mc_malloc_array(chunk * n, sizeof(float));
        gt[t] = mc_malloc_array(n, sizeof(float));
        Et[t] = mc_malloc_array(chunk * block, sizeof(float));
        Pt[t] = mc_malloc_array(block * GPTQ_CC, sizeof(double));
        have = Wt[t] && gt[t] && Et[t] && Pt[t];
    }
    double *A = fac ? NULL : mc_malloc_array(n * n, sizeof(double));
    double *diag = mc_malloc_array(n, sizeof(double));
    double *trow = mc_malloc_array(n, sizeof(double));
    uint32_t *perm = fac ? NULL : mc_malloc_array(n, sizeof(uint32_t));
    uint32_t *tmp = mc_malloc_array(n, sizeof(uint32_t));
    float *imp = mc_malloc_array(n, sizeof(float));
    if (!have || (!fac && (!A || !perm)) || !diag || !trow || !tmp || !imp) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, "gptq", -1,
                     "cannot allocate GPTQ work space for %zux%zu (%.3g GiB)",
                     rows, n,
                     (double)cmp_gptq_work_bytes((uint32_t)rows, (uint32_t)n,
                                                 o.block, T) / (1u << 30));
        goto done;
    }
    for (size_t j = 0; j < n; j++)
        imp[j] = (float)hdiag(h, j);
    double damp = fac ? fac->damp : o.damp;
    if (!fac && (st = factor_into(h, &damp, o.act_order, o.pool, A, perm, diag,
                                  trow, tmp, o.factor_s, err)) != MC_OK)
        goto done;
    if (damp_used)
        *damp_used = damp;
    const double *U = fac ? fac->U : A;
    const uint32_t *order = fac ? fac->perm : perm;

    /* Static parameters: Q8 per row, and Q4 groups under act-order, from
     * the dead-zeroed original weights in original column order. */
    if (fmt != KN_W_Q8)
        memset(out->data, 0, (size_t)kn_wformat_data_bytes(fmt, out->rows, out->cols));
    gptq_job job = {w, h, &o, out, U, order, imp, n, block, chunk, span, ng,
                    fmt == KN_W_Q8 || o.act_order, Wt, Et, gt, Pt};
    cmp_par_rows(o.pool, (uint32_t)rows, 1, gptq_rows, &job);
    if (deq)
        cmp_dequant_matrix(out, deq);
    st = MC_OK;
done:
    for (int t = 0; t < T; t++) {
        if (Wt)
            mc_free(Wt[t]);
        if (Et)
            mc_free(Et[t]);
        if (gt)
            mc_free(gt[t]);
        if (Pt)
            mc_free(Pt[t]);
    }
    if (T > 1) {
        mc_free(Wt);
        mc_free(Et);
        mc_free(gt);
        mc_free(Pt);
    }
    mc_free(A);
    mc_free(diag);
    mc_free(trow);
    mc_free(perm);
    mc_free(tmp);
    mc_free(imp);
    return st;
}

/* cmp_gptq.c - GPTQ error-compensating quantization (see cmp_gptq.h). */
#include "cmp_gptq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmp_lanes.h"
#include "cmp_par.h"
#include "kn_gram.h"
#include "mc_alloc.h"

/* Work (multiply-adds) below which a step (a chunk of statistics, a
 * column of a Cholesky factor, a row of an inverse) stays on the calling
 * thread: waking the pool costs microseconds. */
#define PAR_MIN_WORK ((size_t)1 << 16)

/* Packed row i as an array indexed by the column: hrow(h, i)[j] is element
 * (i, j) for j >= i.  Stays inside the allocation: the offset, row_offset
 * - i, is >= 0 for every i < cols. */
static double *hrow(const cmp_hessian *h, size_t i)
{
    return h->h + cmp_hessian_row_offset(h->cols, (uint32_t)i) - i;
}

static double hdiag(const cmp_hessian *h, size_t i)
{
    return h->h[cmp_hessian_row_offset(h->cols, (uint32_t)i)];
}

/* Element (i, j) of the symmetric sum, either order. */
static double hsym(const cmp_hessian *h, size_t i, size_t j)
{
    return i <= j ? hrow(h, i)[j] : hrow(h, j)[i];
}

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
     * mc_calloc checks count * 8 against SIZE_MAX. */
    uint64_t packed = (uint64_t)cols * (cols + 1) / 2;
    if (packed <= SIZE_MAX)
        h->h = mc_calloc((size_t)packed, sizeof(double));
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

/* First index of thread tid's share of [0, n) when index i costs n - i
 * (rows of a packed triangle, columns of a row of the inverse):
 * n (1 - sqrt(1 - tid / nth)); n for tid >= nth. */
static size_t tri_split(size_t n, int tid, int nth)
{
    if (tid >= nth)
        return n;
    size_t i = (size_t)((double)n * (1.0 - sqrt(1.0 - (double)tid / nth)));
    return i < n ? i : n;
}

void cmp_hessian_add_par(kn_pool *p, cmp_hessian *h, const float *X, size_t T)
{
    kn_gram_tri(p, h->h, X, T, h->cols, h->xt);
    h->n += T;
}

void cmp_hessian_add(cmp_hessian *h, const float *X, size_t T)
{
    cmp_hessian_add_par(NULL, h, X, T);
}

void cmp_cross_add(kn_pool *p, double *c, const float *xf, const float *xq,
                   size_t T, uint32_t width, float *xt)
{
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
    _Static_assert(CMP_OERR_ROWS == CMP_LANES, "one row per lane");
    size_t n = h->cols;
    for (size_t j = 0; j < n; j++)
        for (uint32_t r = 0; r < B; r++) {
            size_t at = (size_t)(r0 + r) * n + j;
            d[j * B + r] = r < nr ? (double)w[at] - (q ? q[at] : 0.0f) : 0.0;
        }
    double acc_s[B] = {0};
    for (size_t i = 0; i < n; i++) {
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

typedef struct oerr_job {
    const cmp_hessian *h;
    const float *w, *q;
    double *d;     /* [threads][CMP_OERR_ROWS * cols] */
    double *terms; /* [rows] */
} oerr_job;

static void oerr_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    const oerr_job *j = ctx;
    double *d = j->d + (size_t)slot * CMP_OERR_ROWS * j->h->cols;
    for (uint32_t r = r0; r < r1; r += CMP_OERR_ROWS) {
        uint32_t nr = r1 - r < CMP_OERR_ROWS ? r1 - r : CMP_OERR_ROWS;
        oerr_block(j->h, j->w, j->q, r, nr, d, j->terms + r);
    }
}

uint64_t cmp_hessian_output_error_par_work_bytes(uint32_t cols, uint32_t rows,
                                                 int threads)
{
    if (threads <= 1)
        return cmp_hessian_output_error_work_bytes(cols);
    return (uint64_t)(rows ? rows : 1) * sizeof(double) +
           (uint64_t)threads * CMP_OERR_ROWS * cols * sizeof(double);
}

double cmp_hessian_output_error_par(kn_pool *p, const cmp_hessian *h,
                                    const float *w, const float *q,
                                    uint32_t rows)
{
    int T = cmp_par_threads(p);
    if (T <= 1)
        return cmp_hessian_output_error(h, w, q, rows);
    oerr_job j = {h, w, q, NULL, NULL};
    j.d = mc_malloc_array((size_t)T * CMP_OERR_ROWS * h->cols, sizeof(double));
    j.terms = mc_malloc_array(rows ? rows : 1, sizeof(double));
    double total = NAN;
    if (j.d && j.terms) {
        cmp_par_rows(p, rows, CMP_OERR_ROWS, oerr_rows, &j);
        total = 0.0;
        for (uint32_t r = 0; r < rows; r++) /* in row order, as one thread */
            total += j.terms[r];
    }
    mc_free(j.d);
    mc_free(j.terms);
    return total;
}


typedef struct chol_job {
    double *a;
    size_t n, j; /* the column being formed */
    double d;    /* its diagonal */
} chol_job;

/* Column j of L for rows j + 1 + [r0, r1): eight rows at a time
 * (cmp_lanes.h; t - (-rj[k]) ri[k] is the plain loop's t - ri[k] rj[k], in
 * the same order), the rest one by one. */
static void chol_col_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    (void)slot;
    const chol_job *c = ctx;
    double *a = c->a;
    size_t n = c->n, j = c->j;
    const double *rj = a + j * n;
    size_t i = j + 1 + r0, end = j + 1 + r1;
    for (; i + CMP_LANES <= end; i += CMP_LANES) {
        double t[CMP_LANES];
        for (size_t r = 0; r < CMP_LANES; r++)
            t[r] = a[(i + r) * n + j];
        cmp_lanes_dot(t, -1.0, rj, a + i * n, 1, n, 0, j);
        for (size_t r = 0; r < CMP_LANES; r++)
            a[(i + r) * n + j] = t[r] / c->d;
    }
    for (; i < end; i++) {
        double t = a[i * n + j];
        const double *ri = a + i * n;
        for (size_t k = 0; k < j; k++)
            t -= ri[k] * rj[k];
        a[i * n + j] = t / c->d;
    }
}

/* In-place lower Cholesky of the n x n symmetric a (lower triangle read and
 * written; upper left alone).  A column's rows are independent given the
 * earlier columns: with a pool they are split over its threads (each
 * element computed as on one thread).  0 on success, -1 if not positive
 * definite. */
static int cholesky_lower(double *a, size_t n, kn_pool *p)
{
    for (size_t j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (size_t k = 0; k < j; k++)
            s -= a[j * n + k] * a[j * n + k];
        if (!(s > 0.0) || !isfinite(s))
            return -1;
        double d = sqrt(s);
        a[j * n + j] = d;
        chol_job c = {a, n, j, d};
        uint32_t rows = (uint32_t)(n - j - 1);
        if ((size_t)rows * j >= PAR_MIN_WORK)
            cmp_par_rows(p, rows, CMP_LANES, chol_col_rows, &c);
        else
            chol_col_rows(&c, 0, rows, 0);
    }
    return 0;
}

typedef struct inv_job {
    const double *a;
    double *t;
    size_t n, i; /* the row of X being formed, in t */
} inv_job;

/* Columns [j0, j1) of row i of X into t: t[j] = -sum_{k=j}^{i-1} L[i][k]
 * X[k][j], k ascending (zero L[i][k] skipped), as in the one-thread loop. */
static void inv_cols(const inv_job *v, size_t j0, size_t j1)
{
    const double *li = v->a + v->i * v->n;
    double *t = v->t;
    for (size_t j = j0; j < j1; j++)
        t[j] = 0.0;
    for (size_t k = j0; k < v->i; k++) {
        double c = li[k];
        if (c == 0.0)
            continue;
        const double *xk = v->a + k * v->n;
        size_t je = k + 1 < j1 ? k + 1 : j1;
        for (size_t j = j0; j < je; j++)
            t[j] -= c * xk[j];
    }
}

/* Thread tid of nth takes the columns of row i that hold an equal share of
 * the work, which falls linearly with the column (column j gets i - j
 * updates): tri_split's ranges. */
static void inv_thread(void *ctx, int tid, int nth)
{
    const inv_job *v = ctx;
    size_t j0 = tri_split(v->i, tid, nth), j1 = tri_split(v->i, tid + 1, nth);
    if (j1 > j0)
        inv_cols(v, j0, j1);
}

/* In-place inverse of the lower triangular L in a's lower triangle (upper
 * left alone).  Forward substitution over whole rows, row i of X = L^-1:
 *   X[i][.] = (e_i - sum_{k<i} L[i][k] X[k][.]) / L[i][i]
 * Row i of L is still read while X[i] is built, so X[i] grows in t (n
 * doubles) and is copied over L[i] once the whole row is formed; rows
 * k < i already hold X.  Every inner loop runs along a row (contiguous;
 * the column-wise version was dominated by strided loads, seconds at
 * n = 1536).  With a pool a row's columns are split over its threads
 * (each element computed as on one thread). */
static void invert_lower(double *a, double *t, size_t n, kn_pool *p)
{
    for (size_t i = 0; i < n; i++) {
        double *li = a + i * n;
        inv_job v = {a, t, n, i};
        if (cmp_par_threads(p) > 1 && i * i / 2 >= PAR_MIN_WORK)
            kn_pool_run(p, inv_thread, &v);
        else
            inv_cols(&v, 0, i);
        double inv = 1.0 / li[i];
        t[i] = 1.0;
        for (size_t j = 0; j <= i; j++)
            li[j] = t[j] * inv;
    }
}

mc_status cmp_gptq_hinv_factor(const cmp_hessian *h, const uint32_t *perm,
                               double lambda, double *a, double *row,
                               kn_pool *pool, mc_error *err)
{
    size_t n = h->cols;
    /* R = J P^T H' P J into the lower triangle: R[i][j] = H'[p(n-1-i)]
     * [p(n-1-j)].  Without a permutation, row i of R reads packed row
     * n-1-i backwards, contiguously. */
    for (size_t i = 0; i < n; i++) {
        size_t pi = perm ? perm[n - 1 - i] : n - 1 - i;
        double *ai = a + i * n;
        for (size_t j = 0; j < i; j++) {
            size_t pj = perm ? perm[n - 1 - j] : n - 1 - j;
            ai[j] = hsym(h, pi, pj);
        }
        double d = hdiag(h, pi);
        ai[i] = (d == 0.0 ? 1.0 : d) + lambda;
    }
    if (cholesky_lower(a, n, pool) != 0)
        return mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                       "not positive definite");
    invert_lower(a, row, n, pool);
    /* R = L L^T, so H'^-1 = J R^-1 J = (J L^-1 J)^T (J L^-1 J): U = J L^-1 J
     * is upper triangular with a positive diagonal, i.e. the upper Cholesky
     * factor of H'^-1.  U[n-1-i][n-1-j] = L^-1[i][j]: each strictly lower
     * element moves to its mirror in the (so far unused) strictly upper
     * triangle (source row forwards, target row backwards, both
     * contiguous), the diagonal reverses, and the lower part is cleared.
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
    for (size_t i = 0; i < n; i++)
        finite &= isfinite(a[i * n + i]);
    for (size_t i = 0; i < n / 2; i++) {
        double t = a[i * n + i];
        a[i * n + i] = a[(n - 1 - i) * n + (n - 1 - i)];
        a[(n - 1 - i) * n + (n - 1 - i)] = t;
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

/* Bytes mc_malloc takes for a request: 0 counts as 1. */
static uint64_t req(uint64_t bytes)
{
    return bytes ? bytes : 1;
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
           (T > 1 ? 3 * req(T * sizeof(void *)) : 0); /* their tables */
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
} gptq_job;

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
            if (i2 < n)
                for (size_t r = 0; r < R; r++) {
                    float *wr = W + r * n;
                    for (size_t k = i1; k < i2; k++) {
                        double e = E[r * block + (k - i1)];
                        if (e == 0.0)
                            continue;
                        const double *uk = U + k * n;
                        for (size_t c = i2; c < n; c++)
                            wr[c] -= (float)(e * uk[c]);
                    }
                }
        }
    }
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
    float **Wt = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &Wone;
    float **Et = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &Eone;
    float **gt = T > 1 ? mc_calloc((size_t)T, sizeof(float *)) : &gone;
    int have = Wt && Et && gt;
    for (int t = 0; have && t < T; t++) {
        Wt[t] = mc_malloc_array(chunk * n, sizeof(float));
        gt[t] = mc_malloc_array(n, sizeof(float));
        Et[t] = mc_malloc_array(chunk * block, sizeof(float));
        have = Wt[t] && gt[t] && Et[t];
    }
    double *A = mc_malloc_array(n * n, sizeof(double));
    double *diag = mc_malloc_array(n, sizeof(double));
    double *trow = mc_malloc_array(n, sizeof(double));
    uint32_t *perm = mc_malloc_array(n, sizeof(uint32_t));
    uint32_t *tmp = mc_malloc_array(n, sizeof(uint32_t));
    float *imp = mc_malloc_array(n, sizeof(float));
    if (!have || !A || !diag || !trow || !perm || !tmp || !imp) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, "gptq", -1,
                     "cannot allocate GPTQ work space for %zux%zu (%.3g GiB)",
                     rows, n,
                     (double)cmp_gptq_work_bytes((uint32_t)rows, (uint32_t)n,
                                                 o.block, T) / (1u << 30));
        goto done;
    }
    /* diag: H's diagonal with dead inputs (H_jj == 0) at 1, as the
     * dampening and act-order see it; the dead columns' weights are zeroed
     * per chunk below. */
    double mean = 0.0;
    for (size_t j = 0; j < n; j++) {
        diag[j] = hdiag(h, j);
        imp[j] = (float)diag[j];
        if (diag[j] == 0.0)
            diag[j] = 1.0;
        mean += diag[j];
    }
    mean /= (double)n;
    if (o.act_order)
        argsort_desc(diag, perm, tmp, n);
    else
        for (size_t j = 0; j < n; j++)
            perm[j] = (uint32_t)j;

    /* U in A; raise lambda while the factorization fails. */
    double damp = o.damp;
    int ok = 0;
    double tf = cmp_par_now();
    for (int attempt = 0; attempt < 7 && !ok; attempt++) {
        if (cmp_gptq_hinv_factor(h, perm, damp * mean, A, trow, o.pool, NULL) == MC_OK)
            ok = 1;
        else
            damp *= 10.0;
    }
    if (o.factor_s)
        *o.factor_s += cmp_par_now() - tf;
    if (!ok) {
        st = mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                     "Hessian is not positive definite even with dampening "
                     "%g x mean diagonal", damp / 10.0);
        goto done;
    }
    if (damp_used)
        *damp_used = damp;

    /* Static parameters: Q8 per row, and Q4 groups under act-order, from
     * the dead-zeroed original weights in original column order. */
    if (fmt != KN_W_Q8)
        memset(out->data, 0, (size_t)kn_wformat_data_bytes(fmt, out->rows, out->cols));
    gptq_job job = {w, h, &o, out, A, perm, imp, n, block, chunk, span, ng,
                    fmt == KN_W_Q8 || o.act_order, Wt, Et, gt};
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
    }
    if (T > 1) {
        mc_free(Wt);
        mc_free(Et);
        mc_free(gt);
    }
    mc_free(A);
    mc_free(diag);
    mc_free(trow);
    mc_free(perm);
    mc_free(tmp);
    mc_free(imp);
    return st;
}

uint64_t cmp_gptq_retarget_work_bytes(uint32_t cols, int threads)
{
    uint64_t n = cols, T = threads > 1 ? threads : 1;
    return req(n * n * sizeof(double)) +
           req(T * 2 * n * CMP_RETARGET_ROWS * sizeof(double));
}

typedef struct retarget_job {
    const double *A; /* L in the lower triangle, L^T mirrored above */
    const double *c;
    const float *w;
    float *out;
    double *z;       /* [threads][2 * cols * CMP_RETARGET_ROWS] */
    size_t n;
} retarget_job;

/* Rows [r0, r1), B at a time, interleaved (x[j * B + r]): each pass over C
 * and L serves all of them, and their sums are independent chains.  Every
 * row's own operations, and their order, are those of the row alone; the
 * unused lanes of a short last block solve for zeros. */
static void retarget_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    enum { B = CMP_RETARGET_ROWS };
    const retarget_job *jb = ctx;
    size_t n = jb->n;
    const double *A = jb->A, *c = jb->c;
    double *b = jb->z + (size_t)slot * 2 * n * B, *y = b + n * B;
    for (uint32_t rb = r0; rb < r1; rb += B) {
        uint32_t nr = r1 - rb < B ? r1 - rb : B;
        const float *wb = jb->w + (size_t)rb * n;
        /* b = C^T w_r; a zero w_ri adds nothing (as in the one-row sum) */
        for (size_t j = 0; j < n * B; j++)
            b[j] = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double *ci = c + i * n;
            double wi[B];
            int live = 0;
            for (uint32_t r = 0; r < B; r++) {
                wi[r] = r < nr ? wb[(size_t)r * n + i] : 0.0;
                live += wi[r] != 0.0;
            }
            if (live == B) {
                cmp_lanes_axpy(b, wi, ci, n);
            } else if (live) {
                for (uint32_t r = 0; r < B; r++)
                    if (wi[r] != 0.0)
                        for (size_t j = 0; j < n; j++)
                            b[j * B + r] += wi[r] * ci[j];
            }
        }
        /* Solve L L^T x = b. */
        for (size_t i = 0; i < n; i++) {
            double t[B];
            for (uint32_t r = 0; r < B; r++)
                t[r] = b[i * B + r];
            const double *li = A + i * n;
            cmp_lanes_dot(t, -1.0, li, y, B, 1, 0, i);
            for (uint32_t r = 0; r < B; r++)
                y[i * B + r] = t[r] / li[i];
        }
        for (size_t i = n; i-- > 0;) {
            double t[B];
            for (uint32_t r = 0; r < B; r++)
                t[r] = y[i * B + r];
            const double *ui = A + i * n;
            cmp_lanes_dot(t, -1.0, ui, b, B, 1, i + 1, n);
            for (uint32_t r = 0; r < B; r++)
                b[i * B + r] = t[r] / ui[i];
        }
        for (uint32_t r = 0; r < nr; r++)
            for (size_t j = 0; j < n; j++)
                jb->out[(size_t)(rb + r) * n + j] = (float)b[j * B + r];
    }
}

mc_status cmp_gptq_retarget(const cmp_hessian *hq, const double *c,
                            const float *w, uint32_t rows, double damp,
                            float *out, kn_pool *pool, mc_error *err)
{
    enum { B = CMP_RETARGET_ROWS };
    _Static_assert(CMP_RETARGET_ROWS == CMP_LANES, "one row per lane");
    size_t n = hq->cols;
    int T = cmp_par_threads(pool);
    double *A = mc_malloc_array(n * n, sizeof(double));
    double *z = mc_malloc_array((size_t)T * 2 * n * B, sizeof(double));
    if (!A || !z) {
        mc_free(A);
        mc_free(z);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "retarget", -1,
                       "cannot allocate %zu x %zu doubles", n, n);
    }
    double mean = 0.0;
    for (size_t j = 0; j < n; j++)
        mean += hdiag(hq, j);
    mean /= (double)n;
    if (!(mean > 0.0))
        mean = 1.0;
    if (damp <= 0.0)
        damp = 0.01;
    int ok = 0;
    for (int attempt = 0; attempt < 7 && !ok; attempt++) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j <= i; j++)
                A[i * n + j] = hsym(hq, i, j) + (i == j ? damp * mean : 0.0);
        if (cholesky_lower(A, n, pool) == 0)
            ok = 1;
        else
            damp *= 10.0;
    }
    if (!ok) {
        mc_free(A);
        mc_free(z);
        return mc_fail(err, MC_ERR_NONFINITE, NULL, "hessian", -1,
                       "input Hessian is not positive definite");
    }
    /* L^T into the upper triangle, so that the back substitution reads
     * rows (the same values in the same order as walking L's columns). */
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++)
            A[i * n + k] = A[k * n + i];
    retarget_job j = {A, c, w, out, z, n};
    cmp_par_rows(pool, rows, B, retarget_rows, &j);
    mc_free(A);
    mc_free(z);
    return MC_OK;
}

/* Solve the symmetric positive (semi)definite system M x = b in place
 * (x in b) by Cholesky with a tiny ridge; 0 on success, -1 if it is not
 * positive definite even so. */
static int spd_solve(double *M, double *b, uint32_t n)
{
    double tr = 0.0;
    for (uint32_t i = 0; i < n; i++)
        tr += M[(size_t)i * n + i];
    double ridge = 1e-10 * (tr > 0.0 ? tr / n : 1.0);
    for (uint32_t i = 0; i < n; i++)
        M[(size_t)i * n + i] += ridge;
    for (uint32_t j = 0; j < n; j++) {
        double d = M[(size_t)j * n + j];
        for (uint32_t k = 0; k < j; k++)
            d -= M[(size_t)j * n + k] * M[(size_t)j * n + k];
        if (!(d > 0.0))
            return -1;
        d = sqrt(d);
        M[(size_t)j * n + j] = d;
        for (uint32_t i = j + 1; i < n; i++) {
            double s = M[(size_t)i * n + j];
            for (uint32_t k = 0; k < j; k++)
                s -= M[(size_t)i * n + k] * M[(size_t)j * n + k];
            M[(size_t)i * n + j] = s / d;
        }
    }
    for (uint32_t i = 0; i < n; i++) { /* L y = b */
        double s = b[i];
        for (uint32_t k = 0; k < i; k++)
            s -= M[(size_t)i * n + k] * b[k];
        b[i] = s / M[(size_t)i * n + i];
    }
    for (uint32_t i = n; i-- > 0;) { /* L^T x = y */
        double s = b[i];
        for (uint32_t k = i + 1; k < n; k++)
            s -= M[(size_t)k * n + i] * b[k];
        b[i] = s / M[(size_t)i * n + i];
    }
    return 0;
}

/* -2 s^T rhs + s^T M s: the row's output error up to the constant
 * w^T H w, for scales s [n] (M [n][n] full). */
static double scale_objective(const double *M, const double *rhs,
                              const double *s, uint32_t n)
{
    double e = 0.0;
    for (uint32_t g = 0; g < n; g++) {
        double t = 0.0;
        for (uint32_t k = 0; k < n; k++)
            t += M[(size_t)g * n + k] * s[k];
        e += s[g] * (t - 2.0 * rhs[g]);
    }
    return e;
}

/* One thread's refit work space (cmp_gptq_refit_work_bytes per set). */
typedef struct refit_ws {
    double *hw, *a, *wd, *M, *Mc, *rhs, *s, *s0;
    cmp_qparam *p0;
} refit_ws;

uint64_t cmp_gptq_refit_work_bytes(uint32_t cols, uint32_t groups, int threads)
{
    uint64_t K = cols, G = groups, B = CMP_LANES, T = threads > 1 ? threads : 1;
    return T * (3 * req(K * B * sizeof(double)) +    /* hw, a, wd */
                req(G * G * B * sizeof(double)) +    /* M, one per lane */
                req(G * G * sizeof(double)) +        /* Mc */
                3 * req(G * sizeof(double)) +        /* rhs, s, s0 */
                req(G * B * sizeof(cmp_qparam))) +   /* p0 */
           T * sizeof(refit_ws);                     /* the sets' table */
}

/* The refit's sums for one block of nr <= CMP_LANES rows starting at r0,
 * each row on its own lane (lanes past nr see zero codes and weights):
 * M_gk = a_g^T H a_k into M + lane * G * G and hw = H w interleaved
 * (hw[j * CMP_LANES + lane]), in one pass over the stored upper triangle,
 * row by row (contiguous): each off-diagonal H_ij counts for (i, j) and
 * (j, i).  a, wd: the codes at unit scale and the weights, interleaved.
 * Every lane's sums are formed in the order of its row alone. */
static void refit_sums(const cmp_hessian *h, uint32_t span, uint32_t G,
                       const double *a, const double *wd, double *M,
                       double *hw)
{
    enum { B = CMP_LANES };
    uint32_t K = h->cols;
    memset(M, 0, (size_t)G * G * B * sizeof(double));
    memset(hw, 0, (size_t)K * B * sizeof(double));
    for (uint32_t i = 0; i < K; i++) {
        const double *Ui = hrow(h, i);
        uint32_t gi = i / span;
        const double *ai = a + (size_t)i * B, *wi = wd + (size_t)i * B;
        double hwi[B];
        for (uint32_t r = 0; r < B; r++) {
            hwi[r] = Ui[i] * wi[r];
            M[(size_t)r * G * G + (size_t)gi * G + gi] += Ui[i] * ai[r] * ai[r];
        }
        for (uint32_t j0 = i + 1; j0 < K;) {
            uint32_t gj = j0 / span;
            uint32_t j1 = (gj + 1) * span < K ? (gj + 1) * span : K;
            double sa[B] = {0};
            cmp_lanes_dot(sa, 1.0, Ui, a, B, 1, j0, j1);
            cmp_lanes_dot(hwi, 1.0, Ui, wd, B, 1, j0, j1);
            cmp_lanes_axpy(hw + (size_t)j0 * B, wi, Ui + j0, j1 - j0);
            for (uint32_t r = 0; r < B; r++) {
                double *Mr = M + (size_t)r * G * G;
                Mr[(size_t)gi * G + gj] += ai[r] * sa[r];
                Mr[(size_t)gj * G + gi] += ai[r] * sa[r];
            }
            j0 = j1;
        }
        for (uint32_t r = 0; r < B; r++)
            hw[(size_t)i * B + r] += hwi[r];
    }
}

mc_status cmp_hessian_check_qbuf(const cmp_hessian *h, const cmp_qbuf *q,
                                 mc_error *err)
{
    mc_status st = cmp_qbuf_check(q, err);
    if (st != MC_OK)
        return st;
    if (h->cols != q->cols)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "hessian", -1,
                       "Hessian width %u, matrix width %u", h->cols, q->cols);
    return MC_OK;
}

typedef struct refit_job {
    const float *w;
    const cmp_hessian *h;
    cmp_qbuf *q;
    refit_ws *ws; /* [threads] */
} refit_job;

/* Refit rows [r0, r1), CMP_LANES at a time. */
static void refit_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    enum { B = CMP_LANES };
    const refit_job *j = ctx;
    const refit_ws *x = &j->ws[slot];
    cmp_qbuf *q = j->q;
    const float *w = j->w;
    uint32_t K = q->cols, G = cmp_qbuf_nparams(q), span = cmp_qbuf_span(q);
    for (uint32_t rb = r0; rb < r1; rb += B) {
        uint32_t nr = r1 - rb < B ? r1 - rb : B;
        /* a: the codes at unit scale (group g holds columns g*span ..) */
        for (uint32_t r = 0; r < B; r++)
            for (uint32_t g = 0; g < G; g++) {
                cmp_qparam pg = {0.0f, 0};
                if (r < nr)
                    pg = cmp_qbuf_get_param(q, rb + r, g);
                x->p0[(size_t)r * G + g] = pg;
                uint32_t c1 = (g + 1) * span < K ? (g + 1) * span : K;
                for (uint32_t c = g * span; c < c1; c++) {
                    size_t at = (size_t)c * B + r;
                    x->a[at] = r < nr ? (double)(cmp_qbuf_get_code(q, rb + r, c) - pg.zero) : 0.0;
                    x->wd[at] = r < nr ? (double)w[(size_t)(rb + r) * K + c] : 0.0;
                }
            }
        refit_sums(j->h, span, G, x->a, x->wd, x->M, x->hw);
        for (uint32_t r = 0; r < nr; r++) {
            const double *Mr = x->M + (size_t)r * G * G;
            const cmp_qparam *pr = x->p0 + (size_t)r * G;
            for (uint32_t g = 0; g < G; g++) {
                x->s0[g] = pr[g].scale;
                uint32_t c1 = (g + 1) * span < K ? (g + 1) * span : K;
                double t = 0.0;
                for (uint32_t c = g * span; c < c1; c++)
                    t += x->a[(size_t)c * B + r] * x->hw[(size_t)c * B + r];
                x->rhs[g] = t;
            }
            memcpy(x->Mc, Mr, (size_t)G * G * sizeof(double));
            memcpy(x->s, x->rhs, G * sizeof(double));
            if (spd_solve(x->Mc, x->s, G) != 0)
                continue; /* codes without the rank to refit: keep */
            /* store (rounding to the stored precision), compare, keep the
             * better of the two */
            int ok = 1;
            for (uint32_t g = 0; g < G && ok; g++)
                ok = isfinite(x->s[g]) && (q->fmt == KN_W_Q4S || x->s[g] >= 0.0);
            if (!ok)
                continue;
            for (uint32_t g = 0; g < G; g++) {
                cmp_qparam pp = {(float)x->s[g], pr[g].zero};
                cmp_qbuf_set_param(q, rb + r, g, pp);
                x->s[g] = cmp_qbuf_get_param(q, rb + r, g).scale;
            }
            if (scale_objective(Mr, x->rhs, x->s, G) >=
                scale_objective(Mr, x->rhs, x->s0, G))
                for (uint32_t g = 0; g < G; g++)
                    cmp_qbuf_set_param(q, rb + r, g, pr[g]);
        }
    }
}

mc_status cmp_gptq_refit_scales(const float *w, const cmp_hessian *h,
                                cmp_qbuf *q, float *deq, kn_pool *pool,
                                mc_error *err)
{
    enum { B = CMP_LANES };
    mc_status st = cmp_hessian_check_qbuf(h, q, err);
    if (st != MC_OK)
        return st;
    uint32_t K = q->cols, G = cmp_qbuf_nparams(q);
    int T = cmp_par_threads(pool);
    refit_ws *ws = mc_calloc((size_t)T, sizeof *ws);
    if (!ws)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "scale refit work space");
    int ok = 1;
    for (int t = 0; t < T; t++) {
        refit_ws *x = &ws[t];
        x->hw = mc_malloc_array((size_t)K * B, sizeof(double));
        x->a = mc_malloc_array((size_t)K * B, sizeof(double));
        x->wd = mc_malloc_array((size_t)K * B, sizeof(double));
        x->M = mc_malloc_array((size_t)G * G * B, sizeof(double));
        x->Mc = mc_malloc_array((size_t)G * G, sizeof(double));
        x->rhs = mc_malloc_array(G, sizeof(double));
        x->s = mc_malloc_array(G, sizeof(double));
        x->s0 = mc_malloc_array(G, sizeof(double));
        x->p0 = mc_malloc_array((size_t)G * B, sizeof(cmp_qparam));
        ok &= x->hw && x->a && x->wd && x->M && x->Mc && x->rhs && x->s &&
              x->s0 && x->p0;
    }
    if (!ok) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "scale refit work space");
    } else {
        refit_job j = {w, h, q, ws};
        cmp_par_rows(pool, q->rows, B, refit_rows, &j);
        if (deq)
            cmp_dequant_matrix(q, deq);
    }
    for (int t = 0; t < T; t++) {
        refit_ws *x = &ws[t];
        mc_free(x->hw);
        mc_free(x->a);
        mc_free(x->wd);
        mc_free(x->M);
        mc_free(x->Mc);
        mc_free(x->rhs);
        mc_free(x->s);
        mc_free(x->s0);
        mc_free(x->p0);
    }
    mc_free(ws);
    return st;
}

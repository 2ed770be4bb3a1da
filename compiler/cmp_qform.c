/* cmp_qform.c - tiled row-wise quadratic forms (see cmp_qform.h). */
#include "cmp_qform.h"

#include <math.h>
#include <string.h>

#include "cmp_gptq_internal.h"
#include "cmp_lanes.h"
#include "cmp_par.h"
#include "kn_lanes.h"
#include "mc_alloc.h"

enum { B = CMP_LANES, TI = CMP_QFORM_TI, TJ = CMP_QFORM_TJ };
_Static_assert(CMP_QFORM_CHUNK % CMP_LANES == 0, "whole blocks per chunk");
_Static_assert(CMP_QFORM_TI <= CMP_QFORM_TJ, "a diagonal tile holds its triangle");
_Static_assert(CMP_QFORM_TI % 4 == 0, "rows of H four at a time");
_Static_assert(KN_QUAD_LANES == CMP_LANES, "one row per lane");

/* Columns of a tile row (a narrow matrix needs no wider tile). */
static size_t tile_cols(size_t n)
{
    return n < TJ ? n : TJ;
}

/* Rows per pass for a call over `rows` rows: a short call needs no more
 * work space than its own rows. */
static uint32_t chunk_rows(uint32_t rows)
{
    uint32_t r = rows < CMP_QFORM_CHUNK ? rows : CMP_QFORM_CHUNK;
    return (r + B - 1) / B * B;
}

uint64_t cmp_qform_work_doubles(uint32_t n, uint32_t rows)
{
    return 2 * (uint64_t)chunk_rows(rows) * n + (uint64_t)TI * tile_cols(n);
}

/* One tile of coefficients against nb blocks: for the rows i in [i0, i1)
 * (cr[i - i0] their coefficients, indexed by j - j0) and every block b,
 *   t_b[i] += cr[i - i0][j - j0] * x_b[j] for j in [max(j0, lo(i)), j1)
 * ascending, lo(i) = i + 1 when tri (the packed triangle) else 0.  With
 * tri, i + 4 <= j1 for every i < i1 (TI <= TJ and j0 >= i0), so a group of
 * four rows is staggered only over [i + 1, i + 4). */
static void tile_pass(const double *const *cr, size_t i0, size_t i1, size_t j0,
                      size_t j1, int tri, const double *x, double *t,
                      uint32_t nb, size_t n)
{
    int avx = kn_cpu_has_avx2() && !kn_force_scalar();
    for (uint32_t b = 0; b < nb; b++) {
        const double *xb = x + (size_t)b * n * B + j0 * B;
        double *tb = t + (size_t)b * n * B;
        size_t i = i0;
        for (; avx && i + 4 <= i1; i += 4) {
            size_t kb = j0; /* where all four rows are inside their range */
            if (tri && i + 4 > j0) {
                kb = i + 4;
                for (size_t g = 0; g < 3; g++) /* the staggered start */
                    cmp_lanes_dot(tb + (i + g) * B, 1.0, cr[i + g - i0], xb, B, 1,
                                  i + g + 1 - j0, kb - j0);
            }
            const double *rows[4] = {cr[i - i0], cr[i + 1 - i0], cr[i + 2 - i0],
                                     cr[i + 3 - i0]};
            kn_avx2_quad4_acc(rows, xb, kb - j0, j1 - j0, tb + i * B);
        }
        for (; i < i1; i++) {
            size_t k0 = tri && i + 1 > j0 ? i + 1 : j0;
            cmp_lanes_dot(tb + i * B, 1.0, cr[i - i0], xb, B, 1, k0 - j0, j1 - j0);
        }
    }
}

/* The packed H's tile (rows [i0, i1), columns [j0, j1)) doubled (the
 * off-diagonal weight, exact) into tile, row pointers into cr. */
static void copy_tile2(const cmp_hessian *h, size_t i0, size_t i1, size_t j0,
                       size_t j1, double *tile, const double **cr)
{
    for (size_t i = i0; i < i1; i++) {
        double *dst = tile + (i - i0) * tile_cols(h->cols);
        const double *src = hrow(h, i);
        for (size_t j = j0 > i + 1 ? j0 : i + 1; j < j1; j++)
            dst[j - j0] = 2.0 * src[j];
        cr[i - i0] = dst;
    }
}

/* Rows [r0, r0 + nr) of w - q (q NULL: w) or of w alone, interleaved in
 * blocks into x (lanes past nr zero). */
static void interleave(const float *w, const float *q, uint32_t nr, size_t n,
                       double *x)
{
    uint32_t nb = (nr + B - 1) / B;
    for (uint32_t b = 0; b < nb; b++)
        for (size_t j = 0; j < n; j++)
            for (uint32_t r = 0; r < B; r++) {
                uint32_t row = b * B + r;
                size_t at = (size_t)row * n + j;
                x[((size_t)b * n + j) * B + r] =
                    row < nr ? (double)w[at] - (q ? q[at] : 0.0f) : 0.0;
            }
}

void cmp_qform_sym_terms(const cmp_hessian *h, const float *w, const float *q,
                         uint32_t rows, double *work, double *terms)
{
    size_t n = h->cols;
    uint32_t chunk = chunk_rows(rows);
    double *x = work, *t = x + (size_t)chunk * n, *tile = t + (size_t)chunk * n;
    const double *cr[TI];
    for (uint32_t c0 = 0; c0 < rows; c0 += chunk) {
        uint32_t nr = rows - c0 < chunk ? rows - c0 : chunk;
        uint32_t nb = (nr + B - 1) / B;
        interleave(w + (size_t)c0 * n, q ? q + (size_t)c0 * n : NULL, nr, n, x);
        double s[CMP_QFORM_CHUNK] = {0};
        for (size_t i0 = 0; i0 < n; i0 += TI) {
            size_t i1 = n - i0 < TI ? n : i0 + TI;
            for (uint32_t b = 0; b < nb; b++) /* each chain starts h_ii d_i */
                for (size_t i = i0; i < i1; i++)
                    for (uint32_t r = 0; r < B; r++) {
                        size_t at = ((size_t)b * n + i) * B + r;
                        t[at] = hdiag(h, i) * x[at];
                    }
            for (size_t j0 = i0; j0 < n; j0 += TJ) {
                size_t j1 = n - j0 < TJ ? n : j0 + TJ;
                copy_tile2(h, i0, i1, j0, j1, tile, cr);
                tile_pass(cr, i0, i1, j0, j1, 1, x, t, nb, n);
            }
            for (uint32_t b = 0; b < nb; b++)
                for (size_t i = i0; i < i1; i++)
                    for (uint32_t r = 0; r < B; r++) {
                        size_t at = ((size_t)b * n + i) * B + r;
                        if (x[at] != 0.0)
                            s[b * B + r] += x[at] * t[at];
                    }
        }
        memcpy(terms + c0, s, nr * sizeof(double));
    }
}

void cmp_qform_rows(const double *M, uint32_t n, const double *x, uint32_t nb,
                    double *t)
{
    /* M's rows are contiguous: its tiles are read in place */
    const double *cr[TI];
    memset(t, 0, (size_t)nb * n * B * sizeof(double));
    for (size_t i0 = 0; i0 < n; i0 += TI) {
        size_t i1 = n - i0 < TI ? n : i0 + TI;
        for (size_t j0 = 0; j0 < n; j0 += TJ) {
            size_t j1 = n - j0 < TJ ? n : j0 + TJ;
            for (size_t i = i0; i < i1; i++)
                cr[i - i0] = M + i * n + j0;
            tile_pass(cr, i0, i1, j0, j1, 0, x, t, nb, n);
        }
    }
}

void cmp_qform_cross_terms(const double *M, uint32_t n, const float *a,
                           const float *b, uint32_t rows, double *work,
                           double *terms)
{
    uint32_t chunk = chunk_rows(rows);
    double *x = work, *t = x + (size_t)chunk * n;
    for (uint32_t c0 = 0; c0 < rows; c0 += chunk) {
        uint32_t nr = rows - c0 < chunk ? rows - c0 : chunk;
        uint32_t nb = (nr + B - 1) / B;
        interleave(b + (size_t)c0 * n, NULL, nr, n, x);
        cmp_qform_rows(M, n, x, nb, t);
        for (uint32_t r = 0; r < nr; r++) {
            const float *ar = a + (size_t)(c0 + r) * n;
            const double *tr = t + (size_t)(r / B) * n * B + r % B;
            double s = 0.0;
            for (size_t i = 0; i < n; i++)
                if (ar[i] != 0.0f)
                    s += ar[i] * tr[i * B];
            terms[c0 + r] = s;
        }
    }
}

uint64_t cmp_qform_par_work_bytes(uint32_t n, uint32_t rows, int threads)
{
    uint64_t T = threads > 1 ? (uint64_t)threads : 1;
    return (uint64_t)(rows ? rows : 1) * sizeof(double) +
           T * cmp_qform_work_doubles(n, rows) * sizeof(double);
}

typedef struct qform_job {
    const cmp_hessian *h; /* sym: the packed H; else NULL */
    const double *M;      /* cross: the full matrix */
    uint32_t n;
    const float *a, *b;   /* sym: w, q; cross: a, b */
    uint64_t per;         /* cmp_qform_work_doubles(n, rows): a thread's */
    double *work;         /* [threads][per] */
    double *terms;        /* [rows] */
} qform_job;

static void qform_job_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    const qform_job *j = ctx;
    size_t at = (size_t)r0 * j->n;
    double *work = j->work + (size_t)slot * j->per;
    if (j->h)
        cmp_qform_sym_terms(j->h, j->a + at, j->b ? j->b + at : NULL, r1 - r0,
                            work, j->terms + r0);
    else
        cmp_qform_cross_terms(j->M, j->n, j->a + at, j->b + at, r1 - r0, work,
                              j->terms + r0);
}

static double qform_par(kn_pool *p, qform_job *j, uint32_t rows)
{
    int T = cmp_par_threads(p);
    /* a thread's rows are at most all of them: the total's chunk serves */
    j->per = cmp_qform_work_doubles(j->n, rows);
    j->work = mc_malloc_array((size_t)T * (size_t)j->per, sizeof(double));
    j->terms = mc_malloc_array(rows ? rows : 1, sizeof(double));
    double total = NAN;
    if (j->work && j->terms) {
        cmp_par_rows(p, rows, CMP_LANES, qform_job_rows, j);
        total = 0.0;
        for (uint32_t r = 0; r < rows; r++) /* in row order, as one thread */
            total += j->terms[r];
    }
    mc_free(j->work);
    mc_free(j->terms);
    return total;
}

double cmp_qform_sym_par(kn_pool *p, const cmp_hessian *h, const float *w,
                         const float *q, uint32_t rows)
{
    qform_job j = {h, NULL, h->cols, w, q, 0, NULL, NULL};
    return qform_par(p, &j, rows);
}

double cmp_qform_cross_par(kn_pool *p, const double *M, uint32_t n,
                           const float *a, const float *b, uint32_t rows)
{
    qform_job j = {NULL, M, n, a, b, 0, NULL, NULL};
    return qform_par(p, &j, rows);
}

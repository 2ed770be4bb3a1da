/* cmp_gptq_fit.c - least-squares fits around GPTQ: the retarget to the
 * full-precision outputs and the refit of the group scales (see
 * cmp_gptq.h). */
#include "cmp_gptq.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cmp_chol.h"
#include "cmp_gptq_internal.h"
#include "cmp_lanes.h"
#include "cmp_par.h"
#include "cmp_qform.h"
#include "kn_ddot.h"
#include "kn_lanes.h"
#include "kn_gram.h"
#include "mc_alloc.h"

uint64_t cmp_gptq_retarget_work_bytes(uint32_t cols, int threads)
{
    uint64_t n = cols, T = threads > 1 ? threads : 1;
    return req(n * n * sizeof(double)) +
           req(T * n * CMP_RETARGET_ROWS * sizeof(double));
}

typedef struct retarget_job {
    const double *A; /* L in the lower triangle, L^T mirrored above */
    const double *c; /* C, or NULL: */
    const double *wc; /* W C given [rows][cols] */
    const float *w;
    float *out;
    double *z;       /* [threads][CMP_RETARGET_ROWS][cols] */
    size_t n;
} retarget_job;

/* Rows of C per chunk of the product W C, and columns per chunk: a
 * 64 x 512 tile of C (256 KiB) stays in L2 for all the block's rows. */
#define RT_IC 64
#define RT_JC 512

/* y [nr][n] = rows rb .. rb + nr - 1 of w times C (kn_daxpy tiles: each
 * element a chain of fused multiply-adds in ascending i). */
static void product_rows(const retarget_job *jb, uint32_t rb, size_t nr,
                         double *y)
{
    enum { MR = KN_DAXPY_MR, NR = KN_DAXPY_NR };
    size_t n = jb->n;
    const double *c = jb->c;
    const float *wb = jb->w + (size_t)rb * n;
    memset(y, 0, nr * n * sizeof(double));
    size_t n8 = n / NR * NR;
    for (size_t i0 = 0; i0 < n; i0 += RT_IC) {
        size_t m = n - i0 < RT_IC ? n - i0 : RT_IC;
        for (size_t j0 = 0; j0 < n; j0 += RT_JC) {
            size_t j1 = n8 - j0 < RT_JC ? n8 : j0 + RT_JC;
            for (size_t r = 0; r < nr; r += MR) {
                int mr = nr - r < MR ? (int)(nr - r) : MR;
                for (size_t j = j0; j < j1; j += NR)
                    kn_daxpy_tile(wb + r * n + i0, n, c + i0 * n + j, n, m,
                                  mr, y + r * n + j, n);
            }
        }
        if (n8 < n)
            kn_ref_daxpy_cols(wb + i0, n, c + i0 * n + n8, n, m, (int)nr,
                              n - n8, y + n8, n);
    }
}

/* Rows [r0, r1), CMP_RETARGET_ROWS at a time: b = w C (product_rows, or
 * the given W C's rows) into z, then the solves (cmp_chol_solve_rows:
 * each row as alone), so the result does not depend on how the rows are
 * split. */
static void retarget_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    const retarget_job *jb = ctx;
    size_t n = jb->n;
    double *y = jb->z + (size_t)slot * n * CMP_RETARGET_ROWS;
    for (uint32_t rb = r0; rb < r1; rb += CMP_RETARGET_ROWS) {
        size_t nr = r1 - rb < CMP_RETARGET_ROWS ? r1 - rb : CMP_RETARGET_ROWS;
        if (jb->c)
            product_rows(jb, rb, nr, y);
        else /* W C given */
            memcpy(y, jb->wc + (size_t)rb * n, nr * n * sizeof(double));
        cmp_chol_solve_rows(jb->A, n, y, nr);
        for (size_t r = 0; r < nr * n; r++)
            jb->out[(size_t)rb * n + r] = (float)y[r];
    }
}

static mc_status retarget(const cmp_hessian *hq, const double *c,
                          const double *wc, const float *w, uint32_t rows,
                          double damp, float *out, kn_pool *pool, mc_error *err)
{
    size_t n = hq->cols;
    int T = cmp_par_threads(pool);
    double *A = mc_malloc_array(n * n, sizeof(double));
    double *z = mc_malloc_array((size_t)T * n * CMP_RETARGET_ROWS, sizeof(double));
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
        /* packed rows into the upper triangle (contiguous on both
         * sides), then mirrored below: reading the lower triangle's
         * elements from the packed rows directly walks a column of them,
         * a cache miss each (~9 s at 14336 wide) */
        for (size_t i = 0; i < n; i++) {
            const double *hr = hrow(hq, i);
            memcpy(A + i * n + i, hr + i, (n - i) * sizeof(double));
            A[i * n + i] += damp * mean;
        }
        cmp_chol_mirror_lower(A, n);
        if (cmp_gptq_cholesky_lower(A, n, pool) == 0)
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
     * rows (cmp_chol_solve_rows). */
    cmp_chol_mirror_upper(A, n);
    retarget_job j = {A, c, wc, w, out, z, n};
    cmp_par_rows(pool, rows, CMP_LANES, retarget_rows, &j);
    mc_free(A);
    mc_free(z);
    return MC_OK;
}

mc_status cmp_gptq_retarget(const cmp_hessian *hq, const double *c,
                            const float *w, uint32_t rows, double damp,
                            float *out, kn_pool *pool, mc_error *err)
{
    return retarget(hq, c, NULL, w, rows, damp, out, pool, err);
}

mc_status cmp_gptq_retarget_wc(const cmp_hessian *hq, const double *wc,
                               uint32_t rows, double damp, float *out,
                               kn_pool *pool, mc_error *err)
{
    return retarget(hq, NULL, wc, NULL, rows, damp, out, pool, err);
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

/* Blocks of CMP_LANES rows whose refit sums share one tiled pass over H
 * (each block holds groups^2 * CMP_LANES sums: 4 blocks keep a 7B
 * down_proj's at int4 g32 to 51 MB per thread). */
#define REFIT_BLOCKS 4u

/* One thread's refit work space (cmp_gptq_refit_work_bytes per set);
 * every array holds REFIT_BLOCKS blocks. */
typedef struct refit_ws {
    double *hw, *a, *wd, *sap, *hwp, *M, *Mc, *rhs, *s, *s0;
    cmp_qparam *p0;
} refit_ws;

uint64_t cmp_gptq_refit_work_bytes(uint32_t cols, uint32_t groups, int threads)
{
    uint64_t K = cols, G = groups, B = CMP_LANES * REFIT_BLOCKS,
             T = threads > 1 ? threads : 1;
    return T * (5 * req(K * B * sizeof(double)) +    /* hw, a, wd, sap, hwp */
                req(G * G * B * sizeof(double)) +    /* M, one per lane */
                req(G * G * sizeof(double)) +        /* Mc */
                3 * req(G * sizeof(double)) +        /* rhs, s, s0 */
                req(G * B * sizeof(cmp_qparam))) +   /* p0 */
           T * sizeof(refit_ws);                     /* the sets' table */
}

/* The refit's sums for one block of nr <= CMP_LANES rows (the reference
 * for refit_sums_tiled, which must give its bits; test_refit_tiled):
 * each row on its own lane (lanes past nr see zero codes and weights):
 * M_gk = a_g^T H a_k into M + lane * G * G and hw = H w interleaved
 * (hw[j * CMP_LANES + lane]), in one pass over the stored upper triangle,
 * row by row (contiguous): each off-diagonal H_ij counts for (i, j) and
 * (j, i).  a, wd: the codes at unit scale and the weights, interleaved.
 * Every lane's sums are formed in the order of its row alone. */
void cmp_gptq_refit_sums_ref(const cmp_hessian *h, uint32_t span, uint32_t G,
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

/* Row i's diagonal term M_{gi gi} += h_ii a_i a_i, every lane. */
static void refit_diag(double *M, uint32_t G, uint32_t gi, double hii,
                       const double *ai)
{
    for (uint32_t r = 0; r < CMP_LANES; r++)
        M[(size_t)r * G * G + (size_t)gi * G + gi] += hii * ai[r] * ai[r];
}

/* One block's view of the tiled sums (cmp_gptq_refit_sums_tiled). */
typedef struct refit_blk {
    const cmp_hessian *h;
    uint32_t span, G;
    size_t K;
    const double *a, *wd; /* the block's codes and weights [K][CMP_LANES] */
    double *hw, *M, *sap, *hwp;
    int m_only;           /* H w given: the M sums alone (wd, hwp unused) */
    int avx;
} refit_blk;

static size_t group_end(const refit_blk *x, size_t k)
{
    size_t e = (k / x->span + 1) * (size_t)x->span;
    return e < x->K ? e : x->K;
}

/* Row i's segment of group g closes: its M terms (row i's diagonal term
 * just before its own group's), and the open sum restarts. */
static void refit_close(const refit_blk *x, size_t i, uint32_t g)
{
    uint32_t G = x->G, gi = (uint32_t)(i / x->span);
    const double *ai = x->a + i * CMP_LANES;
    double *sa = x->sap + i * CMP_LANES;
    if (g == gi)
        refit_diag(x->M, G, gi, hrow(x->h, i)[i], ai);
    for (uint32_t r = 0; r < CMP_LANES; r++) {
        double *Mr = x->M + (size_t)r * G * G;
        Mr[(size_t)gi * G + g] += ai[r] * sa[r];
        Mr[(size_t)g * G + gi] += ai[r] * sa[r];
        sa[r] = 0.0;
    }
}

/* Row i's step over columns [k, s1) of one segment: the codes' sum, and
 * unless m_only its H w chain and its terms of later rows' H w. */
static void refit_step1(const refit_blk *x, size_t i, size_t k, size_t s1)
{
    enum { B = CMP_LANES };
    const double *Ui = hrow(x->h, i);
    double *sa = x->sap + i * B;
    if (x->m_only) {
        cmp_lanes_dot(sa, 1.0, Ui, x->a, B, 1, k, s1);
    } else if (x->avx) {
        kn_avx2_refit_step(Ui, x->a, x->wd, x->hw, x->wd + i * B, k, s1, sa,
                           x->hwp + i * B);
    } else {
        cmp_lanes_dot(sa, 1.0, Ui, x->a, B, 1, k, s1);
        cmp_lanes_dot(x->hwp + i * B, 1.0, Ui, x->wd, B, 1, k, s1);
        cmp_lanes_axpy(x->hw + k * B, x->wd + i * B, Ui + k, s1 - k);
    }
}

/* Rows i .. i + n - 1 over the same columns [k, k1), segment by segment:
 * with AVX2 four rows' M sums as kn_avx2_quad4_acc's chains (m_only) or
 * two rows' full steps as kn_avx2_refit_step2, else row by row; each
 * row's chains and each M and hw element see the one-row order (row i's
 * term before row i + 1's); closes in row order. */
static void refit_rows_n(const refit_blk *x, size_t i, unsigned n, size_t k,
                         size_t k1)
{
    enum { B = CMP_LANES };
    const double *u[4];
    const double *w[2];
    double *sa[2], *hwi[2];
    for (unsigned m = 0; m < n; m++) {
        u[m] = hrow(x->h, i + m);
        if (m < 2 && !x->m_only) {
            w[m] = x->wd + (i + m) * B;
            sa[m] = x->sap + (i + m) * B;
            hwi[m] = x->hwp + (i + m) * B;
        }
    }
    while (k < k1) {
        size_t e = group_end(x, k), s1 = e < k1 ? e : k1;
        if (x->avx && x->m_only && n == 4)
            kn_avx2_quad4_acc(u, x->a, k, s1, x->sap + i * B);
        else if (x->avx && !x->m_only && n == 2)
            kn_avx2_refit_step2(u, x->a, x->wd, x->hw, w, k, s1, sa, hwi);
        else
            for (unsigned m = 0; m < n; m++)
                refit_step1(x, i + m, k, s1);
        if (s1 == e)
            for (unsigned m = 0; m < n; m++)
                refit_close(x, i + m, (uint32_t)(k / x->span));
        k = s1;
    }
}

/* One row tile [i0, i1) of one block against the j tile [j0, j1): rows
 * in sets of `per`, each row joining its set where its columns start
 * (row r at r + 1 in the diagonal tile, its diagonal term just before
 * when its own segment is empty), so the rows before it in the set have
 * gone over the columns it does not have, and no element is touched by
 * two rows out of the one-row order. */
static void refit_tile(const refit_blk *x, size_t i0, size_t i1, size_t j0,
                       size_t j1, unsigned per)
{
    for (size_t i = i0; i < i1; i += per) {
        unsigned n = i1 - i < per ? (unsigned)(i1 - i) : per;
        for (unsigned m = 0; m < n; m++) {
            size_t r = i + m;
            if (j0 == i0 && r + 1 == group_end(x, r))
                refit_diag(x->M, x->G, (uint32_t)(r / x->span), hrow(x->h, r)[r],
                           x->a + r * CMP_LANES);
            size_t k0 = j0 > r + 1 ? j0 : r + 1;
            size_t k1 = m + 1 < n ? (j0 > r + 2 ? j0 : r + 2) : j1;
            refit_rows_n(x, i, m + 1, k0, k1 < j1 ? k1 : j1);
        }
    }
}

/* The same sums for nb blocks (block b's a, wd, hw, sap, hwp at b * K *
 * CMP_LANES, its M at b * G * G * CMP_LANES), with H read in tiles of
 * CMP_QFORM_TI x CMP_QFORM_TJ that serve all nb blocks.  Each lane's
 * operations and their order are the reference's: row i's chains (hwp:
 * H w from h_ii w_i, j ascending; sap: the open group segment's a sum)
 * are carried from tile to tile in memory; a segment's M terms are added
 * when it closes, with row i's diagonal term just before its own group's
 * (where the reference adds it: before anything else of row i touches
 * M_{gi gi}, after every earlier row of the group); the rows' H w parts
 * go to hw[i] at the end of their row tile, after every earlier row's
 * axpy reached it.  With AVX2 the rows go in pairs over their shared
 * columns (refit_tile, refit_rows_n): row i alone over column i + 1
 * first, and row i + 1's diagonal term (its own segment empty) after
 * that, where the one-row order has it.  hw_given: hw holds H w already
 * (an earlier call's, the same h and wd): only M is formed, rows in
 * fours, a third of the work; wd and hwp are not read. */
void cmp_gptq_refit_sums_tiled(const cmp_hessian *h, uint32_t span, uint32_t G,
                               uint32_t nb, const double *a, const double *wd,
                               double *M, double *hw, double *sap, double *hwp,
                               int hw_given)
{
    enum { B = CMP_LANES, TI = CMP_QFORM_TI, TJ = CMP_QFORM_TJ };
    size_t K = h->cols, kb = K * B, gb = (size_t)G * G * B;
    int avx = kn_cpu_has_avx2() && !kn_force_scalar();
    memset(M, 0, nb * gb * sizeof(double));
    if (!hw_given)
        memset(hw, 0, nb * kb * sizeof(double));
    memset(sap, 0, nb * kb * sizeof(double));
    for (size_t i0 = 0; i0 < K; i0 += TI) {
        size_t i1 = K - i0 < TI ? K : i0 + TI;
        if (!hw_given)
            for (uint32_t b = 0; b < nb; b++)
                for (size_t i = i0; i < i1; i++)
                    for (uint32_t r = 0; r < B; r++)
                        hwp[b * kb + i * B + r] = hdiag(h, i) * wd[b * kb + i * B + r];
        for (size_t j0 = i0; j0 < K; j0 += TJ) {
            size_t j1 = K - j0 < TJ ? K : j0 + TJ;
            for (uint32_t b = 0; b < nb; b++) {
                refit_blk x = {h, span, G, K, a + b * kb,
                               hw_given ? NULL : wd + b * kb, hw + b * kb, M + b * gb,
                               sap + b * kb, hw_given ? NULL : hwp + b * kb,
                               hw_given, avx};
                refit_tile(&x, i0, i1, j0, j1, hw_given ? 4u : avx ? 2u : 1u);
            }
        }
        if (!hw_given)
            for (uint32_t b = 0; b < nb; b++)
                for (size_t i = i0; i < i1; i++)
                    for (uint32_t r = 0; r < B; r++)
                        hw[b * kb + i * B + r] += hwp[b * kb + i * B + r];
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
    refit_ws *ws;       /* [threads] */
    cmp_refit_hw *hwc;  /* NULL: H w per call in ws */
} refit_job;

uint64_t cmp_gptq_refit_hw_bytes(uint32_t rows, uint32_t cols)
{
    uint64_t blocks = ((uint64_t)rows + CMP_LANES - 1) / CMP_LANES;
    return req(blocks * CMP_LANES * cols * sizeof(double));
}

/* Refit rows [r0, r1), REFIT_BLOCKS blocks of CMP_LANES at a time. */
static void refit_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    enum { B = CMP_LANES };
    const refit_job *j = ctx;
    const refit_ws *x = &j->ws[slot];
    cmp_qbuf *q = j->q;
    const float *w = j->w;
    uint32_t K = q->cols, G = cmp_qbuf_nparams(q), span = cmp_qbuf_span(q);
    size_t kb = (size_t)K * B, gb = (size_t)G * G * B;
    int given = j->hwc && j->hwc->ready;
    for (uint32_t c0 = r0; c0 < r1; c0 += REFIT_BLOCKS * B) {
        uint32_t nc = r1 - c0 < REFIT_BLOCKS * B ? r1 - c0 : REFIT_BLOCKS * B;
        uint32_t nb = (nc + B - 1) / B;
        /* r0 is a multiple of B (cmp_par_rows' alignment): block c0 / B */
        double *hw = j->hwc ? j->hwc->hw + (size_t)(c0 / B) * kb : x->hw;
        /* a: the codes at unit scale (group g holds columns g*span ..) */
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t rb = c0 + b * B, nr = c0 + nc - rb < B ? c0 + nc - rb : B;
            for (uint32_t r = 0; r < B; r++)
                for (uint32_t g = 0; g < G; g++) {
                    cmp_qparam pg = {0.0f, 0};
                    if (r < nr)
                        pg = cmp_qbuf_get_param(q, rb + r, g);
                    x->p0[(size_t)(b * B + r) * G + g] = pg;
                    uint32_t cl = (g + 1) * span < K ? (g + 1) * span : K;
                    for (uint32_t c = g * span; c < cl; c++) {
                        size_t at = b * kb + (size_t)c * B + r;
                        x->a[at] = r < nr ? (double)(cmp_qbuf_get_code(q, rb + r, c) - pg.zero) : 0.0;
                        if (!given)
                            x->wd[at] = r < nr ? (double)w[(size_t)(rb + r) * K + c] : 0.0;
                    }
                }
        }
        cmp_gptq_refit_sums_tiled(j->h, span, G, nb, x->a, x->wd, x->M, hw,
                                  x->sap, x->hwp, given);
        for (uint32_t rr = 0; rr < nc; rr++) {
            uint32_t b = rr / B, r = rr % B;
            const double *Mr = x->M + b * gb + (size_t)r * G * G;
            const double *ab = x->a + b * kb, *hb = hw + b * kb;
            const cmp_qparam *pr = x->p0 + (size_t)rr * G;
            for (uint32_t g = 0; g < G; g++) {
                x->s0[g] = pr[g].scale;
                uint32_t cl = (g + 1) * span < K ? (g + 1) * span : K;
                double t = 0.0;
                for (uint32_t c = g * span; c < cl; c++)
                    t += ab[(size_t)c * B + r] * hb[(size_t)c * B + r];
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
                cmp_qbuf_set_param(q, c0 + rr, g, pp);
                x->s[g] = cmp_qbuf_get_param(q, c0 + rr, g).scale;
            }
            if (scale_objective(Mr, x->rhs, x->s, G) >=
                scale_objective(Mr, x->rhs, x->s0, G))
                for (uint32_t g = 0; g < G; g++)
                    cmp_qbuf_set_param(q, c0 + rr, g, pr[g]);
        }
    }
}

mc_status cmp_gptq_refit_scales(const float *w, const cmp_hessian *h,
                                cmp_qbuf *q, float *deq, kn_pool *pool,
                                mc_error *err)
{
    return cmp_gptq_refit_scales_cached(w, h, q, deq, NULL, pool, err);
}

mc_status cmp_gptq_refit_scales_cached(const float *w, const cmp_hessian *h,
                                       cmp_qbuf *q, float *deq, cmp_refit_hw *hwc,
                                       kn_pool *pool, mc_error *err)
{
    enum { B = CMP_LANES * REFIT_BLOCKS };
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
        x->sap = mc_malloc_array((size_t)K * B, sizeof(double));
        x->hwp = mc_malloc_array((size_t)K * B, sizeof(double));
        x->M = mc_malloc_array((size_t)G * G * B, sizeof(double));
        x->Mc = mc_malloc_array((size_t)G * G, sizeof(double));
        x->rhs = mc_malloc_array(G, sizeof(double));
        x->s = mc_malloc_array(G, sizeof(double));
        x->s0 = mc_malloc_array(G, sizeof(double));
        x->p0 = mc_malloc_array((size_t)G * B, sizeof(cmp_qparam));
        ok &= x->hw && x->a && x->wd && x->sap && x->hwp && x->M && x->Mc && x->rhs && x->s &&
              x->s0 && x->p0;
    }
    if (!ok) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "scale refit work space");
    } else {
        refit_job j = {w, h, q, ws, hwc};
        cmp_par_rows(pool, q->rows, CMP_LANES, refit_rows, &j);
        if (hwc)
            hwc->ready = 1;
        if (deq)
            cmp_dequant_matrix(q, deq);
    }
    for (int t = 0; t < T; t++) {
        refit_ws *x = &ws[t];
        mc_free(x->hw);
        mc_free(x->a);
        mc_free(x->wd);
        mc_free(x->sap);
        mc_free(x->hwp);
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

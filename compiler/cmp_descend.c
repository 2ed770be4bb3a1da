/* cmp_descend.c - coordinate descent on quantized codes (see cmp_descend.h). */
#include "cmp_descend.h"

#include <string.h>

#include "cmp_lanes.h"
#include "cmp_par.h"
#include "cmp_qform.h"
#include "kn_lanes.h"
#include "kn_ops.h"
#include "mc_alloc.h"

#define DEFAULT_SWEEPS 16u /* a cap: sweeps stop once one changes nothing */

uint64_t cmp_descend_work_bytes(uint32_t cols, int threads)
{
    uint64_t n = cols, T = threads > 1 ? threads : 1;
    return (n * n + n) * sizeof(double) + T * 2 * CMP_QFORM_CHUNK * n * sizeof(double) +
           T * n + (T > 1 ? T * sizeof(uint64_t) : 0);
}

/* Whether column c of a row moves, and the move: one code step (q +- 1
 * inside [lo, hi]) that lowers the row's error, the larger drop of the
 * two (-1 first on a tie).  *to, *tov, *delta: the new code, its value and
 * how far d_c drops. */
static int column_move(double hcc, double gc, float deqc, int code, cmp_qparam p,
                       kn_wformat fmt, int lo, int hi, int *to, float *tov,
                       double *delta)
{
    double best = 0.0;
    *to = code;
    for (int step = -1; step <= 1; step += 2) {
        int nc = code + step;
        if (nc < lo || nc > hi)
            continue;
        float v = cmp_quant_value(fmt, p, nc);
        double dv = (double)v - (double)deqc;
        double de = dv * dv * hcc - 2.0 * dv * gc;
        if (de < best) {
            best = de;
            *delta = dv;
            *to = nc;
            *tov = v;
        }
    }
    return *to != code;
}

/* Descend one row: codes and deq of row r, g = H d (n, updated); diag:
 * H's diagonal, contiguous (H's own is a column stride apart: a cache
 * line, and at 7B widths a page, per column and sweep).  codes: n bytes
 * of scratch for the row's codes.  With AVX2, the
 * columns where no step moves (~98 % of them on stories260k) are passed
 * over by kn_avx2_descend_scan, whose test is column_move's arithmetic:
 * the same moves in the same order. */
static uint64_t descend_row(const double *H, const double *diag, size_t n,
                            cmp_qbuf *q, uint32_t r, float *deqr, double *g,
                            uint32_t sweeps, int8_t *codes)
{
    int lo = q->fmt == KN_W_Q8 ? -127 : 0, hi = q->fmt == KN_W_Q8 ? 127 : 15;
    size_t span = cmp_qbuf_span(q);
    int scan = kn_cpu_has_avx2() && !kn_force_scalar();
    if (scan)
        for (size_t c = 0; c < n; c++)
            codes[c] = (int8_t)cmp_qbuf_get_code(q, r, (uint32_t)c);
    uint64_t moves = 0;
    for (uint32_t s = 0; s < sweeps; s++) {
        uint64_t before = moves;
        for (size_t c0 = 0; c0 < n; c0 += span) {
            size_t c1 = n - c0 < span ? n : c0 + span;
            /* the group's parameters, once per group */
            cmp_qparam p = cmp_qbuf_get_param(q, r, (uint32_t)(c0 / span));
            if (p.scale == 0.0f)
                continue; /* every value 0: no step changes one */
            for (size_t c = c0; c < c1; c++) {
                if (scan) {
                    c = kn_avx2_descend_scan(codes, deqr, g, diag, c, c1, p.scale,
                                             p.zero, lo, hi);
                    if (c == c1)
                        break;
                }
                double hcc = diag[c];
                if (!(hcc > 0.0))
                    continue; /* a dead input: no move changes the error */
                int code = scan ? codes[c] : cmp_qbuf_get_code(q, r, (uint32_t)c);
                int to = code;
                float tov = 0.0f;
                double delta = 0.0;
                if (!column_move(hcc, g[c], deqr[c], code, p, q->fmt, lo, hi, &to,
                                 &tov, &delta))
                    continue;
                /* d_c drops by delta, so g = H d drops by delta H[:, c] */
                cmp_qbuf_set_code(q, r, (uint32_t)c, to);
                if (scan)
                    codes[c] = (int8_t)to;
                deqr[c] = tov;
                const double *hc = H + c * n;
                for (size_t j = 0; j < n; j++)
                    g[j] -= delta * hc[j];
                moves++;
            }
        }
        if (moves == before)
            break;
    }
    return moves;
}

typedef struct descend_job {
    const double *H; /* the full H, then its diagonal */
    const float *w;
    cmp_qbuf *q;
    float *deq;
    double *x, *t;   /* [threads][CMP_QFORM_CHUNK * cols] each */
    int8_t *codes;   /* [threads][cols]: a row's codes for the scan */
    uint64_t *moves; /* [threads] */
    uint32_t sweeps;
} descend_job;

/* Rows [r0, r1), a chunk at a time: g = H d for the whole chunk in one
 * tiled pass over H (cmp_qform_rows: each element the chain of the row
 * alone), then each row's descent on its own g.  A row's d depends only
 * on its own codes, so computing the chunk's g before any of its rows
 * moves is what the row-by-row order computes. */
static void descend_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    enum { B = CMP_LANES };
    const descend_job *j = ctx;
    size_t n = j->q->cols;
    double *x = j->x + (size_t)slot * CMP_QFORM_CHUNK * n,
           *t = j->t + (size_t)slot * CMP_QFORM_CHUNK * n;
    for (uint32_t c0 = r0; c0 < r1; c0 += CMP_QFORM_CHUNK) {
        uint32_t nr = r1 - c0 < CMP_QFORM_CHUNK ? r1 - c0 : CMP_QFORM_CHUNK;
        uint32_t nb = (nr + B - 1) / B;
        for (uint32_t b = 0; b < nb; b++)
            for (size_t c = 0; c < n; c++)
                for (uint32_t r = 0; r < B; r++) {
                    uint32_t row = b * B + r;
                    size_t at = (size_t)(c0 + row) * n + c;
                    x[((size_t)b * n + c) * B + r] =
                        row < nr ? (double)j->w[at] - (double)j->deq[at] : 0.0;
                }
        cmp_qform_rows(j->H, (uint32_t)n, x, nb, t);
        /* each row's g contiguous (into x, no longer needed) */
        for (uint32_t r = 0; r < nr; r++)
            for (size_t c = 0; c < n; c++)
                x[(size_t)r * n + c] = t[((size_t)(r / B) * n + c) * B + r % B];
        for (uint32_t r = 0; r < nr; r++)
            j->moves[slot] += descend_row(j->H, j->H + n * n, n, j->q, c0 + r,
                                          j->deq + (size_t)(c0 + r) * n,
                                          x + (size_t)r * n, j->sweeps,
                                          j->codes + (size_t)slot * n);
    }
}

mc_status cmp_descend_codes(const float *w, const cmp_hessian *h,
                            cmp_qbuf *q, float *deq, uint32_t sweeps,
                            uint64_t *moves, kn_pool *pool, mc_error *err)
{
    enum { B = CMP_LANES };
    mc_status st = cmp_hessian_check_qbuf(h, q, err);
    if (st != MC_OK)
        return st;
    if (sweeps == 0)
        sweeps = DEFAULT_SWEEPS;
    size_t n = q->cols;
    int T = cmp_par_threads(pool);
    uint64_t one = 0;
    descend_job j = {NULL, w, q, deq, NULL, NULL, NULL, T > 1 ? NULL : &one, sweeps};
    double *H = mc_malloc_array(n * n + n, sizeof(double));
    j.x = mc_malloc_array((size_t)T * CMP_QFORM_CHUNK * n, sizeof(double));
    j.t = mc_malloc_array((size_t)T * CMP_QFORM_CHUNK * n, sizeof(double));
    j.codes = mc_malloc_array((size_t)T, n);
    if (T > 1)
        j.moves = mc_calloc((size_t)T, sizeof(uint64_t));
    if (!H || !j.x || !j.t || !j.codes || !j.moves) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, "descend", -1,
                     "cannot allocate %zu x %zu doubles", n, n);
        goto done;
    }
    /* The full symmetric H: rows of it are H's columns, contiguous. */
    for (size_t i = 0; i < n; i++) {
        const double *pi = h->h + cmp_hessian_row_offset(h->cols, (uint32_t)i);
        for (size_t k = i; k < n; k++)
            H[i * n + k] = H[k * n + i] = pi[k - i];
        H[n * n + i] = pi[0];
    }
    j.H = H;
    cmp_par_rows(pool, q->rows, B, descend_rows, &j);
    if (moves) {
        *moves = 0;
        for (int t = 0; t < T; t++)
            *moves += j.moves[t];
    }
done:
    mc_free(H);
    mc_free(j.x);
    mc_free(j.t);
    mc_free(j.codes);
    if (j.moves != &one)
        mc_free(j.moves);
    return st;
}

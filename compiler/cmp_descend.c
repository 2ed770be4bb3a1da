/* cmp_descend.c - coordinate descent on quantized codes (see cmp_descend.h). */
#include "cmp_descend.h"

#include <string.h>

#include "cmp_lanes.h"
#include "mc_alloc.h"

#define DEFAULT_SWEEPS 16u /* a cap: sweeps stop once one changes nothing */

uint64_t cmp_descend_work_bytes(uint32_t cols)
{
    uint64_t n = cols;
    return n * n * sizeof(double) + 2 * CMP_LANES * n * sizeof(double);
}

/* Descend one row: codes and deq of row r, g = H d (n, updated). */
static uint64_t descend_row(const double *H, size_t n, cmp_qbuf *q,
                            uint32_t r, float *deqr, double *g,
                            uint32_t sweeps)
{
    int lo = q->fmt == KN_W_Q8 ? -127 : 0, hi = q->fmt == KN_W_Q8 ? 127 : 15;
    uint32_t span = cmp_qbuf_span(q);
    uint64_t moves = 0;
    for (uint32_t s = 0; s < sweeps; s++) {
        uint64_t before = moves;
        for (size_t c = 0; c < n; c++) {
            double hcc = H[c * n + c];
            if (!(hcc > 0.0))
                continue; /* a dead input: no move changes the error */
            cmp_qparam p = cmp_qbuf_get_param(q, r, (uint32_t)(c / span));
            if (p.scale == 0.0f)
                continue;
            int code = cmp_qbuf_get_code(q, r, (uint32_t)c);
            double best = 0.0, delta = 0.0;
            int to = code;
            float tov = deqr[c];
            for (int step = -1; step <= 1; step += 2) {
                int nc = code + step;
                if (nc < lo || nc > hi)
                    continue;
                float v = cmp_quant_value(q->fmt, p, nc);
                double dv = (double)v - (double)deqr[c];
                double de = dv * dv * hcc - 2.0 * dv * g[c];
                if (de < best) {
                    best = de;
                    delta = dv;
                    to = nc;
                    tov = v;
                }
            }
            if (to == code)
                continue;
            /* d_c drops by delta, so g = H d drops by delta H[:, c] */
            cmp_qbuf_set_code(q, r, (uint32_t)c, to);
            deqr[c] = tov;
            const double *hc = H + c * n;
            for (size_t j = 0; j < n; j++)
                g[j] -= delta * hc[j];
            moves++;
        }
        if (moves == before)
            break;
    }
    return moves;
}

mc_status cmp_descend_codes(const float *w, const cmp_hessian *h,
                            cmp_qbuf *q, float *deq, uint32_t sweeps,
                            uint64_t *moves, mc_error *err)
{
    enum { B = CMP_LANES };
    mc_status st = cmp_hessian_check_qbuf(h, q, err);
    if (st != MC_OK)
        return st;
    if (sweeps == 0)
        sweeps = DEFAULT_SWEEPS;
    size_t n = q->cols;
    double *H = mc_malloc_array(n * n, sizeof(double));
    double *d = mc_malloc_array(n * B, sizeof(double)); /* interleaved */
    double *g = mc_malloc_array(n * B, sizeof(double)); /* [B][n] */
    if (!H || !d || !g) {
        mc_free(H);
        mc_free(d);
        mc_free(g);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "descend", -1,
                       "cannot allocate %zu x %zu doubles", n, n);
    }
    /* The full symmetric H: rows of it are H's columns, contiguous. */
    for (size_t i = 0; i < n; i++) {
        const double *pi = h->h + cmp_hessian_row_offset(h->cols, (uint32_t)i);
        for (size_t j = i; j < n; j++)
            H[i * n + j] = H[j * n + i] = pi[j - i];
    }
    uint64_t total = 0;
    for (uint32_t r0 = 0; r0 < q->rows; r0 += B) {
        uint32_t nr = q->rows - r0 < B ? q->rows - r0 : B;
        for (size_t j = 0; j < n; j++)
            for (uint32_t r = 0; r < B; r++) {
                size_t at = (size_t)(r0 + r) * n + j;
                d[j * B + r] = r < nr ? (double)w[at] - (double)deq[at] : 0.0;
            }
        for (size_t j = 0; j < n; j++) {
            double acc[B] = {0};
            cmp_lanes_dot(acc, 1.0, H + j * n, d, B, 1, 0, n);
            for (uint32_t r = 0; r < B; r++)
                g[r * n + j] = acc[r];
        }
        for (uint32_t r = 0; r < nr; r++)
            total += descend_row(H, n, q, r0 + r, deq + (size_t)(r0 + r) * n,
                                 g + r * n, sweeps);
    }
    if (moves)
        *moves = total;
    mc_free(H);
    mc_free(d);
    mc_free(g);
    return MC_OK;
}

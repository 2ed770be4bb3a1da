/* cmp_awq.c - AWQ scale search, clipping search and folding (cmp_awq.h). */
#include "cmp_awq.h"

#include <math.h>
#include <string.h>

#include "cmp_par.h"
#include "cmp_qform.h"
#include "mc_alloc.h"

void cmp_awq_scale_cols(float *w, uint32_t rows, uint32_t cols,
                        const float *s)
{
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            w[(size_t)r * cols + c] *= s[c];
}

void cmp_awq_div_vec(float *v, const float *s, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        v[j] /= s[j];
}

void cmp_awq_div_rows(float *w, uint32_t rows, uint32_t cols, const float *s)
{
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            w[(size_t)r * cols + c] /= s[r];
}

void cmp_awq_scale_hessian(const cmp_hessian *h, const float *s,
                           cmp_hessian *hs)
{
    size_t n = h->cols;
    /* Both packed alike (same cols): walk the upper triangle as one array,
     * row i being the cols - i values from (i, i). */
    const double *src = h->h;
    double *dst = hs->h;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i; j < n; j++)
            dst[j - i] = src[j - i] / ((double)s[i] * s[j]);
        src += n - i;
        dst += n - i;
    }
    hs->n = h->n;
}

/* Rows of one linear one thread processes per pass of the search: its
 * share of the rows (cmp_par_rows: whole blocks of CMP_OERR_ROWS), and at
 * most CMP_GPTQ_CHUNK_BYTES / threads of floats (at least one row), so the
 * float copies of all threads together stay within CMP_GPTQ_CHUNK_BYTES. */
static size_t search_chunk(uint32_t maxrows, uint32_t cols, int threads)
{
    uint64_t T = threads > 1 ? (uint64_t)threads : 1;
    uint64_t share = maxrows;
    if (T > 1) {
        uint64_t blocks = ((uint64_t)maxrows + CMP_OERR_ROWS - 1) / CMP_OERR_ROWS;
        share = (blocks + T - 1) / T * CMP_OERR_ROWS;
        share = share < maxrows ? share : maxrows;
    }
    uint64_t c = cols ? CMP_GPTQ_CHUNK_BYTES / ((uint64_t)cols * sizeof(float) * T)
                      : share;
    if (c == 0)
        c = 1;
    return (size_t)(c < share ? c : share);
}

/* Every how many rows of a linear the search measures (cmp_awq.h). */
static uint32_t row_stride(uint32_t rows, uint32_t sample_rows)
{
    if (!sample_rows || rows < 2 * sample_rows)
        return 1;
    uint32_t s = rows / sample_rows;
    return s < CMP_AWQ_MAX_STRIDE ? s : CMP_AWQ_MAX_STRIDE;
}

/* Bytes mc_malloc takes for a request: 0 counts as 1. */
static uint64_t req(uint64_t bytes)
{
    return bytes ? bytes : 1;
}

uint64_t cmp_awq_search_work_bytes(uint32_t maxrows, uint32_t cols, int threads,
                                   uint32_t sample_rows)
{
    uint64_t n = cols, T = threads > 1 ? (uint64_t)threads : 1;
    uint64_t copy = req(T * search_chunk(maxrows, cols, threads) * n * sizeof(float));
    return req(n * sizeof(float)) +                                 /* s */
           req((uint64_t)maxrows * sizeof(double)) +                /* terms */
           (row_stride(maxrows, sample_rows) > 1 ? 2 : 1) * copy +   /* ws, wg */
           req(T * cmp_qform_work_doubles(cols, (uint32_t)search_chunk(maxrows, cols, threads)) *
               sizeof(double));                                     /* work */
}

/* One alpha's output error of one linear, rows split over the threads. */
typedef struct awq_job {
    const cmp_hessian *h;
    const float *w;  /* the linear [rows][cols] */
    const float *s;  /* the alpha's scales [cols] */
    kn_wformat fmt;
    uint32_t group;
    size_t chunk;    /* rows per pass of one thread (search_chunk) */
    uint32_t stride; /* the linear's rows measured: every stride-th */
    float *ws;       /* [threads][chunk * cols]: W s, Q(W s), Q(W s) / s */
    float *wg;       /* [threads][chunk * cols]: the sampled rows of w */
    double *d;       /* [threads][cmp_qform_work_doubles(cols, chunk)] */
    double *terms;   /* [rows] each row's error */
} awq_job;

static void awq_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    const awq_job *j = ctx;
    uint32_t cols = j->h->cols;
    float *ws = j->ws + (size_t)slot * j->chunk * cols;
    double *d = j->d + (size_t)slot * cmp_qform_work_doubles(cols, (uint32_t)j->chunk);
    for (uint32_t a = r0; a < r1; a += (uint32_t)j->chunk) {
        uint32_t R = r1 - a < j->chunk ? r1 - a : (uint32_t)j->chunk;
        const float *wr = j->w + (size_t)a * cols;
        if (j->stride > 1) { /* sampled rows a .. a + R - 1: gather them */
            float *wg = j->wg + (size_t)slot * j->chunk * cols;
            for (uint32_t r = 0; r < R; r++)
                memcpy(wg + (size_t)r * cols,
                       j->w + (size_t)(a + r) * j->stride * cols,
                       cols * sizeof(float));
            wr = wg;
        }
        memcpy(ws, wr, (size_t)R * cols * sizeof(float));
        cmp_awq_scale_cols(ws, R, cols, j->s);
        cmp_quant_fake(j->fmt, j->group, ws, NULL, R, cols, ws);
        for (uint32_t r = 0; r < R; r++)
            for (uint32_t c = 0; c < cols; c++)
                ws[(size_t)r * cols + c] /= j->s[c];
        cmp_qform_sym_terms(j->h, wr, ws, R, d, j->terms + a);
    }
}

/* The scales of grid point k (alpha = k * CMP_AWQ_ALPHA_STEP) into s. */
static void alpha_scales(const float *xabs, uint32_t cols, int k, float *s)
{
    double alpha = CMP_AWQ_ALPHA_STEP * k;
    float mx = 0.0f, mn = INFINITY;
    for (uint32_t j = 0; j < cols; j++) {
        float v = k == 0 ? 1.0f : powf(xabs[j], (float)alpha);
        if (!(v >= 1e-4f))
            v = 1e-4f;
        s[j] = v;
        mx = fmaxf(mx, v);
        mn = fminf(mn, v);
    }
    float norm = sqrtf(mx * mn);
    for (uint32_t j = 0; j < cols; j++)
        s[j] /= norm;
}

/* The summed output error of the n linears under scales j->s: each
 * linear's (sampled) row terms added in row order and scaled by its
 * stride, then the linears in order (the sums one thread forms alone). */
static double alpha_error(awq_job *j, kn_pool *pool, const cmp_awq_linear *lin,
                          size_t n, uint32_t sample_rows)
{
    double e = 0.0;
    for (size_t i = 0; i < n; i++) {
        j->w = lin[i].w;
        j->stride = row_stride(lin[i].rows, sample_rows);
        uint32_t nr = (lin[i].rows + j->stride - 1) / j->stride;
        cmp_par_rows(pool, nr, CMP_OERR_ROWS, awq_rows, j);
        double ei = 0.0;
        for (uint32_t r = 0; r < nr; r++)
            ei += j->terms[r];
        e += (double)j->stride * ei;
    }
    return e;
}

mc_status cmp_awq_search(const cmp_hessian *h, const float *xabs,
                         const cmp_awq_linear *lin, size_t n, kn_wformat fmt,
                         uint32_t group, const cmp_awq_search_opts *so,
                         float *s_out, double *alpha_out, double *err_out,
                         double *err0_out, mc_error *err)
{
    uint32_t cols = h->cols;
    uint32_t maxrows = 0;
    for (size_t i = 0; i < n; i++)
        if (lin[i].rows > maxrows)
            maxrows = lin[i].rows;
    kn_pool *pool = so ? so->pool : NULL;
    int T = cmp_par_threads(pool);
    uint32_t sample = so ? so->sample_rows : 0;
    int sampled = 0;
    for (size_t i = 0; i < n; i++)
        sampled |= row_stride(lin[i].rows, sample) > 1;
    awq_job j = {h, NULL, NULL, fmt, group, search_chunk(maxrows, cols, T), 1,
                 NULL, NULL, NULL, NULL};
    float *s = mc_malloc_array(cols, sizeof(float));
    j.terms = mc_malloc_array(maxrows ? maxrows : 1, sizeof(double));
    j.ws = mc_malloc_array((size_t)T * j.chunk * cols, sizeof(float));
    if (sampled)
        j.wg = mc_malloc_array((size_t)T * j.chunk * cols, sizeof(float));
    j.d = mc_malloc_array((size_t)T * cmp_qform_work_doubles(cols, (uint32_t)j.chunk),
                          sizeof(double));
    if (!s || !j.terms || !j.ws || !j.d || (sampled && !j.wg)) {
        mc_free(s);
        mc_free(j.terms);
        mc_free(j.ws);
        mc_free(j.wg);
        mc_free(j.d);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "awq", -1,
                       "cannot allocate AWQ work space");
    }
    j.s = s;
    enum { K = CMP_AWQ_ALPHAS };
    double e[K];
    int done[K] = {0};
    int coarse = so && so->coarse;
    /* Coarse: every CMP_AWQ_COARSE_STEP-th grid point, then the points
     * within two steps of the best of them; where the error is unimodal
     * in alpha (the usual case) the pick equals the full grid's. */
    for (int k = 0; k < K; k += coarse ? CMP_AWQ_COARSE_STEP : 1) {
        alpha_scales(xabs, cols, k, s);
        e[k] = alpha_error(&j, pool, lin, n, sample);
        done[k] = 1;
    }
    if (coarse) {
        int kb = 0;
        for (int k = 1; k < K; k++)
            if (done[k] && e[k] < e[kb])
                kb = k;
        for (int k = kb - 2; k <= kb + 2; k++)
            if (k >= 0 && k < K && !done[k]) {
                alpha_scales(xabs, cols, k, s);
                e[k] = alpha_error(&j, pool, lin, n, sample);
                done[k] = 1;
            }
    }
    /* The first strict minimum in alpha order, as one sweep finds it. */
    double best = INFINITY;
    int kbest = 0;
    for (int k = 0; k < K; k++)
        if (done[k] && e[k] < best) {
            best = e[k];
            kbest = k;
        }
    alpha_scales(xabs, cols, kbest, s_out);
    if (err0_out)
        *err0_out = e[0];
    if (alpha_out)
        *alpha_out = CMP_AWQ_ALPHA_STEP * kbest;
    if (err_out)
        *err_out = best;
    mc_free(s);
    mc_free(j.terms);
    mc_free(j.ws);
    mc_free(j.wg);
    mc_free(j.d);
    return MC_OK;
}

/* d^T H[c0.., c0..] d for the n columns starting at c0 (upper triangle). */
static double block_quad(const cmp_hessian *h, uint32_t c0, const double *d,
                         uint32_t n)
{
    size_t N = h->cols;
    double s = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        if (d[i] == 0.0)
            continue;
        /* packed row c0+i starts at element (c0+i, c0+i), which is row[i] */
        const double *row = h->h + cmp_hessian_row_offset((uint32_t)N, c0 + i) - i;
        double acc = row[i] * d[i];
        for (uint32_t j = i + 1; j < n; j++)
            acc += 2.0 * row[j] * d[j];
        s += d[i] * acc;
    }
    return s;
}

uint64_t cmp_awq_clip_work_bytes(uint32_t cols, kn_wformat fmt,
                                 uint32_t group)
{
    uint64_t span = fmt == KN_W_Q8 ? cols : group;
    return req(span * sizeof(float)) + req(span * sizeof(double));
}

mc_status cmp_awq_clip(const cmp_hessian *hs, float *w, uint32_t rows,
                       kn_wformat fmt, uint32_t group, mc_error *err)
{
    uint32_t cols = hs->cols;
    uint32_t span = fmt == KN_W_Q8 ? cols : group;
    float *c = mc_malloc_array(span, sizeof(float));
    double *d = mc_malloc_array(span, sizeof(double));
    if (!c || !d) {
        mc_free(c);
        mc_free(d);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "awq", -1,
                       "cannot allocate clipping work space");
    }
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c0 = 0; c0 < cols; c0 += span) {
            uint32_t n = cols - c0 < span ? cols - c0 : span;
            float *x = w + (size_t)r * cols + c0;
            float amax = 0.0f;
            for (uint32_t i = 0; i < n; i++)
                amax = fmaxf(amax, fabsf(x[i]));
            if (amax == 0.0f)
                continue;
            double best = INFINITY;
            float best_max = amax;
            for (int k = 0; k < 10; k++) {
                float lim = amax * (1.0f - 0.05f * (float)k);
                for (uint32_t i = 0; i < n; i++)
                    c[i] = fminf(fmaxf(x[i], -lim), lim);
                cmp_quant_fake(fmt, span, c, NULL, 1, n, c);
                for (uint32_t i = 0; i < n; i++)
                    d[i] = (double)x[i] - c[i];
                double e = block_quad(hs, c0, d, n);
                if (e < best) {
                    best = e;
                    best_max = lim;
                }
            }
            for (uint32_t i = 0; i < n; i++)
                x[i] = fminf(fmaxf(x[i], -best_max), best_max);
        }
    mc_free(c);
    mc_free(d);
    return MC_OK;
}

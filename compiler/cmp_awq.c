/* cmp_awq.c - AWQ scale search, clipping search and folding (cmp_awq.h). */
#include "cmp_awq.h"

#include <math.h>
#include <string.h>

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

/* Rows of one linear processed per pass of the search: the float copy of
 * W is then at most CMP_GPTQ_CHUNK_BYTES (or maxrows rows, if fewer). */
static size_t search_chunk(uint32_t maxrows, uint32_t cols)
{
    size_t c = cols ? CMP_GPTQ_CHUNK_BYTES / ((uint64_t)cols * sizeof(float)) : maxrows;
    if (c == 0)
        c = 1;
    return c < maxrows ? c : maxrows;
}

/* Bytes mc_malloc takes for a request: 0 counts as 1. */
static uint64_t req(uint64_t bytes)
{
    return bytes ? bytes : 1;
}

uint64_t cmp_awq_search_work_bytes(uint32_t maxrows, uint32_t cols)
{
    uint64_t n = cols;
    return req(n * sizeof(float)) +                                   /* s */
           req((uint64_t)search_chunk(maxrows, cols) * n * sizeof(float)) + /* ws */
           req(n * CMP_OERR_ROWS * sizeof(double));                   /* d */
}

mc_status cmp_awq_search(const cmp_hessian *h, const float *xabs,
                         const cmp_awq_linear *lin, size_t n, kn_wformat fmt,
                         uint32_t group, float *s_out, double *alpha_out,
                         double *err_out, double *err0_out, mc_error *err)
{
    uint32_t cols = h->cols;
    uint32_t maxrows = 0;
    for (size_t i = 0; i < n; i++)
        if (lin[i].rows > maxrows)
            maxrows = lin[i].rows;
    /* Each linear is scaled, quantized and measured a chunk of rows at a
     * time (rows are independent; the error sums in the same order). */
    size_t chunk = search_chunk(maxrows, cols);
    float *s = mc_malloc_array(cols, sizeof(float));
    float *ws = mc_malloc_array(chunk * cols, sizeof(float));
    double *d = mc_malloc_array((size_t)cols * CMP_OERR_ROWS, sizeof(double));
    if (!s || !ws || !d) {
        mc_free(s);
        mc_free(ws);
        mc_free(d);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "awq", -1,
                       "cannot allocate AWQ work space");
    }
    double best = INFINITY, best_alpha = 0.0;
    for (int k = 0; k < 20; k++) {
        double alpha = 0.05 * k;
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
        double e = 0.0;
        for (size_t i = 0; i < n; i++) {
            double ei = 0.0;
            for (uint32_t r0 = 0; r0 < lin[i].rows; r0 += (uint32_t)chunk) {
                uint32_t R = lin[i].rows - r0 < chunk ? lin[i].rows - r0
                                                      : (uint32_t)chunk;
                const float *wr = lin[i].w + (size_t)r0 * cols;
                memcpy(ws, wr, (size_t)R * cols * sizeof(float));
                cmp_awq_scale_cols(ws, R, cols, s);
                cmp_quant_fake(fmt, group, ws, NULL, R, cols, ws);
                for (uint32_t r = 0; r < R; r++)
                    for (uint32_t c = 0; c < cols; c++)
                        ws[(size_t)r * cols + c] /= s[c];
                cmp_hessian_output_error_add(h, wr, ws, R, d, &ei);
            }
            e += ei;
        }
        if (k == 0 && err0_out)
            *err0_out = e;
        if (e < best) {
            best = e;
            best_alpha = alpha;
            memcpy(s_out, s, cols * sizeof(float));
        }
    }
    if (alpha_out)
        *alpha_out = best_alpha;
    if (err_out)
        *err_out = best;
    mc_free(s);
    mc_free(ws);
    mc_free(d);
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

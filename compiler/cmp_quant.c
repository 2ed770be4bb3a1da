/* cmp_quant.c - RTN and importance-searched quantization into the
 * kn_quant.h layouts (see cmp_quant.h). */
#include "cmp_quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_rtn.h"

#define F16_MAX 65504.0f

int cmp_quant_is_quantized(kn_wformat fmt)
{
    return fmt == KN_W_Q8 || fmt == KN_W_Q4 || fmt == KN_W_Q4S;
}

mc_status cmp_qbuf_check(const cmp_qbuf *b, mc_error *err)
{
    if (!b || !cmp_quant_is_quantized(b->fmt))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "format", -1,
                       "quantized format expected (Q8, Q4 or Q4S)");
    if (b->rows == 0 || b->cols == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "shape", -1,
                       "empty matrix %ux%u", b->rows, b->cols);
    if (b->fmt != KN_W_Q8 && b->group != 32 && b->group != 64 &&
        b->group != 128)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "group", -1,
                       "int4 group must be 32, 64 or 128, not %u", b->group);
    if (!b->data || !b->scales || (b->fmt == KN_W_Q4 && !b->zeros))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "buffers", -1,
                       "data, scales%s buffers are required",
                       b->fmt == KN_W_Q4 ? " and zeros" : "");
    return MC_OK;
}

uint32_t cmp_qbuf_span(const cmp_qbuf *b)
{
    return b->fmt == KN_W_Q8 ? b->cols : b->group;
}

uint32_t cmp_qbuf_nparams(const cmp_qbuf *b)
{
    return b->fmt == KN_W_Q8 ? 1 : kn_q4_ngroups(b->cols, b->group);
}

int cmp_quant_f16_exact(float s)
{
    return fmt_f16_to_f32(fmt_f32_to_f16(s)) == s;
}

float cmp_quant_q8_scale(cmp_q8scale mode, float a)
{
    float s = a / 127.0f;
    if (mode == CMP_Q8_PLAIN || s == 0.0f)
        return s;
    uint16_t h = fmt_f32_to_f16(s); /* nearest; s > 0, so h + 1 is above */
    if (fmt_f16_to_f32(h) < s)
        h++;
    float up = fmt_f16_to_f32(h);
    return isfinite(up) ? up : s; /* above 65504: f32, named at export */
}

/* Round a scale to what the format stores (a Q8 scale of mode F16: to the
 * nearest f16, unless outside its range). */
static float store_scale(kn_wformat fmt, cmp_q8scale mode, float s)
{
    if (fmt == KN_W_Q8) {
        float h = fmt_f16_to_f32(fmt_f32_to_f16(s));
        return mode != CMP_Q8_PLAIN && isfinite(h) ? h : s;
    }
    if (s > F16_MAX)
        s = F16_MAX;
    if (s < -F16_MAX)
        s = -F16_MAX;
    return fmt_f16_to_f32(fmt_f32_to_f16(s));
}

int cmp_quant_code(kn_wformat fmt, cmp_qparam p, float x)
{
    if (p.scale == 0.0f)
        return p.zero;
    float v = nearbyintf(x / p.scale);
    if (fmt == KN_W_Q8) {
        if (!(v >= -127.0f))
            v = -127.0f; /* also maps NaN somewhere defined */
        if (v > 127.0f)
            v = 127.0f;
        return (int)v;
    }
    float q = v + (float)p.zero;
    if (!(q >= 0.0f))
        q = 0.0f;
    if (q > 15.0f)
        q = 15.0f;
    return (int)q;
}

float cmp_quant_value(kn_wformat fmt, cmp_qparam p, int q)
{
    if (fmt == KN_W_Q8)
        return p.scale * (float)q; /* kn_w_at: scale * (float)q */
    return (float)(q - p.zero) * p.scale;
}

/* Error of n values under p, weighted by imp (NULL = 1): kn_rtn_err,
 * whose eight chains take the sum off one add's latency per value. */
static double param_error(kn_wformat fmt, cmp_qparam p, const float *x,
                          const float *imp, size_t n)
{
    return kn_rtn_err(x, imp, n, fmt == KN_W_Q8, p.scale, p.zero);
}

/* Plain parameters for values whose (possibly shrunk) range is [mn, mx]
 * (mn <= 0 <= mx) and whose largest-magnitude signed value is ext. */
static cmp_qparam range_param(kn_wformat fmt, cmp_q8scale mode, float mn,
                              float mx, float ext)
{
    cmp_qparam p = {0.0f, fmt == KN_W_Q4S ? KN_Q4_ZERO_SYM : 0};
    switch (fmt) {
    case KN_W_Q8: {
        p.scale = cmp_quant_q8_scale(mode, fmaxf(-mn, mx));
        break;
    }
    case KN_W_Q4S:
        p.scale = store_scale(fmt, mode, ext / -8.0f);
        break;
    case KN_W_Q4: {
        float s = store_scale(fmt, mode, (mx - mn) / 15.0f);
        p.scale = s;
        if (s > 0.0f) {
            float z = nearbyintf(-mn / s);
            p.zero = z < 0.0f ? 0 : z > 15.0f ? 15 : (int)z;
        }
        break;
    }
    default:
        break;
    }
    return p;
}

/* Weighted least-squares scale for fixed codes (zero kept): minimizes
 * sum imp (x - s (q - z))^2.  Returns p unchanged when degenerate. */
static cmp_qparam refit_scale(kn_wformat fmt, cmp_q8scale mode, cmp_qparam p,
                              const float *x, const float *imp, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        int q = cmp_quant_code(fmt, p, x[i]) - (fmt == KN_W_Q8 ? 0 : p.zero);
        double w = imp ? imp[i] : 1.0;
        num += w * x[i] * q;
        den += w * (double)q * q;
    }
    if (den <= 0.0 || !isfinite(num / den))
        return p;
    cmp_qparam r = p;
    r.scale = store_scale(fmt, mode, (float)(num / den));
    return r;
}

/* cmp_quant_choose with a Q8 scale mode. */
static cmp_qparam choose(kn_wformat fmt, cmp_q8scale mode, const float *x,
                         const float *imp, size_t n)
{
    float mn = 0.0f, mx = 0.0f, ext = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (v < mn)
            mn = v;
        if (v > mx)
            mx = v;
        if (fabsf(v) > fabsf(ext))
            ext = v;
    }
    cmp_qparam best = range_param(fmt, mode, mn, mx, ext);
    int mse = fmt == KN_W_Q8 && mode == CMP_Q8_F16_MSE; /* imp NULL: 1 */
    if ((!imp && !mse) || best.scale == 0.0f)
        return best;
    double best_e = param_error(fmt, best, x, imp, n);
    /* Grid of shrunk ranges: int8 has fine steps, int4 coarse ones. */
    int steps = fmt == KN_W_Q8 ? 20 : 16;
    float step = fmt == KN_W_Q8 ? 0.01f : 0.03f;
    for (int k = 1; k <= steps; k++) {
        float f = 1.0f - step * (float)k;
        cmp_qparam p = range_param(fmt, mode, mn * f, mx * f, ext * f);
        double e = param_error(fmt, p, x, imp, n);
        if (e < best_e) {
            best_e = e;
            best = p;
        }
    }
    for (int it = 0; it < 2; it++) {
        cmp_qparam p = refit_scale(fmt, mode, best, x, imp, n);
        double e = param_error(fmt, p, x, imp, n);
        if (!(e < best_e))
            break;
        best_e = e;
        best = p;
    }
    return best;
}

cmp_qparam cmp_quant_choose(kn_wformat fmt, const float *x, const float *imp,
                            size_t n)
{
    return choose(fmt, CMP_Q8_PLAIN, x, imp, n);
}

void cmp_qbuf_set_param(cmp_qbuf *b, uint32_t r, uint32_t g, cmp_qparam p)
{
    if (b->fmt == KN_W_Q8) {
        ((float *)b->scales)[r] = p.scale;
        return;
    }
    size_t i = (size_t)r * kn_q4_ngroups(b->cols, b->group) + g;
    ((uint16_t *)b->scales)[i] = fmt_f32_to_f16(p.scale);
    if (b->fmt == KN_W_Q4)
        b->zeros[i] = (uint8_t)p.zero;
}

cmp_qparam cmp_qbuf_get_param(const cmp_qbuf *b, uint32_t r, uint32_t g)
{
    cmp_qparam p = {0.0f, 0};
    if (b->fmt == KN_W_Q8) {
        p.scale = ((const float *)b->scales)[r];
        return p;
    }
    size_t i = (size_t)r * kn_q4_ngroups(b->cols, b->group) + g;
    p.scale = fmt_f16_to_f32(((const uint16_t *)b->scales)[i]);
    p.zero = b->fmt == KN_W_Q4 ? b->zeros[i] : KN_Q4_ZERO_SYM;
    return p;
}

void cmp_qbuf_set_code(cmp_qbuf *b, uint32_t r, uint32_t c, int q)
{
    if (b->fmt == KN_W_Q8) {
        ((int8_t *)b->data)[(size_t)r * b->cols + c] = (int8_t)q;
        return;
    }
    uint8_t *byte = (uint8_t *)b->data + (size_t)r * kn_q4_row_bytes(b->cols) + c / 2;
    if (c & 1)
        *byte = (uint8_t)((*byte & 0x0F) | ((q & 15) << 4));
    else
        *byte = (uint8_t)((*byte & 0xF0) | (q & 15));
}

int cmp_qbuf_get_code(const cmp_qbuf *b, uint32_t r, uint32_t c)
{
    if (b->fmt == KN_W_Q8)
        return ((const int8_t *)b->data)[(size_t)r * b->cols + c];
    uint8_t byte = ((const uint8_t *)b->data)[(size_t)r * kn_q4_row_bytes(b->cols) + c / 2];
    return (c & 1) ? byte >> 4 : byte & 15;
}

kn_matrix cmp_qbuf_matrix(const cmp_qbuf *b)
{
    kn_matrix m;
    memset(&m, 0, sizeof m);
    m.fmt = b->fmt;
    m.rows = b->rows;
    m.cols = b->cols;
    m.data = b->data;
    m.scales = b->scales;
    m.zeros = b->fmt == KN_W_Q4 ? b->zeros : NULL;
    m.group = b->fmt == KN_W_Q8 ? 0 : b->group;
    return m;
}

mc_status cmp_quant_matrix(const float *w, const float *imp, cmp_qbuf *b,
                           mc_error *err)
{
    mc_status st = cmp_qbuf_check(b, err);
    if (st != MC_OK)
        return st;
    uint32_t span = cmp_qbuf_span(b), ng = cmp_qbuf_nparams(b);
    /* Odd rows leave a high nibble the layout requires to be 0. */
    if (b->fmt != KN_W_Q8)
        memset(b->data, 0, (size_t)kn_wformat_data_bytes(b->fmt, b->rows, b->cols));
    for (uint32_t r = 0; r < b->rows; r++) {
        const float *row = w + (size_t)r * b->cols;
        for (uint32_t c = 0; c < b->cols; c++)
            if (!isfinite(row[c])) {
                char where[64];
                snprintf(where, sizeof where, "row %u col %u", r, c);
                return mc_fail(err, MC_ERR_NONFINITE, NULL, where, -1,
                               "weight is %s; quantization needs finite values",
                               isnan(row[c]) ? "NaN" : "infinite");
            }
        for (uint32_t g = 0; g < ng; g++) {
            uint32_t c0 = g * span;
            uint32_t n = b->cols - c0 < span ? b->cols - c0 : span;
            cmp_qparam p = choose(b->fmt, b->q8scale, row + c0, imp ? imp + c0 : NULL, n);
            cmp_qbuf_set_param(b, r, g, p);
            /* Re-read the stored parameters so codes match storage exactly
             * (f16 scale round trip is already done in choose). */
            p = cmp_qbuf_get_param(b, r, g);
            for (uint32_t c = c0; c < c0 + n; c++)
                cmp_qbuf_set_code(b, r, c, cmp_quant_code(b->fmt, p, row[c]));
        }
    }
    return MC_OK;
}

/* The first value of x[n] of the largest magnitude (+0 for none), as
 * cmp_quant_choose's scan finds it, from the range [mn, mx] it implies. */
static float extreme(const float *x, size_t n, float mn, float mx)
{
    if (mx > -mn)
        return mx;
    if (-mn > mx)
        return mn;
    if (mx == 0.0f)
        return 0.0f;
    for (size_t i = 0; i < n; i++) /* a tie: the first of mn and mx wins */
        if (fabsf(x[i]) == mx)
            return x[i];
    return mx;
}

int cmp_quant_rtn_rows(const void *src, int type, cmp_qbuf *b, uint32_t r0,
                       uint32_t r1, float *row)
{
    size_t esize = type == KN_RTN_F32 ? 4 : 2;
    uint32_t span = cmp_qbuf_span(b), ng = cmp_qbuf_nparams(b);
    size_t rowb = b->fmt == KN_W_Q8 ? b->cols : kn_q4_row_bytes(b->cols);
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *s = (const uint8_t *)src + (size_t)r * b->cols * esize;
        if (!kn_rtn_to_f32(s, type, b->cols, row))
            return 0;
        uint8_t *codes = (uint8_t *)b->data + (size_t)r * rowb;
        uint32_t g = 0;
        if (b->fmt == KN_W_Q4) { /* whole groups in one call */
            g = b->cols / span;
            kn_rtn_q4_row(row, g, span, (uint16_t *)b->scales + (size_t)r * ng,
                          b->zeros + (size_t)r * ng, codes);
        } else if (b->fmt == KN_W_Q4S) { /* extreme + range_param, batched */
            g = b->cols / span;
            kn_rtn_q4s_row(row, g, span, (uint16_t *)b->scales + (size_t)r * ng,
                           codes);
        }
        for (; g < ng; g++) {
            uint32_t c0 = g * span;
            uint32_t n = b->cols - c0 < span ? b->cols - c0 : span;
            float mn, mx;
            kn_rtn_range(row + c0, n, &mn, &mx);
            float ext = b->fmt == KN_W_Q4S ? extreme(row + c0, n, mn, mx) : 0.0f;
            /* its scale is already what storage holds (f32, or f16-exact):
             * no read-back needed, unlike cmp_quant_matrix's */
            cmp_qparam p = b->q8scale == CMP_Q8_F16_MSE
                               ? choose(b->fmt, b->q8scale, row + c0, NULL, n)
                               : range_param(b->fmt, b->q8scale, mn, mx, ext);
            cmp_qbuf_set_param(b, r, g, p);
            if (b->fmt == KN_W_Q8) {
                if (p.scale == 0.0f)
                    memset(codes + c0, 0, n);
                else
                    kn_rtn_codes_q8(row + c0, n, p.scale, (int8_t *)codes + c0);
            } else if (p.scale == 0.0f) {
                /* every code is the zero point (c0 is even: whole bytes) */
                memset(codes + c0 / 2, p.zero | p.zero << 4, n / 2);
                if (n & 1)
                    codes[c0 / 2 + n / 2] = (uint8_t)p.zero;
            } else {
                kn_rtn_codes_q4(row + c0, n, p.scale, p.zero, codes + c0 / 2);
            }
        }
    }
    return 1;
}

void cmp_dequant_matrix(const cmp_qbuf *b, float *out)
{
    uint32_t span = cmp_qbuf_span(b);
    for (uint32_t r = 0; r < b->rows; r++) {
        cmp_qparam p = {0.0f, 0};
        uint32_t pg = UINT32_MAX;
        for (uint32_t c = 0; c < b->cols; c++) {
            uint32_t g = c / span;
            if (g != pg) {
                p = cmp_qbuf_get_param(b, r, g);
                pg = g;
            }
            out[(size_t)r * b->cols + c] = cmp_quant_value(b->fmt, p, cmp_qbuf_get_code(b, r, c));
        }
    }
}

double cmp_quant_weighted_error(const float *w, const float *imp,
                                const cmp_qbuf *b)
{
    uint32_t span = cmp_qbuf_span(b);
    double e = 0.0;
    for (uint32_t r = 0; r < b->rows; r++)
        for (uint32_t c = 0; c < b->cols; c++) {
            cmp_qparam p = cmp_qbuf_get_param(b, r, c / span);
            double d = (double)w[(size_t)r * b->cols + c] -
                       cmp_quant_value(b->fmt, p, cmp_qbuf_get_code(b, r, c));
            e += (imp ? (double)imp[c] : 1.0) * d * d;
        }
    return e;
}

void cmp_quant_fake(kn_wformat fmt, uint32_t group, const float *w,
                    const float *imp, uint32_t rows, uint32_t cols,
                    float *out)
{
    uint32_t span = fmt == KN_W_Q8 ? cols : group;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c0 = 0; c0 < cols; c0 += span) {
            uint32_t n = cols - c0 < span ? cols - c0 : span;
            const float *x = w + (size_t)r * cols + c0;
            float *o = out + (size_t)r * cols + c0;
            cmp_qparam p = cmp_quant_choose(fmt, x, imp ? imp + c0 : NULL, n);
            for (uint32_t i = 0; i < n; i++)
                o[i] = cmp_quant_value(fmt, p, cmp_quant_code(fmt, p, x[i]));
        }
}

/* kn_rtn.c - plain references and dispatch of the RTN inner loops (see
 * kn_rtn.h). */
#include "kn_rtn.h"

#include <math.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_ops.h"

static int use_avx2(void)
{
    return kn_cpu_has_avx2() && !kn_force_scalar();
}

int kn_ref_rtn_to_f32(const void *src, int type, size_t n, float *out)
{
    const uint16_t *h = src;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        float v;
        if (type == KN_RTN_F16)
            v = fmt_f16_to_f32(h[i]);
        else if (type == KN_RTN_BF16)
            v = fmt_bf16_to_f32(h[i]);
        else
            memcpy(&v, (const float *)src + i, sizeof v);
        out[i] = v;
        finite &= isfinite(v) != 0;
    }
    return finite;
}

int kn_rtn_to_f32(const void *src, int type, size_t n, float *out)
{
    return use_avx2() ? kn_avx2_rtn_to_f32(src, type, n, out)
                      : kn_ref_rtn_to_f32(src, type, n, out);
}

void kn_ref_rtn_range(const float *x, size_t n, float *mn, float *mx)
{
    float lo = 0.0f, hi = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

void kn_rtn_range(const float *x, size_t n, float *mn, float *mx)
{
    if (use_avx2())
        kn_avx2_rtn_range(x, n, mn, mx);
    else
        kn_ref_rtn_range(x, n, mn, mx);
}

void kn_ref_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q)
{
    for (size_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] / scale);
        if (!(v >= -127.0f))
            v = -127.0f;
        if (v > 127.0f)
            v = 127.0f;
        q[i] = (int8_t)v;
    }
}

/* Values [i0, n) into their chains (kn_rtn_err). */
static void err_tail(const float *x, const float *imp, size_t i0, size_t n,
                     int q8, float scale, int zero, double c[KN_RTN_ERR_LANES])
{
    for (size_t i = i0; i < n; i++) {
        float v = 0.0f;
        if (scale != 0.0f) {
            float q = nearbyintf(x[i] / scale);
            float lo = q8 ? -127.0f : 0.0f, hi = q8 ? 127.0f : 15.0f;
            if (!q8)
                q += (float)zero;
            if (!(q >= lo))
                q = lo;
            if (q > hi)
                q = hi;
            v = q8 ? scale * q : (q - (float)zero) * scale;
        }
        double d = (double)x[i] - (double)v;
        double t = (imp ? (double)imp[i] : 1.0) * d;
        c[i % KN_RTN_ERR_LANES] += t * d;
    }
}

static double err_join(const double c[KN_RTN_ERR_LANES])
{
    return ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

double kn_ref_rtn_err(const float *x, const float *imp, size_t n, int q8,
                      float scale, int zero)
{
    double c[KN_RTN_ERR_LANES] = {0};
    err_tail(x, imp, 0, n, q8, scale, zero, c);
    return err_join(c);
}

double kn_rtn_err(const float *x, const float *imp, size_t n, int q8,
                  float scale, int zero)
{
    double c[KN_RTN_ERR_LANES] = {0};
    size_t n8 = 0;
    if (use_avx2()) {
        n8 = n - n % KN_RTN_ERR_LANES;
        kn_avx2_rtn_err(x, imp, n8, q8, scale, zero, c);
    }
    err_tail(x, imp, n8, n, q8, scale, zero, c);
    return err_join(c);
}

void kn_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q)
{
    if (use_avx2())
        kn_avx2_rtn_codes_q8(x, n, scale, q);
    else
        kn_ref_rtn_codes_q8(x, n, scale, q);
}

void kn_ref_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                         uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        float q = nearbyintf(x[i] / scale) + (float)zero;
        if (!(q >= 0.0f))
            q = 0.0f;
        if (q > 15.0f)
            q = 15.0f;
        uint8_t c = (uint8_t)q;
        if (i & 1)
            out[i / 2] = (uint8_t)(out[i / 2] | (c << 4));
        else
            out[i / 2] = c;
    }
}

void kn_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                     uint8_t *out)
{
    if (use_avx2())
        kn_avx2_rtn_codes_q4(x, n, scale, zero, out);
    else
        kn_ref_rtn_codes_q4(x, n, scale, zero, out);
}

void kn_ref_rtn_q4_row(const float *x, uint32_t ng, uint32_t g,
                       uint16_t *scales, uint8_t *zeros, uint8_t *out)
{
    for (uint32_t k = 0; k < ng; k++) {
        const float *v = x + (size_t)k * g;
        float mn, mx;
        kn_ref_rtn_range(v, g, &mn, &mx);
        float s = (mx - mn) / 15.0f;
        if (s > 65504.0f)
            s = 65504.0f;
        if (s < -65504.0f)
            s = -65504.0f;
        scales[k] = fmt_f32_to_f16(s);
        s = fmt_f16_to_f32(scales[k]);
        int zero = 0;
        if (s > 0.0f) {
            float z = nearbyintf(-mn / s);
            zero = z < 0.0f ? 0 : z > 15.0f ? 15 : (int)z;
        }
        zeros[k] = (uint8_t)zero;
        uint8_t *o = out + (size_t)k * g / 2;
        if (s == 0.0f)
            memset(o, 0, g / 2); /* zero is 0 here */
        else
            kn_ref_rtn_codes_q4(v, g, s, zero, o);
    }
}

void kn_rtn_q4_row(const float *x, uint32_t ng, uint32_t g, uint16_t *scales,
                   uint8_t *zeros, uint8_t *out)
{
    if (use_avx2())
        kn_avx2_rtn_q4_row(x, ng, g, scales, zeros, out);
    else
        kn_ref_rtn_q4_row(x, ng, g, scales, zeros, out);
}

void kn_ref_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g,
                        uint16_t *scales, uint8_t *out)
{
    for (uint32_t k = 0; k < ng; k++) {
        const float *v = x + (size_t)k * g;
        float mn, mx;
        kn_ref_rtn_range(v, g, &mn, &mx);
        /* mx also when both are +0 (ext +0) */
        float ext = mx > -mn ? mx : -mn > mx ? mn : mx;
        if (mx == -mn && mx != 0.0f) /* a tie: the first of mn and mx */
            for (uint32_t i = 0; i < g; i++)
                if (fabsf(v[i]) == mx) {
                    ext = v[i];
                    break;
                }
        float s = ext / -8.0f;
        if (s > 65504.0f)
            s = 65504.0f;
        if (s < -65504.0f)
            s = -65504.0f;
        scales[k] = fmt_f32_to_f16(s);
        s = fmt_f16_to_f32(scales[k]);
        uint8_t *o = out + (size_t)k * g / 2;
        if (s == 0.0f)
            memset(o, 0x88, g / 2); /* every code the zero point 8 */
        else
            kn_ref_rtn_codes_q4(v, g, s, 8, o);
    }
}

void kn_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g, uint16_t *scales,
                    uint8_t *out)
{
    if (use_avx2())
        kn_avx2_rtn_q4s_row(x, ng, g, scales, out);
    else
        kn_ref_rtn_q4s_row(x, ng, g, scales, out);
}

/* kn_lora.c - scalar references and dispatch of the merge's kernels
 * (contract in kn_lora.h). */
#include "kn_lora.h"

#include <math.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_ops.h"

static int use_avx2(void)
{
    return !kn_force_scalar() && kn_cpu_has_avx2();
}

void kn_ref_lora_rows(const double *L, const double *R, uint32_t r,
                      size_t cols, size_t nr, double *out, size_t ldo)
{
    for (size_t i = 0; i < nr; i++) {
        double *o = out + i * ldo;
        memset(o, 0, cols * sizeof *o);
        for (uint32_t k = 0; k < r; k++) {
            double b = L[i * r + k];
            const double *a = R + (size_t)k * cols;
            for (size_t j = 0; j < cols; j++) {
                double p = b * a[j]; /* rounded, then added: never fused */
                o[j] += p;
            }
        }
    }
}

void kn_ref_lora_rows_add(const double *L, const double *R, uint32_t r,
                          size_t cols, size_t nr, double coef, double *out,
                          size_t ldo)
{
    for (size_t i = 0; i < nr; i++)
        for (size_t j = 0; j < cols; j++) {
            double s = 0;
            for (uint32_t k = 0; k < r; k++) {
                double p = L[i * r + k] * R[(size_t)k * cols + j];
                s += p;
            }
            double c = coef * s;
            out[i * ldo + j] += c;
        }
}

void kn_lora_rows(const double *L, const double *R, uint32_t r, size_t cols,
                  size_t nr, double *out, size_t ldo)
{
    if (use_avx2() && kn_cpu_has_avx512())
        kn_avx512_lora_rows(L, R, r, cols, nr, 0.0, 0, out, ldo);
    else if (use_avx2())
        kn_avx2_lora_rows(L, R, r, cols, nr, 0.0, 0, out, ldo);
    else
        kn_ref_lora_rows(L, R, r, cols, nr, out, ldo);
}

void kn_lora_rows_add(const double *L, const double *R, uint32_t r,
                      size_t cols, size_t nr, double coef, double *out,
                      size_t ldo)
{
    if (use_avx2() && kn_cpu_has_avx512())
        kn_avx512_lora_rows(L, R, r, cols, nr, coef, 1, out, ldo);
    else if (use_avx2())
        kn_avx2_lora_rows(L, R, r, cols, nr, coef, 1, out, ldo);
    else
        kn_ref_lora_rows_add(L, R, r, cols, nr, coef, out, ldo);
}

/* x rounded once to a binary float with mant stored mantissa bits whose
 * smallest normal exponent is emin: exact scaling by powers of two, then
 * nearbyint (the default rounding mode: to nearest even). */
static double round_prec(double x, int mant, int emin)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e);
    int lead = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, lead - mant);
    return nearbyint(x / q) * q;
}

size_t kn_ref_lora_finish(const double *d, const float *base, size_t n,
                          int type, void *out, double *maxd)
{
    double mx = *maxd;
    size_t j = 0;
    for (; j < n; j++) {
        double x = d[j];
        if (!(fabs(x) <= 3.4028234663852886e38))
            break;
        float f = (float)x;
        double dd = fabs((double)f - (double)base[j]);
        mx = dd > mx ? dd : mx;
        if (type == KN_LORA_F32) {
            ((float *)out)[j] = f;
        } else if (type == KN_LORA_BF16) {
            /* exact after round_prec: the float conversion does not round
             * again (2^128 overflows to inf, as bf16 does) */
            float g = (float)round_prec(x, 7, -126);
            uint32_t b;
            memcpy(&b, &g, 4);
            ((uint16_t *)out)[j] = (uint16_t)(b >> 16);
        } else {
            ((uint16_t *)out)[j] =
                fmt_f32_to_f16((float)round_prec(x, 10, -14));
        }
    }
    *maxd = mx;
    return j;
}

size_t kn_lora_finish(const double *d, const float *base, size_t n, int type,
                      void *out, double *maxd)
{
    if (use_avx2() && type != KN_LORA_F16 && kn_cpu_has_avx512())
        return kn_avx512_lora_finish(d, base, n, type, out, maxd);
    if (use_avx2() && type != KN_LORA_F16)
        return kn_avx2_lora_finish(d, base, n, type, out, maxd);
    return kn_ref_lora_finish(d, base, n, type, out, maxd);
}

/* test_rope.c - kn_rope_init for every HF rope type against values computed
 * here in double from transformers' formulas (and a few literal values
 * computed offline), and kn_rope_apply against its reference and against a
 * direct rotation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_ops.h"
#include "testutil.h"

#define PI 3.14159265358979323846

/* rope types (values of fmt_rope_type) */
enum { R_DEFAULT = 0, R_LINEAR = 1, R_DYNAMIC = 2, R_YARN = 3, R_LLAMA3 = 4 };

static void assert_rel(double got, double want, double tol, const char *what, int i)
{
    double e = fabs(got - want) / fabs(want);
    if (!(e <= tol))
        fprintf(stderr, "%s[%d]: got %.10g want %.10g (rel %g)\n", what, i, got, want, e);
    assert_true(e <= tol);
}

static void test_rope_default_known_values(void **state)
{
    (void)state;
    float f[64], sc = 0;
    kn_rope_init(R_DEFAULT, 10000.0, 1.0, 0, 0, 0, 0, 0, 0, 128, 0, f, &sc);
    assert_true(sc == 1.0f);
    assert_true(f[0] == 1.0f);
    assert_rel(f[1], 0.8659643233600653, 1e-6, "default", 1);
    assert_rel(f[10], 0.23713737056616555, 1e-6, "default", 10);
    assert_rel(f[63], 0.00011547819846894582, 1e-6, "default", 63);
    for (int i = 0; i < 64; i++)
        assert_rel(f[i], pow(10000.0, -2.0 * i / 128.0), 1e-6, "default", i);
}

static void test_rope_linear_divides_inv_freq_by_factor(void **state)
{
    (void)state;
    float f[32], sc = 0;
    kn_rope_init(R_LINEAR, 10000.0, 4.0, 0, 0, 2048, 0, 0, 0, 64, 0, f, &sc);
    for (int i = 0; i < 32; i++)
        assert_rel(f[i], pow(10000.0, -2.0 * i / 64.0) / 4.0, 1e-6, "linear", i);
    assert_true(sc == 1.0f);
}

static void test_rope_dynamic_grows_base_past_original_max(void **state)
{
    (void)state;
    float f[32], sc = 0;
    /* Within the original context: plain default frequencies. */
    kn_rope_init(R_DYNAMIC, 10000.0, 2.0, 0, 0, 2048, 0, 0, 0, 64, 1000, f, &sc);
    for (int i = 0; i < 32; i++)
        assert_rel(f[i], pow(10000.0, -2.0 * i / 64.0), 1e-6, "dyn-short", i);
    /* seq_len 4096 = 2 x original: base = theta * (2*2 - 1)^(64/62). */
    kn_rope_init(R_DYNAMIC, 10000.0, 2.0, 0, 0, 2048, 0, 0, 0, 64, 4096, f, &sc);
    double base = 10000.0 * pow(3.0, 64.0 / 62.0);
    assert_rel(base, 31082.236667168814, 1e-12, "dyn-base", 0);
    assert_rel(f[1], 0.7237840223942559, 1e-6, "dyn", 1);
    assert_rel(f[31], 4.445071440544414e-05, 1e-6, "dyn", 31);
    for (int i = 0; i < 32; i++)
        assert_rel(f[i], pow(base, -2.0 * i / 64.0), 1e-6, "dyn", i);
}

/* transformers' _compute_yarn_parameters, written out independently. */
static double yarn_expected(int i, double d, double theta, double factor,
                            double orig, double bf, double bs)
{
    double lo = floor(d * log(orig / (bf * 2 * PI)) / (2 * log(theta)));
    double hi = ceil(d * log(orig / (bs * 2 * PI)) / (2 * log(theta)));
    lo = fmax(lo, 0);
    hi = fmin(hi, d - 1);
    if (lo == hi)
        hi += 0.001;
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0);
    double pf = pow(theta, 2.0 * i / d);
    double extra_w = 1.0 - ramp;
    return 1.0 / (factor * pf) * (1 - extra_w) + 1.0 / pf * extra_w;
}

static void test_rope_yarn_qwen25_blends_and_scales(void **state)
{
    (void)state;
    /* Qwen2.5 long-context: factor 4, original 32768, theta 1e6, d 128.
     * Correction range (beta_fast 32, beta_slow 1) is dims 23 .. 40. */
    float f[64], sc = 0;
    kn_rope_init(R_YARN, 1e6, 4.0, 0, 0, 32768, 32.0, 1.0, 0.0, 128, 0, f, &sc);
    assert_rel(sc, 1.138629436111989, 1e-6, "yarn-mscale", 0);
    assert_true(f[0] == 1.0f);
    assert_rel(f[24], 0.005375321490790102, 1e-6, "yarn", 24);
    assert_rel(f[39], 6.490394320837028e-05, 1e-6, "yarn", 39);
    assert_rel(f[63], 3.102344401879299e-07, 1e-6, "yarn", 63);
    for (int i = 0; i < 64; i++)
        assert_rel(f[i], yarn_expected(i, 128, 1e6, 4, 32768, 32, 1), 1e-6, "yarn", i);
    /* Defaults: beta 0 -> 32 / 1; an explicit attention_factor wins. */
    kn_rope_init(R_YARN, 1e6, 4.0, 0, 0, 32768, 0, 0, 0.7, 128, 0, f, &sc);
    assert_rel(sc, 0.7, 1e-7, "yarn-af", 0);
    assert_rel(f[30], yarn_expected(30, 128, 1e6, 4, 32768, 32, 1), 1e-6, "yarn", 30);
}

/* transformers' _compute_llama3_parameters, written out independently. */
static double llama3_expected(int i, double d, double theta, double factor,
                              double lo, double hi, double orig)
{
    double f = pow(theta, -2.0 * i / d);
    double wl = 2 * PI / f;
    double lw = orig / lo, hw = orig / hi;
    double fl = wl > lw ? f / factor : f;
    double s = (orig / wl - lo) / (hi - lo);
    double sm = (1 - s) * fl / factor + s * fl;
    return (!(wl < hw) && !(wl > lw)) ? sm : fl;
}

static void test_rope_llama31_params_match_hf(void **state)
{
    (void)state;
    float f[64], sc = 0;
    kn_rope_init(R_LLAMA3, 500000.0, 8.0, 1.0, 4.0, 8192, 0, 0, 0, 128, 0, f, &sc);
    assert_true(sc == 1.0f);
    assert_true(f[0] == 1.0f);                                    /* high freq */
    assert_rel(f[20], 0.016560440080994446, 1e-6, "llama3", 20);  /* high */
    assert_rel(f[30], 0.0013718935677611381, 1e-6, "llama3", 30); /* blended */
    assert_rel(f[33], 0.00031269375038406517, 1e-6, "llama3", 33);
    assert_rel(f[63], 3.068925988914511e-07, 1e-6, "llama3", 63); /* / 8 */
    for (int i = 0; i < 64; i++)
        assert_rel(f[i], llama3_expected(i, 128, 500000, 8, 1, 4, 8192), 1e-6,
                   "llama3", i);
}

static void test_rope_apply_matches_reference_and_direct_rotation(void **state)
{
    (void)state;
    uint32_t hd = 64, nh = 3;
    size_t T = 5;
    float inv[32], sc = 1;
    kn_rope_init(R_YARN, 10000.0, 2.0, 0, 0, 4096, 32, 1, 0, hd, 0, inv, &sc);
    kn_rope r = { hd, inv, sc };
    int64_t pos[5] = { 0, 1, 17, 4095, 100000 };
    size_t n = T * nh * hd;
    float *x = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)sin(0.37 * (double)i + 0.1);
    memcpy(a, x, n * 4);
    memcpy(b, x, n * 4);
    kn_rope_apply(&r, a, T, nh, pos);
    kn_ref_rope_apply(&r, b, T, nh, pos);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++)
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    assert_true(sqrt(num / den) < 1e-6);
    /* Direct: pair (i, i + 32) of token 2 head 1 rotated by angle 17*inv[i]
     * and scaled by the yarn factor. */
    for (uint32_t i = 0; i < 32; i += 7) {
        size_t o = (2 * nh + 1) * hd;
        double ang = (double)(17.0f * inv[i]);
        double xa = x[o + i], xb = x[o + i + 32];
        assert_float_equal(a[o + i], sc * (xa * cos(ang) - xb * sin(ang)), 1e-5);
        assert_float_equal(a[o + i + 32], sc * (xb * cos(ang) + xa * sin(ang)), 1e-5);
    }
    /* Position 0 only scales. */
    for (uint32_t i = 0; i < hd; i++)
        assert_float_equal(a[i], sc * x[i], 1e-6);
    free(x), free(a), free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_default_known_values),
        cmocka_unit_test(test_rope_linear_divides_inv_freq_by_factor),
        cmocka_unit_test(test_rope_dynamic_grows_base_past_original_max),
        cmocka_unit_test(test_rope_yarn_qwen25_blends_and_scales),
        cmocka_unit_test(test_rope_llama31_params_match_hf),
        cmocka_unit_test(test_rope_apply_matches_reference_and_direct_rotation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

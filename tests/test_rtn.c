/* test_rtn.c - the RTN fast path: kn_rtn.h's AVX2 bodies bitwise equal to
 * their plain references, and cmp_quant_rtn_rows (widen + range + codes
 * from a checkpoint's bytes) bitwise equal to cmp_quant_matrix on the
 * widened matrix, for every format, group, source type and awkward value
 * (ties at .5, zeros of both signs, all-zero groups, equal +-extremes,
 * odd widths), and refusing NaN/Inf.  The int4 row kernels (KN_W_Q4,
 * KN_W_Q4S) are also held to their references directly. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_quant.h"
#include "fmt_dtype.h"
#include "kn_ops.h"
#include "kn_rtn.h"
#include "testutil.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

/* Values that stress the rounding: random, exact halves of a step, zeros
 * of both signs, and a few rows' worth of equal-magnitude extremes. */
static void fill_awkward(float *x, size_t n, float step)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t k = tu_rng_u32(&g_rng) % 8;
        if (k == 0)
            x[i] = step * ((float)(int)(tu_rng_u32(&g_rng) % 255) - 127.0f + 0.5f);
        else if (k == 1)
            x[i] = (tu_rng_u32(&g_rng) & 1) ? -0.0f : 0.0f;
        else
            x[i] = tu_rng_f(&g_rng) * 127.0f * step;
    }
}

static void test_rtn_avx2_matches_reference_bitwise(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU without AVX2: only the reference runs");
    enum { N = 1000 };
    static float x[N], a[N], b[N];
    static uint16_t h[N];
    static int8_t qa[N], qb[N];
    static uint8_t pa[N / 2 + 1], pb[N / 2 + 1];
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + tu_rng_u32(&g_rng) % N;
        fill_awkward(x, n, 0.01f);
        float mn1, mx1, mn2, mx2;
        kn_ref_rtn_range(x, n, &mn1, &mx1);
        kn_avx2_rtn_range(x, n, &mn2, &mx2);
        assert_memory_equal(&mn1, &mn2, sizeof mn1);
        assert_memory_equal(&mx1, &mx2, sizeof mx1);
        float s = 0.01f * (round % 2 ? -1.0f : 1.0f);
        kn_ref_rtn_codes_q8(x, n, s, qa);
        kn_avx2_rtn_codes_q8(x, n, s, qb);
        assert_memory_equal(qa, qb, n);
        int zero = (int)(tu_rng_u32(&g_rng) % 16);
        memset(pa, 0xAA, sizeof pa);
        memset(pb, 0x55, sizeof pb);
        kn_ref_rtn_codes_q4(x, n, 0.1f * s, zero, pa);
        kn_avx2_rtn_codes_q4(x, n, 0.1f * s, zero, pb);
        assert_memory_equal(pa, pb, (n + 1) / 2);
        for (int type = KN_RTN_F32; type <= KN_RTN_BF16; type++) {
            const void *src = x;
            if (type != KN_RTN_F32) {
                fmt_from_f32(type == KN_RTN_F16 ? FMT_DT_F16 : FMT_DT_BF16, x, h, n);
                src = h;
            }
            assert_int_equal(kn_ref_rtn_to_f32(src, type, n, a), 1);
            assert_int_equal(kn_avx2_rtn_to_f32(src, type, n, b), 1);
            assert_memory_equal(a, b, n * sizeof(float));
            /* one non-finite value anywhere is found by both */
            size_t at = tu_rng_u32(&g_rng) % n;
            if (type == KN_RTN_F32) {
                float keep = x[at];
                x[at] = (round % 2) ? NAN : -INFINITY;
                assert_int_equal(kn_ref_rtn_to_f32(x, type, n, a), 0);
                assert_int_equal(kn_avx2_rtn_to_f32(x, type, n, b), 0);
                x[at] = keep;
            } else {
                uint16_t keep = h[at];
                h[at] = type == KN_RTN_F16 ? 0x7C00 : 0x7FC0; /* inf, nan */
                assert_int_equal(kn_ref_rtn_to_f32(h, type, n, a), 0);
                assert_int_equal(kn_avx2_rtn_to_f32(h, type, n, b), 0);
                h[at] = keep;
            }
        }
    }
}

/* The int4 row kernels (asymmetric and symmetric) against their plain
 * references, every group size, group counts around the 8-group batch,
 * scales normal, f16-subnormal, rounded to 0 and clamped at 65504 (with
 * quotients past int32), with
 * all-zero groups and equal +-extremes (either first) planted. */
static void test_rtn_q4_rows_avx2_match_reference_bitwise(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU without AVX2: only the reference runs");
    enum { NG = 19, G = 128 };
    static float x[NG * G];
    static uint16_t sa[NG], sb[NG];
    static uint8_t za[NG], zb[NG], pa[NG * G / 2], pb[NG * G / 2];
    const uint32_t groups[] = {32, 64, 128};
    const float steps[] = {0.003f, 1e-7f, 1e-9f, 1e4f, 1e30f};
    for (int round = 0; round < 3 * NG * 5; round++) {
        uint32_t g = groups[round % 3];
        uint32_t ng = 1 + (uint32_t)(round / 3) % NG;
        float step = steps[(round / 3 / NG) % 5];
        fill_awkward(x, (size_t)ng * g, step);
        uint32_t k = tu_rng_u32(&g_rng) % ng; /* a zero group */
        memset(x + (size_t)k * g, 0, g * sizeof(float));
        if (tu_rng_u32(&g_rng) & 1)
            x[(size_t)k * g + tu_rng_u32(&g_rng) % g] = -0.0f;
        k = tu_rng_u32(&g_rng) % ng; /* a tie, the negative or positive first */
        float sgn = (tu_rng_u32(&g_rng) & 1) ? 1.0f : -1.0f;
        x[(size_t)k * g + 1] = sgn * 300.0f * step;
        x[(size_t)k * g + g - 2] = -sgn * 300.0f * step;
        memset(pa, 0x11, sizeof pa);
        memset(pb, 0xEE, sizeof pb);
        memset(sa, 0x11, sizeof sa);
        memset(sb, 0xEE, sizeof sb);
        kn_ref_rtn_q4s_row(x, ng, g, sa, pa);
        kn_avx2_rtn_q4s_row(x, ng, g, sb, pb);
        assert_memory_equal(sa, sb, ng * sizeof(uint16_t));
        assert_memory_equal(pa, pb, (size_t)ng * g / 2);
        memset(za, 0x11, sizeof za);
        memset(zb, 0xEE, sizeof zb);
        kn_ref_rtn_q4_row(x, ng, g, sa, za, pa);
        kn_avx2_rtn_q4_row(x, ng, g, sb, zb, pb);
        assert_memory_equal(sa, sb, ng * sizeof(uint16_t));
        assert_memory_equal(za, zb, ng);
        assert_memory_equal(pa, pb, (size_t)ng * g / 2);
    }
}

/* cmp_quant_rtn_rows over src (type) vs cmp_quant_matrix on the widened
 * values; both with fresh buffers. */
static void check_rows_match(kn_wformat fmt, cmp_q8scale mode, uint32_t group,
                             int type, const void *src, uint32_t rows,
                             uint32_t cols)
{
    uint64_t db = kn_wformat_data_bytes(fmt, rows, cols);
    uint64_t sb = kn_wformat_scale_bytes(fmt, rows, cols, group);
    uint64_t zb = kn_wformat_zero_bytes(fmt, rows, cols, group);
    float *w = malloc((size_t)rows * cols * sizeof(float));
    float *row = malloc(cols * sizeof(float));
    uint8_t *d1 = calloc(1, db), *s1 = calloc(1, sb), *z1 = calloc(1, zb + 1);
    uint8_t *d2 = malloc(db), *s2 = malloc(sb), *z2 = malloc(zb + 1);
    assert_true(w && row && d1 && s1 && z1 && d2 && s2 && z2);
    memset(d2, 0xA5, db); /* the fast path owes every byte */
    memset(s2, 0xA5, sb);
    memset(z2, 0xA5, zb + 1);
    assert_int_equal(kn_ref_rtn_to_f32(src, type, (size_t)rows * cols, w), 1);
    cmp_qbuf b1 = {fmt, rows, cols, group, d1, s1, fmt == KN_W_Q4 ? z1 : NULL,
                   mode};
    cmp_qbuf b2 = {fmt, rows, cols, group, d2, s2, fmt == KN_W_Q4 ? z2 : NULL,
                   mode};
    assert_int_equal(cmp_quant_matrix(w, NULL, &b1, NULL), MC_OK);
    /* two ranges, as two threads would do them */
    assert_int_equal(cmp_quant_rtn_rows(src, type, &b2, 0, rows / 2, row), 1);
    assert_int_equal(cmp_quant_rtn_rows(src, type, &b2, rows / 2, rows, row), 1);
    assert_memory_equal(d1, d2, db);
    assert_memory_equal(s1, s2, sb);
    if (zb)
        assert_memory_equal(z1, z2, zb);
    free(w); free(row);
    free(d1); free(s1); free(z1);
    free(d2); free(s2); free(z2);
}

static void test_rtn_rows_match_cmp_quant_matrix(void **state)
{
    (void)state;
    /* the last two: Q8 with f16-exact scales (a tied embedding's),
     * rounded up and least squared error */
    const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S, KN_W_Q8, KN_W_Q8};
    const uint32_t groups[] = {32, 64, 128};
    const uint32_t widths[] = {32, 33, 200, 257, 576};
    for (int scalar = 0; scalar < 2; scalar++) {
        kn_set_force_scalar(scalar);
        for (size_t f = 0; f < 5; f++)
            for (size_t g = 0; g < 3; g++)
                for (size_t c = 0; c < 5 * 4; c++) {
                    /* steps giving normal, f16-subnormal and clamped
                     * (over 65504) int4 scales; the last, Q8 scales over
                     * 65504 (a CMP_Q8_F16 row then keeps f32) */
                    const float steps[] = {0.003f, 1e-7f, 1e4f, 1e6f};
                    float step = steps[c / 5];
                    uint32_t rows = 7, cols = widths[c % 5];
                    size_t n = (size_t)rows * cols;
                    float *x = malloc(n * sizeof(float));
                    uint16_t *h = malloc(n * sizeof(uint16_t));
                    assert_true(x && h);
                    fill_awkward(x, n, step);
                    /* an all-zero row, and a row whose first group has
                     * equal extremes of both signs */
                    memset(x + cols, 0, cols * sizeof(float));
                    x[2 * cols + 3] = -200.0f * step;
                    x[2 * cols + 5] = 200.0f * step;
                    x[3 * cols + 1] = 200.0f * step;
                    x[3 * cols + 4] = -200.0f * step;
                    for (int type = KN_RTN_F32; type <= KN_RTN_BF16; type++) {
                        if (type == KN_RTN_F16 && step > 1.0f)
                            continue; /* beyond f16's range */
                        const void *src = x;
                        if (type != KN_RTN_F32) {
                            fmt_from_f32(type == KN_RTN_F16 ? FMT_DT_F16
                                                            : FMT_DT_BF16,
                                         x, h, n);
                            src = h;
                        }
                        check_rows_match(fmts[f],
                                         f == 3   ? CMP_Q8_F16
                                         : f == 4 ? CMP_Q8_F16_MSE
                                                  : CMP_Q8_PLAIN,
                                         fmts[f] == KN_W_Q8 ? 0 : groups[g],
                                         type, src, rows, cols);
                    }
                    free(x);
                    free(h);
                }
    }
    kn_set_force_scalar(0);
}

/* kn_rtn_err: the AVX2 chains give the reference's bits (int8, int4 and
 * int4-sym, with and without importances, scale 0, values past the
 * clamp, every tail length), and the reference is the plain sum up to
 * the order of its additions. */
static void test_rtn_err_avx2_matches_reference(void **state)
{
    (void)state;
    enum { N = 203 };
    float x[N], imp[N];
    fill_awkward(x, N, 0.01f);
    for (size_t i = 0; i < N; i++)
        imp[i] = 0.5f + tu_rng_f(&g_rng);
    static const struct { int q8; float scale; int zero; } ps[] = {
        {1, 0.01f, 0}, {1, 0.004f, 0}, {1, 0.0f, 0}, {0, 0.09f, 7},
        {0, 0.05f, 8}, {0, 0.2f, 0}, {0, 0.0f, 3},
    };
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++)
        for (size_t n = 0; n <= N; n += n < 20 ? 1 : 37)
            for (int wi = 0; wi < 2; wi++) {
                const float *w = wi ? imp : NULL;
                double ref = kn_ref_rtn_err(x, w, n, ps[k].q8, ps[k].scale, ps[k].zero);
                kn_set_force_scalar(0);
                double got = kn_rtn_err(x, w, n, ps[k].q8, ps[k].scale, ps[k].zero);
                assert_memory_equal(&got, &ref, sizeof got);
                /* the plain loop of cmp_quant's values */
                double plain = 0.0;
                cmp_qparam p = {ps[k].scale, ps[k].zero};
                kn_wformat f = ps[k].q8 ? KN_W_Q8 : KN_W_Q4;
                for (size_t i = 0; i < n; i++) {
                    double d = (double)x[i] -
                               (double)cmp_quant_value(f, p, cmp_quant_code(f, p, x[i]));
                    plain += (w ? (double)w[i] : 1.0) * d * d;
                }
                assert_true(fabs(got - plain) <= 1e-12 * fabs(plain) + 1e-300);
            }
}

static void test_rtn_rows_refuse_nonfinite(void **state)
{
    (void)state;
    uint32_t rows = 4, cols = 64;
    float x[4 * 64], row[64];
    int8_t d[4 * 64];
    float s[4];
    for (size_t i = 0; i < 4 * 64; i++)
        x[i] = 0.01f * (float)i;
    x[2 * 64 + 9] = NAN;
    cmp_qbuf b = {KN_W_Q8, rows, cols, 0, d, s, NULL};
    assert_int_equal(cmp_quant_rtn_rows(x, KN_RTN_F32, &b, 0, 2, row), 1);
    assert_int_equal(cmp_quant_rtn_rows(x, KN_RTN_F32, &b, 0, rows, row), 0);
    x[2 * 64 + 9] = INFINITY;
    assert_int_equal(cmp_quant_rtn_rows(x, KN_RTN_F32, &b, 2, 3, row), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rtn_avx2_matches_reference_bitwise),
        cmocka_unit_test(test_rtn_q4_rows_avx2_match_reference_bitwise),
        cmocka_unit_test(test_rtn_rows_match_cmp_quant_matrix),
        cmocka_unit_test(test_rtn_rows_refuse_nonfinite),
        cmocka_unit_test(test_rtn_err_avx2_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

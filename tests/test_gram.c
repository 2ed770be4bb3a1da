/* test_gram.c - the blocked Gram sums of kn_gram.h (the calibration's
 * statistics) against their double references: AVX2 and scalar tiles,
 * widths that are not multiples of the tile, chunks that are not full,
 * sums accumulated over many calls; the thread count not changing a
 * bit; and the AVX-512 tile giving the AVX2 tile's bits (skipped, and
 * said so, on a machine without AVX-512). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_gram.h"
#include "kn_ops.h"
#include "testutil.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

/* T x n inputs in [-1, 1) with every 13th channel 30x larger (trained
 * activations have such outliers) and some exact zeros. */
static float *inputs(size_t T, uint32_t n)
{
    float *x = malloc(T * n * sizeof(float));
    assert_non_null(x);
    for (size_t k = 0; k < T * n; k++) {
        float v = tu_rng_f(&g_rng);
        x[k] = k % 29 == 0 ? 0.0f : (k % n) % 13 == 0 ? 30.0f * v : v;
    }
    return x;
}

static size_t tri_count(uint32_t n)
{
    return (size_t)n * (n + 1) / 2;
}

/* max |got - ref| / max |ref| */
static double norm_err(const double *got, const double *ref, size_t k)
{
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < k; i++) {
        e = fmax(e, fabs(got[i] - ref[i]));
        r = fmax(r, fabs(ref[i]));
    }
    return r > 0.0 ? e / r : e;
}

/* Run body once with AVX2 (when present) and once forced scalar. */
#define FOR_BOTH_PATHS(s) for (int s = kn_cpu_has_avx2() ? 0 : 1; s < 2; s++)

static void test_gram_tri_matches_double_reference(void **state)
{
    (void)state;
    static const uint32_t widths[] = {1, 5, 17, 64, 100, 203};
    FOR_BOTH_PATHS(sc) {
        kn_set_force_scalar(sc);
        for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
            uint32_t n = widths[w];
            size_t T = 3 * KN_GRAM_KC + 37; /* a partial last chunk */
            float *x = inputs(T, n);
            float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
            double *h = calloc(tri_count(n), sizeof(double));
            double *ref = calloc(tri_count(n), sizeof(double));
            /* two calls: the sums accumulate */
            kn_gram_tri(NULL, h, x, 150, n, scr);
            kn_gram_tri(NULL, h, x + 150 * (size_t)n, T - 150, n, scr);
            kn_ref_gram_tri(ref, x, T, n);
            double e = norm_err(h, ref, tri_count(n));
            assert_true(e < 1e-6);
            /* the diagonal is a sum of squares: never negative */
            for (uint32_t i = 0; i < n; i++)
                assert_true(h[(size_t)i * (2 * n + 1 - i) / 2] >= 0.0);
            free(x);
            free(scr);
            free(h);
            free(ref);
        }
    }
    kn_set_force_scalar(0);
}

static void test_gram_cross_matches_double_reference(void **state)
{
    (void)state;
    static const uint32_t widths[] = {3, 16, 23, 130};
    FOR_BOTH_PATHS(sc) {
        kn_set_force_scalar(sc);
        for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
            uint32_t n = widths[w];
            size_t T = 2 * KN_GRAM_KC + 5;
            float *a = inputs(T, n), *b = inputs(T, n);
            float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
            double *c = calloc((size_t)n * n, sizeof(double));
            double *ref = calloc((size_t)n * n, sizeof(double));
            kn_gram_cross(NULL, c, a, b, T, n, scr);
            kn_ref_gram_cross(ref, a, b, T, n);
            assert_true(norm_err(c, ref, (size_t)n * n) < 1e-6);
            /* not symmetric: a and b are different, (i, j) is a_i b_j */
            assert_true(c[1] != c[n]);
            free(a);
            free(b);
            free(scr);
            free(c);
            free(ref);
        }
    }
    kn_set_force_scalar(0);
}

/* Wide enough (and enough tokens) that the pool is used. */
static void test_gram_threads_give_identical_sums(void **state)
{
    (void)state;
    kn_pool *p3 = kn_pool_create(3), *p2 = kn_pool_create(2);
    assert_non_null(p3);
    assert_non_null(p2);
    uint32_t n = 301;
    size_t T = 2 * KN_GRAM_KC + 11;
    float *a = inputs(T, n), *b = inputs(T, n);
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    double *h1 = calloc(tri_count(n), sizeof(double));
    double *h3 = calloc(tri_count(n), sizeof(double));
    double *c1 = calloc((size_t)n * n, sizeof(double));
    double *c2 = calloc((size_t)n * n, sizeof(double));
    kn_gram_tri(NULL, h1, a, T, n, scr);
    kn_gram_tri(p3, h3, a, T, n, scr);
    assert_memory_equal(h1, h3, tri_count(n) * sizeof(double));
    kn_gram_cross(NULL, c1, a, b, T, n, scr);
    kn_gram_cross(p2, c2, a, b, T, n, scr);
    assert_memory_equal(c1, c2, (size_t)n * n * sizeof(double));
    /* and the symmetric sum agrees with the cross sum of x with itself
     * on the upper triangle (same tiles, same order) */
    memset(c1, 0, (size_t)n * n * sizeof(double));
    kn_gram_cross(p3, c1, a, a, T, n, scr);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i; j < n; j++)
            assert_true(h1[(size_t)i * (2 * n + 1 - i) / 2 + (j - i)] ==
                        c1[(size_t)i * n + j]);
    free(a);
    free(b);
    free(scr);
    free(h1);
    free(h3);
    free(c1);
    free(c2);
    kn_pool_free(p3);
    kn_pool_free(p2);
}

/* The float chunk sums keep their accuracy over many tokens: the error
 * does not grow with the token count (double sums across chunks). */
static void test_gram_error_does_not_grow_with_tokens(void **state)
{
    (void)state;
    uint32_t n = 24;
    size_t T = 64 * KN_GRAM_KC;
    float *x = inputs(T, n);
    for (size_t k = 0; k < T * n; k++)
        x[k] = fabsf(x[k]) + 0.5f; /* all positive: sums grow with T */
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    double *h = calloc(tri_count(n), sizeof(double));
    double *ref = calloc(tri_count(n), sizeof(double));
    kn_gram_tri(NULL, h, x, T, n, scr);
    kn_ref_gram_tri(ref, x, T, n);
    /* one float sum of 8192 positive terms would be off by ~1e-4 */
    assert_true(norm_err(h, ref, tri_count(n)) < 2e-7);
    free(x);
    free(scr);
    free(h);
    free(ref);
}

/* h (tri) or c (cross) sums of T tokens from start, in two calls (the
 * second starts a new chunk), with the AVX-512 path on or off. */
static void sums_path(kn_pool *p, int tri, int no512, double *out,
                      const float *a, const float *b, size_t T, uint32_t n,
                      float *scr)
{
    kn_set_no_avx512(no512);
    size_t t1 = T / 3;
    if (tri) {
        kn_gram_tri(p, out, a, t1, n, scr);
        kn_gram_tri(p, out, a + t1 * n, T - t1, n, scr);
    } else {
        kn_gram_cross(p, out, a, b, t1, n, scr);
        kn_gram_cross(p, out, a + t1 * n, b + t1 * n, T - t1, n, scr);
    }
    kn_set_no_avx512(0);
}

/* Widths around the AVX-512 tile (12 x 32: two 6-row and two 16-column
 * panels) and the column groups (8 panels), token counts around the float
 * chunk and the packed chunk, 1 and 2 threads, sums added to non-zero
 * values: the AVX-512 path gives the AVX2 path's bits. */
static void test_gram_avx512_matches_avx2_bit_for_bit(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx2() || !kn_cpu_has_avx512()) {
        print_message("AVX-512 against AVX2 comparison skipped: this CPU "
                      "(or MC_NO_AVX512) does not run the AVX-512 path\n");
        return;
    }
    static const uint32_t widths[] = {1, 6, 7, 12, 13, 31, 33, 47, 100,
                                      129, 203, 301};
    static const size_t tokens[] = {1, 37, KN_GRAM_FC + 1, KN_GRAM_KC,
                                    2 * KN_GRAM_KC + 37};
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        uint32_t n = widths[w];
        float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
        assert_non_null(scr);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            size_t T = tokens[k];
            float *a = inputs(T, n), *b = inputs(T, n);
            for (int tri = 0; tri < 2; tri++) {
                size_t cnt = tri ? tri_count(n) : (size_t)n * n;
                double *s2 = malloc(cnt * sizeof(double));
                double *s5 = malloc(cnt * sizeof(double));
                assert_non_null(s2);
                assert_non_null(s5);
                for (int th = 1; th <= 2; th++) {
                    kn_pool *p = th == 2 ? p2 : NULL;
                    for (size_t e = 0; e < cnt; e++)
                        s2[e] = s5[e] = (double)tu_rng_f(&g_rng);
                    sums_path(p, tri, 1, s2, a, b, T, n, scr);
                    sums_path(p, tri, 0, s5, a, b, T, n, scr);
                    if (memcmp(s2, s5, cnt * sizeof(double)) != 0)
                        fail_msg("%s n %u T %zu threads %d: AVX-512 sums "
                                 "differ from AVX2", tri ? "tri" : "cross",
                                 n, T, th);
                }
                free(s2);
                free(s5);
            }
            free(a);
            free(b);
        }
        free(scr);
    }
    kn_pool_free(p2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gram_tri_matches_double_reference),
        cmocka_unit_test(test_gram_cross_matches_double_reference),
        cmocka_unit_test(test_gram_threads_give_identical_sums),
        cmocka_unit_test(test_gram_error_does_not_grow_with_tokens),
        cmocka_unit_test(test_gram_avx512_matches_avx2_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

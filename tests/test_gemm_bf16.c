/* test_gemm_bf16.c - the calibration's bfloat16 products of quantized
 * linears (kn_gemm_bf16.h): every path (vdpbf16ps where the CPU has
 * AVX512_BF16, the AVX2 emulation, the scalar loop) gives the bits of the
 * element-by-element reference (the AVX2 emulation also with AVX-512 F),
 * for float weights (rounded to bfloat16),
 * Q8, Q4 and Q4S at every group, ragged
 * rows, columns (odd ones included) and tokens, 1 and 2 threads, with
 * activations near FLT_MIN whose sums flush; and the reference stays
 * within bfloat16's rounding of the float product. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_gemm_bf16.h"
#include "kn_ops.h"
#include "testutil.h"
#include "tmat.h"

static tu_rng g_rng = {0x2545f4914f6cdd1dull};

enum { PATH_BF16, PATH_AVX512F, PATH_AVX2, PATH_SCALAR, PATH_COUNT };
static const char *const path_name[] = {"avx512bf16", "avx512f emulation",
                                        "avx2", "scalar"};

/* Select a path; 0 when this CPU cannot run it. */
static int use_path(int p)
{
    kn_set_force_scalar(p == PATH_SCALAR);
    kn_set_no_bf16(p != PATH_BF16);
    kn_set_no_avx512(p == PATH_AVX2);
    if (p == PATH_BF16)
        return kn_cpu_has_avx512bf16();
    if (p == PATH_AVX512F)
        return kn_cpu_has_avx512();
    if (p == PATH_AVX2)
        return kn_cpu_has_avx2();
    return 1;
}

static int restore(void **state)
{
    kn_set_no_bf16(0);
    kn_set_no_avx512(0);
    return tu_reset_kernel_switches(state);
}

/* T x cols activations: mostly in [-2, 2), some exact zeros, some near
 * FLT_MIN (their products' sums cancel into the subnormal range, which
 * every path must flush the same way), some subnormal. */
static float *activations(size_t T, uint32_t cols, int tiny)
{
    float *x = malloc(T * cols * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < T * cols; i++) {
        float v = tu_rng_f(&g_rng);
        x[i] = 2.0f * v;
        if (i % 17 == 0)
            x[i] = 0.0f;
        if (tiny && i % 3 == 0)
            x[i] = FLT_MIN * (1.0f + 3.0f * v);
        if (tiny && i % 11 == 0)
            x[i] = FLT_MIN * 0.25f * v;
    }
    return x;
}

/* Pack X and run kn_matmul_bf16_multi on the path selected. */
static void run(kn_pool *pool, const kn_matrix *W, const float *X,
                size_t T, float *Y, const float *bias)
{
    void *xb = malloc(kn_bf16_act_bytes(T, W->cols) + 64);
    assert_non_null(xb);
    kn_bf16_act_pack(X, T, W->cols, xb);
    kn_matmul_bf16_multi(pool, 1, &W, xb, T, &Y, &bias);
    free(xb);
}

static void check_case(kn_pool *pool, kn_wformat f, uint32_t group,
                       uint32_t rows, uint32_t cols, size_t T, int tiny)
{
    tu_tmat t = tu_tmat_make(&g_rng, f, rows, cols, group);
    assert_true(kn_bf16_dot_supported(&t.m));
    float *X = activations(T, cols, tiny);
    float *bias = malloc(rows * sizeof(float));
    float *ref = malloc(T * rows * sizeof(float));
    float *got = malloc(T * rows * sizeof(float));
    assert_non_null(bias);
    assert_non_null(ref);
    assert_non_null(got);
    for (uint32_t r = 0; r < rows; r++)
        bias[r] = tu_rng_f(&g_rng);
    kn_ref_matmul_bf16(&t.m, X, T, ref, bias);
    for (int p = 0; p < PATH_COUNT; p++) {
        if (!use_path(p))
            continue;
        memset(got, 0xcd, T * rows * sizeof(float));
        run(pool, &t.m, X, T, got, bias);
        if (memcmp(got, ref, T * rows * sizeof(float)) != 0) {
            for (size_t i = 0; i < T * rows; i++)
                if (memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
                    print_error("%s: fmt %d g%u %ux%u T %zu tiny %d: element "
                                "(t %zu, r %zu) %.9g, reference %.9g\n",
                                path_name[p], (int)f, group, rows, cols, T,
                                tiny, i / rows, i % rows, got[i], ref[i]);
                    break;
                }
            fail();
        }
    }
    restore(NULL);
    free(X);
    free(bias);
    free(ref);
    free(got);
    tu_tmat_free(&t);
}

static void test_paths_give_the_reference_bits(void **state)
{
    (void)state;
    static const struct { kn_wformat f; uint32_t g; } fmts[] = {
        {KN_W_F32, 0}, {KN_W_Q8, 0}, {KN_W_Q4, 32}, {KN_W_Q4, 64}, {KN_W_Q4, 128},
        {KN_W_Q4S, 32}, {KN_W_Q4S, 128},
    };
    static const uint32_t rows[] = {1, 16, 17, 40, 70};
    static const uint32_t cols[] = {32, 33, 96, 257, 576};
    static const size_t toks[] = {1, 7, 13};
    kn_pool *pools[2] = {NULL, tu_pool_warm(2)};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++)
                for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                    check_case(pools[(ri + ti) % 2], fmts[fi].f, fmts[fi].g,
                               rows[ri], cols[ci], toks[ti], (int)(ci % 2));
    if (!kn_cpu_has_avx512bf16())
        print_message("note: no AVX512_BF16 here: the vdpbf16ps path was not "
                      "run (the AVX2 emulation and the scalar loop were)\n");
}

/* A larger shape: many row panels, several 256-column spans, token tiles
 * with tails, both threads. */
static void test_larger_shape(void **state)
{
    (void)state;
    kn_pool *pool = tu_pool_warm(2);
    check_case(pool, KN_W_Q8, 0, 200, 1536, 29, 0);
    check_case(pool, KN_W_Q4, 128, 200, 1536, 29, 1);
    check_case(pool, KN_W_Q4S, 32, 72, 600, 31, 0);
    check_case(pool, KN_W_F32, 0, 100, 1000, 23, 1);
}

/* The reference against the float product of the dequantized weights:
 * only the activations' rounding (8 significant bits) separates them, and
 * for float weights theirs. */
static void test_reference_near_float_product(void **state)
{
    (void)state;
    static const kn_wformat fs[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S, KN_W_F32};
    for (int i = 0; i < 4; i++) {
        uint32_t rows = 48, cols = 384;
        size_t T = 9;
        tu_tmat t = tu_tmat_make(&g_rng, fs[i], rows, cols, 64);
        float *X = activations(T, cols, 0);
        float *a = malloc(T * rows * sizeof(float));
        float *b = malloc(T * rows * sizeof(float));
        assert_non_null(a);
        assert_non_null(b);
        kn_ref_matmul_bf16(&t.m, X, T, a, NULL);
        kn_ref_matmul(&t.m, X, T, b, NULL);
        double e = tu_norm_err(a, b, T * rows);
        assert_true(e < 2e-2);
        assert_true(e > 1e-6); /* the activations were rounded */
        free(X);
        free(a);
        free(b);
        tu_tmat_free(&t);
    }
}

/* What the path does not take falls back: f16, the 16-row panels. */
static void test_supported(void **state)
{
    (void)state;
    tu_tmat t = tu_tmat_make(&g_rng, KN_W_F32, 4, 64, 0);
    assert_true(kn_bf16_dot_supported(&t.m));
    tu_tmat_free(&t);
    t = tu_tmat_make(&g_rng, KN_W_F16, 4, 64, 0);
    assert_false(kn_bf16_dot_supported(&t.m));
    tu_tmat_free(&t);
    t = tu_tmat_make(&g_rng, KN_W_Q4S, 16, 64, 32);
    t.m.layout = KN_LAYOUT_P16;
    assert_false(kn_bf16_dot_supported(&t.m));
    tu_tmat_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_paths_give_the_reference_bits, restore),
        cmocka_unit_test_teardown(test_larger_shape, restore),
        cmocka_unit_test(test_reference_near_float_product),
        cmocka_unit_test(test_supported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

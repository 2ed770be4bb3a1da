/* test_rotate.c - the randomized Hadamard rotations of cmp_rotate.h: they
 * are orthogonal (so the model's function is kept; test_calib checks that
 * on whole models), deterministic per seed, and refuse widths without a
 * useful power-of-two block. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_rotate.h"

/* M M^T = I: rotate every basis vector and check the Gram matrix. */
static void check_orthogonal(uint32_t n, uint32_t block, int head)
{
    cmp_rotation r;
    assert_int_equal(cmp_rotation_init(&r, head ? 64 : n, head ? n : 8, 7, NULL),
                     MC_OK);
    if (!head)
        assert_int_equal(r.block, block);
    else
        assert_int_equal(r.head_block, n);
    float *cols = calloc((size_t)n * n, sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        cols[(size_t)i * n + i] = 1.0f;
        if (head)
            cmp_rotate_head(&r, cols + (size_t)i * n);
        else
            cmp_rotate_hidden(&r, cols + (size_t)i * n);
    }
    double worst = 0.0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            double d = 0.0;
            for (uint32_t k = 0; k < n; k++)
                d += (double)cols[(size_t)i * n + k] * cols[(size_t)j * n + k];
            worst = fmax(worst, fabs(d - (i == j ? 1.0 : 0.0)));
        }
    assert_true(worst < 1e-5);
    free(cols);
    cmp_rotation_free(&r);
}

static void test_rotate_hidden_is_orthogonal_for_model_widths(void **state)
{
    (void)state;
    check_orthogonal(64, 64, 0);   /* stories260k */
    check_orthogonal(96, 32, 0);   /* 3 blocks of 32 */
    check_orthogonal(896, 128, 0); /* Qwen2-0.5B: 7 blocks of 128 */
}

static void test_rotate_head_is_orthogonal(void **state)
{
    (void)state;
    check_orthogonal(8, 8, 1);
    check_orthogonal(128, 128, 1);
}

static void test_rotate_refuses_narrow_blocks_and_skips_odd_heads(void **state)
{
    (void)state;
    cmp_rotation r;
    mc_error e;
    assert_int_equal(cmp_rotation_init(&r, 40, 8, 1, &e), MC_ERR_INVALID_ARG);
    assert_non_null(strstr(e.message, "power-of-two"));
    assert_int_equal(cmp_rotation_applies(40), 0);
    assert_int_equal(cmp_rotation_applies(5120), 1);
    /* head_dim 80 (not a power of two): residual only */
    assert_int_equal(cmp_rotation_init(&r, 5120, 80, 1, NULL), MC_OK);
    assert_int_equal(r.block, 1024);
    assert_int_equal(r.head_block, 0);
    cmp_rotation_free(&r);
    cmp_rotation_free(NULL);
}

/* Same seed, same rotation; another seed, another. */
static void test_rotate_is_deterministic_per_seed(void **state)
{
    (void)state;
    cmp_rotation a, b, c;
    assert_int_equal(cmp_rotation_init(&a, 64, 8, 42, NULL), MC_OK);
    assert_int_equal(cmp_rotation_init(&b, 64, 8, 42, NULL), MC_OK);
    assert_int_equal(cmp_rotation_init(&c, 64, 8, 43, NULL), MC_OK);
    float x[64], y[64], z[64];
    for (int i = 0; i < 64; i++)
        x[i] = y[i] = z[i] = (float)(i % 7) - 3.0f;
    cmp_rotate_hidden(&a, x);
    cmp_rotate_hidden(&b, y);
    cmp_rotate_hidden(&c, z);
    assert_memory_equal(x, y, sizeof x);
    assert_memory_not_equal(x, z, sizeof x);
    cmp_rotation_free(&a);
    cmp_rotation_free(&b);
    cmp_rotation_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotate_hidden_is_orthogonal_for_model_widths),
        cmocka_unit_test(test_rotate_head_is_orthogonal),
        cmocka_unit_test(test_rotate_refuses_narrow_blocks_and_skips_odd_heads),
        cmocka_unit_test(test_rotate_is_deterministic_per_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_kernels_quant.c - kn_matmul (AVX2 and scalar, 1 and 2 threads) and
 * kn_matrix_row against the scalar reference, for every weight format, over
 * odd shapes: columns not a multiple of 8 or 32, ragged int4 groups, token
 * counts on both sides of the decode/prefill switch. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_ops.h"
#include "testutil.h"
#include "tmat.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

static const char *fmt_name(kn_wformat f)
{
    static const char *n[] = { "F32", "F16", "BF16", "Q8", "Q4", "Q4S" };
    return n[f];
}

/* Compare kn_matmul (current force-scalar setting, pool p) with the
 * reference for one matrix and T tokens; with and without bias. */
static void check_matmul(kn_pool *p, const tu_tmat *t, size_t T, double tol)
{
    const kn_matrix *W = &t->m;
    float *X = malloc(T * W->cols * sizeof(float) + 4);
    float *Y = malloc(T * W->rows * sizeof(float) + 4);
    float *R = malloc(T * W->rows * sizeof(float) + 4);
    float *bias = malloc(W->rows * sizeof(float) + 4);
    assert_true(X && Y && R && bias);
    for (size_t i = 0; i < T * W->cols; i++)
        X[i] = tu_rng_f(&g_rng);
    for (uint32_t i = 0; i < W->rows; i++)
        bias[i] = tu_rng_f(&g_rng);
    for (int b = 0; b < 2; b++) {
        const float *bp = b ? bias : NULL;
        kn_ref_matmul(W, X, T, R, bp);
        for (size_t i = 0; i < T * W->rows; i++)
            Y[i] = NAN; /* the op must write every output */
        kn_matmul(p, W, X, T, Y, bp);
        double e = tu_norm_err(Y, R, T * W->rows);
        if (!(e < tol))
            fprintf(stderr, "matmul %s %ux%u g%u T=%zu threads=%d scalar=%d "
                    "bias=%d: err %g\n", fmt_name(W->fmt), W->rows, W->cols,
                    W->group, T, kn_pool_threads(p), kn_force_scalar(), b, e);
        assert_true(e < tol);
    }
    free(X);
    free(Y);
    free(R);
    free(bias);
}

static void run_matmul_suite(int scalar)
{
    static const uint32_t shapes[][2] = {
        { 5, 172 }, { 37, 300 }, { 64, 64 }, { 9, 33 }, { 3, 1 },
        { 130, 257 }, { 17, 96 },
    };
    static const size_t Ts[] = { 1, 2, 3, 5, 8, 9, 17, 64 };
    static const uint32_t groups[] = { 32, 64, 128 };
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    kn_set_force_scalar(scalar);
    for (int f = 0; f < KN_W_COUNT_; f++) {
        int ng = (f == KN_W_Q4 || f == KN_W_Q4S) ? 3 : 1;
        for (int gi = 0; gi < ng; gi++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, shapes[s][0], shapes[s][1],
                                   groups[gi]);
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    check_matmul(NULL, &t, Ts[ti], 1e-5);
                    check_matmul(p2, &t, Ts[ti], 1e-5);
                }
                tu_tmat_free(&t);
            }
    }
    kn_set_force_scalar(0);
    kn_pool_free(p2);
}

static void test_matmul_avx2_matches_reference_all_formats(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    run_matmul_suite(0);
}

static void test_matmul_scalar_matches_reference_all_formats(void **state)
{
    (void)state;
    run_matmul_suite(1);
}

static void test_matmul_ragged_int4_groups_172_cols(void **state)
{
    (void)state;
    /* 172 = 5*32+12 = 2*64+44 = 128+44: the last group is short for every
     * group size, and the row has an even byte count. 171: odd columns. */
    static const uint32_t cols[] = { 172, 171 };
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (int c = 0; c < 2; c++)
        for (uint32_t g = 32; g <= 128; g *= 2)
            for (int f = KN_W_Q4; f <= KN_W_Q4S; f++) {
                tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, 11, cols[c], g);
                check_matmul(p2, &t, 1, 1e-5);
                check_matmul(p2, &t, 17, 1e-5);
                tu_tmat_free(&t);
            }
    kn_pool_free(p2);
}

static void test_matmul_large_prefill_two_threads(void **state)
{
    (void)state;
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (int f = 0; f < KN_W_COUNT_; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, 67, 777, 64);
        check_matmul(p2, &t, 40, 1e-5);
        tu_tmat_free(&t);
    }
    kn_pool_free(p2);
}

static void test_matmul_unusual_group_falls_back_to_scalar(void **state)
{
    (void)state;
    /* group 16 is outside the contract's {32, 64, 128}: it must still be
     * computed correctly (by the scalar path), not misread. */
    tu_tmat t = tu_tmat_make(&g_rng, KN_W_Q4, 7, 50, 16);
    check_matmul(NULL, &t, 3, 1e-5);
    tu_tmat_free(&t);
}

static void test_matrix_row_known_values_q4(void **state)
{
    (void)state;
    /* 3 columns, one group: q = 1, 2, 3; scale 0.5; zero 1 -> 0, 0.5, 1. */
    uint8_t data[2] = { 0x21, 0x03 };
    uint16_t sc = fmt_f32_to_f16(0.5f);
    uint8_t z = 1;
    kn_matrix m = { KN_W_Q4, 1, 3, data, &sc, &z, 32, KN_LAYOUT_ROWS };
    float out[3];
    kn_matrix_row(&m, 0, out);
    assert_true(out[0] == 0.0f && out[1] == 0.5f && out[2] == 1.0f);
    /* Symmetric: zero 8 -> (1-8)*0.5, (2-8)*0.5, (3-8)*0.5. */
    m.fmt = KN_W_Q4S;
    m.zeros = NULL;
    kn_matrix_row(&m, 0, out);
    assert_true(out[0] == -3.5f && out[1] == -3.0f && out[2] == -2.5f);
}

static void test_matrix_row_known_values_q8_f16_bf16(void **state)
{
    (void)state;
    int8_t q[4] = { -127, 0, 1, 127, };
    float s[2] = { 0.25f, 2.0f };
    kn_matrix m = { KN_W_Q8, 2, 2, q, s, NULL, 0, KN_LAYOUT_ROWS };
    float out[2];
    kn_matrix_row(&m, 1, out);
    assert_true(out[0] == 2.0f && out[1] == 254.0f);
    uint16_t h[2] = { 0x3c00, 0xc000 }; /* 1, -2 in f16 */
    kn_matrix mh = { KN_W_F16, 1, 2, h, NULL, NULL, 0, KN_LAYOUT_ROWS };
    kn_matrix_row(&mh, 0, out);
    assert_true(out[0] == 1.0f && out[1] == -2.0f);
    uint16_t b[2] = { 0x3f80, 0x4040 }; /* 1, 3 in bf16 */
    kn_matrix mb = { KN_W_BF16, 1, 2, b, NULL, NULL, 0, KN_LAYOUT_ROWS };
    kn_matrix_row(&mb, 0, out);
    assert_true(out[0] == 1.0f && out[1] == 3.0f);
}

static void test_matrix_row_matches_matmul_with_unit_vector(void **state)
{
    (void)state;
    /* Row r of W equals column r of W^T e_c over c: check every format. */
    for (int f = 0; f < KN_W_COUNT_; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, 6, 45, 32);
        float row[45], x[45], y[6];
        kn_matrix_row(&t.m, 4, row);
        for (uint32_t c = 0; c < 45; c += 11) {
            memset(x, 0, sizeof x);
            x[c] = 1.0f;
            kn_ref_matmul(&t.m, x, 1, y, NULL);
            assert_true(y[4] == row[c]);
        }
        tu_tmat_free(&t);
    }
}

/* A token's output row must have the same bits whatever else is in the
 * call (T tokens, 1 or 2 threads): the runtime's promise that a sequence
 * gives identical results alone or in a batch rests on it. */
static void test_matmul_rows_are_bit_identical_for_every_T(void **state)
{
    (void)state;
    static const kn_wformat fmts[] = {KN_W_F32, KN_W_F16, KN_W_BF16,
                                      KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    static const uint32_t colss[] = {40, 172, 520, 1100};
    enum { ROWS = 13, TMAX = 20 };
    kn_pool *pool = kn_pool_create(2);
    assert_non_null(pool);
    for (size_t f = 0; f < 6; f++)
        for (size_t ci = 0; ci < 4; ci++) {
            uint32_t cols = colss[ci];
            tu_tmat t = tu_tmat_make(&g_rng, fmts[f], ROWS, cols, 32);
            float *x = malloc((size_t)TMAX * cols * sizeof(float));
            float *alone = malloc((size_t)TMAX * ROWS * sizeof(float));
            float *y = malloc((size_t)TMAX * ROWS * sizeof(float));
            assert_non_null(x);
            for (size_t i = 0; i < (size_t)TMAX * cols; i++)
                x[i] = tu_rng_f(&g_rng);
            for (size_t tok = 0; tok < TMAX; tok++)
                kn_matmul(NULL, &t.m, x + tok * cols, 1, alone + tok * ROWS,
                          NULL);
            for (size_t T = 2; T <= TMAX; T++)
                for (int th = 0; th < 2; th++) {
                    kn_matmul(th ? pool : NULL, &t.m, x, T, y, NULL);
                    for (size_t tok = 0; tok < T; tok++)
                        if (memcmp(y + tok * ROWS, alone + tok * ROWS,
                                   ROWS * sizeof(float)) != 0)
                            fail_msg("%s cols %u: token %zu differs at T=%zu "
                                     "(threads %d)", fmt_name(fmts[f]), cols,
                                     tok, T, th + 1);
                }
            free(x);
            free(alone);
            free(y);
            tu_tmat_free(&t);
        }
    kn_pool_free(pool);
}

/* The float prefill GEMM over its tiling boundaries: 19 rows (two 8-row
 * panels and a 3-row one, 4-row tiles and a 3-row tail), 1100 columns
 * (two full KN_KC blocks and a ragged one), T = 140 (a 128-token panel
 * and one of 12, 3-token tiles and a 2-token tail; for the AVX-512 GEMM
 * one 140-token panel, 8-row tiles and a 3-row one, 6-token tiles and a
 * 2-token tail): every token's row has the bits of that token alone, 1 and
 * 2 threads, with AVX-512 (where the CPU has it) and without. */
static void test_matmul_gemm_panel_boundaries_bit_identical(void **state)
{
    (void)state;
    static const kn_wformat fmts[] = {KN_W_F32, KN_W_F16, KN_W_Q8, KN_W_Q4};
    enum { ROWS = 19, COLS = 1100, T = 140 };
    kn_pool *pool = kn_pool_create(2);
    assert_non_null(pool);
    float *x = malloc((size_t)T * COLS * sizeof(float));
    float *alone = malloc((size_t)T * ROWS * sizeof(float));
    float *y = malloc((size_t)T * ROWS * sizeof(float));
    assert_true(x && alone && y);
    for (size_t i = 0; i < (size_t)T * COLS; i++)
        x[i] = tu_rng_f(&g_rng);
    for (size_t f = 0; f < 4; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, fmts[f], ROWS, COLS, 32);
        for (size_t tok = 0; tok < T; tok++)
            kn_matmul(NULL, &t.m, x + tok * COLS, 1, alone + tok * ROWS, NULL);
        /* the AVX-512 GEMM where the CPU has it, and the AVX2 one */
        for (int no512 = 0; no512 < 2; no512++) {
            kn_set_no_avx512(no512);
            for (int th = 0; th < 2; th++) {
                kn_matmul(th ? pool : NULL, &t.m, x, T, y, NULL);
                for (size_t tok = 0; tok < T; tok++)
                    if (memcmp(y + tok * ROWS, alone + tok * ROWS,
                               ROWS * sizeof(float)) != 0)
                        fail_msg("%s: token %zu differs at T=%d (threads %d%s)",
                                 fmt_name(fmts[f]), tok, T, th + 1,
                                 no512 ? ", AVX-512 off" : "");
            }
        }
        kn_set_no_avx512(0);
        tu_tmat_free(&t);
    }
    free(x);
    free(alone);
    free(y);
    kn_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_avx2_matches_reference_all_formats),
        cmocka_unit_test(test_matmul_scalar_matches_reference_all_formats),
        cmocka_unit_test(test_matmul_ragged_int4_groups_172_cols),
        cmocka_unit_test(test_matmul_large_prefill_two_threads),
        cmocka_unit_test(test_matmul_unusual_group_falls_back_to_scalar),
        cmocka_unit_test(test_matrix_row_known_values_q4),
        cmocka_unit_test(test_matrix_row_known_values_q8_f16_bf16),
        cmocka_unit_test(test_matrix_row_matches_matmul_with_unit_vector),
        cmocka_unit_test(test_matmul_rows_are_bit_identical_for_every_T),
        cmocka_unit_test(test_matmul_gemm_panel_boundaries_bit_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

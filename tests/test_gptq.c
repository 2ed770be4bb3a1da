/* test_gptq.c - GPTQ: Hessian accumulation, error compensation beating RTN
 * on correlated inputs (a wrong update fails), act-order, dead columns,
 * ragged groups, and the no-correlation case reducing to RTN. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_gptq.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "testutil.h"

static uint64_t rs = 0xfeed1234;
static float urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xFFFFFF) / 16777216.0f;
}
static float nrand(void)
{
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

typedef struct qm {
    cmp_qbuf b;
    void *data, *scales;
    uint8_t *zeros;
} qm;
static void qm_init(qm *m, kn_wformat f, uint32_t rows, uint32_t cols,
                    uint32_t group)
{
    memset(m, 0, sizeof *m);
    m->data = calloc(1, kn_wformat_data_bytes(f, rows, cols));
    m->scales = calloc(1, kn_wformat_scale_bytes(f, rows, cols, group));
    size_t zb = kn_wformat_zero_bytes(f, rows, cols, group);
    m->zeros = zb ? calloc(1, zb) : NULL;
    m->b = (cmp_qbuf){f, rows, cols, f == KN_W_Q8 ? 0 : group, m->data,
                      m->scales, m->zeros};
}
static void qm_free(qm *m)
{
    free(m->data);
    free(m->scales);
    free(m->zeros);
}

/* Correlated inputs: x = z M with a random mixing M plus per-channel
 * scales, so H has strong off-diagonal structure (like real activations). */
static float *correlated_inputs(size_t T, uint32_t cols)
{
    float *M = malloc((size_t)cols * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)cols * cols; i++)
        M[i] = nrand() / sqrtf((float)cols);
    for (uint32_t i = 0; i < cols; i++)
        M[i * cols + i] += 1.0f;
    float *X = malloc(T * cols * sizeof(float));
    float *z = malloc(cols * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        for (uint32_t i = 0; i < cols; i++)
            z[i] = nrand();
        for (uint32_t j = 0; j < cols; j++) {
            double s = 0.0;
            for (uint32_t i = 0; i < cols; i++)
                s += z[i] * M[i * cols + j];
            X[t * cols + j] = (float)s * (1.0f + 3.0f * (float)(j % 7 == 0));
        }
    }
    free(M);
    free(z);
    return X;
}

static float *rand_w(uint32_t rows, uint32_t cols)
{
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = nrand() * 0.05f;
    return w;
}

/* ||X W^T - X Q^T||^2 computed directly (not through H). */
static double direct_output_error(const float *X, size_t T, const float *w,
                                  const float *q, uint32_t rows, uint32_t cols)
{
    double e = 0.0;
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = 0; r < rows; r++) {
            double s = 0.0;
            for (uint32_t c = 0; c < cols; c++)
                s += (double)X[t * cols + c] * ((double)w[r * cols + c] - q[r * cols + c]);
            e += s * s;
        }
    return e;
}

static void test_hessian_accumulates_x_transpose_x(void **state)
{
    (void)state;
    uint32_t cols = 37;
    size_t T = 150; /* not a multiple of the 64-token chunk */
    float *X = correlated_inputs(T, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    cmp_hessian_add(&h, X, 100);
    cmp_hessian_add(&h, X + 100 * cols, T - 100);
    assert_int_equal(h.n, T);
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t j = i; j < cols; j++) {
            double s = 0.0;
            for (size_t t = 0; t < T; t++)
                s += (double)X[t * cols + i] * X[t * cols + j];
            assert_float_equal(h.h[i * cols + j], s, 1e-9 * (1.0 + fabs(s)));
        }
    /* Output error through H equals the direct one. */
    float *w = rand_w(5, cols), *q = rand_w(5, cols);
    double a = cmp_hessian_output_error(&h, w, q, 5);
    double b = direct_output_error(X, T, w, q, 5, cols);
    assert_float_equal(a, b, 1e-6 * b);
    free(w);
    free(q);
    cmp_hessian_free(&h);
    free(X);
}

/* GPTQ must reduce the output error well below RTN's on correlated inputs;
 * without the error feedback (or with a wrong sign) it cannot. */
static void check_beats_rtn(kn_wformat f, uint32_t g, int act_order,
                            uint32_t cols, double max_ratio)
{
    uint32_t rows = 48;
    size_t T = 512;
    float *X = correlated_inputs(T, cols);
    float *w = rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    cmp_hessian_add(&h, X, T);
    qm a, b;
    qm_init(&a, f, rows, cols, g);
    qm_init(&b, f, rows, cols, g);
    assert_int_equal(cmp_quant_matrix(w, NULL, &a.b, NULL), MC_OK);
    cmp_gptq_opts o = {0.01, act_order, 128, 0};
    float *dg = malloc((size_t)rows * cols * sizeof(float));
    float *dr = malloc((size_t)rows * cols * sizeof(float));
    assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, dg, NULL, NULL), MC_OK);
    cmp_dequant_matrix(&a.b, dr);
    double er = direct_output_error(X, T, w, dr, rows, cols);
    double eg = direct_output_error(X, T, w, dg, rows, cols);
    print_message("fmt %d g %u act %d cols %u: rtn %.4g gptq %.4g ratio %.3f\n",
                  f, g, act_order, cols, er, eg, eg / er);
    assert_true(eg < max_ratio * er);
    /* deq output is what the stored layout says, through the kernels. */
    kn_matrix km = cmp_qbuf_matrix(&b.b);
    float *row = malloc(cols * sizeof(float));
    for (uint32_t r = 0; r < rows; r++) {
        kn_matrix_row(&km, r, row);
        assert_memory_equal(row, dg + (size_t)r * cols, cols * sizeof(float));
    }
    /* Refitting the scales never raises the error (after GPTQ) and lowers
     * RTN's; the refit layout still dequantizes to what it reports. */
    assert_int_equal(cmp_gptq_refit_scales(w, &h, &b.b, dg, NULL), MC_OK);
    double ef = direct_output_error(X, T, w, dg, rows, cols);
    assert_int_equal(cmp_gptq_refit_scales(w, &h, &a.b, dr, NULL), MC_OK);
    double erf = direct_output_error(X, T, w, dr, rows, cols);
    print_message("  refit: gptq %.4g -> %.4g, rtn %.4g -> %.4g\n", eg, ef, er,
                  erf);
    assert_true(ef <= eg * (1.0 + 1e-6));
    assert_true(erf < er);
    km = cmp_qbuf_matrix(&b.b);
    for (uint32_t r = 0; r < rows; r++) {
        kn_matrix_row(&km, r, row);
        assert_memory_equal(row, dg + (size_t)r * cols, cols * sizeof(float));
    }
    free(row);
    free(dg);
    free(dr);
    qm_free(&a);
    qm_free(&b);
    cmp_hessian_free(&h);
    free(X);
    free(w);
}

static void test_gptq_beats_rtn_int8_per_channel(void **state)
{
    (void)state;
    check_beats_rtn(KN_W_Q8, 0, 0, 160, 0.7);
}

static void test_gptq_beats_rtn_int4_ragged_groups(void **state)
{
    (void)state;
    check_beats_rtn(KN_W_Q4, 32, 0, 172, 0.7);
    check_beats_rtn(KN_W_Q4, 64, 0, 172, 0.7);
    check_beats_rtn(KN_W_Q4S, 128, 0, 172, 0.7);
}

static void test_gptq_act_order_with_static_groups_beats_rtn(void **state)
{
    (void)state;
    check_beats_rtn(KN_W_Q4, 32, 1, 172, 0.7);
    check_beats_rtn(KN_W_Q8, 0, 1, 150, 0.7);
}

/* Dead inputs (always zero) give zero weights and no NaN; the rest is
 * still compensated. */
static void test_gptq_dead_columns_become_zero(void **state)
{
    (void)state;
    uint32_t rows = 8, cols = 64;
    size_t T = 256;
    float *X = correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++) {
        X[t * cols + 5] = 0.0f;
        X[t * cols + 40] = 0.0f;
    }
    float *w = rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    cmp_hessian_add(&h, X, T);
    for (int ao = 0; ao < 2; ao++) {
        qm b;
        qm_init(&b, KN_W_Q4, rows, cols, 32);
        float *d = malloc((size_t)rows * cols * sizeof(float));
        cmp_gptq_opts o = {0.01, ao, 128, 0};
        assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, d, NULL, NULL), MC_OK);
        for (uint32_t r = 0; r < rows; r++) {
            assert_true(d[r * cols + 5] == 0.0f);
            assert_true(d[r * cols + 40] == 0.0f);
            for (uint32_t c = 0; c < cols; c++)
                assert_true(isfinite(d[r * cols + c]));
        }
        free(d);
        qm_free(&b);
    }
    /* No tokens at all: every column dead, all zero, still MC_OK. */
    cmp_hessian e;
    assert_int_equal(cmp_hessian_init(&e, cols, NULL), MC_OK);
    qm b;
    qm_init(&b, KN_W_Q8, rows, cols, 0);
    float *d = malloc((size_t)rows * cols * sizeof(float));
    assert_int_equal(cmp_gptq_quantize(w, &e, NULL, &b.b, d, NULL, NULL), MC_OK);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        assert_true(d[i] == 0.0f);
    free(d);
    qm_free(&b);
    cmp_hessian_free(&e);
    cmp_hessian_free(&h);
    free(X);
    free(w);
}

/* With a diagonal Hessian there is nothing to compensate across columns:
 * GPTQ (per-row Q8, whose parameters do not depend on updates) must give
 * exactly RTN. */
static void test_gptq_with_diagonal_hessian_equals_rtn(void **state)
{
    (void)state;
    uint32_t rows = 6, cols = 40;
    float *w = rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    for (uint32_t j = 0; j < cols; j++)
        h.h[j * cols + j] = 1.0 + j;
    h.n = 1;
    qm a, b;
    qm_init(&a, KN_W_Q8, rows, cols, 0);
    qm_init(&b, KN_W_Q8, rows, cols, 0);
    assert_int_equal(cmp_quant_matrix(w, NULL, &a.b, NULL), MC_OK);
    assert_int_equal(cmp_gptq_quantize(w, &h, NULL, &b.b, NULL, NULL, NULL), MC_OK);
    assert_memory_equal(a.data, b.data, (size_t)rows * cols);
    assert_memory_equal(a.scales, b.scales, rows * sizeof(float));
    qm_free(&a);
    qm_free(&b);
    cmp_hessian_free(&h);
    free(w);
}

/* An indefinite "Hessian" (negative diagonal) fails cleanly after the
 * dampening is raised, naming the Hessian. */
static void test_gptq_rejects_indefinite_hessian(void **state)
{
    (void)state;
    uint32_t rows = 2, cols = 8;
    float *w = rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    for (uint32_t j = 0; j < cols; j++)
        h.h[j * cols + j] = j == 3 ? -1e9 : 1.0;
    qm b;
    qm_init(&b, KN_W_Q8, rows, cols, 0);
    mc_error e;
    assert_int_equal(cmp_gptq_quantize(w, &h, NULL, &b.b, NULL, NULL, &e),
                     MC_ERR_NONFINITE);
    assert_string_equal(e.field, "hessian");
    qm_free(&b);
    cmp_hessian_free(&h);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hessian_accumulates_x_transpose_x),
        cmocka_unit_test(test_gptq_beats_rtn_int8_per_channel),
        cmocka_unit_test(test_gptq_beats_rtn_int4_ragged_groups),
        cmocka_unit_test(test_gptq_act_order_with_static_groups_beats_rtn),
        cmocka_unit_test(test_gptq_dead_columns_become_zero),
        cmocka_unit_test(test_gptq_with_diagonal_hessian_equals_rtn),
        cmocka_unit_test(test_gptq_rejects_indefinite_hessian),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cuda_calib.c - calibration statistics on the GPU (cmp_gpu_stats.h,
 * kernels/cuda/stats.cu) against the CPU path: the sums Hq, Hf and C agree
 * to 1e-5 of the largest value (both are float products over 128-token
 * chunks added in double, in different orders: each element carries one
 * chunk-long float dot product's error), and a whole calibration with
 * --calib-device cuda matches the CPU one (summed error to 1e-3 relative,
 * held-out KLD to 2 %).
 * Without a device (or CUDA) the GPU path is refused with a message and
 * the comparisons skip, saying so. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_calib.h"
#include "cmp_eval.h"
#include "cmp_gpu_stats.h"
#include "kn_gram.h"
#include "rt_model.h"
#include "testutil.h"

static int have_gpu(void)
{
    if (cmp_gpu_stats_available())
        return 1;
    printf("[  SKIP    ] no CUDA device (or a build without CUDA): the GPU "
           "statistics are not compared\n");
    return 0;
}

/* Asking for the GPU without one is an error that says so. */
static void test_cuda_calib_refused_without_device(void **state)
{
    (void)state;
    if (cmp_gpu_stats_available())
        skip(); /* a device is here: the other tests cover it */
    cmp_gpu_stats *g = NULL;
    mc_error e;
    assert_int_equal(cmp_gpu_stats_create(64, 16, 1, 0, &g, &e), MC_ERR_UNSUPPORTED);
    assert_null(g);
    char *path;
    int32_t *tok;
    size_t *off;
    rt_model *m = tu_fixture_open("llama", 3, 20, &path, &tok, &off);
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q8;
    o.method = CMP_QM_GPTQ;
    o.stats_on_gpu = 1;
    cmp_calib_result *r = NULL;
    assert_int_equal(cmp_calib_run(m, tok, off, 3, &o, &r, &e), MC_ERR_UNSUPPORTED);
    assert_null(r);
    assert_non_null(strstr(e.message, "CUDA"));
    tu_fixture_close(m, path, tok, off);
}

static double max_abs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

/* The three sums over three sequences, CPU vs GPU, with float products
 * or (bf16) bfloat16 products on both. */
static void sums_match_cpu(int bf16)
{
    if (!have_gpu())
        skip();
    uint32_t cols = 96;
    size_t T = 50, nseq = 3;
    tu_rng g = {31};
    float *xf = malloc(T * cols * sizeof(float)), *xq = malloc(T * cols * sizeof(float));
    cmp_hessian hq, hf, gq, gf;
    assert_int_equal(cmp_hessian_init(&hq, cols, NULL), MC_OK);
    assert_int_equal(cmp_hessian_init(&hf, cols, NULL), MC_OK);
    assert_int_equal(cmp_hessian_init(&gq, cols, NULL), MC_OK);
    assert_int_equal(cmp_hessian_init(&gf, cols, NULL), MC_OK);
    hq.bf16 = hf.bf16 = bf16;
    double *c = calloc((size_t)cols * cols, sizeof(double));
    double *gc = calloc((size_t)cols * cols, sizeof(double));
    cmp_gpu_stats *gs = NULL;
    mc_error e;
    assert_int_equal(cmp_gpu_stats_create(cols, T, 1, bf16, &gs, &e), MC_OK);
    for (size_t s = 0; s < nseq; s++) {
        for (size_t i = 0; i < T * cols; i++) {
            xf[i] = 2.0f * tu_rng_f(&g) - 1.0f;
            xq[i] = xf[i] + 0.05f * (tu_rng_f(&g) - 0.5f);
        }
        cmp_hessian_add(&hf, xf, T);
        cmp_hessian_add(&hq, xq, T);
        for (size_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < cols; i++)
                for (uint32_t j = 0; j < cols; j++)
                    c[(size_t)i * cols + j] +=
                        bf16 ? (double)kn_bf16_round(xf[t * cols + i]) *
                                   kn_bf16_round(xq[t * cols + j])
                             : (double)xf[t * cols + i] * xq[t * cols + j];
        assert_int_equal(cmp_gpu_stats_add(gs, 0, xf, T), MC_OK);
        assert_int_equal(cmp_gpu_stats_add(gs, 1, xq, T), MC_OK);
    }
    assert_int_equal(cmp_gpu_stats_read(gs, &gq, &gf, gc, &e), MC_OK);
    double scale = max_abs(c, (size_t)cols * cols), worst = 0.0;
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t j = 0; j < cols; j++) {
            worst = fmax(worst, fabs(cmp_hessian_get(&hq, i, j) - cmp_hessian_get(&gq, i, j)));
            worst = fmax(worst, fabs(cmp_hessian_get(&hf, i, j) - cmp_hessian_get(&gf, i, j)));
            worst = fmax(worst, fabs(c[(size_t)i * cols + j] - gc[(size_t)i * cols + j]));
        }
    printf("# CPU vs GPU sums (%s products): max |diff| %.3g of max |value| %.3g\n",
           bf16 ? "bfloat16" : "float", worst, scale);
    assert_true(worst <= 1e-5 * scale);
    cmp_gpu_stats_free(gs);
    cmp_hessian_free(&hq);
    cmp_hessian_free(&hf);
    cmp_hessian_free(&gq);
    cmp_hessian_free(&gf);
    free(c);
    free(gc);
    free(xf);
    free(xq);
}

static void test_cuda_calib_sums_match_cpu(void **state)
{
    (void)state;
    sums_match_cpu(0);
}

static void test_cuda_calib_bf16_sums_match_cpu(void **state)
{
    (void)state;
    sums_match_cpu(1);
}

static double calibrate(const rt_model *m, const int32_t *tok, const size_t *off,
                        size_t nseq, int gpu, cmp_eval_report *rep)
{
    cmp_calib_opts o = tu_calib_opts_best_q4(32, 2);
    o.stats_on_gpu = gpu;
    cmp_calib_result *r = NULL;
    mc_error e;
    if (cmp_calib_run(m, tok, off, nseq, &o, &r, &e) != MC_OK) {
        char buf[2048];
        fail_msg("%s", mc_error_format(&e, buf, sizeof buf));
    }
    double sum = 0.0;
    for (size_t i = 0; i < (size_t)r->layers * CMP_LIN_COUNT; i++)
        sum += r->t[i].err;
    *rep = r->heldout;
    cmp_calib_result_free(r);
    return sum;
}

/* A whole calibration: GPU statistics give the CPU's result. */
static void test_cuda_calib_matches_cpu_calibration(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    char *path;
    int32_t *tok;
    size_t *off;
    rt_model *m = tu_fixture_open("llama", 12, 40, &path, &tok, &off);
    cmp_eval_report rc, rg;
    double ec = calibrate(m, tok, off, 12, 0, &rc);
    double eg = calibrate(m, tok, off, 12, 1, &rg);
    printf("# summed error CPU %.9f GPU %.9f; held-out KLD %.6f / %.6f\n", ec, eg,
           rc.kld_mean, rg.kld_mean);
    assert_true(fabs(ec - eg) <= 1e-3 * ec);
    assert_true(fabs(rc.kld_mean - rg.kld_mean) <= 0.02 * rc.kld_mean + 1e-9);
    tu_fixture_close(m, path, tok, off);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_calib_refused_without_device),
        cmocka_unit_test(test_cuda_calib_sums_match_cpu),
        cmocka_unit_test(test_cuda_calib_bf16_sums_match_cpu),
        cmocka_unit_test(test_cuda_calib_matches_cpu_calibration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

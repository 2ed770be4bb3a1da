/* test_awq.c - AWQ: folding keeps the full-precision function, the scale
 * search beats plain RTN on inputs with salient channels, its error equals
 * the directly measured output error, clipping never hurts, and the work
 * space byte counts match measured allocation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_awq.h"
#include "cmp_qform.h"
#include "cmp_gptq.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "mc_alloc.h"
#include "testutil.h"

static uint64_t rs = 0xa5a5a5a5;
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
static float *randn(size_t n, float std)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = nrand() * std;
    return p;
}

/* Activations with a few salient channels (10-30x larger), as in LLMs. */
static float *salient_inputs(size_t T, uint32_t cols)
{
    float *X = randn(T * cols, 1.0f);
    for (size_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < cols; j += 17)
            X[t * cols + j] *= 10.0f + (float)(j % 3) * 10.0f;
    return X;
}

static void xabs_mean(const float *X, size_t T, uint32_t cols, float *out)
{
    for (uint32_t j = 0; j < cols; j++) {
        double s = 0.0;
        for (size_t t = 0; t < T; t++)
            s += fabs(X[t * cols + j]);
        out[j] = (float)(s / (double)T);
    }
}

/* rmsnorm(x) * (g / s) @ (W diag(s))^T == rmsnorm(x) * g @ W^T, and
 * down(silu(gate) * up / s) with down diag(s) == the original. */
static void test_awq_folding_preserves_function(void **state)
{
    (void)state;
    uint32_t hidden = 48, ffn = 40, T = 5;
    float *x = randn((size_t)T * hidden, 1.0f);
    float *g = randn(hidden, 1.0f);
    float *W = randn((size_t)ffn * hidden, 0.1f);
    float *U = randn((size_t)ffn * hidden, 0.1f);
    float *D = randn((size_t)hidden * ffn, 0.1f);
    float s1[48], s2[40];
    for (uint32_t j = 0; j < hidden; j++)
        s1[j] = 0.1f + 3.0f * urand();
    for (uint32_t j = 0; j < ffn; j++)
        s2[j] = 0.1f + 3.0f * urand();

    float xb[5 * 48], gt[5 * 40], up[5 * 40], y1[5 * 48], y2[5 * 48];
    kn_matrix mW = {KN_W_F32, ffn, hidden, W, NULL, NULL, 0, KN_LAYOUT_ROWS};
    kn_matrix mU = {KN_W_F32, ffn, hidden, U, NULL, NULL, 0, KN_LAYOUT_ROWS};
    kn_matrix mD = {KN_W_F32, hidden, ffn, D, NULL, NULL, 0, KN_LAYOUT_ROWS};
    kn_ref_rmsnorm(xb, x, g, T, hidden, 1e-5f);
    kn_ref_matmul(&mW, xb, T, gt, NULL);
    kn_ref_matmul(&mU, xb, T, up, NULL);
    kn_ref_silu_mul(gt, up, (size_t)T * ffn);
    kn_ref_matmul(&mD, gt, T, y1, NULL);

    cmp_awq_div_vec(g, s1, hidden);
    cmp_awq_scale_cols(W, ffn, hidden, s1);
    cmp_awq_scale_cols(U, ffn, hidden, s1);
    cmp_awq_div_rows(U, ffn, hidden, s2);
    cmp_awq_scale_cols(D, hidden, ffn, s2);
    kn_ref_rmsnorm(xb, x, g, T, hidden, 1e-5f);
    kn_ref_matmul(&mW, xb, T, gt, NULL);
    kn_ref_matmul(&mU, xb, T, up, NULL);
    kn_ref_silu_mul(gt, up, (size_t)T * ffn);
    kn_ref_matmul(&mD, gt, T, y2, NULL);
    for (uint32_t i = 0; i < T * hidden; i++)
        assert_float_equal(y1[i], y2[i], 1e-5 * (1.0 + fabsf(y1[i])));
    free(x);
    free(g);
    free(W);
    free(U);
    free(D);
}

typedef struct setup {
    uint32_t rows, cols;
    size_t T;
    float *X, *W, *xa;
    cmp_hessian h;
} setup;

static void mk(setup *s, uint32_t rows, uint32_t cols, size_t T)
{
    s->rows = rows;
    s->cols = cols;
    s->T = T;
    s->X = salient_inputs(T, cols);
    s->W = randn((size_t)rows * cols, 0.05f);
    s->xa = malloc(cols * sizeof(float));
    xabs_mean(s->X, T, cols, s->xa);
    assert_int_equal(cmp_hessian_init(&s->h, cols, NULL), MC_OK);
    cmp_hessian_add(&s->h, s->X, T);
}
static void rm(setup *s)
{
    free(s->X);
    free(s->W);
    free(s->xa);
    cmp_hessian_free(&s->h);
}

/* sum_t ||x W^T - (x / s) Qs^T||^2 measured directly. */
static double direct_err(const setup *s, const float *Qs, const float *sc)
{
    double e = 0.0;
    for (size_t t = 0; t < s->T; t++)
        for (uint32_t r = 0; r < s->rows; r++) {
            double a = 0.0, b = 0.0;
            for (uint32_t c = 0; c < s->cols; c++) {
                double x = s->X[t * s->cols + c];
                a += x * s->W[(size_t)r * s->cols + c];
                b += x / sc[c] * Qs[(size_t)r * s->cols + c];
            }
            e += (a - b) * (a - b);
        }
    return e;
}

static void test_awq_search_beats_rtn_on_salient_channels(void **state)
{
    (void)state;
    setup s;
    mk(&s, 40, 128, 300);
    kn_wformat fs[2] = {KN_W_Q4, KN_W_Q8};
    for (int f = 0; f < 2; f++) {
        float sc[128];
        double alpha = -1, e = 0, e0 = 0;
        cmp_awq_linear l = {s.W, s.rows};
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, NULL, sc,
                                        &alpha, &e, &e0, NULL), MC_OK);
        print_message("fmt %d alpha %.2f err %.4g rtn %.4g\n", fs[f], alpha, e, e0);
        assert_true(alpha > 0.0);
        assert_true(e < 0.8 * e0);
        /* The reported error is the real output error of the scaled,
         * quantized weight applied to x / s. */
        float *Qs = malloc((size_t)s.rows * s.cols * sizeof(float));
        memcpy(Qs, s.W, (size_t)s.rows * s.cols * sizeof(float));
        cmp_awq_scale_cols(Qs, s.rows, s.cols, sc);
        cmp_quant_fake(fs[f], 32, Qs, NULL, s.rows, s.cols, Qs);
        double d = direct_err(&s, Qs, sc);
        assert_float_equal(d, e, 1e-6 * d);
        free(Qs);
    }
    rm(&s);
}

/* With uniform inputs (no salient channel) scaling has little to gain, and
 * the search never returns anything worse than alpha 0. */
static void test_awq_search_never_worse_than_rtn(void **state)
{
    (void)state;
    uint32_t rows = 16, cols = 64;
    size_t T = 200;
    float *X = randn(T * cols, 1.0f), *W = randn((size_t)rows * cols, 0.05f);
    float xa[64], sc[64];
    xabs_mean(X, T, cols, xa);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    cmp_hessian_add(&h, X, T);
    cmp_awq_linear l = {W, rows};
    double e, e0;
    assert_int_equal(cmp_awq_search(&h, xa, &l, 1, KN_W_Q4S, 64, NULL, sc, NULL, &e,
                                    &e0, NULL), MC_OK);
    assert_true(e <= e0);
    cmp_hessian_free(&h);
    free(X);
    free(W);
}

/* Clipping in the scaled space never increases the output error and helps
 * when rows have outliers. */
static void test_awq_clip_reduces_error(void **state)
{
    (void)state;
    setup s;
    mk(&s, 24, 96, 200);
    for (size_t i = 0; i < (size_t)s.rows * s.cols; i += 29)
        s.W[i] *= 6.0f;
    float ones[96];
    for (int j = 0; j < 96; j++)
        ones[j] = 1.0f;
    float *q0 = malloc((size_t)s.rows * s.cols * sizeof(float));
    float *wc = malloc((size_t)s.rows * s.cols * sizeof(float));
    cmp_quant_fake(KN_W_Q4, 32, s.W, NULL, s.rows, s.cols, q0);
    memcpy(wc, s.W, (size_t)s.rows * s.cols * sizeof(float));
    assert_int_equal(cmp_awq_clip(&s.h, wc, s.rows, KN_W_Q4, 32, NULL), MC_OK);
    cmp_quant_fake(KN_W_Q4, 32, wc, NULL, s.rows, s.cols, wc);
    double e0 = direct_err(&s, q0, ones), e1 = direct_err(&s, wc, ones);
    print_message("clip: %.4g -> %.4g\n", e0, e1);
    assert_true(e1 < e0);
    free(q0);
    free(wc);
    rm(&s);
}

/* diag(1/s) H diag(1/s) is the Hessian of x / s. */
static void test_awq_scaled_hessian_matches_scaled_inputs(void **state)
{
    (void)state;
    uint32_t cols = 20;
    size_t T = 70;
    float *X = randn(T * cols, 1.0f), sc[20];
    for (uint32_t j = 0; j < cols; j++)
        sc[j] = 0.5f + urand();
    cmp_hessian h, hs, hx;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    assert_int_equal(cmp_hessian_init(&hs, cols, NULL), MC_OK);
    assert_int_equal(cmp_hessian_init(&hx, cols, NULL), MC_OK);
    cmp_hessian_add(&h, X, T);
    cmp_awq_scale_hessian(&h, sc, &hs);
    for (size_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < cols; j++)
            X[t * cols + j] /= sc[j];
    cmp_hessian_add(&hx, X, T);
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t j = i; j < cols; j++)
            assert_float_equal(cmp_hessian_get(&hs, i, j), cmp_hessian_get(&hx, i, j),
                               1e-5 * (1.0 + fabs(cmp_hessian_get(&hx, i, j))));
    cmp_hessian_free(&h);
    cmp_hessian_free(&hs);
    cmp_hessian_free(&hx);
    free(X);
}

/* Peak bytes the search and the clipping allocate (usable sizes, tracked
 * by mc_alloc) cover their formulas and exceed them by no more than
 * malloc's rounding (every block here is below the mmap threshold);
 * scaling a Hessian allocates nothing. */
static int64_t measure(int64_t *live0)
{
    int64_t peak = mc_alloc_peak_bytes() - *live0;
    assert_int_equal(mc_alloc_live_bytes(), *live0); /* nothing left */
    mc_alloc_track(0);
    return peak;
}
static void start(int64_t *live0)
{
    mc_alloc_track(1);
    *live0 = mc_alloc_live_bytes();
    mc_alloc_reset_peak();
}

static void test_awq_work_bytes_match_measured_peak(void **state)
{
    (void)state;
    setup s;
    mk(&s, 40, 128, 150);
    float *w2 = randn((size_t)20 * s.cols, 0.05f);
    cmp_awq_linear l[2] = {{s.W, s.rows}, {w2, 20}};
    float sc[128];
    int64_t live0;
    start(&live0);
    assert_int_equal(cmp_awq_search(&s.h, s.xa, l, 2, KN_W_Q4, 32, NULL, sc, NULL,
                                    NULL, NULL, NULL), MC_OK);
    int64_t peak = measure(&live0);
    uint64_t f = cmp_awq_search_work_bytes(40, 128, 1, 0);
    print_message("search: formula %llu, measured %lld\n", (unsigned long long)f,
                  (long long)peak);
    assert_true(f == 128 * 4 + 40 * 8 + 40 * 128 * 4 + cmp_qform_work_doubles(128, 40) * 8);
    assert_true(peak >= (int64_t)f && peak <= (int64_t)f + 4 * 32);

    cmp_hessian hs;
    assert_int_equal(cmp_hessian_init(&hs, s.cols, NULL), MC_OK);
    start(&live0);
    cmp_awq_scale_hessian(&s.h, sc, &hs);
    assert_int_equal(measure(&live0), 0);

    kn_wformat fs[3] = {KN_W_Q4, KN_W_Q4S, KN_W_Q8};
    uint32_t gs[3] = {32, 128, 0};
    for (int k = 0; k < 3; k++) {
        float *wc = malloc((size_t)s.rows * s.cols * sizeof(float));
        memcpy(wc, s.W, (size_t)s.rows * s.cols * sizeof(float));
        start(&live0);
        assert_int_equal(cmp_awq_clip(&hs, wc, s.rows, fs[k], gs[k], NULL), MC_OK);
        peak = measure(&live0);
        f = cmp_awq_clip_work_bytes(s.cols, fs[k], gs[k]);
        assert_true(f == (fs[k] == KN_W_Q8 ? s.cols : gs[k]) * 12ull);
        assert_true(peak >= (int64_t)f && peak <= (int64_t)f + 2 * 32);
        free(wc);
    }
    /* a 70B model's down_proj (8192 x 28672): the float copy is a 64 MiB
     * chunk of rows, not the whole 0.9 GiB matrix */
    uint64_t c = CMP_GPTQ_CHUNK_BYTES / (28672 * 4);
    assert_true(cmp_awq_search_work_bytes(8192, 28672, 1, 0) ==
                28672 * 4 + 8192 * 8 + c * 28672 * 4 +
                    cmp_qform_work_doubles(28672, (uint32_t)c) * 8);
    cmp_hessian_free(&hs);
    free(w2);
    rm(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq_folding_preserves_function),
        cmocka_unit_test(test_awq_search_beats_rtn_on_salient_channels),
        cmocka_unit_test(test_awq_search_never_worse_than_rtn),
        cmocka_unit_test(test_awq_clip_reduces_error),
        cmocka_unit_test(test_awq_scaled_hessian_matches_scaled_inputs),
        cmocka_unit_test(test_awq_work_bytes_match_measured_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

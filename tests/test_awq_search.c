/* test_awq_search.c - AWQ's alpha search at the machine's speed (issue 17):
 * on a pool of any size it returns the same bits as on one thread; its
 * full grid picks the first smallest of the errors measured point by point;
 * the coarse walk picks the smallest of the points it visits (the full
 * grid's pick where the error is unimodal); its work space with threads
 * matches the formula the memory plan uses; the output error's AVX2 path
 * gives the scalar path's bits; the row sample (sample_rows) measures
 * every stride-th row and scales it, and leaves small linears whole. */
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

static tu_rng g_rng = {0x5eed17};
static float rnd(void) /* uniform in [-1, 1) */
{
    return tu_rng_f(&g_rng);
}

/* Two linears (45 and 13 rows: neither a whole number of the search's
 * 8-row blocks) over 96 inputs with salient channels, and their Hessian. */
typedef struct setup {
    uint32_t cols;
    float *w[2];
    uint32_t rows[2];
    float xa[96];
    cmp_hessian h;
} setup;

static void mk(setup *s)
{
    s->cols = 96;
    s->rows[0] = 45;
    s->rows[1] = 13;
    size_t T = 160;
    float *X = malloc(T * s->cols * sizeof(float));
    for (size_t i = 0; i < T * s->cols; i++)
        X[i] = rnd() * ((i % s->cols) % 11 == 0 ? 20.0f : 1.0f);
    for (uint32_t j = 0; j < s->cols; j++) {
        double a = 0.0;
        for (size_t t = 0; t < T; t++)
            a += fabsf(X[t * s->cols + j]);
        s->xa[j] = (float)(a / (double)T);
    }
    for (int i = 0; i < 2; i++) {
        s->w[i] = malloc((size_t)s->rows[i] * s->cols * sizeof(float));
        for (size_t k = 0; k < (size_t)s->rows[i] * s->cols; k++)
            s->w[i][k] = 0.05f * rnd();
    }
    assert_int_equal(cmp_hessian_init(&s->h, s->cols, NULL), MC_OK);
    cmp_hessian_add(&s->h, X, T);
    free(X);
}

static void rm(setup *s)
{
    free(s->w[0]);
    free(s->w[1]);
    cmp_hessian_free(&s->h);
}

typedef struct found {
    float sc[96];
    double alpha, e, e0;
} found;

static void search(setup *s, kn_wformat f, kn_pool *pool, int coarse,
                   found *out)
{
    cmp_awq_linear l[2] = {{s->w[0], s->rows[0]}, {s->w[1], s->rows[1]}};
    cmp_awq_search_opts so = {pool, coarse, 0};
    memset(out, 0, sizeof *out);
    assert_int_equal(cmp_awq_search(&s->h, s->xa, l, 2, f, 32, &so, out->sc,
                                    &out->alpha, &out->e, &out->e0, NULL),
                     MC_OK);
}

static void test_awq_search_same_bits_on_any_pool(void **state)
{
    (void)state;
    setup s;
    mk(&s);
    kn_wformat fs[2] = {KN_W_Q4, KN_W_Q8};
    int sizes[3] = {2, 3, 5};
    for (int f = 0; f < 2; f++)
        for (int coarse = 0; coarse < 2; coarse++) {
            found one, many;
            search(&s, fs[f], NULL, coarse, &one);
            assert_true(one.alpha > 0.0); /* a real pick, not alpha 0 */
            for (int p = 0; p < 3; p++) {
                kn_pool *pool = tu_pool_warm(sizes[p]);
                search(&s, fs[f], pool, coarse, &many);
                kn_pool_free(pool);
                assert_memory_equal(one.sc, many.sc, sizeof one.sc);
                assert_memory_equal(&one.e, &many.e, sizeof one.e);
                assert_memory_equal(&one.e0, &many.e0, sizeof one.e0);
                assert_true(one.alpha == many.alpha);
            }
        }
    rm(&s);
}

/* The error of grid point k measured here, independently of the search:
 * scales max(xa^alpha, 1e-4) over sqrt(max min), then W against
 * Q(W diag(s)) / s on the Hessian, the linears summed in order. */
static double point_error(setup *s, kn_wformat f, int k)
{
    float sc[96];
    float mx = 0.0f, mn = INFINITY;
    for (uint32_t j = 0; j < s->cols; j++) {
        float v = k == 0 ? 1.0f
                         : powf(s->xa[j], (float)(CMP_AWQ_ALPHA_STEP * k));
        sc[j] = v < 1e-4f ? 1e-4f : v;
        mx = fmaxf(mx, sc[j]);
        mn = fminf(mn, sc[j]);
    }
    for (uint32_t j = 0; j < s->cols; j++)
        sc[j] /= sqrtf(mx * mn);
    double e = 0.0;
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)s->rows[i] * s->cols;
        float *q = malloc(n * sizeof(float));
        memcpy(q, s->w[i], n * sizeof(float));
        cmp_awq_scale_cols(q, s->rows[i], s->cols, sc);
        cmp_quant_fake(f, 32, q, NULL, s->rows[i], s->cols, q);
        for (size_t a = 0; a < n; a++)
            q[a] /= sc[a % s->cols];
        e += cmp_hessian_output_error(&s->h, s->w[i], q, s->rows[i]);
        free(q);
    }
    return e;
}

static void test_awq_search_picks_the_first_smallest_point(void **state)
{
    (void)state;
    setup s;
    mk(&s);
    kn_wformat fs[3] = {KN_W_Q4, KN_W_Q4S, KN_W_Q8};
    for (int f = 0; f < 3; f++) {
        double e[CMP_AWQ_ALPHAS];
        for (int k = 0; k < CMP_AWQ_ALPHAS; k++)
            e[k] = point_error(&s, fs[f], k);
        /* full grid: the first smallest of all 20 */
        int kf = 0;
        for (int k = 1; k < CMP_AWQ_ALPHAS; k++)
            if (e[k] < e[kf])
                kf = k;
        /* coarse: the first smallest of 0, 3, .., 18 and the points
         * within two steps of the best of those */
        int kc = 0, seen[CMP_AWQ_ALPHAS] = {0};
        for (int k = 0; k < CMP_AWQ_ALPHAS; k += CMP_AWQ_COARSE_STEP) {
            seen[k] = 1;
            if (e[k] < e[kc])
                kc = k;
        }
        for (int k = kc - 2; k <= kc + 2; k++)
            if (k >= 0 && k < CMP_AWQ_ALPHAS)
                seen[k] = 1;
        int kcb = 0;
        for (int k = 1; k < CMP_AWQ_ALPHAS; k++)
            if (seen[k] && e[k] < e[kcb])
                kcb = k;
        found full, coarse;
        search(&s, fs[f], NULL, 0, &full);
        search(&s, fs[f], NULL, 1, &coarse);
        print_message("fmt %d: full alpha %.2f (%.6g), coarse %.2f (%.6g), "
                      "rtn %.6g\n", fs[f], full.alpha, full.e, coarse.alpha,
                      coarse.e, full.e0);
        assert_true(full.alpha == CMP_AWQ_ALPHA_STEP * kf);
        assert_true(full.e == e[kf]);
        assert_true(full.e0 == e[0] && coarse.e0 == e[0]);
        assert_true(coarse.alpha == CMP_AWQ_ALPHA_STEP * kcb);
        assert_true(coarse.e == e[kcb]);
        assert_true(coarse.e >= full.e);
        /* unimodal along the grid: the coarse walk finds the same point */
        int uni = 1;
        for (int k = 1; k < CMP_AWQ_ALPHAS; k++)
            if ((k <= kf && e[k] > e[k - 1]) || (k > kf && e[k] < e[k - 1]))
                uni = 0;
        if (uni)
            assert_true(kcb == kf);
    }
    rm(&s);
}

/* With a pool, every thread has its own float copy and difference rows;
 * the bytes the search allocates (usable sizes tracked by mc_alloc) cover
 * the formula the memory plan counts and exceed it by no more than
 * malloc's rounding of its four blocks. */
static void test_awq_search_work_bytes_count_every_thread(void **state)
{
    (void)state;
    setup s;
    mk(&s);
    int sizes[3] = {1, 2, 3};
    for (int p = 0; p < 3; p++) {
        kn_pool *pool = sizes[p] > 1 ? tu_pool_warm(sizes[p]) : NULL;
        found r;
        mc_alloc_track(1);
        int64_t live0 = mc_alloc_live_bytes();
        mc_alloc_reset_peak();
        search(&s, KN_W_Q4, pool, 0, &r);
        int64_t peak = mc_alloc_peak_bytes() - live0;
        assert_int_equal(mc_alloc_live_bytes(), live0);
        mc_alloc_track(0);
        kn_pool_free(pool);
        uint64_t f = cmp_awq_search_work_bytes(45, 96, sizes[p], 0);
        /* one thread copies all 45 rows; with T, whole 8-row blocks:
         * 6 blocks -> 3 (24 rows) each for 2, 2 (16 rows) each for 3 */
        uint64_t c = sizes[p] == 1 ? 45 : sizes[p] == 2 ? 24 : 16;
        assert_true(f == 96 * 4 + 45 * 8 +
                             (uint64_t)sizes[p] * (c * 96 * 4 +
                                                   cmp_qform_work_doubles(96, (uint32_t)c) * 8));
        print_message("threads %d: formula %llu, measured %lld\n", sizes[p],
                      (unsigned long long)f, (long long)peak);
        assert_true(peak >= (int64_t)f && peak <= (int64_t)f + 4 * 32);
    }
    /* a 70B down_proj over 4 threads: the float copies together stay
     * within one CMP_GPTQ_CHUNK_BYTES */
    uint64_t c4 = CMP_GPTQ_CHUNK_BYTES / (28672ull * 4 * 4);
    assert_true(cmp_awq_search_work_bytes(8192, 28672, 4, 0) ==
                28672 * 4 + 8192 * 8 +
                    4 * (c4 * 28672 * 4 + cmp_qform_work_doubles(28672, (uint32_t)c4) * 8));
    rm(&s);
}

/* The output error's AVX2 path (four rows of H at once, kn_lanes.h) gives
 * the bits of the scalar chains: widths with and without a tail of rows
 * of H, blocks of 8 and short ones, rows whose difference is zero (their
 * lanes are skipped) and runs of zero columns (whole rows of H skipped). */
static void test_output_error_avx2_same_bits_as_scalar(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx2()) {
        print_message("skipped: this CPU has no AVX2 (the scalar path is "
                      "the only one)\n");
        return;
    }
    uint32_t widths[4] = {4, 30, 97, 256};
    for (int k = 0; k < 4; k++) {
        uint32_t C = widths[k], R = 21;
        size_t T = 64;
        float *X = malloc(T * C * sizeof(float));
        float *w = malloc((size_t)R * C * sizeof(float));
        float *q = malloc((size_t)R * C * sizeof(float));
        for (size_t i = 0; i < T * C; i++)
            X[i] = rnd();
        for (size_t i = 0; i < (size_t)R * C; i++) {
            w[i] = rnd();
            uint32_t r = (uint32_t)(i / C), c = (uint32_t)(i % C);
            /* row 5 exact; columns 8..15 exact in every row */
            q[i] = r == 5 || (c >= 8 && c < 16) ? w[i] : w[i] + 0.01f * rnd();
        }
        cmp_hessian h;
        assert_int_equal(cmp_hessian_init(&h, C, NULL), MC_OK);
        cmp_hessian_add(&h, X, T);
        double e[2], e0[2];
        for (int sc = 0; sc < 2; sc++) {
            kn_set_force_scalar(sc);
            e[sc] = cmp_hessian_output_error(&h, w, q, R);
            e0[sc] = cmp_hessian_output_error(&h, w, NULL, R);
        }
        kn_set_force_scalar(0);
        print_message("width %u: %.17g %.17g\n", C, e[0], e[1]);
        assert_true(e[0] > 0.0);
        assert_memory_equal(&e[0], &e[1], sizeof e[0]);
        assert_memory_equal(&e0[0], &e0[1], sizeof e0[0]);
        cmp_hessian_free(&h);
        free(X);
        free(w);
        free(q);
    }
}

/* A linear whose rows repeat in fours (row r is base row r / 4): the
 * stride-4 sample sees each base row once, so the sampled search's
 * errors are the whole rows' to rounding and its pick is theirs; with
 * every row distinct the sample's pick stays near the whole rows' and its
 * error estimate close; under 2 * sample_rows rows nothing is sampled
 * (bits equal); and a pool gives the same bits. */
static void test_awq_search_row_sample(void **state)
{
    (void)state;
    setup s;
    mk(&s);
    uint32_t base = 45, rows = 4 * base;
    float *rep4 = malloc((size_t)rows * s.cols * sizeof(float));
    float *big = malloc((size_t)rows * s.cols * sizeof(float));
    assert_non_null(rep4);
    assert_non_null(big);
    for (uint32_t r = 0; r < rows; r++)
        memcpy(rep4 + (size_t)r * s.cols, s.w[0] + (size_t)(r / 4) * s.cols,
               s.cols * sizeof(float));
    for (size_t k = 0; k < (size_t)rows * s.cols; k++)
        big[k] = 0.05f * rnd();
    kn_wformat fs[2] = {KN_W_Q4, KN_W_Q8};
    kn_pool *pool = tu_pool_warm(3);
    for (int f = 0; f < 2; f++) {
        float sc_all[96], sc_smp[96], sc_pool[96];
        double a_all, a_smp, a_pool, e_all, e_smp, e_pool, e0_all, e0_smp, e0_pool;
        /* repeated rows: 180 >= 2 * 45, stride min(4, 180 / 45) = 4 */
        cmp_awq_linear l = {rep4, rows};
        cmp_awq_search_opts all = {NULL, 0, 0}, smp = {NULL, 0, base};
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, &all, sc_all,
                                        &a_all, &e_all, &e0_all, NULL), MC_OK);
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, &smp, sc_smp,
                                        &a_smp, &e_smp, &e0_smp, NULL), MC_OK);
        assert_true(a_all == a_smp);
        assert_true(fabs(e_smp - e_all) <= 1e-12 * e_all);
        assert_true(fabs(e0_smp - e0_all) <= 1e-12 * e0_all);
        /* distinct rows: an estimate */
        l.w = big;
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, &all, sc_all,
                                        &a_all, &e_all, &e0_all, NULL), MC_OK);
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, &smp, sc_smp,
                                        &a_smp, &e_smp, &e0_smp, NULL), MC_OK);
        assert_true(fabs(e0_smp - e0_all) <= 0.15 * e0_all);
        /* the sampled pick costs the whole rows little over their own */
        setup b = s;
        b.w[0] = big;
        b.rows[0] = rows;
        b.rows[1] = 0;
        double at_smp = point_error(&b, fs[f], (int)lround(a_smp / CMP_AWQ_ALPHA_STEP));
        double at_all = point_error(&b, fs[f], (int)lround(a_all / CMP_AWQ_ALPHA_STEP));
        print_message("%s: whole rows pick alpha %.2f (error %.6g), the sample "
                      "%.2f (error %.6g on the whole rows)\n",
                      f ? "int8" : "int4", a_all, at_all, a_smp, at_smp);
        assert_true(fabs(at_all - e_all) <= 1e-9 * e_all);
        assert_true(at_smp <= 1.05 * at_all);
        cmp_awq_search_opts smp_pool = {pool, 0, base};
        assert_int_equal(cmp_awq_search(&s.h, s.xa, &l, 1, fs[f], 32, &smp_pool,
                                        sc_pool, &a_pool, &e_pool, &e0_pool, NULL),
                         MC_OK);
        assert_memory_equal(&e_pool, &e_smp, sizeof e_pool);
        assert_memory_equal(sc_pool, sc_smp, sizeof sc_pool);
        /* s.w's 45 and 13 rows are under 2 * 64: no sample, the same bits */
        found whole, under;
        search(&s, fs[f], NULL, 0, &whole);
        cmp_awq_linear l2[2] = {{s.w[0], s.rows[0]}, {s.w[1], s.rows[1]}};
        cmp_awq_search_opts so = {NULL, 0, 64};
        memset(&under, 0, sizeof under);
        assert_int_equal(cmp_awq_search(&s.h, s.xa, l2, 2, fs[f], 32, &so, under.sc,
                                        &under.alpha, &under.e, &under.e0, NULL),
                         MC_OK);
        assert_memory_equal(&whole.e, &under.e, sizeof whole.e);
        assert_true(whole.alpha == under.alpha);
    }
    kn_pool_free(pool);
    free(rep4);
    free(big);
    rm(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq_search_same_bits_on_any_pool),
        cmocka_unit_test(test_awq_search_picks_the_first_smallest_point),
        cmocka_unit_test(test_awq_search_work_bytes_count_every_thread),
        cmocka_unit_test(test_output_error_avx2_same_bits_as_scalar),
        cmocka_unit_test(test_awq_search_row_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

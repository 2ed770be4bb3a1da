/* test_gptq_work.c - the GPTQ-family steps around the quantizer: the code
 * descent reaching a local minimum, every row-parallel step (GPTQ, refit,
 * descent, retarget, output error, Hessian and cross sums, the inverse
 * factor) giving on three threads exactly what it gives on one, and the
 * work-space byte formulas against measured allocation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_descend.h"
#include "cmp_gptq.h"
#include "cmp_qform.h"
#include "cmp_quant.h"
#include "gptq_fixture.h"
#include "kn_gram.h"
#include "kn_ops.h"
#include "mc_alloc.h"
#include "testutil.h"

/* ---- code descent --------------------------------------------------- */

/* From RTN codes, the descent lowers the output error, keeps every group
 * parameter, leaves deq equal to the dequantized codes, never moves a dead
 * input's code, and stops at a local minimum: no single code step inside
 * the format's range lowers any row's error. */
static void check_descent(kn_wformat f)
{
    uint32_t rows = 11, cols = 40; /* ragged last group at 32 */
    size_t T = 160;
    float *X = tu_gq_correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++)
        X[t * cols + 6] = 0.0f; /* dead input */
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    tu_gq_qm m;
    tu_gq_qm_init(&m, f, rows, cols, 32);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    float *deq = malloc((size_t)rows * cols * sizeof(float));
    float *chk = malloc((size_t)rows * cols * sizeof(float));
    cmp_dequant_matrix(&m.b, deq);
    int dead0[11];
    for (uint32_t r = 0; r < rows; r++)
        dead0[r] = cmp_qbuf_get_code(&m.b, r, 6);
    size_t sb = kn_wformat_scale_bytes(f, rows, cols, 32);
    size_t zb = kn_wformat_zero_bytes(f, rows, cols, 32);
    void *sc0 = malloc(sb), *z0 = malloc(zb ? zb : 1);
    memcpy(sc0, m.scales, sb);
    if (zb)
        memcpy(z0, m.zeros, zb);
    double e0 = cmp_hessian_output_error(&h, w, deq, rows);
    uint64_t moves = 0;
    assert_int_equal(cmp_descend_codes(w, &h, &m.b, deq, 64, &moves, NULL, NULL), MC_OK);
    double e1 = cmp_hessian_output_error(&h, w, deq, rows);
    print_message("descent fmt %d: %.6g -> %.6g in %llu moves\n", (int)f, e0, e1,
                  (unsigned long long)moves);
    assert_true(moves > 0);
    assert_true(e1 < 0.97 * e0);
    assert_memory_equal(sc0, m.scales, sb);
    if (zb)
        assert_memory_equal(z0, m.zeros, zb);
    cmp_dequant_matrix(&m.b, chk);
    assert_memory_equal(chk, deq, (size_t)rows * cols * sizeof(float));
    int lo = f == KN_W_Q8 ? -127 : 0, hi = f == KN_W_Q8 ? 127 : 15;
    for (uint32_t r = 0; r < rows; r++) {
        assert_int_equal(cmp_qbuf_get_code(&m.b, r, 6), dead0[r]);
        float *wr = w + (size_t)r * cols, *dr = deq + (size_t)r * cols;
        double er = cmp_hessian_output_error(&h, wr, dr, 1);
        for (uint32_t c = 0; c < cols; c++) {
            cmp_qparam p = cmp_qbuf_get_param(&m.b, r, c / cmp_qbuf_span(&m.b));
            int code = cmp_qbuf_get_code(&m.b, r, c);
            for (int step = -1; step <= 1; step += 2) {
                if (code + step < lo || code + step > hi)
                    continue;
                float keep = dr[c];
                dr[c] = cmp_quant_value(f, p, code + step);
                double e = cmp_hessian_output_error(&h, wr, dr, 1);
                dr[c] = keep;
                assert_true(e >= er * (1.0 - 1e-9));
            }
        }
    }
    free(sc0);
    free(z0);
    free(chk);
    free(deq);
    tu_gq_qm_free(&m);
    free(w);
    cmp_hessian_free(&h);
    free(X);
}

static void test_descent_reaches_a_local_minimum(void **state)
{
    (void)state;
    check_descent(KN_W_Q4);
    check_descent(KN_W_Q4S);
    check_descent(KN_W_Q8);
}

/* Buffers of one quantized matrix compared byte for byte. */
static void assert_qm_equal(const tu_gq_qm *a, const tu_gq_qm *b, kn_wformat f, uint32_t rows,
                            uint32_t cols)
{
    assert_memory_equal(a->data, b->data, kn_wformat_data_bytes(f, rows, cols));
    assert_memory_equal(a->scales, b->scales, kn_wformat_scale_bytes(f, rows, cols, 32));
    size_t zb = kn_wformat_zero_bytes(f, rows, cols, 32);
    if (zb)
        assert_memory_equal(a->zeros, b->zeros, zb);
}

/* The descent with the AVX2 scan makes the moves the per-column loop
 * makes: the same codes, values and move count on both paths, for every
 * format, with a dead input, ragged groups, range limits (RTN's extreme
 * codes) and a row whose last columns are fewer than four. */
static void test_descent_scan_matches_scalar(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx2()) {
        print_message("no AVX2 here: the scan is not run\n");
        return;
    }
    uint32_t rows = 9, cols = 75; /* groups of 32: 32, 32, 11 */
    size_t T = 120, nel = (size_t)rows * cols;
    float *X = tu_gq_correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++)
        X[t * cols + 6] = 0.0f;
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    static const kn_wformat fmts[3] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    for (int k = 0; k < 3; k++) {
        tu_gq_qm a, b;
        tu_gq_qm_init(&a, fmts[k], rows, cols, 32);
        tu_gq_qm_init(&b, fmts[k], rows, cols, 32);
        assert_int_equal(cmp_quant_matrix(w, NULL, &a.b, NULL), MC_OK);
        assert_int_equal(cmp_quant_matrix(w, NULL, &b.b, NULL), MC_OK);
        float *da = malloc(nel * sizeof(float)), *db = malloc(nel * sizeof(float));
        cmp_dequant_matrix(&a.b, da);
        cmp_dequant_matrix(&b.b, db);
        uint64_t ma = 0, mb = 0;
        kn_set_force_scalar(1);
        assert_int_equal(cmp_descend_codes(w, &h, &a.b, da, 0, &ma, NULL, NULL), MC_OK);
        kn_set_force_scalar(0);
        assert_int_equal(cmp_descend_codes(w, &h, &b.b, db, 0, &mb, NULL, NULL), MC_OK);
        assert_true(ma > 0);
        assert_true(ma == mb);
        assert_qm_equal(&a, &b, fmts[k], rows, cols);
        assert_memory_equal(da, db, nel * sizeof(float));
        free(da);
        free(db);
        tu_gq_qm_free(&a);
        tu_gq_qm_free(&b);
    }
    free(w);
    cmp_hessian_free(&h);
    free(X);
}

/* ---- threads ---------------------------------------------------------- */

/* Every row-parallel step gives on a pool of three threads (an uneven
 * split of 37 rows) exactly what it gives on the calling thread alone:
 * GPTQ (with and without act-order), the refit, the descent, the
 * retarget and the output error. */
static void test_threads_give_identical_results(void **state)
{
    (void)state;
    kn_pool *pool = kn_pool_create(3);
    assert_non_null(pool);
    uint32_t rows = 37, cols = 72;
    size_t T = 200;
    float *X = tu_gq_correlated_inputs(T, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    size_t nel = (size_t)rows * cols;
    float *d1 = malloc(nel * sizeof(float)), *d3 = malloc(nel * sizeof(float));
    kn_wformat fs[2] = {KN_W_Q4, KN_W_Q8};
    for (int fi = 0; fi < 2; fi++)
        for (int ao = 0; ao <= 1; ao++) {
            kn_wformat f = fs[fi];
            tu_gq_qm a, b;
            tu_gq_qm_init(&a, f, rows, cols, 32);
            tu_gq_qm_init(&b, f, rows, cols, 32);
            cmp_gptq_opts o1 = {0.01, ao, 128, 1, 0, 0, NULL};
            cmp_gptq_opts o3 = o1;
            o3.pool = pool;
            o1.chunk_rows = o3.chunk_rows = 0;
            assert_int_equal(cmp_gptq_quantize(w, &h, &o1, &a.b, d1, NULL, NULL), MC_OK);
            assert_int_equal(cmp_gptq_quantize(w, &h, &o3, &b.b, d3, NULL, NULL), MC_OK);
            assert_qm_equal(&a, &b, f, rows, cols);
            assert_int_equal(cmp_gptq_refit_scales(w, &h, &a.b, d1, NULL, NULL), MC_OK);
            assert_int_equal(cmp_gptq_refit_scales(w, &h, &b.b, d3, pool, NULL), MC_OK);
            assert_qm_equal(&a, &b, f, rows, cols);
            uint64_t m1 = 0, m3 = 0;
            assert_int_equal(cmp_descend_codes(w, &h, &a.b, d1, 0, &m1, NULL, NULL), MC_OK);
            assert_int_equal(cmp_descend_codes(w, &h, &b.b, d3, 0, &m3, pool, NULL), MC_OK);
            assert_qm_equal(&a, &b, f, rows, cols);
            assert_memory_equal(d1, d3, nel * sizeof(float));
            assert_true(m1 == m3);
            double e1 = cmp_hessian_output_error(&h, w, d1, rows);
            assert_true(cmp_hessian_output_error_par(pool, &h, w, d3, rows) == e1);
            assert_true(cmp_hessian_output_error_par(NULL, &h, w, d3, rows) == e1);
            tu_gq_qm_free(&a);
            tu_gq_qm_free(&b);
        }
    double *C = calloc((size_t)cols * cols, sizeof(double));
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t k = 0; k < cols; k++)
            C[i * cols + k] = 0.9 * cmp_hessian_get(&h, i, k);
    assert_int_equal(cmp_gptq_retarget(&h, C, w, rows, 0.01, d1, NULL, NULL), MC_OK);
    assert_int_equal(cmp_gptq_retarget(&h, C, w, rows, 0.01, d3, pool, NULL), MC_OK);
    assert_memory_equal(d1, d3, nel * sizeof(float));
    /* the statistics: H on three threads, and C against the per-token
     * rank-1 update it replaces (150 tokens: two full chunks and a part;
     * some x_f exactly zero) */
    {
        cmp_hessian h3;
        assert_int_equal(cmp_hessian_init(&h3, cols, NULL), MC_OK);
        cmp_hessian_add_par(pool, &h3, X, 120);
        cmp_hessian_add_par(pool, &h3, X + 120 * cols, T - 120);
        cmp_hessian h1;
        assert_int_equal(cmp_hessian_init(&h1, cols, NULL), MC_OK);
        cmp_hessian_add(&h1, X, 120);
        cmp_hessian_add(&h1, X + 120 * cols, T - 120);
        assert_memory_equal(h1.h, h3.h, cmp_hessian_row_offset(cols, cols) * sizeof(double));
        assert_true(h1.n == h3.n);
        size_t nt = 150;
        float *xf = X, *xq = X + 40 * cols;
        for (size_t t = 0; t < nt; t += 7)
            xf[t * cols + (t % cols)] = 0.0f;
        double *c1 = calloc((size_t)cols * cols, sizeof(double));
        double *c3 = calloc((size_t)cols * cols, sizeof(double));
        /* against the per-token rank-1 update in double: float products
         * within a chunk (kn_gram.h) */
        double cmax = 0.0;
        for (size_t t = 0; t < nt; t++)
            for (uint32_t i = 0; i < cols; i++) {
                double fi = xf[t * cols + i];
                for (uint32_t k = 0; k < cols; k++)
                    c1[(size_t)i * cols + k] += fi * xq[t * cols + k];
            }
        for (size_t e = 0; e < (size_t)cols * cols; e++)
            cmax = fmax(cmax, fabs(c1[e]));
        cmp_cross_add(pool, c3, xf, xq, nt, cols, h3.xt, 0);
        for (size_t e = 0; e < (size_t)cols * cols; e++)
            assert_true(fabs(c3[e] - c1[e]) <= 1e-6 * cmax);
        /* the same sums, bit for bit, without the pool */
        memcpy(c1, c3, (size_t)cols * cols * sizeof(double));
        memset(c3, 0, (size_t)cols * cols * sizeof(double));
        cmp_cross_add(NULL, c3, xf, xq, nt, cols, h3.xt, 0);
        assert_memory_equal(c1, c3, (size_t)cols * cols * sizeof(double));
        free(c1);
        free(c3);
        cmp_hessian_free(&h1);
        cmp_hessian_free(&h3);
    }
    /* the factorization's columns and the inverse's rows go parallel only
     * from about 400 wide, the fill of the factor from H from 512: compare
     * there, with an act-order permutation */
    {
        uint32_t wide = 600;
        float *Xw = tu_gq_correlated_inputs(700, wide);
        cmp_hessian hw;
        tu_gq_hessian_of(&hw, Xw, 700, wide);
        uint32_t *perm = malloc(wide * sizeof(uint32_t));
        for (uint32_t i = 0; i < wide; i++)
            perm[i] = (i * 7u) % wide; /* 7 and 600 are coprime */
        double *u1 = malloc((size_t)wide * wide * sizeof(double));
        double *u3 = malloc((size_t)wide * wide * sizeof(double));
        double *row = malloc(wide * sizeof(double));
        assert_int_equal(cmp_gptq_hinv_factor(&hw, perm, 1.0, u1, row, NULL, NULL), MC_OK);
        assert_int_equal(cmp_gptq_hinv_factor(&hw, perm, 1.0, u3, row, pool, NULL), MC_OK);
        assert_memory_equal(u1, u3, (size_t)wide * wide * sizeof(double));
        free(u1);
        free(u3);
        free(row);
        free(perm);
        cmp_hessian_free(&hw);
        free(Xw);
    }
    free(C);
    free(d1);
    free(d3);
    free(w);
    cmp_hessian_free(&h);
    free(X);
    kn_pool_free(pool);
}

/* ---- work-space byte counts against measured allocation ------------- */

typedef struct peak_probe {
    int64_t live0;
} peak_probe;

static void probe_start(peak_probe *p)
{
    mc_alloc_track(1);
    p->live0 = mc_alloc_live_bytes();
    mc_alloc_reset_peak();
}

/* The measured peak (usable sizes) must cover the formula and exceed it by
 * no more than malloc's rounding: under 32 bytes per heap block, under a
 * page per block large enough to be mmapped (>= 128 KiB); nothing may
 * stay allocated. */
static void probe_check(peak_probe *p, const char *what, uint64_t formula,
                        int nblocks, int nbig)
{
    int64_t peak = mc_alloc_peak_bytes() - p->live0;
    int64_t left = mc_alloc_live_bytes() - p->live0;
    mc_alloc_track(0);
    print_message("%s: formula %llu, measured %lld\n", what,
                  (unsigned long long)formula, (long long)peak);
    assert_int_equal(left, 0);
    assert_true(peak >= (int64_t)formula);
    assert_true(peak <= (int64_t)formula + 32 * nblocks + 4096 * nbig);
}

static void test_gptq_work_bytes_match_measured_peak(void **state)
{
    (void)state;
    peak_probe p;
    /* the accumulator */
    cmp_hessian h;
    probe_start(&p);
    assert_int_equal(cmp_hessian_init(&h, 100, NULL), MC_OK);
    int64_t held = mc_alloc_live_bytes() - p.live0;
    mc_alloc_track(0);
    assert_true(held >= (int64_t)cmp_hessian_bytes(100));
    assert_true(held <= (int64_t)cmp_hessian_bytes(100) + 2 * 32);
    size_t T = 260;
    float *X = tu_gq_correlated_inputs(T, 100);
    cmp_hessian_add(&h, X, T);

    kn_pool *pool3 = tu_pool_warm(3);
    /* GPTQ: every block below the mmap threshold (cols 100), then one
     * matrix above it (cols 200) */
    struct {
        kn_wformat f;
        uint32_t g, rows, cols, block;
        int act, nbig;
    } cs[3] = {{KN_W_Q4, 32, 40, 100, 0, 0, 0}, {KN_W_Q8, 0, 7, 100, 256, 1, 0},
               {KN_W_Q4S, 64, 12, 200, 128, 1, 1}};
    for (int c = 0; c < 3; c++) {
        cmp_hessian hc;
        float *Xc = cs[c].cols == 100 ? NULL : tu_gq_correlated_inputs(2 * cs[c].cols, cs[c].cols);
        if (Xc) {
            assert_int_equal(cmp_hessian_init(&hc, cs[c].cols, NULL), MC_OK);
            cmp_hessian_add(&hc, Xc, 2 * (size_t)cs[c].cols);
        }
        const cmp_hessian *hh = Xc ? &hc : &h;
        float *w = tu_gq_rand_w(cs[c].rows, cs[c].cols);
        tu_gq_qm q;
        tu_gq_qm_init(&q, cs[c].f, cs[c].rows, cs[c].cols, cs[c].g);
        cmp_gptq_opts o = {0.01, cs[c].act, cs[c].block, 0, 0};
        probe_start(&p);
        assert_int_equal(cmp_gptq_quantize(w, hh, &o, &q.b, NULL, NULL, NULL), MC_OK);
        probe_check(&p, "gptq", cmp_gptq_work_bytes(cs[c].rows, cs[c].cols, cs[c].block, 1),
                    9, cs[c].nbig);
        uint32_t groups = cmp_qbuf_nparams(&q.b);
        probe_start(&p);
        assert_int_equal(cmp_gptq_refit_scales(w, hh, &q.b, NULL, NULL, NULL), MC_OK);
        probe_check(&p, "refit", cmp_gptq_refit_work_bytes(cs[c].cols, groups, 1), 12, 0);
        /* three threads: each its own work copies */
        o.pool = pool3;
        probe_start(&p);
        assert_int_equal(cmp_gptq_quantize(w, hh, &o, &q.b, NULL, NULL, NULL), MC_OK);
        probe_check(&p, "gptq x3", cmp_gptq_work_bytes(cs[c].rows, cs[c].cols, cs[c].block, 3),
                    18, cs[c].nbig);
        probe_start(&p);
        assert_int_equal(cmp_gptq_refit_scales(w, hh, &q.b, NULL, pool3, NULL), MC_OK);
        probe_check(&p, "refit x3", cmp_gptq_refit_work_bytes(cs[c].cols, groups, 3), 34, 0);
        tu_gq_qm_free(&q);
        free(w);
        if (Xc) {
            cmp_hessian_free(&hc);
            free(Xc);
        }
    }

    /* retarget: C = sum x x^T (full), w */
    double *C = calloc(100 * 100, sizeof(double));
    for (uint32_t i = 0; i < 100; i++)
        for (uint32_t j = 0; j < 100; j++)
            C[i * 100 + j] = cmp_hessian_get(&h, i, j);
    float *w = tu_gq_rand_w(5, 100), *out = malloc(5 * 100 * sizeof(float));
    probe_start(&p);
    assert_int_equal(cmp_gptq_retarget(&h, C, w, 5, 0.01, out, NULL, NULL), MC_OK);
    probe_check(&p, "retarget", cmp_gptq_retarget_work_bytes(100, 1), 2, 0);
    probe_start(&p);
    assert_int_equal(cmp_gptq_retarget(&h, C, w, 5, 0.01, out, pool3, NULL), MC_OK);
    probe_check(&p, "retarget x3", cmp_gptq_retarget_work_bytes(100, 3), 2, 0);
    probe_start(&p);
    (void)cmp_hessian_output_error_par(pool3, &h, w, NULL, 5);
    probe_check(&p, "output error x3", cmp_hessian_output_error_par_work_bytes(100, 5, 3), 2, 0);
    assert_true(cmp_hessian_output_error_par_work_bytes(100, 5, 3) ==
                5 * 8 + 3 * cmp_qform_work_doubles(100, 5) * 8);
    probe_start(&p);
    (void)cmp_hessian_output_error_par(NULL, &h, w, NULL, 5);
    probe_check(&p, "output error x1", cmp_hessian_output_error_par_work_bytes(100, 5, 1), 2, 0);
    assert_true(cmp_hessian_output_error_par_work_bytes(100, 5, 1) ==
                5 * 8 + cmp_qform_work_doubles(100, 5) * 8);

    /* output error: the stack up to 512 columns, the heap above */
    probe_start(&p);
    (void)cmp_hessian_output_error(&h, w, NULL, 5);
    probe_check(&p, "output error 100", cmp_hessian_output_error_work_bytes(100), 0, 0);
    assert_true(cmp_hessian_output_error_work_bytes(100) == 0);
    cmp_hessian wide;
    assert_int_equal(cmp_hessian_init(&wide, 600, NULL), MC_OK);
    float *ww = tu_gq_rand_w(2, 600);
    probe_start(&p);
    (void)cmp_hessian_output_error(&wide, ww, NULL, 2);
    probe_check(&p, "output error 600", cmp_hessian_output_error_work_bytes(600), 1, 0);
    assert_true(cmp_hessian_output_error_work_bytes(600) == 600 * CMP_OERR_ROWS * 8);

    /* descent: the full H, eight rows' d and g, and a row's codes */
    {
        float *q = tu_gq_rand_w(5, 100), *qd = malloc(5 * 100 * sizeof(float));
        tu_gq_qm m;
        tu_gq_qm_init(&m, KN_W_Q4, 5, 100, 32);
        assert_int_equal(cmp_quant_matrix(q, NULL, &m.b, NULL), MC_OK);
        cmp_dequant_matrix(&m.b, qd);
        probe_start(&p);
        assert_int_equal(cmp_descend_codes(q, &h, &m.b, qd, 0, NULL, NULL, NULL), MC_OK);
        probe_check(&p, "descent", cmp_descend_work_bytes(100, 1), 4, 0);
        probe_start(&p);
        assert_int_equal(cmp_descend_codes(q, &h, &m.b, qd, 0, NULL, pool3, NULL), MC_OK);
        probe_check(&p, "descent x3", cmp_descend_work_bytes(100, 3), 5, 0);
        assert_true(cmp_descend_work_bytes(100, 1) ==
                    (100 * 100 + 100) * 8 + 2 * CMP_QFORM_CHUNK * 100 * 8 + 100);
        tu_gq_qm_free(&m);
        free(q);
        free(qd);
    }

    /* the formulas themselves, at a 70B model's widest input */
    uint64_t n = 28672, c = CMP_GPTQ_CHUNK_BYTES / (n * 4);
    assert_true(cmp_gptq_work_bytes(8192, 28672, 0, 1) ==
                n * n * 8 + c * n * 4 + c * 128 * 4 + 128 * 256 * 8 + n * 32);
    assert_true(cmp_gptq_work_bytes(8192, 28672, 128, 1) == cmp_gptq_work_bytes(8192, 28672, 0, 1));
    assert_true(cmp_gptq_retarget_work_bytes(28672, 1) ==
                n * n * 8 + n * CMP_RETARGET_ROWS * 8);

    cmp_hessian_free(&wide);
    kn_pool_free(pool3);
    free(ww);
    free(w);
    free(out);
    free(C);
    cmp_hessian_free(&h);
    free(X);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descent_reaches_a_local_minimum),
        cmocka_unit_test(test_descent_scan_matches_scalar),
        cmocka_unit_test(test_threads_give_identical_results),
        cmocka_unit_test(test_gptq_work_bytes_match_measured_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

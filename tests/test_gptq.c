/* test_gptq.c - GPTQ: Hessian accumulation (packed), error compensation
 * beating RTN on correlated inputs (a wrong update fails), act-order, dead
 * columns, ragged groups, the no-correlation case reducing to RTN, the
 * in-place inverse factor against a plain reference, row chunks, kept
 * parameters and a shared factor.  The code descent, thread-count
 * independence and the work-space byte counts are test_gptq_work.c's. */
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
#include "kn_lanes.h"
#include "gptq_fixture.h"
#include "kn_gram.h"
#include "kn_ops.h"
#include "testutil.h"

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
    float *X = tu_gq_correlated_inputs(T, cols);
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
            /* float products within a 128-token chunk (kn_gram.h): a
             * float dot product's error, relative to |x_i| |x_j| */
            double scale = sqrt(cmp_hessian_get(&h, i, i) * cmp_hessian_get(&h, j, j));
            assert_float_equal(cmp_hessian_get(&h, i, j), s, 1e-6 * scale);
            /* symmetric access */
            assert_true(cmp_hessian_get(&h, j, i) == cmp_hessian_get(&h, i, j));
        }
    /* Output error through H equals the direct one. */
    float *w = tu_gq_rand_w(5, cols), *q = tu_gq_rand_w(5, cols);
    double a = cmp_hessian_output_error(&h, w, q, 5);
    double b = direct_output_error(X, T, w, q, 5, cols);
    assert_float_equal(a, b, 1e-6 * b);
    free(w);
    free(q);
    /* reset zeroes every stored element and the count */
    cmp_hessian_reset(&h);
    assert_int_equal(h.n, 0);
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t j = 0; j < cols; j++)
            assert_true(cmp_hessian_get(&h, i, j) == 0.0);
    cmp_hessian_free(&h);
    free(X);
}

/* The blocked output error gives each row the value it has computed alone
 * (one-row calls), bit for bit, at every row count around the block size,
 * with dead columns and rows that equal their replacement; and it matches
 * the direct sum over tokens. */
static void test_output_error_rows_are_independent_of_blocking(void **state)
{
    (void)state;
    uint32_t cols = 45;
    size_t T = 90;
    float *X = tu_gq_correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++)
        X[t * cols + 7] = 0.0f; /* a dead input */
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    uint32_t maxrows = 2 * CMP_OERR_ROWS + 3;
    float *w = tu_gq_rand_w(maxrows, cols), *q = tu_gq_rand_w(maxrows, cols);
    for (uint32_t r = 0; r < maxrows; r++)
        q[(size_t)r * cols + 3] = w[(size_t)r * cols + 3]; /* zero difference */
    memcpy(q + 5 * cols, w + 5 * cols, cols * sizeof(float)); /* exact row */
    for (uint32_t rows = 1; rows <= maxrows; rows++) {
        double alone = 0.0;
        for (uint32_t r = 0; r < rows; r++)
            alone += cmp_hessian_output_error(&h, w + (size_t)r * cols,
                                              q + (size_t)r * cols, 1);
        double together = cmp_hessian_output_error(&h, w, q, rows);
        assert_true(together == alone);
        double direct = direct_output_error(X, T, w, q, rows, cols);
        /* H's float chunk sums (kn_gram.h) */
        assert_float_equal(together, direct, 1e-6 * direct);
    }
    free(w);
    free(q);
    cmp_hessian_free(&h);
    free(X);
}

/* Retargeting solves W* (Hq + lambda I) = W C row by row (its normal
 * equations), and a row's result does not depend on the rows solved with
 * it (row counts around the block, a zero weight, a dead input). */
static void test_retarget_solves_normal_equations_blockwise(void **state)
{
    (void)state;
    uint32_t cols = 29;
    size_t T = 120;
    float *xf = tu_gq_correlated_inputs(T, cols);
    float *xq = malloc(T * cols * sizeof(float));
    for (size_t i = 0; i < T * cols; i++)
        xq[i] = xf[i] + 0.1f * tu_gq_nrand();
    for (size_t t = 0; t < T; t++)
        xf[t * cols + 4] = xq[t * cols + 4] = 0.0f; /* dead input */
    cmp_hessian hq;
    tu_gq_hessian_of(&hq, xq, T, cols);
    double *C = calloc((size_t)cols * cols, sizeof(double));
    for (size_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < cols; i++)
            for (uint32_t j = 0; j < cols; j++)
                C[i * cols + j] += (double)xf[t * cols + i] * xq[t * cols + j];
    uint32_t maxrows = 2 * CMP_RETARGET_ROWS + 3;
    float *w = tu_gq_rand_w(maxrows, cols);
    w[2 * cols + 9] = 0.0f;
    float *all = malloc((size_t)maxrows * cols * sizeof(float));
    float *one = malloc(cols * sizeof(float));
    double damp = 0.01, mean = 0.0;
    for (uint32_t j = 0; j < cols; j++)
        mean += cmp_hessian_get(&hq, j, j);
    mean /= cols;
    static const uint32_t counts[] = {1, 2, 7, 8, 9, CMP_RETARGET_ROWS - 1,
                                      CMP_RETARGET_ROWS, CMP_RETARGET_ROWS + 1,
                                      2 * CMP_RETARGET_ROWS + 3};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        uint32_t rows = counts[t];
        assert_int_equal(cmp_gptq_retarget(&hq, C, w, rows, damp, all, NULL, NULL), MC_OK);
        for (uint32_t r = 0; r < rows; r++) {
            assert_int_equal(cmp_gptq_retarget(&hq, C, w + (size_t)r * cols, 1,
                                               damp, one, NULL, NULL), MC_OK);
            assert_memory_equal(one, all + (size_t)r * cols, cols * sizeof(float));
        }
    }
    /* from W C given (down's outputs, cmp_calib_down_from_outputs): the
     * same solution, from the rows' W C summed in double here */
    double *wc = calloc((size_t)maxrows * cols, sizeof(double));
    float *from_wc = malloc((size_t)maxrows * cols * sizeof(float));
    assert_non_null(wc);
    assert_non_null(from_wc);
    for (uint32_t r = 0; r < maxrows; r++)
        for (uint32_t k = 0; k < cols; k++)
            for (uint32_t j = 0; j < cols; j++)
                wc[(size_t)r * cols + j] += (double)w[(size_t)r * cols + k] * C[k * cols + j];
    assert_int_equal(cmp_gptq_retarget_wc(&hq, wc, maxrows, damp, from_wc, NULL, NULL),
                     MC_OK);
    for (size_t k = 0; k < (size_t)maxrows * cols; k++)
        assert_float_equal(from_wc[k], all[k], 1e-5 * (fabs(all[k]) + 1e-3));
    free(wc);
    free(from_wc);
    for (uint32_t r = 0; r < maxrows; r++)
        for (uint32_t j = 0; j < cols; j++) {
            double lhs = 0.0, rhs = 0.0, scale = 0.0;
            for (uint32_t k = 0; k < cols; k++) {
                double hk = cmp_hessian_get(&hq, k, j) + (k == j ? damp * mean : 0.0);
                lhs += (double)all[(size_t)r * cols + k] * hk;
                rhs += (double)w[(size_t)r * cols + k] * C[k * cols + j];
                scale += fabs((double)w[(size_t)r * cols + k] * C[k * cols + j]);
            }
            assert_float_equal(lhs, rhs, 1e-5 * (scale + 1e-12));
        }
    free(one);
    free(all);
    free(w);
    free(C);
    cmp_hessian_free(&hq);
    free(xq);
    free(xf);
}

/* The packed layout: rows one after another, row i starting with (i, i);
 * the offsets do not wrap at the widest inputs. */
static void test_hessian_packed_row_offsets(void **state)
{
    (void)state;
    uint32_t cols = 9;
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    size_t k = 0;
    for (uint32_t i = 0; i < cols; i++) {
        assert_int_equal(cmp_hessian_row_offset(cols, i), k);
        for (uint32_t j = i; j < cols; j++)
            cmp_hessian_set(&h, j, i, (double)k++); /* either order */
    }
    assert_int_equal(cmp_hessian_row_offset(cols, cols), k);
    assert_int_equal(k, cols * (cols + 1) / 2);
    for (size_t t = 0; t < k; t++)
        assert_true(h.h[t] == (double)t);
    cmp_hessian_free(&h);
    /* i * cols - i * (i - 1) / 2 in 64 bits, at and past 65536 */
    uint64_t big = 65536;
    for (uint64_t i = 0; i <= big; i += 4099)
        assert_true(cmp_hessian_row_offset((uint32_t)big, (uint32_t)i) ==
                    i * big - (i ? i * (i - 1) / 2 : 0));
    assert_true(cmp_hessian_row_offset(65536, 65536) == 65536ull * 65537 / 2);
    assert_true(cmp_hessian_bytes(28672) ==
                28672ull * 28673 / 2 * sizeof(double) +
                (28674ull + 28672ull) * KN_GRAM_KC_BF16 * sizeof(float));
}

/* GPTQ must reduce the output error well below RTN's on correlated inputs;
 * without the error feedback (or with a wrong sign) it cannot. */
static void check_beats_rtn(kn_wformat f, uint32_t g, int act_order,
                            uint32_t cols, double max_ratio)
{
    uint32_t rows = 48;
    size_t T = 512;
    float *X = tu_gq_correlated_inputs(T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    tu_gq_qm a, b;
    tu_gq_qm_init(&a, f, rows, cols, g);
    tu_gq_qm_init(&b, f, rows, cols, g);
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
    assert_int_equal(cmp_gptq_refit_scales(w, &h, &b.b, dg, NULL, NULL), MC_OK);
    double ef = direct_output_error(X, T, w, dg, rows, cols);
    assert_int_equal(cmp_gptq_refit_scales(w, &h, &a.b, dr, NULL, NULL), MC_OK);
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
    tu_gq_qm_free(&a);
    tu_gq_qm_free(&b);
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
    float *X = tu_gq_correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++) {
        X[t * cols + 5] = 0.0f;
        X[t * cols + 40] = 0.0f;
    }
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    for (int ao = 0; ao < 2; ao++) {
        tu_gq_qm b;
        tu_gq_qm_init(&b, KN_W_Q4, rows, cols, 32);
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
        tu_gq_qm_free(&b);
    }
    /* No tokens at all: every column dead, all zero, still MC_OK. */
    cmp_hessian e;
    assert_int_equal(cmp_hessian_init(&e, cols, NULL), MC_OK);
    tu_gq_qm b;
    tu_gq_qm_init(&b, KN_W_Q8, rows, cols, 0);
    float *d = malloc((size_t)rows * cols * sizeof(float));
    assert_int_equal(cmp_gptq_quantize(w, &e, NULL, &b.b, d, NULL, NULL), MC_OK);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        assert_true(d[i] == 0.0f);
    free(d);
    tu_gq_qm_free(&b);
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
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    for (uint32_t j = 0; j < cols; j++)
        cmp_hessian_set(&h, j, j, 1.0 + j);
    h.n = 1;
    tu_gq_qm a, b;
    tu_gq_qm_init(&a, KN_W_Q8, rows, cols, 0);
    tu_gq_qm_init(&b, KN_W_Q8, rows, cols, 0);
    assert_int_equal(cmp_quant_matrix(w, NULL, &a.b, NULL), MC_OK);
    assert_int_equal(cmp_gptq_quantize(w, &h, NULL, &b.b, NULL, NULL, NULL), MC_OK);
    assert_memory_equal(a.data, b.data, (size_t)rows * cols);
    assert_memory_equal(a.scales, b.scales, rows * sizeof(float));
    tu_gq_qm_free(&a);
    tu_gq_qm_free(&b);
    cmp_hessian_free(&h);
    free(w);
}

/* An indefinite "Hessian" (negative diagonal) fails cleanly after the
 * dampening is raised, naming the Hessian. */
static void test_gptq_rejects_indefinite_hessian(void **state)
{
    (void)state;
    uint32_t rows = 2, cols = 8;
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    assert_int_equal(cmp_hessian_init(&h, cols, NULL), MC_OK);
    for (uint32_t j = 0; j < cols; j++)
        cmp_hessian_set(&h, j, j, j == 3 ? -1e9 : 1.0);
    tu_gq_qm b;
    tu_gq_qm_init(&b, KN_W_Q8, rows, cols, 0);
    mc_error e;
    assert_int_equal(cmp_gptq_quantize(w, &h, NULL, &b.b, NULL, NULL, &e),
                     MC_ERR_NONFINITE);
    assert_string_equal(e.field, "hessian");
    tu_gq_qm_free(&b);
    cmp_hessian_free(&h);
    free(w);
}

/* ---- the in-place inverse factor against a plain reference ---------- */

/* Lower Cholesky of the dense symmetric m [n][n], in place (lower part;
 * the upper part is left alone). */
static void ref_cholesky(double *m, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        double d = m[j * n + j];
        for (size_t k = 0; k < j; k++)
            d -= m[j * n + k] * m[j * n + k];
        assert_true(d > 0.0);
        d = sqrt(d);
        m[j * n + j] = d;
        for (size_t i = j + 1; i < n; i++) {
            double t = m[i * n + j];
            for (size_t k = 0; k < j; k++)
                t -= m[i * n + k] * m[j * n + k];
            m[i * n + j] = t / d;
        }
    }
}

/* The factor by the textbook route: M = P^T H P + lambda I (dead diagonal
 * at 1), M^-1 by solving L L^T x = e_k for every k, then the upper
 * Cholesky factor of M^-1.  minv [n][n] and uref [n][n] (upper, zero
 * below) receive the inverse and the factor. */
static void ref_factor(const cmp_hessian *h, const uint32_t *perm,
                       double lambda, double *minv, double *uref)
{
    size_t n = h->cols;
    double *L = malloc(n * n * sizeof(double));
    double *y = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            uint32_t pi = perm ? perm[i] : (uint32_t)i;
            uint32_t pj = perm ? perm[j] : (uint32_t)j;
            double v = cmp_hessian_get(h, pi, pj);
            if (i == j)
                v = (v == 0.0 ? 1.0 : v) + lambda;
            L[i * n + j] = v;
        }
    ref_cholesky(L, n);
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < n; i++) { /* L y = e_k */
            double t = i == k ? 1.0 : 0.0;
            for (size_t m = 0; m < i; m++)
                t -= L[i * n + m] * y[m];
            y[i] = t / L[i * n + i];
        }
        for (size_t i = n; i-- > 0;) { /* L^T x = y */
            double t = y[i];
            for (size_t m = i + 1; m < n; m++)
                t -= L[m * n + i] * minv[m * n + k];
            minv[i * n + k] = t / L[i * n + i];
        }
    }
    memcpy(L, minv, n * n * sizeof(double));
    ref_cholesky(L, n);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            uref[i * n + j] = j >= i ? L[j * n + i] : 0.0;
    free(L);
    free(y);
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* U from cmp_gptq_hinv_factor (one matrix, in place) is the reference's
 * upper Cholesky factor of M^-1, and U^T U = M^-1, to 1e-9 relative. */
static void check_factor(uint32_t cols, int permute, int dead)
{
    size_t T = 2 * cols + 20;
    float *X = tu_gq_correlated_inputs(T, cols);
    if (dead)
        for (size_t t = 0; t < T; t++)
            X[t * cols + 7] = 0.0f; /* a dead input: H_77 == 0 */
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    uint32_t *perm = NULL;
    if (permute) { /* a random permutation, as act-order would give */
        perm = malloc(cols * sizeof(uint32_t));
        for (uint32_t i = 0; i < cols; i++)
            perm[i] = i;
        for (uint32_t i = cols - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(tu_gq_urand() * (float)(i + 1)) % (i + 1);
            uint32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    }
    double mean = 0.0;
    for (uint32_t j = 0; j < cols; j++) {
        double d = cmp_hessian_get(&h, j, j);
        mean += d == 0.0 ? 1.0 : d;
    }
    double lambda = 0.01 * mean / cols;
    size_t nn = (size_t)cols * cols;
    double *U = malloc(nn * sizeof(double)), *row = malloc(cols * sizeof(double));
    double *minv = malloc(nn * sizeof(double)), *uref = malloc(nn * sizeof(double));
    assert_int_equal(cmp_gptq_hinv_factor(&h, perm, lambda, U, row, NULL, NULL), MC_OK);
    ref_factor(&h, perm, lambda, minv, uref);
    double su = max_abs(uref, nn), sm = max_abs(minv, nn), eu = 0.0, em = 0.0;
    for (uint32_t i = 0; i < cols; i++)
        for (uint32_t j = 0; j < cols; j++) {
            if (j < i)
                assert_true(U[(size_t)i * cols + j] == 0.0);
            if (j == i)
                assert_true(U[(size_t)i * cols + i] > 0.0);
            eu = fmax(eu, fabs(U[(size_t)i * cols + j] - uref[(size_t)i * cols + j]));
            double utu = 0.0; /* (U^T U)_ij = sum_k U_ki U_kj */
            for (uint32_t k = 0; k < cols; k++)
                utu += U[(size_t)k * cols + i] * U[(size_t)k * cols + j];
            em = fmax(em, fabs(utu - minv[(size_t)i * cols + j]));
        }
    print_message("factor %u perm %d dead %d: |U - Uref| %.3g of %.3g, "
                  "|U^T U - M^-1| %.3g of %.3g\n", cols, permute, dead, eu, su,
                  em, sm);
    assert_true(eu <= 1e-9 * su);
    assert_true(em <= 1e-9 * sm);
    free(U);
    free(row);
    free(minv);
    free(uref);
    free(perm);
    cmp_hessian_free(&h);
    free(X);
}

static void test_gptq_inverse_factor_matches_reference(void **state)
{
    (void)state;
    check_factor(40, 0, 0);
    check_factor(40, 1, 0);  /* act-order-like permutation */
    check_factor(41, 1, 1);  /* odd width: the diagonal's middle stays */
    check_factor(41, 0, 1);
    check_factor(1, 0, 0);
}

/* Rows in chunks: the float work copy holds chunk_rows rows at a time, and
 * the result is bit for bit the whole-matrix one (ragged last chunk too),
 * and so is the scalar path's. */
static void test_gptq_row_chunks_give_identical_results(void **state)
{
    (void)state;
    uint32_t rows = 23, cols = 100;
    size_t T = 300;
    float *X = tu_gq_correlated_inputs(T, cols);
    for (size_t t = 0; t < T; t++)
        X[t * cols + 11] = 0.0f; /* dead column zeroed per chunk too */
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    struct {
        kn_wformat f;
        uint32_t g, block;
        int act, search;
    } cs[4] = {{KN_W_Q4, 32, 128, 0, 0}, {KN_W_Q4, 32, 64, 1, 1},
               {KN_W_Q8, 0, 48, 0, 0}, {KN_W_Q4S, 64, 0, 0, 1}};
    /* the last: the whole matrix on the scalar path (the AVX2 update
     * takes six rows at a time, then the rest; columns in 8-column
     * strips, then the ragged one; blocks 64 and 48 leave later columns
     * to it) */
    uint32_t chunks[3] = {5, 1, 0};
    size_t nel = (size_t)rows * cols;
    for (int c = 0; c < 4; c++) {
        tu_gq_qm a;
        tu_gq_qm_init(&a, cs[c].f, rows, cols, cs[c].g);
        float *da = malloc(nel * sizeof(float));
        cmp_gptq_opts o = {0.01, cs[c].act, cs[c].block, cs[c].search, 0};
        assert_int_equal(cmp_gptq_quantize(w, &h, &o, &a.b, da, NULL, NULL), MC_OK);
        for (int k = 0; k < 3; k++) {
            tu_gq_qm b;
            tu_gq_qm_init(&b, cs[c].f, rows, cols, cs[c].g);
            float *db = malloc(nel * sizeof(float));
            o.chunk_rows = chunks[k];
            kn_set_force_scalar(k == 2);
            assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, db, NULL, NULL), MC_OK);
            kn_set_force_scalar(0);
            assert_memory_equal(a.data, b.data, kn_wformat_data_bytes(cs[c].f, rows, cols));
            assert_memory_equal(a.scales, b.scales,
                                kn_wformat_scale_bytes(cs[c].f, rows, cols, cs[c].g));
            if (a.zeros)
                assert_memory_equal(a.zeros, b.zeros,
                                    kn_wformat_zero_bytes(cs[c].f, rows, cols, cs[c].g));
            assert_memory_equal(da, db, nel * sizeof(float));
            free(db);
            tu_gq_qm_free(&b);
        }
        free(da);
        tu_gq_qm_free(&a);
    }
    cmp_hessian_free(&h);
    free(w);
    free(X);
}

/* keep_params: given the parameters a normal run chose, a second run that
 * keeps them reproduces that run's codes exactly (the compensation is the
 * same; only who chooses the grid differs), and leaves them unchanged. */
static void test_gptq_keep_params_reproduces_codes(void **state)
{
    (void)state;
    uint32_t rows = 9, cols = 100;
    size_t T = 300;
    float *X = tu_gq_correlated_inputs(T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    struct {
        kn_wformat f;
        uint32_t g;
        int act, search;
    } cs[4] = {{KN_W_Q4, 32, 0, 1}, {KN_W_Q4, 32, 1, 0}, {KN_W_Q8, 0, 0, 0},
               {KN_W_Q4S, 64, 0, 1}};
    for (int c = 0; c < 4; c++) {
        uint64_t db = kn_wformat_data_bytes(cs[c].f, rows, cols);
        uint64_t sb = kn_wformat_scale_bytes(cs[c].f, rows, cols, cs[c].g);
        uint64_t zb = kn_wformat_zero_bytes(cs[c].f, rows, cols, cs[c].g);
        tu_gq_qm a, b;
        tu_gq_qm_init(&a, cs[c].f, rows, cols, cs[c].g);
        tu_gq_qm_init(&b, cs[c].f, rows, cols, cs[c].g);
        cmp_gptq_opts o = {0.01, cs[c].act, 128, cs[c].search, 0, 0};
        assert_int_equal(cmp_gptq_quantize(w, &h, &o, &a.b, NULL, NULL, NULL), MC_OK);
        memcpy(b.scales, a.scales, sb);
        if (zb)
            memcpy(b.zeros, a.zeros, zb);
        memset(b.data, 0x5a, db);
        o.keep_params = 1;
        assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, NULL, NULL, NULL), MC_OK);
        assert_memory_equal(a.data, b.data, db);
        assert_memory_equal(a.scales, b.scales, sb);
        if (zb)
            assert_memory_equal(a.zeros, b.zeros, zb);
        tu_gq_qm_free(&a);
        tu_gq_qm_free(&b);
    }
    cmp_hessian_free(&h);
    free(w);
    free(X);
}

/* A factor made once and given to quantize (the linears of a group share
 * it) gives exactly quantize's own result, with and without act-order, at
 * int8 and int4; a factor of another width or order is refused. */
static void test_gptq_shared_factor_gives_identical_codes(void **state)
{
    (void)state;
    uint32_t rows = 24, cols = 96;
    size_t T = 256;
    float *X = tu_gq_correlated_inputs(T, cols);
    float *w = tu_gq_rand_w(rows, cols);
    cmp_hessian h;
    tu_gq_hessian_of(&h, X, T, cols);
    static const kn_wformat fmts[2] = {KN_W_Q8, KN_W_Q4};
    for (int fi = 0; fi < 2; fi++)
        for (int ao = 0; ao < 2; ao++) {
            tu_gq_qm a, b;
            tu_gq_qm_init(&a, fmts[fi], rows, cols, 32);
            tu_gq_qm_init(&b, fmts[fi], rows, cols, 32);
            cmp_gptq_opts o = {0.01, ao, 128, 1};
            double da = 0.0, db = 0.0;
            assert_int_equal(cmp_gptq_quantize(w, &h, &o, &a.b, NULL, &da, NULL), MC_OK);
            cmp_gptq_factor f;
            assert_int_equal(cmp_gptq_factor_make(&h, 0.01, ao, NULL, NULL, &f, NULL),
                             MC_OK);
            o.factor = &f;
            assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, NULL, &db, NULL), MC_OK);
            assert_true(da == db);
            assert_memory_equal(a.b.data, b.b.data,
                                kn_wformat_data_bytes(fmts[fi], rows, cols));
            assert_memory_equal(a.b.scales, b.b.scales,
                                kn_wformat_scale_bytes(fmts[fi], rows, cols, a.b.group));
            o.act_order = !ao; /* a factor of the other order */
            mc_error e;
            assert_int_equal(cmp_gptq_quantize(w, &h, &o, &b.b, NULL, NULL, &e),
                             MC_ERR_INVALID_ARG);
            cmp_gptq_factor_free(&f);
            cmp_gptq_factor_free(&f); /* twice: a no-op */
            tu_gq_qm_free(&a);
            tu_gq_qm_free(&b);
        }
    cmp_hessian_free(&h);
    free(X);
    free(w);
}

/* GPTQ's update of later columns (kn_avx2_gptq_update) gives the scalar
 * loop's bits: each value's chain in double over the block's errors in
 * order, one fma per error, rounded to float once; six rows at a time
 * then the rest, whole strips then the ragged one (whose lanes beyond the
 * columns are neither read nor written). */
static void test_gptq_update_kernel_gives_the_scalar_bits(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx2()) {
        print_message("no AVX2 on this CPU: the kernel is not used\n");
        return;
    }
    enum { NR = 13, LDW = 61, NE = 37, LDE = 40, NC = 45, S = KN_GPTQ_STRIP };
    enum { NS = (NC + S - 1) / S };
    float *W = malloc(NR * LDW * sizeof(float)), *ref = malloc(NR * LDW * sizeof(float));
    float *E = malloc(NR * LDE * sizeof(float));
    double *P = malloc(NS * NE * S * sizeof(double));
    assert_true(W && ref && E && P);
    for (int i = 0; i < NR * LDW; i++)
        W[i] = i % 11 == 0 ? -0.0f : tu_gq_nrand();
    for (int i = 0; i < NR * LDE; i++)
        E[i] = i % 5 == 0 || i / LDE == 2 ? 0.0f : 0.1f * tu_gq_nrand(); /* row 2: all */
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NE; t++)
            for (int l = 0; l < S; l++)
                P[(s * NE + t) * S + l] =
                    s * S + l >= NC ? 0.0 : (t + l) % 7 == 0 ? -1.0 : (double)tu_gq_nrand() / 3.0;
    memcpy(ref, W, NR * LDW * sizeof(float));
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) {
            double acc = ref[r * LDW + c];
            for (int t = 0; t < NE; t++)
                acc = fma(-(double)E[r * LDE + t], P[((c / S) * NE + t) * S + c % S], acc);
            ref[r * LDW + c] = (float)acc;
        }
    /* columns NC .. LDW - 1 are past the update: the kernel leaves them */
    kn_avx2_gptq_update(W, LDW, NR, E, LDE, P, NE, NC);
    assert_memory_equal(W, ref, NR * LDW * sizeof(float));
    free(W);
    free(ref);
    free(E);
    free(P);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hessian_accumulates_x_transpose_x),
        cmocka_unit_test(test_gptq_update_kernel_gives_the_scalar_bits),
        cmocka_unit_test(test_hessian_packed_row_offsets),
        cmocka_unit_test(test_output_error_rows_are_independent_of_blocking),
        cmocka_unit_test(test_retarget_solves_normal_equations_blockwise),
        cmocka_unit_test(test_gptq_beats_rtn_int8_per_channel),
        cmocka_unit_test(test_gptq_beats_rtn_int4_ragged_groups),
        cmocka_unit_test(test_gptq_act_order_with_static_groups_beats_rtn),
        cmocka_unit_test(test_gptq_dead_columns_become_zero),
        cmocka_unit_test(test_gptq_with_diagonal_hessian_equals_rtn),
        cmocka_unit_test(test_gptq_rejects_indefinite_hessian),
        cmocka_unit_test(test_gptq_inverse_factor_matches_reference),
        cmocka_unit_test(test_gptq_row_chunks_give_identical_results),
        cmocka_unit_test(test_gptq_keep_params_reproduces_codes),
        cmocka_unit_test(test_gptq_shared_factor_gives_identical_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_qform.c - the tiled quadratic forms (cmp_qform.h) give the bits of
 * the plain references they replace: the eight-row output error
 * (cmp_hessian_output_error_terms) for the packed H, and one row at a time
 * for the cross term and the product M x; at widths below a tile, not a
 * multiple of four or of a tile, and above one tile; with zero rows, zero
 * columns, short blocks and more rows than a chunk; on the AVX2 path and
 * forced scalar; and on pools of 1, 2 and 3 threads.  The scale refit's
 * tiled sums give the bits of its one-pass reference. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_gptq.h"
#include "cmp_gptq_internal.h"
#include "cmp_lanes.h"
#include "cmp_qform.h"
#include "kn_ops.h"
#include "testutil.h"

static tu_rng g_rng = {0x9f0e17};

/* Widths: below four, below a tile row, not a multiple of four, one tile
 * exactly, just over one and several tile columns, ragged. */
static const uint32_t WIDTHS[] = {3, 5, 67, 64, 513, 1100};
/* Rows: one, a short block, blocks, more than a chunk with a tail. */
static const uint32_t ROWS[] = {1, 7, 16, 137};

/* A random double with all 53 bits of its mantissa in play: float
 * inputs alone would make many sums exact, and then any order would
 * pass. */
static double rnd53(void)
{
    return (double)tu_rng_f(&g_rng) + (double)tu_rng_f(&g_rng) * 0x1p-24;
}

/* A symmetric matrix with a dominant diagonal (full-precision elements),
 * input `dead` zero (a dead column: its row and column are zero). */
static void make_h(cmp_hessian *h, uint32_t n, uint32_t dead)
{
    assert_int_equal(cmp_hessian_init(h, n, NULL), MC_OK);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i; j < n; j++) {
            double v = i == j ? 4.0 + rnd53() : rnd53() / 8.0;
            cmp_hessian_set(h, i, j, i == dead % n || j == dead % n ? 0.0 : v);
        }
    h->n = 1;
}

/* Weights with adversarial rows: row 2 all zero, row 3 equal to its
 * quantized copy (a zero difference), column 1 zero everywhere. */
static void make_wq(uint32_t rows, uint32_t n, float **w, float **q)
{
    *w = malloc((size_t)rows * n * sizeof(float));
    *q = malloc((size_t)rows * n * sizeof(float));
    assert_non_null(*w);
    assert_non_null(*q);
    tu_rng_fill(&g_rng, *w, (size_t)rows * n, 0.1f);
    for (size_t i = 0; i < (size_t)rows * n; i++)
        (*q)[i] = roundf((*w)[i] * 64.0f) / 64.0f;
    for (uint32_t r = 0; r < rows; r++) {
        if (n > 1)
            (*w)[(size_t)r * n + 1] = (*q)[(size_t)r * n + 1] = 0.0f;
        for (uint32_t c = 0; c < n; c++) {
            size_t at = (size_t)r * n + c;
            if (r == 2)
                (*w)[at] = (*q)[at] = 0.0f;
            if (r == 3)
                (*q)[at] = (*w)[at];
        }
    }
}

static void check_sym(int scalar)
{
    kn_set_force_scalar(scalar);
    for (size_t a = 0; a < sizeof WIDTHS / sizeof WIDTHS[0]; a++) {
        uint32_t n = WIDTHS[a];
        cmp_hessian h;
        make_h(&h, n, n / 2);
        for (size_t b = 0; b < sizeof ROWS / sizeof ROWS[0]; b++) {
            uint32_t rows = ROWS[b];
            float *w, *q;
            make_wq(rows, n, &w, &q);
            double *ref = malloc(rows * sizeof(double)),
                   *got = malloc(rows * sizeof(double)),
                   *d = malloc((size_t)CMP_OERR_ROWS * n * sizeof(double)),
                   *work = malloc(cmp_qform_work_doubles(n, rows) * sizeof(double));
            assert_non_null(ref);
            assert_non_null(got);
            assert_non_null(d);
            assert_non_null(work);
            for (int qn = 0; qn < 2; qn++) {
                const float *qq = qn ? NULL : q;
                cmp_hessian_output_error_terms(&h, w, qq, rows, d, ref);
                cmp_qform_sym_terms(&h, w, qq, rows, work, got);
                assert_memory_equal(ref, got, rows * sizeof(double));
                if (rows > 3)
                    assert_true(got[2] == 0.0 && (qn || got[3] == 0.0));
            }
            free(ref);
            free(got);
            free(d);
            free(work);
            free(w);
            free(q);
        }
        cmp_hessian_free(&h);
    }
    kn_set_force_scalar(0);
}

static void test_qform_sym_gives_the_eight_row_bits(void **state)
{
    (void)state;
    check_sym(0);
}

static void test_qform_sym_scalar_gives_the_eight_row_bits(void **state)
{
    (void)state;
    check_sym(1);
}

/* The plain one-row reference of the cross term: each inner sum one chain
 * over j ascending from 0.0 (cmp_lanes.h's rule), the outer sum over i
 * ascending skipping zero a_ri. */
static double cross_ref(const double *M, size_t n, const float *a, const float *b)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double t[CMP_LANES] = {0};
        cmp_lanes_dot_f(t, 1.0, M + i * n, b, 1, 0, 0, n);
        if (a[i] != 0.0f)
            s += a[i] * t[0];
    }
    return s;
}

static void test_qform_cross_and_rows_give_the_one_row_bits(void **state)
{
    (void)state;
    for (int scalar = 0; scalar < 2; scalar++) {
        kn_set_force_scalar(scalar);
        for (size_t a = 0; a < sizeof WIDTHS / sizeof WIDTHS[0]; a++) {
            uint32_t n = WIDTHS[a];
            double *M = malloc((size_t)n * n * sizeof(double));
            assert_non_null(M);
            for (size_t i = 0; i < (size_t)n * n; i++)
                M[i] = rnd53(); /* not symmetric */
            uint32_t rows = ROWS[a % 4];
            float *w, *q;
            make_wq(rows, n, &w, &q);
            double *got = malloc(rows * sizeof(double)),
                   *work = malloc(cmp_qform_work_doubles(n, rows) * sizeof(double));
            assert_non_null(got);
            assert_non_null(work);
            cmp_qform_cross_terms(M, n, w, q, rows, work, got);
            for (uint32_t r = 0; r < rows; r++) {
                double ref = cross_ref(M, n, w + (size_t)r * n, q + (size_t)r * n);
                assert_memory_equal(&ref, &got[r], sizeof ref);
            }
            /* M x for two blocks (the second short): every element one chain */
            uint32_t nb = 2;
            double *x = calloc((size_t)nb * n * CMP_LANES, sizeof(double)),
                   *t = malloc((size_t)nb * n * CMP_LANES * sizeof(double));
            assert_non_null(x);
            assert_non_null(t);
            for (size_t i = 0; i < (size_t)nb * n * CMP_LANES - 3 * n; i++)
                x[i] = tu_rng_f(&g_rng);
            cmp_qform_rows(M, n, x, nb, t);
            for (uint32_t b = 0; b < nb; b++)
                for (uint32_t i = 0; i < n; i++) {
                    double ref[CMP_LANES] = {0};
                    cmp_lanes_dot(ref, 1.0, M + (size_t)i * n, x + (size_t)b * n * CMP_LANES,
                                  CMP_LANES, 1, 0, n);
                    assert_memory_equal(ref, t + ((size_t)b * n + i) * CMP_LANES,
                                        sizeof ref);
                }
            free(x);
            free(t);
            free(got);
            free(work);
            free(w);
            free(q);
            free(M);
        }
    }
    kn_set_force_scalar(0);
}

static void test_qform_par_same_bits_on_any_pool(void **state)
{
    (void)state;
    uint32_t n = 300, rows = 277;
    cmp_hessian h;
    make_h(&h, n, 7);
    float *w, *q;
    make_wq(rows, n, &w, &q);
    double *M = malloc((size_t)n * n * sizeof(double));
    assert_non_null(M);
    for (size_t i = 0; i < (size_t)n * n; i++)
        M[i] = rnd53();
    double ref = cmp_hessian_output_error(&h, w, q, rows);
    double s1 = cmp_qform_sym_par(NULL, &h, w, q, rows);
    double c1 = cmp_qform_cross_par(NULL, M, n, w, q, rows);
    assert_memory_equal(&ref, &s1, sizeof ref);
    assert_true(isfinite(c1));
    for (int T = 2; T <= 3; T++) {
        kn_pool *p = tu_pool_warm(T);
        double s = cmp_hessian_output_error_par(p, &h, w, q, rows);
        double c = cmp_qform_cross_par(p, M, n, w, q, rows);
        assert_memory_equal(&s1, &s, sizeof s);
        assert_memory_equal(&c1, &c, sizeof c);
        kn_pool_free(p);
    }
    /* against a plain double sum by relative error (the measure is exact
     * up to rounding: no float products anywhere) */
    double plain = 0.0;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++) {
                size_t a = (size_t)r * n;
                plain += ((double)w[a + i] - q[a + i]) * cmp_hessian_get(&h, i, j) *
                         ((double)w[a + j] - q[a + j]);
            }
    assert_true(fabs(s1 - plain) <= 1e-12 * fabs(plain));
    free(M);
    free(w);
    free(q);
    cmp_hessian_free(&h);
}

/* The scale refit's tiled sums give the one-pass reference's bits, block
 * by block: group spans that divide a tile, straddle it, and span the
 * whole row (Q8), ragged last groups, zero codes, one to five blocks;
 * spans of 1-3 columns, where rows paired by the AVX2 path straddle
 * groups and a row's own segment is empty. */
static void test_qform_refit_sums_tiled_give_the_reference_bits(void **state)
{
    (void)state;
    static const struct { uint32_t K, span; } cs[] = {
        {5, 5}, {67, 32}, {64, 64}, {600, 32}, {600, 600}, {1100, 128}, {1100, 96},
        {70, 1}, {131, 2}, {97, 3}};
    for (int scalar = 0; scalar < 2; scalar++) {
        kn_set_force_scalar(scalar);
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            uint32_t K = cs[c].K, span = cs[c].span, G = (K + span - 1) / span;
            uint32_t nb = 1 + (uint32_t)(c % 5);
            cmp_hessian h;
            make_h(&h, K, K / 3);
            size_t kb = (size_t)K * CMP_LANES, gb = (size_t)G * G * CMP_LANES;
            double *a = malloc(nb * kb * sizeof(double)), *wd = malloc(nb * kb * sizeof(double));
            double *M = malloc(nb * gb * sizeof(double)), *hw = malloc(nb * kb * sizeof(double));
            double *sap = malloc(nb * kb * sizeof(double)), *hwp = malloc(nb * kb * sizeof(double));
            double *Mr = malloc(gb * sizeof(double)), *hr = malloc(kb * sizeof(double));
            assert_true(a && wd && M && hw && sap && hwp && Mr && hr);
            for (size_t i = 0; i < nb * kb; i++) {
                a[i] = (double)(int)(tu_rng_u32(&g_rng) % 16) - 8.0; /* zeros too */
                wd[i] = rnd53();
            }
            cmp_gptq_refit_sums_tiled(&h, span, G, nb, a, wd, M, hw, sap, hwp, 0);
            for (uint32_t b = 0; b < nb; b++) {
                cmp_gptq_refit_sums_ref(&h, span, G, a + b * kb, wd + b * kb, Mr, hr);
                assert_memory_equal(Mr, M + b * gb, gb * sizeof(double));
                assert_memory_equal(hr, hw + b * kb, kb * sizeof(double));
            }
            /* H w given (new codes, the weights not read): M alone, the
             * same bits, hw left as it was */
            for (size_t i = 0; i < nb * kb; i++) {
                a[i] = (double)(int)(tu_rng_u32(&g_rng) % 16) - 8.0;
                wd[i] = NAN;
            }
            memcpy(hwp, hw, nb * kb * sizeof(double));
            cmp_gptq_refit_sums_tiled(&h, span, G, nb, a, NULL, M, hw, sap, NULL, 1);
            assert_memory_equal(hwp, hw, nb * kb * sizeof(double));
            for (uint32_t b = 0; b < nb; b++) {
                /* any finite weights: M does not read them */
                cmp_gptq_refit_sums_ref(&h, span, G, a + b * kb, hwp + b * kb, Mr, hr);
                assert_memory_equal(Mr, M + b * gb, gb * sizeof(double));
            }
            free(a);
            free(wd);
            free(M);
            free(hw);
            free(sap);
            free(hwp);
            free(Mr);
            free(hr);
            cmp_hessian_free(&h);
        }
    }
    kn_set_force_scalar(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qform_sym_gives_the_eight_row_bits),
        cmocka_unit_test(test_qform_sym_scalar_gives_the_eight_row_bits),
        cmocka_unit_test(test_qform_cross_and_rows_give_the_one_row_bits),
        cmocka_unit_test(test_qform_par_same_bits_on_any_pool),
        cmocka_unit_test(test_qform_refit_sums_tiled_give_the_reference_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

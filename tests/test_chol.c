/* test_chol.c - the blocked Cholesky factorization and triangular inverse
 * (cmp_chol.h) and their register tile (kn_ddot.h): the tile's AVX2 and
 * scalar bodies agree bit for bit; the blocked factor matches the plain
 * column-by-column reference on sizes that are and are not multiples of
 * the block (tiny ones included); a matrix that is not positive definite
 * fails in any block; X L = I for the inverse; and one, two and three
 * threads give the same bits. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_chol.h"
#include "kn_ddot.h"
#include "kn_ops.h"

static uint64_t g_seed = 88172645463325252ull;

static double urand(void) /* uniform in [-1, 1) */
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_seed >> 11) / (double)(1ull << 52) - 1.0;
}

/* A random SPD n x n matrix, full: X^T X / m over m = n + 8 rows of
 * correlated inputs (input j mixes j - 1) plus 0.01 I. */
static double *spd(size_t n)
{
    size_t m = n + 8;
    double *x = malloc(m * n * sizeof(double)), *a = calloc(n * n, sizeof(double));
    assert_non_null(x);
    assert_non_null(a);
    for (size_t t = 0; t < m; t++)
        for (size_t j = 0; j < n; j++)
            x[t * n + j] = urand() + (j ? 0.5 * x[t * n + j - 1] : 0.0);
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
            double s = 0.0;
            for (size_t t = 0; t < m; t++)
                s += x[t * n + i] * x[t * n + j];
            a[i * n + j] = a[j * n + i] = s / (double)m + (i == j ? 0.01 : 0.0);
        }
    free(x);
    return a;
}

static double *dup(const double *a, size_t n)
{
    double *b = malloc(n * n * sizeof(double));
    assert_non_null(b);
    memcpy(b, a, n * n * sizeof(double));
    return b;
}

/* ---- the tile --------------------------------------------------------- */

/* Both bodies of the tile give the same bits for every length (the
 * k mod 4 tail included) and every edge shape, and agree with a plain
 * double dot product to rounding. */
static void test_ddot_tile_bodies_agree(void **state)
{
    (void)state;
    enum { LD = 300 };
    double *a = malloc(KN_DDOT_MR * LD * sizeof(double));
    double *b = malloc(KN_DDOT_NR * LD * sizeof(double));
    for (size_t i = 0; i < KN_DDOT_MR * LD; i++)
        a[i] = urand();
    for (size_t i = 0; i < KN_DDOT_NR * LD; i++)
        b[i] = urand();
    static const size_t ms[] = {0, 1, 3, 4, 5, 8, 131, 257};
    for (size_t t = 0; t < sizeof ms / sizeof ms[0]; t++)
        for (int mr = 1; mr <= KN_DDOT_MR; mr++)
            for (int nr = 1; nr <= KN_DDOT_NR; nr++) {
                double o1[KN_DDOT_MR * KN_DDOT_NR], o2[KN_DDOT_MR * KN_DDOT_NR];
                kn_set_force_scalar(1);
                kn_ddot_tile(a, LD, b, LD, ms[t], mr, nr, o1);
                kn_set_force_scalar(0);
                kn_ddot_tile(a, LD, b, LD, ms[t], mr, nr, o2);
                for (int r = 0; r < mr; r++)
                    for (int c = 0; c < nr; c++) {
                        double s = 0.0, sa = 0.0;
                        for (size_t k = 0; k < ms[t]; k++) {
                            s += a[r * LD + k] * b[c * LD + k];
                            sa += fabs(a[r * LD + k] * b[c * LD + k]);
                        }
                        assert_true(o1[r * KN_DDOT_NR + c] == o2[r * KN_DDOT_NR + c]);
                        assert_true(fabs(o1[r * KN_DDOT_NR + c] - s) <= 1e-14 * (sa + 1.0));
                    }
            }
    free(a);
    free(b);
}

/* The axpy tile: both bodies give the same bits, a chain of fused
 * multiply-adds from y's value, for full and short tiles. */
static void test_daxpy_tile_bodies_agree(void **state)
{
    (void)state;
    enum { LD = 40, M = 37 };
    float w[KN_DAXPY_MR * LD];
    double b[M * LD], y0[KN_DAXPY_MR * LD], y1[KN_DAXPY_MR * LD], y2[KN_DAXPY_MR * LD];
    for (size_t i = 0; i < KN_DAXPY_MR * LD; i++) {
        w[i] = (float)urand();
        y0[i] = y1[i] = y2[i] = urand();
    }
    for (size_t i = 0; i < M * LD; i++)
        b[i] = urand();
    for (int mr = 1; mr <= KN_DAXPY_MR; mr++) {
        memcpy(y1, y0, sizeof y0);
        memcpy(y2, y0, sizeof y0);
        kn_set_force_scalar(1);
        kn_daxpy_tile(w, LD, b, LD, M, mr, y1, LD);
        kn_set_force_scalar(0);
        kn_daxpy_tile(w, LD, b, LD, M, mr, y2, LD);
        assert_memory_equal(y1, y2, sizeof y1);
        for (int r = 0; r < KN_DAXPY_MR; r++)
            for (int c = 0; c < KN_DAXPY_NR; c++) {
                double t = y0[r * LD + c];
                for (size_t i = 0; i < M; i++)
                    t = fma((double)w[r * LD + i], b[i * LD + c], t);
                assert_true(y1[r * LD + c] == (r < mr ? t : y0[r * LD + c]));
            }
    }
}

/* ---- the factorization ------------------------------------------------ */

/* Blocked against the reference: max |L - Lref| <= 1e-11 max |Lref|, the
 * upper triangle untouched, and L L^T = A to 1e-12 relative. */
static void check_against_ref(size_t n)
{
    double *a = spd(n), *l = dup(a, n), *r = dup(a, n);
    for (size_t i = 0; i < n; i++) /* mark the upper triangle */
        for (size_t j = i + 1; j < n; j++)
            l[i * n + j] = -7.0;
    assert_int_equal(cmp_chol_lower(l, n, NULL), 0);
    assert_int_equal(cmp_chol_lower_ref(r, n), 0);
    double e = 0.0, m = 0.0, ea = 0.0, ma = 0.0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            if (j > i) {
                assert_true(l[i * n + j] == -7.0);
                continue;
            }
            e = fmax(e, fabs(l[i * n + j] - r[i * n + j]));
            m = fmax(m, fabs(r[i * n + j]));
            double s = 0.0;
            for (size_t k = 0; k <= j; k++)
                s += l[i * n + k] * l[j * n + k];
            ea = fmax(ea, fabs(s - a[i * n + j]));
            ma = fmax(ma, fabs(a[i * n + j]));
        }
    print_message("cholesky n %zu: |L - Lref| %.3g of %.3g, |L L^T - A| %.3g of %.3g\n",
                  n, e, m, ea, ma);
    assert_true(e <= 1e-11 * m);
    assert_true(ea <= 1e-12 * ma);
    free(a);
    free(l);
    free(r);
}

static void test_cholesky_matches_reference(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 2, 7, 127, CMP_CHOL_NB, CMP_CHOL_NB + 1,
                                2 * CMP_CHOL_NB + 45, 3 * CMP_CHOL_NB};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++)
        check_against_ref(ns[t]);
}

/* A pivot that is not positive (in the first block, in a later block, in
 * a matrix of one element) or not a number fails, as the reference does. */
static void test_cholesky_rejects_indefinite(void **state)
{
    (void)state;
    static const size_t cases[][2] = {{1, 0}, {7, 3}, {300, 5}, {300, 200}, {300, 299}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        size_t n = cases[t][0], k = cases[t][1];
        double *a = spd(n);
        a[k * n + k] = -a[k * n + k]; /* a negative diagonal: indefinite */
        double *b = dup(a, n);
        assert_int_equal(cmp_chol_lower(a, n, NULL), -1);
        assert_int_equal(cmp_chol_lower_ref(b, n), -1);
        free(a);
        free(b);
    }
    size_t n = 260;
    double *a = spd(n);
    a[200 * n + 3] = NAN;
    assert_int_equal(cmp_chol_lower(a, n, NULL), -1);
    free(a);
    /* positive semidefinite but singular (rank one): a zero pivot */
    a = calloc(n * n, sizeof(double));
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            a[i * n + j] = 1.0;
    assert_int_equal(cmp_chol_lower(a, n, NULL), -1);
    free(a);
}

/* ---- the inverse ------------------------------------------------------- */

/* X = L^-1: X L = I to 1e-10 (relative to |X| |L|), the diagonal in dinv,
 * and a's diagonal and upper triangle (L^T) left as they were. */
static void check_inverse(size_t n)
{
    double *a = spd(n);
    assert_int_equal(cmp_chol_lower(a, n, NULL), 0);
    cmp_chol_mirror_upper(a, n);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            assert_true(a[i * n + j] == a[j * n + i]);
    double *l = dup(a, n), *dinv = malloc(n * sizeof(double));
    cmp_chol_invert_lower(a, dinv, n, NULL);
    double e = 0.0, mx = 0.0, ml = 0.0;
    for (size_t i = 0; i < n; i++) {
        assert_true(a[i * n + i] == l[i * n + i]);
        for (size_t j = i + 1; j < n; j++)
            assert_true(a[i * n + j] == l[i * n + j]);
        for (size_t j = 0; j <= i; j++) {
            double x = j == i ? dinv[i] : a[i * n + j];
            mx = fmax(mx, fabs(x));
            ml = fmax(ml, fabs(l[i * n + j]));
            double s = 0.0; /* (X L)_ij = sum_{k=j}^{i} X[i][k] L[k][j] */
            for (size_t k = j; k <= i; k++)
                s += (k == i ? dinv[i] : a[i * n + k]) * l[k * n + j];
            e = fmax(e, fabs(s - (i == j ? 1.0 : 0.0)));
        }
    }
    print_message("inverse n %zu: |X L - I| %.3g (|X| %.3g, |L| %.3g)\n", n, e, mx, ml);
    assert_true(e <= 1e-10 * fmax(1.0, mx * ml));
    free(a);
    free(l);
    free(dinv);
}

static void test_inverse_is_inverse(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 2, 7, 127, CMP_CHOL_NB, CMP_CHOL_NB + 1,
                                2 * CMP_CHOL_NB + 45};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++)
        check_inverse(ns[t]);
}

/* ---- the solves ---------------------------------------------------------- */

/* cmp_chol_solve_rows: A x = b for each row to 1e-10 relative (A = L L^T,
 * several blocks wide), and each row's bits as when solved alone. */
static void test_solve_rows_solves_each_row_alone(void **state)
{
    (void)state;
    size_t n = 2 * CMP_CHOL_NB + 45, rows = 11;
    double *a = spd(n), *l = dup(a, n);
    assert_int_equal(cmp_chol_lower(l, n, NULL), 0);
    cmp_chol_mirror_upper(l, n);
    double *b = malloc(rows * n * sizeof(double)), *y = malloc(rows * n * sizeof(double));
    for (size_t i = 0; i < rows * n; i++)
        b[i] = y[i] = urand();
    cmp_chol_solve_rows(l, n, y, rows);
    for (size_t r = 0; r < rows; r++) {
        double one[2 * CMP_CHOL_NB + 45];
        memcpy(one, b + r * n, n * sizeof(double));
        cmp_chol_solve_rows(l, n, one, 1);
        assert_memory_equal(one, y + r * n, n * sizeof(double));
        double e = 0.0, m = 0.0;
        for (size_t i = 0; i < n; i++) {
            double s = 0.0, sa = 0.0;
            for (size_t k = 0; k < n; k++) {
                s += a[i * n + k] * y[r * n + k];
                sa += fabs(a[i * n + k] * y[r * n + k]);
            }
            e = fmax(e, fabs(s - b[r * n + i]));
            m = fmax(m, sa);
        }
        assert_true(e <= 1e-10 * m);
    }
    free(a);
    free(l);
    free(b);
    free(y);
}

/* ---- threads and CPU paths --------------------------------------------- */

/* The factor and the inverse on 1, 2 and 3 threads, and on the scalar
 * path, are the same bits. */
static void test_same_bits_any_threads(void **state)
{
    (void)state;
    static const size_t ns[] = {300, 2 * CMP_CHOL_NB + 77};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        double *a = spd(n), *ref = NULL, *dref = NULL;
        for (int v = 0; v < 4; v++) {
            int threads = v < 3 ? v + 1 : 1;
            kn_pool *p = threads > 1 ? kn_pool_create(threads) : NULL;
            double *b = dup(a, n), *d = malloc(n * sizeof(double));
            kn_set_force_scalar(v == 3);
            assert_int_equal(cmp_chol_lower(b, n, p), 0);
            cmp_chol_mirror_upper(b, n);
            cmp_chol_invert_lower(b, d, n, p);
            kn_set_force_scalar(0);
            kn_pool_free(p);
            if (!ref) {
                ref = b;
                dref = d;
                continue;
            }
            assert_memory_equal(b, ref, n * n * sizeof(double));
            assert_memory_equal(d, dref, n * sizeof(double));
            free(b);
            free(d);
        }
        free(a);
        free(ref);
        free(dref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddot_tile_bodies_agree),
        cmocka_unit_test(test_daxpy_tile_bodies_agree),
        cmocka_unit_test(test_cholesky_matches_reference),
        cmocka_unit_test(test_cholesky_rejects_indefinite),
        cmocka_unit_test(test_inverse_is_inverse),
        cmocka_unit_test(test_solve_rows_solves_each_row_alone),
        cmocka_unit_test(test_same_bits_any_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

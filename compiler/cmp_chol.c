/* cmp_chol.c - blocked Cholesky factorization and triangular inverse
 * (see cmp_chol.h). */
#include "cmp_chol.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cmp_lanes.h"
#include "cmp_par.h"
#include "kn_ddot.h"

/* Multiply-adds below which a block step stays on the calling thread:
 * starting threads costs tens of microseconds. */
#define CHOL_PAR_MIN ((size_t)1 << 18)

enum { MR = KN_DDOT_MR, NR = KN_DDOT_NR };

static size_t zmin(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Each thread's copy of a block's chunk of rows (NB x KC doubles, 256
 * KiB): the factor's rows are n doubles apart, a multiple of 4 KiB at
 * every model width, so a tile's four b rows and three x rows all fall in
 * the same L1 sets and evict each other; the copy's rows are 2 KiB apart
 * (bench_factor: the Cholesky 1.4-1.6x faster at n = 8192 and 14336).
 * Thread-local so that nothing allocates. */
static _Thread_local double chol_bpack[CMP_CHOL_NB * CMP_CHOL_KC];

/* Rows [j0, j1) (j1 - j0 <= NB) of a (ld n), columns [kk, kk + m) (m <=
 * KC), into chol_bpack: row j at (j - j0) * KC. */
static const double *pack_rows(const double *a, size_t n, size_t j0,
                               size_t j1, size_t kk, size_t m)
{
    for (size_t j = j0; j < j1; j++)
        memcpy(chol_bpack + (j - j0) * CMP_CHOL_KC, a + j * n + kk,
               m * sizeof(double));
    return chol_bpack;
}

/* dst[q][j] += sign * sum_{k < m} x[q][k] b[j][k] for q < mr and j in
 * [j0, j1): one tile row of mr rows of x (and dst: row stride n) against
 * a block of b's rows packed by pack_rows (b's row j at (j - j0) * KC; x
 * and b at the chunk's first column).  sign is +-1: adding -s is
 * subtracting s, exactly. */
static void tile_strip(const double *x, const double *b, size_t n, size_t m,
                       int mr, size_t j0, size_t j1, double sign, double *dst)
{
    double out[MR * NR];
    for (size_t j = j0; j < j1; j += NR) {
        int nr = (int)zmin(NR, j1 - j);
        kn_ddot_tile(x, n, b + (j - j0) * CMP_CHOL_KC, CMP_CHOL_KC, m, mr, nr, out);
        for (int q = 0; q < mr; q++)
            for (int c = 0; c < nr; c++)
                dst[q * n + j + c] += sign * out[q * NR + c];
    }
}

/* Substitution over the block of columns [j0, j1) of rows y (stride n)
 * whose products with every column outside the block are already
 * subtracted; b's rows are a's.  Forward (back = 0), j ascending:
 *   y[i][j] = (y[i][j] - sum_{j0 <= k < j} y[i][k] a[j][k]) / a[j][j];
 * backward (back = 1), j descending, the sum over j < k < j1.  Eight rows
 * at a time (cmp_lanes.h: each lane does what its row alone would, since
 * t + (-c) y is t - c y exactly), the rest one by one. */
static void rows_solve_block(const double *a, size_t n, double *y, size_t rows,
                             size_t j0, size_t j1, int back)
{
    size_t i = 0;
    for (; i + CMP_LANES <= rows; i += CMP_LANES)
        for (size_t t = 0; t < j1 - j0; t++) {
            size_t j = back ? j1 - 1 - t : j0 + t;
            double v[CMP_LANES];
            for (size_t r = 0; r < CMP_LANES; r++)
                v[r] = y[(i + r) * n + j];
            cmp_lanes_dot(v, -1.0, a + j * n, y + i * n, 1, n,
                          back ? j + 1 : j0, back ? j1 : j);
            for (size_t r = 0; r < CMP_LANES; r++)
                y[(i + r) * n + j] = v[r] / a[j * n + j];
        }
    for (; i < rows; i++) {
        double *yi = y + i * n;
        for (size_t t = 0; t < j1 - j0; t++) {
            size_t j = back ? j1 - 1 - t : j0 + t;
            const double *aj = a + j * n;
            double v = yi[j];
            for (size_t k = back ? j + 1 : j0; k < (back ? j1 : j); k++)
                v -= aj[k] * yi[k];
            yi[j] = v / aj[j];
        }
    }
}

int cmp_chol_lower_ref(double *a, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (size_t k = 0; k < j; k++)
            s -= a[j * n + k] * a[j * n + k];
        if (!(s > 0.0) || !isfinite(s))
            return -1;
        double d = sqrt(s);
        a[j * n + j] = d;
        const double *rj = a + j * n;
        for (size_t i = j + 1; i < n; i++) {
            double t = a[i * n + j];
            const double *ri = a + i * n;
            for (size_t k = 0; k < j; k++)
                t -= ri[k] * rj[k];
            a[i * n + j] = t / d;
        }
    }
    return 0;
}

/* One block step of the factorization: columns [k0, k1). */
typedef struct chol_step {
    double *a;
    size_t n, k0, k1;
} chol_step;

/* a[i][j] -= sum_{k < k0} a[i][k] a[j][k] for rows k0 + [r0, r1) and
 * columns j in [k0, k1), j <= i.  Chunks of CMP_CHOL_KC columns outside,
 * so the block's chunk of rows (NB x KC) stays in L2 for every row tile;
 * each element subtracts the chunks' sums in chunk order. */
static void chol_update_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    (void)slot;
    const chol_step *s = ctx;
    double *a = s->a;
    size_t n = s->n, k0 = s->k0, k1 = s->k1, i1 = k0 + r1;
    double out[MR * NR];
    for (size_t kk = 0; kk < k0; kk += CMP_CHOL_KC) {
        size_t m = zmin(CMP_CHOL_KC, k0 - kk);
        const double *bp = pack_rows(a, n, k0, k1, kk, m);
        for (size_t i = k0 + r0; i < i1; i += MR) {
            int mr = (int)zmin(MR, i1 - i);
            for (size_t j = k0; j < k1 && j < i + (size_t)mr; j += NR) {
                int nr = (int)zmin(NR, k1 - j);
                kn_ddot_tile(a + i * n + kk, n, bp + (j - k0) * CMP_CHOL_KC,
                             CMP_CHOL_KC, m, mr, nr, out);
                for (int r = 0; r < mr; r++)
                    for (int c = 0; c < nr && j + (size_t)c <= i + (size_t)r; c++)
                        a[(i + r) * n + j + c] -= out[r * NR + c];
            }
        }
    }
}

/* Rows k1 + [r0, r1) of the block's columns, already updated by the
 * earlier columns: the forward substitution with the factored diagonal
 * block. */
static void chol_solve_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    (void)slot;
    const chol_step *s = ctx;
    rows_solve_block(s->a, s->n, s->a + (s->k1 + r0) * s->n, r1 - r0, s->k0,
                     s->k1, 0);
}

/* The diagonal block [k0, k1)^2, already updated by the earlier columns,
 * factorized in place as cmp_chol_lower_ref does over its own columns. */
static int chol_diag_block(double *a, size_t n, size_t k0, size_t k1)
{
    for (size_t j = k0; j < k1; j++) {
        const double *rj = a + j * n;
        double s = rj[j];
        for (size_t k = k0; k < j; k++)
            s -= rj[k] * rj[k];
        if (!(s > 0.0) || !isfinite(s))
            return -1;
        double d = sqrt(s);
        a[j * n + j] = d;
        for (size_t i = j + 1; i < k1; i++) {
            double *ri = a + i * n;
            double t = ri[j];
            for (size_t k = k0; k < j; k++)
                t -= ri[k] * rj[k];
            ri[j] = t / d;
        }
    }
    return 0;
}

int cmp_chol_lower(double *a, size_t n, kn_pool *pool)
{
    for (size_t k0 = 0; k0 < n; k0 += CMP_CHOL_NB) {
        size_t k1 = zmin(k0 + CMP_CHOL_NB, n), nb = k1 - k0;
        chol_step s = {a, n, k0, k1};
        uint32_t rows = (uint32_t)(n - k0);
        if (k0 > 0) {
            if ((size_t)rows * nb * k0 >= CHOL_PAR_MIN)
                cmp_par_rows(pool, rows, MR, chol_update_rows, &s);
            else
                chol_update_rows(&s, 0, rows, 0);
        }
        if (chol_diag_block(a, n, k0, k1) != 0)
            return -1;
        rows = (uint32_t)(n - k1);
        if ((size_t)rows * nb * nb / 2 >= CHOL_PAR_MIN)
            cmp_par_rows(pool, rows, CMP_LANES, chol_solve_rows, &s);
        else if (rows)
            chol_solve_rows(&s, 0, rows, 0);
    }
    return 0;
}

/* a[i][k] = a[k][i] (to_upper) or a[k][i] = a[i][k] for every k > i, in
 * 32 x 32 tiles so that both the rows read and the columns written stay
 * in cache. */
static void mirror(double *a, size_t n, int to_upper)
{
    enum { TB = 32 };
    for (size_t i0 = 0; i0 < n; i0 += TB)
        for (size_t k0 = i0; k0 < n; k0 += TB)
            for (size_t k = k0; k < zmin(k0 + TB, n); k++)
                for (size_t i = i0; i < zmin(i0 + TB, k); i++) {
                    if (to_upper)
                        a[i * n + k] = a[k * n + i];
                    else
                        a[k * n + i] = a[i * n + k];
                }
}

void cmp_chol_mirror_upper(double *a, size_t n)
{
    mirror(a, n, 1);
}

void cmp_chol_mirror_lower(double *a, size_t n)
{
    mirror(a, n, 0);
}

/* One column block of the inverse: columns [j0, j1), rows [base, n)
 * (base: j0 rounded down to a multiple of MR, so that tiles start at
 * absolute multiples of MR whatever the split). */
typedef struct inv_step {
    double *a;
    const double *dinv;
    size_t n, j0, j1, base;
} inv_step;

/* Rows [r0, r1) (absolute; r0 a multiple of MR unless r0 == r1) of the
 * block's columns of X.  Element (i, j), j < i, starts at 0 and has the
 * terms X[i][k] L^T[j][k] subtracted in this fixed order: the tile
 * products over k in [j1, i0) (i0 = i rounded down to a multiple of MR)
 * by chunks; k in [max(j1, i0), i) one by one; the diagonal term k = i if
 * i >= j1; then the block's own columns k in (j, min(i, j1)) ascending
 * (and k = i if i < j1), j going down so that they are known; then it is
 * divided by L[j][j]. */
static void inv_rows(const inv_step *s, size_t r0, size_t r1)
{
    double *a = s->a;
    const double *dinv = s->dinv;
    size_t n = s->n, j0 = s->j0, j1 = s->j1;
    for (size_t i = r0; i < r1; i++)
        for (size_t j = j0; j < zmin(j1, i); j++)
            a[i * n + j] = 0.0;
    /* rows below the block: the product with the columns to its right */
    for (size_t kk = j1; kk + 1 < r1; kk += CMP_CHOL_KC) {
        const double *bp = pack_rows(a, n, j0, j1, kk, zmin(CMP_CHOL_KC, n - kk));
        for (size_t i0 = r0; i0 < r1; i0 += MR) {
            if (i0 <= kk)
                continue;
            size_t m = zmin(CMP_CHOL_KC, i0 - kk);
            tile_strip(a + i0 * n + kk, bp, n, m, (int)zmin(MR, r1 - i0),
                       j0, j1, -1.0, a + i0 * n);
        }
    }
    for (size_t i = r0; i < r1; i++) {
        double *xi = a + i * n;
        size_t kt = i - i % MR;
        if (kt < j1)
            kt = j1;
        for (size_t j = j0; j < zmin(j1, i); j++) {
            const double *lj = a + j * n;
            double t = xi[j];
            for (size_t k = kt; k < i; k++)
                t -= xi[k] * lj[k];
            if (i >= j1)
                t -= dinv[i] * lj[i];
            xi[j] = t;
        }
    }
    /* the block's own columns, right to left: rows inside the block one
     * by one (their sums end at the diagonal), the rows below it by the
     * backward substitution */
    size_t i = r0;
    for (; i < r1 && i < j1; i++) {
        double *xi = a + i * n;
        for (size_t j = i; j-- > j0;) {
            const double *lj = a + j * n;
            double t = xi[j];
            for (size_t k = j + 1; k < i; k++)
                t -= xi[k] * lj[k];
            t -= dinv[i] * lj[i];
            xi[j] = t / lj[j];
        }
    }
    if (i < r1)
        rows_solve_block(a, n, a + i * n, r1 - i, j0, j1, 1);
}

/* Thread tid's rows: row i costs about (i - base + NB / 2) multiply-adds
 * per block column, so the split points solve a quadratic; rounded to
 * multiples of MR (absolute, base being one). */
static size_t inv_split(const inv_step *s, int tid, int nth)
{
    if (tid <= 0)
        return s->base;
    if (tid >= nth)
        return s->n;
    double h = CMP_CHOL_NB / 2.0, N = (double)(s->n - s->base);
    double f = (double)tid / nth;
    double x = sqrt(h * h + f * ((N + h) * (N + h) - h * h)) - h;
    size_t i = s->base + (size_t)x / MR * MR;
    return i < s->n ? i : s->n;
}

static void inv_thread(void *ctx, int tid, int nth)
{
    const inv_step *s = ctx;
    size_t r0 = inv_split(s, tid, nth), r1 = inv_split(s, tid + 1, nth);
    if (r1 > r0)
        inv_rows(s, r0, r1);
}

void cmp_chol_invert_lower(double *a, double *dinv, size_t n, kn_pool *pool)
{
    for (size_t i = 0; i < n; i++)
        dinv[i] = 1.0 / a[i * n + i];
    if (n == 0)
        return;
    int T = cmp_par_threads(pool);
    for (size_t j0 = (n - 1) / CMP_CHOL_NB * CMP_CHOL_NB;; j0 -= CMP_CHOL_NB) {
        size_t j1 = zmin(j0 + CMP_CHOL_NB, n);
        inv_step s = {a, dinv, n, j0, j1, j0 - j0 % MR};
        size_t rows = n - s.base;
        if (T > 1 && rows * (j1 - j0) * (rows / 2 + 1) >= CHOL_PAR_MIN)
            cmp_par_spawn(T, inv_thread, &s);
        else
            inv_rows(&s, s.base, n);
        if (j0 == 0)
            break;
    }
}

/* y[i][j] -= sum_{k in [k0, k1)} y[i][k] b[j][k] for rows i < rows and
 * j in [j0, j1), b's rows read from a (ld n): tiles over KC-column
 * chunks at absolute offsets from k0, chunks in ascending order. */
static void rows_sub_product(const double *a, size_t n, double *y, size_t rows,
                             size_t j0, size_t j1, size_t k0, size_t k1)
{
    for (size_t kk = k0; kk < k1; kk += CMP_CHOL_KC) {
        size_t m = zmin(CMP_CHOL_KC, k1 - kk);
        const double *bp = pack_rows(a, n, j0, j1, kk, m);
        for (size_t r = 0; r < rows; r += MR)
            tile_strip(y + r * n + kk, bp, n, m, (int)zmin(MR, rows - r),
                       j0, j1, -1.0, y + r * n);
    }
}

void cmp_chol_solve_rows(const double *a, size_t n, double *y, size_t rows)
{
    /* Y := Y L^-T (Y L^T = B): column j needs columns k < j of its row */
    for (size_t k0 = 0; k0 < n; k0 += CMP_CHOL_NB) {
        size_t k1 = zmin(k0 + CMP_CHOL_NB, n);
        rows_sub_product(a, n, y, rows, k0, k1, 0, k0);
        rows_solve_block(a, n, y, rows, k0, k1, 0);
    }
    /* Y := Y L^-1 (Z L = Y, L[k][j] = a[j][k] above the diagonal): column
     * j needs columns k > j, so the blocks go from the right */
    if (n == 0)
        return;
    for (size_t j0 = (n - 1) / CMP_CHOL_NB * CMP_CHOL_NB;; j0 -= CMP_CHOL_NB) {
        size_t j1 = zmin(j0 + CMP_CHOL_NB, n);
        rows_sub_product(a, n, y, rows, j0, j1, j1, n);
        rows_solve_block(a, n, y, rows, j0, j1, 1);
        if (j0 == 0)
            break;
    }
}

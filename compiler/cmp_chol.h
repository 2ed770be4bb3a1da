/*
 * cmp_chol.h - dense double Cholesky factorization and triangular inverse
 * for the calibration (GPTQ's inverse factor, GPTAQ's retarget solves),
 * blocked so that 7B/70B widths run at register-tile speed.
 *
 * Why blocked: at n = 14336 the matrix is 1.6 GB.  The unblocked
 * left-looking Cholesky (kept as cmp_chol_lower_ref) reads all earlier
 * columns of every row for every column: the whole matrix streams from
 * memory n times.  Here the columns go in blocks of CMP_CHOL_NB: a
 * block's update by all earlier columns is one product A B^T of rows
 * (kn_ddot.h tiles, B chunks of CMP_CHOL_KC columns kept in L2), so the
 * matrix streams n / CMP_CHOL_NB times and the arithmetic runs in fused
 * multiply-add registers.  The inverse walks the same way.
 *
 * Layout: row-major n x n doubles, lower triangle = L (diagonal
 * included).  Precision: double throughout (H's conditioning needs it);
 * the rounding differs from the unblocked order in the last bits.
 *
 * Threads: the rows of each block step are split over the pool's threads
 * (threads started per step, cmp_par.h); every element is computed by the
 * same operations in the same order whatever the split (tiles start at
 * absolute multiples of KN_DDOT_MR, product chunks at absolute column
 * offsets), so the results do not depend on the thread count.
 * No function allocates: each thread copies a block's chunk of rows into
 * its own 256 KiB thread-local buffer (cmp_chol.c says why).
 */
#ifndef CMP_CHOL_H
#define CMP_CHOL_H

#include <stddef.h>

#include "kn_ops.h"

#define CMP_CHOL_NB 128 /* columns per block */
#define CMP_CHOL_KC 256 /* columns per chunk of a block product */

/* In-place lower Cholesky of the n x n symmetric positive definite a:
 * reads the lower triangle, writes L there (upper triangle left alone).
 * pool NULL = the calling thread.  0 on success; -1 if a pivot is not
 * positive and finite (not numerically positive definite; a is then
 * partly overwritten). */
int cmp_chol_lower(double *a, size_t n, kn_pool *pool);

/* The plain reference: column by column, each element's earlier products
 * subtracted one by one in ascending order, one thread.  The same contract
 * and the same failure test as cmp_chol_lower; tests and benchmarks
 * compare the blocked factor with it. */
int cmp_chol_lower_ref(double *a, size_t n);

/* Copy the strictly lower triangle onto the strictly upper one
 * (a[j][k] = a[k][j], k > j), in tiles so both sides stay in cache. */
void cmp_chol_mirror_upper(double *a, size_t n);
/* The other way: the strictly upper triangle onto the strictly lower one
 * (for a symmetric matrix whose source stores rows of its upper half). */
void cmp_chol_mirror_lower(double *a, size_t n);

/* X = L^-1 for L in a's lower triangle WITH L^T mirrored in its strictly
 * upper triangle (cmp_chol_mirror_upper): X's strictly lower part
 * overwrites L's, and its diagonal (1 / L_ii) goes to dinv [n]; a's
 * diagonal and upper triangle are left as they were.  From X L = I, row i
 * of X is
 *   X[i][j] = -(sum_{k=j+1}^{i} X[i][k] L^T[j][k]) / L[j][j],  j < i,
 * a function of row i alone: rows are independent, columns go in blocks
 * from the right, and every inner loop reads rows.  pool NULL = the
 * calling thread. */
void cmp_chol_invert_lower(double *a, double *dinv, size_t n, kn_pool *pool);

/* y [rows][n] (row-major) := y (L L^T)^-1, i.e. each row b becomes the
 * solution x of L L^T x = b, for L in a's lower triangle with L^T mirrored
 * above it (cmp_chol_mirror_upper): the retarget's solves.  Forward
 * (y L^T = b) then backward (x L = y) substitution, both in column
 * blocks whose products with the finished columns are kn_ddot tiles, so
 * L streams once per call instead of once per eight rows.  Each row's
 * result is computed as alone (the same bits in any grouping of rows);
 * one thread: callers split the rows. */
void cmp_chol_solve_rows(const double *a, size_t n, double *y, size_t rows);

#endif /* CMP_CHOL_H */

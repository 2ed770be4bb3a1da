/*
 * cmp_qform.h - the calibration's row-wise quadratic forms over many rows,
 * with the matrix tiled so that each tile is read from memory once per
 * chunk of rows instead of once per eight rows.
 *
 * What: for rows r of D [rows][n] (and of A, B), the terms
 *   sym:   d_r^T H d_r       (H the packed symmetric Hessian sum, cmp_gptq.h)
 *   cross: a_r^T M b_r       (M a full [n][n] matrix, row-major)
 *   rows:  t_r = M x_r       (every element of the product, for the descent)
 * Why: at 7B widths (n = 14336) the packed H is 0.8 GB and the full M
 * 1.6 GB; the eight-row passes of cmp_hessian.c stream all of it from
 * memory per eight rows, so they run at the memory's speed, several times
 * below the adders'.  Here a tile of CMP_QFORM_TI x CMP_QFORM_TJ elements
 * (256 KiB, in L2) serves CMP_QFORM_CHUNK rows before the next is read.
 *
 * Invariant (why the artifacts do not change): every row's term is formed
 * with exactly the operations, in exactly the order, of the eight-row
 * reference (cmp_hessian_output_error_terms; cmp_lanes.h's rule): the
 * inner sum of element (r, i) is one chain over j ascending, carried from
 * tile to tile in memory, multiply and add rounded separately; the outer
 * sum adds its elements in i ascending.  Only the loop nest changes, so
 * the results are the reference's bits, for any chunking and any thread
 * count; test_qform compares them.
 */
#ifndef CMP_QFORM_H
#define CMP_QFORM_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_gptq.h"
#include "kn_ops.h"

/* Rows that share one pass over the matrix (a multiple of CMP_LANES). */
#define CMP_QFORM_CHUNK 128u
/* A tile: rows i of the matrix x columns j (TI <= TJ: the diagonal tile
 * of a row tile then holds its whole triangle). */
#define CMP_QFORM_TI 64u
#define CMP_QFORM_TJ 512u

/* Doubles of the work space of one call over `rows` rows of width n: a
 * chunk's rows and their partial sums interleaved (2 * c * n, c =
 * min(CHUNK, rows) rounded up to CMP_LANES) and a tile (TI * min(TJ, n)).  A
 * call over fewer rows fits in the same space. */
uint64_t cmp_qform_work_doubles(uint32_t n, uint32_t rows);

/* terms[r] = (w_r - q_r)^T H (w_r - q_r) for r < rows, bit for bit
 * cmp_hessian_output_error_terms' term (q NULL: zeros).  w, q
 * [rows][h->cols]; work: cmp_qform_work_doubles(h->cols, rows). */
void cmp_qform_sym_terms(const cmp_hessian *h, const float *w, const float *q,
                         uint32_t rows, double *work, double *terms);

/* terms[r] = sum_i a_ri sum_j M_ij b_rj (the inner sums j ascending from
 * 0, the outer i ascending, zero a_ri skipped) for M [n][n] and a, b
 * [rows][n]; work: cmp_qform_work_doubles(n, rows). */
void cmp_qform_cross_terms(const double *M, uint32_t n, const float *a,
                           const float *b, uint32_t rows, double *work,
                           double *terms);

/* t = M x for nb blocks of CMP_LANES interleaved rows: x and t
 * [nb][n][CMP_LANES] (x[(b * n + j) * 8 + r]); t[(b * n + i) * 8 + r] =
 * sum_j M_ij x[(b * n + j) * 8 + r] as one chain from 0.0, j ascending
 * (cmp_lanes_dot with m = 1 over the whole row). */
void cmp_qform_rows(const double *M, uint32_t n, const double *x, uint32_t nb,
                    double *t);

/* The sums of the terms over all rows, in row order, the rows split over
 * the pool's threads (NULL: the calling thread): the same bits for any
 * pool.  NaN when the work space (cmp_qform_par_work_bytes) cannot be
 * allocated. */
double cmp_qform_sym_par(kn_pool *p, const cmp_hessian *h, const float *w,
                         const float *q, uint32_t rows);
double cmp_qform_cross_par(kn_pool *p, const double *M, uint32_t n,
                           const float *a, const float *b, uint32_t rows);
/* Peak bytes either allocates: the terms (rows * 8, at least 8) and each
 * thread's work space. */
uint64_t cmp_qform_par_work_bytes(uint32_t n, uint32_t rows, int threads);

#endif /* CMP_QFORM_H */

/*
 * kn_ddot.h - a register tile of double dot products, the inner kernel of
 * the calibration's blocked Cholesky factorization and triangular inverse
 * (compiler/cmp_chol.c).
 *
 * Both operands are row-major with k contiguous (the "dot" form A B^T):
 *   out[r][c] = sum_{k < m} a[r * lda + k] * b[c * ldb + k]
 * for r < KN_DDOT_MR, c < KN_DDOT_NR.  In a Cholesky factor and in the
 * transposed factor every operand the blocked algorithms need is such a
 * row, so nothing is packed.
 *
 * Summation order (fixed, the same on every path, so results do not
 * depend on the CPU or on how callers group rows into tiles): four
 * partial sums s_q over k = q (mod 4) for k < m & ~3, each by fused
 * multiply-adds in ascending k; then (s_0 + s_2) + (s_1 + s_3); then the
 * last m & 3 terms by fused multiply-adds in ascending k.  The scalar
 * path uses C99 fma(), which rounds exactly as the AVX2/FMA instruction,
 * so both give the same bits.  Each element's operations do not involve
 * the other elements of its tile.
 *
 * Edge tiles: rows r >= mr (c >= nr) read row mr - 1 (nr - 1) again and
 * their outputs are to be ignored, so the caller never pads.  Nothing
 * allocates.
 */
#ifndef KN_DDOT_H
#define KN_DDOT_H

#include <stddef.h>

#define KN_DDOT_MR 3 /* rows of a (i) per tile */
#define KN_DDOT_NR 4 /* rows of b (j) per tile */

/* out[r * KN_DDOT_NR + c] = the dot product above (1 <= mr <= MR,
 * 1 <= nr <= NR; m may be 0: zeros).  AVX2/FMA when the CPU has it and
 * kn_force_scalar() is 0; the same bits either way. */
void kn_ddot_tile(const double *a, size_t lda, const double *b, size_t ldb,
                  size_t m, int mr, int nr,
                  double out[KN_DDOT_MR * KN_DDOT_NR]);

/* The two bodies (kn_ddot.c: scalar, the reference; kn_ddot_avx2.c: call
 * only when kn_cpu_has_avx2()); rows already resolved, a[r] and b[c]. */
void kn_ref_ddot_tile(const double *const a[KN_DDOT_MR],
                      const double *const b[KN_DDOT_NR], size_t m,
                      double out[KN_DDOT_MR * KN_DDOT_NR]);
void kn_avx2_ddot_tile(const double *const a[KN_DDOT_MR],
                       const double *const b[KN_DDOT_NR], size_t m,
                       double out[KN_DDOT_MR * KN_DDOT_NR]);

/* The "axpy" form, for products whose right operand is only stored by
 * rows (the retarget's W C): a KN_DAXPY_MR x KN_DAXPY_NR tile of
 *   y[r * ldy + c] = fma(w[r * ldw + i], b[i * ldb + c], y[...])
 * for i = 0 .. m-1 ascending, w float (widened exactly), b and y double.
 * Each element is a chain of fused multiply-adds in ascending i from its
 * value in y, on both paths (the same bits), whatever the tile.  Rows r
 * >= mr read and write nothing; all KN_DAXPY_NR columns are written
 * (callers do ragged column edges with kn_ref_daxpy_cols). */
#define KN_DAXPY_MR 4
#define KN_DAXPY_NR 8
void kn_daxpy_tile(const float *w, size_t ldw, const double *b, size_t ldb,
                   size_t m, int mr, double *y, size_t ldy);
/* The same chain for columns [0, nc) of rows r < mr, scalar (fma()). */
void kn_ref_daxpy_cols(const float *w, size_t ldw, const double *b, size_t ldb,
                       size_t m, int mr, size_t nc, double *y, size_t ldy);
/* The AVX2 body (call only when kn_cpu_has_avx2(); mr == KN_DAXPY_MR). */
void kn_avx2_daxpy_tile(const float *w, size_t ldw, const double *b,
                        size_t ldb, size_t m, double *y, size_t ldy);

#endif /* KN_DDOT_H */

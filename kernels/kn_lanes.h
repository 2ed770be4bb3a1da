/*
 * kn_lanes.h - the calibration's symmetric quadratic forms with AVX2, four
 * rows of a packed matrix at a time (compiler/cmp_hessian.c's output
 * errors, tr(D H D^T) for eight rows of D at once).
 *
 * Why: one row i of H against eight interleaved difference rows is eight
 * chains of dependent additions (k ascending), bound by the add latency.
 * Rows i .. i+3 are independent chains too: interleaving them keeps the
 * adders busy and reads each difference column once for four rows of H.
 * Every lane performs exactly the operations, in exactly the order, of
 * the scalar code in cmp_hessian.c (cmp_lanes.h's rule: acc = h_ii * d_i,
 * then acc += (2 * h_ik) * d_k for k ascending, multiply and add rounded
 * separately, never fused), so the results are the same bits; test
 * test_awq_search compares them.  Call only when kn_cpu_has_avx2().
 */
#ifndef KN_LANES_H
#define KN_LANES_H

#include <stddef.h>
#include <stdint.h>

/* Lanes of one difference column: d[k * KN_QUAD_LANES + r]. */
#define KN_QUAD_LANES 8

/* For g < 4 and lanes r < 8, with i = i0 + g and row[g] the packed row i
 * of H indexed by column (row[g][k] = H[i][k] for k >= i):
 *   acc[g * 8 + r] = row[g][i] * d[i * 8 + r], then for k = i + 1 .. n - 1
 *   acc[g * 8 + r] += (2.0 * row[g][k]) * d[k * 8 + r].
 * Requires i0 + 4 <= n. */
void kn_avx2_quad4(const double *const row[4], const double *d, size_t i0,
                   size_t n, double acc[4 * KN_QUAD_LANES]);

/* The tiled passes' step (compiler/cmp_qform.c): for g < 4 and lanes
 * r < 8, for k = k0 .. k1 - 1 ascending:
 *   acc[g * 8 + r] += row[g][k] * d[k * 8 + r]
 * acc holds running sums on entry (a chain continued from an earlier
 * tile).  The same rounding as the scalar chain (cmp_lanes.h's rule,
 * m = 1): a multiply and an add, never fused. */
void kn_avx2_quad4_acc(const double *const row[4], const double *d, size_t k0,
                       size_t k1, double acc[4 * KN_QUAD_LANES]);

/* The scale refit's step (compiler/cmp_gptq_fit.c): one row u of H (u[k]
 * = H[i][k]) against eight interleaved rows of codes a, weights wd and
 * the running product hw; for k = k0 .. k1 - 1 ascending and lanes r < 8:
 *   sa[r] += u[k] * a[k * 8 + r];  hwi[r] += u[k] * wd[k * 8 + r];
 *   hw[k * 8 + r] += w[r] * u[k].
 * sa and hwi hold running sums on entry.  Multiplies and adds rounded
 * separately, as cmp_lanes_dot (m = 1) and cmp_lanes_axpy do. */
void kn_avx2_refit_step(const double *u, const double *a, const double *wd,
                        double *hw, const double w[KN_QUAD_LANES], size_t k0,
                        size_t k1, double sa[KN_QUAD_LANES],
                        double hwi[KN_QUAD_LANES]);

/* Two rows u[0], u[1] of H over the same columns at once: for k = k0 ..
 * k1 - 1 ascending, exactly kn_avx2_refit_step for row 0 (sa[0], hwi[0],
 * w[0]) and for row 1 (sa[1], hwi[1], w[1]), with each hw[k * 8 + r]
 * receiving row 0's term before row 1's, as two one-row calls over the
 * whole range would leave it.  The codes, weights and hw are read once
 * for both rows: one row's step waits on the second-level cache for them
 * (three lines per column for six multiply-adds per lane). */
void kn_avx2_refit_step2(const double *const u[2], const double *a,
                         const double *wd, double *hw,
                         const double *const w[2], size_t k0, size_t k1,
                         double *const sa[2], double *const hwi[2]);

/* GPTQ's update of later columns by a block's errors (compiler/
 * cmp_gptq.c), from a panel of the block's factor rows: for each
 * KN_GPTQ_STRIP-column strip s of the nc columns, ne rows of
 * KN_GPTQ_STRIP doubles, P[(s * ne + t) * KN_GPTQ_STRIP + l] = U[t][s *
 * KN_GPTQ_STRIP + l] (zero beyond nc), so a strip's ne x 8 values are one
 * contiguous 8 KiB run (ne = 128) that stays in L1 for six rows.  For
 * rows r < nr and columns c < nc, one chain in double from the value:
 *   acc = W[r * ldw + c];
 *   acc = fma(-(double)E[r * lde + t], U[t][c], acc)  for t = 0 .. ne - 1
 *   W[r * ldw + c] = (float)acc
 * (one rounding to float per block, where a step per error rounded
 * twice), the scalar loop's bits (cmp_gptq.c's fallback).  Six rows by
 * eight columns at a time: twelve accumulators, two panel loads and six
 * broadcasts per twelve fused multiply-adds. */
#define KN_GPTQ_STRIP 8
#define KN_GPTQ_UPDATE_MAX 128 /* ne at most */
void kn_avx2_gptq_update(float *W, size_t ldw, size_t nr, const float *E,
                         size_t lde, const double *P, size_t ne, size_t nc);

/* The code descent's scan (compiler/cmp_descend.c): the first column c in
 * [c0, c1) of one row where one code step lowers the row's error, c1 when
 * there is none.  With v(k) = (float)(k - zero) * scale (zero 0 for Q8:
 * the same product as scale * (float)k), dv = (double)v(codes[c] + step) -
 * (double)deq[c] and de = (dv * dv) * diag[c] - (2.0 * dv) * g[c], each
 * operation rounded on its own, a step moves when diag[c] > 0, lo <=
 * codes[c] + step <= hi and de < 0 (step -1 or +1).  The descent's own
 * per-column test computes the same values in the same way, so the two
 * agree on every column; test_gptq_work compares the descent on both
 * paths. */
size_t kn_avx2_descend_scan(const int8_t *codes, const float *deq,
                            const double *g, const double *diag, size_t c0,
                            size_t c1, float scale, int zero, int lo, int hi);

#endif /* KN_LANES_H */

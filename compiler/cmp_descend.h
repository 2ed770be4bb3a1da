/*
 * cmp_descend.h - coordinate descent on the codes of a quantized matrix,
 * after GPTQ (the local search of QuantEase, Behdin et al. 2023).
 *
 * GPTQ visits each column once and never revisits a rounding once later
 * columns have absorbed its error, so its codes are a good but not a local
 * minimum of the layer objective
 *   E(Q) = tr((W - Q) H (W - Q)^T) = sum over rows of d^T H d,  d = w - q.
 * Here each row's codes move one step (q +- 1, inside the format's range,
 * group parameters kept) whenever that lowers the row's E exactly:
 * with g = H d, moving column c's value by delta changes E by
 *   delta^2 H_cc - 2 delta g_c,
 * and an accepted move updates g by -delta H[:, c].  Sweeps run over the
 * columns in order until one changes nothing or the sweep limit is
 * reached, so E never grows and the result is deterministic.
 *
 * Cost per row: H d (cols^2, eight rows per pass) plus cols per accepted
 * move; work space one full [cols][cols] double copy of H (the size of
 * GPTQ's own factor, which is freed by then) and eight rows' d and g.
 */
#ifndef CMP_DESCEND_H
#define CMP_DESCEND_H

#include <stdint.h>

#include "cmp_gptq.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "mc_error.h"

/* Descend q's codes (checked as cmp_qbuf_check; parameters kept) towards w
 * [rows][cols] under h (h->cols == q->cols).  deq [rows][cols]: on entry the
 * dequantized q, on return the dequantized result.  sweeps: the most
 * passes over a row's columns (0 -> 16; a row stops earlier once a sweep
 * changes nothing).  *moves (optional) receives the number of accepted
 * steps.  pool (NULL = the calling thread) splits the rows over its
 * threads; the result does not depend on it.  MC_ERR_NOMEM,
 * MC_ERR_INVALID_ARG. */
mc_status cmp_descend_codes(const float *w, const cmp_hessian *h,
                            cmp_qbuf *q, float *deq, uint32_t sweeps,
                            uint64_t *moves, kn_pool *pool, mc_error *err);

/* Peak bytes cmp_descend_codes allocates for this width with `threads`
 * threads: (cols^2 + cols) * 8 (H in full, and its diagonal) + threads *
 * 2 * CMP_QFORM_CHUNK * cols * 8 (a chunk of rows' differences and
 * products, cmp_qform.h) + threads * cols (a row's codes), and with more
 * than one thread their move counters (threads * 8). */
uint64_t cmp_descend_work_bytes(uint32_t cols, int threads);

#endif /* CMP_DESCEND_H */

/*
 * kn_pack16.h - the 16-row panel layout of an int4-sym or int8 matrix
 * (KN_LAYOUT_P16, byte layouts in kn_quant.h), built by the CPU runtime
 * at load from an artifact's row-major Q4S or Q8.
 *
 * Why: batch-1 decode reads each weight byte once.  In the row layout the
 * AVX-512 decode kernels read 8 rows (8 streams; int4 8 more for the
 * scales) and shuffle them into lanes; in panels one load is 16 rows x a
 * few code bytes, the scales sit in the panel, and a thread's rows are
 * one sequential stream.  The arithmetic is unchanged (kn_qdot.h's block
 * sums), so results are the row layout's bits.
 *
 * The panel matrix is the same bytes as data + scales; every kernel entry
 * (kn_matmul, kn_matmul_q, kn_matrix_row) accepts it, the AVX-512 ones at
 * speed and the others through the scalar reference.  kn_unpack16 gives
 * the row layout back (the CUDA upload).
 */
#ifndef KN_PACK16_H
#define KN_PACK16_H

#include <stdint.h>

#include "kn_ops.h"

/* 1 if W can be packed: Q4S or Q8 in the row layout, rows a positive
 * multiple of 16, cols a multiple of 32, a Q4S group a power of two >= 32. */
int kn_pack16_ok(const kn_matrix *W);

/* Bytes of W's panel copy (== its data + scale bytes), in either layout. */
uint64_t kn_pack16_bytes(const kn_matrix *W);

/* Bytes of one panel of W (rows 16P .. 16P+15), in either layout. */
uint64_t kn_pack16_panel_bytes(const kn_matrix *W);

/* Write W's panels into dst (kn_pack16_bytes(W) bytes, 64-byte aligned
 * for the kernels' loads) and set *out to the view of them (out->scales
 * NULL, out->layout KN_LAYOUT_P16).  Precondition: kn_pack16_ok(W).  out
 * may be W. */
void kn_pack16(const kn_matrix *W, void *dst, kn_matrix *out);

/* The row layout of panel matrix W into data (its row-layout data bytes)
 * and scales (its row-layout scale bytes). */
void kn_unpack16(const kn_matrix *W, void *data, void *scales);

#endif /* KN_PACK16_H */

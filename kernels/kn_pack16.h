/*
 * kn_pack16.h - the 16-row panel layout of an int4-sym matrix
 * (KN_LAYOUT_P16, byte layout in kn_quant.h), built by the CPU runtime at
 * load from an artifact's row-major Q4S.
 *
 * Why: batch-1 decode reads each weight byte once.  In the row layout the
 * AVX-512 decode kernel reads 8 rows (8 streams) plus their scales (8
 * more) and shuffles them into lanes; in panels one 512-bit load is 16
 * rows x 4 code bytes, the scales sit before their group's blocks, and a
 * thread's rows are one sequential stream.  The arithmetic is unchanged
 * (kn_qdot.h's block sums), so results are the row layout's bits.
 *
 * The panel matrix is the same bytes as data + scales; every kernel entry
 * (kn_matmul, kn_matmul_q, kn_matrix_row) accepts it, the AVX-512 ones at
 * speed and the others through the scalar reference.  kn_q4s_unpack16
 * gives the row layout back (the CUDA upload).
 */
#ifndef KN_PACK16_H
#define KN_PACK16_H

#include <stdint.h>

#include "kn_ops.h"

/* 1 if W can be packed: Q4S in the row layout, rows a positive multiple
 * of 16, cols a multiple of 32, group a power of two >= 32. */
int kn_q4s_pack16_ok(const kn_matrix *W);

/* Bytes of W's panel copy (== its data + scale bytes). */
uint64_t kn_q4s_pack16_bytes(const kn_matrix *W);

/* Write W's panels into dst (kn_q4s_pack16_bytes(W) bytes, 64-byte
 * aligned for the kernels' loads) and set *out to the view of them
 * (out->scales NULL, out->layout KN_LAYOUT_P16).  Precondition:
 * kn_q4s_pack16_ok(W).  out may be W. */
void kn_q4s_pack16(const kn_matrix *W, void *dst, kn_matrix *out);

/* The row layout of panel matrix W into data (rows x cols/2 bytes) and
 * scales (rows x ngroups u16). */
void kn_q4s_unpack16(const kn_matrix *W, void *data, void *scales);

#endif /* KN_PACK16_H */

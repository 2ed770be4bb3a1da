/*
 * kn_gram.h - sums of outer products of token rows (Gram matrices), the
 * calibration's statistics: H += sum_t x_t x_t^T (upper triangle, packed)
 * and C += sum_t a_t b_t^T (full), as blocked float GEMMs.
 *
 * Precision design: the tokens go in float chunks of KN_GRAM_FC.  Within
 * a float chunk each element's products are summed in float (fused
 * multiply-adds on AVX2/FMA); each float chunk's sums are then added in
 * double.  So the rounding error of an element is that of a
 * KN_GRAM_FC-term float dot product (relative ~1e-7 of |x_i| |x_j| for
 * trained activations) and does not grow with the number of tokens; the
 * double sums across chunks keep a calibration over millions of tokens as
 * accurate as one over a chunk.  A double GEMM would be 2x slower on AVX2
 * and 64x slower on a consumer GPU, for precision GPTQ does not use (it
 * dampens H by 1 % of its mean diagonal).  Products overflow float only for
 * |x| > 1.8e19.
 *
 * Layout of the packed triangle h (as cmp_hessian): row i holds (i, i) ..
 * (i, n-1) contiguously from index i * (2n + 1 - i) / 2.
 *
 * Blocking: the tokens are packed KN_GRAM_KC at a time (a packed chunk of
 * KN_GRAM_KC / KN_GRAM_FC float chunks) into panels (A: KN_GRAM_MR rows of
 * the transposed chunk, token-major; B: KN_GRAM_NR columns, token-major,
 * zero padded), and a KN_GRAM_MR x KN_GRAM_NR tile is computed in
 * registers: float sums over each float chunk, added to a double tile in
 * L1, which is added to the caller's sums once per packed chunk.  (With
 * 128-token packed chunks, adding every tile to h or c, megabytes of
 * doubles at the 1536-wide input, took more time than the products.)
 * The column panels are taken in groups of 8 (256 KiB of B panels, in
 * L2), and within a group row panel by row panel, so that an A panel stays
 * in L1 across the group and the tiles are added along rows of h or c, not
 * down its columns (a new page per row at width 1536).  With AVX-512
 * (kn_cpu_has_avx512) the tile is 12 x 32, two row panels by two column
 * panels of the same packing.
 * The column panels are split over the pool's threads; every element is
 * computed by exactly the same operations whatever the thread count, the
 * tile shape, the vector width or the order of the tiles, so the sums do
 * not depend on them: the AVX-512 path gives the AVX2 path's bits.  They
 * do depend on where the chunks start (calls start a new chunk) and on the
 * CPU (FMA or not).
 *
 * Cost (Zen 4, one core): the tiles run near the FMA peak (~50 G
 * multiply-adds/s, zmm or ymm alike); adding each packed chunk's tile sums
 * to h or c reads and writes all of it once per call of <= KN_GRAM_KC
 * tokens, which at width 1536 (19 MB for c) is bound by memory bandwidth
 * and takes ~10-15 % of the time (prefetching it measured no gain); the
 * packing ~4 %.
 *
 * No allocation: the caller passes scratch of kn_gram_scratch_floats(n)
 * floats.  Pointers may not alias.
 */
#ifndef KN_GRAM_H
#define KN_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"

#define KN_GRAM_FC 128 /* tokens per float chunk (float sums) */
#define KN_GRAM_KC 512 /* tokens per packed chunk (one add to h or c) */
/* Tokens per packed chunk of the bfloat16 sums: twice as many, since their
 * tiles run twice as fast and the adds to h or c would otherwise weigh
 * twice as much (their pair panels take the float panels' bytes). */
#define KN_GRAM_KC_BF16 (2 * KN_GRAM_KC)
#define KN_GRAM_MR 6   /* tile rows (i) */
#define KN_GRAM_NR 16  /* tile columns (j): two AVX vectors */

/* Floats of scratch the sums below need for width n: both packed panels
 * of one packed chunk, (ceil(n / MR) * MR + ceil(n / NR) * NR) *
 * KN_GRAM_KC_BF16 (the bfloat16 sums' emulation packs that many tokens as
 * floats). */
uint64_t kn_gram_scratch_floats(uint32_t n);

/* h (packed upper triangle of an n x n sum, layout above) += sum over T
 * rows of x [T][n] of x_t x_t^T.  p NULL = the calling thread. */
void kn_gram_tri(kn_pool *p, double *h, const float *x, size_t T, uint32_t n,
                 float *scratch);

/* c [n][n] (row-major, full) += sum over T rows of a_t b_t^T, i.e.
 * c[i][j] += sum_t a[t][i] b[t][j]; a, b: [T][n]. */
void kn_gram_cross(kn_pool *p, double *c, const float *a, const float *b,
                   size_t T, uint32_t n, float *scratch);

/* The same sums with bfloat16 products (the calibration's default,
 * cmp_calib.h): each input is rounded to bfloat16 (round to nearest even;
 * float subnormals and bfloat16 subnormals to signed zero, NaN stays NaN)
 * and each element's float chain over a float chunk takes the tokens in
 * pairs, the odd token then the even one, each product (exact in float)
 * added with one rounding, a result below FLT_MIN flushed to zero: the
 * arithmetic of AVX512_BF16's vdpbf16ps, which runs it at twice the float
 * FMA's multiply-adds per instruction.  Where the CPU lacks it (or with
 * kn_set_no_bf16 / MC_NO_BF16=1) the float tiles run on the rounded inputs
 * in that order with MXCSR's FTZ and DAZ set, which gives the same bits
 * (checked on Zen 4 against vdpbf16ps, including subnormal operands, and
 * by test_gram); the scalar tile gives them too except where a product is
 * itself below FLT_MIN (it rounds the product before the add).  The
 * inputs keep 8 significant bits: the sums' relative error per term is
 * ~2^-8, random in sign, against ~2^-24 for the float sums; measured,
 * this moves the calibrated quality by less than its noise
 * (docs/quantization.md).  A call of an odd count pads a zero token. */
void kn_gram_tri_bf16(kn_pool *p, double *h, const float *x, size_t T,
                      uint32_t n, float *scratch);
void kn_gram_cross_bf16(kn_pool *p, double *c, const float *a, const float *b,
                        size_t T, uint32_t n, float *scratch);

/* c [na][nb] (row-major) += sum over T rows of a_t b_t^T, a: [T][na], b:
 * [T][nb]: kn_gram_cross (bf16 = 0) or kn_gram_cross_bf16 (1) for inputs
 * of two widths, with the same tiles and order (each element the same
 * bits as the square sum of zero-padded inputs).  scratch:
 * kn_gram_rect_scratch_floats(na, nb). */
void kn_gram_cross_rect(kn_pool *p, double *c, const float *a, uint32_t na,
                        const float *b, uint32_t nb, size_t T, int bf16,
                        float *scratch);
uint64_t kn_gram_rect_scratch_floats(uint32_t na, uint32_t nb);

/* x rounded to bfloat16 as above, returned as the float it stands for
 * (the tests' references use it). */
float kn_bf16_round(float x);

/* The plain references: every product and sum in double, tokens in
 * order.  Tests compare the blocked sums with them by normalized error. */
void kn_ref_gram_tri(double *h, const float *x, size_t T, uint32_t n);
void kn_ref_gram_cross(double *c, const float *a, const float *b, size_t T,
                       uint32_t n);

/* The register tile (internal to kn_gram.c; the AVX2/FMA version lives in
 * kn_gram_avx2.c): out[r][c] = sum over t < m of ap[t * MR + r] *
 * bp[t * NR + c], summed in float within each KN_GRAM_FC tokens (t
 * ascending), those sums added in double in order. */
void kn_avx2_gram_tile(const float *ap, const float *bp, size_t m,
                       double out[KN_GRAM_MR * KN_GRAM_NR]);

/* The AVX-512 tile (kn_gram_avx512.c; run only when kn_cpu_has_avx512()):
 * the same sums over na (1 or 2) consecutive A panels from ap and nb (1 or
 * 2) consecutive B panels from bp (panels of kc tokens, as packed), i.e.
 * rows r < na * MR, columns c < nb * NR, into out[r * KN_GRAM_TILE512_NC +
 * c]; every element bit for bit the AVX2 tile's. */
#define KN_GRAM_TILE512_NC (2 * KN_GRAM_NR)
#define KN_GRAM_TILE512 (2 * KN_GRAM_MR * KN_GRAM_TILE512_NC)
void kn_avx512_gram_tile(const float *ap, int na, const float *bp, int nb,
                         size_t m, size_t kc, double out[KN_GRAM_TILE512]);

/* The AVX512_BF16 tile (kn_gram_avx512.c; run only when
 * kn_cpu_has_avx512bf16()): the bfloat16 sums over `pairs` token pairs of
 * na (1 or 2) A panels and nb (1 or 2) B panels packed as pairs (a 32-bit
 * element holds token 2p in its low half and 2p + 1 in its high half;
 * panels of kcp pairs), the float sums restarted every KN_GRAM_FC / 2
 * pairs, into out as kn_avx512_gram_tile. */
void kn_avx512bf16_gram_tile(const uint32_t *ap, int na, const uint32_t *bp,
                             int nb, size_t pairs, size_t kcp,
                             double out[KN_GRAM_TILE512]);

/* The emulation's packing with AVX2 (kn_gram_avx2.c; kn_cpu_has_avx2()):
 * columns [c0, c0 + pw) of x [m][n] rounded to bfloat16 as kn_bf16_round
 * into d [m + m % 2][pw], each pair's tokens swapped (row t holds token
 * t ^ 1; zero past m and past column n). */
void kn_avx2_gram_pack_swapped(const float *x, size_t n, size_t m, size_t c0,
                               size_t pw, float *d);

/* The native path's conversion (kn_gram_avx512.c; AVX-512 F/BW): out[j]
 * = bfloat16 of hi[j] in the high half, of lo[j] in the low half (the
 * rounding of kn_bf16_round), j < n; hi NULL: a zero high half. */
void kn_avx512_bf16_pairs(const float *lo, const float *hi, size_t n,
                          uint32_t *out);

#endif /* KN_GRAM_H */

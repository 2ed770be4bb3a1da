/*
 * kn_lora.h - the LoRA delta product of the merge, in double precision.
 *
 *   out[i][j] = sum_k L[i][k] * R[k][j]     i < nr, j < cols, k < r
 *
 * L is [nr][r] (row stride r), R is [r][cols] (row stride cols), out is
 * [nr][cols] with row stride ldo.  Every element is summed in the SAME
 * order, k ascending from +0, each product rounded to double and then
 * added (never fused): the result is bitwise the same in the scalar
 * reference, in the AVX2 path, for any row blocking and on any CPU, so a
 * merged model does not depend on the machine that merged it.
 *
 * kn_lora_rows uses AVX2 when the CPU has it (and kn_force_scalar() is 0);
 * kn_ref_lora_rows is the plain loop it is tested against (bit equality).
 * Neither allocates; out may not alias L or R.
 */
#ifndef KN_LORA_H
#define KN_LORA_H

#include <stddef.h>
#include <stdint.h>

void kn_lora_rows(const double *L, const double *R, uint32_t r, size_t cols,
                  size_t nr, double *out, size_t ldo);
void kn_ref_lora_rows(const double *L, const double *R, uint32_t r,
                      size_t cols, size_t nr, double *out, size_t ldo);

/* AVX2 body (kn_lora_avx2.c); call only when kn_cpu_has_avx2(). */
void kn_avx2_lora_rows(const double *L, const double *R, uint32_t r,
                       size_t cols, size_t nr, double *out, size_t ldo);

#endif /* KN_LORA_H */

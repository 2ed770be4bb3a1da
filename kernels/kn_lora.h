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
 * kn_lora_rows uses AVX-512 when the CPU has it (kn_cpu_has_avx512(), so
 * MC_NO_AVX512=1 turns it off), else AVX2 when the CPU has it (and
 * kn_force_scalar() is 0); kn_ref_lora_rows is the plain loop both are
 * tested against (bit equality).
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

/* The same sum s[i][j], added: out[i][j] = out[i][j] + coef * s[i][j] (the
 * product rounded, then the add), bitwise as if s were computed by
 * kn_lora_rows first. */
void kn_lora_rows_add(const double *L, const double *R, uint32_t r,
                      size_t cols, size_t nr, double coef, double *out,
                      size_t ldo);
void kn_ref_lora_rows_add(const double *L, const double *R, uint32_t r,
                          size_t cols, size_t nr, double coef, double *out,
                          size_t ldo);

/* The end of a merged row: d[n] rounded once (to nearest even) to the
 * output type (KN_LORA_F32, _BF16 or _F16) into out, and *maxd raised to
 * max |(float)d[j] - base[j]| (the change in float32 terms, for the
 * report).  Returns n, or the index of the first d[j] that is NaN or
 * beyond float32's range (out and *maxd are then partly written). */
enum { KN_LORA_F32 = 0, KN_LORA_BF16 = 1, KN_LORA_F16 = 2 };
size_t kn_lora_finish(const double *d, const float *base, size_t n, int type,
                      void *out, double *maxd);
size_t kn_ref_lora_finish(const double *d, const float *base, size_t n,
                          int type, void *out, double *maxd);

/* AVX2 bodies (kn_lora_avx2.c); call only when kn_cpu_has_avx2(). */
void kn_avx2_lora_rows(const double *L, const double *R, uint32_t r,
                       size_t cols, size_t nr, double coef, int add,
                       double *out, size_t ldo);
size_t kn_avx2_lora_finish(const double *d, const float *base, size_t n,
                           int type, void *out, double *maxd);
/* AVX-512 bodies of kn_lora_rows / _add and kn_lora_finish
 * (kn_lora_avx512.c); call only when kn_cpu_has_avx512(). */
void kn_avx512_lora_rows(const double *L, const double *R, uint32_t r,
                         size_t cols, size_t nr, double coef, int add,
                         double *out, size_t ldo);
size_t kn_avx512_lora_finish(const double *d, const float *base, size_t n,
                             int type, void *out, double *maxd);

#endif /* KN_LORA_H */

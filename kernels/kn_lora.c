/* kn_lora.c - scalar reference and dispatch of the LoRA delta product
 * (contract in kn_lora.h). */
#include "kn_lora.h"

#include <string.h>

#include "kn_ops.h"

void kn_ref_lora_rows(const double *L, const double *R, uint32_t r,
                      size_t cols, size_t nr, double *out, size_t ldo)
{
    for (size_t i = 0; i < nr; i++) {
        double *o = out + i * ldo;
        memset(o, 0, cols * sizeof *o);
        for (uint32_t k = 0; k < r; k++) {
            double b = L[i * r + k];
            const double *a = R + (size_t)k * cols;
            for (size_t j = 0; j < cols; j++) {
                double p = b * a[j]; /* rounded, then added: never fused */
                o[j] += p;
            }
        }
    }
}

void kn_lora_rows(const double *L, const double *R, uint32_t r, size_t cols,
                  size_t nr, double *out, size_t ldo)
{
    if (!kn_force_scalar() && kn_cpu_has_avx2())
        kn_avx2_lora_rows(L, R, r, cols, nr, out, ldo);
    else
        kn_ref_lora_rows(L, R, r, cols, nr, out, ldo);
}

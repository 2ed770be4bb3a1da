/* export_util.h - the export tests' shared pieces (test_export.c):
 * compiling a fixture with the library, running `mcompile export`, the
 * GGUF and compressed-tensors files checked value by value against our
 * own dequantization of the artifact (readers written from the formats'
 * specifications: gguf_read.c, compressed-tensors' pack_to_int32 layout),
 * and a wide generated model.
 *
 * Include after <cmocka.h>: the helpers fail the test on any mismatch. */
#ifndef TU_EXPORT_UTIL_H
#define TU_EXPORT_UTIL_H

#include <stdint.h>

#include "kn_quant.h"

/* Compile model into path with the library: --quant quant, the linears
 * in fmt unless KN_W_COUNT_, int4 group, zstd sections when compress. */
void tu_x_compile(const char *model, const char *path, const char *quant,
                  kn_wformat fmt, uint32_t group, int compress);
/* `mcompile export` with args (shell-quoted by the caller): its exit
 * code, stdout and stderr into *out and *err when not NULL (caller
 * frees). */
int tu_x_run_export(const char *args, char **out, char **err);
/* Every tensor of the artifact mca against the GGUF: same values within
 * the conversion's stated rounding (exact but for Q8_0 from int8 rows
 * whose scale is not an f16 value, and Q4_1's m), q/k rows permuted per
 * head when permute.  Returns how many GGUF tensors had type want. */
int tu_x_check_gguf_values(const char *mca, const char *gguf, uint32_t want,
                           int permute);
/* The compressed-tensors directory dir against the artifact mca: the
 * packed codes, scales and zero points are the artifact's, and the float
 * tensors its exact values. */
void tu_x_check_ct_values(const char *mca, const char *dir);
/* A Llama of 12.6 MiB (hidden 256, FFN 704, 4 layers, vocab 512, f32)
 * whose largest tensor is 704 KiB, written into dir; tied: no lm_head,
 * and the embedding's row 0 times row0 (when not 0). */
void tu_x_write_wide_model(const char *dir, int tied, float row0);

#endif /* TU_EXPORT_UTIL_H */

/*
 * fmt_dtype.h - element types of tensors in files and conversions between
 * the floating-point ones.
 *
 * Conversions to f16/bf16 round to nearest, ties to even, and keep NaN a NaN
 * (quiet) and Inf an Inf; f16 overflow gives Inf as IEEE says.  These are the
 * only rounding routines in the project: merge, quantization and the writers
 * all call them, so "rounded once" means exactly one call here.
 */
#ifndef FMT_DTYPE_H
#define FMT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum fmt_dtype {
    FMT_DT_INVALID = 0,
    FMT_DT_F32,
    FMT_DT_F16,
    FMT_DT_BF16,
    FMT_DT_I8,
    FMT_DT_U8,
    FMT_DT_I32,
    FMT_DT_F64,
    FMT_DT_I64,
    FMT_DT_I16,
    FMT_DT_U16,
    FMT_DT_U32,
    FMT_DT_U64,
    FMT_DT_BOOL,
    FMT_DT_F8_E4M3,
    FMT_DT_F8_E5M2,
    FMT_DT_COUNT_
} fmt_dtype;

/* safetensors name ("F32", "BF16", ...) -> dtype; FMT_DT_INVALID if unknown. */
fmt_dtype fmt_dtype_from_name(const char *name);
/* dtype -> safetensors name; "INVALID" for out-of-range values. */
const char *fmt_dtype_name(fmt_dtype dt);
/* Bytes per element; 0 for FMT_DT_INVALID. */
size_t fmt_dtype_size(fmt_dtype dt);
/* 1 for F32/F16/BF16 (the float types mcompile computes with). */
int fmt_dtype_is_float(fmt_dtype dt);

float fmt_f16_to_f32(uint16_t h);
uint16_t fmt_f32_to_f16(float f);     /* round to nearest even */
float fmt_bf16_to_f32(uint16_t b);
uint16_t fmt_f32_to_bf16(float f);    /* round to nearest even */

/* Convert n elements of src (dtype F32/F16/BF16, little-endian, possibly
 * unaligned) to float32 dst.  Returns 0 on success, -1 if dt is not one of
 * those three. */
int fmt_to_f32(fmt_dtype dt, const void *src, float *dst, size_t n);
/* Convert n float32 to dst of dtype F32/F16/BF16 (rounded once, RNE).
 * Returns 0 on success, -1 for other dtypes. */
int fmt_from_f32(fmt_dtype dt, const float *src, void *dst, size_t n);

#endif /* FMT_DTYPE_H */

/*
 * fmt_gguf.h - streaming GGUF writer (the file format of ggml/llama.cpp,
 * version 3, as ggml's docs/gguf.md publishes it).
 *
 * Byte layout (all integers little-endian):
 *
 *   0   u8[4]   magic "GGUF"
 *   4   u32     version = 3
 *   8   u64     tensor_count  (T)
 *  16   u64     metadata_kv_count (K)
 *  24   K key/value pairs:
 *           string  key    (u64 length + bytes, no NUL; ASCII
 *                           "lower_snake.dotted", at most 65535 bytes)
 *           u32     value_type (FMT_GGUF_V_*)
 *           value:  u8/i8/bool 1 byte, u16/i16 2, u32/i32/f32 4,
 *                   u64/i64/f64 8, string as above, array =
 *                   u32 element type, u64 count, count elements
 *                   (no arrays of arrays here)
 *       T tensor infos:
 *           string  name   (at most 63 bytes: ggml's GGML_MAX_NAME - 1)
 *           u32     n_dims (1..4)
 *           u64[n_dims] ne  (ne[0] is the FASTEST-varying dimension: a
 *                            rows x cols matrix is ne = {cols, rows})
 *           u32     ggml type (FMT_GGUF_T_*)
 *           u64     offset  relative to the start of the data section,
 *                           a multiple of the alignment
 *   zero padding to a multiple of the alignment (general.alignment, u32,
 *   power of two; 32 when the key is absent)
 *   data section: each tensor's bytes at its offset, zero padding between
 *   tensors up to the next multiple of the alignment.
 *
 * Block types (ggml-common.h; blocks run along ne[0], so ne[0] must be a
 * multiple of the block size, 32 for all four):
 *   Q8_0  34 bytes: f16 d, i8 qs[32]              x = d * qs[j]
 *   Q4_0  18 bytes: f16 d, u8 qs[16]              x = d * (q - 8)
 *   Q4_1  20 bytes: f16 d, f16 m, u8 qs[16]       x = d * q + m
 *   Q5_0  22 bytes: f16 d, u8 qh[4], u8 qs[16]    x = d * (q - 16)
 *   where for Q4_* and Q5_0 element j < 16 is the low nibble of qs[j] and
 *   element j + 16 the high nibble of qs[j]; Q5_0's fifth bit of element
 *   j is bit j of qh read as a little-endian u32.
 *
 * Use: create, add the metadata and declare every tensor (name, type,
 * shape), begin_data (header, metadata and tensor infos are written: every
 * offset is known by then), then stream each tensor's bytes in declaration
 * order (a write may cover part of a tensor or span several; the padding is
 * the writer's), then finish.  Output goes through fmt_atomic.h (temp file,
 * fsync, rename) and is byte-identical for identical calls.  Invalid
 * combinations are refused when made, naming the key or tensor: duplicate
 * keys or tensor names, a block type whose ne[0] is not a multiple of 32,
 * empty or over-long names, more than 4 dims, an alignment that is not a
 * power of two, metadata after begin_data, a general.alignment set through
 * the typed adders (use fmt_gguf_set_alignment).
 */
#ifndef FMT_GGUF_H
#define FMT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

#define FMT_GGUF_MAGIC "GGUF"
#define FMT_GGUF_VERSION 3u
#define FMT_GGUF_DEFAULT_ALIGN 32u
#define FMT_GGUF_MAX_NAME 63u   /* bytes; ggml's GGML_MAX_NAME is 64 with NUL */
#define FMT_GGUF_MAX_DIMS 4
#define FMT_GGUF_MAX_KEY 65535u /* bytes; gguf.md: keys up to 2^16 - 1 */

typedef enum fmt_gguf_vtype {
    FMT_GGUF_V_U8 = 0,
    FMT_GGUF_V_I8 = 1,
    FMT_GGUF_V_U16 = 2,
    FMT_GGUF_V_I16 = 3,
    FMT_GGUF_V_U32 = 4,
    FMT_GGUF_V_I32 = 5,
    FMT_GGUF_V_F32 = 6,
    FMT_GGUF_V_BOOL = 7,
    FMT_GGUF_V_STRING = 8,
    FMT_GGUF_V_ARRAY = 9,
    FMT_GGUF_V_U64 = 10,
    FMT_GGUF_V_I64 = 11,
    FMT_GGUF_V_F64 = 12,
} fmt_gguf_vtype;

/* The ggml tensor types this writer emits (values pinned by ggml.h). */
typedef enum fmt_gguf_ttype {
    FMT_GGUF_T_F32 = 0,
    FMT_GGUF_T_F16 = 1,
    FMT_GGUF_T_Q4_0 = 2,
    FMT_GGUF_T_Q4_1 = 3,
    FMT_GGUF_T_Q5_0 = 6,
    FMT_GGUF_T_Q8_0 = 8,
    FMT_GGUF_T_BF16 = 30,
} fmt_gguf_ttype;

#define FMT_GGUF_QK 32u          /* elements per Q8_0/Q4_0/Q4_1/Q5_0 block */
#define FMT_GGUF_Q8_0_BYTES 34u
#define FMT_GGUF_Q4_0_BYTES 18u
#define FMT_GGUF_Q4_1_BYTES 20u
#define FMT_GGUF_Q5_0_BYTES 22u

/* "F32", "Q4_0", ... or NULL for a type this writer does not know. */
const char *fmt_gguf_ttype_name(fmt_gguf_ttype t);
/* Bytes of one row of ne0 elements of type t into *out.  MC_ERR_SHAPE if
 * ne0 is not a multiple of t's block, MC_ERR_UNSUPPORTED for an unknown
 * type; name (may be NULL) is the tensor named in the message. */
mc_status fmt_gguf_row_bytes(fmt_gguf_ttype t, uint64_t ne0, const char *name,
                             uint64_t *out, mc_error *err);

typedef struct fmt_gguf_writer fmt_gguf_writer;

/* Start a writer for path (final name; a temp file until finish). */
mc_status fmt_gguf_writer_create(const char *path, fmt_gguf_writer **out,
                                 mc_error *err);
/* Alignment of the data section and of every tensor (power of two, at
 * least 8, at most 1 MiB); written as general.alignment (u32) when it is
 * not the default 32.  Before any tensor is declared. */
mc_status fmt_gguf_set_alignment(fmt_gguf_writer *w, uint32_t align,
                                 mc_error *err);

/* Metadata, in the order of the calls.  Strings are UTF-8, length given
 * (no NUL needed).  Arrays copy their elements: vals holds n elements of
 * elem (a fixed-size type; not STRING, ARRAY). */
mc_status fmt_gguf_add_u32(fmt_gguf_writer *w, const char *key, uint32_t v,
                           mc_error *err);
mc_status fmt_gguf_add_i32(fmt_gguf_writer *w, const char *key, int32_t v,
                           mc_error *err);
mc_status fmt_gguf_add_u64(fmt_gguf_writer *w, const char *key, uint64_t v,
                           mc_error *err);
mc_status fmt_gguf_add_f32(fmt_gguf_writer *w, const char *key, float v,
                           mc_error *err);
mc_status fmt_gguf_add_bool(fmt_gguf_writer *w, const char *key, int v,
                            mc_error *err);
mc_status fmt_gguf_add_string(fmt_gguf_writer *w, const char *key,
                              const char *s, size_t len, mc_error *err);
mc_status fmt_gguf_add_array(fmt_gguf_writer *w, const char *key,
                             fmt_gguf_vtype elem, const void *vals, size_t n,
                             mc_error *err);
/* An array of n strings, strs[i] of lens[i] bytes. */
mc_status fmt_gguf_add_string_array(fmt_gguf_writer *w, const char *key,
                                    const char *const *strs,
                                    const size_t *lens, size_t n,
                                    mc_error *err);

/* Declare a tensor: ndim dims in ggml order (ne[0] fastest). */
mc_status fmt_gguf_add_tensor(fmt_gguf_writer *w, const char *name,
                              fmt_gguf_ttype type, int ndim,
                              const uint64_t *ne, mc_error *err);
/* Bytes of a declared tensor's data (no padding). */
uint64_t fmt_gguf_tensor_bytes(const fmt_gguf_writer *w, size_t i);
/* Write magic, counts, metadata, tensor infos and padding. */
mc_status fmt_gguf_begin_data(fmt_gguf_writer *w, mc_error *err);
/* Append n bytes of tensor data in declaration order. */
mc_status fmt_gguf_write(fmt_gguf_writer *w, const void *data, size_t n,
                         mc_error *err);
/* Check every declared byte was written, pad, commit atomically; frees w
 * in all cases. */
mc_status fmt_gguf_finish(fmt_gguf_writer *w, mc_error *err);
/* Remove the temp file and free w.  NULL is a no-op. */
void fmt_gguf_abort(fmt_gguf_writer *w);

#endif /* FMT_GGUF_H */

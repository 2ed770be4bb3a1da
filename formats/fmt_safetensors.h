/*
 * fmt_safetensors.h - safetensors reader (over mmap) and streaming writer.
 *
 * Byte layout (https://github.com/huggingface/safetensors):
 *   [0, 8)        N: u64 little-endian, length of the JSON header
 *   [8, 8+N)      UTF-8 JSON object, may be right-padded with spaces:
 *                   name -> {"dtype": "F32", "shape": [u64...],
 *                            "data_offsets": [begin, end]}
 *                   optional "__metadata__": {string: string}
 *   [8+N, EOF)    data buffer; offsets are relative to its start, end
 *                 exclusive, row-major little-endian, no strides.
 *
 * The reader enforces every rule of docs/formats.md before it hands
 * out a pointer: file >= 8 bytes; N <= 100,000,000 and 8+N <= file size;
 * header is valid UTF-8 JSON; no duplicate keys (checked on the raw text,
 * since JSON libraries keep one silently); known dtype (unsupported ones
 * rejected by name); shape product x element size fits u64 and equals
 * end-begin; offsets sorted tile [0, buffer length) exactly (no gap, no
 * overlap, no trailing bytes); __metadata__ values are strings.
 * Errors name the file, the tensor or field, the byte offset in the file
 * (for header problems: 8 + position in the JSON) and what was expected.
 *
 * The writer streams: declare every tensor (name, dtype, shape), then write
 * the data bytes in declaration order, then finish.  It writes to a
 * temporary file in the target's directory (fmt_atomic.h), pads the header
 * with spaces to a multiple of 8 bytes, always includes
 * {"__metadata__": {"format": "pt"}} plus any metadata set, fsyncs and
 * renames.  Output is byte-identical for identical calls.  Tensor data is
 * laid out in declaration order; the header lists tensors in that order.
 */
#ifndef FMT_SAFETENSORS_H
#define FMT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_dtype.h"
#include "mc_error.h"

#define FMT_ST_MAX_DIMS 8
#define FMT_ST_MAX_HEADER 100000000ull

typedef struct fmt_st_tensor {
    const char *name;                  /* NUL-terminated, owned by the file */
    fmt_dtype dtype;
    int ndim;                          /* 0 (scalar) .. FMT_ST_MAX_DIMS */
    uint64_t shape[FMT_ST_MAX_DIMS];   /* shape[0] is the slowest dimension */
    uint64_t nelem;                    /* product of shape (1 for rank 0) */
    uint64_t nbytes;                   /* nelem * element size */
    uint64_t file_offset;              /* absolute byte offset in the file */
    const void *data;                  /* read-only view into the mapping */
} fmt_st_tensor;

typedef struct fmt_st_file fmt_st_file;

/* Open and validate path; maps it read-only.  *out is owned by the caller
 * (fmt_st_close).  On failure *out is NULL and err says why. */
mc_status fmt_st_open(const char *path, fmt_st_file **out, mc_error *err);
/* Same checks over a caller-owned buffer (borrowed; must outlive the file).
 * name is used in error messages.  Used by fuzz targets and tests. */
mc_status fmt_st_open_memory(const void *data, size_t size, const char *name,
                             fmt_st_file **out, mc_error *err);
void fmt_st_close(fmt_st_file *f); /* NULL is a no-op */

const char *fmt_st_path(const fmt_st_file *f);
/* Number of tensors and the i-th in data-offset order (borrowed). */
size_t fmt_st_count(const fmt_st_file *f);
const fmt_st_tensor *fmt_st_get(const fmt_st_file *f, size_t i);
/* Tensor by name, or NULL (borrowed). */
const fmt_st_tensor *fmt_st_find(const fmt_st_file *f, const char *name);
/* 1 if a and b (either may be NULL: 0) hold the same dtype, shape and
 * bytes (a tied checkpoint's lm_head.weight stored again as the
 * embedding). */
int fmt_st_tensor_same(const fmt_st_tensor *a, const fmt_st_tensor *b);
/* __metadata__ value for key, or NULL (borrowed). */
const char *fmt_st_metadata(const fmt_st_file *f, const char *key);
size_t fmt_st_metadata_count(const fmt_st_file *f);
/* i-th metadata pair (borrowed); returns 0 if i is out of range. */
int fmt_st_metadata_at(const fmt_st_file *f, size_t i, const char **key,
                       const char **value);

typedef struct fmt_st_writer fmt_st_writer;

/* Start a writer for path (final name; a temp file is used until finish). */
mc_status fmt_st_writer_create(const char *path, fmt_st_writer **out,
                               mc_error *err);
/* Declare a tensor.  All declarations come before begin_data.  Rejects
 * duplicate names and shapes whose byte size overflows. */
mc_status fmt_st_writer_add(fmt_st_writer *w, const char *name, fmt_dtype dt,
                            int ndim, const uint64_t *shape, mc_error *err);
/* Add a __metadata__ entry (format=pt is always present). */
mc_status fmt_st_writer_set_metadata(fmt_st_writer *w, const char *key,
                                     const char *value, mc_error *err);
/* Write the header; after this only fmt_st_writer_write/finish/abort. */
mc_status fmt_st_writer_begin_data(fmt_st_writer *w, mc_error *err);
/* Append nbytes of tensor data, in declaration order; a call may span
 * tensor boundaries or cover part of one. */
mc_status fmt_st_writer_write(fmt_st_writer *w, const void *data,
                              size_t nbytes, mc_error *err);
/* Check every declared byte was written, fsync, rename into place, free w. */
mc_status fmt_st_writer_finish(fmt_st_writer *w, mc_error *err);
/* Remove the temp file and free w (NULL is a no-op).  Leaves any previous
 * file at the final path untouched. */
void fmt_st_writer_abort(fmt_st_writer *w);
/* Total bytes the file will have (valid after begin_data). */
uint64_t fmt_st_writer_total_bytes(const fmt_st_writer *w);

#endif /* FMT_SAFETENSORS_H */

/*
 * fmt_artifact.h - the compiled artifact (.mca): one file holding a model's
 * weights in their final formats, the memory plan and the provenance, laid
 * out so the runtime can mmap it and point straight into it.
 *
 * Byte layout (all integers little-endian; docs/artifact.md says the same
 * with examples):
 *
 *   [0, 64)        header
 *       0   u8[8]  magic  "\x89MCA\r\n\x1a\n"  (PNG-style: catches text-mode
 *                  transfers and truncation to 7 bits)
 *       8   u32    version = 1
 *      12   u32    header_bytes = 64
 *      16   u64    manifest_offset = 64
 *      24   u64    manifest_bytes  (M)
 *      32   u64    manifest_xxh3   (XXH3-64, seed 0, of the M manifest bytes)
 *      40   u32    alignment       (of section data; power of two, 64..1 MiB;
 *                                   the writer uses 4096)
 *      44   u32    flags = 0
 *      48   u64    reserved = 0
 *      56   u64    header_xxh3     (of bytes [0, 56))
 *   [64, 64+M)     manifest: UTF-8 JSON object, compact, keys sorted
 *   zero padding to the next multiple of alignment
 *   section 0 stored bytes, zero padding to alignment, section 1, ...
 *   zero padding to a multiple of 64
 *   [T, T+64*S)    section table, S entries of 64 bytes, in file order
 *       0   u64    offset          absolute, multiple of alignment
 *       8   u64    stored_bytes    bytes in the file
 *      16   u64    raw_bytes       bytes after decompression
 *      24   u64    stored_xxh3     of the stored bytes
 *      32   u64    raw_xxh3        of the raw (decompressed) bytes
 *      40   u32    codec           0 = raw (stored == raw), 1 = zstd frame
 *      44   u32    reserved = 0
 *      48   u64[2] reserved = 0
 *   [F-64, F)      trailer (F = file size)
 *       0   u8[8]  magic  "MCA-END\x01"
 *       8   u64    table_offset    (T)
 *      16   u64    section_count   (S)
 *      24   u64    table_xxh3      (of the 64*S table bytes)
 *      32   u64    file_bytes      (F)
 *      40   u64    manifest_xxh3   (same value as in the header)
 *      48   u64    reserved = 0
 *      56   u64    trailer_xxh3    (of bytes [0, 56) of the trailer)
 *
 * The table and trailer come last so the writer streams in one pass (zstd
 * sizes are known only after compressing) through fmt_atomic.h.
 *
 * Manifest schema (checked on every open): an object with
 *   "format": "mcompile-artifact", "version": 1,
 *   "sections": [{"name": str (unique), "kind": str, "raw_bytes": int}...]
 *               one per table entry, same order, raw_bytes equal,
 *   "config": object, "plan": object, "provenance": object,
 *   "tensors": [{"name": str (unique), "format": "f32"|"f16"|"bf16"|"q8"|
 *                "q4"|"q4s", "shape": [n] or [rows, cols], "group": int,
 *                "section": index, "data": [off, bytes],
 *                "scales": [off, bytes], "zeros": [off, bytes]}...]
 *               where every part lies inside its section's raw bytes and
 *               offsets are multiples of 64.
 * What a tensor's bytes mean is kernels/kn_quant.h's layout for its format;
 * the runtime (rt_artifact.c) checks part sizes against that arithmetic.
 *
 * Two depths of validation (as valkey): fmt_art_open does the cheap checks
 * (magic, version, header/trailer/table/manifest checksums, table bounds,
 * alignment, order and overlap, manifest schema) on every open;
 * fmt_art_verify reads every section and checks both of its checksums.
 * Output is byte-identical for identical writer calls (no time, no paths,
 * single-threaded zstd at a fixed level, sorted JSON keys).
 */
#ifndef FMT_ARTIFACT_H
#define FMT_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mc_error.h"

#define FMT_ART_MAGIC "\x89MCA\r\n\x1a\n"
#define FMT_ART_END_MAGIC "MCA-END\x01"
#define FMT_ART_VERSION 1u
#define FMT_ART_HEADER_BYTES 64u
#define FMT_ART_TRAILER_BYTES 64u
#define FMT_ART_ENTRY_BYTES 64u
#define FMT_ART_ALIGN 4096u
#define FMT_ART_PART_ALIGN 64u           /* tensor parts inside a section */
#define FMT_ART_MAX_MANIFEST (256u << 20) /* bytes */
#define FMT_ART_MAX_SECTIONS (1u << 20)

typedef enum fmt_art_codec {
    FMT_ART_CODEC_RAW = 0,
    FMT_ART_CODEC_ZSTD = 1,
} fmt_art_codec;

/* One section as found on open (borrowed views into the file). */
typedef struct fmt_art_section {
    const char *name;        /* manifest sections[i].name */
    const char *kind;        /* "tensor", "tokenizer", ... */
    uint64_t offset;         /* absolute byte offset of the stored bytes */
    uint64_t stored_bytes;   /* bytes in the file */
    uint64_t raw_bytes;      /* bytes after decompression */
    uint64_t stored_xxh3;
    uint64_t raw_xxh3;
    fmt_art_codec codec;
    const uint8_t *stored;   /* view of the stored bytes */
} fmt_art_section;

/* A byte range inside a section's raw bytes. */
typedef struct fmt_art_part {
    uint64_t off, bytes;
} fmt_art_part;

/* The weight formats a tensor may be stored in, as the manifest's
 * "format" strings name them: the one table of these names (the runtime,
 * `mcompile inspect` and export read it; kernels/kn_names.c maps
 * kn_wformat onto it, whose values these are, asserted there). */
typedef enum fmt_art_wformat {
    FMT_ART_F32 = 0,         /* "f32" */
    FMT_ART_F16 = 1,         /* "f16" */
    FMT_ART_BF16 = 2,        /* "bf16" */
    FMT_ART_Q8 = 3,          /* "q8" */
    FMT_ART_Q4 = 4,          /* "q4" */
    FMT_ART_Q4S = 5,         /* "q4s" */
    FMT_ART_NFORMATS
} fmt_art_wformat;

/* The name of format f (a static string), or "?" when out of range. */
const char *fmt_art_wformat_name(fmt_art_wformat f);
/* 0 and *out for a known name; -1 for an unknown one (or NULL). */
int fmt_art_wformat_parse(const char *s, fmt_art_wformat *out);

/* One tensor of the manifest. */
typedef struct fmt_art_tensor {
    const char *name;        /* borrowed from the manifest */
    const char *format;      /* fmt_art_wformat_name(fmt), static */
    fmt_art_wformat fmt;     /* the format the name says */
    int ndim;                /* 1 or 2 */
    uint64_t rows, cols;     /* 1-D: rows = 1, cols = n */
    uint32_t group;          /* q4/q4s group size, else 0 */
    size_t section;          /* index into the section table */
    fmt_art_part data, scales, zeros; /* bytes 0 when absent */
} fmt_art_tensor;

typedef struct fmt_art fmt_art;

/* Open path (mapped read-only) and run the cheap checks.  *out owned by the
 * caller (fmt_art_close).  Errors name the byte offset where detected. */
mc_status fmt_art_open(const char *path, fmt_art **out, mc_error *err);
/* Same over a borrowed buffer that must outlive the result. */
mc_status fmt_art_open_memory(const void *data, size_t size, const char *name,
                              fmt_art **out, mc_error *err);
void fmt_art_close(fmt_art *a); /* NULL is a no-op */

uint64_t fmt_art_file_bytes(const fmt_art *a);
const uint8_t *fmt_art_bytes(const fmt_art *a);   /* the whole mapping */
/* Parsed manifest (borrowed) and its raw text (borrowed, not NUL-ended). */
const json_t *fmt_art_manifest(const fmt_art *a);
const char *fmt_art_manifest_text(const fmt_art *a, size_t *len);

size_t fmt_art_section_count(const fmt_art *a);
const fmt_art_section *fmt_art_section_at(const fmt_art *a, size_t i);
/* Index of the section named name, or (size_t)-1. */
size_t fmt_art_find_section(const fmt_art *a, const char *name);
size_t fmt_art_tensor_count(const fmt_art *a);
const fmt_art_tensor *fmt_art_tensor_at(const fmt_art *a, size_t i);
const fmt_art_tensor *fmt_art_find_tensor(const fmt_art *a, const char *name);

/* Deep check: every section's stored checksum, and for zstd sections the
 * raw checksum after streaming decompression (into a small scratch buffer).
 * On failure *bad (if non-NULL) is the first bad section index. */
mc_status fmt_art_verify(const fmt_art *a, size_t *bad, mc_error *err);
/* Check one section's stored bytes against stored_xxh3. */
mc_status fmt_art_verify_section(const fmt_art *a, size_t i, mc_error *err);
/* Put section i's raw bytes into dst (dst_bytes must equal raw_bytes):
 * copy for raw sections, streaming zstd decompression straight into dst for
 * zstd ones (a malformed frame or a size mismatch is an error).  With
 * check, dst is also compared with raw_xxh3. */
mc_status fmt_art_section_read(const fmt_art *a, size_t i, void *dst,
                               uint64_t dst_bytes, int check, mc_error *err);

/* ---- writer --------------------------------------------------------------
 * Declare sections (name, kind, raw bytes, codec), then begin with the
 * manifest (borrowed; a copy gets "format", "version" and "sections"
 * added), then stream every section's raw bytes in declaration order (a
 * write may cover part of a section or span several), then finish. */
typedef struct fmt_art_writer fmt_art_writer;

mc_status fmt_art_writer_create(const char *path, fmt_art_writer **out,
                                mc_error *err);
/* zstd level for FMT_ART_CODEC_ZSTD sections (default 3). */
void fmt_art_writer_set_level(fmt_art_writer *w, int level);
mc_status fmt_art_writer_add_section(fmt_art_writer *w, const char *name,
                                     const char *kind, uint64_t raw_bytes,
                                     fmt_art_codec codec, mc_error *err);
mc_status fmt_art_writer_begin(fmt_art_writer *w, const json_t *manifest,
                               mc_error *err);
mc_status fmt_art_writer_write(fmt_art_writer *w, const void *data, size_t n,
                               mc_error *err);
/* Checks every declared byte was written, writes table and trailer, then
 * commits atomically.  Frees w in all cases. */
mc_status fmt_art_writer_finish(fmt_art_writer *w, mc_error *err);
void fmt_art_writer_abort(fmt_art_writer *w); /* NULL is a no-op */

/* ---- helpers ---------------------------------------------------------- */
uint64_t fmt_art_xxh3(const void *data, size_t n);
/* XXH3-64 of a whole file, read in streaming fashion. */
mc_status fmt_art_file_xxh3(const char *path, uint64_t *out, mc_error *err);
/* 1 if the first 8 bytes of a file are FMT_ART_MAGIC (0 otherwise, also on
 * open errors).  For programs choosing how to open a path. */
int fmt_art_is_artifact(const char *path);

#endif /* FMT_ARTIFACT_H */

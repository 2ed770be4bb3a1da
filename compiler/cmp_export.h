/*
 * cmp_export.h - `mcompile export`: a compiled artifact (or a Hugging Face
 * model directory) written for the engines people already run.
 *
 *   GGUF (llama.cpp): general/llama|qwen2 metadata, the tokenizer from the
 *   embedded tokenizer.json, tensors under llama.cpp's names.  f32/f16/bf16
 *   stay as they are; our int8 (per-row f32 scale) becomes Q8_0 (the row's
 *   scale rounded to f16 in every block, codes unchanged: bit-exact when
 *   every scale is an f16 value, as a tied embedding's are; the report
 *   says which Q8_0 tensors are exact, and refuses, by name, a row whose
 *   scale is beyond f16's range); int4 groups
 *   (any of g32/64/128: each 32-block repeats its group's parameters)
 *   become Q4_0 (symmetric, exact); asymmetric groups become what
 *   opts.gguf_int4 says: Q5_0 (the default: exact, x = d (c - 16) with
 *   d = scale, c = q - zero + 16 in 1..31; 5.5 bits per weight), Q4_1
 *   (5 bits; exact would be d = scale, m = -scale * zero, but m is an f16
 *   rounded to nearest, a shift of the block by up to 2^-11 of
 *   |scale * zero|) or Q8_0 (exact: d = scale, c = q - zero; 8.5 bits).
 *   A row length that is not a multiple of 32 has no ggml block form: such
 *   a tensor is written as F32 holding exactly our dequantized values (the
 *   stated fallback), or refused with strict.  llama.cpp's "llama" graph applies RoPE to adjacent pairs, so
 *   q/k rows are permuted per head as its converter does (rows move with
 *   their scales: our quantization is per row).
 *
 *   compressed-tensors (vLLM, transformers): a model directory with
 *   config.json + quantization_config, model.safetensors and the tokenizer
 *   files.  int4 is "pack-quantized" (weight_packed int32 [rows, cols/8],
 *   weight_scale [rows, groups], weight_zero_point packed int32
 *   [rows/8, groups] when asymmetric, weight_shape [2]); int8 is
 *   "int-quantized" per channel (weight int8, weight_scale [rows, 1]).  A
 *   linear whose groups do not divide its row goes in "ignore", written
 *   dequantized in float32 (or refused with strict).
 *
 * A rotated artifact needs nothing: its rotation is already in the stored
 * weights (the norms were folded into the linears and are all ones).
 * The export streams: one tensor is read (decompressed) and converted at a
 * time, so memory is about one tensor's input plus its output.  Outputs are
 * atomic (fmt_atomic.h): a failure leaves no file or directory behind.
 */
#ifndef CMP_EXPORT_H
#define CMP_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_config.h"
#include "kn_quant.h"
#include "mc_error.h"

typedef enum cmp_export_format {
    CMP_EXPORT_GGUF = 0,
    CMP_EXPORT_CT = 1, /* compressed-tensors directory */
} cmp_export_format;

/* How asymmetric int4 groups are written to GGUF (symmetric ones are
 * always Q4_0, which holds them exactly). */
typedef enum cmp_gguf_int4 {
    CMP_GGUF_INT4_Q5_0 = 0, /* 5.5 bits/weight, exact (the default) */
    CMP_GGUF_INT4_Q4_1 = 1, /* 5.0 bits/weight, m rounded to f16 */
    CMP_GGUF_INT4_Q8_0 = 2, /* 8.5 bits/weight, exact */
} cmp_gguf_int4;

typedef struct cmp_export_opts {
    cmp_export_format format;
    cmp_gguf_int4 gguf_int4; /* GGUF only */
    int strict;        /* refuse a tensor the format cannot hold exactly as
                          quantized, instead of the float32 fallback */
    int ignore_window; /* GGUF: export a sliding-window model although
                          llama.cpp's llama/qwen2 graphs attend to the
                          whole context (exact only up to the window) */
} cmp_export_opts;

#define CMP_EXPORT_MAX_NOTES 16

/* A GGUF export's general.quantized_by: the tool that wrote it, and how a
 * later export knows the file is one it may replace. */
#define CMP_EXPORT_GGUF_BY "mcompile"

typedef struct cmp_export_report {
    size_t tensors;           /* tensors written */
    size_t quantized;         /* of those, in a quantized type */
    size_t fallback;          /* quantized in the input, written float32 */
    char fallback_first[128]; /* first such tensor's name */
    char fallback_why[160];   /* and why the format cannot hold it */
    int dense_embed;          /* compressed-tensors: a quantized embedding
                                 written dequantized in float32 (its form
                                 there, not a fallback) */
    uint64_t bytes;           /* bytes written (all files) */
    uint64_t largest_tensor;  /* bytes of the largest input tensor */
    uint64_t q4_1_blocks;     /* GGUF: Q4_1 blocks written */
    uint64_t q4_1_inexact;    /* of those, not equal to ours */
    double q4_1_max_err;      /* largest |Q4_1 - ours| / the block's scale */
    size_t q8_tensors;        /* GGUF: Q8_0 tensors from our int8 */
    size_t q8_exact;          /* of those, bit-exact: every row's scale
                                 an f16 value (a tied embedding's are:
                                 cmp_quant.h CMP_Q8_F16) */
    char q8_exact_names[192]; /* their GGUF names, ", "-separated ("..."
                                 ends a longer list) */
    char q8_inexact_first[128]; /* the first that is not exact ("" none) */
    uint64_t q8_rows_inexact; /* rows whose scale the f16 rounded */
    double q8_max_err;        /* largest |f16(scale) - scale| / scale */
    char tokenizer[64];       /* "llama (SPM) from tokenizer.json", "none" */
    char tokenizer_note[512]; /* GGUF: what llama.cpp's tokenizer will not
                                 reproduce of the tokenizer.json ("" none) */
    char arch[32];            /* GGUF general.architecture, or model_type */
} cmp_export_report;

/* Export input (an .mca artifact, or a model directory / file as
 * fmt_model_open takes) to out (a .gguf file or a directory).  Refuses out
 * equal to the input.  rep may be NULL. */
mc_status cmp_export(const char *input, const char *out,
                     const cmp_export_opts *o, cmp_export_report *rep,
                     mc_error *err);

/* ---- shared by the writers (cmp_export_src.c) ------------------------- */

/* One tensor of the input, as the writers see it. */
typedef struct cmp_xtensor {
    const char *name;        /* Hugging Face name (borrowed) */
    kn_wformat fmt;          /* storage format */
    int ndim;                /* 1 or 2 */
    uint32_t rows, cols;     /* 1-D: rows 1 */
    uint32_t group;          /* Q4/Q4S group, else 0 */
    const uint8_t *data;     /* kn_quant.h layouts; valid until the next */
    const uint8_t *scales;   /* cmp_xsrc_load or cmp_xsrc_close */
    const uint8_t *zeros;
} cmp_xtensor;

typedef struct cmp_xsrc cmp_xsrc;

mc_status cmp_xsrc_open(const char *path, cmp_xsrc **out, mc_error *err);
void cmp_xsrc_close(cmp_xsrc *s); /* NULL is a no-op */
const fmt_model_config *cmp_xsrc_config(const cmp_xsrc *s);
/* The tokenizer.json bytes (borrowed, not NUL-ended), NULL if none. */
const char *cmp_xsrc_tokenizer(const cmp_xsrc *s, size_t *len);
size_t cmp_xsrc_count(const cmp_xsrc *s);
/* Shape and format of tensor i without reading its bytes (data NULL). */
mc_status cmp_xsrc_info(const cmp_xsrc *s, size_t i, cmp_xtensor *t,
                        mc_error *err);
/* Tensor i with its bytes (the previous load's views become invalid). */
mc_status cmp_xsrc_load(cmp_xsrc *s, size_t i, cmp_xtensor *t, mc_error *err);
/* 1 if the input has a tensor named name. */
int cmp_xsrc_has(const cmp_xsrc *s, const char *name);
/* Bytes of tensor t's data + scales + zeros. */
uint64_t cmp_xtensor_bytes(const cmp_xtensor *t);
/* Row r of t as float32 (out holds cols), exactly our dequantization. */
void cmp_xtensor_row_f32(const cmp_xtensor *t, uint32_t r, float *out);

/* GGUF tokenizer.ggml.* metadata from tokenizer.json text (len bytes) for
 * cfg's vocabulary (cmp_export_tok.c); desc gets "llama (SPM), N tokens"
 * or "gpt2 (BPE, pre qwen2), N tokens"; note what of the tokenizer.json
 * llama.cpp will not reproduce (empty when nothing).  src names the input
 * in errors. */
struct fmt_gguf_writer;
mc_status cmp_export_gguf_tokenizer(struct fmt_gguf_writer *w,
                                    const char *text, size_t len,
                                    const fmt_model_config *cfg,
                                    const char *src, char *desc,
                                    size_t desc_cap, char *note,
                                    size_t note_cap, mc_error *err);

/* The two writers (cmp_export_gguf.c, cmp_export_ct.c). */
mc_status cmp_export_gguf(cmp_xsrc *s, const char *out,
                          const cmp_export_opts *o, cmp_export_report *rep,
                          mc_error *err);
mc_status cmp_export_ct(cmp_xsrc *s, const char *out,
                        const cmp_export_opts *o, cmp_export_report *rep,
                        mc_error *err);

#endif /* CMP_EXPORT_H */

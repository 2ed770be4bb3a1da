/*
 * cmp_calib_data.h - calibration data for `mcompile --calib FILE`: token
 * ids as fmt_ids reads them, or plain text tokenized with the model's
 * tokenizer.
 *
 * Which one a file is, is decided by its content alone (not its name):
 *
 *   ids   every line, after stripping ' ', '\t' and a final '\r', is
 *         empty, a '#' comment (fmt_ids.h keeps those), or whitespace-
 *         separated runs of the digits 0-9 -- and at least one line is
 *         such a run.  The file is then parsed by fmt_ids_parse exactly as
 *         fmt_ids_load would (same result, same errors: an id over
 *         INT32_MAX or not below vocab_size is an error, not text).
 *   text  anything else: "12 34 x" is text, so is a file holding only
 *         comments.  A NUL byte is an error (a binary file, not text).
 *
 * Text becomes sequences like this:
 *   1. documents are the paragraphs: runs of lines separated by one or
 *      more blank lines (only ' ', '\t', '\r', '\f', '\v').  A document is
 *      its lines' bytes from the first non-blank line to the end of the
 *      last one, inner '\n' kept, the last line's "\n" / "\r\n" not;
 *   2. each document is encoded with rt_tokenizer_encode(add_special = 0)
 *      and, when the tokenizer names a BOS (rt_tokenizer_bos() >= 0: the
 *      post-processor template's special token, tokenizer_config.json's
 *      bos_token, or a "<s>" / "<|begin_of_text|>" token), that id is put
 *      in front.  For Llama-2/3 and Mistral this is what mrun's default
 *      (add_special) gives a prompt: "<s>" + the text;
 *   3. the documents' tokens are concatenated into one stream and cut into
 *      sequences of max_seq tokens (0 means CMP_CALIB_DATA_DEFAULT_SEQ);
 *      a last piece shorter than CMP_CALIB_DATA_MIN_TAIL tokens is dropped
 *      unless it is the only sequence.  Only the first token of a document
 *      is BOS; a sequence may start mid-document.
 * Every id must be below vocab_size (0 skips the check, as in fmt_ids).
 *
 * The tokenizer is the one mcompile embeds in the artifact and mrun reads:
 * tokenizer.json in the model's directory -- MODEL itself when it is a
 * directory, else the directory holding it (a .safetensors file or a
 * model.safetensors.index.json), the rule of fmt_model_dir().  A
 * tokenizer_config.json beside it is read too (rt_tokenizer_load).
 *
 * Files over CMP_CALIB_DATA_MAX_BYTES are refused before reading.  The
 * whole file is read into memory; the text path holds the file, the token
 * stream and the result at once.
 */
#ifndef CMP_CALIB_DATA_H
#define CMP_CALIB_DATA_H

#include <stdint.h>

#include "fmt_ids.h"
#include "mc_error.h"

/* Largest calibration file accepted, in bytes (1 GiB). */
#define CMP_CALIB_DATA_MAX_BYTES ((uint64_t)1 << 30)
/* Sequence length in tokens for text when max_seq is 0. */
#define CMP_CALIB_DATA_DEFAULT_SEQ 512u
/* A last text piece shorter than this (tokens) is dropped, unless alone. */
#define CMP_CALIB_DATA_MIN_TAIL 16u

/* Load the calibration file at path.  model_path is the MODEL argument of
 * mcompile (a directory, a .safetensors file or an index .json); it is
 * used only to find tokenizer.json, and only for a text file (it may be
 * NULL, in which case text is an error).  max_seq (tokens) applies to text
 * only: an ids file keeps its lines as they are.  On success *out is new
 * (free with fmt_ids_free) and has the layout fmt_ids_load returns;
 * *was_text (if was_text is non-NULL) is 1 for text, 0 for ids.  On
 * failure *out is NULL.  err->file is path for every error about the file
 * itself, including "text needs a tokenizer".
 * Errors: MC_ERR_NOT_FOUND (no file; or text and no tokenizer.json),
 * MC_ERR_IO, MC_ERR_UNSUPPORTED (over 1 GiB), MC_ERR_FORMAT (empty or
 * blank, NUL byte, bad ids, an id not below vocab_size, text that encodes
 * to nothing), MC_ERR_NOMEM, MC_ERR_INVALID_ARG (NULL path or out); a
 * tokenizer.json that does not load gives rt_tokenizer_load's status with
 * its message quoted (err->file is still path).
 * src (optional) receives the xxh3 and the size of the bytes read, for the
 * artifact's provenance, so the file is read once. */
typedef struct cmp_calib_source {
    uint64_t xxh3;  /* fmt_art_xxh3 of the whole file */
    uint64_t bytes; /* its size */
} cmp_calib_source;
mc_status cmp_calib_data_load(const char *path, const char *model_path,
                              uint32_t vocab_size, uint32_t max_seq,
                              fmt_ids **out, int *was_text,
                              cmp_calib_source *src, mc_error *err);

#endif /* CMP_CALIB_DATA_H */

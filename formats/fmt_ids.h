/*
 * fmt_ids.h - token-id files: sequences of token ids as text.
 *
 * Used by `mrun --tokens-file`, calibration (`--calib`) and evaluation
 * (`--tokens`).  Layout (bytes, ASCII):
 *
 *   file     := line*                    '\n' ends a line; the last line may
 *                                        lack it; "\r\n" is accepted
 *   line     := blank* (id (sep id)*)? blank* ("\r")?
 *   blank    := ' ' | '\t'
 *   sep      := blank+
 *   id       := [0-9]+                   decimal, no sign; value <= INT32_MAX
 *                                        and < vocab_size when one is given
 *   comment  := blank* '#' anything      a whole line; ignored
 *
 * Each non-blank, non-comment line is one sequence (at least one id).  Blank
 * lines and comment lines are skipped; they are not sequences ('#' after an
 * id on the same line is an error, so a stray character is never silently
 * dropped).  A line may hold at most FMT_IDS_MAX_LINE bytes.  A file with no
 * sequence is an error (every user needs at least one).
 *
 * Errors are MC_ERR_FORMAT with the file, "line L, column C" (1-based,
 * columns in bytes) in the message and the byte offset in err->offset.
 *
 * The result is compact: all ids in one array, sequence i is
 * ids[offsets[i] .. offsets[i+1]).  Parsing makes two passes over the text
 * (validate and count, then fill), so it allocates exactly twice.
 */
#ifndef FMT_IDS_H
#define FMT_IDS_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

/* Longest accepted line in bytes, excluding the '\n'. */
#define FMT_IDS_MAX_LINE ((size_t)64 << 20)

typedef struct fmt_ids {
    int32_t *ids;      /* (n_ids) all ids, sequence after sequence (owned) */
    size_t n_ids;      /* total ids */
    size_t *offsets;   /* (n_seqs + 1) start of each sequence in ids; offsets[n_seqs] == n_ids (owned) */
    size_t n_seqs;     /* sequences (>= 1) */
} fmt_ids;

/* Parse data[0..len).  name is the file name for messages (may be NULL).
 * vocab_size 0 skips the range check; otherwise every id must be
 * < vocab_size.  On success *out is new (free with fmt_ids_free); on
 * failure *out is NULL.  Errors: MC_ERR_FORMAT, MC_ERR_NOMEM,
 * MC_ERR_INVALID_ARG (NULL arguments). */
mc_status fmt_ids_parse(const void *data, size_t len, const char *name,
                        uint32_t vocab_size, fmt_ids **out, mc_error *err);

/* Read and parse the file at path.  Also MC_ERR_NOT_FOUND / MC_ERR_IO. */
mc_status fmt_ids_load(const char *path, uint32_t vocab_size, fmt_ids **out,
                       mc_error *err);

/* Free; NULL is a no-op. */
void fmt_ids_free(fmt_ids *ids);

/* Length of sequence i (i < n_seqs) and a borrowed pointer to its ids. */
static inline const int32_t *fmt_ids_seq(const fmt_ids *f, size_t i,
                                         size_t *len)
{
    *len = f->offsets[i + 1] - f->offsets[i];
    return f->ids + f->offsets[i];
}

#endif /* FMT_IDS_H */

/*
 * rt_stopstr.h - stop strings: generation ends as soon as the decoded text
 * of the generated tokens contains one of them (a match may span tokens;
 * the prompt's text never counts).
 *
 * Decoding a token sequence is, for the decoders a tokenizer.json can
 * hold (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip), the
 * concatenation of each token's text, where only the first token with
 * text is decoded differently (a leading space dropped).  So the text is
 * followed one token at a time from two tables built once per tokenizer
 * (rt_stop_pieces: each token's bytes first and later in a sequence), and
 * a request's matcher (rt_stop_match) keeps only a window of the last
 * (longest stop string - 1) bytes plus one token's bytes, in a buffer the
 * caller sizes when the request is admitted: pushing a token never
 * allocates and costs O(window * stop strings).
 *
 * The final text of a request is still decoded whole (rt_tokenizer_decode)
 * and cut before the earliest stop string in it (rt_stop_find), as
 * vLLM and OpenAI cut.
 */
#ifndef RT_STOPSTR_H
#define RT_STOPSTR_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_tokenizer.h"

/* Longest stop string accepted (bytes): the window is sized from it. */
#define RT_STOP_STRING_MAX 1024

typedef struct rt_stop_pieces rt_stop_pieces;

/* Build the per-token text tables of tok (special tokens decode to no
 * text, as the output's text skips them).  One decode per token and
 * position: done once per job, never per step.  MC_ERR_NOMEM, or
 * MC_ERR_INVALID_ARG when tok is NULL. */
mc_status rt_stop_pieces_build(const rt_tokenizer *tok, rt_stop_pieces **out,
                               mc_error *err);
void rt_stop_pieces_free(rt_stop_pieces *p); /* NULL is a no-op */
/* The bytes p's tables were allocated with (malloc's own rounding
 * aside), for a memory plan; 0 for NULL. */
size_t rt_stop_pieces_bytes(const rt_stop_pieces *p);

/* A request's matcher; every pointer is borrowed for its lifetime. */
typedef struct rt_stop_match {
    const rt_stop_pieces *pieces;
    const char *const *str;    /* [n] stop strings */
    const size_t *len;         /* [n] their lengths in bytes, >= 1 */
    size_t n;
    char *win;                 /* window, rt_stop_match_bytes() bytes */
    size_t used;               /* bytes in win */
    size_t keep;               /* longest stop string - 1 */
    int started;               /* a token with text has been pushed */
} rt_stop_match;

/* Bytes of the window buffer a matcher of these stop strings needs. */
size_t rt_stop_match_bytes(const rt_stop_pieces *p, const size_t *len,
                           size_t n);

/* Start matching (no text yet).  win: rt_stop_match_bytes() bytes. */
void rt_stop_match_init(rt_stop_match *m, const rt_stop_pieces *p,
                        const char *const *str, const size_t *len, size_t n,
                        char *win);

/* The text grew by generated token id: 1 if it now contains a stop string
 * (one that ends in this token's bytes; earlier ones were reported by the
 * push that completed them), else 0.  Never allocates. */
int rt_stop_match_push(rt_stop_match *m, int32_t id);

/* Offset of the earliest occurrence of any of the n strings in text[0,
 * len), or len when none occurs. */
size_t rt_stop_find(const char *text, size_t len, const char *const *str,
                    const size_t *slen, size_t n);

#endif /* RT_STOPSTR_H */

/* tok_gen.h - generated tokenizer.json files with hand-worked answers, and
 * the encode / round-trip checks the tokenizer tests share
 * (test_tokenizer.c, test_tokenizer_mistral.c).
 *
 * The SentencePiece-style file: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF>
 * 3..258, then the pieces named S_* below (merges "\u2581 \u2581",
 * "\u2581 h", "l l", "\u2581h e", "\u2581he ll", "\u2581hell o", "a b",
 * "\u2581 a").  The byte-level file: the 256 GPT-2 byte characters, then the
 * pieces named B_* (merges "\u0120 t", "h e", "\u0120t he", "i s",
 * "\u0120 is"), <|endoftext|> special.
 *
 * Include after <cmocka.h> (cmocka's rule): the checks fail the test. */
#ifndef TU_TOK_GEN_H
#define TU_TOK_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "rt_tokenizer.h"

#define MS "\xE2\x96\x81" /* U+2581, the SentencePiece space */

/* Ids of the SentencePiece-style pieces after the 259 fixed ids. */
enum {
    S_SP = 259, S_A, S_B, S_C, S_H, S_E, S_L, S_O, S_SPH, S_LL, S_SPHE,
    S_SPHELL, S_SPHELLO, S_EACUTE, S_AB, S_SPA, S_SPSP
};

typedef struct tu_spm_opts {
    int legacy;          /* normalizer Prepend+Replace, no pre-tokenizer */
    int pair_merges;     /* [["a","b"]] instead of ["a b"] */
    const char *scheme;  /* Metaspace prepend_scheme */
    int split;           /* Metaspace split */
    int byte_fallback;
    int fuse_unk;
} tu_spm_opts;

/* Ids of the byte-level pieces after the 256 byte characters. */
enum { B_GT = 256, B_HE, B_GTHE, B_IS, B_GIS, B_THIS, B_EOT };

/* The tokenizer.json text (new, the caller frees). */
char *tu_tok_spm_json(const tu_spm_opts *o);
/* split: 0 ByteLevel(use_regex) alone; 1 Split(Llama-3 regex)+ByteLevel. */
char *tu_tok_bl_json(int split, int pair_merges, int ignore_merges);

/* A tokenizer loaded from json text / generated (new; fails the test when
 * the load fails, printing why). */
rt_tokenizer *tu_tok_load_text(const char *json);
rt_tokenizer *tu_tok_load_spm(tu_spm_opts o);
rt_tokenizer *tu_tok_load_bl(int split, int pairs, int ignore);

/* encode(text) == want[0..n_want) or the test fails, printing both. */
void tu_tok_expect_ids(const rt_tokenizer *t, const char *text, int special,
                       const int32_t *want, size_t n_want);
#define EXPECT(t, text, special, ...)                                          \
    do {                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                 \
        tu_tok_expect_ids(t, text, special, want_,                             \
                          sizeof want_ / sizeof *want_);                       \
    } while (0)

/* decode(encode(text)) == want (text itself when want is NULL).  skip:
 * encode with add_special and decode with skip_special; else neither. */
void tu_tok_expect_round_trip_skip(const rt_tokenizer *t, const char *text,
                                   size_t len, const char *want,
                                   size_t want_len, int skip);
/* The same with skip 1. */
void tu_tok_expect_round_trip(const rt_tokenizer *t, const char *text,
                              size_t len, const char *want, size_t want_len);
#define ROUND_TRIP(t, s) tu_tok_expect_round_trip(t, s, strlen(s), NULL, 0)
#define ROUND_TRIP_SPECIAL(t, s)                                               \
    tu_tok_expect_round_trip_skip(t, s, strlen(s), NULL, 0, 0)

#endif /* TU_TOK_GEN_H */

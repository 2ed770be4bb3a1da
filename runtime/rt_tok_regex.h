/*
 * rt_tok_regex.h - the tokenizer's patterns, matched by PCRE2 (UTF-8, Unicode
 * properties), and the way Hugging Face `tokenizers` cuts text with them.
 *
 * Two flavours of pattern text:
 *  - RT_RE_ONIG: a regex from tokenizer.json.  `tokenizers` compiles those
 *    with Oniguruma (Ruby syntax), whose classes differ from PCRE2's, so
 *    the text is translated before compiling: \s and \S become White_Space,
 *    \w becomes Letter | Mark | Number | Connector_Punctuation (Oniguruma's
 *    Unicode definitions), ^ and $ match at line ends (Ruby).  What has no
 *    faithful translation is refused with the reason: \W inside a class,
 *    \b, \B, \h, \H, the (?m) option (dot-all in Ruby).
 *  - RT_RE_PCRE: our own patterns (Whitespace, Punctuation, ...), PCRE2
 *    syntax as written.
 * A regex is matched within each run of valid UTF-8 of the subject: an
 * invalid byte matches nothing and ends the run as the end of the text
 * would (Hugging Face never sees such bytes; encode accepts them).
 *
 * Matching walks the text as the Rust `regex` / `onig` crates' find_iter
 * do: leftmost-first matches, no overlap, and an empty match right after
 * the previous match is skipped.
 *
 * A compiled pattern is read-only and may be used by several threads at
 * once; each thread brings its own match scratch (rt_tok_re_scratch).
 * Memory comes from mc_malloc (fault injection reaches PCRE2 too).
 */
#ifndef RT_TOK_REGEX_H
#define RT_TOK_REGEX_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

typedef struct rt_tok_re rt_tok_re;
typedef struct rt_tok_re_scratch rt_tok_re_scratch;

enum { RT_RE_ONIG, RT_RE_PCRE };

/* The members of Rust's regex \w (Unicode), to go inside [...] of an
 * RT_RE_PCRE pattern: Alphabetic, Mark, Decimal_Number,
 * Connector_Punctuation, Join_Control.  `tokenizers` uses that crate for
 * Whitespace and for single_word added tokens. */
#define RT_TOK_RE_RUST_WORD \
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"

/* How a Split turns matches into pieces (Hugging Face
 * SplitDelimiterBehavior). */
enum {
    RT_SPLIT_REMOVED,
    RT_SPLIT_ISOLATED,
    RT_SPLIT_MERGED_PREV,
    RT_SPLIT_MERGED_NEXT,
    RT_SPLIT_CONTIGUOUS
};

/* Compile pat[0..len).  On success *out is new (free with rt_tok_re_free).
 * MC_ERR_UNSUPPORTED: a construct without a faithful translation, or a
 * pattern PCRE2 rejects; why (cap bytes, NUL-terminated) says which and
 * where.  MC_ERR_NOMEM. */
mc_status rt_tok_re_compile(const char *pat, size_t len, int flavour,
                            rt_tok_re **out, char *why, size_t why_cap);
void rt_tok_re_free(rt_tok_re *re); /* NULL is a no-op */

/* Scratch for matching (new; free with rt_tok_re_scratch_free, NULL ok);
 * NULL when out of memory. */
rt_tok_re_scratch *rt_tok_re_scratch_new(void);
void rt_tok_re_scratch_free(rt_tok_re_scratch *sc);

/* One span of a text cut by a pattern: [start, end), is_match. */
typedef struct rt_tok_span {
    size_t start, end; /* bytes */
    int match;
} rt_tok_span;

/* Cut s[0..n) into spans covering it (matches of re, or of the literal
 * lit[0..lit_len) when re is NULL, and the gaps between them; invert swaps
 * the two), then apply behaviour (RT_SPLIT_*) and drop empty and removed
 * spans.  Spans are appended to out (an rt_tok_span array of *n_out, room
 * *cap, grown with mc_realloc).  MC_ERR_NOMEM, or MC_ERR_INVALID_ARG when
 * PCRE2 fails to match (match limit). */
mc_status rt_tok_re_split(const rt_tok_re *re, const uint8_t *lit,
                          size_t lit_len, int invert, int behaviour,
                          rt_tok_re_scratch *sc, const uint8_t *s, size_t n,
                          rt_tok_span **out, size_t *n_out, size_t *cap);

#endif /* RT_TOK_REGEX_H */

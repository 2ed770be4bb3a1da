/*
 * rt_tok_unicode.h - the little Unicode the tokenizer does by hand: lenient
 * UTF-8 decoding and White_Space (a fixed list of 25 code points).  Classes
 * for patterns are PCRE2's (rt_tok_regex.h); normalization forms and case
 * are utf8proc's (rt_tok_norm.c).
 */
#ifndef RT_TOK_UNICODE_H
#define RT_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Code point sentinel for a byte that does not start a valid UTF-8
 * sequence; it is in no class (not L, N or whitespace). */
#define RT_TOK_BAD_CP 0xFFFFFFFFu

/* Decode the character at s[0..n) (n >= 1).  Returns its length in bytes
 * (1..4) and the code point in *cp; an invalid, overlong, surrogate or
 * truncated sequence is one byte long with *cp = RT_TOK_BAD_CP. */
size_t rt_tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Length of the run of valid UTF-8 at the start of s[0..n) (0 if s[0]
 * does not start a valid character). */
size_t rt_tok_utf8_valid_len(const uint8_t *s, size_t n);

/* Encode cp (<= 0x10FFFF) as UTF-8 into out[0..4); returns the length. */
size_t rt_tok_utf8_put(uint32_t cp, uint8_t *out);

/* Unicode White_Space (Rust's char::is_whitespace, regex \s). */
int rt_tok_is_space(uint32_t cp);

#endif /* RT_TOK_UNICODE_H */

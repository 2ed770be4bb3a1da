/*
 * rt_tok_unicode.h - the little Unicode the tokenizer needs: lenient UTF-8
 * decoding and the classes used by the pre-tokenizer regexes (\p{L}, \p{N},
 * \s).  The L and N ranges are generated from Python's unicodedata by
 * scripts/gen-unicode-tables.py into rt_tok_unicode_tables.c.
 */
#ifndef RT_TOK_UNICODE_H
#define RT_TOK_UNICODE_H

#include <stddef.h>
#include <stdint.h>

extern const uint32_t rt_tok_letter_ranges[][2];
extern const size_t rt_tok_letter_ranges_count;
extern const uint32_t rt_tok_number_ranges[][2];
extern const size_t rt_tok_number_ranges_count;

/* Code point sentinel for a byte that does not start a valid UTF-8
 * sequence; it is in no class (not L, N or whitespace). */
#define RT_TOK_BAD_CP 0xFFFFFFFFu

/* Decode the character at s[0..n) (n >= 1).  Returns its length in bytes
 * (1..4) and the code point in *cp; an invalid, overlong, surrogate or
 * truncated sequence is one byte long with *cp = RT_TOK_BAD_CP. */
size_t rt_tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Encode cp (<= 0x10FFFF) as UTF-8 into out[0..4); returns the length. */
size_t rt_tok_utf8_put(uint32_t cp, uint8_t *out);

int rt_tok_is_letter(uint32_t cp);  /* general category L* */
int rt_tok_is_number(uint32_t cp);  /* general category N* */
int rt_tok_is_space(uint32_t cp);   /* regex \s (Unicode White_Space) */

#endif /* RT_TOK_UNICODE_H */

/*
 * rt_tok_pretok.c - normalizers, pre-tokenizers and the hand-compiled split
 * regexes.
 *
 * A segment of text (between added tokens) becomes a list of pieces, each a
 * byte range of a work buffer.  Steps that change bytes (Prepend, Replace,
 * Metaspace, ByteLevel's prefix space) write a new buffer; steps that only
 * split keep the buffer and cut the pieces.  Empty pieces are dropped, as
 * Hugging Face drops empty splits.
 *
 * The regexes are the three Hugging Face byte-level tokenizers use, matched
 * with the leftmost-first alternation semantics of the regex engine:
 *   GPT-2   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama-3 (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2   the same with \p{N} for \p{N}{1,3}
 * Every character is matched by one of the alternatives, so a match is
 * never empty.
 */
#include <string.h>

#include "rt_tok_internal.h"
#include "rt_tok_unicode.h"

static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int rt_tok_pattern_from_regex(const char *re, size_t len)
{
    if (len == sizeof PAT_GPT2 - 1 && memcmp(re, PAT_GPT2, len) == 0)
        return RT_PAT_GPT2;
    if (len == sizeof PAT_LLAMA3 - 1 && memcmp(re, PAT_LLAMA3, len) == 0)
        return RT_PAT_LLAMA3;
    if (len == sizeof PAT_QWEN2 - 1 && memcmp(re, PAT_QWEN2, len) == 0)
        return RT_PAT_QWEN2;
    return -1;
}

/* Code point at s[i] (i < n) and its length. */
static uint32_t cp_at(const uint8_t *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    *len = rt_tok_utf8_next(s + i, n - i, &cp);
    return cp;
}

/* [^\s\p{L}\p{N}] */
static int is_other(uint32_t cp)
{
    return !rt_tok_is_space(cp) && !rt_tok_is_letter(cp) &&
           !rt_tok_is_number(cp);
}

static int lower_eq(uint8_t c, char want)
{
    if (c >= 'A' && c <= 'Z')
        c = (uint8_t)(c - 'A' + 'a');
    return c == (uint8_t)want;
}

/* Length of a contraction at s[i] ('s 't 're 've 'm 'll 'd), or 0. */
static size_t contraction(const uint8_t *s, size_t n, size_t i, int icase)
{
    if (s[i] != '\'' || i + 1 >= n)
        return 0;
    uint8_t a = s[i + 1];
    uint8_t b = i + 2 < n ? s[i + 2] : 0;
    if (!icase) {
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
            (a == 'l' && b == 'l'))
            return 3;
        return 0;
    }
    if (lower_eq(a, 's') || lower_eq(a, 't') || lower_eq(a, 'm') ||
        lower_eq(a, 'd'))
        return 2;
    if ((lower_eq(a, 'r') && lower_eq(b, 'e')) ||
        (lower_eq(a, 'v') && lower_eq(b, 'e')) ||
        (lower_eq(a, 'l') && lower_eq(b, 'l')))
        return 3;
    return 0;
}

/* End of a run of characters of one class starting at i, at most max
 * characters (0 = no limit). */
static size_t run_end(const uint8_t *s, size_t n, size_t i,
                      int (*cls)(uint32_t), size_t max)
{
    size_t count = 0, len;
    while (i < n && (max == 0 || count < max) && cls(cp_at(s, n, i, &len))) {
        i += len;
        count++;
    }
    return i;
}

/* \s+(?!\S)|\s+ at i, where s[i] is whitespace. */
static size_t space_match(const uint8_t *s, size_t n, size_t i)
{
    size_t len, last = i, j = i;
    while (j < n && rt_tok_is_space(cp_at(s, n, j, &len))) {
        last = j;
        j += len;
    }
    if (j == n || last == i)
        return j - i; /* to the end, or a single whitespace char */
    return last - i;  /* leave the last one to go with what follows */
}

static int not_newline_l_n(uint32_t cp)
{
    return cp != '\r' && cp != '\n' && !rt_tok_is_letter(cp) &&
           !rt_tok_is_number(cp);
}

static int is_newline(uint32_t cp)
{
    return cp == '\r' || cp == '\n';
}

size_t rt_tok_pattern_match(int pattern, const uint8_t *s, size_t n, size_t i)
{
    size_t len, len1, c;
    uint32_t c0 = cp_at(s, n, i, &len);
    if (pattern == RT_PAT_GPT2) {
        if ((c = contraction(s, n, i, 0)) != 0)
            return c;
        size_t j = i;
        uint32_t cj = c0;
        if (c0 == ' ' && i + 1 < n) {
            uint32_t c1 = cp_at(s, n, i + 1, &len1);
            if (rt_tok_is_letter(c1) || rt_tok_is_number(c1) || is_other(c1)) {
                j = i + 1;
                cj = c1;
            }
        }
        if (rt_tok_is_letter(cj))
            return run_end(s, n, j, rt_tok_is_letter, 0) - i;
        if (rt_tok_is_number(cj))
            return run_end(s, n, j, rt_tok_is_number, 0) - i;
        if (is_other(cj))
            return run_end(s, n, j, is_other, 0) - i;
        return space_match(s, n, i);
    }
    /* Llama-3 / Qwen2 */
    if ((c = contraction(s, n, i, 1)) != 0)
        return c;
    if (not_newline_l_n(c0) && i + len < n &&
        rt_tok_is_letter(cp_at(s, n, i + len, &len1)))
        return run_end(s, n, i + len, rt_tok_is_letter, 0) - i;
    if (rt_tok_is_letter(c0))
        return run_end(s, n, i, rt_tok_is_letter, 0) - i;
    if (rt_tok_is_number(c0))
        return run_end(s, n, i, rt_tok_is_number,
                       pattern == RT_PAT_LLAMA3 ? 3 : 1) -
               i;
    {
        size_t j = i;
        if (c0 == ' ' && i + 1 < n && is_other(cp_at(s, n, i + 1, &len1)))
            j = i + 1;
        if (is_other(cp_at(s, n, j, &len1))) {
            size_t e = run_end(s, n, j, is_other, 0);
            return run_end(s, n, e, is_newline, 0) - i;
        }
    }
    /* c0 is whitespace: \s*[\r\n]+ then \s+(?!\S) then \s+ */
    size_t j = i, last_nl = SIZE_MAX;
    while (j < n && rt_tok_is_space(cp_at(s, n, j, &len))) {
        if (s[j] == '\r' || s[j] == '\n')
            last_nl = j;
        j += len;
    }
    if (last_nl != SIZE_MAX)
        return last_nl + 1 - i;
    return space_match(s, n, i);
}

/* ---- pipeline ---- */

#define PIECES(b) ((rt_tok_piece *)(void *)(b)->p)
#define NPIECES(b) ((b)->len / sizeof(rt_tok_piece))

static int add_piece(rt_tok_buf *pb, size_t off, size_t len, int at_start)
{
    if (len == 0)
        return 1;
    rt_tok_piece p = {off, len, at_start};
    return rt_tok_buf_append(pb, &p, sizeof p);
}

static void swap(rt_tok_buf *a, rt_tok_buf *b)
{
    rt_tok_buf t = *a;
    *a = *b;
    *b = t;
}

/* Append src[0..n) to out with every occurrence of pat replaced by rep. */
int rt_tok_replace_into(rt_tok_buf *out, const uint8_t *src, size_t n,
                        const uint8_t *pat, size_t plen, const uint8_t *rep,
                        size_t rlen)
{
    size_t i = 0, start = 0;
    if (plen == 0)
        return rt_tok_buf_append(out, src, n);
    while (i + plen <= n) {
        if (src[i] == pat[0] && memcmp(src + i, pat, plen) == 0) {
            if (!rt_tok_buf_append(out, src + start, i - start) ||
                !rt_tok_buf_append(out, rep, rlen))
                return 0;
            i += plen;
            start = i;
        } else {
            i++;
        }
    }
    return rt_tok_buf_append(out, src + start, n - start);
}

/* One byte-changing step over every piece: cur/pieces -> other/pieces2,
 * then swapped back so the result is in cur/pieces. */
static mc_status rewrite_step(const rt_tok_step *st, rt_tok_buf *cur,
                              rt_tok_buf *other, rt_tok_buf *pieces,
                              rt_tok_buf *pieces2)
{
    other->len = 0;
    pieces2->len = 0;
    size_t np = NPIECES(pieces);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p = PIECES(pieces)[k];
        const uint8_t *src = cur->p + p.off;
        size_t start = other->len;
        int ok = 1;
        switch (st->kind) {
        case RT_NORM_PREPEND:
            ok = rt_tok_buf_append(other, st->a, st->a_len) &&
                 rt_tok_buf_append(other, src, p.len);
            break;
        case RT_NORM_REPLACE:
            ok = rt_tok_replace_into(other, src, p.len, st->a, st->a_len, st->b,
                                     st->b_len);
            break;
        case RT_PRE_METASPACE: {
            /* after replacing ' ', the piece starts with the replacement
             * iff it starts with ' ' or with the replacement already */
            int starts = src[0] == ' ' || (p.len >= st->a_len &&
                                           memcmp(src, st->a, st->a_len) == 0);
            int want = st->prepend == RT_PREPEND_ALWAYS ||
                       (st->prepend == RT_PREPEND_FIRST && p.at_start);
            if (want && !starts)
                ok = rt_tok_buf_append(other, st->a, st->a_len);
            ok = ok &&
                 rt_tok_replace_into(other, src, p.len, (const uint8_t *)" ", 1,
                                     st->a, st->a_len);
            break;
        }
        case RT_PRE_BYTELEVEL:
            if (st->add_prefix_space && src[0] != ' ')
                ok = rt_tok_buf_append(other, " ", 1);
            ok = ok && rt_tok_buf_append(other, src, p.len);
            break;
        default:
            ok = rt_tok_buf_append(other, src, p.len);
        }
        if (!ok || !add_piece(pieces2, start, other->len - start, p.at_start))
            return MC_ERR_NOMEM;
    }
    swap(cur, other);
    swap(pieces, pieces2);
    return MC_OK;
}

/* Cut every piece: by a regex pattern, or (pattern < 0) before each
 * occurrence of sep (Metaspace split, MergedWithNext). */
static mc_status split_step(int pattern, const uint8_t *sep, size_t sep_len,
                            const rt_tok_buf *cur, rt_tok_buf *pieces,
                            rt_tok_buf *pieces2)
{
    pieces2->len = 0;
    size_t np = NPIECES(pieces);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p = PIECES(pieces)[k];
        const uint8_t *s = cur->p + p.off;
        size_t i = 0;
        int first = p.at_start;
        if (pattern >= 0) {
            while (i < p.len) {
                size_t m = rt_tok_pattern_match(pattern, s, p.len, i);
                if (!add_piece(pieces2, p.off + i, m, first))
                    return MC_ERR_NOMEM;
                first = 0;
                i += m;
            }
        } else {
            size_t start = 0;
            for (i = 1; i + sep_len <= p.len; i++) {
                if (memcmp(s + i, sep, sep_len) == 0) {
                    if (!add_piece(pieces2, p.off + start, i - start, first))
                        return MC_ERR_NOMEM;
                    first = 0;
                    start = i;
                }
            }
            if (!add_piece(pieces2, p.off + start, p.len - start, first))
                return MC_ERR_NOMEM;
        }
    }
    swap(pieces, pieces2);
    return MC_OK;
}

mc_status rt_tok_pretokenize(const rt_tokenizer *t, const uint8_t *text,
                             size_t n, int at_start, rt_tok_buf *cur,
                             rt_tok_buf *other, rt_tok_buf *pieces,
                             rt_tok_buf *pieces2)
{
    mc_status st;
    cur->len = 0;
    pieces->len = 0;
    if (!rt_tok_buf_append(cur, text, n) || !add_piece(pieces, 0, n, at_start))
        return MC_ERR_NOMEM;
    for (size_t k = 0; k < t->n_norm; k++) {
        if (t->norm[k].kind == RT_NORM_NFC)
            continue; /* identity: inputs are assumed NFC (see header) */
        if ((st = rewrite_step(&t->norm[k], cur, other, pieces, pieces2)))
            return st;
    }
    for (size_t k = 0; k < t->n_pre; k++) {
        const rt_tok_step *s = &t->pre[k];
        if (s->kind == RT_PRE_SPLIT) {
            st = split_step(s->pattern, NULL, 0, cur, pieces, pieces2);
        } else if (s->kind == RT_PRE_METASPACE) {
            st = rewrite_step(s, cur, other, pieces, pieces2);
            if (!st && s->split)
                st = split_step(-1, s->a, s->a_len, cur, pieces, pieces2);
        } else { /* ByteLevel */
            st = MC_OK;
            if (s->add_prefix_space)
                st = rewrite_step(s, cur, other, pieces, pieces2);
            if (!st && s->use_regex)
                st = split_step(RT_PAT_GPT2, NULL, 0, cur, pieces, pieces2);
        }
        if (st)
            return st;
    }
    return MC_OK;
}

/*
 * rt_tok_norm.c - the normalizers of tokenizer.json: Prepend, Replace
 * (literal or regex), NFC / NFD / NFKC / NFKD and Lowercase (utf8proc),
 * Strip, StripAccents.  Each step reads one buffer and writes the other.
 *
 * The input may hold invalid UTF-8 (encode accepts any bytes): the Unicode
 * steps transform each run of valid characters and copy the invalid bytes
 * through unchanged.
 */
#include <string.h>
#include <utf8proc.h>

#include "mc_alloc.h"
#include "rt_tok_internal.h"
#include "rt_tok_unicode.h"

void rt_tok_work_free(rt_tok_work *w)
{
    mc_free(w->cur.p);
    mc_free(w->other.p);
    mc_free(w->pieces.p);
    mc_free(w->pieces2.p);
    mc_free(w->spans);
    rt_tok_re_scratch_free(w->re);
    memset(w, 0, sizeof *w);
}

rt_tok_re_scratch *rt_tok_work_re(rt_tok_work *w)
{
    if (!w->re)
        w->re = rt_tok_re_scratch_new();
    return w->re;
}

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

mc_status rt_tok_replace_step(const rt_tok_step *st, rt_tok_work *w,
                              const uint8_t *src, size_t n, rt_tok_buf *out,
                              int *lost_start)
{
    /* the result's size before it is built: a long replacement would
     * otherwise allocate n x its length in one step */
    const size_t limit = RT_TOK_NORM_GROWTH * n + RT_TOK_NORM_SLACK;
    if (!st->re) { /* a literal: no spans needed */
        if (st->a_len > 0 && st->b_len > st->a_len) {
            size_t hits = 0;
            for (size_t i = 0; i + st->a_len <= n;)
                if (src[i] == st->a[0] && !memcmp(src + i, st->a, st->a_len)) {
                    hits++;
                    i += st->a_len;
                } else {
                    i++;
                }
            if (hits > (limit - n) / (st->b_len - st->a_len))
                return MC_ERR_OVERFLOW;
        }
        if (lost_start && st->b_len == 0 && st->a_len > 0 && n > st->a_len &&
            memcmp(src, st->a, st->a_len) == 0)
            *lost_start = 1;
        return rt_tok_replace_into(out, src, n, st->a, st->a_len, st->b,
                                   st->b_len)
                   ? MC_OK
                   : MC_ERR_NOMEM;
    }
    rt_tok_re_scratch *sc = rt_tok_work_re(w);
    if (!sc)
        return MC_ERR_NOMEM;
    w->n_spans = 0;
    mc_status r = rt_tok_re_split(st->re, NULL, 0, 0, -1, sc, src, n,
                                  &w->spans, &w->n_spans, &w->spans_cap);
    /* text whose first characters are replaced by nothing no longer starts
     * at the original offset 0 (Hugging Face's alignments) */
    if (!r && lost_start && st->b_len == 0 && w->n_spans > 0 &&
        w->spans[0].match && w->spans[0].end > 0)
        *lost_start = 1;
    size_t size = 0;
    for (size_t i = 0; !r && i < w->n_spans && size <= limit; i++)
        size += w->spans[i].match ? st->b_len
                                  : w->spans[i].end - w->spans[i].start;
    if (!r && size > limit)
        return MC_ERR_OVERFLOW;
    for (size_t i = 0; !r && i < w->n_spans; i++) {
        const rt_tok_span *sp = &w->spans[i];
        int ok = sp->match ? rt_tok_buf_append(out, st->b, st->b_len)
                           : rt_tok_buf_append(out, src + sp->start,
                                               sp->end - sp->start);
        if (!ok)
            r = MC_ERR_NOMEM;
    }
    return r;
}

static int put_cp(rt_tok_buf *out, uint32_t cp)
{
    uint8_t u[4];
    return rt_tok_buf_append(out, u, rt_tok_utf8_put(cp, u));
}

/* One Unicode normalization form of valid UTF-8 s[0..n) appended to out.
 * The code points go through a mc_malloc'ed buffer (utf8proc's own map
 * functions would use malloc). */
static mc_status unicode_form(const uint8_t *s, size_t n, utf8proc_option_t opt,
                              rt_tok_buf *out)
{
    /* a character decomposes to at most 18 code points (Unicode's own
     * bound); start with one per byte and grow once if utf8proc asks */
    size_t cap = n + 16;
    utf8proc_int32_t *cps = NULL;
    for (int tries = 0; tries < 2; tries++) {
        mc_free(cps);
        if (cap > SIZE_MAX / sizeof *cps || !(cps = mc_malloc(cap * sizeof *cps)))
            return MC_ERR_NOMEM;
        utf8proc_ssize_t m = utf8proc_decompose_custom(
            s, (utf8proc_ssize_t)n, cps, (utf8proc_ssize_t)cap, opt, NULL,
            NULL);
        if (m < 0) {
            mc_free(cps);
            return m == UTF8PROC_ERROR_NOMEM ? MC_ERR_NOMEM : MC_ERR_INVALID_ARG;
        }
        if ((size_t)m <= cap) {
            if (opt & UTF8PROC_COMPOSE)
                m = utf8proc_normalize_utf32(cps, m, opt);
            int ok = rt_tok_buf_reserve(out, (size_t)m * 4);
            for (utf8proc_ssize_t k = 0; ok && k < m; k++)
                ok = put_cp(out, (uint32_t)cps[k]);
            mc_free(cps);
            return ok ? MC_OK : MC_ERR_NOMEM;
        }
        cap = (size_t)m;
    }
    mc_free(cps);
    return MC_ERR_NOMEM;
}

/* Rust's char::to_lowercase: the simple mapping, except U+0130 (the only
 * unconditional multi-character lowercase in SpecialCasing). */
static int put_lower(rt_tok_buf *out, uint32_t cp)
{
    if (cp == 0x130)
        return put_cp(out, 'i') && put_cp(out, 0x307);
    return put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

static int is_mark(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC ||
           c == UTF8PROC_CATEGORY_ME;
}

/* Per-character steps (Lowercase, StripAccents) over s[0..n). */
static int per_char(int kind, const uint8_t *s, size_t n, rt_tok_buf *out,
                    int *lost_start)
{
    size_t start = out->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = rt_tok_utf8_next(s + i, n - i, &cp);
        int ok;
        if (cp == RT_TOK_BAD_CP)
            ok = rt_tok_buf_append(out, s + i, l);
        else if (kind == RT_NORM_LOWER)
            ok = put_lower(out, cp);
        else
            ok = is_mark(cp) || rt_tok_buf_append(out, s + i, l);
        if (!ok)
            return 0;
        i += l;
        if (out->len == start && i > 0 && i < n)
            *lost_start = 1; /* a leading mark was stripped */
    }
    return 1;
}

/* Strip White_Space from the chosen sides of s[0..n). */
static int strip(const rt_tok_step *st, const uint8_t *s, size_t n,
                 rt_tok_buf *out, int *lost_start)
{
    size_t b = 0, e = n;
    while (st->start && b < n) {
        uint32_t cp;
        size_t l = rt_tok_utf8_next(s + b, n - b, &cp);
        if (!rt_tok_is_space(cp))
            break;
        b += l;
    }
    /* the end: find the last non-space character going forwards (UTF-8
     * cannot be decoded backwards without care, and this is short) */
    if (st->stop) {
        size_t i = b, last = b;
        while (i < n) {
            uint32_t cp;
            size_t l = rt_tok_utf8_next(s + i, n - i, &cp);
            i += l;
            if (!rt_tok_is_space(cp))
                last = i;
        }
        e = last;
    }
    if (b > 0)
        *lost_start = 1;
    return rt_tok_buf_append(out, s + b, e - b);
}

/* An ASCII byte followed by ASCII (or the end) is left alone by every
 * normalization form: no combining mark is ASCII, and nothing composes
 * with a following ASCII character. */
static int ascii_fixed(const uint8_t *s, size_t n, size_t i)
{
    return s[i] < 0x80 && (i + 1 == n || s[i + 1] < 0x80);
}

/* A normalization form of valid UTF-8 s[0..n): ASCII stretches are copied,
 * the rest goes through utf8proc (most text is mostly ASCII). */
static mc_status unicode_run(const uint8_t *s, size_t n, utf8proc_option_t opt,
                             rt_tok_buf *out)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && ascii_fixed(s, n, j))
            j++;
        if (j > i && !rt_tok_buf_append(out, s + i, j - i))
            return MC_ERR_NOMEM;
        i = j;
        while (j < n && !ascii_fixed(s, n, j))
            j++;
        if (j > i) {
            mc_status r = unicode_form(s + i, j - i, opt, out);
            if (r)
                return r;
        }
        i = j;
    }
    return MC_OK;
}

static mc_status unicode_step(int kind, const uint8_t *s, size_t n,
                              rt_tok_buf *out)
{
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (kind) {
    case RT_NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case RT_NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case RT_NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    for (size_t i = 0; i < n;) {
        size_t run = rt_tok_utf8_valid_len(s + i, n - i);
        if (run) {
            mc_status r = unicode_run(s + i, run, opt, out);
            if (r)
                return r;
            i += run;
        } else {
            if (!rt_tok_buf_append(out, s + i, 1))
                return MC_ERR_NOMEM;
            i++;
        }
    }
    return MC_OK;
}

mc_status rt_tok_normalize(const rt_tokenizer *t, const uint8_t *src, size_t n,
                           rt_tok_buf *out, rt_tok_buf *tmp, rt_tok_work *w,
                           int *lost_start)
{
    out->len = 0;
    if (!rt_tok_buf_append(out, src, n))
        return MC_ERR_NOMEM;
    for (size_t k = 0; k < t->n_norm; k++) {
        const rt_tok_step *st = &t->norm[k];
        mc_status r = MC_OK;
        tmp->len = 0;
        const uint8_t *s = out->p ? out->p : (const uint8_t *)"";
        size_t len = out->len;
        switch (st->kind) {
        case RT_NORM_PREPEND:
            /* Hugging Face prepends only to non-empty text */
            if (len && (!rt_tok_buf_append(tmp, st->a, st->a_len) ||
                        !rt_tok_buf_append(tmp, s, len)))
                r = MC_ERR_NOMEM;
            break;
        case RT_NORM_REPLACE:
            r = rt_tok_replace_step(st, w, s, len, tmp, lost_start);
            break;
        case RT_NORM_LOWER:
        case RT_NORM_STRIP_ACCENTS:
            if (!per_char(st->kind, s, len, tmp, lost_start))
                r = MC_ERR_NOMEM;
            break;
        case RT_NORM_STRIP:
            if (!strip(st, s, len, tmp, lost_start))
                r = MC_ERR_NOMEM;
            break;
        default:
            r = unicode_step(st->kind, s, len, tmp);
        }
        if (r)
            return r;
        /* A tokenizer.json is untrusted: chained Replace steps ("a" ->
         * "aa", 40 times) would grow the text exponentially.  Real
         * normalizers stay far below this (NFKC's worst character is 18
         * code points). */
        if (tmp->len > RT_TOK_NORM_GROWTH * n + RT_TOK_NORM_SLACK)
            return MC_ERR_OVERFLOW;
        rt_tok_buf x = *out;
        *out = *tmp;
        *tmp = x;
    }
    return MC_OK;
}

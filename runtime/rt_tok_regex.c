/*
 * rt_tok_regex.c - PCRE2 behind the tokenizer's patterns: translating
 * Oniguruma-flavoured regexes, walking matches as Rust's find_iter does,
 * and the five Split behaviours of Hugging Face `tokenizers`
 * (tokenizers/src/tokenizer/normalizer.rs, NormalizedString::split).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_tok_internal.h"
#include "rt_tok_regex.h"
#include "rt_tok_unicode.h"

struct rt_tok_re {
    pcre2_code *code;
};

struct rt_tok_re_scratch {
    pcre2_general_context *gctx;
    pcre2_match_data *md;
};

static void *re_alloc(PCRE2_SIZE n, void *data)
{
    (void)data;
    return mc_malloc(n);
}

static void re_free(void *p, void *data)
{
    (void)data;
    mc_free(p);
}

/* Oniguruma's Unicode \w: Letter | Mark | Number | Connector_Punctuation. */
#define ONIG_WORD "\\p{L}\\p{M}\\p{N}\\p{Pc}"

/* Append text to the translation; 0 when out of memory. */
static int put(rt_tok_buf *o, const char *s, size_t n)
{
    return rt_tok_buf_append(o, s, n);
}

/* Translate an Oniguruma (Ruby syntax) pattern to PCRE2.  Returns MC_OK,
 * MC_ERR_NOMEM, or MC_ERR_UNSUPPORTED with why filled. */
static mc_status translate(const char *p, size_t n, rt_tok_buf *o, char *why,
                           size_t why_cap)
{
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        int ok = 1;
        if (c == '\\' && i + 1 < n) {
            char e = p[++i];
            switch (e) {
            case 's':
                ok = put(o, "\\p{White_Space}", 15);
                break;
            case 'S':
                ok = put(o, "\\P{White_Space}", 15);
                break;
            case 'w':
                ok = in_class ? put(o, ONIG_WORD, sizeof ONIG_WORD - 1)
                              : put(o, "[" ONIG_WORD "]", sizeof ONIG_WORD + 1);
                break;
            case 'W':
                if (in_class) {
                    snprintf(why, why_cap, "\\W inside a character class "
                             "(at byte %zu)", i - 1);
                    return MC_ERR_UNSUPPORTED;
                }
                ok = put(o, "[^" ONIG_WORD "]", sizeof ONIG_WORD + 2);
                break;
            case 'b': case 'B': case 'h': case 'H':
                if (!in_class || e != 'b') {
                    snprintf(why, why_cap,
                             "\\%c (at byte %zu): Oniguruma and PCRE2 mean "
                             "different things by it", e, i - 1);
                    return MC_ERR_UNSUPPORTED;
                }
                ok = put(o, "\\b", 2);
                break;
            default:
                ok = put(o, p + i - 1, 2);
            }
        } else if (c == '[') {
            if (in_class && i + 1 < n && p[i + 1] == ':') {
                const char *end = NULL;
                for (size_t k = i + 2; k + 1 < n && !end; k++)
                    if (p[k] == ':' && p[k + 1] == ']')
                        end = p + k + 2;
                if (!end) {
                    snprintf(why, why_cap, "unterminated [: at byte %zu", i);
                    return MC_ERR_UNSUPPORTED;
                }
                ok = put(o, p + i, (size_t)(end - (p + i)));
                i = (size_t)(end - p) - 1;
            } else if (in_class) {
                snprintf(why, why_cap, "a nested character class (at byte "
                         "%zu)", i);
                return MC_ERR_UNSUPPORTED;
            } else {
                in_class = 1;
                ok = put(o, "[", 1);
                /* a ']' or '^]' right after '[' is a literal */
                if (i + 1 < n && p[i + 1] == '^') {
                    ok = ok && put(o, "^", 1);
                    i++;
                }
                if (i + 1 < n && p[i + 1] == ']') {
                    ok = ok && put(o, "\\]", 2);
                    i++;
                }
            }
        } else if (c == ']' && in_class) {
            in_class = 0;
            ok = put(o, "]", 1);
        } else if (c == '&' && in_class && i + 1 < n && p[i + 1] == '&') {
            snprintf(why, why_cap, "class intersection && (at byte %zu)", i);
            return MC_ERR_UNSUPPORTED;
        } else if (c == '(' && !in_class && i + 2 < n && p[i + 1] == '?') {
            /* inline options (?imx-imx) or (?imx-imx: */
            size_t k = i + 2;
            while (k < n && (p[k] == 'i' || p[k] == 'm' || p[k] == 'x' ||
                             p[k] == '-'))
                k++;
            if (k > i + 2 && k < n && (p[k] == ')' || p[k] == ':') &&
                memchr(p + i + 2, 'm', k - i - 2)) {
                snprintf(why, why_cap, "the (?m) option (at byte %zu): "
                         "dot-all in Oniguruma, multi-line in PCRE2", i);
                return MC_ERR_UNSUPPORTED;
            }
            ok = put(o, "(", 1);
        } else {
            ok = put(o, &c, 1);
        }
        if (!ok)
            return MC_ERR_NOMEM;
    }
    return MC_OK;
}

mc_status rt_tok_re_compile(const char *pat, size_t len, int flavour,
                            rt_tok_re **out, char *why, size_t why_cap)
{
    *out = NULL;
    if (why_cap)
        why[0] = '\0';
    rt_tok_buf t = {0};
    mc_status r = MC_OK;
    if (flavour == RT_RE_ONIG)
        r = translate(pat, len, &t, why, why_cap);
    else if (!put(&t, pat, len))
        r = MC_ERR_NOMEM;
    if (r) {
        mc_free(t.p);
        return r;
    }
    pcre2_general_context *g = pcre2_general_context_create(re_alloc,
                                                             re_free, NULL);
    pcre2_compile_context *cc = g ? pcre2_compile_context_create(g) : NULL;
    rt_tok_re *re = mc_calloc(1, sizeof *re);
    if (!g || !cc || !re) {
        r = MC_ERR_NOMEM;
        goto done;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    int ec;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP;
    if (flavour == RT_RE_ONIG)
        opts |= PCRE2_MULTILINE; /* Ruby's ^ and $ are line anchors */
    re->code = pcre2_compile((PCRE2_SPTR)(t.p ? t.p : (uint8_t *)""), t.len,
                             opts, &ec, &eoff, cc);
    /* JIT where the platform allows it (matching is 3-10x faster); when
     * it does not, pcre2_match interprets */
    if (re->code)
        (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    if (!re->code) {
        if (ec == PCRE2_ERROR_HEAPLIMIT || ec == PCRE2_ERROR_NOMEMORY ||
            mc_alloc_failure_injected()) {
            r = MC_ERR_NOMEM;
        } else {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            snprintf(why, why_cap, "PCRE2 cannot compile it: %s (at byte "
                     "%zu of the translated pattern)", (char *)msg,
                     (size_t)eoff);
            r = MC_ERR_UNSUPPORTED;
        }
    }
done:
    pcre2_compile_context_free(cc);
    pcre2_general_context_free(g);
    mc_free(t.p);
    if (r) {
        rt_tok_re_free(re);
        return r;
    }
    *out = re;
    return MC_OK;
}

void rt_tok_re_free(rt_tok_re *re)
{
    if (!re)
        return;
    pcre2_code_free(re->code);
    mc_free(re);
}

rt_tok_re_scratch *rt_tok_re_scratch_new(void)
{
    rt_tok_re_scratch *sc = mc_calloc(1, sizeof *sc);
    if (!sc)
        return NULL;
    sc->gctx = pcre2_general_context_create(re_alloc, re_free, NULL);
    /* one pair: only where the whole match lies is needed */
    sc->md = sc->gctx ? pcre2_match_data_create(1, sc->gctx) : NULL;
    if (!sc->md) {
        rt_tok_re_scratch_free(sc);
        return NULL;
    }
    return sc;
}

void rt_tok_re_scratch_free(rt_tok_re_scratch *sc)
{
    if (!sc)
        return;
    pcre2_match_data_free(sc->md);
    pcre2_general_context_free(sc->gctx);
    mc_free(sc);
}

static int push(rt_tok_span **out, size_t *n, size_t *cap, size_t a,
                size_t b, int m)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        rt_tok_span *p = mc_realloc(*out, nc * sizeof *p);
        if (!p)
            return 0;
        *out = p;
        *cap = nc;
    }
    (*out)[(*n)++] = (rt_tok_span){a, b, m};
    return 1;
}

/* Next match at or after s[from] inside the valid fragment [fs, fe):
 * 1 and [*ms, *me), 0 for none, or a negative PCRE2 error. */
static int next_match(const rt_tok_re *re, rt_tok_re_scratch *sc,
                      const uint8_t *s, size_t fs, size_t fe, size_t from,
                      size_t *ms, size_t *me)
{
    /* the fragment is valid UTF-8: without PCRE2_NO_UTF_CHECK, PCRE2 would
     * check the whole rest of the subject on every call (quadratic) */
    int rc = pcre2_match(re->code, (PCRE2_SPTR)(s + fs), fe - fs, from - fs,
                         PCRE2_NO_UTF_CHECK, sc->md, NULL);
    /* JIT code runs on a small fixed stack; the interpreter on the heap */
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re->code, (PCRE2_SPTR)(s + fs), fe - fs, from - fs,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, sc->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return rc;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    *ms = fs + ov[0];
    *me = fs + ov[1];
    return 1;
}

/* Matches and gaps of s[0..n), appended to out from index *n_out.  A regex
 * is matched within each run of valid UTF-8 (an invalid byte matches
 * nothing and ends the run, as if the text ended there); a literal
 * anywhere. */
static mc_status find_all(const rt_tok_re *re, const uint8_t *lit,
                          size_t lit_len, rt_tok_re_scratch *sc,
                          const uint8_t *s, size_t n, rt_tok_span **out,
                          size_t *n_out, size_t *cap)
{
    size_t prev = 0, last_match_end = 0, fs = 0;
    int have_last = 0;
    while (fs < n) {
        size_t fe = re ? fs + rt_tok_utf8_valid_len(s + fs, n - fs) : n;
        size_t last_end = fs;
        while (fe > fs && last_end <= fe) {
            size_t ms, me;
            if (re) {
                int rc = next_match(re, sc, s, fs, fe, last_end, &ms, &me);
                if (rc == 0)
                    break;
                if (rc < 0)
                    return rc == PCRE2_ERROR_NOMEMORY ? MC_ERR_NOMEM
                                                      : MC_ERR_INVALID_ARG;
            } else {
                if (lit_len == 0 || lit_len > n - last_end)
                    break;
                const uint8_t *f =
                    memmem(s + last_end, n - last_end, lit, lit_len);
                if (!f)
                    break;
                ms = (size_t)(f - s);
                me = ms + lit_len;
            }
            /* an empty match right after the previous one is skipped */
            if (ms == me && have_last && last_end == last_match_end) {
                uint32_t cp;
                last_end += last_end < fe ? rt_tok_utf8_next(s + last_end,
                                                             fe - last_end, &cp)
                                          : 1;
                continue;
            }
            last_end = last_match_end = me;
            have_last = 1;
            if (prev != ms && !push(out, n_out, cap, prev, ms, 0))
                return MC_ERR_NOMEM;
            if (!push(out, n_out, cap, ms, me, 1))
                return MC_ERR_NOMEM;
            prev = me;
        }
        fs = fe + 1; /* past the invalid byte (or the end) */
    }
    if (prev != n && !push(out, n_out, cap, prev, n, 0))
        return MC_ERR_NOMEM;
    return MC_OK;
}

mc_status rt_tok_re_split(const rt_tok_re *re, const uint8_t *lit,
                          size_t lit_len, int invert, int behaviour,
                          rt_tok_re_scratch *sc, const uint8_t *s, size_t n,
                          rt_tok_span **out, size_t *n_out, size_t *cap)
{
    size_t base = *n_out;
    mc_status r = find_all(re, lit, lit_len, sc, s, n, out, n_out, cap);
    if (r)
        return r;
    rt_tok_span *v = *out + base;
    size_t m = *n_out - base, k = 0;
    if (invert)
        for (size_t i = 0; i < m; i++)
            v[i].match = !v[i].match;
    /* each behaviour folds the spans in place (k <= i always) */
    int prev_match = 0;
    switch (behaviour) {
    case RT_SPLIT_REMOVED:
        for (size_t i = 0; i < m; i++)
            if (!v[i].match)
                v[k++] = v[i];
        break;
    case RT_SPLIT_ISOLATED:
        k = m;
        break;
    case RT_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < m; i++) {
            if (v[i].match && !prev_match && k > 0)
                v[k - 1].end = v[i].end;
            else
                v[k++] = v[i];
            prev_match = v[i].match;
        }
        break;
    case RT_SPLIT_MERGED_NEXT:
        /* walk backwards: a match joins the span after it */
        k = m;
        for (size_t i = m; i-- > 0;) {
            if (v[i].match && !prev_match && k < m)
                v[k].start = v[i].start;
            else
                v[--k] = v[i];
            prev_match = v[i].match;
        }
        memmove(v, v + k, (m - k) * sizeof *v);
        k = m - k;
        break;
    case RT_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < m; i++) {
            if (v[i].match == prev_match && k > 0)
                v[k - 1].end = v[i].end;
            else
                v[k++] = v[i];
            prev_match = v[i].match;
        }
        break;
    default: /* raw: every span, empty matches included (Replace) */
        return MC_OK;
    }
    /* drop empty spans */
    size_t j = 0;
    for (size_t i = 0; i < k; i++)
        if (v[i].end > v[i].start)
            v[j++] = v[i];
    *n_out = base + j;
    return MC_OK;
}

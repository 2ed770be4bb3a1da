/*
 * rt_tok_json_steps.c - the normalizer, pre-tokenizer, decoder and
 * post-processor sections of tokenizer.json, each a type-checked object or
 * a Sequence of them (nested at most RT_TOKJ_MAX_DEPTH deep).
 */
#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_tok_json.h"
#include "rt_tok_regex.h"
#include "rt_tok_unicode.h"

static mc_status get_type(rt_tokj_ctx *c, json_t *obj, const char *path,
                          const char **type)
{
    size_t len;
    if (!json_is_object(obj))
        return rt_tokj_bad(c, path, "expected an object%s", "");
    return rt_tokj_get_str(c, obj, "type", path, type, &len, NULL);
}

static mc_status add_step(rt_tokj_ctx *c, rt_tok_step **steps, size_t *n,
                          const char *path, rt_tok_step **out)
{
    if (*n >= RT_TOKJ_MAX_STEPS)
        return rt_tokj_unsupported(c, path, "more than 64 pipeline steps");
    rt_tok_step *s = mc_realloc(*steps, (*n + 1) * sizeof **steps);
    if (!s)
        return rt_tokj_nomem(c, path);
    *steps = s;
    memset(&s[*n], 0, sizeof s[*n]);
    *out = &s[(*n)++];
    return MC_OK;
}

/* {"String": "x"} pattern of Replace / Split; regex_out gets a Regex. */
static mc_status get_pattern(rt_tokj_ctx *c, json_t *obj, const char *path,
                             const char **s, size_t *len, int *is_regex)
{
    char field[256];
    snprintf(field, sizeof field, "%s.pattern", path);
    json_t *p = json_object_get(obj, "pattern");
    if (!json_is_object(p))
        return rt_tokj_bad(
            c, field, "expected {\"String\": ...} or {\"Regex\": ...}%s", "");
    json_t *v = json_object_get(p, "String");
    *is_regex = 0;
    if (!v) {
        v = json_object_get(p, "Regex");
        *is_regex = 1;
    }
    if (!json_is_string(v))
        return rt_tokj_bad(
            c, field, "expected {\"String\": ...} or {\"Regex\": ...}%s", "");
    *s = json_string_value(v);
    *len = json_string_length(v);
    return MC_OK;
}

/* Compile pattern text for a step; a refusal names the step and why. */
static mc_status compile_re(rt_tokj_ctx *c, const char *path, const char *s,
                            size_t len, int flavour, rt_tok_re **out)
{
    char why[240], what[400];
    mc_status r = rt_tok_re_compile(s, len, flavour, out, why, sizeof why);
    if (r == MC_ERR_NOMEM)
        return rt_tokj_nomem(c, path);
    if (r) {
        snprintf(what, sizeof what, "regex \"%.100s\": %s", s, why);
        return rt_tokj_unsupported(c, path, what);
    }
    return MC_OK;
}

/* The pattern of a Replace (normalizer or decoder): a literal in st->a, or
 * a compiled regex in st->re; the content in st->b. */
static mc_status get_replace(rt_tokj_ctx *c, json_t *obj, const char *path,
                             rt_tok_step *st)
{
    const char *s;
    size_t len;
    int is_regex;
    mc_status r;
    if ((r = get_pattern(c, obj, path, &s, &len, &is_regex)))
        return r;
    if (is_regex) {
        if ((r = compile_re(c, path, s, len, RT_RE_ONIG, &st->re)))
            return r;
    } else {
        if (!(st->a = rt_tokj_dup_bytes(s, len)))
            return rt_tokj_nomem(c, path);
        st->a_len = len;
    }
    if ((r = rt_tokj_get_str(c, obj, "content", path, &s, &len, NULL)))
        return r;
    if (!(st->b = rt_tokj_dup_bytes(s, len)))
        return rt_tokj_nomem(c, path);
    st->b_len = len;
    return MC_OK;
}

/* A cutting pre-tokenizer step: regex re_text (flavour) or, when re_text is
 * NULL, the literal lit[0..lit_len). */
static mc_status add_split(rt_tokj_ctx *c, const char *path,
                           const char *re_text, size_t re_len, int flavour,
                           const char *lit, size_t lit_len, int invert,
                           int behaviour)
{
    rt_tok_step *st = NULL; /* set by add_step (gcc -O3 cannot tell) */
    mc_status r;
    if ((r = add_step(c, &c->t->pre, &c->t->n_pre, path, &st)))
        return r;
    st->kind = RT_PRE_SPLIT;
    st->invert = invert;
    st->behaviour = behaviour;
    if (re_text)
        return compile_re(c, path, re_text, re_len, flavour, &st->re);
    if (!(st->a = rt_tokj_dup_bytes(lit, lit_len)))
        return rt_tokj_nomem(c, path);
    st->a_len = lit_len;
    return MC_OK;
}

/* "behavior" of Split / Punctuation (def when absent). */
static mc_status get_behaviour(rt_tokj_ctx *c, json_t *obj, const char *path,
                               int def, int *out)
{
    static const char *const names[] = {"Removed", "Isolated",
                                        "MergedWithPrevious", "MergedWithNext",
                                        "Contiguous"};
    const char *s;
    size_t len;
    int present;
    char field[256];
    mc_status r = rt_tokj_get_str(c, obj, "behavior", path, &s, &len, &present);
    if (r)
        return r;
    *out = def;
    if (!present)
        return MC_OK;
    for (int k = 0; k < 5; k++)
        if (!strcmp(s, names[k])) {
            *out = k; /* names[] is in RT_SPLIT_* order */
            return MC_OK;
        }
    snprintf(field, sizeof field, "%s.behavior", path);
    return rt_tokj_bad(c, field,
                       "expected Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext or Contiguous, not \"%.60s\"", s);
}

/* Patterns of the pre-tokenizers that `tokenizers` defines by character
 * predicates or by its own regexes (PCRE2 syntax; Rust's meanings). */
static const char RE_WHITESPACE[] = "[" RT_TOK_RE_RUST_WORD "]+|[^"
    RT_TOK_RE_RUST_WORD "\\p{White_Space}]+";
static const char RE_SPACE[] = "\\p{White_Space}";   /* char::is_whitespace */
static const char RE_DIGIT[] = "\\p{N}";             /* char::is_numeric */
/* is_ascii_punctuation() || is_punctuation() (general category P) */
static const char RE_PUNCT[] = "[\\p{P}!-/:-@\\[-`{-~]";
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";

/* Metaspace replacement + prepend scheme (shared by pre-tokenizer and
 * decoder). */
static mc_status get_metaspace(rt_tokj_ctx *c, json_t *obj, const char *path,
                               rt_tok_step *st)
{
    const char *s;
    size_t len;
    int present;
    mc_status r;
    char field[256];
    if ((r = rt_tokj_get_str(c, obj, "replacement", path, &s, &len, NULL)))
        return r;
    uint32_t cp;
    snprintf(field, sizeof field, "%s.replacement", path);
    if (len == 0 || rt_tok_utf8_next((const uint8_t *)s, len, &cp) != len ||
        cp == RT_TOK_BAD_CP)
        return rt_tokj_bad(c, field, "expected exactly one character%s", "");
    if (!(st->a = rt_tokj_dup_bytes(s, len)))
        return rt_tokj_nomem(c, path);
    st->a_len = len;
    if ((r = rt_tokj_get_str(c, obj, "prepend_scheme", path, &s, &len,
                             &present)))
        return r;
    if (present) {
        snprintf(field, sizeof field, "%s.prepend_scheme", path);
        if (len == 5 && !memcmp(s, "first", 5))
            st->prepend = RT_PREPEND_FIRST;
        else if (len == 6 && !memcmp(s, "always", 6))
            st->prepend = RT_PREPEND_ALWAYS;
        else if (len == 5 && !memcmp(s, "never", 5))
            st->prepend = RT_PREPEND_NEVER;
        else
            return rt_tokj_bad(
                c, field, "expected \"first\", \"always\" or \"never\"%s", "");
    } else {
        int aps;
        if ((r = rt_tokj_get_bool(c, obj, "add_prefix_space", path, 1, &aps)))
            return r;
        st->prepend = aps ? RT_PREPEND_ALWAYS : RT_PREPEND_NEVER;
    }
    return rt_tokj_get_bool(c, obj, "split", path, 1, &st->split);
}

mc_status rt_tokj_parse_normalizer(rt_tokj_ctx *c, json_t *obj,
                                   const char *path, int depth)
{
    const char *type, *s;
    size_t len;
    mc_status r;
    rt_tok_step *st = NULL; /* set by add_step (gcc -O3 cannot tell) */
    rt_tokenizer *t = c->t;
    if (depth > RT_TOKJ_MAX_DEPTH)
        return rt_tokj_unsupported(c, path, "normalizers nested too deeply");
    if ((r = get_type(c, obj, path, &type)))
        return r;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(obj, "normalizers");
        char field[256];
        snprintf(field, sizeof field, "%s.normalizers", path);
        if (!json_is_array(arr))
            return rt_tokj_bad(c, field, "expected an array%s", "");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(field, sizeof field, "%s.normalizers[%zu]", path, i);
            if ((r = rt_tokj_parse_normalizer(c, json_array_get(arr, i), field,
                                              depth + 1)))
                return r;
        }
        return MC_OK;
    }
    if (!strcmp(type, "Prepend")) {
        if ((r = rt_tokj_get_str(c, obj, "prepend", path, &s, &len, NULL)))
            return r;
        if ((r = add_step(c, &t->norm, &t->n_norm, path, &st)))
            return r;
        st->kind = RT_NORM_PREPEND;
        if (!(st->a = rt_tokj_dup_bytes(s, len)))
            return rt_tokj_nomem(c, path);
        st->a_len = len;
        return MC_OK;
    }
    if (!strcmp(type, "Replace")) {
        if ((r = add_step(c, &t->norm, &t->n_norm, path, &st)))
            return r;
        st->kind = RT_NORM_REPLACE;
        return get_replace(c, obj, path, st);
    }
    static const struct {
        const char *name;
        int kind;
    } plain[] = {{"NFC", RT_NORM_NFC},
                 {"NFD", RT_NORM_NFD},
                 {"NFKC", RT_NORM_NFKC},
                 {"NFKD", RT_NORM_NFKD},
                 {"Lowercase", RT_NORM_LOWER},
                 {"StripAccents", RT_NORM_STRIP_ACCENTS},
                 {"Strip", RT_NORM_STRIP}};
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
        if (strcmp(type, plain[k].name) != 0)
            continue;
        if ((r = add_step(c, &t->norm, &t->n_norm, path, &st)))
            return r;
        st->kind = plain[k].kind;
        if (st->kind != RT_NORM_STRIP)
            return MC_OK;
        int left, right;
        if ((r = rt_tokj_get_bool(c, obj, "strip_left", path, 1, &left)) ||
            (r = rt_tokj_get_bool(c, obj, "strip_right", path, 1, &right)))
            return r;
        st->start = (size_t)left;
        st->stop = (size_t)right;
        return MC_OK;
    }
    char what[160];
    snprintf(what, sizeof what, "normalizer type \"%.100s\"", type);
    return rt_tokj_unsupported(c, path, what);
}

mc_status rt_tokj_parse_pretok(rt_tokj_ctx *c, json_t *obj, const char *path,
                               int depth)
{
    const char *type, *s;
    size_t len;
    mc_status r;
    rt_tok_step *st = NULL; /* set by add_step (gcc -O3 cannot tell) */
    rt_tokenizer *t = c->t;
    char field[256];
    if (depth > RT_TOKJ_MAX_DEPTH)
        return rt_tokj_unsupported(c, path, "pre-tokenizers nested too deeply");
    if ((r = get_type(c, obj, path, &type)))
        return r;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(obj, "pretokenizers");
        snprintf(field, sizeof field, "%s.pretokenizers", path);
        if (!json_is_array(arr))
            return rt_tokj_bad(c, field, "expected an array%s", "");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(field, sizeof field, "%s.pretokenizers[%zu]", path, i);
            if ((r = rt_tokj_parse_pretok(c, json_array_get(arr, i), field,
                                          depth + 1)))
                return r;
        }
        return MC_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        if ((r = add_step(c, &t->pre, &t->n_pre, path, &st)))
            return r;
        st->kind = RT_PRE_METASPACE;
        return get_metaspace(c, obj, path, st);
    }
    if (!strcmp(type, "ByteLevel")) {
        if ((r = add_step(c, &t->pre, &t->n_pre, path, &st)))
            return r;
        st->kind = RT_PRE_BYTELEVEL;
        t->byte_level = 1;
        if ((r = rt_tokj_get_bool(c, obj, "add_prefix_space", path, 0,
                                  &st->add_prefix_space)) ||
            (r = rt_tokj_get_bool(c, obj, "use_regex", path, 1,
                                  &st->use_regex)))
            return r;
        if (!st->use_regex)
            return MC_OK;
        return compile_re(c, path, RE_GPT2, sizeof RE_GPT2 - 1, RT_RE_ONIG,
                          &st->re);
    }
    int beh, flag;
    if (!strcmp(type, "Split")) {
        int is_regex;
        if ((r = get_pattern(c, obj, path, &s, &len, &is_regex)) ||
            (r = get_behaviour(c, obj, path, -1, &beh)) ||
            (r = rt_tokj_get_bool(c, obj, "invert", path, 0, &flag)))
            return r;
        if (beh < 0) {
            snprintf(field, sizeof field, "%s.behavior", path);
            return mc_fail(c->err, MC_ERR_FORMAT, c->file, field, -1,
                           "missing (expected a string)");
        }
        if (is_regex)
            return add_split(c, path, s, len, RT_RE_ONIG, NULL, 0, flag, beh);
        return add_split(c, path, NULL, 0, 0, s, len, flag, beh);
    }
    if (!strcmp(type, "Digits")) {
        if ((r = rt_tokj_get_bool(c, obj, "individual_digits", path, 0, &flag)))
            return r;
        return add_split(c, path, RE_DIGIT, sizeof RE_DIGIT - 1, RT_RE_PCRE,
                         NULL, 0, 0,
                         flag ? RT_SPLIT_ISOLATED : RT_SPLIT_CONTIGUOUS);
    }
    if (!strcmp(type, "Whitespace"))
        return add_split(c, path, RE_WHITESPACE, sizeof RE_WHITESPACE - 1,
                         RT_RE_PCRE, NULL, 0, 1, RT_SPLIT_REMOVED);
    if (!strcmp(type, "WhitespaceSplit") || !strcmp(type, "BertPreTokenizer")) {
        if ((r = add_split(c, path, RE_SPACE, sizeof RE_SPACE - 1, RT_RE_PCRE,
                           NULL, 0, 0, RT_SPLIT_REMOVED)))
            return r;
        if (type[0] == 'W')
            return MC_OK;
        return add_split(c, path, RE_PUNCT, sizeof RE_PUNCT - 1, RT_RE_PCRE,
                         NULL, 0, 0, RT_SPLIT_ISOLATED);
    }
    if (!strcmp(type, "Punctuation")) {
        if ((r = get_behaviour(c, obj, path, RT_SPLIT_ISOLATED, &beh)))
            return r;
        return add_split(c, path, RE_PUNCT, sizeof RE_PUNCT - 1, RT_RE_PCRE,
                         NULL, 0, 0, beh);
    }
    if (!strcmp(type, "CharDelimiterSplit")) {
        uint32_t cp;
        if ((r = rt_tokj_get_str(c, obj, "delimiter", path, &s, &len, NULL)))
            return r;
        snprintf(field, sizeof field, "%s.delimiter", path);
        if (len == 0 || rt_tok_utf8_next((const uint8_t *)s, len, &cp) != len ||
            cp == RT_TOK_BAD_CP)
            return rt_tokj_bad(c, field, "expected exactly one character%s",
                               "");
        return add_split(c, path, NULL, 0, 0, s, len, 0, RT_SPLIT_REMOVED);
    }
    char what[160];
    snprintf(what, sizeof what, "pre-tokenizer type \"%.100s\"", type);
    return rt_tokj_unsupported(c, path, what);
}

mc_status rt_tokj_parse_decoder(rt_tokj_ctx *c, json_t *obj, const char *path,
                                int depth)
{
    const char *type, *s;
    size_t len;
    mc_status r;
    rt_tok_step *st = NULL; /* set by add_step (gcc -O3 cannot tell) */
    rt_tokenizer *t = c->t;
    char field[256];
    if (depth > RT_TOKJ_MAX_DEPTH)
        return rt_tokj_unsupported(c, path, "decoders nested too deeply");
    if ((r = get_type(c, obj, path, &type)))
        return r;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(obj, "decoders");
        snprintf(field, sizeof field, "%s.decoders", path);
        if (!json_is_array(arr))
            return rt_tokj_bad(c, field, "expected an array%s", "");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(field, sizeof field, "%s.decoders[%zu]", path, i);
            if ((r = rt_tokj_parse_decoder(c, json_array_get(arr, i), field,
                                           depth + 1)))
                return r;
        }
        return MC_OK;
    }
    if ((r = add_step(c, &t->dec, &t->n_dec, path, &st)))
        return r;
    if (!strcmp(type, "ByteLevel")) {
        st->kind = RT_DEC_BYTELEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        st->kind = RT_DEC_METASPACE;
        return get_metaspace(c, obj, path, st);
    } else if (!strcmp(type, "ByteFallback")) {
        st->kind = RT_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        st->kind = RT_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        st->kind = RT_DEC_REPLACE;
        return get_replace(c, obj, path, st);
    } else if (!strcmp(type, "Strip")) {
        st->kind = RT_DEC_STRIP;
        if ((r = rt_tokj_get_str(c, obj, "content", path, &s, &len, NULL)))
            return r;
        uint32_t cp;
        snprintf(field, sizeof field, "%s.content", path);
        if (len == 0 || rt_tok_utf8_next((const uint8_t *)s, len, &cp) != len)
            return rt_tokj_bad(c, field, "expected exactly one character%s",
                               "");
        if (!(st->a = rt_tokj_dup_bytes(s, len)))
            return rt_tokj_nomem(c, path);
        st->a_len = len;
        const char *keys[2] = {"start", "stop"};
        size_t *dst[2] = {&st->start, &st->stop};
        for (int k = 0; k < 2; k++) {
            json_t *v = json_object_get(obj, keys[k]);
            snprintf(field, sizeof field, "%s.%s", path, keys[k]);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > 1000000)
                return rt_tokj_bad(c, field,
                                   "expected an integer in [0, 1000000]%s", "");
            *dst[k] = (size_t)json_integer_value(v);
        }
    } else {
        char what[160];
        snprintf(what, sizeof what, "decoder type \"%.100s\"", type);
        return rt_tokj_unsupported(c, path, what);
    }
    return MC_OK;
}

mc_status rt_tokj_parse_post(rt_tokj_ctx *c, json_t *obj, const char *path,
                             int depth)
{
    const char *type;
    mc_status r;
    rt_tokenizer *t = c->t;
    char field[256];
    if (depth > RT_TOKJ_MAX_DEPTH)
        return rt_tokj_unsupported(c, path,
                                   "post-processors nested too deeply");
    if ((r = get_type(c, obj, path, &type)))
        return r;
    if (!strcmp(type, "ByteLevel"))
        return MC_OK; /* only adjusts offsets */
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(obj, "processors");
        snprintf(field, sizeof field, "%s.processors", path);
        if (!json_is_array(arr))
            return rt_tokj_bad(c, field, "expected an array%s", "");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(field, sizeof field, "%s.processors[%zu]", path, i);
            if ((r = rt_tokj_parse_post(c, json_array_get(arr, i), field,
                                        depth + 1)))
                return r;
        }
        return MC_OK;
    }
    if (strcmp(type, "TemplateProcessing") != 0) {
        char what[160];
        snprintf(what, sizeof what, "post-processor type \"%.100s\"", type);
        return rt_tokj_unsupported(c, path, what);
    }
    if (t->tmpl)
        return rt_tokj_unsupported(c, path, "more than one TemplateProcessing");
    json_t *single = json_object_get(obj, "single");
    json_t *specials = json_object_get(obj, "special_tokens");
    snprintf(field, sizeof field, "%s.single", path);
    if (!json_is_array(single) || json_array_size(single) > RT_TOKJ_MAX_STEPS)
        return rt_tokj_bad(c, field, "expected an array of at most 64 items%s",
                           "");
    if (specials && !json_is_object(specials)) {
        snprintf(field, sizeof field, "%s.special_tokens", path);
        return rt_tokj_bad(c, field, "expected an object%s", "");
    }
    size_t n_seq = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i);
        snprintf(field, sizeof field, "%s.single[%zu]", path, i);
        json_t *sp = json_object_get(item, "SpecialToken");
        json_t *sq = json_object_get(item, "Sequence");
        if (json_is_object(sq)) {
            json_t *id = json_object_get(sq, "id");
            if (!json_is_string(id) || strcmp(json_string_value(id), "A"))
                return rt_tokj_bad(c, field,
                                   "expected the sequence \"A\" in a "
                                   "single template%s",
                                   "");
            int32_t mark = -1;
            if (n_seq++)
                return rt_tokj_bad(c, field, "sequence \"A\" appears twice%s",
                                   "");
            int32_t *p = mc_realloc(t->tmpl, (t->n_tmpl + 1) * sizeof *p);
            if (!p)
                return rt_tokj_nomem(c, field);
            t->tmpl = p;
            t->tmpl[t->n_tmpl++] = mark;
            continue;
        }
        if (!json_is_object(sp))
            return rt_tokj_bad(c, field,
                               "expected {\"SpecialToken\": ...} or "
                               "{\"Sequence\": ...}%s",
                               "");
        json_t *name = json_object_get(sp, "id");
        if (!json_is_string(name))
            return rt_tokj_bad(c, field,
                               "expected SpecialToken.id to be a string%s", "");
        json_t *def = specials
                          ? json_object_get(specials, json_string_value(name))
                          : NULL;
        json_t *ids = def ? json_object_get(def, "ids") : NULL;
        if (!json_is_array(ids) || json_array_size(ids) > RT_TOKJ_MAX_STEPS)
            return rt_tokj_bad(c, field,
                               "special token \"%.100s\" has no ids array "
                               "in special_tokens",
                               json_string_value(name));
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *v = json_array_get(ids, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= (json_int_t)t->vocab_size ||
                !t->flags[json_integer_value(v)])
                return rt_tokj_bad(c, field,
                                   "special token \"%.100s\" has an id "
                                   "outside the vocabulary",
                                   json_string_value(name));
            int32_t *p = mc_realloc(t->tmpl, (t->n_tmpl + 1) * sizeof *p);
            if (!p)
                return rt_tokj_nomem(c, field);
            t->tmpl = p;
            t->tmpl[t->n_tmpl++] = (int32_t)json_integer_value(v);
        }
    }
    if (n_seq != 1) {
        snprintf(field, sizeof field, "%s.single", path);
        return rt_tokj_bad(c, field, "expected the sequence \"A\" once%s", "");
    }
    return MC_OK;
}

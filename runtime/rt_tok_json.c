/*
 * rt_tok_json.c - reading tokenizer.json (and tokenizer_config.json) into
 * struct rt_tokenizer: the vocabulary, the model section, the whole file
 * (the pipelines are in rt_tok_json_steps.c).  Every field is
 * type-checked; an error names the file and the JSON path of the field
 * ("model.merges[17]", "decoder.decoders[2]").
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_tok_json.h"
#include "rt_tok_unicode.h"

mc_status rt_tokj_bad(rt_tokj_ctx *c, const char *field, const char *fmt,
                      const char *a)
{
    return mc_fail(c->err, MC_ERR_FORMAT, c->file, field, -1, fmt, a);
}

mc_status rt_tokj_unsupported(rt_tokj_ctx *c, const char *field,
                              const char *what)
{
    /* the status already reads "unsupported: " */
    return mc_fail(c->err, MC_ERR_UNSUPPORTED, c->file, field, -1, "%s",
                   what);
}

mc_status rt_tokj_nomem(rt_tokj_ctx *c, const char *field)
{
    return mc_fail(c->err, MC_ERR_NOMEM, c->file, field, -1,
                   "out of memory while loading the tokenizer");
}

/* Optional boolean member: absent or null gives def. */
mc_status rt_tokj_get_bool(rt_tokj_ctx *c, json_t *obj, const char *key,
                           const char *path, int def, int *out)
{
    json_t *v = json_object_get(obj, key);
    char field[256];
    if (!v || json_is_null(v)) {
        *out = def;
        return MC_OK;
    }
    if (!json_is_boolean(v)) {
        /* a very long path is cut visibly (gcc -O3 -Wformat-truncation) */
        if (snprintf(field, sizeof field, "%s.%s", path, key) >=
            (int)sizeof field)
            memcpy(field + sizeof field - 4, "...", 4);
        return rt_tokj_bad(c, field, "expected true or false%s", "");
    }
    *out = json_is_true(v);
    return MC_OK;
}

/* Required (or optional when out_present != NULL) string member. */
mc_status rt_tokj_get_str(rt_tokj_ctx *c, json_t *obj, const char *key,
                          const char *path, const char **s, size_t *len,
                          int *present)
{
    json_t *v = json_object_get(obj, key);
    char field[256];
    snprintf(field, sizeof field, "%s.%s", path, key);
    if (!v || (present && json_is_null(v))) {
        if (present) {
            *present = 0;
            return MC_OK;
        }
        return mc_fail(c->err, MC_ERR_FORMAT, c->file, field, -1,
                       "missing (expected a string)");
    }
    if (!json_is_string(v))
        return rt_tokj_bad(c, field, "expected a string%s", "");
    *s = json_string_value(v);
    *len = json_string_length(v);
    if (present)
        *present = 1;
    return MC_OK;
}

uint8_t *rt_tokj_dup_bytes(const char *s, size_t n)
{
    uint8_t *p = mc_malloc(n ? n : 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

/* Type name of a step object ("type" member). */
static int cmp_added(const void *x, const void *y)
{
    const rt_tok_added *a = x, *b = y;
    size_t la = a->normalized ? a->nlen : a->len;
    size_t lb = b->normalized ? b->nlen : b->len;
    if (la != lb)
        return la > lb ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 bytes to U+0100.. in byte order. */
static void byte_level_tables(rt_tokenizer *t)
{
    uint32_t next = 256;
    for (int i = 0; i < 324; i++)
        t->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                   (b >= 0xAE && b <= 0xFF);
        uint32_t cp = keep ? (uint32_t)b : next++;
        uint8_t u[4];
        t->bl_char_len[b] = (uint8_t)rt_tok_utf8_put(cp, u);
        memcpy(t->bl_char[b], u, t->bl_char_len[b]);
        t->bl_byte[cp] = (int16_t)b;
    }
}

static mc_status parse_vocab(rt_tokj_ctx *c, json_t *model, json_t *added)
{
    rt_tokenizer *t = c->t;
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return rt_tokj_bad(c, "model.vocab",
                           "expected an object of token: id%s", "");
    size_t n_model = json_object_size(vocab), n_added = 0;
    if (added && !json_is_null(added)) {
        if (!json_is_array(added))
            return rt_tokj_bad(c, "added_tokens", "expected an array%s", "");
        n_added = json_array_size(added);
    }
    /* pass 1: types, id ranges, sizes */
    uint64_t max_id = 0, pool = 0;
    int any = 0;
    const char *key;
    json_t *val;
    char field[256];
    json_object_foreach(vocab, key, val)
    {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= (json_int_t)RT_TOK_MAX_ID) {
            snprintf(field, sizeof field, "model.vocab[\"%.200s\"]", key);
            return rt_tokj_bad(c, field,
                               "expected an integer id in [0, 16777216)%s", "");
        }
        if ((uint64_t)id > max_id)
            max_id = (uint64_t)id;
        any = 1;
        pool += strlen(key);
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        if (!json_is_object(a))
            return rt_tokj_bad(c, field, "expected an object%s", "");
        json_t *id = json_object_get(a, "id");
        json_t *ct = json_object_get(a, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= (json_int_t)RT_TOK_MAX_ID) {
            snprintf(field, sizeof field, "added_tokens[%zu].id", i);
            return rt_tokj_bad(c, field,
                               "expected an integer id in [0, 16777216)%s", "");
        }
        if (!json_is_string(ct) || json_string_length(ct) == 0) {
            snprintf(field, sizeof field, "added_tokens[%zu].content", i);
            return rt_tokj_bad(c, field, "expected a non-empty string%s", "");
        }
        if ((uint64_t)json_integer_value(id) > max_id)
            max_id = (uint64_t)json_integer_value(id);
        any = 1;
        pool += json_string_length(ct);
    }
    if (!any)
        return rt_tokj_bad(c, "model.vocab", "the vocabulary is empty%s", "");
    /* ids must be (nearly) dense: no huge tables from a tiny file */
    if (max_id + 1 > 2 * (uint64_t)(n_model + n_added) + 256)
        return mc_fail(c->err, MC_ERR_FORMAT, c->file, "model.vocab", -1,
                       "largest id %llu is far beyond the %zu tokens given",
                       (unsigned long long)max_id, n_model + n_added);
    if (pool >= UINT32_MAX)
        return rt_tokj_bad(c, "model.vocab", "token texts exceed 4 GiB%s", "");
    t->vocab_size = (uint32_t)max_id + 1;
    size_t vs = t->vocab_size;
    t->pool = mc_malloc(pool ? (size_t)pool : 1);
    t->tok_off = mc_calloc(vs, sizeof *t->tok_off);
    t->tok_len = mc_calloc(vs, sizeof *t->tok_len);
    t->model_off = mc_calloc(vs, sizeof *t->model_off);
    t->model_len = mc_calloc(vs, sizeof *t->model_len);
    t->flags = mc_calloc(vs, 1);
    if (!t->pool || !t->tok_off || !t->tok_len || !t->model_off ||
        !t->model_len || !t->flags)
        return rt_tokj_nomem(c, "model.vocab");
    json_object_foreach(vocab, key, val)
    {
        uint32_t id = (uint32_t)json_integer_value(val);
        size_t len = strlen(key);
        if (t->flags[id]) {
            snprintf(field, sizeof field, "model.vocab[\"%.200s\"]", key);
            return mc_fail(c->err, MC_ERR_FORMAT, c->file, field, -1,
                           "id %u is given to two tokens", id);
        }
        memcpy(t->pool + t->pool_len, key, len);
        t->model_off[id] = t->tok_off[id] = (uint32_t)t->pool_len;
        t->model_len[id] = t->tok_len[id] = (uint32_t)len;
        t->pool_len += len;
        t->flags[id] = RT_TOK_F_MODEL;
    }
    mc_status r = rt_tok_vocab_index(t, c->file, c->err);
    if (r)
        return r;
    if (n_added) {
        t->added = mc_calloc(n_added, sizeof *t->added);
        if (!t->added)
            return rt_tokj_nomem(c, "added_tokens");
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        json_t *ct = json_object_get(a, "content");
        uint32_t id = (uint32_t)json_integer_value(json_object_get(a, "id"));
        size_t len = json_string_length(ct);
        const char *s = json_string_value(ct);
        rt_tok_added *ad = &t->added[t->n_added];
        snprintf(field, sizeof field, "added_tokens[%zu]", i);
        if (t->flags[id] & RT_TOK_F_ADDED)
            return mc_fail(c->err, MC_ERR_FORMAT, c->file, field, -1,
                           "id %u is given to two added tokens", id);
        /* "normalized" defaults to !special, as AddedToken::from does */
        if ((r = rt_tokj_get_bool(c, a, "special", field, 0, &ad->special)) ||
            (r = rt_tokj_get_bool(c, a, "lstrip", field, 0, &ad->lstrip)) ||
            (r = rt_tokj_get_bool(c, a, "rstrip", field, 0, &ad->rstrip)) ||
            (r = rt_tokj_get_bool(c, a, "single_word", field, 0,
                                  &ad->single_word)) ||
            (r = rt_tokj_get_bool(c, a, "normalized", field, !ad->special,
                                  &ad->normalized)))
            return r;
        if (!(ad->text = rt_tokj_dup_bytes(s, len)))
            return rt_tokj_nomem(c, field);
        ad->len = len;
        ad->id = (int32_t)id;
        t->n_added++;
        memcpy(t->pool + t->pool_len, s, len);
        t->tok_off[id] = (uint32_t)t->pool_len;
        t->tok_len[id] = (uint32_t)len;
        t->pool_len += len;
        t->flags[id] |= RT_TOK_F_ADDED | (ad->special ? RT_TOK_F_SPECIAL : 0);
    }
    return MC_OK;
}

/* Hugging Face matches a normalized added token by its content run through
 * the normalizer; the others by their content.  Needs the normalizer. */
static mc_status index_added(rt_tokj_ctx *c)
{
    rt_tokenizer *t = c->t;
    rt_tok_work w;
    rt_tok_buf out = {0}, tmp = {0};
    mc_status r = MC_OK;
    int need_word = 0;
    memset(&w, 0, sizeof w);
    for (size_t i = 0; i < t->n_added && !r; i++) {
        rt_tok_added *ad = &t->added[i];
        need_word |= ad->single_word;
        if (!ad->normalized)
            continue;
        int lost = 0;
        r = rt_tok_normalize(t, ad->text, ad->len, &out, &tmp, &w, &lost);
        if (!r && !(ad->ntext = rt_tokj_dup_bytes((const char *)out.p,
                                                  out.len)))
            r = MC_ERR_NOMEM;
        ad->nlen = out.len;
        t->flags[ad->id] |= RT_TOK_F_NORMALIZED;
    }
    mc_free(out.p);
    mc_free(tmp.p);
    rt_tok_work_free(&w);
    if (r)
        return r == MC_ERR_NOMEM ? rt_tokj_nomem(c, "added_tokens")
                                 : rt_tokj_bad(c, "added_tokens",
                                               "the normalizer failed on an "
                                               "added token%s", "");
    if (t->n_added > 1)
        qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    for (size_t i = 0; i < t->n_added; i++) {
        const rt_tok_added *ad = &t->added[i];
        if (ad->normalized ? ad->nlen > 0 : 1)
            t->added_first[ad->normalized]
                          [ad->normalized ? ad->ntext[0] : ad->text[0]] = 1;
    }
    /* single_word looks at the neighbours with Rust's regex \w */
    static const char word[] = "[" RT_TOK_RE_RUST_WORD "]";
    char why[200];
    if (need_word && (r = rt_tok_re_compile(word, sizeof word - 1, RT_RE_PCRE,
                                            &t->word_re, why, sizeof why)))
        return rt_tokj_nomem(c, "added_tokens");
    return MC_OK;
}

static mc_status parse_model(rt_tokj_ctx *c, json_t *model)
{
    rt_tokenizer *t = c->t;
    const char *s;
    size_t len;
    int present;
    mc_status r;
    char field[256];
    if ((r = rt_tokj_get_str(c, model, "type", "model", &s, &len, &present)))
        return r;
    if (present && strcmp(s, "BPE") != 0)
        return rt_tokj_unsupported(c, "model.type", "models other than BPE");
    if ((r = rt_tokj_get_bool(c, model, "byte_fallback", "model", 0,
                              &t->byte_fallback)) ||
        (r = rt_tokj_get_bool(c, model, "fuse_unk", "model", 0,
                              &t->fuse_unk)) ||
        (r = rt_tokj_get_bool(c, model, "ignore_merges", "model", 0,
                              &t->ignore_merges)))
        return r;
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) {
        if (!json_is_number(dropout))
            return rt_tokj_bad(c, "model.dropout",
                               "expected null or a number%s", "");
        if (json_number_value(dropout) != 0.0)
            return rt_tokj_unsupported(c, "model.dropout", "BPE dropout");
    }
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        if ((r = rt_tokj_get_str(c, model, affix[k], "model", &s, &len,
                                 &present)))
            return r;
        if (present && len > 0)
            return rt_tokj_unsupported(c, "model", affix[k]);
    }
    t->unk_id = -1;
    if ((r = rt_tokj_get_str(c, model, "unk_token", "model", &s, &len,
                             &present)))
        return r;
    if (present) {
        t->unk_id = rt_tokenizer_token_to_id(t, s, len);
        if (t->unk_id < 0)
            return rt_tokj_bad(c, "model.unk_token",
                               "unk_token \"%.100s\" is not in "
                               "the vocabulary",
                               s);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->fallback_id[b] = rt_tok_vocab_find(t, (const uint8_t *)name, 6);
        t->byte_id[b] = rt_tok_vocab_find(t, t->bl_char[b], t->bl_char_len[b]);
    }
    json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges))
        return MC_OK;
    if (!json_is_array(merges))
        return rt_tokj_bad(c, "model.merges", "expected an array%s", "");
    size_t n = json_array_size(merges);
    if (n >= RT_TOK_MAX_ID)
        return rt_tokj_bad(c, "model.merges", "more than 16777216 merges%s",
                           "");
    if (rt_tok_merge_alloc(t, n))
        return rt_tokj_nomem(c, "model.merges");
    rt_tok_buf cat = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t alen, blen;
        snprintf(field, sizeof field, "model.merges[%zu]", i);
        if (json_is_string(m)) {
            a = json_string_value(m);
            size_t mlen = json_string_length(m);
            const char *sp = memchr(a, ' ', mlen);
            if (!sp || sp == a || sp + 1 == a + mlen ||
                memchr(sp + 1, ' ', (size_t)(a + mlen - sp - 1))) {
                mc_free(cat.p);
                return rt_tokj_bad(c, field,
                                   "expected \"left right\" (one space)%s", "");
            }
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = mlen - alen - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            alen = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            blen = json_string_length(json_array_get(m, 1));
        } else {
            mc_free(cat.p);
            return rt_tokj_bad(c, field,
                               "expected \"left right\" or [\"left\", "
                               "\"right\"]%s",
                               "");
        }
        int32_t ia = rt_tok_vocab_find(t, (const uint8_t *)a, alen);
        int32_t ib = rt_tok_vocab_find(t, (const uint8_t *)b, blen);
        cat.len = 0;
        if (!rt_tok_buf_append(&cat, a, alen) ||
            !rt_tok_buf_append(&cat, b, blen)) {
            mc_free(cat.p);
            return rt_tokj_nomem(c, field);
        }
        int32_t ir = rt_tok_vocab_find(t, cat.p, cat.len);
        if (ia < 0 || ib < 0 || ir < 0) {
            mc_free(cat.p);
            return rt_tokj_bad(c, field,
                               "a merge part or its result is not in "
                               "model.vocab%s",
                               "");
        }
        rt_tok_merge_put(t, ia, ib, (uint32_t)i, ir);
    }
    mc_free(cat.p);
    return MC_OK;
}

/* See rt_tokenizer.chunk. */
static void set_chunking(rt_tokenizer *t)
{
    const uint8_t *sym = NULL;
    size_t len = 0;
    if (t->byte_level)
        return;
    for (size_t i = 0; i < t->n_pre; i++)
        if (t->pre[i].kind == RT_PRE_METASPACE) {
            sym = t->pre[i].a;
            len = t->pre[i].a_len;
        }
    for (size_t i = 0; i < t->n_norm && !sym; i++)
        if (t->norm[i].kind == RT_NORM_REPLACE && t->norm[i].a_len == 1 &&
            t->norm[i].a[0] == ' ' && t->norm[i].b_len > 0) {
            sym = t->norm[i].b;
            len = t->norm[i].b_len;
        }
    /* the symbol must be one character and a token itself: were it byte
     * fallback or unk, a token without it in its text could cover it */
    uint32_t cp;
    if (!sym || len > sizeof t->chunk_sym ||
        rt_tok_utf8_next(sym, len, &cp) != len || cp == RT_TOK_BAD_CP ||
        rt_tok_vocab_find(t, sym, len) < 0)
        return;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->flags[id] & RT_TOK_F_MODEL))
            continue;
        const uint8_t *s = t->pool + t->model_off[id];
        size_t n = t->model_len[id], k = 0;
        while (n - k >= len && memcmp(s + k, sym, len) == 0)
            k += len;
        for (; k + len <= n; k++)
            if (memcmp(s + k, sym, len) == 0)
                return;
    }
    t->chunk = 1;
    memcpy(t->chunk_sym, sym, len);
    t->chunk_sym_len = len;
}

static int32_t first_present(const rt_tokenizer *t, const char *const *names)
{
    for (; *names; names++) {
        int32_t id = rt_tokenizer_token_to_id(t, *names, strlen(*names));
        if (id >= 0)
            return id;
    }
    return -1;
}

mc_status rt_tok_parse(rt_tokenizer *t, const void *data, size_t len,
                       const char *file, mc_error *err)
{
    rt_tokj_ctx c = {t, file, err};
    json_error_t jerr;
    mc_alloc_install_jansson();
    json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson turns some failed allocations into syntax errors or
         * leaves the text empty; an injected failure is out of memory */
        if (json_error_code(&jerr) == json_error_out_of_memory ||
            jerr.text[0] == '\0' || mc_alloc_failure_injected())
            return rt_tokj_nomem(&c, "");
        return mc_fail(err, MC_ERR_FORMAT, file, "", jerr.position,
                       "invalid JSON at line %d, column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    }
    mc_status r = MC_OK;
    byte_level_tables(t);
    t->bos_id = t->eos_id = t->unk_id = -1;
    json_t *model = json_object_get(root, "model");
    json_t *v;
    if (!json_is_object(root)) {
        r = rt_tokj_bad(&c, "", "expected a JSON object at the top level%s",
                        "");
        goto done;
    }
    if (!json_is_object(model)) {
        r = rt_tokj_bad(&c, "model", "expected an object%s", "");
        goto done;
    }
    if ((r = parse_vocab(&c, model, json_object_get(root, "added_tokens"))) ||
        (r = parse_model(&c, model)))
        goto done;
    if ((v = json_object_get(root, "normalizer")) && !json_is_null(v) &&
        (r = rt_tokj_parse_normalizer(&c, v, "normalizer", 0)))
        goto done;
    if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v) &&
        (r = rt_tokj_parse_pretok(&c, v, "pre_tokenizer", 0)))
        goto done;
    if ((v = json_object_get(root, "decoder")) && !json_is_null(v)) {
        t->has_decoder = 1;
        if ((r = rt_tokj_parse_decoder(&c, v, "decoder", 0)))
            goto done;
    }
    if ((r = index_added(&c)))
        goto done;
    set_chunking(t);
    if ((v = json_object_get(root, "post_processor")) && !json_is_null(v) &&
        (r = rt_tokj_parse_post(&c, v, "post_processor", 0)))
        goto done;
    for (size_t i = 0; i < t->n_tmpl; i++)
        if (t->tmpl[i] >= 0) {
            t->bos_id = t->tmpl[i];
            break;
        }
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", NULL};
    static const char *const eos_names[] = {
        "</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", NULL};
    if (t->bos_id < 0)
        t->bos_id = first_present(t, bos_names);
    t->eos_id = first_present(t, eos_names);
done:
    json_decref(root);
    return r;
}

/* bos_token / eos_token: "text" or {"content": "text", ...}. */
static mc_status config_token(rt_tokj_ctx *c, json_t *root, const char *key,
                              int32_t *id)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return MC_OK;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return rt_tokj_bad(c, key,
                           "expected a string or {\"content\": string}%s", "");
    int32_t found = rt_tokenizer_token_to_id(c->t, json_string_value(v),
                                             json_string_length(v));
    if (found < 0)
        return rt_tokj_bad(c, key, "token \"%.100s\" is not in the vocabulary",
                           json_string_value(v));
    *id = found;
    return MC_OK;
}

mc_status rt_tok_read_config(rt_tokenizer *t, const char *cfg_path,
                             mc_error *err)
{
    rt_tokj_ctx c = {t, cfg_path, err};
    json_error_t jerr;
    /* real configs hold integers beyond 64 bits (model_max_length 1e30):
     * only strings are read here, so numbers may as well be doubles */
    json_t *root = json_load_file(
        cfg_path, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!root) {
        /* jansson turns some failed allocations into syntax errors or
         * leaves the text empty; an injected failure is out of memory */
        if (json_error_code(&jerr) == json_error_out_of_memory ||
            jerr.text[0] == '\0' || mc_alloc_failure_injected())
            return rt_tokj_nomem(&c, "");
        return mc_fail(err, MC_ERR_FORMAT, cfg_path, "", jerr.position,
                       "invalid JSON at line %d, column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    }
    mc_status r = MC_OK;
    if (!json_is_object(root))
        r = rt_tokj_bad(&c, "", "expected a JSON object at the top level%s",
                        "");
    if (!r)
        r = config_token(&c, root, "bos_token", &t->bos_id);
    if (!r)
        r = config_token(&c, root, "eos_token", &t->eos_id);
    json_decref(root);
    return r;
}

void rt_tok_free_internal(rt_tokenizer *t)
{
    rt_tok_step *lists[3] = {t->norm, t->pre, t->dec};
    size_t counts[3] = {t->n_norm, t->n_pre, t->n_dec};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < counts[k]; i++) {
            mc_free(lists[k][i].a);
            mc_free(lists[k][i].b);
            rt_tok_re_free(lists[k][i].re);
        }
        mc_free(lists[k]);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        mc_free(t->added[i].text);
        mc_free(t->added[i].ntext);
    }
    rt_tok_re_free(t->word_re);
    mc_free(t->added);
    mc_free(t->pool);
    mc_free(t->tok_off);
    mc_free(t->tok_len);
    mc_free(t->model_off);
    mc_free(t->model_len);
    mc_free(t->flags);
    mc_free(t->vhash);
    mc_free(t->mkey);
    mc_free(t->mrank);
    mc_free(t->mnew);
    mc_free(t->tmpl);
}

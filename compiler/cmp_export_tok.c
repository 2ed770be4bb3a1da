/* cmp_export_tok.c - a Hugging Face tokenizer.json as GGUF tokenizer
 * metadata (tokenizer.ggml.*), the way llama.cpp's converter writes it.
 *
 * Only BPE models are handled (the tokenizers of Llama, Mistral and
 * Qwen2):
 *   byte_fallback true  -> "llama" (llama.cpp's SentencePiece tokenizer):
 *       tokens, scores and token types; <0xNN> pieces are BYTE, the unk
 *       token UNKNOWN.  tokenizer.json has no SentencePiece scores, and
 *       llama.cpp's SPM tokenizer merges the adjacent pair with the highest
 *       score, so each token produced by a merge gets minus its merge rank
 *       (the rank order is the BPE order) and every other piece 0.
 *   byte_fallback false -> "gpt2" (byte-level BPE): tokens, token types
 *       and the merges; the pre-tokenizer name is "qwen2" for Qwen2,
 *       "llama-bpe" for a 128k vocabulary (Llama 3) and "default" else.
 * Added tokens become CONTROL (special) or USER_DEFINED; ids with no token
 * (the embedding has padding rows) become "[PAD<id>]" UNUSED, as the
 * converter does.  BOS/EOS come from config.json, add_bos_token and
 * add_eos_token from the post-processor's template (a special token first,
 * or last).  Anything else (Unigram, WordPiece, ids past
 * the vocabulary) is refused by name. */
#include "cmp_export.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "fmt_gguf.h"
#include "mc_alloc.h"

#define PAD_BYTES 24 /* "[PAD" + a u32 + "]" + NUL fits */

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4,
       TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct tokv {
    const char **text;  /* [n] borrowed from the JSON or pads */
    size_t *len;        /* [n] */
    float *score;       /* [n] */
    int32_t *type;      /* [n] */
    char *pads;         /* "[PAD<id>]" strings, PAD_BYTES each */
    size_t n;
} tokv;

static void tokv_free(tokv *v)
{
    mc_free(v->text);
    mc_free(v->len);
    mc_free(v->score);
    mc_free(v->type);
    mc_free(v->pads);
}

static int is_byte_piece(const char *s, size_t n)
{
    return n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

/* "a b" or ["a", "b"] -> the merged text a+b into buf; 0 if malformed. */
static int merge_text(const json_t *m, char *buf, size_t cap, const char **sp,
                      size_t *sl)
{
    const char *a, *b;
    size_t la, lb;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp1 = strchr(s, ' ');
        if (!sp1 || sp1 == s)
            return 0;
        a = s;
        la = (size_t)(sp1 - s);
        b = sp1 + 1;
        lb = strlen(b);
        *sp = s;
        *sl = json_string_length(m);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
        la = strlen(a);
        lb = strlen(b);
        *sp = NULL; /* the caller joins them with a space */
        *sl = 0;
    } else {
        return 0;
    }
    if (la + lb + 1 > cap)
        return 0;
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    buf[la + lb] = 0;
    return 1;
}

static mc_status bad(mc_error *err, const char *src, const char *field,
                     const char *what)
{
    return mc_fail(err, MC_ERR_UNSUPPORTED, src, field, -1,
                   "tokenizer.json: %s", what);
}

/* tokens from model.vocab and added_tokens, for n ids. */
static mc_status fill_tokens(const json_t *root, const json_t *model,
                             tokv *v, int spm, const char *src, mc_error *err)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return bad(err, src, "model.vocab", "model.vocab is not an object");
    const char *key;
    json_t *val;
    const json_t *unk = json_object_get(model, "unk_token");
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || (uint64_t)id >= v->n)
            return mc_fail(err, MC_ERR_SHAPE, src, key, -1,
                           "tokenizer.json: token id %lld is outside the "
                           "model's vocabulary of %zu", (long long)id, v->n);
        size_t kl = strlen(key);
        v->text[id] = key;
        v->len[id] = kl;
        v->type[id] = TT_NORMAL;
        if (spm && is_byte_piece(key, kl))
            v->type[id] = TT_BYTE;
        if (json_is_string(unk) && strcmp(json_string_value(unk), key) == 0)
            v->type[id] = TT_UNKNOWN;
    }
    const json_t *added = json_object_get(root, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id");
        const json_t *c = json_object_get(a, "content");
        if (!json_is_integer(id) || !json_is_string(c) ||
            json_integer_value(id) < 0 ||
            (uint64_t)json_integer_value(id) >= v->n)
            return mc_fail(err, MC_ERR_SHAPE, src, "added_tokens", -1,
                           "tokenizer.json: added token %zu has no id inside "
                           "the model's vocabulary of %zu", i, v->n);
        size_t k = (size_t)json_integer_value(id);
        v->text[k] = json_string_value(c);
        v->len[k] = json_string_length(c);
        if (v->type[k] != TT_UNKNOWN)
            v->type[k] = json_is_true(json_object_get(a, "special"))
                             ? TT_CONTROL : TT_USER;
    }
    for (size_t k = 0; k < v->n; k++)
        if (!v->text[k]) {
            char *p = v->pads + PAD_BYTES * k;
            snprintf(p, PAD_BYTES, "[PAD%u]", (unsigned)k);
            v->text[k] = p;
            v->len[k] = strlen(p);
            v->type[k] = TT_UNUSED;
        }
    return MC_OK;
}

/* SPM scores: minus the rank of the first merge producing each token. */
static mc_status spm_scores(const json_t *model, tokv *v, const char *src,
                            mc_error *err)
{
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    char buf[1024];
    for (size_t r = 0; r < json_array_size(merges); r++) {
        const char *s;
        size_t sl;
        if (!merge_text(json_array_get(merges, r), buf, sizeof buf, &s, &sl))
            return bad(err, src, "model.merges",
                       "a merge is neither \"a b\" nor [\"a\", \"b\"]");
        const json_t *id = json_object_get(vocab, buf);
        if (json_is_integer(id)) {
            size_t k = (size_t)json_integer_value(id);
            if (v->score[k] == 0.0f)
                v->score[k] = -(float)(r + 1);
        }
    }
    return MC_OK;
}

/* llama.cpp's SPM tokenizer joins any two adjacent pieces whose
 * concatenation is a token; the BPE joins only the listed merges.  The
 * scores make the two agree when every split of a token into two tokens
 * is a merge (true of a tokenizer.json converted from a SentencePiece
 * model, which lists them all).  Appends to note how many splits of
 * ordinary tokens are not merges, which llama.cpp may join where the BPE
 * does not. */
static void spm_loose_splits(const json_t *model, const tokv *v, char *note,
                             size_t cap)
{
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    json_t *pairs = json_object();
    char buf[1024], first[96] = "";
    for (size_t r = 0; pairs && r < json_array_size(merges); r++) {
        const json_t *m = json_array_get(merges, r);
        if (json_is_string(m)) {
            json_object_set_new(pairs, json_string_value(m), json_true());
        } else if (json_is_array(m) &&
                   snprintf(buf, sizeof buf, "%s %s",
                            json_string_value(json_array_get(m, 0)),
                            json_string_value(json_array_get(m, 1))) <
                       (int)sizeof buf) {
            json_object_set_new(pairs, buf, json_true());
        }
    }
    size_t count = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        size_t kl = strlen(key);
        json_int_t id = json_integer_value(val);
        if (!pairs || kl + 2 > sizeof buf || id < 0 ||
            (uint64_t)id >= v->n || v->type[id] != TT_NORMAL)
            continue;
        for (size_t i = 1; i < kl; i++) {
            if (((unsigned char)key[i] & 0xC0) == 0x80)
                continue; /* inside a UTF-8 character */
            memcpy(buf, key, i);
            buf[i] = 0;
            int left = json_object_get(vocab, buf) != NULL;
            buf[i] = ' ';
            memcpy(buf + i + 1, key + i, kl - i + 1);
            if (left && json_object_get(vocab, buf + i + 1) &&
                !json_object_get(pairs, buf) && !count++)
                snprintf(first, sizeof first, "'%.*s' + '%.40s'",
                         (int)(i < 40 ? i : 40), key, key + i);
        }
    }
    json_decref(pairs);
    size_t k = strlen(note);
    if (count && k < cap)
        snprintf(note + k, cap - k, "%s%zu splits of a token into two tokens "
                 "are not merges (first: %s): llama.cpp's SPM tokenizer may "
                 "join them where the BPE does not", k ? "; " : "", count,
                 first);
}

static mc_status add_merges(fmt_gguf_writer *w, const json_t *model,
                            const char *src, mc_error *err)
{
    const json_t *merges = json_object_get(model, "merges");
    size_t n = json_array_size(merges);
    const char **s = mc_calloc(n + 1, sizeof *s);
    size_t *l = mc_calloc(n + 1, sizeof *l);
    char **owned = mc_calloc(n + 1, sizeof *owned);
    mc_status st = MC_OK;
    if (!s || !l || !owned)
        st = mc_fail(err, MC_ERR_NOMEM, src, "model.merges", -1,
                     "out of memory");
    char buf[1024];
    for (size_t r = 0; st == MC_OK && r < n; r++) {
        const json_t *m = json_array_get(merges, r);
        if (!merge_text(m, buf, sizeof buf, &s[r], &l[r])) {
            st = bad(err, src, "model.merges",
                     "a merge is neither \"a b\" nor [\"a\", \"b\"]");
        } else if (!s[r]) { /* array form: write "a b" */
            const char *a = json_string_value(json_array_get(m, 0));
            const char *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            if (!(owned[r] = mc_malloc(la + lb + 2))) {
                st = mc_fail(err, MC_ERR_NOMEM, src, "model.merges", -1,
                             "out of memory");
                break;
            }
            memcpy(owned[r], a, la);
            owned[r][la] = ' ';
            memcpy(owned[r] + la + 1, b, lb + 1);
            s[r] = owned[r];
            l[r] = la + lb + 1;
        }
    }
    if (st == MC_OK)
        st = fmt_gguf_add_string_array(w, "tokenizer.ggml.merges", s, l, n,
                                       err);
    for (size_t r = 0; owned && r < n; r++)
        mc_free(owned[r]);
    mc_free(owned);
    mc_free(s);
    mc_free(l);
    return st;
}

/* 1 if the post-processor's single template starts (at_end 0) or ends
 * (at_end 1) with a special token: llama.cpp's add_bos / add_eos. */
static int template_adds(const json_t *root, int at_end)
{
    const json_t *pp = json_object_get(root, "post_processor");
    const json_t *single = json_object_get(pp, "single");
    size_t n = json_array_size(single);
    return n > 1 && json_is_object(json_object_get(
                        json_array_get(single, at_end ? n - 1 : 0),
                        "SpecialToken"));
}

static const char *jstr(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* A "Sequence" node's list (under key), or the node alone as a list of
 * one; *n gets the length.  NULL node: n = 0. */
static const json_t *steps(const json_t *node, const char *key, size_t *n,
                           json_t **own)
{
    *own = NULL;
    *n = 0;
    if (!json_is_object(node))
        return NULL;
    if (!strcmp(jstr(node, "type"), "Sequence")) {
        const json_t *l = json_object_get(node, key);
        *n = json_array_size(l);
        return l;
    }
    *own = json_array();
    json_array_append(*own, (json_t *)node);
    *n = 1;
    return *own;
}

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* How llama.cpp's SPM tokenizer can follow this tokenizer.json's
 * normalizer and pre-tokenizer: it escapes spaces as U+2581 and, with
 * add_space_prefix, puts one in front of the text (and after each special
 * token).  *prefix gets add_space_prefix; what llama.cpp cannot follow
 * goes into note (empty when it follows everything). */
static void spm_form(const json_t *root, int *prefix, char *note, size_t cap)
{
    json_t *own1, *own2;
    size_t nn, np, k = 0;
    const json_t *nl = steps(json_object_get(root, "normalizer"),
                             "normalizers", &nn, &own1);
    const json_t *pl = steps(json_object_get(root, "pre_tokenizer"),
                             "pretokenizers", &np, &own2);
    int escapes = 0;
    *prefix = 0;
    note[0] = 0;
    for (size_t i = 0; i < nn; i++) {
        const json_t *x = json_array_get(nl, i);
        const char *ty = jstr(x, "type");
        const json_t *pat = json_object_get(x, "pattern");
        if (!strcmp(ty, "Prepend") && !strcmp(jstr(x, "prepend"), SPACE_MARK)) {
            *prefix = 1;
        } else if (!strcmp(ty, "Replace") &&
                   !strcmp(jstr(pat, "String"), " ") &&
                   !strcmp(jstr(x, "content"), SPACE_MARK)) {
            escapes = 1;
        } else if (k < cap) {
            k += (size_t)snprintf(note + k, cap - k,
                                  "%snormalizer %s is not applied by "
                                  "llama.cpp", k ? "; " : "", ty);
        }
    }
    for (size_t i = 0; i < np; i++) {
        const json_t *x = json_array_get(pl, i);
        const char *ty = jstr(x, "type");
        const char *scheme = jstr(x, "prepend_scheme");
        if (!strcmp(ty, "Metaspace") && !strcmp(jstr(x, "replacement"),
                                                SPACE_MARK) &&
            !json_is_true(json_object_get(x, "split"))) {
            escapes = 1;
            /* "first"/"always" prepend only when the text does not start
             * with a space already; llama.cpp always does */
            *prefix = strcmp(scheme, "never") != 0;
            if (*prefix && k < cap)
                k += (size_t)snprintf(
                    note + k, cap - k,
                    "%sMetaspace prepend_scheme \"%s\": llama.cpp adds one "
                    "more U+2581 to text that starts with a space%s",
                    k ? "; " : "", scheme,
                    strcmp(scheme, "first") ? "" : " or follows a special "
                    "token");
        } else if (k < cap) {
            k += (size_t)snprintf(note + k, cap - k,
                                  "%spre-tokenizer %s is not applied by "
                                  "llama.cpp", k ? "; " : "", ty);
        }
    }
    if (!escapes && k < cap)
        snprintf(note + k, cap - k, "%sspaces are not U+2581 in this "
                 "tokenizer.json but are in llama.cpp's", k ? "; " : "");
    json_decref(own1);
    json_decref(own2);
}

/* Append to note the added tokens whose matching llama.cpp does not do:
 * it finds an added token in the raw text, wherever it is, so an added
 * token matched on normalized text, only as a whole word, or taking the
 * spaces beside it (normalized / single_word / lstrip / rstrip) splits
 * differently. */
static void added_note(const json_t *root, char *note, size_t cap)
{
    static const char *const flags[] = {"normalized", "single_word",
                                        "lstrip", "rstrip"};
    const json_t *added = json_object_get(root, "added_tokens");
    size_t k = strlen(note), count = 0;
    const char *first = NULL, *flag = NULL;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        for (size_t f = 0; f < sizeof flags / sizeof *flags; f++) {
            /* tokenizers never normalizes the text of a special token */
            if (f == 0 && json_is_true(json_object_get(a, "special")))
                continue;
            if (json_is_true(json_object_get(a, flags[f]))) {
                if (!count++) {
                    first = jstr(a, "content");
                    flag = flags[f];
                }
                break;
            }
        }
    }
    if (count && k < cap)
        snprintf(note + k, cap - k, "%s%zu added token%s (first: '%.40s', "
                 "%s) matched on the raw text by llama.cpp", k ? "; " : "",
                 count, count == 1 ? "" : "s", first, flag);
}

/* Hugging Face's Split regexes of Qwen2 and Llama 3 (llama.cpp's "qwen2"
 * and "llama-bpe" pre-tokenizers apply the same splits). */
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* llama.cpp's name for this byte-level BPE's pre-tokenizer, recognised
 * from its structure: Split(Qwen2 or Llama 3 regex) + ByteLevel without
 * regex, ByteLevel with GPT-2's regex ("gpt-2"), Digits(individual) +
 * that ("smollm").  Anything else gets "default" and a note. */
static const char *bpe_pre(const json_t *root, const json_t *model,
                           char *note, size_t cap)
{
    json_t *own;
    size_t n;
    const json_t *l = steps(json_object_get(root, "pre_tokenizer"),
                            "pretokenizers", &n, &own);
    const json_t *a = json_array_get(l, 0), *b = json_array_get(l, 1);
    const char *pre = NULL;
    int prefix_space = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(l, i);
        if (!strcmp(jstr(x, "type"), "ByteLevel") &&
            json_is_true(json_object_get(x, "add_prefix_space")))
            prefix_space = 1;
    }
    const char *ta = jstr(a, "type"), *tb = jstr(b, "type");
    if (n == 2 && !strcmp(ta, "Split") && !strcmp(tb, "ByteLevel") &&
        !json_is_true(json_object_get(b, "use_regex")) &&
        !strcmp(jstr(a, "behavior"), "Isolated") &&
        !json_is_true(json_object_get(a, "invert"))) {
        const char *re = jstr(json_object_get(a, "pattern"), "Regex");
        int ignore = json_is_true(json_object_get(model, "ignore_merges"));
        /* llama-bpe also takes a whole word that is a token as it is
         * (ignore_merges): only right for a tokenizer.json that does */
        if (!strcmp(re, re_qwen2) && !ignore)
            pre = "qwen2";
        else if (!strcmp(re, re_llama3) && ignore)
            pre = "llama-bpe";
    } else if (n == 1 && !strcmp(ta, "ByteLevel") &&
               json_is_true(json_object_get(a, "use_regex"))) {
        pre = "gpt-2";
    } else if (n == 2 && !strcmp(ta, "Digits") &&
               json_is_true(json_object_get(a, "individual_digits")) &&
               !strcmp(tb, "ByteLevel") &&
               json_is_true(json_object_get(b, "use_regex"))) {
        pre = "smollm";
    }
    size_t k = 0;
    note[0] = 0;
    if (!pre)
        k += (size_t)snprintf(note, cap, "pre-tokenizer not one llama.cpp "
                              "names: its \"default\" splits may differ");
    if (prefix_space && k < cap)
        k += (size_t)snprintf(note + k, cap - k, "%sByteLevel "
                              "add_prefix_space is not applied by llama.cpp",
                              k ? "; " : "");
    const json_t *norm = json_object_get(root, "normalizer");
    if (json_is_object(norm) && k < cap)
        snprintf(note + k, cap - k, "%snormalizer %s is not applied by "
                 "llama.cpp (same ids on text it leaves unchanged)",
                 k ? "; " : "", jstr(norm, "type"));
    json_decref(own);
    return pre ? pre : "default";
}

mc_status cmp_export_gguf_tokenizer(struct fmt_gguf_writer *w,
                                    const char *text, size_t len,
                                    const fmt_model_config *cfg,
                                    const char *src, char *desc,
                                    size_t desc_cap, char *note,
                                    size_t note_cap, mc_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root)
        return mc_fail(err, MC_ERR_FORMAT, src, "tokenizer", je.position,
                       "tokenizer.json: %s (line %d)", je.text, je.line);
    const json_t *model = json_object_get(root, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    mc_status st = MC_OK;
    tokv v = {0};
    if (!type || strcmp(type, "BPE") != 0) {
        st = mc_fail(err, MC_ERR_UNSUPPORTED, src, "model.type", -1,
                     "tokenizer.json model type '%s'; only BPE (Llama, "
                     "Mistral, Qwen2) is exported", type ? type : "?");
        goto out;
    }
    int spm = json_is_true(json_object_get(model, "byte_fallback"));
    v.n = cfg->vocab_size;
    v.text = mc_calloc(v.n, sizeof *v.text);
    v.len = mc_calloc(v.n, sizeof *v.len);
    v.score = mc_calloc(v.n, sizeof *v.score);
    v.type = mc_calloc(v.n, sizeof *v.type);
    v.pads = mc_calloc(v.n, PAD_BYTES);
    if (!v.text || !v.len || !v.score || !v.type || !v.pads) {
        st = mc_fail(err, MC_ERR_NOMEM, src, "tokenizer", -1, "out of memory");
        goto out;
    }
    if ((st = fill_tokens(root, model, &v, spm, src, err)) != MC_OK ||
        (spm && (st = spm_scores(model, &v, src, err)) != MC_OK))
        goto out;
    int prefix = 0;
    const char *pre = NULL;
    if (spm) {
        spm_form(root, &prefix, note, note_cap);
        spm_loose_splits(model, &v, note, note_cap);
    } else {
        pre = bpe_pre(root, model, note, note_cap);
    }
    added_note(root, note, note_cap);
    const char *gm = spm ? "llama" : "gpt2";
    if ((st = fmt_gguf_add_string(w, "tokenizer.ggml.model", gm, strlen(gm),
                                  err)) != MC_OK ||
        (!spm && (st = fmt_gguf_add_string(w, "tokenizer.ggml.pre", pre,
                                           strlen(pre), err)) != MC_OK) ||
        (st = fmt_gguf_add_string_array(w, "tokenizer.ggml.tokens", v.text,
                                        v.len, v.n, err)) != MC_OK ||
        (spm && (st = fmt_gguf_add_bool(w, "tokenizer.ggml.add_space_prefix",
                                        prefix, err)) != MC_OK) ||
        (spm && (st = fmt_gguf_add_array(w, "tokenizer.ggml.scores",
                                         FMT_GGUF_V_F32, v.score, v.n,
                                         err)) != MC_OK) ||
        (st = fmt_gguf_add_array(w, "tokenizer.ggml.token_type",
                                 FMT_GGUF_V_I32, v.type, v.n, err)) != MC_OK ||
        (!spm && (st = add_merges(w, model, src, err)) != MC_OK))
        goto out;
    if (cfg->bos_token_id >= 0 &&
        (st = fmt_gguf_add_u32(w, "tokenizer.ggml.bos_token_id",
                               (uint32_t)cfg->bos_token_id, err)) != MC_OK)
        goto out;
    if (cfg->n_eos > 0 &&
        (st = fmt_gguf_add_u32(w, "tokenizer.ggml.eos_token_id",
                               (uint32_t)cfg->eos_token_ids[0], err)) != MC_OK)
        goto out;
    for (size_t k = 0; k < v.n; k++)
        if (v.type[k] == TT_UNKNOWN) {
            if ((st = fmt_gguf_add_u32(w, "tokenizer.ggml.unknown_token_id",
                                       (uint32_t)k, err)) != MC_OK)
                goto out;
            break;
        }
    if ((st = fmt_gguf_add_bool(w, "tokenizer.ggml.add_bos_token",
                                template_adds(root, 0), err)) != MC_OK ||
        (st = fmt_gguf_add_bool(w, "tokenizer.ggml.add_eos_token",
                                template_adds(root, 1), err)) != MC_OK)
        goto out;
    if (spm)
        snprintf(desc, desc_cap, "llama (SPM), %zu tokens", v.n);
    else
        snprintf(desc, desc_cap, "gpt2 (BPE, pre %s), %zu tokens", pre, v.n);
out:
    tokv_free(&v);
    json_decref(root);
    return st;
}

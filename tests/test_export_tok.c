/* test_export_tok.c - the GGUF tokenizer metadata of `mcompile export`
 * (compiler/cmp_export_tok.c) checked the way llama.cpp uses it, without
 * llama.cpp or Python.
 *
 * A byte-fallback BPE (Llama 2, Mistral) becomes llama.cpp's SentencePiece
 * vocabulary, which merges by token score instead of by merge rank.  Here
 * a transcription of llama.cpp's SPM tokenizer (llm_tokenizer_spm_session
 * in src/llama-vocab.cpp: optional U+2581 prefix, spaces escaped, UTF-8
 * characters as symbols, the adjacent pair whose concatenation is the
 * highest-scored token merged first (leftmost on ties), symbols that are
 * no token written as <0xNN> bytes) runs on the exported tokens, scores and
 * add_space_prefix, and its ids are compared with our tokenizer.json
 * implementation's (runtime/rt_tokenizer.h, itself checked id for id
 * against Hugging Face tokenizers by scripts/tokenizer-check) on the
 * tokenizer corpus (tests/data/tokenizer/corpus.json) and on texts made to
 * be hard: runs of spaces, newlines, digits, unicode, byte fallback.
 * scripts/export-check runs llama.cpp itself on the same forms.
 * For byte-level BPEs the llama.cpp pre-tokenizer name recognised from the
 * tokenizer.json's structure is checked, and that whatever llama.cpp will
 * not reproduce is stated in the export's note.  Also the metadata itself
 * (tokens, types, scores, BOS/EOS) for the Mistral tokenizer.json. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_export.h"
#include "fmt_gguf.h"
#include "gguf_read.h"
#include "rt_tokenizer.h"
#include "testutil.h"

#define DATA MC_SOURCE_DIR "/tests/data/tokenizer"
#define MISTRAL \
    MC_SHARED_DIR "/tokenizers/mistral-7b-instruct-v0.1/tokenizer.json"

static const char *const hard_texts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Hello world!  Two  spaces, a tab\tand\na newline.",
    "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
    "\xf0\x9f\x98\x80 (byte fallback)",
    "   leading spaces and 1234567890 digits", " x", "  x", "    x", "x ",
    "x  ", "trailing   ", "a  b   c    d     e", "\n", "\n\n x", " \n ",
    "line\n\n\nline", "1 22 333 4444 55555 3.14159 -42 1,000,000",
    "tab\there\t\tand  more", "    def f(x):\n        return x * 2\n",
    "THE QUICK BROWN FOX", "\xe2\x96\x81 literal", "e\xcc\x81 \xc3\xa9", "",
    " ", "   ", "\xc2\xa0non-breaking\xc2\xa0space",
};

/* ---- the exported vocabulary, as llama.cpp holds it -------------------- */

typedef struct spm {
    tg_file f;
    size_t n;
    const char **text; /* [n] token bytes (not NUL-ended) */
    size_t *len;       /* [n] */
    float *score;      /* [n] */
    size_t *order;     /* ids sorted by text, for lookup */
    int prefix;        /* tokenizer.ggml.add_space_prefix */
} spm;

static const spm *g_sort;

static int cmp_text(const char *a, size_t la, const char *b, size_t lb)
{
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int by_text(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return cmp_text(g_sort->text[x], g_sort->len[x], g_sort->text[y],
                    g_sort->len[y]);
}

/* id of the token s[0..l), or -1 (llama.cpp's text_to_token) */
static long spm_find(const spm *v, const char *s, size_t l)
{
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2, id = v->order[mid];
        int c = cmp_text(v->text[id], v->len[id], s, l);
        if (c == 0)
            return (long)id;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static void spm_open(spm *v, const char *path)
{
    if (tg_open(path, &v->f))
        fail_msg("%s: %s", path, v->f.why);
    const tg_kv *tok = tg_kv_find(&v->f, "tokenizer.ggml.tokens");
    const tg_kv *sc = tg_kv_find(&v->f, "tokenizer.ggml.scores");

    const tg_kv *pre = tg_kv_find(&v->f, "tokenizer.ggml.add_space_prefix");
    assert_non_null(tok);
    assert_non_null(sc);
    assert_non_null(pre);
    assert_int_equal(pre->type, 7); /* bool */
    assert_int_equal(sc->elem, 6);  /* f32 */
    assert_int_equal(sc->n, tok->n);

    v->prefix = pre->val[0];
    v->n = (size_t)tok->n;
    v->text = calloc(v->n, sizeof *v->text);
    v->len = calloc(v->n, sizeof *v->len);
    v->score = calloc(v->n, sizeof *v->score);
    v->order = calloc(v->n, sizeof *v->order);

    const uint8_t *p = tok->val;
    for (size_t i = 0; i < v->n; i++) {
        uint64_t l;
        memcpy(&l, p, 8);
        v->text[i] = (const char *)p + 8;
        v->len[i] = (size_t)l;
        p += 8 + l;
        memcpy(&v->score[i], sc->val + 4 * i, 4);
        v->order[i] = i;
    }
    g_sort = v;
    qsort(v->order, v->n, sizeof *v->order, by_text);
}

static void spm_close(spm *v)
{
    tg_close(&v->f);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->order);
}

/* llama.cpp's SPM tokenization of s[0..l) (no BOS, no special tokens)
 * into ids; returns the count. */
static size_t spm_encode(const spm *v, const char *s, size_t l, int32_t *ids,
                         size_t cap)
{
    if (l == 0)
        return 0; /* llama.cpp makes no fragment of an empty text */
    /* the prefix, then every ' ' escaped as U+2581 (3 bytes) */
    char *t = malloc(3 * l + 4);
    size_t tl = 0;
    for (size_t i = 0; i < l + (size_t)v->prefix; i++) {
        char c = i < (size_t)v->prefix ? ' ' : s[i - (size_t)v->prefix];
        if (c == ' ') {
            memcpy(t + tl, "\xe2\x96\x81", 3);
            tl += 3;
        } else {
            t[tl++] = c;
        }
    }
    /* symbols: UTF-8 characters (llama.cpp's unicode_len_utf8) */
    size_t ns = 0, *off = malloc(tl * sizeof *off);
    size_t *sl = malloc(tl * sizeof *sl);
    for (size_t i = 0; i < tl;) {
        static const int lens[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                     1, 1, 1, 1, 2, 2, 3, 4};
        size_t n = (size_t)lens[(unsigned char)t[i] >> 4];
        if (n > tl - i)
            n = tl - i;
        off[ns] = i;
        sl[ns++] = n;
        i += n;
    }
    /* merge the best pair until none is a token; merged symbols keep the
     * left one's slot, so slot order is text order */
    for (;;) {
        long best = -1;
        float bs = 0;
        for (size_t i = 0; i + 1 < ns; i++) {
            long id = spm_find(v, t + off[i], sl[i] + sl[i + 1]);
            if (id >= 0 && (best < 0 || v->score[id] > bs)) {
                best = (long)i;
                bs = v->score[id];
            }
        }
        if (best < 0)
            break;
        sl[best] += sl[best + 1];
        memmove(off + best + 1, off + best + 2,
                (ns - (size_t)best - 2) * sizeof *off);
        memmove(sl + best + 1, sl + best + 2,
                (ns - (size_t)best - 2) * sizeof *sl);
        ns--;
    }
    size_t n = 0;
    for (size_t i = 0; i < ns; i++) {
        long id = spm_find(v, t + off[i], sl[i]);
        if (id >= 0) {
            if (n < cap)
                ids[n] = (int32_t)id;
            n++;
            continue;
        }
        for (size_t b = 0; b < sl[i]; b++) { /* byte fallback */
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>",
                     (unsigned char)t[off[i] + b]);
            long bid = spm_find(v, hex, 6);
            if (n < cap)
                ids[n] = (int32_t)bid;
            n++;
        }
    }
    free(t);
    free(off);
    free(sl);
    return n;
}

/* ---- export and compare ------------------------------------------------ */

/* The GGUF tokenizer metadata of tokenizer.json text into path; desc and
 * note as the export reports them. */
static void export_tok(const char *text, size_t len, uint32_t vocab,
                       fmt_arch arch, const char *path, char *desc,
                       char *note)
{
    fmt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = vocab;
    cfg.arch = arch;
    cfg.bos_token_id = -1;
    fmt_gguf_writer *w;
    mc_error err;
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    mc_status st = cmp_export_gguf_tokenizer(w, text, len, &cfg, "t", desc,
                                             64, note, 512, &err);
    if (st != MC_OK)
        fail_msg("export: %s", err.message);
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);
}

/* The texts: the hard ones, then the corpus. */
static json_t *texts(void)
{
    json_t *c = json_load_file(DATA "/corpus.json", JSON_ALLOW_NUL,
                               NULL);
    assert_non_null(c);
    for (size_t i = sizeof hard_texts / sizeof *hard_texts; i-- > 0;)
        json_array_insert_new(c, 0, json_string(hard_texts[i]));
    return c;
}

/* How many texts llama.cpp's SPM tokenizer (over the GGUF) splits as our
 * tokenizer.json implementation does; *tried gets how many were compared
 * (texts that start with a space are skipped when skip_leading_space). */
static size_t spm_agreement(const char *json_text, size_t len, uint32_t vocab,
                            int skip_leading_space, size_t *tried,
                            char *note)
{
    char *dir = tu_mkdtemp("extok");
    char *path = tu_fmt("%s/t.gguf", dir);
    char desc[64];
    export_tok(json_text, len, vocab, FMT_ARCH_LLAMA, path, desc, note);
    assert_non_null(strstr(desc, "llama (SPM)"));
    spm v;
    spm_open(&v, path);
    rt_tokenizer *tok;
    mc_error err;
    assert_int_equal(rt_tokenizer_load_memory(json_text, len, "t", &tok, &err),
                     MC_OK);
    json_t *all = texts(), *root = json_loadb(json_text, len, 0, NULL);
    const json_t *adds = json_object_get(root, "added_tokens");
    size_t same = 0, shown = 0;
    *tried = 0;
    int32_t a[4096], b[4096];
    for (size_t i = 0; i < json_array_size(all); i++) {
        const json_t *js = json_array_get(all, i);
        const char *s = json_string_value(js);
        size_t sl = json_string_length(js);
        if (skip_leading_space &&
            (s[0] == ' ' || !strncmp(s, "\xe2\x96\x81", 3)))
            continue;
        /* an added token written in the text is split off before the SPM
         * tokenizer runs, in llama.cpp as in tokenizers: that part is
         * llama.cpp's own, which scripts/export-check runs */
        int added = 0;
        for (size_t k = 0; k < json_array_size(adds); k++) {
            const json_t *c = json_object_get(json_array_get(adds, k),
                                              "content");
            added |= strstr(s, json_string_value(c)) != NULL;
        }
        if (added)
            continue;
        size_t na = spm_encode(&v, s, sl, a, 4096), nb;
        assert_int_equal(rt_tokenizer_encode(tok, s, sl, 0, b, 4096, &nb,
                                             &err), MC_OK);
        (*tried)++;
        if (na == nb && !memcmp(a, b, na * sizeof *a)) {
            same++;
        } else if (shown++ < 3) {
            printf("differs on \"%s\": spm %zu ids, tokenizer.json %zu\n", s,
                   na, nb);
        }
    }
    json_decref(all);
    json_decref(root);
    rt_tokenizer_free(tok);
    spm_close(&v);
    tu_rmtree(dir);
    free(path);
    free(dir);
    return same;
}

/* Mistral's tokenizer.json, rewritten in its older form (normalizer
 * Prepend + Replace, no pre-tokenizer), which is what llama.cpp's
 * add_space_prefix does: every text splits the same, leading spaces
 * included, and nothing goes in the note. */
static void test_export_tok_mistral_legacy_form_splits_as_spm(void **state)
{
    (void)state;
    size_t len;
    char *text = tu_read_file(MISTRAL, &len);
    TU_SKIP_IF(!text, "the Mistral tokenizer is not in ../shared");
    json_t *j = json_loadb(text, len, 0, NULL);
    assert_non_null(j);
    json_object_set_new(j, "normalizer", json_pack(
        "{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
        "normalizers", "type", "Prepend", "prepend", "\xe2\x96\x81", "type",
        "Replace", "pattern", "String", " ", "content", "\xe2\x96\x81"));
    json_object_set_new(j, "pre_tokenizer", json_null());
    char *legacy = json_dumps(j, JSON_COMPACT);
    size_t tried;
    char note[512];
    size_t same = spm_agreement(legacy, strlen(legacy), 32000, 0, &tried,
                                note);
    assert_string_equal(note, ""); /* nothing llama.cpp does differently */
    printf("mistral (legacy form): %zu of %zu texts identical\n", same, tried);
    assert_int_equal(same, tried);
    assert_true(tried > 400);
    free(legacy);
    json_decref(j);
    free(text);
}

/* The same tokenizer as saved by a recent tokenizers (Metaspace,
 * prepend_scheme "first"): no U+2581 is added to a text that starts with a
 * space, where llama.cpp adds one: identical on every other text, and the
 * note says so. */
static void test_export_tok_mistral_metaspace_form_states_the_difference(
    void **state)
{
    (void)state;
    size_t len;
    char *text = tu_read_file(MISTRAL, &len);
    TU_SKIP_IF(!text, "the Mistral tokenizer is not in ../shared");
    size_t tried;
    char note[512];
    size_t same = spm_agreement(text, len, 32000, 1, &tried, note);
    printf("mistral (Metaspace): %zu of %zu texts identical\n", same, tried);
    assert_int_equal(same, tried);
    assert_true(tried > 350);
    assert_non_null(strstr(note, "prepend_scheme \"first\""));
    assert_non_null(strstr(note, "starts with a space"));
    free(text);
}

/* A SentencePiece-style BPE trained by the tokenizers library (not
 * converted from a SentencePiece model) in the legacy form. */
static void test_export_tok_trained_spm_bpe_splits_as_llama_spm(void **state)
{
    (void)state;
    size_t len;
    char *text = tu_read_file(DATA "/spm_legacy.json", &len);
    assert_non_null(text);
    size_t tried;
    char note[512];
    size_t same = spm_agreement(text, len, 1024, 0, &tried, note);
    printf("spm_legacy: %zu of %zu texts identical; note \"%s\"\n", same,
           tried, note);
    assert_int_equal(same, tried);
    /* trained by tokenizers, its merges are not every split of its
     * tokens (none of them changed a text here, but they could) */
    assert_non_null(strstr(note, "splits of a token into two tokens are "
                                 "not merges"));
    /* <extra_0> (normalized) and <tag> (single_word): stated */
    assert_non_null(strstr(note, "2 added tokens (first: '<extra_0>', "
                                 "normalized)"));
    /* its template "<s> $A </s>" adds BOS and EOS: llama.cpp is told so */
    char *dir = tu_mkdtemp("extok");
    char *path = tu_fmt("%s/t.gguf", dir);
    char desc[64];
    export_tok(text, len, 1024, FMT_ARCH_LLAMA, path, desc, note);
    tg_file f;
    assert_int_equal(tg_open(path, &f), 0);
    assert_int_equal(tg_kv_find(&f, "tokenizer.ggml.add_bos_token")->val[0],
                     1);
    assert_int_equal(tg_kv_find(&f, "tokenizer.ggml.add_eos_token")->val[0],
                     1);
    assert_int_equal(tg_kv_find(&f, "tokenizer.ggml.add_space_prefix")->val[0],
                     1);
    tg_close(&f);
    tu_rmtree(dir);
    free(path);
    free(dir);
    free(text);
}

/* Byte-level BPEs: llama.cpp's pre-tokenizer named from the structure,
 * and what llama.cpp does not do stated in the note. */
static void test_export_tok_byte_level_pre_tokenizer_by_structure(void **state)
{
    (void)state;
    static const struct {
        const char *file, *desc, *note;
    } forms[] = {
        {"qwen2", "gpt2 (BPE, pre qwen2)", "normalizer NFC"},
        {"llama3", "gpt2 (BPE, pre llama-bpe)", ""},
        {"gpt2", "gpt2 (BPE, pre gpt-2)", "add_prefix_space"},
        {"smollm", "gpt2 (BPE, pre smollm)", ""},
    };
    char *dir = tu_mkdtemp("extok");
    char *path = tu_fmt("%s/t.gguf", dir);
    for (size_t i = 0; i < sizeof forms / sizeof *forms; i++) {
        char *p = tu_fmt("%s/%s.json", DATA, forms[i].file);
        size_t len;
        char *text = tu_read_file(p, &len);
        assert_non_null(text);
        char desc[64], note[512];
        export_tok(text, len, 1024, FMT_ARCH_LLAMA, path, desc, note);
        if (strncmp(desc, forms[i].desc, strlen(forms[i].desc)))
            fail_msg("%s: %s, want %s", forms[i].file, desc, forms[i].desc);
        if (forms[i].note[0] ? !strstr(note, forms[i].note) : note[0] != 0)
            fail_msg("%s: note \"%s\", want \"%s\"", forms[i].file, note,
                     forms[i].note);
        tg_file f;
        assert_int_equal(tg_open(path, &f), 0);
        assert_non_null(tg_kv_find(&f, "tokenizer.ggml.merges"));
        assert_null(tg_kv_find(&f, "tokenizer.ggml.scores"));
        tg_close(&f);
        /* the same with Qwen2's regex changed: not a pre-tokenizer
         * llama.cpp names, so "default" and a note */
        if (!strcmp(forms[i].file, "qwen2")) {
            json_t *j = json_loadb(text, len, 0, NULL);
            json_t *re = json_object_get(json_object_get(json_array_get(
                json_object_get(json_object_get(j, "pre_tokenizer"),
                                "pretokenizers"), 0), "pattern"), "Regex");
            assert_non_null(re);
            json_string_set(re, "\\p{L}+|\\p{N}+|\\s+|.");
            char *t2 = json_dumps(j, JSON_COMPACT);
            export_tok(t2, strlen(t2), 1024, FMT_ARCH_QWEN2, path, desc,
                       note);
            assert_non_null(strstr(desc, "pre default"));
            assert_non_null(strstr(note, "pre-tokenizer not one llama.cpp"));
            free(t2);
            json_decref(j);
        }
        free(text);
        free(p);
    }
    tu_rmtree(dir);
    free(path);
    free(dir);
}

/* The Mistral tokenizer.json as llama.cpp's SPM vocabulary. */
static void test_export_tokenizer_metadata_from_tokenizer_json(void **state)
{
    (void)state;
    char *tp = tu_fmt("%s/tokenizers/mistral-7b-instruct-v0.1/tokenizer.json",
                      MC_SHARED_DIR);
    size_t len;
    char *text = tu_read_file(tp, &len);
    free(tp);
    TU_SKIP_IF(!text, "the Mistral tokenizer is not in ../shared");
    fmt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 32000;
    cfg.bos_token_id = 1;
    cfg.eos_token_ids[0] = 2;
    cfg.n_eos = 1;
    char *dir = tu_mkdtemp("ext");
    char *p = tu_fmt("%s/t.gguf", dir);
    fmt_gguf_writer *w;
    mc_error err;
    char desc[64], note[512];
    assert_int_equal(fmt_gguf_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(cmp_export_gguf_tokenizer(w, text, len, &cfg, "t", desc,
                                               sizeof desc, note, sizeof note,
                                               &err), MC_OK);
    assert_string_equal(desc, "llama (SPM), 32000 tokens");
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);
    tg_file f;
    assert_int_equal(tg_open(p, &f), 0);
    size_t n;
    const char *m = tg_kv_str(&f, "tokenizer.ggml.model", &n);
    assert_memory_equal(m, "llama", n);
    const tg_kv *tok = tg_kv_find(&f, "tokenizer.ggml.tokens");
    const tg_kv *ty = tg_kv_find(&f, "tokenizer.ggml.token_type");
    const tg_kv *sc = tg_kv_find(&f, "tokenizer.ggml.scores");
    assert_int_equal(tok->n, 32000);
    assert_int_equal(ty->n, 32000);
    assert_int_equal(sc->n, 32000);
    /* walk the strings to ids 0..3 and 13 (<0x0A>) */
    const uint8_t *q = tok->val;
    char got[5][16];
    for (int i = 0; i <= 13; i++) {
        uint64_t l;
        memcpy(&l, q, 8);
        if (i < 4 || i == 13)
            snprintf(got[i < 4 ? i : 4], 16, "%.*s", (int)l, q + 8);
        q += 8 + l;
    }
    assert_string_equal(got[0], "<unk>");
    assert_string_equal(got[1], "<s>");
    assert_string_equal(got[2], "</s>");
    assert_string_equal(got[4], "<0x0A>");
    int32_t types[14];
    memcpy(types, ty->val, sizeof types);
    assert_int_equal(types[0], 2);  /* UNKNOWN */
    assert_int_equal(types[1], 3);  /* CONTROL */
    assert_int_equal(types[13], 6); /* BYTE */
    assert_int_equal(types[3], 6);  /* <0x00> */
    /* the first merge ("▁ t") makes the best-scored token */
    float s28;
    memcpy(&s28, sc->val + 4 * 261, 4); /* id of "▁t" */
    assert_true(s28 == -1.0f);
    assert_int_equal(tg_kv_u32(&f, "tokenizer.ggml.bos_token_id"), 1);
    assert_int_equal(tg_kv_find(&f, "tokenizer.ggml.add_bos_token")->val[0],
                     1);
    assert_int_equal(tg_kv_find(&f, "tokenizer.ggml.add_eos_token")->val[0],
                     0);
    tg_close(&f);
    /* a vocabulary smaller than the tokenizer's ids is refused */
    cfg.vocab_size = 1000;
    assert_int_equal(fmt_gguf_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(cmp_export_gguf_tokenizer(w, text, len, &cfg, "t", desc,
                                               sizeof desc, note, sizeof note,
                                               &err),
                     MC_ERR_SHAPE);
    assert_non_null(strstr(err.message, "outside the model's vocabulary"));
    fmt_gguf_abort(w);
    free(text);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_tok_mistral_legacy_form_splits_as_spm),
        cmocka_unit_test(
            test_export_tok_mistral_metaspace_form_states_the_difference),
        cmocka_unit_test(test_export_tok_trained_spm_bpe_splits_as_llama_spm),
        cmocka_unit_test(test_export_tok_byte_level_pre_tokenizer_by_structure),
        cmocka_unit_test(test_export_tokenizer_metadata_from_tokenizer_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

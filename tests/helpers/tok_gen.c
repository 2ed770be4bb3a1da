/* tok_gen.c - see tok_gen.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tok_gen.h"


/* Pieces after <unk> <s> </s> and the 256 <0xNN> tokens: ids 259.. */
static const char *const SPM_PIECES[] = {
    MS, "a", "b", "c", "h", "e", "l", "o", MS "h", "ll", MS "he", MS "hell",
    MS "hello", "\xC3\xA9", "ab", MS "a", MS MS};
static const char *const SPM_MERGES[][2] = {
    {MS, MS}, {MS, "h"}, {"l", "l"}, {MS "h", "e"}, {MS "he", "ll"},
    {MS "hell", "o"}, {"a", "b"}, {MS, "a"}};

static json_t *merges_json(const char *const (*m)[2], size_t n, int pairs)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (pairs) {
            json_array_append_new(arr, json_pack("[ss]", m[i][0], m[i][1]));
        } else {
            char *s = tu_fmt("%s %s", m[i][0], m[i][1]);
            json_array_append_new(arr, json_string(s));
            free(s);
        }
    }
    return arr;
}

static json_t *added_json(const char *content, int id, int special)
{
    return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content",
                     content, "single_word", 0, "lstrip", 0, "rstrip", 0,
                     "normalized", 0, "special", special);
}

char *tu_tok_spm_json(const tu_spm_opts *o)
{
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, "<s>", json_integer(1));
    json_object_set_new(vocab, "</s>", json_integer(2));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(3 + b));
    }
    for (size_t i = 0; i < sizeof SPM_PIECES / sizeof *SPM_PIECES; i++)
        json_object_set_new(vocab, SPM_PIECES[i], json_integer(259 + (int)i));
    json_t *model = json_pack(
        "{s:s,s:n,s:s,s:n,s:n,s:b,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout",
        "unk_token", "<unk>", "continuing_subword_prefix", "end_of_word_suffix",
        "fuse_unk", o->fuse_unk, "byte_fallback", o->byte_fallback,
        "ignore_merges", 0, "vocab", vocab, "merges",
        merges_json(SPM_MERGES, sizeof SPM_MERGES / sizeof *SPM_MERGES,
                    o->pair_merges));
    json_t *added = json_pack("[o,o,o]", added_json("<unk>", 0, 1),
                              added_json("<s>", 1, 1), added_json("</s>", 2, 1));
    json_t *norm, *pre;
    if (o->legacy) {
        norm = json_pack("{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]}", "type",
                         "Sequence", "normalizers", "type", "Prepend",
                         "prepend", MS, "type", "Replace", "pattern", "String",
                         " ", "content", MS);
        pre = json_null();
    } else {
        norm = json_null();
        pre = json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace",
                        "replacement", MS, "prepend_scheme",
                        o->scheme ? o->scheme : "first", "split", o->split);
    }
    json_t *dec = json_pack(
        "{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type",
        "Sequence", "decoders", "type", "Replace", "pattern", "String", MS,
        "content", " ", "type", "ByteFallback", "type", "Fuse", "type",
        "Strip", "content", " ", "start", 1, "stop", 0);
    json_t *post = json_pack(
        "{s:s,s:[{s:{s:s,s:i}},{s:{s:s,s:i}}],s:{s:{s:s,s:[i],s:[s]}}}",
        "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
        "type_id", 0, "Sequence", "id", "A", "type_id", 0, "special_tokens",
        "<s>", "id", "<s>", "ids", 1, "tokens", "<s>");
    json_t *root = json_pack("{s:s,s:n,s:n,s:o,s:o,s:o,s:o,s:o,s:o}",
                             "version", "1.0", "truncation", "padding",
                             "added_tokens", added, "normalizer", norm,
                             "pre_tokenizer", pre, "post_processor", post,
                             "decoder", dec, "model", model);
    assert_non_null(root);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

/* GPT-2's byte -> char map (written independently of the library). */
static void byte_char(int b, char out[4])
{
    int n = 0, cp;
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
               (b >= 174 && b <= 255);
    if (keep) {
        cp = b;
    } else {
        cp = 256;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) ||
                  (x >= 174 && x <= 255)))
                cp++;
    }
    if (cp < 0x80) {
        out[n++] = (char)cp;
    } else {
        out[n++] = (char)(0xC0 | (cp >> 6));
        out[n++] = (char)(0x80 | (cp & 0x3F));
    }
    out[n] = '\0';
}

static const char *const BL_PIECES[] = {"\xC4\xA0t", "he", "\xC4\xA0the",
                                        "is", "\xC4\xA0is", "this"};
static const char *const BL_MERGES[][2] = {
    {"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"i", "s"},
    {"\xC4\xA0", "is"}};

/* split: 0 ByteLevel(use_regex) alone; 1 Split(Llama-3 regex)+ByteLevel */
char *tu_tok_bl_json(int split, int pair_merges, int ignore_merges)
{
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char c[4];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    for (size_t i = 0; i < sizeof BL_PIECES / sizeof *BL_PIECES; i++)
        json_object_set_new(vocab, BL_PIECES[i], json_integer(256 + (int)i));
    json_t *model = json_pack(
        "{s:s,s:n,s:n,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout",
        "unk_token", "byte_fallback", 0, "ignore_merges", ignore_merges,
        "vocab", vocab, "merges",
        merges_json(BL_MERGES, sizeof BL_MERGES / sizeof *BL_MERGES,
                    pair_merges));
    json_t *pre;
    if (split)
        pre = json_pack(
            "{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type",
            "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
            "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+",
            "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
            "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
    else
        pre = json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel",
                        "add_prefix_space", 0, "trim_offsets", 1, "use_regex",
                        1);
    json_t *root = json_pack(
        "{s:[o],s:n,s:o,s:{s:s},s:{s:s,s:b,s:b},s:o}", "added_tokens",
        added_json("<|endoftext|>", B_EOT, 1), "normalizer", "pre_tokenizer",
        pre, "post_processor", "type", "ByteLevel", "decoder", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "model", model);
    assert_non_null(root);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

rt_tokenizer *tu_tok_load_text(const char *json)
{
    rt_tokenizer *t = NULL;
    mc_error e;
    mc_status r = rt_tokenizer_load_memory(json, strlen(json), "gen.json", &t,
                                           &e);
    if (r) {
        char buf[1600];
        print_error("load: %s\n", mc_error_format(&e, buf, sizeof buf));
    }
    assert_int_equal(r, MC_OK);
    return t;
}

rt_tokenizer *tu_tok_load_spm(tu_spm_opts o)
{
    char *s = tu_tok_spm_json(&o);
    rt_tokenizer *t = tu_tok_load_text(s);
    free(s);
    return t;
}

rt_tokenizer *tu_tok_load_bl(int split, int pairs, int ignore)
{
    char *s = tu_tok_bl_json(split, pairs, ignore);
    rt_tokenizer *t = tu_tok_load_text(s);
    free(s);
    return t;
}

void tu_tok_expect_ids(const rt_tokenizer *t, const char *text, int special,
                       const int32_t *want, size_t n_want)
{
    int32_t ids[512];
    size_t n = 0;
    mc_error e;
    assert_int_equal(rt_tokenizer_encode(t, text, strlen(text), special, ids,
                                         512, &n, &e), MC_OK);
    int same = n == n_want &&
               (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same) {
        print_error("encode(\"%s\"): got", text);
        for (size_t i = 0; i < n; i++)
            print_error(" %d", ids[i]);
        print_error(", want");
        for (size_t i = 0; i < n_want; i++)
            print_error(" %d", want[i]);
        print_error("\n");
    }
    assert_true(same);
}

/* decode(encode(text)) == want (text itself when want is NULL).  skip:
 * encode with add_special and decode with skip_special; else neither. */
void tu_tok_expect_round_trip_skip(const rt_tokenizer *t, const char *text,
                                   size_t len, const char *want,
                                   size_t want_len, int skip)
{
    size_t cap = 4 * len + 16, n = 0, out_len = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    char *out = malloc(4 * len + 64);
    assert_int_equal(rt_tokenizer_encode(t, text, len, skip, ids, cap, &n,
                                         NULL), MC_OK);
    assert_int_equal(rt_tokenizer_decode(t, ids, n, skip, out, 4 * len + 64,
                                         &out_len), MC_OK);
    if (!want) {
        want = text;
        want_len = len;
    }
    if (out_len != want_len || memcmp(out, want, want_len) != 0)
        print_error("round trip of \"%.*s\" gave \"%.*s\"\n", (int)len, text,
                    (int)out_len, out);
    assert_int_equal(out_len, want_len);
    assert_memory_equal(out, want, want_len);
    free(ids);
    free(out);
}
void tu_tok_expect_round_trip(const rt_tokenizer *t, const char *text,
                              size_t len, const char *want, size_t want_len)
{
    tu_tok_expect_round_trip_skip(t, text, len, want, want_len, 1);
}

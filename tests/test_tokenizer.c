/*
 * test_tokenizer.c - rt_tokenizer on small generated tokenizer.json files
 * (helpers/tok_gen.c; answers worked out by hand from their merges): the
 * SentencePiece and byte-level pipelines, the Split regexes, the API
 * contract, malformed files, allocation failures and the sibling
 * tokenizer_config.json.  The real Mistral tokenizer is
 * test_tokenizer_mistral.c's.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_tok_regex.h" /* the Split machinery, tested directly */
#include "rt_tokenizer.h"
#include "testutil.h"
#include "tok_gen.h"

/* ---- SentencePiece-style ----------------------------------------------- */

static void test_spm_metaspace_known_answers(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1});
    EXPECT(t, "hello", 0, S_SPHELLO);
    EXPECT(t, "hello", 1, 1, S_SPHELLO);
    EXPECT(t, "hell", 0, S_SPHELL);
    /* "a b" (rank 6) merges before "▁ a" (rank 7) */
    EXPECT(t, "ab a", 0, S_SP, S_AB, S_SPA);
    /* "▁ ▁" has rank 0: split=false lets it win */
    EXPECT(t, "a  a", 0, S_SPA, S_SPSP, S_A);
    tu_tok_expect_ids(t, "", 0, NULL, 0);
    size_t n = 99;
    assert_int_equal(rt_tokenizer_encode(t, "", 0, 0, NULL, 0, &n, NULL),
                     MC_OK);
    assert_int_equal(n, 0);
    EXPECT(t, "", 1, 1);
    assert_int_equal(rt_tokenizer_vocab_size(t), 276);
    assert_int_equal(rt_tokenizer_bos(t), 1);
    assert_int_equal(rt_tokenizer_eos(t), 2);
    assert_int_equal(rt_tokenizer_token_to_id(t, MS "hello", 8), S_SPHELLO);
    assert_int_equal(rt_tokenizer_token_to_id(t, "</s>", 4), 2);
    assert_int_equal(rt_tokenizer_token_to_id(t, "zz", 2), -1);
    size_t len;
    const char *p = rt_tokenizer_id_to_token(t, S_LL, &len);
    assert_non_null(p);
    assert_int_equal(len, 2);
    assert_memory_equal(p, "ll", 2);
    assert_null(rt_tokenizer_id_to_token(t, 276, &len));
    assert_true(rt_tokenizer_is_special(t, 1));
    assert_false(rt_tokenizer_is_special(t, S_A));
    rt_tokenizer_free(t);
}

static void test_spm_legacy_normalizer_known_answers(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.legacy = 1, .pair_merges = 1,
                                          .byte_fallback = 1});
    EXPECT(t, "hello", 1, 1, S_SPHELLO);
    EXPECT(t, "ab a", 0, S_SP, S_AB, S_SPA);
    /* Prepend is unconditional: " hello" -> "▁▁hello" */
    EXPECT(t, " hello", 0, S_SPSP, S_H, S_E, S_LL, S_O);
    /* the legacy form prepends to every segment between added tokens */
    EXPECT(t, "hello</s>hello", 0, S_SPHELLO, 2, S_SPHELLO);
    ROUND_TRIP(t, "hello ab");
    rt_tokenizer_free(t);
}

static void test_spm_merge_encodings_agree(void **state)
{
    (void)state;
    const char *texts[] = {"hello", "ab a", "a  a", "hell o", "h\xC3\xA9!",
                           "  hello  ", "abcabc"};
    for (int legacy = 0; legacy < 2; legacy++) {
        rt_tokenizer *a = tu_tok_load_spm((tu_spm_opts){.legacy = legacy,
                                              .byte_fallback = 1});
        rt_tokenizer *b = tu_tok_load_spm((tu_spm_opts){.legacy = legacy,
                                              .pair_merges = 1,
                                              .byte_fallback = 1});
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            int32_t x[64], y[64];
            size_t nx, ny;
            assert_int_equal(rt_tokenizer_encode(a, texts[i], strlen(texts[i]),
                                                 1, x, 64, &nx, NULL), MC_OK);
            assert_int_equal(rt_tokenizer_encode(b, texts[i], strlen(texts[i]),
                                                 1, y, 64, &ny, NULL), MC_OK);
            assert_int_equal(nx, ny);
            assert_memory_equal(x, y, nx * sizeof *x);
        }
        rt_tokenizer_free(a);
        rt_tokenizer_free(b);
    }
}

static void test_spm_byte_fallback_and_decode(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1});
    /* é is a piece, '!' is not: <0x21> = 3 + 0x21 */
    EXPECT(t, "h\xC3\xA9!", 0, S_SPH, S_EACUTE, 3 + 0x21);
    /* U+1F600 F0 9F 98 80 */
    EXPECT(t, "h\xF0\x9F\x98\x80", 0, S_SPH, 3 + 0xF0, 3 + 0x9F, 3 + 0x98,
           3 + 0x80);
    const int32_t ids[] = {1, S_SPH, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80,
                           S_SP, S_A, 2};
    char buf[64];
    size_t len;
    assert_int_equal(rt_tokenizer_decode(t, ids, 9, 1, buf, sizeof buf, &len),
                     MC_OK);
    assert_string_equal(buf, "h\xF0\x9F\x98\x80 a");
    assert_int_equal(len, strlen(buf));
    /* not skipping specials: they pass through the decoder unchanged */
    assert_int_equal(rt_tokenizer_decode(t, ids, 9, 0, buf, sizeof buf, &len),
                     MC_OK);
    assert_string_equal(buf, "<s> h\xF0\x9F\x98\x80 a</s>");
    ROUND_TRIP(t, "hello world, \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80!");
    ROUND_TRIP(t, "tab\tnew\nline \x01\x7F");
    /* invalid UTF-8 survives through byte fallback */
    tu_tok_expect_round_trip(t, "a\xFF\xC3(b", 6, NULL, 0);
    rt_tokenizer_free(t);
}

static void test_spm_special_tokens_split(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1});
    /* prepend_scheme "first": only the segment at offset 0 gets "▁" */
    EXPECT(t, "hello</s>hello", 1, 1, S_SPHELLO, 2, S_H, S_E, S_LL, S_O);
    EXPECT(t, "<s>hello", 0, 1, S_H, S_E, S_LL, S_O);
    /* longest match first, and a partial special is plain text */
    EXPECT(t, "</s", 0, S_SP, 3 + '<', 3 + '/', 3 + 's');
    ROUND_TRIP_SPECIAL(t, "hello</s>hello");
    rt_tokenizer_free(t);

    t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1, .scheme = "always"});
    EXPECT(t, "hello</s>hello", 0, S_SPHELLO, 2, S_SPHELLO);
    rt_tokenizer_free(t);
    t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1, .scheme = "never"});
    EXPECT(t, "hello", 0, S_H, S_E, S_LL, S_O);
    rt_tokenizer_free(t);
}

static void test_spm_metaspace_split_true_cuts_words(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1, .split = 1});
    /* pieces "▁a", "▁", "▁a": "▁ ▁" can no longer merge */
    EXPECT(t, "a  a", 0, S_SPA, S_SP, S_SPA);
    EXPECT(t, "hello hell", 0, S_SPHELLO, S_SPHELL);
    rt_tokenizer_free(t);
}

static void test_spm_unknown_chars_use_unk(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.fuse_unk = 1});
    EXPECT(t, "h!!", 0, S_SPH, 0);
    EXPECT(t, "!h!", 0, S_SP, 0, S_H, 0);
    rt_tokenizer_free(t);
    t = tu_tok_load_spm((tu_spm_opts){.fuse_unk = 0});
    EXPECT(t, "h!!", 0, S_SPH, 0, 0);
    rt_tokenizer_free(t);
}

/* ---- byte-level -------------------------------------------------------- */

static void test_bytelevel_known_answers(void **state)
{
    (void)state;
    for (int split = 0; split < 2; split++) {
        rt_tokenizer *t = tu_tok_load_bl(split, split, 0);
        EXPECT(t, "the is", 0, 't', B_HE, B_GIS);
        EXPECT(t, " the", 1, B_GTHE);
        EXPECT(t, "this", 0, 't', 'h', B_IS);
        EXPECT(t, "Hi\xF0\x9F\x98\x80", 0, 'H', 'i', 0xF0, 0x9F, 0x98, 0x80);
        EXPECT(t, "the<|endoftext|> is", 0, 't', B_HE, B_EOT, B_GIS);
        assert_int_equal(rt_tokenizer_bos(t), -1);
        assert_int_equal(rt_tokenizer_eos(t), B_EOT);
        assert_int_equal(rt_tokenizer_token_to_id(t, "\xC4\xA0the", 5), B_GTHE);
        rt_tokenizer_free(t);
    }
}

static void test_bytelevel_ignore_merges_takes_whole_words(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_bl(1, 0, 1);
    EXPECT(t, "this", 0, B_THIS);
    /* "Ġthis" is no token: ordinary merges */
    EXPECT(t, " this", 0, B_GT, 'h', B_IS);
    rt_tokenizer_free(t);
}

static void test_bytelevel_round_trips(void **state)
{
    (void)state;
    for (int split = 0; split < 2; split++) {
        rt_tokenizer *t = tu_tok_load_bl(split, 0, 0);
        ROUND_TRIP(t, "The quick brown fox, isn't it?  42 + 7\n\n\tend ");
        ROUND_TRIP(t, "na\xC3\xAFve caf\xC3\xA9 \xCE\xB1\xCE\xB2\xCE\xB3");
        ROUND_TRIP(t, "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE "
                      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\xA0\x9C\x8E");
        ROUND_TRIP_SPECIAL(t, "the<|endoftext|>the");
        tu_tok_expect_round_trip(t, "\x00\xFF\xC3(\x80", 5, NULL, 0);
        /* skip_special drops the special token */
        tu_tok_expect_round_trip(t, "a<|endoftext|>b", 15, "ab", 2);
        rt_tokenizer_free(t);
    }
}

/* ---- split regexes ----------------------------------------------------- */

static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Cut text with an Oniguruma-flavoured pattern and behaviour, as a Split
 * pre-tokenizer does; the pieces must be want[]. */
static void expect_cut(const char *pattern, int invert, int behaviour,
                       const char *text, const char *const *want,
                       size_t n_want)
{
    rt_tok_re *re = NULL;
    char why[256];
    assert_int_equal(rt_tok_re_compile(pattern, strlen(pattern), RT_RE_ONIG,
                                       &re, why, sizeof why),
                     MC_OK);
    rt_tok_re_scratch *sc = rt_tok_re_scratch_new();
    assert_non_null(sc);
    rt_tok_span *sp = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(rt_tok_re_split(re, NULL, 0, invert, behaviour, sc,
                                     (const uint8_t *)text, strlen(text), &sp,
                                     &n, &cap),
                     MC_OK);
    for (size_t k = 0; k < n; k++) {
        size_t m = sp[k].end - sp[k].start;
        if (k >= n_want || strlen(want[k]) != m ||
            memcmp(want[k], text + sp[k].start, m) != 0)
            print_error("/%s/ on \"%s\": piece %zu is \"%.*s\"\n", pattern,
                        text, k, (int)m, text + sp[k].start);
        assert_true(k < n_want);
        assert_int_equal(strlen(want[k]), m);
    }
    assert_int_equal(n, n_want);
    free(sp);
    rt_tok_re_scratch_free(sc);
    rt_tok_re_free(re);
}
#define CUT(p, inv, beh, text, ...)                                            \
    do {                                                                       \
        const char *const w_[] = {__VA_ARGS__};                                \
        expect_cut(p, inv, beh, text, w_, sizeof w_ / sizeof *w_);             \
    } while (0)
#define SPLIT(p, text, ...) CUT(p, 0, RT_SPLIT_ISOLATED, text, __VA_ARGS__)

static void test_split_patterns_match_regex_semantics(void **state)
{
    (void)state;
    SPLIT(PAT_GPT2, "Hello world  123 it's!!", "Hello", " world", " ",
          " 123", " it", "'s", "!!");
    SPLIT(PAT_GPT2, "A'S  \n x ", "A", "'", "S", "  \n", " x", " ");
    SPLIT(PAT_GPT2, "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC",
          "caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC");
    SPLIT(PAT_LLAMA3, "Hello world  12345 IT'S\n\n  x", "Hello", " world",
          " ", " ", "123", "45", " IT", "'S", "\n\n", " ", " x");
    SPLIT(PAT_LLAMA3, "(ok)...\r\n!x", "(ok", ")...\r\n", "!x");
    SPLIT(PAT_QWEN2, "x 2024", "x", " ", "2", "0", "2", "4");
    /* U+0085 is White_Space (Oniguruma's \s), not PCRE2's \s */
    SPLIT("\\s+", "a\xC2\x85" "b", "a", "\xC2\x85", "b");
}

static void test_split_behaviours_match_tokenizers(void **state)
{
    (void)state;
    /* the examples of tokenizers' normalizer.rs tests */
    const char *text = "The-final--countdown";
    CUT("-", 0, RT_SPLIT_REMOVED, text, "The", "final", "countdown");
    CUT("-", 0, RT_SPLIT_ISOLATED, text, "The", "-", "final", "-", "-",
        "countdown");
    CUT("-", 0, RT_SPLIT_MERGED_PREV, text, "The-", "final-", "-",
        "countdown");
    CUT("-", 0, RT_SPLIT_MERGED_NEXT, text, "The", "-final", "-",
        "-countdown");
    CUT("-", 0, RT_SPLIT_CONTIGUOUS, text, "The", "-", "final", "--",
        "countdown");
    CUT("-", 1, RT_SPLIT_REMOVED, text, "-", "-", "-");
    CUT("-+", 1, RT_SPLIT_ISOLATED, text, "The", "-", "final", "--",
        "countdown");
    /* empty matches right after a match are skipped, as Rust's find_iter */
    CUT("x*", 0, RT_SPLIT_ISOLATED, "axxb", "a", "xx", "b");
}

static void test_regex_refuses_what_it_cannot_translate(void **state)
{
    (void)state;
    static const char *const bad[] = {"\\bword\\b", "[\\W]", "(?m:.)",
                                      "[a-z&&[^aeiou]]", "\\h+", "(unclosed"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        rt_tok_re *re = NULL;
        char why[256] = "";
        assert_int_equal(rt_tok_re_compile(bad[i], strlen(bad[i]), RT_RE_ONIG,
                                           &re, why, sizeof why),
                         MC_ERR_UNSUPPORTED);
        assert_null(re);
        assert_true(strlen(why) > 10);
    }
}

/* ---- API contract ------------------------------------------------------ */

static void test_encode_reports_needed_size(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1});
    int32_t ids[2];
    size_t n = 0;
    mc_error e;
    assert_int_equal(rt_tokenizer_encode(t, "ab a", 4, 1, ids, 2, &n, &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(n, 4);
    assert_non_null(strstr(e.message, "4 ids"));
    assert_int_equal(rt_tokenizer_encode(t, "ab a", 4, 1, NULL, 0, &n, NULL),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(n, 4);
    assert_int_equal(rt_tokenizer_encode(t, NULL, 3, 1, NULL, 0, &n, NULL),
                     MC_ERR_INVALID_ARG);
    rt_tokenizer_free(t);
}

/* A normalizer that grows the text exponentially (chained Replace "a" ->
 * "aa") is refused at encode, by name, after bounded work; a normal
 * growth (" " -> a 3-byte character, every character) encodes. */
static void test_encode_refuses_runaway_normalizer(void **state)
{
    (void)state;
    char json[4096];
    int o = snprintf(json, sizeof json,
                     "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
                     "\"b\":1}},\"normalizer\":{\"type\":\"Sequence\","
                     "\"normalizers\":[");
    for (int i = 0; i < 40; i++)
        o += snprintf(json + o, sizeof json - (size_t)o,
                      "%s{\"type\":\"Replace\",\"pattern\":{\"String\":"
                      "\"a\"},\"content\":\"aa\"}", i ? "," : "");
    snprintf(json + o, sizeof json - (size_t)o, "]}}");
    rt_tokenizer *t = NULL;
    mc_error e;
    assert_int_equal(rt_tokenizer_load_memory(json, strlen(json), "t", &t, &e),
                     MC_OK);
    size_t n = 0;
    assert_int_equal(rt_tokenizer_encode(t, "ab", 2, 0, NULL, 0, &n, &e),
                     MC_ERR_OVERFLOW);
    assert_string_equal(e.field, "normalizer");
    assert_non_null(strstr(e.message, "grow the text"));
    rt_tokenizer_free(t);
    /* one step with a long replacement is stopped before it is built */
    char *big = malloc(12000);
    assert_non_null(big);
    o = snprintf(big, 12000, "{\"model\":{\"type\":\"BPE\",\"vocab\":{"
                 "\"a\":0}},\"normalizer\":{\"type\":\"Replace\","
                 "\"pattern\":{\"String\":\"a\"},\"content\":\"");
    for (int i = 0; i < 5000; i++)
        big[o++] = 'a';
    snprintf(big + o, 12000 - (size_t)o, "\"}}");
    assert_int_equal(rt_tokenizer_load_memory(big, strlen(big), "t", &t, &e),
                     MC_OK);
    char text[101];
    memset(text, 'a', 100);
    text[100] = '\0';
    assert_int_equal(rt_tokenizer_encode(t, text, 100, 0, NULL, 0, &n, &e),
                     MC_ERR_OVERFLOW);
    rt_tokenizer_free(t);
    free(big);
    const char *ok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,"
                     "\"\\u2581\":1}},\"normalizer\":{\"type\":\"Replace\","
                     "\"pattern\":{\"String\":\"a\"},\"content\":"
                     "\"\\u2581\"}}";
    assert_int_equal(rt_tokenizer_load_memory(ok, strlen(ok), "t", &t, &e),
                     MC_OK);
    assert_int_equal(rt_tokenizer_encode(t, "aaaa", 4, 0, NULL, 0, &n, &e),
                     MC_ERR_INVALID_ARG); /* a size query: n ids needed */
    assert_int_equal(n, 4);
    rt_tokenizer_free(t);
}

static void test_decode_checks_ids_and_size(void **state)
{
    (void)state;
    rt_tokenizer *t = tu_tok_load_spm((tu_spm_opts){.byte_fallback = 1});
    const int32_t ok[] = {S_SPHELLO, S_SPA};
    char buf[8];
    size_t len = 0;
    assert_int_equal(rt_tokenizer_decode(t, ok, 2, 0, NULL, 0, &len),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(len, 7); /* "hello a" */
    assert_int_equal(rt_tokenizer_decode(t, ok, 2, 0, buf, 7, &len),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(len, 7);
    assert_int_equal(rt_tokenizer_decode(t, ok, 2, 0, buf, 8, &len), MC_OK);
    assert_string_equal(buf, "hello a");
    const int32_t bad1[] = {5, -1}, bad2[] = {276};
    assert_int_equal(rt_tokenizer_decode(t, bad1, 2, 0, buf, 8, &len),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(rt_tokenizer_decode(t, bad2, 1, 0, buf, 8, &len),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(rt_tokenizer_decode(t, NULL, 0, 0, buf, 8, &len), MC_OK);
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    rt_tokenizer_free(t);
    rt_tokenizer_free(NULL);
}

/* ---- malformed files --------------------------------------------------- */

#define V "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"
#define M(extra) "{\"model\":{\"type\":\"BPE\"," V extra "}}"
#define R(extra) "{\"model\":{\"type\":\"BPE\"," V "}," extra "}"
static const struct bad_case {
    const char *json;
    mc_status status;
    const char *field; /* exact err.field */
} BAD[] = {
    {"{", MC_ERR_FORMAT, ""},
    {"[]", MC_ERR_FORMAT, ""},
    {"{}", MC_ERR_FORMAT, "model"},
    {"{\"model\":{\"vocab\":[]}}", MC_ERR_FORMAT, "model.vocab"},
    {"{\"model\":{\"vocab\":{}}}", MC_ERR_FORMAT, "model.vocab"},
    {"{\"model\":{\"vocab\":{\"a\":\"0\"}}}", MC_ERR_FORMAT, "model.vocab[\"a\"]"},
    {"{\"model\":{\"vocab\":{\"a\":-1}}}", MC_ERR_FORMAT, "model.vocab[\"a\"]"},
    {"{\"model\":{\"vocab\":{\"a\":99999999999}}}", MC_ERR_FORMAT, "model.vocab[\"a\"]"},
    {"{\"model\":{\"vocab\":{\"a\":5000}}}", MC_ERR_FORMAT, "model.vocab"},
    {"{\"model\":{\"vocab\":{\"a\":0,\"b\":0}}}", MC_ERR_FORMAT, "model.vocab[\"b\"]"},
    {"{\"model\":{\"vocab\":{\"a\":0,\"a\":1}}}", MC_ERR_FORMAT, ""},
    {M(",\"merges\":[\"a c\"]"), MC_ERR_FORMAT, "model.merges[0]"},
    {M(",\"merges\":[\"a b\",\"b a\"]"), MC_ERR_FORMAT, "model.merges[1]"},
    {M(",\"merges\":[\"ab\"]"), MC_ERR_FORMAT, "model.merges[0]"},
    {M(",\"merges\":[\"a  b\"]"), MC_ERR_FORMAT, "model.merges[0]"},
    {M(",\"merges\":[[\"a\"]]"), MC_ERR_FORMAT, "model.merges[0]"},
    {M(",\"merges\":[[\"a\",2]]"), MC_ERR_FORMAT, "model.merges[0]"},
    {M(",\"merges\":\"a b\""), MC_ERR_FORMAT, "model.merges"},
    {"{\"model\":{\"type\":\"WordPiece\"," V "}}", MC_ERR_UNSUPPORTED, "model.type"},
    {M(",\"unk_token\":\"<zz>\""), MC_ERR_FORMAT, "model.unk_token"},
    {M(",\"unk_token\":7"), MC_ERR_FORMAT, "model.unk_token"},
    {M(",\"byte_fallback\":\"yes\""), MC_ERR_FORMAT, "model.byte_fallback"},
    {M(",\"dropout\":0.1"), MC_ERR_UNSUPPORTED, "model.dropout"},
    {M(",\"continuing_subword_prefix\":\"##\""), MC_ERR_UNSUPPORTED, "model"},
    {R("\"added_tokens\":{}"), MC_ERR_FORMAT, "added_tokens"},
    {R("\"added_tokens\":[{\"id\":3,\"content\":\"\"}]"), MC_ERR_FORMAT,
     "added_tokens[0].content"},
    {R("\"added_tokens\":[{\"id\":\"3\",\"content\":\"x\"}]"), MC_ERR_FORMAT,
     "added_tokens[0].id"},
    {R("\"added_tokens\":[{\"id\":3,\"content\":\"x\",\"special\":1}]"),
     MC_ERR_FORMAT, "added_tokens[0].special"},
    {R("\"added_tokens\":[{\"id\":3,\"content\":\"x\"},{\"id\":3,\"content\":\"y\"}]"),
     MC_ERR_FORMAT, "added_tokens[1]"},
    {R("\"pre_tokenizer\":{\"type\":\"UnicodeScripts\"}"), MC_ERR_UNSUPPORTED,
     "pre_tokenizer"},
    {R("\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\bx\"},"
       "\"behavior\":\"Isolated\",\"invert\":false}"), MC_ERR_UNSUPPORTED,
     "pre_tokenizer"},
    {R("\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(x\"},"
       "\"behavior\":\"Isolated\",\"invert\":false}"), MC_ERR_UNSUPPORTED,
     "pre_tokenizer"},
    {R("\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},"
       "\"behavior\":\"Sideways\"}"), MC_ERR_FORMAT, "pre_tokenizer.behavior"},
    {R("\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":1}"),
     MC_ERR_FORMAT, "pre_tokenizer.individual_digits"},
    {R("\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}"),
     MC_ERR_FORMAT, "pre_tokenizer.replacement"},
    {R("\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\","
       "\"prepend_scheme\":\"sometimes\"}"), MC_ERR_FORMAT,
     "pre_tokenizer.prepend_scheme"},
    {R("\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":{}}"),
     MC_ERR_FORMAT, "pre_tokenizer.pretokenizers"},
    {R("\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[7]}"),
     MC_ERR_FORMAT, "pre_tokenizer.pretokenizers[0]"},
    {R("\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"use_regex\":0}"),
     MC_ERR_FORMAT, "pre_tokenizer.use_regex"},
    {R("\"normalizer\":{\"type\":\"Precompiled\"}"), MC_ERR_UNSUPPORTED,
     "normalizer"},
    {R("\"normalizer\":{\"type\":\"Strip\",\"strip_left\":\"yes\"}"),
     MC_ERR_FORMAT, "normalizer.strip_left"},
    {R("\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"[\\\\W]\"},"
       "\"content\":\"\"}"), MC_ERR_UNSUPPORTED, "normalizer"},
    {R("\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"}}"),
     MC_ERR_FORMAT, "normalizer.content"},
    {R("\"normalizer\":{\"type\":\"Replace\",\"pattern\":\" \",\"content\":\"x\"}"),
     MC_ERR_FORMAT, "normalizer.pattern"},
    {R("\"decoder\":{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}"),
     MC_ERR_FORMAT, "decoder.start"},
    {R("\"decoder\":5"), MC_ERR_FORMAT, "decoder"},
    {R("\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"CTC\"}]}"),
     MC_ERR_UNSUPPORTED, "decoder.decoders[0]"},
    {R("\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
       "[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],"
       "\"special_tokens\":{}}"), MC_ERR_FORMAT, "post_processor.single[0]"},
    {R("\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[]}"),
     MC_ERR_FORMAT, "post_processor.single"},
    {R("\"post_processor\":{\"type\":\"BertProcessing\"}"), MC_ERR_UNSUPPORTED,
     "post_processor"},
};

static void test_tokenizer_rejects_malformed_files(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        rt_tokenizer *t = (rt_tokenizer *)1;
        mc_error e;
        mc_error_clear(&e);
        mc_status r = rt_tokenizer_load_memory(BAD[i].json, strlen(BAD[i].json),
                                               "bad.json", &t, &e);
        if (r != BAD[i].status || strcmp(e.field, BAD[i].field) != 0)
            print_error("case %zu (%s): status %d field '%s' message '%s'\n",
                        i, BAD[i].json, r, e.field, e.message);
        assert_int_equal(r, BAD[i].status);
        assert_string_equal(e.field, BAD[i].field);
        assert_string_equal(e.file, "bad.json");
        assert_true(strlen(e.message) > 0);
        assert_null(t);
    }
    /* the minimal valid file loads */
    rt_tokenizer *t = NULL;
    const char *ok = M(",\"merges\":[\"a b\"]");
    assert_int_equal(rt_tokenizer_load_memory(ok, strlen(ok), NULL, &t, NULL),
                     MC_OK);
    EXPECT(t, "abab", 0, 2, 2);
    /* no decoder: tokens are joined with spaces, as in HF */
    const int32_t ids[] = {2, 0, 1};
    char buf[16];
    size_t len;
    assert_int_equal(rt_tokenizer_decode(t, ids, 3, 0, buf, sizeof buf, &len),
                     MC_OK);
    assert_string_equal(buf, "ab a b");
    rt_tokenizer_free(t);
}

static void test_tokenizer_load_reports_missing_file(void **state)
{
    (void)state;
    rt_tokenizer *t;
    mc_error e;
    assert_int_equal(rt_tokenizer_load("/nonexistent/tokenizer.json", &t, &e),
                     MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, "/nonexistent/tokenizer.json");
}

static void test_tokenizer_survives_allocation_failures(void **state)
{
    (void)state;
    char *json = tu_tok_spm_json(&(tu_spm_opts){.byte_fallback = 1});
    const char *text = "hello</s>ab a h\xF0\x9F\x98\x80";
    int loaded = 0;
    for (long k = 0; !loaded && k < 100000; k++) {
        rt_tokenizer *t = NULL;
        mc_error e;
        mc_alloc_fail_after(k);
        mc_status r = rt_tokenizer_load_memory(json, strlen(json), "g", &t, &e);
        mc_alloc_fail_after(-1);
        if (r != MC_OK) {
            if (r != MC_ERR_NOMEM)
                print_error("fail_after(%ld): status %d: %s\n", k, r,
                            e.message);
            assert_int_equal(r, MC_ERR_NOMEM);
            assert_null(t);
            continue;
        }
        loaded = 1;
        for (long j = 0; j < 100000; j++) {
            int32_t ids[64];
            size_t n;
            mc_alloc_fail_after(j);
            r = rt_tokenizer_encode(t, text, strlen(text), 1, ids, 64, &n, NULL);
            mc_alloc_fail_after(-1);
            if (r == MC_OK)
                break;
            assert_int_equal(r, MC_ERR_NOMEM);
        }
        const int32_t ids[] = {1, S_SPHELLO, 2, 3 + 0xF0, 3 + 0x9F};
        for (long j = 0; j < 100000; j++) {
            char buf[64];
            size_t len;
            mc_alloc_fail_after(j);
            r = rt_tokenizer_decode(t, ids, 5, 0, buf, sizeof buf, &len);
            mc_alloc_fail_after(-1);
            if (r == MC_OK)
                break;
            assert_int_equal(r, MC_ERR_NOMEM);
        }
        rt_tokenizer_free(t);
    }
    assert_true(loaded);
    free(json);
}

static void test_tokenizer_reads_sibling_config(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("tok");
    char *path = tu_fmt("%s/tokenizer.json", dir);
    char *cfg = tu_fmt("%s/tokenizer_config.json", dir);
    char *json = tu_tok_bl_json(0, 0, 0);
    assert_int_equal(tu_write_file(path, json, strlen(json)), 0);
    const char *c1 = "{\"bos_token\":{\"content\":\"<|endoftext|>\"},"
                     "\"eos_token\":\"\xC4\xA0the\",\"model_max_length\":"
                     "1000000000000000019884624838656}";
    assert_int_equal(tu_write_file(cfg, c1, strlen(c1)), 0);
    rt_tokenizer *t = NULL;
    mc_error e;
    assert_int_equal(rt_tokenizer_load(path, &t, &e), MC_OK);
    assert_int_equal(rt_tokenizer_bos(t), B_EOT);
    assert_int_equal(rt_tokenizer_eos(t), B_GTHE);
    rt_tokenizer_free(t);
    const char *c2 = "{\"eos_token\":\"<nope>\"}";
    assert_int_equal(tu_write_file(cfg, c2, strlen(c2)), 0);
    assert_int_equal(rt_tokenizer_load(path, &t, &e), MC_ERR_FORMAT);
    assert_string_equal(e.file, cfg);
    assert_string_equal(e.field, "eos_token");
    assert_null(t);
    free(json);
    free(cfg);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_metaspace_known_answers),
        cmocka_unit_test(test_spm_legacy_normalizer_known_answers),
        cmocka_unit_test(test_spm_merge_encodings_agree),
        cmocka_unit_test(test_spm_byte_fallback_and_decode),
        cmocka_unit_test(test_spm_special_tokens_split),
        cmocka_unit_test(test_spm_metaspace_split_true_cuts_words),
        cmocka_unit_test(test_spm_unknown_chars_use_unk),
        cmocka_unit_test(test_bytelevel_known_answers),
        cmocka_unit_test(test_bytelevel_ignore_merges_takes_whole_words),
        cmocka_unit_test(test_bytelevel_round_trips),
        cmocka_unit_test(test_split_patterns_match_regex_semantics),
        cmocka_unit_test(test_split_behaviours_match_tokenizers),
        cmocka_unit_test(test_regex_refuses_what_it_cannot_translate),
        cmocka_unit_test(test_encode_reports_needed_size),
        cmocka_unit_test(test_encode_refuses_runaway_normalizer),
        cmocka_unit_test(test_decode_checks_ids_and_size),
        cmocka_unit_test(test_tokenizer_rejects_malformed_files),
        cmocka_unit_test(test_tokenizer_load_reports_missing_file),
        cmocka_unit_test(test_tokenizer_survives_allocation_failures),
        cmocka_unit_test(test_tokenizer_reads_sibling_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_tokenizer_mistral.c - rt_tokenizer on the real Mistral tokenizer in
 * ../shared (answers checked against a plain Python BPE over its vocab and
 * merges; skipped, saying so, when the file is absent): known answers,
 * byte fallback, round trips, the older saved form, and 2 MB of text.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_tokenizer.h"
#include "testutil.h"
#include "tok_gen.h"

/* ---- the real Mistral tokenizer ---------------------------------------- */

static rt_tokenizer *g_mistral;
static char g_mistral_path[4096];

static int mistral_setup(void **state)
{
    (void)state;
    snprintf(g_mistral_path, sizeof g_mistral_path,
             "%s/tokenizers/mistral-7b-instruct-v0.1/tokenizer.json",
             MC_SHARED_DIR);
    if (!tu_exists(g_mistral_path))
        return 0;
    mc_error e;
    if (rt_tokenizer_load(g_mistral_path, &g_mistral, &e) != MC_OK) {
        char buf[1600];
        printf("mistral load failed: %s\n", mc_error_format(&e, buf, sizeof buf));
        g_mistral = NULL;
        return -1;
    }
    return 0;
}

static int mistral_teardown(void **state)
{
    (void)state;
    rt_tokenizer_free(g_mistral);
    g_mistral = NULL;
    return 0;
}

#define NEED_MISTRAL()                                                         \
    TU_SKIP_IF(!g_mistral, "mistral-7b-instruct-v0.1/tokenizer.json absent "  \
                           "in ../shared/tokenizers")

static void test_mistral_known_answers(void **state)
{
    (void)state;
    NEED_MISTRAL();
    rt_tokenizer *t = g_mistral;
    assert_int_equal(rt_tokenizer_vocab_size(t), 32000);
    assert_int_equal(rt_tokenizer_bos(t), 1);
    assert_int_equal(rt_tokenizer_eos(t), 2);
    assert_int_equal(rt_tokenizer_token_to_id(t, MS "Hello", 8), 22557);
    assert_int_equal(rt_tokenizer_token_to_id(t, "<0x0A>", 6), 13);
    /* checked against a plain Python BPE over the file's vocab and merges */
    EXPECT(t, "Hello world", 1, 1, 22557, 1526);
    EXPECT(t, "Hello world", 0, 22557, 1526);
    EXPECT(t, "The quick brown fox jumps over the lazy dog.", 1, 1, 415, 2936,
           9060, 285, 1142, 461, 10575, 754, 272, 17898, 3914, 28723);
    EXPECT(t, "Once upon a time, there was a little girl named Lily.", 1, 1,
           5713, 3714, 264, 727, 28725, 736, 403, 264, 1628, 2746, 5160, 25492,
           28723);
    EXPECT(t, "Tom's cat, 42 times", 1, 1, 4660, 28742, 28713, 5255, 28725,
           28705, 28781, 28750, 2421);
    EXPECT(t, "  leading spaces", 1, 1, 28705, 5374, 10599);
    EXPECT(t, "tab\tand\nnewline", 1, 1, 7683, 12, 391, 13, 1095, 1081);
    EXPECT(t, "a</s>b", 1, 1, 264, 2, 28726);
}

static void test_mistral_rare_chars_fall_back_to_bytes(void **state)
{
    (void)state;
    NEED_MISTRAL();
    rt_tokenizer *t = g_mistral;
    /* U+2070E (F0 A0 9C 8E) is not a piece: <0xF0><0xA0><0x9C><0x8E> */
    EXPECT(t, "\xF0\xA0\x9C\x8E", 1, 1, 28705, 243, 163, 159, 145);
    /* 😀 is a piece of its own */
    EXPECT(t, "\xF0\x9F\x98\x80", 1, 1, 28705, 30575);
    /* 寿 (E5 AF BF) falls back, 司 is a piece */
    EXPECT(t, "I like \xE5\xAF\xBF\xE5\x8F\xB8 and \xE2\x98\x83.", 1, 1, 315,
           737, 28705, 232, 178, 194, 29989, 304, 28705, 31666, 28723);
}

static void test_mistral_round_trips(void **state)
{
    (void)state;
    NEED_MISTRAL();
    const char *texts[] = {
        "Hello world",
        "The quick brown fox jumps over the lazy dog.",
        "naïve café, Ærøskøbing, Straße",
        "日本語の文章です。中文句子。한국어 문장.",
        "emoji 😀👍🏽 and rare 𠜎𠜱 chars",
        "code:\n\tif (x) {\n\t\treturn y;\n\t}\n",
        "multiple   spaces   and trailing  ",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        ROUND_TRIP(g_mistral, texts[i]);
    /* the decoder strips the one leading space the encoder added */
    tu_tok_expect_round_trip(g_mistral, " x", 2, "x", 1);
}

/* The same vocabulary in the older saved form (normalizer Prepend+Replace,
 * no pre-tokenizer, pair merges) encodes plain text the same way. */
static void test_mistral_legacy_form_matches(void **state)
{
    (void)state;
    NEED_MISTRAL();
    json_error_t je;
    json_t *root = json_load_file(g_mistral_path, 0, &je);
    assert_non_null(root);
    json_object_set_new(root, "pre_tokenizer", json_null());
    json_object_set_new(root, "normalizer",
                        json_pack("{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]}",
                                  "type", "Sequence", "normalizers", "type",
                                  "Prepend", "prepend", MS, "type", "Replace",
                                  "pattern", "String", " ", "content", MS));
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const char *m = json_string_value(json_array_get(merges, i));
        const char *sp = strchr(m, ' ');
        char *a = tu_fmt("%.*s", (int)(sp - m), m);
        json_array_set_new(merges, i, json_pack("[ss]", a, sp + 1));
        free(a);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    rt_tokenizer *legacy = tu_tok_load_text(text);
    free(text);
    const char *texts[] = {"Hello world", "Once upon a time, there was a girl.",
                           "日本語 😀 𠜎", "a  b\tc\nd"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t x[256], y[256];
        size_t nx, ny;
        assert_int_equal(rt_tokenizer_encode(g_mistral, texts[i],
                                             strlen(texts[i]), 1, x, 256, &nx,
                                             NULL), MC_OK);
        assert_int_equal(rt_tokenizer_encode(legacy, texts[i], strlen(texts[i]),
                                             1, y, 256, &ny, NULL), MC_OK);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx * sizeof *x);
    }
    /* where they differ: the legacy form prepends even before a space */
    EXPECT(legacy, " Hello", 0, 28705, 22557);
    EXPECT(g_mistral, " Hello", 0, 22557);
    rt_tokenizer_free(legacy);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_mistral_encodes_two_megabytes(void **state)
{
    (void)state;
    NEED_MISTRAL();
    double t0 = now_s();
    rt_tokenizer *t = NULL;
    assert_int_equal(rt_tokenizer_load(g_mistral_path, &t, NULL), MC_OK);
    double load_s = now_s() - t0;
    const char *base = "Once upon a time, there was a little girl named Lily. "
                       "She liked 123 apples and 日本語 😀!\n";
    size_t bl = strlen(base), len = (size_t)2 << 20;
    char *text = malloc(len);
    for (size_t i = 0; i < len; i++)
        text[i] = base[i % bl];
    len -= len % bl; /* whole sentences */
    size_t cap = len, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    t0 = now_s();
    assert_int_equal(rt_tokenizer_encode(t, text, len, 0, ids, cap, &n, NULL),
                     MC_OK);
    double enc_s = now_s() - t0;
    double mbps = (double)len / enc_s / 1e6;
    printf("[  INFO    ] mistral: load %.3f s, encode %zu bytes -> %zu ids "
           "in %.3f s (%.1f MB/s)\n", load_s, len, n, enc_s, mbps);
    /* per-sentence ids repeat: the split into chunks changed nothing */
    size_t per = 0;
    assert_int_equal(rt_tokenizer_encode(t, base, bl, 0, NULL, 0, &per, NULL),
                     MC_ERR_INVALID_ARG);
    /* No time limit here: speed is bench_tokenizer's business (a timed
     * test fails on a loaded CI machine, not on a slow tokenizer). */
    assert_true(n > 0 && n <= len);
    free(ids);
    free(text);
    rt_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mistral_known_answers),
        cmocka_unit_test(test_mistral_rare_chars_fall_back_to_bytes),
        cmocka_unit_test(test_mistral_round_trips),
        cmocka_unit_test(test_mistral_legacy_form_matches),
        cmocka_unit_test(test_mistral_encodes_two_megabytes),
    };
    return cmocka_run_group_tests(tests, mistral_setup, mistral_teardown);
}

/*
 * test_tokenizer_forms.c - the tokenizer against the answers of Hugging Face
 * `tokenizers` on ten tokenizer.json forms built with that library (every
 * normalizer, pre-tokenizer, decoder and added-token option the tokenizer
 * supports), over a corpus of 400+ strings: prose, code, whitespace runs,
 * CJK, Arabic, Hindi, emoji ZWJ sequences, NFC / NFD accents, control
 * characters, special-token text, digits.  The forms and answers live in
 * tests/data/tokenizer/, written by scripts/tokenizer-check --write.
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

#include "rt_tokenizer.h"

#define DATA MC_SOURCE_DIR "/tests/data/tokenizer"

static const char *const FORMS[] = {"smollm",     "gpt2",       "llama3",
                                    "qwen2",      "mistral",    "spm_legacy",
                                    "normalized", "splits",     "whitespace",
                                    "bert"};

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j)
        print_error("%s: %s (line %d)\n", path, je.text, je.line);
    assert_non_null(j);
    return j;
}

/* ids of text, or a failure naming the form and string. */
static int32_t *encode(const rt_tokenizer *t, json_t *text, int special,
                       size_t *n)
{
    size_t need = 0;
    mc_error e;
    rt_tokenizer_encode(t, json_string_value(text), json_string_length(text),
                        special, NULL, 0, &need, &e);
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(rt_tokenizer_encode(t, json_string_value(text),
                                         json_string_length(text), special,
                                         ids, need, n, &e),
                     MC_OK);
    return ids;
}

static int ids_equal(const int32_t *ids, size_t n, json_t *want)
{
    if (!json_is_array(want) || json_array_size(want) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != ids[i])
            return 0;
    return 1;
}

static int decode_equal(const rt_tokenizer *t, const int32_t *ids, size_t n,
                        int skip, json_t *want)
{
    size_t need = 0, len = 0;
    rt_tokenizer_decode(t, ids, n, skip, NULL, 0, &need);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    assert_int_equal(rt_tokenizer_decode(t, ids, n, skip, buf, need + 1, &len),
                     MC_OK);
    int ok = json_string_length(want) == len &&
             memcmp(json_string_value(want), buf, len) == 0;
    free(buf);
    return ok;
}

/* Replay one form; returns the number of strings whose encodes or decodes
 * differ (each printed). */
static size_t replay(const char *form, json_t *corpus)
{
    char path[512];
    snprintf(path, sizeof path, DATA "/%s.json", form);
    rt_tokenizer *t = NULL;
    mc_error e;
    mc_status r = rt_tokenizer_load(path, &t, &e);
    if (r)
        print_error("%s: %s: %s\n", form, e.field, e.message);
    assert_int_equal(r, MC_OK);
    snprintf(path, sizeof path, DATA "/%s.golden.json", form);
    json_t *g = load_json(path);
    json_t *g_ids = json_object_get(g, "ids");
    json_t *g_sp = json_object_get(g, "ids_special");
    json_t *g_dec = json_object_get(g, "decode");
    json_t *g_skip = json_object_get(g, "decode_skip");
    assert_int_equal(json_array_size(g_sp), json_array_size(corpus));
    size_t bad = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        json_t *text = json_array_get(corpus, i);
        size_t na = 0, nb = 0;
        int32_t *a = encode(t, text, 0, &na);
        int32_t *b = encode(t, text, 1, &nb);
        json_t *want_a = json_array_get(g_ids, i);
        json_t *want_skip = json_array_get(g_skip, i);
        const char *what = NULL;
        if (!ids_equal(a, na, json_is_null(want_a) ? json_array_get(g_sp, i)
                                                   : want_a))
            what = "ids";
        else if (!ids_equal(b, nb, json_array_get(g_sp, i)))
            what = "ids with special tokens";
        else if (!decode_equal(t, b, nb, 0, json_array_get(g_dec, i)))
            what = "decode";
        else if (!decode_equal(t, b, nb, 1,
                               json_is_null(want_skip)
                                   ? json_array_get(g_dec, i)
                                   : want_skip))
            what = "decode skipping special tokens";
        if (what) {
            bad++;
            print_error("%s: string %zu (\"%.60s\"): %s differ from "
                        "tokenizers'\n",
                        form, i, json_string_value(text), what);
        }
        free(a);
        free(b);
    }
    json_decref(g);
    rt_tokenizer_free(t);
    return bad;
}

static void test_every_form_matches_hf_tokenizers(void **state)
{
    (void)state;
    json_t *corpus = load_json(DATA "/corpus.json");
    assert_true(json_array_size(corpus) >= 400);
    size_t bad = 0;
    for (size_t k = 0; k < sizeof FORMS / sizeof *FORMS; k++) {
        size_t b = replay(FORMS[k], corpus);
        print_message("%-11s %zu of %zu strings differ\n", FORMS[k], b,
                      json_array_size(corpus));
        bad += b;
    }
    json_decref(corpus);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_form_matches_hf_tokenizers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

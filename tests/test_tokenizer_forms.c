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

#include "mc_alloc.h"
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

static rt_tokenizer *load_form(const char *form)
{
    char path[512];
    snprintf(path, sizeof path, DATA "/%s.json", form);
    rt_tokenizer *t = NULL;
    mc_error e;
    assert_int_equal(rt_tokenizer_load(path, &t, &e), MC_OK);
    return t;
}

/* Not valid UTF-8 (Hugging Face cannot take it): the normalizers pass the
 * bad bytes through, no regex matches them, and the byte-level
 * vocabularies give them back exactly. */
static void test_byte_level_forms_round_trip_invalid_utf8(void **state)
{
    (void)state;
    static const char text[] = "ab\xFF\xC3(c  \xE2\x82 d\x80" "caf\xC3\xA9 12345"
                               "\xF0\x9F\x98";
    static const char *const forms[] = {"smollm", "llama3", "qwen2"};
    for (size_t k = 0; k < 3; k++) {
        rt_tokenizer *t = load_form(forms[k]);
        int32_t ids[256];
        size_t n = 0, len = 0;
        char out[256];
        assert_int_equal(rt_tokenizer_encode(t, text, sizeof text - 1, 0, ids,
                                             256, &n, NULL),
                         MC_OK);
        assert_int_equal(rt_tokenizer_decode(t, ids, n, 0, out, sizeof out,
                                             &len),
                         MC_OK);
        if (len != sizeof text - 1 || memcmp(out, text, len) != 0)
            print_error("%s: the round trip changed the bytes\n", forms[k]);
        assert_memory_equal(out, text, sizeof text - 1);
        assert_int_equal(len, sizeof text - 1);
        rt_tokenizer_free(t);
    }
}

/* Every allocation of loading (the regexes, the normalized added tokens,
 * the steps) and of encoding (normalizers, PCRE2 match data, splits) may
 * fail: the answer is MC_ERR_NOMEM and nothing leaks, or the right ids. */
static void test_forms_survive_allocation_failures(void **state)
{
    (void)state;
    static const char *const forms[] = {"normalized", "splits", "qwen2",
                                        "spm_legacy"};
    static const char text[] = "Hello World, caf\xC3\xA9 <sep> x-y 123 "
                               "\xEF\xAC\x81 <extra_0>  \xE4\xBD\xA0\xFF";
    for (size_t f = 0; f < sizeof forms / sizeof *forms; f++) {
        char path[512];
        snprintf(path, sizeof path, DATA "/%s.json", forms[f]);
        mc_alloc_reset_count();
        rt_tokenizer *ref = load_form(forms[f]);
        long total = (long)mc_alloc_count();
        int32_t want[128];
        size_t n_want = 0;
        assert_int_equal(rt_tokenizer_encode(ref, text, sizeof text - 1, 1,
                                             want, 128, &n_want, NULL),
                         MC_OK);
        /* the JSON parse is most of the allocations: every one of the
         * last 400 (the pipeline, the added tokens), a sample before */
        for (long k = 0; k <= total; k += k < total - 400 ? 97 : 1) {
            rt_tokenizer *t = NULL;
            mc_error e;
            mc_alloc_fail_after(k);
            mc_status r = rt_tokenizer_load(path, &t, &e);
            mc_alloc_fail_after(-1);
            if (r != MC_OK) {
                if (r != MC_ERR_NOMEM)
                    print_error("%s: fail_after(%ld): %d %s: %s\n", forms[f],
                                k, r, e.field, e.message);
                assert_int_equal(r, MC_ERR_NOMEM);
                assert_null(t);
                continue;
            }
            rt_tokenizer_free(t);
        }
        for (long j = 0; j < 100000; j++) {
            int32_t ids[128];
            size_t n = 0;
            mc_alloc_fail_after(j);
            mc_status r = rt_tokenizer_encode(ref, text, sizeof text - 1, 1,
                                              ids, 128, &n, NULL);
            mc_alloc_fail_after(-1);
            if (r == MC_OK) {
                assert_int_equal(n, n_want);
                assert_memory_equal(ids, want, n * sizeof *ids);
                break;
            }
            assert_int_equal(r, MC_ERR_NOMEM);
        }
        rt_tokenizer_free(ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_form_matches_hf_tokenizers),
        cmocka_unit_test(test_byte_level_forms_round_trip_invalid_utf8),
        cmocka_unit_test(test_forms_survive_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

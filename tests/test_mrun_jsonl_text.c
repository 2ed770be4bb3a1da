/* test_mrun_jsonl_text.c - the real mrun binary on JSONL jobs whose lines
 * use text-level features, on a fixture model with a tokenizer beside it:
 * labels of several tokens (ids, id arrays, texts) score exactly the
 * continuation sums of the same tokens run as separate requests, beside
 * generation lines that share the steps; a label of no tokens is an error
 * line and the job goes on; mrun --score-label gives the same scores.
 * Stop strings: a match across token boundaries stops the line at the
 * token that completed it, the text cut before it ("stop_string"); a stop
 * string that is only in the prompt does not stop; mrun --stop-string
 * gives the same result; without a tokenizer they are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "json_lines.h"
#include "testutil.h"
#include "tok_fixture.h"

static char *g_out, *g_err;
static char *g_dir, *g_model;

#define mrun(...) tu_run_bin(&g_out, &g_err, "mrun", __VA_ARGS__)

/* A small plan: requests share steps, prompts and label rows are split. */
#define PLAN "--max-batch 3 --max-seq 64 --prefill-chunk 8 --threads 2"

/* The fixture llama with a tokenizer.json beside it (links, not copies). */
static int setup(void **st)
{
    (void)st;
    g_dir = tu_mkdtemp("jsonl-text");
    g_model = tu_fmt("%s/model", g_dir);
    assert_int_equal(mkdir(g_model, 0755), 0);
    const char *files[2] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *a = tu_fmt("%s/llama/%s", MC_FIXTURE_DIR, files[i]);
        char *b = tu_fmt("%s/%s", g_model, files[i]);
        assert_int_equal(symlink(a, b), 0);
        free(a);
        free(b);
    }
    char *tok = tu_fmt("%s/tokenizer.json", g_model);
    tu_tiny_tokenizer_write(tok);
    free(tok);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    tu_rmtree(g_dir);
    free(g_dir);
    free(g_model);
    free(g_out);
    free(g_err);
    return 0;
}

static double num(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    assert_non_null(v);
    return json_number_value(v);
}

/* The labels of every scoring line, as JSON text, and what each is as a
 * continuation: "ab" is the text "\u2581ab", 3 tokens with this tokenizer. */
#define NLAB 4
static const char *const LAB_JSON[NLAB] = {"7", "[30,31,32]", "\"ab\"",
                                           "[40,41,42,43]"};
static const char *const LAB_CONT[NLAB] = {"[7]", "[30,31,32]", "\"ab\"",
                                           "[40,41,42,43]"};
static const size_t LAB_TOKENS[NLAB] = {1, 3, 3, 4};

static void test_jsonl_multi_token_labels_equal_continuations_alone(
    void **st)
{
    (void)st;
    char *in = tu_fmt("%s/labels.jsonl", g_dir);
    char *out = tu_fmt("%s/labels.out", g_dir);
    char *cin = tu_fmt("%s/cont.jsonl", g_dir);
    char *cout = tu_fmt("%s/cont.out", g_dir);
    FILE *f = fopen(in, "w"), *fc = fopen(cin, "w");
    assert_non_null(f);
    assert_non_null(fc);
    tu_rng g = {0x1ABE1ull};
    enum { N = 12 };
    size_t plen[N];
    char first_ids[512] = ""; /* line 2's prompt, space-separated */
    for (size_t k = 0; k < N; k++) {
        char ids[512];
        size_t o = 0;
        plen[k] = 1 + tu_rng_u32(&g) % 40;
        for (size_t i = 0; i < plen[k]; i++)
            o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%u",
                                  i ? "," : "", 1 + tu_rng_u32(&g) % 255);
        if (k == 1)
            for (char *p = strcpy(first_ids, ids); (p = strchr(p, ','));)
                *p = ' ';
        if (k % 3 == 0) { /* generation beside the scoring lines */
            fprintf(f, "{\"id\": %zu, \"ids\": [%s], \"max_new_tokens\": "
                       "%u}\n", k, ids, 4 + tu_rng_u32(&g) % 16);
            continue;
        }
        fprintf(f, "{\"id\": %zu, \"ids\": [%s], \"labels\": [%s,%s,%s,%s]}"
                   "\n", k, ids, LAB_JSON[0], LAB_JSON[1], LAB_JSON[2],
                LAB_JSON[3]);
        for (size_t j = 0; j < NLAB; j++)
            fprintf(fc, "{\"id\": \"%zu.%zu\", \"ids\": [%s], "
                        "\"continuation\": %s}\n", k, j, ids, LAB_CONT[j]);
    }
    /* Labels of no tokens: error lines, the job goes on. */
    fputs("{\"id\": \"empty-text\", \"ids\": [1, 2], \"labels\": [7, \"\"]}\n"
          "{\"id\": \"empty-ids\", \"ids\": [1, 2], \"labels\": [[]]}\n", f);
    fclose(f);
    fclose(fc);
    assert_int_equal(mrun("%s --input %s --output %s %s", g_model, in, out,
                          PLAN), 1);
    assert_non_null(strstr(g_err, "(2 failed: plan 0, input 2"));
    assert_int_equal(mrun("%s --input %s --output %s %s -q", g_model, cin,
                          cout, PLAN), 0);
    size_t n, nc;
    json_t **o = tu_json_lines(out, &n);
    json_t **c = tu_json_lines(cout, &nc);
    assert_int_equal(n, N + 2);
    size_t ci = 0, scored = 0;
    for (size_t k = 0; k < N; k++) {
        if (k % 3 == 0) {
            assert_non_null(json_object_get(o[k], "ids"));
            continue;
        }
        const json_t *labs = json_object_get(o[k], "labels");
        assert_int_equal(json_array_size(labs), NLAB);
        assert_int_equal(num(o[k], "prompt_tokens"), plen[k]);
        size_t best = 0;
        for (size_t j = 0; j < NLAB; j++, ci++) {
            const json_t *l = json_array_get(labs, j);
            float got = (float)num(l, "logprob");
            float want = (float)num(c[ci], "continuation_sum");
            if (got != want)
                fail_msg("line %zu label %zu: %.9g, as a continuation alone "
                         "%.9g", k + 1, j, got, want);
            assert_int_equal(num(l, "tokens"), LAB_TOKENS[j]);
            assert_int_equal(json_array_size(json_object_get(
                                 c[ci], "continuation_logprobs")),
                             LAB_TOKENS[j]);
            if (got > (float)num(json_array_get(labs, best), "logprob"))
                best = j;
            scored++;
        }
        assert_true(json_equal(json_object_get(o[k], "label"),
                               json_object_get(json_array_get(labs, best),
                                               "label")));
    }
    assert_int_equal(ci, nc);
    assert_int_equal(scored, 8 * NLAB);
    assert_non_null(strstr(json_string_value(json_object_get(o[N], "error")),
                           "\"labels\"[1] is a text that encodes to no "
                           "tokens"));
    assert_non_null(strstr(json_string_value(json_object_get(o[N + 1],
                                                             "error")),
                           "\"labels\"[0] is an empty array"));
    /* mrun --score-label: the same scores outside a job (%.7g there);
     * the prompt of line 2, the first scoring line. */
    const json_t *first = json_object_get(o[1], "labels");
    assert_int_equal(mrun("%s --tokens '%s' --score-labels 7 --score-label "
                          "'30 31 32' --score-label '3 4 5' --score-label "
                          "'40 41 42 43' %s --json -q", g_model, first_ids,
                          PLAN),
                     0);
    json_t *cli = json_loads(g_out, 0, NULL);
    assert_non_null(cli);
    const json_t *cl = json_object_get(
        json_array_get(json_object_get(cli, "scores"), 0), "labels");
    assert_int_equal(json_array_size(cl), NLAB);
    for (size_t j = 0; j < NLAB; j++) {
        double a = num(json_array_get(cl, j), "logprob");
        double b = num(json_array_get(first, j), "logprob");
        if (fabs(a - b) > 1e-6 * fabs(b) + 1e-6)
            fail_msg("label %zu: mrun --score-label %.9g, job %.9g", j, a, b);
    }
    json_decref(cli);
    tu_json_lines_free(o, n);
    tu_json_lines_free(c, nc);
    free(in);
    free(out);
    free(cin);
    free(cout);
}

/* ---- stop strings ------------------------------------------------------ */

/* The one output line of a one-line job (text in, JSON out). */
static json_t *one_line_job(const char *line, const char *extra)
{
    char *in = tu_fmt("%s/one.jsonl", g_dir), *out = tu_fmt("%s/one.out",
                                                            g_dir);
    assert_int_equal(tu_write_file(in, line, strlen(line)), 0);
    unlink(out);
    mrun("%s --input %s --output %s %s --ignore-eos -q %s", g_model, in, out,
         PLAN, extra);
    size_t n;
    json_t **v = tu_json_lines(out, &n);
    assert_int_equal(n, 1);
    json_t *o = v[0];
    free(v);
    free(in);
    free(out);
    return o;
}

static void test_jsonl_stop_string_across_tokens_cuts_text(void **st)
{
    (void)st;
    /* The reference: 30 tokens, no stop string. */
    json_t *ref = one_line_job("{\"prompt\": \"ab cd\", \"max_new_tokens\": "
                               "30}\n", "");
    const char *text = json_string_value(json_object_get(ref, "text"));
    const json_t *ids = json_object_get(ref, "ids");
    assert_non_null(text);
    assert_int_equal(json_array_size(ids), 30);
    /* A stop string over the boundary of tokens t and t + 1 (2 bytes of
     * each; every token of this model's text has >= 1 byte), at its first
     * occurrence in the text. */
    char *prefix = NULL, stop[16] = "";
    size_t t, cut = 0, plen = 0;
    for (t = 1; t + 1 < 30; t++) {
        /* The text of tokens 0..t: this tokenizer's tokens are "Z%03d"
         * (30..255) or one letter (4..29), joined as they are. */
        free(prefix);
        prefix = calloc(1, 256);
        plen = 0;
        for (size_t k = 0; k <= t; k++) {
            int id = (int)json_integer_value(json_array_get(ids, k));
            plen += (size_t)(id >= 30 ? snprintf(prefix + plen, 256 - plen,
                                                 "Z%03d", id)
                             : id >= 4 ? snprintf(prefix + plen,
                                                  256 - plen, "%c",
                                                  'a' + id - 4)
                                       : 0);
        }
        assert_memory_equal(prefix, text, plen); /* the decode agrees */
        int next = (int)json_integer_value(json_array_get(ids, t + 1));
        if (plen < 2 || next < 30)
            continue;
        snprintf(stop, sizeof stop, "%c%cZ%d", prefix[plen - 2],
                 prefix[plen - 1], (next / 100) % 10); /* "Z" + 1st digit */
        const char *at = strstr(text, stop);
        if (at && (size_t)(at - text) == plen - 2) {
            cut = plen - 2;
            break;
        }
    }
    free(prefix);
    assert_true(t + 1 < 30); /* found one */
    char *line = tu_fmt("{\"prompt\": \"ab cd\", \"max_new_tokens\": 30, "
                        "\"stop\": [\"%s\"]}\n", stop);
    json_t *o = one_line_job(line, "");
    free(line);
    assert_string_equal(json_string_value(json_object_get(o, "stop_reason")),
                        "stop_string");
    /* ids: up to the token that completed the match, t + 1 */
    const json_t *got = json_object_get(o, "ids");
    assert_int_equal(json_array_size(got), t + 2);
    assert_int_equal(json_integer_value(json_object_get(o,
                                                        "generated_tokens")),
                     t + 2);
    for (size_t k = 0; k < t + 2; k++)
        assert_true(json_equal(json_array_get(got, k),
                               json_array_get(ids, k)));
    const char *gt = json_string_value(json_object_get(o, "text"));
    assert_int_equal(strlen(gt), cut);
    assert_memory_equal(gt, text, cut);
    /* The same through --stop-string, for the job and for a prompt. */
    char *flag = tu_fmt("--stop-string '%s'", stop);
    json_t *o2 = one_line_job("{\"prompt\": \"ab cd\", \"max_new_tokens\": "
                              "30}\n", flag);
    assert_true(json_equal(o, o2));
    assert_int_equal(mrun("%s --prompt 'ab cd' --max-new-tokens 30 "
                          "--ignore-eos %s %s --json -q", g_model, PLAN,
                          flag), 0);
    json_t *cli = json_loads(g_out, 0, NULL);
    assert_non_null(cli);
    const json_t *s0 = json_array_get(json_object_get(cli, "sequences"), 0);
    assert_true(json_equal(json_object_get(s0, "ids"), got));
    assert_string_equal(json_string_value(json_object_get(s0, "text")), gt);
    assert_string_equal(json_string_value(json_object_get(s0,
                                                          "stop_reason")),
                        "stop_string");
    json_decref(cli);
    free(flag);
    json_decref(o2);
    json_decref(o);
    json_decref(ref);
}

static void test_jsonl_stop_string_in_the_prompt_does_not_stop(void **st)
{
    (void)st;
    /* "ab cd" is in the prompt only (the generated text of this model is
     * "Z%03d" pieces and letters; checked on the reference). */
    json_t *ref = one_line_job("{\"prompt\": \"ab cd ab cd\", "
                               "\"max_new_tokens\": 20}\n", "");
    assert_null(strstr(json_string_value(json_object_get(ref, "text")),
                       "b c"));
    json_t *o = one_line_job("{\"prompt\": \"ab cd ab cd\", "
                             "\"max_new_tokens\": 20, \"stop\": [\"b c\", "
                             "\"d a\", \"ab cd\"]}\n", "");
    assert_string_equal(json_string_value(json_object_get(o, "stop_reason")),
                        "length");
    assert_true(json_equal(json_object_get(o, "ids"),
                           json_object_get(ref, "ids")));
    assert_true(json_equal(json_object_get(o, "text"),
                           json_object_get(ref, "text")));
    json_decref(o);
    json_decref(ref);
}

static void test_stop_strings_need_a_tokenizer(void **st)
{
    (void)st;
    char *bare = tu_fmt("%s/llama", MC_FIXTURE_DIR); /* no tokenizer.json */
    char *in = tu_fmt("%s/bare.jsonl", g_dir), *out = tu_fmt("%s/bare.out",
                                                             g_dir);
    const char *job = "{\"ids\": [1, 2], \"stop\": [7, \"x\"]}\n"
                      "{\"ids\": [1, 2], \"max_new_tokens\": 3}\n";
    assert_int_equal(tu_write_file(in, job, strlen(job)), 0);
    assert_int_equal(mrun("%s --input %s --output %s %s", bare, in, out,
                          PLAN), 1);
    size_t n;
    json_t **o = tu_json_lines(out, &n);
    assert_int_equal(n, 2);
    assert_non_null(strstr(json_string_value(json_object_get(o[0], "error")),
                           "stop strings need a tokenizer"));
    assert_null(json_object_get(o[1], "error"));
    tu_json_lines_free(o, n);
    unlink(out);
    assert_int_equal(mrun("%s --input %s --output %s %s --stop-string x",
                          bare, in, out, PLAN), 1);
    assert_non_null(strstr(g_err, "--stop-string needs a tokenizer"));
    assert_int_equal(mrun("%s --tokens '1 2' --stop-string x %s", bare,
                          PLAN), 1);
    assert_non_null(strstr(g_err, "stop strings need a tokenizer"));
    assert_int_equal(mrun("%s --tokens '1 2' --stop-string ''", bare), 2);
    free(bare);
    free(in);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_jsonl_multi_token_labels_equal_continuations_alone),
        cmocka_unit_test(test_jsonl_stop_string_across_tokens_cuts_text),
        cmocka_unit_test(test_jsonl_stop_string_in_the_prompt_does_not_stop),
        cmocka_unit_test(test_stop_strings_need_a_tokenizer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_jsonl.c - JSONL job lines (rt_jsonl.h): every key of an input line
 * parsed and range-checked with a message naming the line and the key;
 * text prompts, text labels and continuations through a tokenizer; the
 * output line's exact bytes (key order, floats, UTF-8 repair); the id an
 * output line gives back to --resume. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "rt_jsonl.h"
#include "testutil.h"
#include "tok_fixture.h"

static const rt_jsonl_defaults D = {.max_new_tokens = 16, .top_p = 1.0f,
                                    .seed = 9, .add_special = 1};

static mc_status parse(const char *line, uint64_t n, const rt_tokenizer *t,
                       rt_jsonl_req *r, mc_error *e)
{
    mc_error_clear(e);
    return rt_jsonl_parse(line, strlen(line), n, &D, t, r, e);
}

static void test_jsonl_parses_every_key(void **st)
{
    (void)st;
    rt_jsonl_req r;
    mc_error e;
    assert_int_equal(parse("{\"id\": \"x\\\"y\", \"ids\": [1, 2, 3], "
                           "\"max_new_tokens\": 0, \"temperature\": 0.5, "
                           "\"top_k\": 7, \"top_p\": 0.25, \"seed\": 11, "
                           "\"stop\": [2, 5], \"extra\": {\"k\": 1}}",
                           3, NULL, &r, &e),
                     MC_OK);
    assert_string_equal(r.id, "\"x\\\"y\"");
    assert_int_equal(r.n_ids, 3);
    assert_int_equal(r.ids[2], 3);
    assert_int_equal(r.max_new_tokens, 0);
    assert_true(r.temperature == 0.5f && r.top_p == 0.25f && r.top_k == 7);
    assert_int_equal(r.seed, 11);
    assert_int_equal(r.seq_index, 0); /* an explicit seed: (seed, 0) */
    assert_int_equal(r.n_stop, 2);
    assert_false(r.score);
    rt_jsonl_req_free(&r);
    /* Defaults: the job's, RNG stream (job seed, line - 1), id = line. */
    assert_int_equal(parse("{\"ids\": [4]}", 42, NULL, &r, &e), MC_OK);
    assert_string_equal(r.id, "42");
    assert_int_equal(r.max_new_tokens, 16);
    assert_int_equal(r.seed, 9);
    assert_int_equal(r.seq_index, 41);
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"id\": 5, \"ids\": [4], \"labels\": [1, 2], "
                           "\"continuation\": [3]}", 1, NULL, &r, &e),
                     MC_OK);
    assert_true(r.score);
    assert_int_equal(r.n_labels, 2);
    assert_string_equal(r.label_json[1], "2");
    assert_int_equal(r.n_cont, 1);
    rt_jsonl_req_free(&r);
    rt_jsonl_req_free(NULL);
    assert_true(rt_jsonl_is_blank(" \t\r", 3));
    assert_false(rt_jsonl_is_blank(" {", 2));
}

static void test_jsonl_rejects_bad_lines_naming_line_and_key(void **st)
{
    (void)st;
    static const struct {
        const char *line, *field, *text;
    } bad[] = {
        {"{\"ids\": [1,", "", "not JSON"},
        {"[1, 2]", "", "expected a JSON object"},
        {"{}", "prompt", "exactly one"},
        {"{\"ids\": [1], \"prompt\": \"a\"}", "ids", "exactly one"},
        {"{\"ids\": [1, -2]}", "ids", "\"ids\"[1]"},
        {"{\"ids\": [1, 2147483648]}", "ids", "token id"},
        {"{\"ids\": \"1 2\"}", "ids", "array"},
        {"{\"prompt\": 3}", "prompt", "string"},
        {"{\"prompt\": \"hi\"}", "prompt", "tokenizer"},
        {"{\"id\": [1], \"ids\": [1]}", "id", "string or an integer"},
        {"{\"ids\": [1], \"max_new_tokens\": -1}", "max_new_tokens", "0.."},
        {"{\"ids\": [1], \"max_new_tokens\": 1.5}", "max_new_tokens", "0.."},
        {"{\"ids\": [1], \"temperature\": -0.1}", "temperature", "0..1e6"},
        {"{\"ids\": [1], \"temperature\": 1e308}", "temperature", "0..1e6"},
        {"{\"ids\": [1], \"top_p\": 0}", "top_p", "(0, 1]"},
        {"{\"ids\": [1], \"top_p\": 1.5}", "top_p", "(0, 1]"},
        {"{\"ids\": [1], \"top_k\": -3}", "top_k", "0..4294967295"},
        {"{\"ids\": [1], \"top_k\": 1e18}", "top_k", "0..4294967295"},
        {"{\"ids\": [1], \"seed\": -3}", "seed", ">= 0"},
        {"{\"ids\": [1], \"stop\": 2}", "stop", "array"},
        {"{\"ids\": [1], \"labels\": []}", "labels", "non-empty"},
        {"{\"ids\": [1], \"labels\": [1.5]}", "labels", "\"labels\"[0]"},
        {"{\"ids\": [1], \"labels\": [\"yes\"]}", "labels", "tokenizer"},
        {"{\"ids\": [1], \"continuation\": []}", "continuation", "empty"},
        {"{\"ids\": [1], \"ids\": [2]}", "", "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rt_jsonl_req r;
        mc_error e;
        mc_status s = parse(bad[i].line, 7, NULL, &r, &e);
        if (s != MC_ERR_FORMAT || strncmp(e.message, "line 7: ", 8) ||
            strcmp(e.field, bad[i].field) || !strstr(e.message, bad[i].text))
            fail_msg("%s: status %d field '%s' message '%s'", bad[i].line,
                     (int)s, e.field, e.message);
        assert_null(r.ids);
        rt_jsonl_req_free(&r);
    }
    /* The id survives a failure, for the error line. */
    rt_jsonl_req r;
    mc_error e;
    assert_int_equal(parse("{\"id\": \"k\", \"ids\": [1], \"top_p\": 2}", 1,
                           NULL, &r, &e),
                     MC_ERR_FORMAT);
    assert_string_equal(r.id, "\"k\"");
    rt_jsonl_req_free(&r);
}

static void test_jsonl_text_through_the_tokenizer(void **st)
{
    (void)st;
    char *json = tu_spm_tokenizer_json(1);
    rt_tokenizer *t = NULL;
    assert_int_equal(rt_tokenizer_load_memory(json, strlen(json), "t", &t,
                                              NULL),
                     MC_OK);
    free(json);
    rt_jsonl_req r;
    mc_error e;
    /* "ab cd": BOS, ▁ a b, ▁ c d; a label "a" is "▁a": two tokens. */
    assert_int_equal(parse("{\"prompt\": \"ab\\ncd\", \"continuation\": "
                           "\"ab\"}", 1, t, &r, &e),
                     MC_OK);
    assert_int_equal(r.ids[0], 1); /* BOS */
    assert_true(r.n_ids >= 5);
    assert_int_equal(r.n_cont, 3); /* no BOS in a continuation */
    rt_jsonl_req_free(&r);
    /* A label of several tokens: "a" is "\u2581a", two tokens. */
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [\"a\"]}", 4, t, &r,
                           &e),
                     MC_OK);
    assert_int_equal(r.n_labels, 1);
    assert_int_equal(r.label_len[0], 2);
    assert_int_equal(r.label_seq[0][0], TU_SPM_SPACE);
    assert_int_equal(r.label_seq[0][1], TU_SPM_A);
    assert_int_equal(rt_jsonl_score_extra(&r), 2);
    rt_jsonl_req_free(&r);
    /* A text that encodes to no tokens is the line's error, named. */
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [7, \"\"]}", 4, t,
                           &r, &e),
                     MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "line 4: \"labels\"[1] is a text that "
                                      "encodes to no tokens"));
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [\"\\u2581\", 7, "
                           "[5, 6, 7]]}", 4, t, &r, &e),
                     MC_OK); /* "\u2581" is one token; echoed as given */
    assert_int_equal(r.n_labels, 3);
    assert_int_equal(r.label_len[0], 1);
    assert_int_equal(r.label_seq[1][0], 7);
    assert_int_equal(r.label_len[2], 3);
    assert_int_equal(r.label_seq[2][2], 7);
    assert_string_equal(r.label_json[0], "\"\xe2\x96\x81\"");
    assert_string_equal(r.label_json[1], "7");
    assert_string_equal(r.label_json[2], "[5,6,7]");
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [[]]}", 5, t, &r, &e),
                     MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "line 5: \"labels\"[0] is an empty "
                                      "array"));
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [[3, -1]]}", 6, t, &r,
                           &e),
                     MC_ERR_FORMAT);
    rt_jsonl_req_free(&r);
    rt_tokenizer_free(t);
}

static void test_jsonl_output_bytes_are_fixed(void **st)
{
    (void)st;
    rt_jsonl_req r;
    mc_error e;
    assert_int_equal(parse("{\"id\": \"q\", \"ids\": [1, 2]}", 3, NULL, &r,
                           &e),
                     MC_OK);
    const int32_t gen[3] = {5, 6, 7};
    /* Text with a newline, a quote, a control byte and a cut character. */
    const char text[] = "a\n\"\x01\xe2\x82";
    rt_jsonl_result res = {.prompt_tokens = 2, .gen_ids = gen, .n_gen = 3,
                           .text = text, .text_len = sizeof text - 1};
    char *out;
    size_t len;
    assert_int_equal(rt_jsonl_format_result(&r, &res, &out, &len), MC_OK);
    assert_string_equal(out,
                        "{\"id\":\"q\",\"line\":3,\"prompt_tokens\":2,"
                        "\"generated_tokens\":3,\"stop_reason\":\"length\","
                        "\"ids\":[5,6,7],\"text\":\"a\\n\\\"\\u0001\\ufffd"
                        "\\ufffd\"}\n");
    assert_int_equal(len, strlen(out));
    char *id;
    int failed;
    assert_int_equal(rt_jsonl_output_id(out, len - 1, &id, &failed, &e),
                     MC_OK);
    assert_string_equal(id, "\"q\"");
    assert_false(failed);
    free(id);
    free(out);
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [4, \"b\"], "
                           "\"continuation\": [2, 3]}", 8, NULL, &r, &e),
                     MC_ERR_FORMAT); /* a text label needs the tokenizer */
    rt_jsonl_req_free(&r);
    assert_int_equal(parse("{\"ids\": [1], \"labels\": [4, [9, 10]], "
                           "\"continuation\": [2, 3]}", 8, NULL, &r, &e),
                     MC_OK);
    const float lab[2] = {-2.5f, -0.125f}, cont[2] = {-1.0f, -0.1f};
    rt_jsonl_result sr = {.prompt_tokens = 1, .label_logprobs = lab,
                          .cont_logprobs = cont};
    assert_int_equal(rt_jsonl_format_result(&r, &sr, &out, &len), MC_OK);
    assert_string_equal(out,
                        "{\"id\":8,\"line\":8,\"prompt_tokens\":1,\"labels\":"
                        "[{\"label\":4,\"logprob\":-2.5,\"tokens\":1},"
                        "{\"label\":[9,10],\"logprob\":-0.125,\"tokens\":2}],"
                        "\"label\":[9,10],"
                        "\"continuation_logprobs\":[-1,-0.100000001],"
                        "\"continuation_sum\":-1.1000000014901161}\n");
    free(out);
    rt_jsonl_req_free(&r);
    assert_int_equal(rt_jsonl_format_error(NULL, 12, "beyond \"plan\"", 8,
                                           512, &out, &len),
                     MC_OK);
    assert_string_equal(out, "{\"id\":12,\"line\":12,\"error\":\"beyond "
                             "\\\"plan\\\"\",\"max_batch\":8,\"max_seq\":512}"
                             "\n");
    assert_int_equal(rt_jsonl_output_id(out, len, &id, &failed, &e), MC_OK);
    assert_string_equal(id, "12");
    assert_true(failed);
    free(id);
    free(out);
    assert_int_equal(rt_jsonl_output_id("{\"id\":1}", 8, &id, &failed, &e),
                     MC_ERR_FORMAT);
    assert_int_equal(rt_jsonl_output_id("{\"id\":1,\"li", 12, &id, &failed,
                                        &e),
                     MC_ERR_FORMAT);
    assert_null(id);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_parses_every_key),
        cmocka_unit_test(test_jsonl_rejects_bad_lines_naming_line_and_key),
        cmocka_unit_test(test_jsonl_text_through_the_tokenizer),
        cmocka_unit_test(test_jsonl_output_bytes_are_fixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

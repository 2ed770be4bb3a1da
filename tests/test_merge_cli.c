/* test_merge_cli.c - `mcompile merge` end to end through the real binary:
 * exit codes (0 ok, 1 error, 2 usage), the --json report, byte-identical
 * output across runs, refusals that leave nothing behind, a sharded
 * output whose index is rewritten, and a tied lm_head that gets untied. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_model.h"
#include "testutil.h"

#define BIN MC_BIN_DIR "/mcompile"
#define FX MC_FIXTURE_DIR

static int run_merge(const char *args, char **out, char **err)
{
    char *cmd = tu_fmt("'%s' merge %s", BIN, args);
    int rc = tu_run(cmd, out, err);
    free(cmd);
    return rc;
}

static int same_file(const char *a, const char *b)
{
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

static void test_merge_cli_help_goes_to_stdout_exit_0(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(run_merge("--help", &out, &err), 0);
    assert_non_null(strstr(out, "usage: mcompile merge BASE --lora"));
    assert_string_equal(err, "");
    free(out);
    free(err);
}

static void test_merge_cli_usage_errors_exit_2(void **state)
{
    (void)state;
    const char *cases[] = {
        "",
        FX "/llama -o /tmp/x",                                  /* no --lora */
        FX "/llama --lora " FX "/adapters/llama-plain",         /* no -o */
        FX "/llama --lora " FX "/adapters/llama-plain -o /tmp/x --dtype f8",
        FX "/llama --lora " FX "/adapters/llama-plain -o /tmp/x --frobnicate",
        FX "/llama " FX "/qwen2 --lora " FX "/adapters/llama-plain -o /tmp/x",
        FX "/llama --lora",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL, *err = NULL;
        int rc = run_merge(cases[i], &out, &err);
        if (rc != 2)
            fail_msg("'%s': exit %d, stderr %s", cases[i], rc, err);
        assert_non_null(strstr(err, "mcompile merge"));
        assert_string_equal(out, "");
        free(out);
        free(err);
    }
}

static void test_merge_cli_json_report_and_byte_identical_runs(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("cli");
    char *args1 = tu_fmt(FX "/llama --lora " FX "/adapters/llama-plain:0.5 "
                            "--lora " FX "/adapters/llama-dora -o %s/a --json",
                         tmp);
    char *args2 = tu_fmt(FX "/llama --lora " FX "/adapters/llama-plain:0.5 "
                            "--lora " FX "/adapters/llama-dora -o %s/b -q",
                         tmp);
    char *out = NULL, *err = NULL;
    assert_int_equal(run_merge(args1, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    if (!j)
        fail_msg("not JSON: %s", out);
    const char *keys[] = {"status", "tensors", "tensors_touched", "adapters",
                          "max_abs_delta", "bytes_written", "seconds",
                          "untied_lm_head", "output"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!json_object_get(j, keys[i]))
            fail_msg("--json lacks \"%s\": %s", keys[i], out);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    assert_int_equal(json_array_size(json_object_get(j, "adapters")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors_touched")),
                     13); /* q, v, down x 4 + embed */
    assert_true(json_real_value(json_object_get(j, "max_abs_delta")) > 0);
    assert_true(json_integer_value(json_object_get(j, "bytes_written")) > 0);
    json_decref(j);
    free(out);
    free(err);
    assert_int_equal(run_merge(args2, &out, &err), 0);
    assert_string_equal(out, ""); /* -q */
    free(out);
    free(err);
    const char *files[] = {"model.safetensors", "config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *a = tu_fmt("%s/a/%s", tmp, files[i]);
        char *b = tu_fmt("%s/b/%s", tmp, files[i]);
        assert_true(same_file(a, b));
        free(a);
        free(b);
    }
    char *o = tu_fmt("%s/a", tmp);
    fmt_model *m = NULL;
    assert_int_equal(fmt_model_open(o, &m, NULL), MC_OK);
    fmt_model_close(m);
    free(o);
    tu_rmtree(tmp);
    free(tmp);
    free(args1);
    free(args2);
}

/* Each refusal: exit 1, a message naming the problem, no output directory
 * and no temporary files next to it. */
static void test_merge_cli_refusals_exit_1_and_leave_nothing(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("clirefuse");
    /* A truncated copy of the base. */
    char *cp = tu_fmt("mkdir -p '%s/../%s-trunc' && cp -r '%s/llama/.' "
                      "'%s/../%s-trunc/' && truncate -s -100 "
                      "'%s/../%s-trunc/model.safetensors'",
                      tmp, strrchr(tmp, '/') + 1, FX, tmp,
                      strrchr(tmp, '/') + 1, tmp, strrchr(tmp, '/') + 1);
    assert_int_equal(system(cp), 0);
    free(cp);
    char *trunc = tu_fmt("%s/../%s-trunc", tmp, strrchr(tmp, '/') + 1);
    struct {
        const char *base, *adapter, *expect;
    } cases[] = {
        {FX "/llama", FX "/adapters/mistral-plain", "shape mismatch"},
        {FX "/llama", FX "/adapters/nonexistent", "cannot open"},
        {FX "/llama", MC_SOURCE_DIR "/tests/invalid/adapter/nan_in_lora_B",
         "NaN or infinite"},
        {FX "/llama", MC_SOURCE_DIR "/tests/invalid/adapter/init_pissa",
         "convert it at save time"},
        {FX "/llama", MC_SOURCE_DIR "/tests/invalid/adapter/rank_mismatch_A_B",
         "rank mismatch"},
        {FX "/llama", MC_SOURCE_DIR "/tests/invalid/adapter/truncated_safetensors",
         "adapter_model.safetensors"},
        {FX "/llama", MC_SOURCE_DIR "/tests/invalid/adapter/key_without_prefix",
         "base_model.model."},
        {trunc, FX "/adapters/llama-plain", "model.safetensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *args = tu_fmt("%s --lora %s -o %s/out --json", cases[i].base,
                            cases[i].adapter, tmp);
        char *out = NULL, *err = NULL;
        assert_int_equal(run_merge(args, &out, &err), 1);
        if (!strstr(err, cases[i].expect))
            fail_msg("stderr lacks '%s': %s", cases[i].expect, err);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        assert_string_equal(json_string_value(json_object_get(j, "status")),
                            "error");
        json_decref(j);
        assert_int_equal(tu_count_entries(tmp), 0);
        free(out);
        free(err);
        free(args);
    }
    tu_rmtree(trunc);
    free(trunc);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_refuses_output_equal_to_input(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("cliself");
    char *cp = tu_fmt("cp -r '%s/llama' '%s/base'", FX, tmp);
    assert_int_equal(system(cp), 0);
    free(cp);
    char *cfg = tu_fmt("%s/base/config.json", tmp);
    size_t before_len;
    char *before = tu_read_file(cfg, &before_len);
    const char *outs[] = {"base", "base/inner", "."};
    for (size_t i = 0; i < 3; i++) {
        char *args = tu_fmt("%s/base --lora " FX "/adapters/llama-plain -o "
                            "%s/%s", tmp, tmp, outs[i]);
        char *out = NULL, *err = NULL;
        assert_int_equal(run_merge(args, &out, &err), 1);
        assert_non_null(strstr(err, "refusing to overwrite an input"));
        free(out);
        free(err);
        free(args);
    }
    assert_int_equal(tu_count_entries(tmp), 1);
    char *base = tu_fmt("%s/base", tmp);
    assert_int_equal(tu_count_entries(base), 2);
    char *after = tu_read_file(cfg, NULL);
    assert_string_equal(before, after);
    free(before);
    free(after);
    free(cfg);
    free(base);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_failure_keeps_previous_output(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("clikeep");
    char *ok = tu_fmt(FX "/llama --lora " FX "/adapters/llama-plain -o %s/out",
                      tmp);
    char *bad = tu_fmt(FX "/llama --lora " FX "/adapters/mistral-plain -o "
                          "%s/out", tmp);
    assert_int_equal(run_merge(ok, NULL, NULL), 0);
    char *st = tu_fmt("%s/out/model.safetensors", tmp);
    size_t n1;
    char *before = tu_read_file(st, &n1);
    assert_int_equal(run_merge(bad, NULL, NULL), 1);
    assert_true(tu_exists(st));
    size_t n2;
    char *after = tu_read_file(st, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    assert_int_equal(tu_count_entries(tmp), 1);
    free(before);
    free(after);
    free(st);
    free(ok);
    free(bad);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_sharded_output_has_updated_index(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("clishard");
    char *args = tu_fmt(FX "/llama-sharded --lora " FX "/adapters/llama-plain "
                           "-o %s/out --dtype bf16", tmp);
    assert_int_equal(run_merge(args, NULL, NULL), 0);
    char *idx = tu_fmt("%s/out/model.safetensors.index.json", tmp);
    json_t *j = json_load_file(idx, 0, NULL);
    assert_non_null(j);
    json_int_t total =
        json_integer_value(json_object_get(json_object_get(j, "metadata"),
                                           "total_size"));
    char *o = tu_fmt("%s/out", tmp);
    fmt_model *m = NULL;
    assert_int_equal(fmt_model_open(o, &m, NULL), MC_OK);
    assert_int_equal(fmt_model_shard_count(m), 3);
    assert_int_equal((uint64_t)total, fmt_model_total_bytes(m));
    /* bf16: half the bytes of the F32 input. */
    fmt_model *in = NULL;
    assert_int_equal(fmt_model_open(FX "/llama-sharded", &in, NULL), MC_OK);
    assert_int_equal(2 * fmt_model_total_bytes(m), fmt_model_total_bytes(in));
    fmt_model_close(in);
    fmt_model_close(m);
    json_decref(j);
    char *cfg = tu_fmt("%s/out/config.json", tmp);
    j = json_load_file(cfg, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "torch_dtype")),
                        "bfloat16");
    json_decref(j);
    free(cfg);
    free(o);
    free(idx);
    free(args);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_unties_tied_lm_head(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("clitie");
    char *args = tu_fmt(FX "/qwen2 --lora " FX "/adapters/qwen2-lm-head -o "
                           "%s/out --json", tmp);
    char *out = NULL;
    assert_int_equal(run_merge(args, &out, NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_true(json_is_true(json_object_get(j, "untied_lm_head")));
    json_decref(j);
    char *cfg = tu_fmt("%s/out/config.json", tmp);
    j = json_load_file(cfg, 0, NULL);
    assert_true(json_is_false(json_object_get(j, "tie_word_embeddings")));
    json_decref(j);
    char *o = tu_fmt("%s/out", tmp);
    fmt_model *m = NULL;
    assert_int_equal(fmt_model_open(o, &m, NULL), MC_OK);
    assert_non_null(fmt_model_find(m, "lm_head.weight", NULL));
    assert_non_null(fmt_model_find(m, "model.embed_tokens.weight", NULL));
    fmt_model_close(m);
    free(o);
    free(cfg);
    free(out);
    free(args);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_accepts_safetensors_file_as_base(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("clifile");
    char *args = tu_fmt(FX "/llama-bf16/model.safetensors --lora " FX
                           "/adapters/llama-embed -o %s/out -v", tmp);
    char *out = NULL;
    assert_int_equal(run_merge(args, &out, NULL), 0);
    assert_non_null(strstr(out, "changes model.embed_tokens.weight"));
    char *cfg = tu_fmt("%s/out/config.json", tmp);
    char *src = tu_fmt("%s/llama-bf16/config.json", FX);
    assert_true(same_file(cfg, src)); /* copied byte for byte */
    free(cfg);
    free(src);
    free(out);
    free(args);
    tu_rmtree(tmp);
    free(tmp);
}

static void test_merge_cli_merges_stories260k_in_place(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k not found under MC_SHARED_DIR: skipped");
    /* The fixture q_proj adapter fits stories' q_proj [64, 64]. */
    char *tmp = tu_mkdtemp("clistories");
    char *args = tu_fmt("%s --lora " FX "/adapters/llama-fifo -o %s/out --json",
                        sd, tmp);
    char *out = NULL, *err = NULL;
    int rc = run_merge(args, &out, &err);
    if (rc != 0)
        fail_msg("exit %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "tensors_touched")),
                     4);
    json_decref(j);
    free(out);
    free(err);
    free(args);
    tu_rmtree(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_cli_help_goes_to_stdout_exit_0),
        cmocka_unit_test(test_merge_cli_usage_errors_exit_2),
        cmocka_unit_test(test_merge_cli_json_report_and_byte_identical_runs),
        cmocka_unit_test(test_merge_cli_refusals_exit_1_and_leave_nothing),
        cmocka_unit_test(test_merge_cli_refuses_output_equal_to_input),
        cmocka_unit_test(test_merge_cli_failure_keeps_previous_output),
        cmocka_unit_test(test_merge_cli_sharded_output_has_updated_index),
        cmocka_unit_test(test_merge_cli_unties_tied_lm_head),
        cmocka_unit_test(test_merge_cli_accepts_safetensors_file_as_base),
        cmocka_unit_test(test_merge_cli_merges_stories260k_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_config.c - config.json parsing: defaults per architecture, RoPE
 * variants, biases and sliding windows, range checks, and the invalid-case
 * data folder tests/invalid/config/. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_config.h"
#include "invalid_cases.h"
#include "mc_alloc.h"
#include "testutil.h"

static mc_status parse(const char *json, fmt_model_config *c, mc_error *e)
{
    mc_error_clear(e);
    return fmt_config_parse(json, strlen(json), "config.json", c, e);
}

#define LLAMA_CORE                                                             \
    "\"hidden_size\": 64, \"intermediate_size\": 160, "                        \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 8, "                   \
    "\"vocab_size\": 256"

static void test_config_llama_defaults(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE "}", &c,
                           &e),
                     MC_OK);
    assert_int_equal(c.arch, FMT_ARCH_LLAMA);
    assert_string_equal(c.model_type, "llama");
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 8);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_int_equal(c.tie_word_embeddings, 0);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.rope.type, FMT_ROPE_DEFAULT);
    assert_true(c.rope.factor == 1.0);
    assert_int_equal(c.qkv_bias, 0);
    assert_int_equal(c.o_bias, 0);
    assert_int_equal(c.mlp_bias, 0);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.torch_dtype, FMT_DT_INVALID);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(fmt_config_q_dim(&c), 64);
    assert_int_equal(fmt_config_kv_dim(&c), 64);
}

static void test_config_mistral_defaults_kv8_eps_window(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"mistral\", \"hidden_size\": 256,"
                           " \"intermediate_size\": 512, \"num_hidden_layers\":"
                           " 2, \"num_attention_heads\": 16, \"vocab_size\": "
                           "100}", &c, &e),
                     MC_OK);
    assert_int_equal(c.arch, FMT_ARCH_MISTRAL);
    assert_int_equal(c.num_kv_heads, 8);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(fmt_config_layer_window(&c, 0), 4096);
    assert_int_equal(fmt_config_layer_window(&c, 1), 4096);
}

static void test_config_mistral_null_sliding_window_means_full(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"mistral\", " LLAMA_CORE
                           ", \"num_key_value_heads\": 2, "
                           "\"sliding_window\": null}", &c, &e),
                     MC_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(fmt_config_layer_window(&c, 3), 0);
    assert_int_equal(parse("{\"model_type\": \"mistral\", " LLAMA_CORE
                           ", \"num_key_value_heads\": 2, "
                           "\"sliding_window\": 32}", &c, &e),
                     MC_OK);
    assert_int_equal(c.sliding_window, 32);
}

static void test_config_qwen2_biases_and_window_layers(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"qwen2\", " LLAMA_CORE
                           ", \"sliding_window\": 16}", &c, &e),
                     MC_OK);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.o_bias, 0);
    assert_int_equal(c.mlp_bias, 0);
    /* use_sliding_window defaults to false: the window is ignored. */
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(parse("{\"model_type\": \"qwen2\", " LLAMA_CORE
                           ", \"sliding_window\": 16, \"use_sliding_window\": "
                           "true, \"max_window_layers\": 2}", &c, &e),
                     MC_OK);
    assert_int_equal(c.sliding_window, 16);
    assert_int_equal(c.max_window_layers, 2);
    assert_int_equal(fmt_config_layer_window(&c, 1), 0);
    assert_int_equal(fmt_config_layer_window(&c, 2), 16);
    assert_int_equal(fmt_config_layer_window(&c, 3), 16);
}

static void test_config_llama_attention_and_mlp_bias(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"attention_bias\": true, \"mlp_bias\": true}",
                           &c, &e),
                     MC_OK);
    assert_int_equal(c.qkv_bias, 1);
    assert_int_equal(c.o_bias, 1);
    assert_int_equal(c.mlp_bias, 1);
}

static void test_config_explicit_head_dim_and_gqa(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"num_key_value_heads\": 2, \"head_dim\": 16}",
                           &c, &e),
                     MC_OK);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(fmt_config_q_dim(&c), 128);
    assert_int_equal(fmt_config_kv_dim(&c), 32);
}

static void test_config_rope_scaling_type_and_rope_type(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"rope_scaling\": {\"type\": \"linear\", "
                           "\"factor\": 2.0}}", &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_LINEAR);
    assert_true(c.rope.factor == 2.0);
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"rope_theta\": 500000.0, \"rope_scaling\": "
                           "{\"rope_type\": \"llama3\", \"factor\": 8.0, "
                           "\"low_freq_factor\": 1.0, \"high_freq_factor\": "
                           "4.0, \"original_max_position_embeddings\": 8192}}",
                           &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 8.0);
    assert_true(c.rope.low_freq_factor == 1.0);
    assert_true(c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_pos, 8192);
    assert_int_equal(parse("{\"model_type\": \"qwen2\", " LLAMA_CORE
                           ", \"rope_scaling\": {\"type\": \"yarn\", "
                           "\"factor\": 4}}", &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_YARN);
    assert_true(c.rope.beta_fast == 32.0);
    assert_true(c.rope.beta_slow == 1.0);
    assert_true(c.rope.attention_factor == 0.0);
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"rope_scaling\": {\"rope_type\": \"dynamic\", "
                           "\"factor\": 2.5}}", &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_DYNAMIC);
}

static void test_config_rope_parameters_holds_theta(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"rope_parameters\": {\"rope_type\": "
                           "\"default\", \"rope_theta\": 1000000.0}}",
                           &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_DEFAULT);
    assert_true(c.rope.theta == 1e6);
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"rope_parameters\": {\"rope_type\": "
                           "\"linear\", \"factor\": 4, \"rope_theta\": 5e5}}",
                           &c, &e),
                     MC_OK);
    assert_int_equal(c.rope.type, FMT_ROPE_LINEAR);
    assert_true(c.rope.theta == 5e5);
    assert_true(c.rope.factor == 4.0);
}

static void test_config_eos_int_or_list_and_dtype(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"bos_token_id\": 1, \"eos_token_id\": 2, "
                           "\"torch_dtype\": \"bfloat16\"}", &c, &e),
                     MC_OK);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.torch_dtype, FMT_DT_BF16);
    assert_int_equal(parse("{\"model_type\": \"llama\", " LLAMA_CORE
                           ", \"eos_token_id\": [2, 7, 9], \"dtype\": "
                           "\"float16\"}", &c, &e),
                     MC_OK);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_token_ids[2], 9);
    assert_int_equal(c.torch_dtype, FMT_DT_F16);
}

static void test_config_architectures_fallback_without_model_type(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    assert_int_equal(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], "
                           LLAMA_CORE "}", &c, &e),
                     MC_OK);
    assert_int_equal(c.arch, FMT_ARCH_QWEN2);
}

/* Each field error must name the field. */
static void expect_fail(const char *json, mc_status st, const char *field,
                        const char *msg_part)
{
    fmt_model_config c;
    mc_error e;
    mc_status got = parse(json, &c, &e);
    if (got != st || (field && strcmp(e.field, field) != 0) ||
        (msg_part && !strstr(e.message, msg_part))) {
        char buf[1200];
        print_error("input %s\n -> status %d, %s\n", json, got,
                    mc_error_format(&e, buf, sizeof buf));
        fail();
    }
}

static void test_config_rejects_out_of_range_counts_naming_field(void **state)
{
    (void)state;
    expect_fail("{\"model_type\": \"llama\", \"hidden_size\": 0, "
                "\"intermediate_size\": 160, \"num_hidden_layers\": 4, "
                "\"num_attention_heads\": 8, \"vocab_size\": 256}",
                MC_ERR_FORMAT, "hidden_size", "out of range");
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"num_key_value_heads\": 3}",
                MC_ERR_FORMAT, "num_key_value_heads", "divide");
    expect_fail("{\"model_type\": \"llama\", \"hidden_size\": 60, "
                "\"intermediate_size\": 160, \"num_hidden_layers\": 4, "
                "\"num_attention_heads\": 8, \"vocab_size\": 256}",
                MC_ERR_FORMAT, "hidden_size", "multiple");
    expect_fail("{\"model_type\": \"llama\", \"hidden_size\": 64, "
                "\"intermediate_size\": 160, \"num_hidden_layers\": 99999, "
                "\"num_attention_heads\": 8, \"vocab_size\": 256}",
                MC_ERR_FORMAT, "num_hidden_layers", NULL);
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"rms_norm_eps\": -1}", MC_ERR_FORMAT, "rms_norm_eps",
                NULL);
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"eos_token_id\": 256}", MC_ERR_FORMAT, "eos_token_id",
                "vocabulary");
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"head_dim\": 7}", MC_ERR_FORMAT, "head_dim", NULL);
    expect_fail("{\"model_type\": \"llama\", \"hidden_size\": 64.0, "
                "\"intermediate_size\": 160, \"num_hidden_layers\": 4, "
                "\"num_attention_heads\": 8, \"vocab_size\": 256}",
                MC_ERR_FORMAT, "hidden_size", "integer");
}

static void test_config_rejects_unsupported_activation_and_rope(void **state)
{
    (void)state;
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"hidden_act\": \"gelu\"}", MC_ERR_UNSUPPORTED,
                "hidden_act", "silu");
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 2}}",
                MC_ERR_UNSUPPORTED, "rope_scaling", "longrope");
    expect_fail("{\"model_type\": \"gpt2\", " LLAMA_CORE "}",
                MC_ERR_UNSUPPORTED, "model_type", "gpt2");
    expect_fail("{" LLAMA_CORE "}", MC_ERR_NOT_FOUND, "model_type", NULL);
}

static void test_config_rejects_duplicate_keys_and_bad_json(void **state)
{
    (void)state;
    expect_fail("{\"model_type\": \"llama\", " LLAMA_CORE
                ", \"vocab_size\": 512}", MC_ERR_FORMAT, "", "duplicate");
    expect_fail("{\"model_type\": \"llama\", ", MC_ERR_FORMAT, "", "JSON");
    expect_fail("[1, 2]", MC_ERR_FORMAT, "", "object");
}

static int same_config(const fmt_model_config *a, const fmt_model_config *b)
{
    return a->arch == b->arch && strcmp(a->model_type, b->model_type) == 0 &&
           a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size &&
           a->num_layers == b->num_layers && a->num_heads == b->num_heads &&
           a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim &&
           a->vocab_size == b->vocab_size &&
           a->max_position_embeddings == b->max_position_embeddings &&
           a->rms_norm_eps == b->rms_norm_eps &&
           a->tie_word_embeddings == b->tie_word_embeddings &&
           a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias &&
           a->mlp_bias == b->mlp_bias && a->rope.type == b->rope.type &&
           a->rope.theta == b->rope.theta && a->rope.factor == b->rope.factor &&
           a->rope.low_freq_factor == b->rope.low_freq_factor &&
           a->rope.high_freq_factor == b->rope.high_freq_factor &&
           a->rope.original_max_pos == b->rope.original_max_pos &&
           a->rope.beta_fast == b->rope.beta_fast &&
           a->rope.beta_slow == b->rope.beta_slow &&
           a->rope.attention_factor == b->rope.attention_factor &&
           a->sliding_window == b->sliding_window &&
           a->max_window_layers == b->max_window_layers &&
           a->torch_dtype == b->torch_dtype &&
           a->bos_token_id == b->bos_token_id && a->n_eos == b->n_eos &&
           memcmp(a->eos_token_ids, b->eos_token_ids,
                  sizeof a->eos_token_ids) == 0;
}

static void test_config_to_json_round_trips(void **state)
{
    (void)state;
    const char *inputs[] = {
        "{\"model_type\": \"llama\", " LLAMA_CORE
        ", \"num_key_value_heads\": 2, \"rope_scaling\": {\"rope_type\": "
        "\"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
        "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": "
        "8192}, \"eos_token_id\": [2, 3], \"bos_token_id\": 1, "
        "\"torch_dtype\": \"float32\", \"rms_norm_eps\": 1e-5, "
        "\"attention_bias\": true}",
        "{\"model_type\": \"mistral\", " LLAMA_CORE
        ", \"num_key_value_heads\": 4, \"sliding_window\": null}",
        "{\"model_type\": \"qwen2\", " LLAMA_CORE
        ", \"use_sliding_window\": true, \"sliding_window\": 8, "
        "\"max_window_layers\": 1, \"tie_word_embeddings\": true, "
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
        "\"attention_factor\": 1.5}}",
    };
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        fmt_model_config a, b;
        mc_error e;
        assert_int_equal(parse(inputs[i], &a, &e), MC_OK);
        char *text = fmt_config_to_json(&a);
        assert_non_null(text);
        assert_int_equal(parse(text, &b, &e), MC_OK);
        assert_true(same_config(&a, &b));
        mc_free(text);
    }
}

static void test_config_survives_every_allocation_failure(void **state)
{
    (void)state;
    mc_alloc_install_jansson();
    const char *json = "{\"model_type\": \"llama\", " LLAMA_CORE
                       ", \"eos_token_id\": [1, 2]}";
    for (long n = 0;; n++) {
        fmt_model_config c;
        mc_error e;
        mc_alloc_fail_after(n);
        mc_status st = parse(json, &c, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
    }
}

static void test_config_loads_stories260k(void **state)
{
    (void)state;
    const char *dir = tu_stories_dir();
    TU_SKIP_IF(!dir, "stories260k not found under MC_SHARED_DIR");
    char *path = tu_fmt("%s/config.json", dir);
    fmt_model_config c;
    mc_error e;
    assert_int_equal(fmt_config_load(path, &c, &e), MC_OK);
    assert_int_equal(c.hidden_size, 64);
    assert_int_equal(c.intermediate_size, 172);
    assert_int_equal(c.num_layers, 5);
    assert_int_equal(c.num_kv_heads, 4);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.tie_word_embeddings, 1);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_int_equal(c.torch_dtype, FMT_DT_F32);
    free(path);
}

static void test_config_load_reports_missing_file(void **state)
{
    (void)state;
    fmt_model_config c;
    mc_error e;
    mc_error_clear(&e);
    assert_int_equal(fmt_config_load("/nonexistent/config.json", &c, &e),
                     MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, "/nonexistent/config.json");
}

/* tests/invalid/config/<case>/config.json must fail with a message that
 * contains the text of <case>/expect and names the file. */
static void check_invalid_config(const char *case_dir, const char *expect,
                                 void *ctx)
{
    (void)ctx;
    char *path = tu_fmt("%s/config.json", case_dir);
    fmt_model_config c;
    mc_error e;
    mc_error_clear(&e);
    mc_status st = fmt_config_load(path, &c, &e);
    free(path);
    if (st == MC_OK)
        fail_msg("%s: accepted", case_dir);
    char msg[2048];
    mc_error_format(&e, msg, sizeof msg);
    tu_assert_case_error(case_dir, expect, msg);
}

static void test_config_rejects_each_invalid_case(void **state)
{
    (void)state;
    int n = tu_for_each_invalid_case("config", check_invalid_config, NULL);
    assert_true(n >= 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_llama_defaults),
        cmocka_unit_test(test_config_mistral_defaults_kv8_eps_window),
        cmocka_unit_test(test_config_mistral_null_sliding_window_means_full),
        cmocka_unit_test(test_config_qwen2_biases_and_window_layers),
        cmocka_unit_test(test_config_llama_attention_and_mlp_bias),
        cmocka_unit_test(test_config_explicit_head_dim_and_gqa),
        cmocka_unit_test(test_config_rope_scaling_type_and_rope_type),
        cmocka_unit_test(test_config_rope_parameters_holds_theta),
        cmocka_unit_test(test_config_eos_int_or_list_and_dtype),
        cmocka_unit_test(test_config_architectures_fallback_without_model_type),
        cmocka_unit_test(test_config_rejects_out_of_range_counts_naming_field),
        cmocka_unit_test(test_config_rejects_unsupported_activation_and_rope),
        cmocka_unit_test(test_config_rejects_duplicate_keys_and_bad_json),
        cmocka_unit_test(test_config_to_json_round_trips),
        cmocka_unit_test(test_config_survives_every_allocation_failure),
        cmocka_unit_test(test_config_loads_stories260k),
        cmocka_unit_test(test_config_load_reports_missing_file),
        cmocka_unit_test(test_config_rejects_each_invalid_case),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

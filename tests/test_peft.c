/* test_peft.c - adapter_config.json parsing, PEFT module selection
 * (list / regex / all-linear / exclude / layers_to_transform), rank and
 * alpha patterns, adapter files mapped to base module names, and the
 * invalid-adapter data folder tests/invalid/adapter/. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_peft.h"
#include "invalid_cases.h"
#include "mc_alloc.h"
#include "testutil.h"

static mc_status parse(const char *json, fmt_peft_config *c)
{
    mc_error e;
    mc_error_clear(&e);
    mc_status st = fmt_peft_config_parse(json, strlen(json), "cfg", c, &e);
    if (st) {
        char buf[1500];
        print_message("parse: %s\n", mc_error_format(&e, buf, sizeof buf));
    }
    return st;
}

#define Q0 "model.layers.0.self_attn.q_proj"

static void test_peft_config_defaults(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"target_modules\": [\"q_proj\"]}", &c), MC_OK);
    assert_int_equal(c.r, 8);
    assert_true(c.lora_alpha == 8.0);
    assert_int_equal(c.bias, FMT_PEFT_BIAS_NONE);
    assert_int_equal(c.use_rslora, 0);
    assert_int_equal(c.use_dora, 0);
    assert_string_equal(c.init, "true");
    uint32_t r;
    double alpha, s;
    fmt_peft_module_params(&c, Q0, &r, &alpha, &s);
    assert_int_equal(r, 8);
    assert_true(s == 1.0);
    fmt_peft_config_free(&c);
    fmt_peft_config_free(NULL);
}

static void test_peft_list_target_matches_exact_or_dot_suffix(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"target_modules\": [\"q_proj\", "
                           "\"model.layers.1.mlp.up_proj\"]}", &c),
                     MC_OK);
    assert_true(fmt_peft_selects(&c, Q0, 1));
    assert_true(fmt_peft_selects(&c, "q_proj", 1));
    assert_false(fmt_peft_selects(&c, "model.layers.0.self_attn.xq_proj", 1));
    assert_true(fmt_peft_selects(&c, "model.layers.1.mlp.up_proj", 1));
    assert_false(fmt_peft_selects(&c, "model.layers.0.mlp.up_proj", 1));
    fmt_peft_config_free(&c);
}

static void test_peft_regex_target_must_match_whole_name(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"target_modules\": "
                           "\".*layers\\\\.\\\\d\\\\.self_attn\\\\.(q|v)_proj\"}",
                           &c),
                     MC_OK);
    assert_non_null(c.target.regex);
    assert_true(fmt_peft_selects(&c, Q0, 1));
    assert_true(fmt_peft_selects(&c, "model.layers.3.self_attn.v_proj", 1));
    assert_false(fmt_peft_selects(&c, "model.layers.3.self_attn.k_proj", 1));
    /* Full match: a longer name does not match. */
    assert_false(fmt_peft_selects(&c, "model.layers.3.self_attn.v_proj.x", 1));
    assert_false(fmt_peft_selects(&c, "model.layers.12.self_attn.v_proj", 1));
    fmt_peft_config_free(&c);
}

static void test_peft_all_linear_excludes_output_layer(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"target_modules\": \"all-linear\", "
                           "\"exclude_modules\": [\"down_proj\"]}", &c),
                     MC_OK);
    assert_true(c.target.all_linear);
    assert_true(fmt_peft_selects(&c, Q0, 1));
    assert_false(fmt_peft_selects(&c, "lm_head", 0));
    assert_false(fmt_peft_selects(&c, "model.layers.0.mlp.down_proj", 1));
    fmt_peft_config_free(&c);
}

static void test_peft_layers_to_transform_narrows_list_targets(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"target_modules\": [\"q_proj\", \"lm_head\"], "
                           "\"layers_to_transform\": [1, 3], "
                           "\"layers_pattern\": \"layers\"}", &c),
                     MC_OK);
    assert_false(fmt_peft_selects(&c, Q0, 1));
    assert_true(fmt_peft_selects(&c, "model.layers.1.self_attn.q_proj", 1));
    assert_true(fmt_peft_selects(&c, "model.layers.3.self_attn.q_proj", 1));
    /* No layer index: not selected when layers_to_transform is set. */
    assert_false(fmt_peft_selects(&c, "lm_head", 0));
    fmt_peft_config_free(&c);
    assert_int_equal(parse("{\"target_modules\": [\"q_proj\"], "
                           "\"layers_to_transform\": 2}", &c),
                     MC_OK);
    assert_true(fmt_peft_selects(&c, "model.layers.2.self_attn.q_proj", 1));
    assert_false(fmt_peft_selects(&c, "model.layers.12.self_attn.q_proj", 1));
    fmt_peft_config_free(&c);
    /* PEFT applies layers_to_transform to list targets only. */
    assert_int_equal(parse("{\"target_modules\": \".*q_proj\", "
                           "\"layers_to_transform\": [1]}", &c),
                     MC_OK);
    assert_true(fmt_peft_selects(&c, Q0, 1));
    fmt_peft_config_free(&c);
}

static void test_peft_rank_and_alpha_pattern_first_match_wins(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"r\": 8, \"lora_alpha\": 16, \"target_modules\":"
                           " [\"q_proj\", \"v_proj\"], \"rank_pattern\": "
                           "{\"layers.0.self_attn.q_proj\": 2, \"q_proj\": 4},"
                           " \"alpha_pattern\": {\"v_proj\": 3}}", &c),
                     MC_OK);
    uint32_t r;
    double a, s;
    fmt_peft_module_params(&c, Q0, &r, &a, &s);
    assert_int_equal(r, 2);
    assert_true(a == 16.0 && s == 8.0);
    fmt_peft_module_params(&c, "model.layers.1.self_attn.q_proj", &r, &a, &s);
    assert_int_equal(r, 4);
    assert_true(s == 4.0);
    fmt_peft_module_params(&c, "model.layers.1.self_attn.v_proj", &r, &a, &s);
    assert_int_equal(r, 8);
    assert_true(a == 3.0 && s == 3.0 / 8.0);
    /* "(.*\.)?(key)$": the key must end at a component boundary. */
    fmt_peft_module_params(&c, "model.layers.1.self_attn.xq_proj", &r, &a, &s);
    assert_int_equal(r, 8);
    fmt_peft_config_free(&c);
}

static void test_peft_rslora_scales_by_sqrt_rank(void **state)
{
    (void)state;
    fmt_peft_config c;
    assert_int_equal(parse("{\"r\": 16, \"lora_alpha\": 8, \"use_rslora\": "
                           "true, \"target_modules\": [\"q_proj\"]}", &c),
                     MC_OK);
    double s;
    fmt_peft_module_params(&c, Q0, NULL, NULL, &s);
    assert_true(s == 2.0);
    fmt_peft_config_free(&c);
}

static void test_peft_refuses_base_changing_init(void **state)
{
    (void)state;
    const char *inits[] = {"pissa", "pissa_niter_16", "olora", "corda",
                           "loftq", "lora_ga"};
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
        char *json = tu_fmt("{\"init_lora_weights\": \"%s\"}", inits[i]);
        fmt_peft_config c;
        mc_error e;
        assert_int_equal(fmt_peft_config_parse(json, strlen(json), "cfg", &c,
                                               &e),
                         MC_ERR_UNSUPPORTED);
        assert_string_equal(e.field, "init_lora_weights");
        assert_non_null(strstr(e.message, "convert it at save time"));
        free(json);
    }
    fmt_peft_config c;
    assert_int_equal(parse("{\"init_lora_weights\": \"gaussian\"}", &c), MC_OK);
    fmt_peft_config_free(&c);
}

static void test_peft_config_survives_allocation_failures(void **state)
{
    (void)state;
    mc_alloc_install_jansson();
    const char *json = "{\"r\": 4, \"target_modules\": [\"q_proj\", \"v\"], "
                       "\"rank_pattern\": {\"q\": 2}, \"alpha_pattern\": "
                       "{\"v\": 1}, \"modules_to_save\": [\"lm_head\"], "
                       "\"layers_to_transform\": [0, 1], \"layers_pattern\":"
                       " [\"layers\"]}";
    for (long n = 0;; n++) {
        fmt_peft_config c;
        mc_error e;
        mc_alloc_fail_after(n);
        mc_status st = fmt_peft_config_parse(json, strlen(json), "c", &c, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_peft_config_free(&c);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
    }
}

static char *adapter_dir(const char *name)
{
    return tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR, name);
}

static fmt_peft_adapter *open_fixture(const char *name)
{
    char *dir = adapter_dir(name);
    fmt_peft_adapter *a = NULL;
    mc_error e;
    mc_status st = fmt_peft_open(dir, &a, &e);
    if (st) {
        char buf[1500];
        fail_msg("%s: %s", dir, mc_error_format(&e, buf, sizeof buf));
    }
    free(dir);
    return a;
}

static void test_peft_maps_keys_to_base_module_names(void **state)
{
    (void)state;
    fmt_peft_adapter *a = open_fixture("llama-plain");
    assert_int_equal(fmt_peft_module_count(a), 8); /* 4 layers x q, v */
    const fmt_peft_module *m = fmt_peft_find_module(a, Q0);
    assert_non_null(m);
    assert_int_equal(m->kind, FMT_PEFT_LINEAR);
    assert_int_equal(m->r, 4);
    assert_true(m->scaling == 2.0);
    assert_int_equal(m->A->shape[0], 4);
    assert_int_equal(m->A->shape[1], 64);
    assert_int_equal(m->B->shape[1], 4);
    assert_null(m->magnitude);
    assert_null(fmt_peft_find_module(a, "model.layers.0.self_attn.k_proj"));
    assert_int_equal(fmt_peft_replace_count(a), 0);
    fmt_peft_close(a);
}

static void test_peft_rank_pattern_adapter_has_per_module_ranks(void **state)
{
    (void)state;
    fmt_peft_adapter *a = open_fixture("llama-patterns");
    const fmt_peft_module *q = fmt_peft_find_module(a, Q0);
    const fmt_peft_module *u1 =
        fmt_peft_find_module(a, "model.layers.1.mlp.up_proj");
    const fmt_peft_module *u0 =
        fmt_peft_find_module(a, "model.layers.0.mlp.up_proj");
    const fmt_peft_module *v =
        fmt_peft_find_module(a, "model.layers.0.self_attn.v_proj");
    assert_true(q && u1 && u0 && v);
    assert_int_equal(q->r, 2);
    assert_true(q->scaling == 4.0);
    assert_int_equal(u1->r, 6);
    assert_int_equal(u0->r, 4);
    assert_true(v->scaling == 3.0 / 4.0);
    fmt_peft_close(a);
}

static void test_peft_embedding_dora_and_modules_to_save(void **state)
{
    (void)state;
    fmt_peft_adapter *a = open_fixture("llama-dora");
    const fmt_peft_module *e = fmt_peft_find_module(a, "model.embed_tokens");
    assert_non_null(e);
    assert_int_equal(e->kind, FMT_PEFT_EMBEDDING);
    assert_non_null(e->magnitude);
    assert_int_equal(e->magnitude->shape[0], e->B->shape[0]);
    assert_non_null(fmt_peft_find_module(a, Q0)->magnitude);
    fmt_peft_close(a);
    a = open_fixture("llama-mts");
    assert_int_equal(fmt_peft_replace_count(a), 2);
    assert_string_equal(fmt_peft_replace_at(a, 0)->tensor, "lm_head.weight");
    assert_string_equal(fmt_peft_replace_at(a, 1)->tensor, "model.norm.weight");
    fmt_peft_close(a);
    a = open_fixture("llama-lora-bias");
    const fmt_peft_module *v =
        fmt_peft_find_module(a, "model.layers.2.self_attn.v_proj");
    assert_non_null(v->b_bias);
    assert_int_equal(fmt_peft_replace_count(a), 4); /* v_proj biases */
    fmt_peft_close(a);
}

static void test_peft_open_survives_allocation_failures(void **state)
{
    (void)state;
    char *dir = adapter_dir("llama-mts");
    for (long n = 0;; n++) {
        fmt_peft_adapter *a = NULL;
        mc_error e;
        mc_alloc_fail_after(n);
        mc_status st = fmt_peft_open(dir, &a, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_peft_close(a);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_not_equal(st, MC_OK);
        assert_null(a);
    }
    free(dir);
}

static void test_peft_open_reports_missing_directory(void **state)
{
    (void)state;
    fmt_peft_adapter *a = NULL;
    mc_error e;
    assert_int_equal(fmt_peft_open("/nonexistent/adapter", &a, &e),
                     MC_ERR_NOT_FOUND);
    assert_null(a);
    assert_non_null(strstr(e.file, "adapter_config.json"));
}

static void check_invalid_adapter(const char *case_dir, const char *expect,
                                  void *ctx)
{
    (void)ctx;
    fmt_peft_adapter *a = NULL;
    mc_error e;
    mc_error_clear(&e);
    mc_status st = fmt_peft_open(case_dir, &a, &e);
    fmt_peft_close(a);
    if (st == MC_OK)
        fail_msg("%s: accepted", case_dir);
    char msg[2048];
    mc_error_format(&e, msg, sizeof msg);
    tu_assert_case_error(case_dir, expect, msg);
}

static void test_peft_rejects_each_invalid_adapter(void **state)
{
    (void)state;
    int n = tu_for_each_invalid_case("adapter", check_invalid_adapter, NULL);
    assert_true(n >= 15);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_config_defaults),
        cmocka_unit_test(test_peft_list_target_matches_exact_or_dot_suffix),
        cmocka_unit_test(test_peft_regex_target_must_match_whole_name),
        cmocka_unit_test(test_peft_all_linear_excludes_output_layer),
        cmocka_unit_test(test_peft_layers_to_transform_narrows_list_targets),
        cmocka_unit_test(test_peft_rank_and_alpha_pattern_first_match_wins),
        cmocka_unit_test(test_peft_rslora_scales_by_sqrt_rank),
        cmocka_unit_test(test_peft_refuses_base_changing_init),
        cmocka_unit_test(test_peft_config_survives_allocation_failures),
        cmocka_unit_test(test_peft_maps_keys_to_base_module_names),
        cmocka_unit_test(test_peft_rank_pattern_adapter_has_per_module_ranks),
        cmocka_unit_test(test_peft_embedding_dora_and_modules_to_save),
        cmocka_unit_test(test_peft_open_survives_allocation_failures),
        cmocka_unit_test(test_peft_open_reports_missing_directory),
        cmocka_unit_test(test_peft_rejects_each_invalid_adapter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

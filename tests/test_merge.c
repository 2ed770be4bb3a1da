/* test_merge.c - the merge library against an independent double-precision
 * computation (written here, from the adapter files and PEFT's formulas),
 * rounded once to the output dtype: every merged element must equal that
 * single rounding (0 ulp), for every adapter feature, on the generated
 * fixtures and on stories260k. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_merge.h"
#include "cmp_merge_internal.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_safetensors.h"
#include "mc_alloc.h"
#include "merge_ref.h"
#include "testutil.h"

#define SIMPLE_TEST(fn, model, adapter, dt, min)                               \
    static void fn(void **state)                                               \
    {                                                                          \
        (void)state;                                                           \
        run r;                                                                 \
        check_one(model, adapter, dt, min, &r);                                \
        run_free(&r);                                                          \
    }

SIMPLE_TEST(test_merge_plain_lora_list_targets, "llama", "llama-plain",
            FMT_DT_INVALID, 8)
SIMPLE_TEST(test_merge_regex_targets, "llama", "llama-regex", FMT_DT_INVALID,
            12)
SIMPLE_TEST(test_merge_rslora_all_linear, "llama", "llama-rslora",
            FMT_DT_INVALID, 28)
SIMPLE_TEST(test_merge_rank_and_alpha_patterns, "llama", "llama-patterns",
            FMT_DT_INVALID, 12)
SIMPLE_TEST(test_merge_dora_linear_and_embedding, "llama", "llama-dora",
            FMT_DT_INVALID, 9)
SIMPLE_TEST(test_merge_fan_in_fan_out_on_linear_is_ignored_like_peft,
            "llama", "llama-fifo", FMT_DT_INVALID, 4)
SIMPLE_TEST(test_merge_embedding_lora_transposed, "llama", "llama-embed",
            FMT_DT_INVALID, 1)
SIMPLE_TEST(test_merge_modules_to_save_replace, "llama", "llama-mts",
            FMT_DT_INVALID, 6)
SIMPLE_TEST(test_merge_bf16_base_rounds_once, "llama-bf16", "llama-rslora",
            FMT_DT_INVALID, 28)
SIMPLE_TEST(test_merge_f16_base_rounds_once, "llama-f16", "llama-dora",
            FMT_DT_INVALID, 9)
SIMPLE_TEST(test_merge_dtype_f32_to_bf16, "llama", "llama-plain", FMT_DT_BF16,
            8)
SIMPLE_TEST(test_merge_dtype_f32_to_f16, "llama", "llama-dora", FMT_DT_F16, 9)
SIMPLE_TEST(test_merge_dtype_bf16_to_f32, "llama-bf16", "llama-plain",
            FMT_DT_F32, 8)
SIMPLE_TEST(test_merge_mistral_all_linear, "mistral", "mistral-plain",
            FMT_DT_INVALID, 21)

static void test_merge_layers_to_transform_leaves_other_layers(void **state)
{
    (void)state;
    run r;
    check_one("llama", "llama-layers", FMT_DT_INVALID, 4, &r);
    assert_int_equal(r.touched, 4); /* gate and o of layers 1 and 3 only */
    run_free(&r);
}

static void test_merge_several_adapters_weighted_sum(void **state)
{
    (void)state;
    char *b = fx("llama");
    char *a1 = fx("adapters/llama-plain"), *a2 = fx("adapters/llama-second");
    const char *dirs[2] = {a1, a2};
    const double w[2] = {0.5, -1.25};
    run r;
    merge_and_check(b, dirs, w, 2, FMT_DT_INVALID, &r);
    assert_int_equal(r.rep.adapters, 2);
    assert_int_equal(r.touched, 12); /* q x4 (both), v x4, gate x4 */
    run_free(&r);
    free(b);
    free(a1);
    free(a2);
}

static void test_merge_bias_all_and_lora_bias(void **state)
{
    (void)state;
    char *b = fx("llama-bias");
    char *a1 = fx("adapters/llama-bias-all"), *a2 = fx("adapters/llama-lora-bias");
    const char *dirs[2] = {a1, a2};
    run r;
    merge_and_check(b, dirs, NULL, 2, FMT_DT_INVALID, &r);
    /* k, v, o weights (12) + q biases (4) + down bias (1) + v, o biases (8) */
    assert_int_equal(r.touched, 25);
    assert_int_equal(r.rep.replaced, 9);
    run_free(&r);
    free(b);
    free(a1);
    free(a2);
}

static void test_merge_sharded_base_keeps_layout(void **state)
{
    (void)state;
    run r;
    check_one("llama-sharded", "llama-plain", FMT_DT_INVALID, 8, &r);
    fmt_model *in = NULL, *out = NULL;
    char *b = fx("llama-sharded");
    assert_int_equal(fmt_model_open(b, &in, NULL), MC_OK);
    assert_int_equal(fmt_model_open(r.out, &out, NULL), MC_OK);
    assert_true(fmt_model_is_sharded(out));
    assert_int_equal(fmt_model_shard_count(out), fmt_model_shard_count(in));
    for (size_t i = 0; i < fmt_model_tensor_count(in); i++) {
        size_t s1, s2;
        const fmt_st_tensor *t = fmt_model_tensor(in, i, &s1);
        assert_non_null(fmt_model_find(out, t->name, &s2));
        assert_int_equal(s1, s2);
    }
    fmt_model_close(in);
    fmt_model_close(out);
    free(b);
    run_free(&r);
}

static void test_merge_tied_lm_head_is_untied(void **state)
{
    (void)state;
    run r;
    check_one("qwen2", "qwen2-lm-head", FMT_DT_INVALID, 4, &r);
    assert_int_equal(r.rep.untied_lm_head, 1);
    char *cfg = tu_fmt("%s/config.json", r.out);
    json_t *j = json_load_file(cfg, 0, NULL);
    assert_true(json_is_false(json_object_get(j, "tie_word_embeddings")));
    json_decref(j);
    free(cfg);
    run_free(&r);
}

/* A tied config whose checkpoint still stores lm_head.weight: a change to
 * lm_head must also mark the config untied, or loaders re-tie it. */
static void test_merge_tied_config_with_stored_lm_head_is_marked_untied(
    void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("tiedstored");
    char *cp = tu_fmt("cp -r '%s/llama' '%s/base'", MC_FIXTURE_DIR, tmp);
    assert_int_equal(system(cp), 0);
    free(cp);
    char *cfgp = tu_fmt("%s/base/config.json", tmp);
    json_t *j = json_load_file(cfgp, 0, NULL);
    json_object_set_new(j, "tie_word_embeddings", json_true());
    assert_int_equal(json_dump_file(j, cfgp, JSON_INDENT(2)), 0);
    json_decref(j);
    char *b = tu_fmt("%s/base", tmp), *a = fx("adapters/llama-mts");
    const char *dirs[1] = {a};
    run r;
    merge_and_check(b, dirs, NULL, 1, FMT_DT_INVALID, &r);
    assert_int_equal(r.rep.untied_lm_head, 1);
    char *oc = tu_fmt("%s/config.json", r.out);
    j = json_load_file(oc, 0, NULL);
    assert_true(json_is_false(json_object_get(j, "tie_word_embeddings")));
    json_decref(j);
    run_free(&r);
    tu_rmtree(tmp);
    free(tmp);
    free(cfgp);
    free(oc);
    free(b);
    free(a);
}

/* ---- adapters built by the tests themselves --------------------------- */

typedef struct tt {
    const char *key;
    int ndim;
    uint64_t shape[2];
} tt;

static void write_adapter(const char *dir, const char *config, const tt *ts,
                          size_t n, uint64_t seed)
{
    char *p = tu_fmt("mkdir -p '%s'", dir);
    assert_int_equal(system(p), 0);
    free(p);
    p = tu_fmt("%s/adapter_config.json", dir);
    assert_int_equal(tu_write_file(p, config, strlen(config)), 0);
    free(p);
    p = tu_fmt("%s/adapter_model.safetensors", dir);
    fmt_st_writer *w;
    assert_int_equal(fmt_st_writer_create(p, &w, NULL), MC_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(fmt_st_writer_add(w, ts[i].key, FMT_DT_F32,
                                           ts[i].ndim, ts[i].shape, NULL),
                         MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, NULL), MC_OK);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = ts[i].ndim == 1 ? ts[i].shape[0]
                                     : ts[i].shape[0] * ts[i].shape[1];
        for (uint64_t j = 0; j < k; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            /* magnitudes (1-D) positive near 1, matrices centred on 0 */
            float v = (float)((double)(s >> 40) / 16777216.0 - 0.5) * 0.4f;
            if (ts[i].ndim == 1)
                v = 0.8f + v;
            assert_int_equal(fmt_st_writer_write(w, &v, 4, NULL), MC_OK);
        }
    }
    assert_int_equal(fmt_st_writer_finish(w, NULL), MC_OK);
    free(p);
}

/* A Conv1D-style base: weight stored [in, out], so fan_in_fan_out applies
 * (and DoRA normalises columns). */
static void test_merge_fan_in_fan_out_transposed_base_with_dora(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("fifo");
    char *bdir = tu_fmt("%s/base", tmp), *adir = tu_fmt("%s/ad", tmp);
    char *p = tu_fmt("mkdir -p '%s'", bdir);
    assert_int_equal(system(p), 0);
    free(p);
    p = tu_fmt("%s/config.json", bdir);
    const char *cfg = "{\"model_type\": \"llama\"}";
    assert_int_equal(tu_write_file(p, cfg, strlen(cfg)), 0);
    free(p);
    tt bt[] = {{"h.0.mlp.c_fc.weight", 2, {8, 12}}, {"h.0.ln.weight", 1, {8}}};
    p = tu_fmt("%s/model.safetensors", bdir);
    fmt_st_writer *w;
    assert_int_equal(fmt_st_writer_create(p, &w, NULL), MC_OK);
    for (int i = 0; i < 2; i++)
        assert_int_equal(fmt_st_writer_add(w, bt[i].key, FMT_DT_F32, bt[i].ndim,
                                           bt[i].shape, NULL),
                         MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, NULL), MC_OK);
    for (int j = 0; j < 8 * 12 + 8; j++) {
        float v = (float)((j * 7919) % 23 - 11) / 20.0f;
        assert_int_equal(fmt_st_writer_write(w, &v, 4, NULL), MC_OK);
    }
    assert_int_equal(fmt_st_writer_finish(w, NULL), MC_OK);
    free(p);
    tt at[] = {{"base_model.model.h.0.mlp.c_fc.lora_A.weight", 2, {2, 8}},
               {"base_model.model.h.0.mlp.c_fc.lora_B.weight", 2, {12, 2}},
               {"base_model.model.h.0.mlp.c_fc.lora_magnitude_vector", 1, {12}}};
    write_adapter(adir, "{\"r\": 2, \"lora_alpha\": 3, \"fan_in_fan_out\": "
                        "true, \"use_dora\": true, \"target_modules\": "
                        "[\"c_fc\"]}", at, 3, 7);
    const char *dirs[1] = {adir};
    run r;
    merge_and_check(bdir, dirs, NULL, 1, FMT_DT_INVALID, &r);
    assert_int_equal(r.touched, 1);
    run_free(&r);
    tu_rmtree(tmp);
    free(tmp);
    free(bdir);
    free(adir);
}

static void test_merge_stories260k_lora_dora_and_untie(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k not found under MC_SHARED_DIR: skipped");
    char *tmp = tu_mkdtemp("stories");
    char *a1 = tu_fmt("%s/plain", tmp), *a2 = tu_fmt("%s/dora", tmp);
    /* q [64,64], v [32,64] (4 kv heads x 8), lm_head tied [512,64] */
    tt t1[] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", 2, {4, 64}},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", 2, {64, 4}},
        {"base_model.model.model.layers.4.self_attn.v_proj.lora_A.weight", 2, {4, 64}},
        {"base_model.model.model.layers.4.self_attn.v_proj.lora_B.weight", 2, {32, 4}},
        {"base_model.model.lm_head.lora_A.weight", 2, {4, 64}},
        {"base_model.model.lm_head.lora_B.weight", 2, {512, 4}},
    };
    write_adapter(a1, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                      "[\"q_proj\", \"v_proj\", \"lm_head\"]}", t1, 6, 11);
    tt t2[] = {
        {"base_model.model.model.layers.2.mlp.down_proj.lora_A.weight", 2, {2, 172}},
        {"base_model.model.model.layers.2.mlp.down_proj.lora_B.weight", 2, {64, 2}},
        {"base_model.model.model.layers.2.mlp.down_proj.lora_magnitude_vector", 1, {64}},
        {"base_model.model.model.embed_tokens.lora_embedding_A", 2, {2, 512}},
        {"base_model.model.model.embed_tokens.lora_embedding_B", 2, {64, 2}},
    };
    /* DoRA: every module of the adapter has a magnitude. */
    tt t2b[] = {t2[0], t2[1], t2[2], t2[3], t2[4],
                {"base_model.model.model.embed_tokens.lora_magnitude_vector", 1, {64}}};
    write_adapter(a2, "{\"r\": 2, \"lora_alpha\": 2, \"use_rslora\": true, "
                      "\"target_modules\": [\"down_proj\", \"embed_tokens\"], "
                      "\"use_dora\": true}", t2b, 6, 12);
    const char *dirs[2] = {a1, a2};
    const double wts[2] = {1.0, 0.75};
    run r;
    merge_and_check(sd, dirs, wts, 2, FMT_DT_INVALID, &r);
    assert_int_equal(r.rep.untied_lm_head, 1);
    assert_int_equal(r.touched, 5); /* q, v, down, embed, new lm_head */
    run_free(&r);
    tu_rmtree(tmp);
    free(tmp);
    free(a1);
    free(a2);
}

/* ---- refusals ----------------------------------------------------------- */

static mc_status try_open(const char *base_dir, const char *adir, mc_error *e)
{
    fmt_model *base = NULL;
    assert_int_equal(fmt_model_open(base_dir, &base, e), MC_OK);
    cmp_adapter_spec s = {adir, 1.0};
    cmp_merge *m = NULL;
    mc_status st = cmp_merge_open(base, &s, 1, &m, e);
    assert_true((st == MC_OK) == (m != NULL));
    cmp_merge_close(m);
    fmt_model_close(base);
    return st;
}

static void test_merge_refuses_missing_module_with_prefix_hint(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("missing");
    char *b = fx("llama");
    tt t[] = {{"base_model.model.layers.0.self_attn.q_proj.lora_A.weight", 2, {2, 64}},
              {"base_model.model.layers.0.self_attn.q_proj.lora_B.weight", 2, {64, 2}}};
    write_adapter(tmp, "{\"r\": 2, \"target_modules\": [\"q_proj\"]}", t, 2, 3);
    mc_error e;
    assert_int_equal(try_open(b, tmp, &e), MC_ERR_NOT_FOUND);
    assert_non_null(strstr(e.message, "'layers.0.self_attn.q_proj.weight'"));
    assert_non_null(strstr(e.message, "\"model.\" prefix"));
    tu_rmtree(tmp);
    free(tmp);
    free(b);
}

static void test_merge_refuses_shape_mismatch(void **state)
{
    (void)state;
    char *b = fx("llama"), *a = fx("adapters/mistral-plain");
    mc_error e;
    assert_int_equal(try_open(b, a, &e), MC_ERR_SHAPE);
    assert_non_null(strstr(e.message, "but base tensor"));
    free(b);
    free(a);
}

static void test_merge_refuses_output_inside_input(void **state)
{
    (void)state;
    char *b = fx("llama"), *a = fx("adapters/llama-plain");
    fmt_model *base = NULL;
    assert_int_equal(fmt_model_open(b, &base, NULL), MC_OK);
    cmp_adapter_spec s = {a, 1.0};
    cmp_merge *m = NULL;
    assert_int_equal(cmp_merge_open(base, &s, 1, &m, NULL), MC_OK);
    int before = tu_count_entries(b);
    mc_error e;
    assert_int_equal(cmp_merge_write(m, b, FMT_DT_INVALID, NULL, &e),
                     MC_ERR_INVALID_ARG);
    char *inner = tu_fmt("%s/merged", b);
    assert_int_equal(cmp_merge_write(m, inner, FMT_DT_INVALID, NULL, &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(cmp_merge_write(m, MC_FIXTURE_DIR, FMT_DT_INVALID, NULL,
                                     &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(tu_count_entries(b), before);
    assert_false(tu_exists(inner));
    cmp_merge_close(m);
    fmt_model_close(base);
    free(inner);
    free(b);
    free(a);
}

/* Flip one bit of the byte at off in path. */
static void flip_byte(const char *path, uint64_t off)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
    assert_int_equal(fputc(c ^ 0x10, f), c ^ 0x10);
    assert_int_equal(fclose(f), 0);
}

/* The read-back before commit (cmp_merge_verify_) catches one flipped
 * byte in a changed tensor of a written shard and names the tensor; its
 * check sums are taken on all row threads, so a damaged tensor is found
 * whichever thread reads it.  An unchanged tensor is copied, not
 * computed, and is not its business. */
static void test_merge_read_back_catches_a_flipped_byte(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("mergevfy"), *out = tu_fmt("%s/out", tmp);
    char *b = fx("llama"), *a = fx("adapters/llama-plain");
    fmt_model *base = NULL;
    assert_int_equal(fmt_model_open(b, &base, NULL), MC_OK);
    cmp_adapter_spec s = {a, 1.0};
    cmp_merge *m = NULL;
    mc_error e;
    assert_int_equal(cmp_merge_open(base, &s, 1, &m, NULL), MC_OK);
    assert_int_equal(cmp_merge_write(m, out, FMT_DT_INVALID, NULL, &e), MC_OK);
    assert_int_equal(cmp_merge_verify_(m, out, FMT_DT_INVALID, &e), MC_OK);
    char *sp = tu_fmt("%s/%s", out, fmt_model_shard_name(base, 0));
    static const char *const names[] = {
        "model.layers.3.self_attn.v_proj.weight", /* changed, late */
        "model.layers.0.self_attn.q_proj.weight", /* changed, first */
        "model.norm.weight",                      /* unchanged */
    };
    for (size_t k = 0; k < 3; k++) {
        fmt_st_file *f = NULL;
        assert_int_equal(fmt_st_open(sp, &f, &e), MC_OK);
        const fmt_st_tensor *t = fmt_st_find(f, names[k]);
        assert_non_null(t);
        uint64_t off = t->file_offset + t->nbytes / 2 + 1;
        fmt_st_close(f);
        flip_byte(sp, off);
        mc_status st = cmp_merge_verify_(m, out, FMT_DT_INVALID, &e);
        if (k < 2) {
            char buf[1600];
            assert_int_equal(st, MC_ERR_IO);
            assert_non_null(strstr(mc_error_format(&e, buf, sizeof buf),
                                   names[k]));
        } else {
            assert_int_equal(st, MC_OK);
        }
        flip_byte(sp, off); /* back as written */
        assert_int_equal(cmp_merge_verify_(m, out, FMT_DT_INVALID, &e), MC_OK);
    }
    cmp_merge_close(m);
    fmt_model_close(base);
    tu_rmtree(tmp);
    free(sp);
    free(out);
    free(tmp);
    free(b);
    free(a);
}

static void test_merge_open_survives_allocation_failures(void **state)
{
    (void)state;
    mc_alloc_install_jansson();
    char *b = fx("qwen2"), *a = fx("adapters/qwen2-lm-head");
    fmt_model *base = NULL;
    assert_int_equal(fmt_model_open(b, &base, NULL), MC_OK);
    float *out = malloc(256 * 64 * sizeof *out);
    for (long n = 0;; n++) {
        cmp_adapter_spec s = {a, 1.0};
        cmp_merge *m = NULL;
        mc_error e;
        mc_alloc_fail_after(n);
        mc_status st = cmp_merge_open(base, &s, 1, &m, &e);
        if (st == MC_OK)
            st = cmp_merge_tensor_f32(m, "lm_head.weight", out, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        cmp_merge_close(m);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_not_equal(st, MC_OK);
    }
    free(out);
    fmt_model_close(base);
    free(b);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_plain_lora_list_targets),
        cmocka_unit_test(test_merge_regex_targets),
        cmocka_unit_test(test_merge_rslora_all_linear),
        cmocka_unit_test(test_merge_rank_and_alpha_patterns),
        cmocka_unit_test(test_merge_layers_to_transform_leaves_other_layers),
        cmocka_unit_test(test_merge_dora_linear_and_embedding),
        cmocka_unit_test(test_merge_fan_in_fan_out_on_linear_is_ignored_like_peft),
        cmocka_unit_test(test_merge_fan_in_fan_out_transposed_base_with_dora),
        cmocka_unit_test(test_merge_embedding_lora_transposed),
        cmocka_unit_test(test_merge_modules_to_save_replace),
        cmocka_unit_test(test_merge_bias_all_and_lora_bias),
        cmocka_unit_test(test_merge_several_adapters_weighted_sum),
        cmocka_unit_test(test_merge_tied_lm_head_is_untied),
        cmocka_unit_test(
            test_merge_tied_config_with_stored_lm_head_is_marked_untied),
        cmocka_unit_test(test_merge_bf16_base_rounds_once),
        cmocka_unit_test(test_merge_f16_base_rounds_once),
        cmocka_unit_test(test_merge_dtype_f32_to_bf16),
        cmocka_unit_test(test_merge_dtype_f32_to_f16),
        cmocka_unit_test(test_merge_dtype_bf16_to_f32),
        cmocka_unit_test(test_merge_sharded_base_keeps_layout),
        cmocka_unit_test(test_merge_mistral_all_linear),
        cmocka_unit_test(test_merge_stories260k_lora_dora_and_untie),
        cmocka_unit_test(test_merge_refuses_missing_module_with_prefix_hint),
        cmocka_unit_test(test_merge_refuses_shape_mismatch),
        cmocka_unit_test(test_merge_refuses_output_inside_input),
        cmocka_unit_test(test_merge_read_back_catches_a_flipped_byte),
        cmocka_unit_test(test_merge_open_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

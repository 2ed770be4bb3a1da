/* test_plan.c - the memory planner against independent arithmetic for
 * Mistral-7B-v0.1, Llama-3-8B and Qwen2-7B (config.json texts below; no
 * weights), the frontier, the refusal message and size parsing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_plan.h"
#include "fmt_config.h"
#include "testutil.h"

static const char MISTRAL_7B[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1,"
    " \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 32000}";

static const char LLAMA3_8B[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 128000,"
    " \"eos_token_id\": 128001, \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 8192,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null,"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.40.0.dev0\","
    " \"use_cache\": true, \"vocab_size\": 128256}";

static const char QWEN2_7B[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151643,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 3584,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 18944,"
    " \"max_position_embeddings\": 131072, \"max_window_layers\": 28,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 28,"
    " \"num_hidden_layers\": 28, \"num_key_value_heads\": 4,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
    " \"sliding_window\": 131072, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.37.2\","
    " \"use_cache\": true, \"use_sliding_window\": false,"
    " \"vocab_size\": 152064}";

/* The shape facts, written out by hand from the configs above. */
typedef struct shape {
    const char *json;
    uint64_t L, H, F, NH, NKV, HD, V, window;
    int qkv_bias;
    uint64_t params;          /* published parameter count */
} shape;

static const shape MODELS[] = {
    {MISTRAL_7B, 32, 4096, 14336, 32, 8, 128, 32000, 4096, 0, 7241732096ull},
    {LLAMA3_8B, 32, 4096, 14336, 32, 8, 128, 128256, 0, 0, 8030261248ull},
    {QWEN2_7B, 28, 3584, 18944, 28, 4, 128, 152064, 0, 1, 7615616512ull},
};

static void load(const shape *s, fmt_model_config *c)
{
    mc_error err;
    assert_int_equal(fmt_config_parse(s->json, strlen(s->json), "config.json",
                                      c, &err), MC_OK);
}

/* Bytes of a rows x cols matrix in a format, from kn_quant.h's prose. */
static uint64_t mat_bytes(const char *fmt, uint64_t rows, uint64_t cols,
                          uint64_t g)
{
    if (!strcmp(fmt, "f32"))
        return 4 * rows * cols;
    if (!strcmp(fmt, "f16") || !strcmp(fmt, "bf16"))
        return 2 * rows * cols;
    if (!strcmp(fmt, "q8"))
        return rows * cols + 4 * rows;
    uint64_t groups = (cols + g - 1) / g; /* q4: nibbles, f16 scale, u8 zero */
    uint64_t zeros = strcmp(fmt, "q4s") ? rows * groups : 0; /* q4s: none */
    return rows * ((cols + 1) / 2) + rows * groups * 2 + zeros;
}

/* Expected weight bytes under cmp_plan.h's policy, computed by hand. */
static uint64_t expected_weights(const shape *s, const char *quant,
                                 uint64_t g)
{
    const char *lin = !strcmp(quant, "int8")       ? "q8"
                      : !strcmp(quant, "int4")     ? "q4"
                      : !strcmp(quant, "int4-sym") ? "q4s"
                                                   : quant;
    const char *emb = !strcmp(quant, "f32")    ? "f32"
                      : !strcmp(quant, "bf16") ? "bf16"
                                               : "f16";
    const char *head = strcmp(lin, quant) ? "q8" : emb; /* quantized */
    uint64_t qd = s->NH * s->HD, kd = s->NKV * s->HD;
    uint64_t per = mat_bytes(lin, qd, s->H, g) + 2 * mat_bytes(lin, kd, s->H, g) +
                   mat_bytes(lin, s->H, qd, g) +
                   2 * mat_bytes(lin, s->F, s->H, g) +
                   mat_bytes(lin, s->H, s->F, g) + 2 * s->H * 4 +
                   (s->qkv_bias ? (qd + 2 * kd) * 4 : 0);
    return mat_bytes(emb, s->V, s->H, g) + s->L * per + s->H * 4 +
           mat_bytes(head, s->V, s->H, g);
}

static void test_plan_param_counts_match_published(void **state)
{
    (void)state;
    for (size_t i = 0; i < 3; i++) {
        fmt_model_config c;
        load(&MODELS[i], &c);
        assert_int_equal(cmp_plan_param_count(&c), MODELS[i].params);
    }
}

static void test_plan_weight_bytes_exact_for_every_quant(void **state)
{
    (void)state;
    static const char *const q[] = {"f32", "f16", "bf16", "int8", "int4",
                                    "int4-sym"};
    static const uint32_t groups[] = {32, 64, 128};
    for (size_t i = 0; i < 3; i++) {
        fmt_model_config c;
        load(&MODELS[i], &c);
        for (size_t k = 0; k < sizeof q / sizeof q[0]; k++)
            for (size_t gi = 0; gi < 3; gi++) {
                cmp_plan_request r;
                cmp_plan_request_default(&r);
                assert_int_equal(cmp_wpolicy_parse(q[k], groups[gi], &r.policy,
                                                   NULL), MC_OK);
                r.target_bytes = 1ull << 50;
                r.max_batch = 1;
                r.max_seq = 1024;
                cmp_plan p;
                assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
                assert_int_equal(p.weights_bytes,
                                 expected_weights(&MODELS[i], q[k], groups[gi]));
            }
    }
    /* Mistral-7B in fp16 is 13.49 GiB (REFERENCE.md); norms stay f32 */
    fmt_model_config c;
    load(&MODELS[0], &c);
    uint64_t w = expected_weights(&MODELS[0], "f16", 128);
    uint64_t norms = (2 * 32 + 1) * 4096ull;
    assert_int_equal(w, 2 * (7241732096ull - norms) + 4 * norms);
    char buf[32];
    snprintf(buf, sizeof buf, "%.2f", w / 1073741824.0);
    assert_string_equal(buf, "13.49");
}

static void test_plan_kv_bytes_per_token_and_window_cap(void **state)
{
    (void)state;
    static const kn_kvtype kv[] = {KN_KV_F16, KN_KV_I8, KN_KV_F32};
    for (size_t i = 0; i < 3; i++) {
        const shape *s = &MODELS[i];
        fmt_model_config c;
        load(s, &c);
        for (size_t k = 0; k < 3; k++) {
            uint64_t per_head = kv[k] == KN_KV_F16  ? s->HD * 2
                                : kv[k] == KN_KV_I8 ? s->HD + 4 /* f32 scale */
                                                    : s->HD * 4;
            uint64_t slot = 2 * s->NKV * per_head; /* K and V, one layer */
            cmp_plan_request r;
            cmp_plan_request_default(&r);
            r.kv_type = kv[k];
            r.target_bytes = 1ull << 50;
            static const uint32_t B[] = {1, 3, 8};
            static const uint64_t T[] = {100, 4096, 4353, 16384};
            for (size_t b = 0; b < 3; b++)
                for (size_t t = 0; t < 4; t++) {
                    r.max_batch = B[b];
                    r.max_seq = T[t];
                    cmp_plan p;
                    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
                    assert_int_equal(p.kv_bytes_per_token, s->L * slot);
                    uint64_t cap = T[t];
                    if (s->window && s->window + 256 < cap)
                        cap = s->window + 256; /* ring: window + chunk */
                    assert_int_equal(p.kv_bytes, s->L * B[b] * cap * slot);
                    assert_int_equal(p.arena_bytes,
                                     p.kv_bytes + p.activation_bytes);
                    assert_int_equal(p.total_bytes, p.weights_bytes +
                                                        p.arena_bytes +
                                                        p.reserve_bytes);
                }
        }
    }
    /* REFERENCE.md: Mistral-7B, 128 KiB per token in fp16 */
    fmt_model_config c;
    load(&MODELS[0], &c);
    cmp_plan_request r;
    cmp_plan_request_default(&r);
    r.target_bytes = 1ull << 50;
    cmp_plan p;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    assert_int_equal(p.kv_bytes_per_token, 128 * 1024);
}

static void test_plan_frontier_is_tight_and_monotone(void **state)
{
    (void)state;
    for (size_t i = 0; i < 3; i++) {
        fmt_model_config c;
        load(&MODELS[i], &c);
        cmp_plan_request r;
        cmp_plan_request_default(&r);
        r.target_bytes = 24ull << 30;
        if (i > 0)
            assert_int_equal(cmp_wpolicy_parse("int8", 0, &r.policy, NULL),
                             MC_OK);
        cmp_plan p;
        assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
        assert_true(p.fits);
        assert_true(p.total_bytes <= r.target_bytes);
        assert_true(p.nfrontier >= 3);
        for (size_t k = 0; k < p.nfrontier; k++) {
            const cmp_frontier_point *f = &p.frontier[k];
            uint64_t t = cmp_plan_total_for(&c, &r, p.weights_bytes,
                                            p.reserve_bytes, f->batch,
                                            f->max_seq);
            assert_true(t > 0 && t <= r.target_bytes);
            if (f->max_seq < c.max_position_embeddings)
                assert_true(cmp_plan_total_for(&c, &r, p.weights_bytes,
                                               p.reserve_bytes, f->batch,
                                               f->max_seq + 1) >
                            r.target_bytes);
            if (k)
                assert_true(f->max_seq <= p.frontier[k - 1].max_seq);
        }
    }
}

static void test_plan_refuses_with_breakdown(void **state)
{
    (void)state;
    fmt_model_config c;
    load(&MODELS[0], &c);
    cmp_plan_request r;
    cmp_plan_request_default(&r);
    r.target_bytes = 24ull << 30;
    r.max_batch = 64;
    r.max_seq = 32768;
    r.device = CMP_DEV_CUDA;
    cmp_plan p;
    mc_error err;
    assert_int_equal(cmp_plan_build(&c, &r, &p, &err), MC_ERR_PLAN);
    assert_false(p.fits);
    assert_int_equal(p.reserve_bytes, (1024ull + 32) << 20);
    char bd[256];
    cmp_plan_breakdown(&p, bd, sizeof bd);
    printf("refusal: %s\n", bd);
    assert_true(strncmp(bd, "needs ", 6) == 0);
    assert_non_null(strstr(bd, "weights 13.49, KV "));
    assert_non_null(strstr(bd, ", reserve 1.03; target 24.00"));
    assert_non_null(strstr(err.message, bd));
    /* user reserve overrides the device default */
    r.reserve_bytes = 0;
    r.max_batch = 1;
    r.max_seq = 1024;
    assert_int_equal(cmp_plan_build(&c, &r, &p, &err), MC_OK);
    assert_int_equal(p.reserve_bytes, 0);
    assert_string_equal(p.reserve_source, "--reserve");
}

static void test_plan_chooses_limits_that_fit(void **state)
{
    (void)state;
    fmt_model_config c;
    load(&MODELS[1], &c);
    cmp_plan_request r;
    cmp_plan_request_default(&r);
    r.target_bytes = 20ull << 30;
    cmp_plan p;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    assert_true(p.chosen && p.fits);
    assert_int_equal(p.limits.max_seq, 4096);
    assert_true(p.limits.max_batch >= 1);
    /* one more sequence would not fit (or the batch cap was reached) */
    if (p.limits.max_batch < 64)
        assert_true(cmp_plan_total_for(&c, &r, p.weights_bytes,
                                       p.reserve_bytes,
                                       p.limits.max_batch + 1, 4096) >
                    r.target_bytes);
    /* only --max-seq: batch chosen; only --max-batch: context chosen */
    r.max_seq = 8192;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    assert_int_equal(p.limits.max_seq, 8192);
    r.max_seq = 0;
    r.max_batch = 2;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    assert_int_equal(p.limits.max_batch, 2);
    assert_int_equal(p.limits.max_seq, 8192); /* model maximum fits */
    /* nothing fits: weights alone exceed the target */
    r.target_bytes = 8ull << 30;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_ERR_PLAN);
    assert_int_equal(p.nfrontier, 0);
}

static void test_plan_json_has_documented_keys(void **state)
{
    (void)state;
    fmt_model_config c;
    load(&MODELS[2], &c);
    cmp_plan_request r;
    cmp_plan_request_default(&r);
    r.target_bytes = 32ull << 30;
    cmp_plan p;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    json_t *j = cmp_plan_to_json(&p);
    static const char *const keys[] = {
        "weights_bytes", "kv_bytes_per_token", "activation_bytes",
        "reserve_bytes", "total_bytes", "target_bytes", "max_batch",
        "max_seq", "fits", "frontier", "buffers", "arena_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_non_null(json_object_get(j, keys[i]));
    assert_true(json_is_true(json_object_get(j, "fits")));
    json_t *f0 = json_array_get(json_object_get(j, "frontier"), 0);
    assert_non_null(json_object_get(f0, "batch"));
    assert_non_null(json_object_get(f0, "max_seq"));
    assert_int_equal(json_array_size(json_object_get(j, "buffers")),
                     RT_BUF_COUNT_);
    json_decref(j);
}

static void test_plan_parses_sizes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(cmp_parse_size("24GiB", &v), 0);
    assert_int_equal(v, 24ull << 30);
    assert_int_equal(cmp_parse_size("24G", &v), 0);
    assert_int_equal(v, 24ull << 30);
    assert_int_equal(cmp_parse_size("24gb", &v), 0);
    assert_int_equal(v, 24ull << 30);
    assert_int_equal(cmp_parse_size("1.5GiB", &v), 0);
    assert_int_equal(v, 3ull << 29);
    assert_int_equal(cmp_parse_size("512MiB", &v), 0);
    assert_int_equal(v, 512ull << 20);
    assert_int_equal(cmp_parse_size("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(cmp_parse_size("18446744073709551615", &v), 0);
    assert_int_equal(v, UINT64_MAX);
    assert_int_equal(cmp_parse_size("2K", &v), 0);
    assert_int_equal(v, 2048);
    static const char *const bad[] = {"", "G", "-1G", "12X", "1.5.2G",
                                      "24 GiBs", "1e30", "nan",
                                      "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(cmp_parse_size(bad[i], &v), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_param_counts_match_published),
        cmocka_unit_test(test_plan_weight_bytes_exact_for_every_quant),
        cmocka_unit_test(test_plan_kv_bytes_per_token_and_window_cap),
        cmocka_unit_test(test_plan_frontier_is_tight_and_monotone),
        cmocka_unit_test(test_plan_refuses_with_breakdown),
        cmocka_unit_test(test_plan_chooses_limits_that_fit),
        cmocka_unit_test(test_plan_json_has_documented_keys),
        cmocka_unit_test(test_plan_parses_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_merge_peft.c - adapters in the forms PEFT 0.21 itself saves
 * (<module>.base_layer.* keys, modules_to_save on a tied embedding, DoRA
 * after another adapter), and merged output that is never replaced by a
 * side file: each checked against the independent reference (merge_ref.h)
 * at 0 ulp.  scripts/peft-check compares the same forms with the real
 * peft package (not in CI). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_merge.h"
#include "fmt_model.h"
#include "kn_ops.h"
#include "merge_ref.h"
#include "testutil.h"

/* Merge one fixture adapter and check the report's counts. */
static void expect(const char *model, const char *adapter, fmt_dtype dt,
                   size_t touched, size_t replaced, int untied, run *r)
{
    check_one(model, adapter, dt, touched, r);
    assert_int_equal(r->touched, touched);
    assert_int_equal(r->rep.replaced, replaced);
    assert_int_equal(r->rep.untied_lm_head, untied);
}

/* The output's lm_head is qwen2's original embedding, bit for bit, and the
 * config says untied. */
static void assert_lm_head_is_original_embedding(const run *r)
{
    char *cfg = tu_fmt("%s/config.json", r->out);
    json_t *j = json_load_file(cfg, 0, NULL);
    assert_true(json_is_false(json_object_get(j, "tie_word_embeddings")));
    json_decref(j);
    fmt_model *in = NULL, *out = NULL;
    char *b = fx("qwen2");
    assert_int_equal(fmt_model_open(b, &in, NULL), MC_OK);
    assert_int_equal(fmt_model_open(r->out, &out, NULL), MC_OK);
    const fmt_st_tensor *e0 = fmt_model_find(in, "model.embed_tokens.weight", NULL);
    const fmt_st_tensor *lm = fmt_model_find(out, "lm_head.weight", NULL);
    const fmt_st_tensor *e1 = fmt_model_find(out, "model.embed_tokens.weight", NULL);
    assert_true(e0 && lm && e1 && lm->nbytes == e0->nbytes);
    assert_memory_equal(lm->data, e0->data, e0->nbytes);
    assert_true(memcmp(e1->data, e0->data, e0->nbytes) != 0);
    fmt_model_close(in);
    fmt_model_close(out);
    free(b);
    free(cfg);
}

/* PEFT saves the full weight of an embedding / lm_head LoRA as
 * <module>.base_layer.weight: an unchanged copy is no change, a changed
 * one (a resized vocabulary) replaces the base before the delta. */
static void test_merge_embedding_and_lm_head_lora_with_base_layer_weights(
    void **state)
{
    (void)state;
    run r;
    /* lm_head's copy is replaced; embed's is an unchanged copy */
    expect("llama", "llama-embed-lm-head", FMT_DT_INVALID, 2, 1, 0, &r);
    assert_int_equal(r.rep.lora_modules, 2);
    run_free(&r);
}

/* bias "all": the adapted module's bias as <module>.base_layer.bias, the
 * others as <module>.bias; "lora_only": the adapted modules' only. */
static void test_merge_bias_all_and_lora_only_as_base_layer_bias(void **state)
{
    (void)state;
    run r;
    /* q weights x4, q biases x4, layer-0 down bias */
    expect("llama-bias", "llama-bias-base", FMT_DT_INVALID, 9, 5, 0, &r);
    run_free(&r);
    /* v weights x4, v biases x4 */
    expect("llama-bias", "llama-lora-only", FMT_DT_BF16, 8, 4, 0, &r);
    run_free(&r);
}

/* modules_to_save ["embed_tokens"] on a tied model: PEFT keeps the output
 * layer on the original weight and unties; so must the output. */
static void test_merge_modules_to_save_embedding_unties_keeping_lm_head(
    void **state)
{
    (void)state;
    run r;
    /* embed, q x3, the new lm_head */
    expect("qwen2", "qwen2-mts-embed", FMT_DT_INVALID, 5, 1, 1, &r);
    assert_lm_head_is_original_embedding(&r);
    run_free(&r);
}

/* An embedding LoRA on a tied model: PEFT's forward leaves the output
 * layer on the original weight, so lm_head is written with it, untied
 * (peft 0.21's merge_and_unload would add the delta to both). */
static void test_merge_embedding_lora_on_tied_model_keeps_output_layer(
    void **state)
{
    (void)state;
    run r;
    /* embed, the new lm_head; the base_layer copy is unchanged */
    expect("qwen2", "qwen2-embed", FMT_DT_INVALID, 2, 0, 1, &r);
    assert_lm_head_is_original_embedding(&r);
    run_free(&r);
}

/* DoRA after a plain adapter on the same layer (q_proj): PEFT 0.21 takes
 * the norm of W0 + the DoRA delta (not W0 + every delta) and scales all
 * of W + delta by m / norm, in its forward and in merge_and_unload alike
 * (scripts/peft-check: 0 ulp). */
static void test_merge_dora_after_another_adapter_normalises_its_own_delta(
    void **state)
{
    (void)state;
    char *b = fx("llama");
    char *a1 = fx("adapters/llama-plain"), *a2 = fx("adapters/llama-dora");
    const char *dirs[2] = {a1, a2};
    const double w[2] = {1.0, 0.5};
    run r;
    merge_and_check(b, dirs, w, 2, FMT_DT_BF16, &r);
    assert_int_equal(r.rep.adapters, 2);
    run_free(&r);
    /* and the other order: DoRA first, then the plain delta on top */
    const char *rev[2] = {a2, a1};
    merge_and_check(b, rev, NULL, 2, FMT_DT_INVALID, &r);
    run_free(&r);
    free(b);
    free(a1);
    free(a2);
}

/* The merged bytes do not depend on the CPU path (AVX2 or scalar). */
static void test_merge_output_same_with_scalar_kernels(void **state)
{
    (void)state;
    run r1, r2;
    kn_set_force_scalar(1);
    check_one("llama", "llama-dora", FMT_DT_BF16, 9, &r1);
    kn_set_force_scalar(0);
    check_one("llama", "llama-dora", FMT_DT_BF16, 9, &r2);
    char *cmd = tu_fmt("cmp -s '%s/model.safetensors' '%s/model.safetensors'",
                       r1.out, r2.out);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    run_free(&r1);
    run_free(&r2);
}

/* Shards named like tokenizer files ("tokenizer-0000N-of-0000M...") are
 * merged output, never overwritten by the side-file copy; real side files
 * are still copied. */
static void test_merge_tokenizer_named_shards_keep_merged_values(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("tokshard");
    char *cmd = tu_fmt(
        "set -e; cp -r '%s/llama-sharded' '%s/base'; cd '%s/base'; "
        "for i in 1 2 3; do mv model-0000$i-of-00003.safetensors "
        "tokenizer-0000$i-of-00003.safetensors; done; "
        "sed -i 's/model-0000/tokenizer-0000/g' model.safetensors.index.json; "
        "printf '{\"model\": {}}' > tokenizer.json",
        MC_FIXTURE_DIR, tmp, tmp);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    char *b = tu_fmt("%s/base", tmp), *a = fx("adapters/llama-rslora");
    const char *dirs[1] = {a};
    run r;
    merge_and_check(b, dirs, NULL, 1, FMT_DT_INVALID, &r);
    assert_true(r.touched >= 28);
    char *tj = tu_fmt("%s/tokenizer.json", r.out);
    assert_true(tu_exists(tj));
    free(tj);
    run_free(&r);
    free(b);
    tu_rmtree(tmp);
    free(tmp);
    free(a);
}

/* A single-file base named tokenizer.safetensors: the output's
 * tokenizer.safetensors is the merge (equal to the same merge of the
 * fixture's model.safetensors), not a copy of the input. */
static void test_merge_single_tokenizer_named_file_is_merged(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("tokfile");
    char *cmd = tu_fmt("set -e; mkdir '%s/base'; cp '%s/llama/config.json' "
                       "'%s/base/'; cp '%s/llama/model.safetensors' "
                       "'%s/base/tokenizer.safetensors'",
                       tmp, MC_FIXTURE_DIR, tmp, MC_FIXTURE_DIR, tmp);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    char *a = fx("adapters/llama-plain");
    run ref;
    check_one("llama", "llama-plain", FMT_DT_INVALID, 8, &ref);
    char *bf = tu_fmt("%s/base/tokenizer.safetensors", tmp);
    char *out = tu_fmt("%s/out", tmp);
    fmt_model *base = NULL;
    assert_int_equal(fmt_model_open(bf, &base, NULL), MC_OK);
    cmp_adapter_spec s = {a, 1.0};
    cmp_merge *m = NULL;
    cmp_merge_report rep;
    assert_int_equal(cmp_merge_open(base, &s, 1, &m, NULL), MC_OK);
    mc_error e;
    assert_int_equal(cmp_merge_write(m, out, FMT_DT_INVALID, &rep, &e), MC_OK);
    assert_int_equal(rep.tensors_touched, 8);
    cmd = tu_fmt("cmp -s '%s/tokenizer.safetensors' '%s/model.safetensors'",
                 out, ref.out);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    cmp_merge_close(m);
    fmt_model_close(base);
    run_free(&ref);
    tu_rmtree(tmp);
    free(tmp);
    free(bf);
    free(out);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_merge_embedding_and_lm_head_lora_with_base_layer_weights),
        cmocka_unit_test(test_merge_bias_all_and_lora_only_as_base_layer_bias),
        cmocka_unit_test(
            test_merge_modules_to_save_embedding_unties_keeping_lm_head),
        cmocka_unit_test(
            test_merge_embedding_lora_on_tied_model_keeps_output_layer),
        cmocka_unit_test(
            test_merge_dora_after_another_adapter_normalises_its_own_delta),
        cmocka_unit_test(test_merge_output_same_with_scalar_kernels),
        cmocka_unit_test(test_merge_tokenizer_named_shards_keep_merged_values),
        cmocka_unit_test(test_merge_single_tokenizer_named_file_is_merged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

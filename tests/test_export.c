/* test_export.c - `mcompile export` end to end: artifacts compiled from
 * the fixtures (and stories260k when ../shared has it) are exported to
 * GGUF and compressed-tensors, and the files are read back by readers
 * written from the formats' specifications (helpers/gguf_read.c; the
 * pack_to_int32 layout of compressed-tensors, unpacked in
 * helpers/export_util.c) and compared value by value with our own
 * dequantization of the artifact.  Also: the
 * float32 fallback and --strict's refusal by tensor name, the sliding
 * window refusal, usage errors, refusing to overwrite the input, and
 * memory about one tensor.  The GGUF tokenizer metadata is test_export_tok.c's. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmp_compile.h"
#include "cmp_export.h"
#include "cmp_quant.h"
#include "fmt_dtype.h"
#include "fmt_gguf.h"
#include "fmt_safetensors.h"
#include "export_util.h"
#include "gguf_read.h"
#include "mc_alloc.h"
#include "testutil.h"

#define FX MC_FIXTURE_DIR

static void test_export_gguf_holds_the_artifacts_values(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exg");
    char *mca = tu_fmt("%s/m.mca", dir), *gg = tu_fmt("%s/m.gguf", dir);
    static const struct {
        const char *model, *quant;
        kn_wformat fmt;
        uint32_t group, want;
        int permute, compress, linears; /* linears: 7 x layers */
        const char *extra;              /* more export options */
    } cases[] = {
        {"llama", "int8", KN_W_COUNT_, 32, FMT_GGUF_T_Q8_0, 1, 0, 28, ""},
        /* asymmetric int4: Q5_0 by default and Q8_0, both exact
         * (tolerance 0 above), or Q4_1 (its bound above) */
        {"llama", "int4", KN_W_COUNT_, 32, FMT_GGUF_T_Q5_0, 1, 1, 28, ""},
        {"llama", "int4", KN_W_COUNT_, 32, FMT_GGUF_T_Q4_1, 1, 0, 28,
         " --gguf-int4 q4_1"},
        {"llama", "int4", KN_W_COUNT_, 64, FMT_GGUF_T_Q4_1, 1, 0, 28,
         " --gguf-int4 q4_1"},
        {"llama", "int4", KN_W_COUNT_, 128, FMT_GGUF_T_Q8_0, 1, 0, 28,
         " --gguf-int4 q8_0"},
        {"llama", "int4", KN_W_Q4S, 32, FMT_GGUF_T_Q4_0, 1, 0, 28,
         " --gguf-int4 q5_0"}, /* symmetric stays Q4_0 */
        {"llama-bias", "int8", KN_W_COUNT_, 32, FMT_GGUF_T_Q8_0, 1, 0, 28, ""},
        {"llama", "f32", KN_W_COUNT_, 32, FMT_GGUF_T_F32, 1, 0, 28, ""},
        {"llama-bf16", "bf16", KN_W_COUNT_, 32, FMT_GGUF_T_BF16, 1, 0, 28, ""},
        {"qwen2", "int4", KN_W_COUNT_, 32, FMT_GGUF_T_Q5_0, 0, 0, 21, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *model = tu_fmt("%s/%s", FX, cases[i].model);
        tu_x_compile(model, mca, cases[i].quant, cases[i].fmt, cases[i].group,
                cases[i].compress);
        char *args = tu_fmt("'%s' --format gguf -o '%s' -q%s%s", mca, gg,
                            strcmp(cases[i].model, "qwen2")
                                ? ""
                                : " --ignore-sliding-window",
                            cases[i].extra);
        char *out = NULL, *err = NULL;
        assert_int_equal(tu_x_run_export(args, &out, &err), 0);
        assert_string_equal(out, "");
        int n = tu_x_check_gguf_values(mca, gg, cases[i].want, cases[i].permute);
        /* every linear (7 per layer) got the expected type */
        assert_true(n >= cases[i].linears);
        free(args);
        free(out);
        free(err);
        free(model);
    }
    /* the report states what Q4_1 rounds: how many blocks, and by how
     * much of a scale (at most half an f16 step of 15 scales, 15/2048) */
    tu_x_compile(FX "/llama", mca, "int4", KN_W_COUNT_, 32, 0);
    for (int k = 0; k < 2; k++) {
        char *a = tu_fmt("'%s' --format gguf -o '%s' --json%s", mca, gg,
                         k ? " --gguf-int4 q4_1" : "");
        char *out = NULL;
        assert_int_equal(tu_x_run_export(a, &out, NULL), 0);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        json_int_t blocks = json_integer_value(json_object_get(j,
                                                               "q4_1_blocks"));
        json_int_t inexact = json_integer_value(
            json_object_get(j, "q4_1_inexact"));
        double worst = json_real_value(json_object_get(j, "q4_1_max_err"));
        if (k == 0) {
            assert_int_equal(blocks, 0); /* the default, Q5_0, is exact */
        } else {
            assert_true(inexact > 0 && inexact <= blocks);
            assert_true(worst > 0 && worst <= 15.0 / 2048 * (1 + 1e-9));
        }
        json_decref(j);
        free(a);
        free(out);
    }
    /* a model directory exports too: its float tensors as they are */
    char *args = tu_fmt("'%s/llama' --format gguf -o '%s' -q", FX, gg);
    assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
    tg_file f;
    assert_int_equal(tg_open(gg, &f), 0);
    size_t n;
    const char *tm = tg_kv_str(&f, "tokenizer.ggml.model", &n);
    assert_memory_equal(tm, "no_vocab", n);
    assert_int_equal(tg_kv_u32(&f, "llama.vocab_size"), 256);
    assert_int_equal(tg_tensor_find(&f, "blk.0.attn_q.weight")->type,
                     FMT_GGUF_T_F32);
    tg_close(&f);
    free(args);
    tu_rmtree(dir);
    free(mca);
    free(gg);
    free(dir);
}

/* stories260k's FFN width 172 is no multiple of 32: ffn_down (172 wide
 * rows) is written as F32 with the exact values and said so; --strict
 * refuses, naming the tensor, and leaves nothing behind. */
static void test_export_ragged_rows_fall_back_or_are_refused(void **state)
{
    (void)state;
    const char *stories = tu_stories_dir();
    TU_SKIP_IF(!stories, "stories260k not in ../shared");
    char *dir = tu_mkdtemp("exr");
    char *mca = tu_fmt("%s/s.mca", dir), *gg = tu_fmt("%s/s.gguf", dir);
    tu_x_compile(stories, mca, "int4", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s'", mca, gg);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_x_run_export(args, &out, &err), 0);
    assert_non_null(strstr(out, "5 quantized tensors written as float32"));
    assert_non_null(strstr(out, "model.layers.0.mlp.down_proj.weight"));
    tu_x_check_gguf_values(mca, gg, FMT_GGUF_T_Q5_0, 1);
    tg_file f;
    assert_int_equal(tg_open(gg, &f), 0);
    assert_int_equal(tg_tensor_find(&f, "blk.0.ffn_down.weight")->type,
                     FMT_GGUF_T_F32);
    assert_int_equal(tg_tensor_find(&f, "blk.0.ffn_up.weight")->type,
                     FMT_GGUF_T_Q5_0);
    /* tied: no output.weight, llama.cpp reuses token_embd */
    assert_null(tg_tensor_find(&f, "output.weight"));
    tg_close(&f);
    free(args);
    free(out);
    free(err);
    char *g2 = tu_fmt("%s/strict.gguf", dir);
    args = tu_fmt("'%s' --format gguf --strict -o '%s'", mca, g2);
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "model.layers.0.mlp.down_proj.weight"));
    assert_non_null(strstr(err, "--strict"));
    assert_false(tu_exists(g2));
    free(args);
    free(out);
    free(err);
    char *ct = tu_fmt("%s/ct", dir);
    args = tu_fmt("'%s' --format compressed-tensors --strict -o '%s'", mca,
                  ct);
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "down_proj"));
    assert_false(tu_exists(ct));
    assert_int_equal(tu_count_entries(dir), 2); /* s.mca, s.gguf */
    free(args);
    free(out);
    free(err);
    tu_rmtree(dir);
    free(ct);
    free(g2);
    free(mca);
    free(gg);
    free(dir);
}

static void test_export_compressed_tensors_layout_and_values(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exc");
    char *mca = tu_fmt("%s/m.mca", dir), *ct = tu_fmt("%s/ct", dir);
    static const struct {
        const char *model, *quant;
        kn_wformat fmt;
        uint32_t group;
        size_t targets; /* 7 x layers, less the rows of 160 at g64 */
    } cases[] = {{"llama", "int4", KN_W_COUNT_, 32, 28},
                 {"llama", "int4", KN_W_Q4S, 64, 24},
                 {"llama", "int8", KN_W_COUNT_, 32, 28},
                 {"qwen2", "int4", KN_W_COUNT_, 32, 21},
                 {"mistral", "int8", KN_W_COUNT_, 32, 21}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *model = tu_fmt("%s/%s", FX, cases[i].model);
        tu_x_compile(model, mca, cases[i].quant, cases[i].fmt, cases[i].group, 1);
        char *args = tu_fmt("'%s' --format compressed-tensors -o '%s' -q",
                            mca, ct);
        assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
        tu_x_check_ct_values(mca, ct);
        char *cp = tu_fmt("%s/config.json", ct);
        json_t *cfg = json_load_file(cp, 0, NULL);
        json_t *g0 = json_object_get(
            json_object_get(json_object_get(cfg, "quantization_config"),
                            "config_groups"), "group_0");
        json_t *w = json_object_get(g0, "weights");
        int q8 = !strcmp(cases[i].quant, "int8");
        assert_int_equal(json_integer_value(json_object_get(w, "num_bits")),
                         q8 ? 8 : 4);
        assert_string_equal(json_string_value(json_object_get(w, "strategy")),
                            q8 ? "channel" : "group");
        assert_int_equal(json_is_true(json_object_get(w, "symmetric")),
                         q8 || cases[i].fmt == KN_W_Q4S);
        if (!q8)
            assert_int_equal(json_integer_value(json_object_get(
                                 w, "group_size")), cases[i].group);
        assert_int_equal(json_array_size(json_object_get(g0, "targets")),
                         cases[i].targets);
        json_decref(cfg);
        free(cp);
        free(args);
        free(model);
    }
    tu_rmtree(dir);
    free(mca);
    free(ct);
    free(dir);
}

/* A tied model's int8 embedding (its output layer; cmp_plan.h): GGUF gets
 * a Q8_0 token_embd bit-exact to the artifact (its int8 codes, each
 * block's d the row's scale itself: the compiler chose it an f16 value),
 * which the report says, and no output.weight (llama.cpp reuses
 * token_embd); the int8 linears' Q8_0 are reported not exact (their f32
 * scales rounded); compressed-tensors gets the embedding dequantized in
 * float32, which --strict accepts and --json reports.  --lm-head f16
 * keeps it F16. */
static void test_export_tied_int8_embedding(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exe");
    char *mca = tu_fmt("%s/m.mca", dir), *gg = tu_fmt("%s/m.gguf", dir);
    char *ct = tu_fmt("%s/ct", dir);
    tu_x_compile(FX "/qwen2", mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s' --json "
                        "--ignore-sliding-window", mca, gg);
    char *out = NULL;
    assert_int_equal(tu_x_run_export(args, &out, NULL), 0);
    json_t *j = json_loads(out, 0, NULL), *q8 = json_object_get(j, "q8_0");
    assert_non_null(q8);
    assert_int_equal(json_integer_value(json_object_get(q8, "tensors")),
                     1 + 7 * 3);
    assert_int_equal(json_integer_value(json_object_get(q8, "exact")), 1);
    assert_string_equal(json_string_value(json_object_get(q8, "exact_names")),
                        "token_embd.weight");
    assert_string_equal(
        json_string_value(json_object_get(q8, "inexact_first")),
        "blk.0.attn_q.weight");
    json_decref(j);
    free(out);
    free(args);
    tu_x_check_gguf_values(mca, gg, FMT_GGUF_T_Q8_0, 0);
    cmp_xsrc *s;
    mc_error err;
    assert_int_equal(cmp_xsrc_open(mca, &s, &err), MC_OK);
    cmp_xtensor t;
    assert_int_equal(cmp_xsrc_load(s, 0, &t, &err), MC_OK);
    assert_string_equal(t.name, "model.embed_tokens.weight");
    assert_int_equal(t.fmt, KN_W_Q8);
    tg_file f;
    assert_int_equal(tg_open(gg, &f), 0);
    const tg_tensor *e = tg_tensor_find(&f, "token_embd.weight");
    assert_non_null(e);
    assert_int_equal(e->type, FMT_GGUF_T_Q8_0);
    assert_null(tg_tensor_find(&f, "output.weight"));
    for (uint32_t r = 0; r < t.rows; r++) {
        float sc;
        memcpy(&sc, t.scales + 4 * (uint64_t)r, 4);
        for (uint32_t b = 0; b < t.cols / 32; b++) {
            const uint8_t *blk = e->data + ((uint64_t)r * (t.cols / 32) + b) *
                                               FMT_GGUF_Q8_0_BYTES;
            assert_true(fmt_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)) ==
                        sc);
            assert_memory_equal(blk + 2, t.data + (uint64_t)r * t.cols + 32 * b,
                                32);
        }
    }
    tg_close(&f);
    cmp_xsrc_close(s);
    /* compressed-tensors: float32, exact, not a fallback */
    args = tu_fmt("'%s' --format compressed-tensors --strict --json -o '%s'",
                  mca, ct);
    out = NULL;
    assert_int_equal(tu_x_run_export(args, &out, NULL), 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "dense_embed")));
    assert_int_equal(json_integer_value(json_object_get(j, "fallback")), 0);
    json_decref(j);
    free(out);
    free(args);
    tu_x_check_ct_values(mca, ct);
    char *sp = tu_fmt("%s/model.safetensors", ct);
    fmt_st_file *st;
    assert_int_equal(fmt_st_open(sp, &st, &err), MC_OK);
    assert_int_equal(fmt_st_find(st, "model.embed_tokens.weight")->dtype,
                     FMT_DT_F32);
    assert_null(fmt_st_find(st, "lm_head.weight"));
    fmt_st_close(st);
    free(sp);
    /* --lm-head f16: the float embedding, as before */
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse("int8", 0, &o.req.policy, NULL), MC_OK);
    o.req.policy.lm_head_set = 1;
    o.req.policy.lm_head_fmt = KN_W_F16;
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 1;
    o.req.max_seq = 64;
    o.model = FX "/qwen2";
    o.out = mca;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    args = tu_fmt("'%s' --format gguf -o '%s' -q --ignore-sliding-window",
                  mca, gg);
    assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
    free(args);
    assert_int_equal(tg_open(gg, &f), 0);
    assert_int_equal(tg_tensor_find(&f, "token_embd.weight")->type,
                     FMT_GGUF_T_F16);
    tg_close(&f);
    tu_rmtree(dir);
    free(ct);
    free(mca);
    free(gg);
    free(dir);
}

/* --lm-head int4-sym / int4 at group 32: the output layer (untied llama's
 * lm_head, tied qwen2's embedding) exports as Q4_0 (symmetric) or Q5_0
 * (asymmetric, exact), values checked against the artifact like every
 * tensor; compressed-tensors writes a quantized untied lm_head as float32
 * (a fallback, the engines load it dense) and the tied embedding dense,
 * with the artifact's values. */
static void test_export_int4_output_layer(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("ex4");
    char *mca = tu_fmt("%s/m.mca", dir), *gg = tu_fmt("%s/m.gguf", dir);
    char *ct = tu_fmt("%s/ct", dir);
    static const struct {
        const char *model, *quant;
        kn_wformat head;
        uint32_t want;
        int linears;        /* 7 x layers */
        const char *tensor; /* the output layer in the GGUF */
    } cases[] = {
        {"llama", "int4-sym", KN_W_Q4S, FMT_GGUF_T_Q4_0, 28, "output.weight"},
        {"llama", "int4", KN_W_Q4, FMT_GGUF_T_Q5_0, 28, "output.weight"},
        {"qwen2", "int4-sym", KN_W_Q4S, FMT_GGUF_T_Q4_0, 21,
         "token_embd.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cmp_compile_opts o;
        memset(&o, 0, sizeof o);
        cmp_plan_request_default(&o.req);
        assert_int_equal(cmp_wpolicy_parse(cases[i].quant, 32, &o.req.policy,
                                           NULL), MC_OK);
        o.req.policy.lm_head_set = 1; /* --lm-head */
        o.req.policy.lm_head_fmt = cases[i].head;
        o.req.target_bytes = 1ull << 30;
        o.req.max_batch = 1;
        o.req.max_seq = 64;
        char *model = tu_fmt("%s/%s", FX, cases[i].model);
        o.model = model;
        o.out = mca;
        mc_error err;
        assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
        int tied = strcmp(cases[i].model, "qwen2") == 0;
        char *args = tu_fmt("'%s' --format gguf -o '%s' -q%s", mca, gg,
                            tied ? " --ignore-sliding-window" : "");
        assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
        /* the linears and the output layer */
        assert_int_equal(tu_x_check_gguf_values(mca, gg, cases[i].want, !tied),
                         cases[i].linears + 1);
        tg_file f;
        assert_int_equal(tg_open(gg, &f), 0);
        assert_int_equal(tg_tensor_find(&f, cases[i].tensor)->type,
                         cases[i].want);
        tg_close(&f);
        free(args);
        args = tu_fmt("'%s' --format compressed-tensors -q -o '%s'", mca, ct);
        assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
        tu_x_check_ct_values(mca, ct);
        free(args);
        char *rm = tu_fmt("rm -rf '%s'", ct);
        assert_int_equal(tu_run(rm, NULL, NULL), 0);
        free(rm);
        free(model);
    }
    tu_rmtree(dir);
    free(ct);
    free(mca);
    free(gg);
    free(dir);
}

static void test_export_refuses_sliding_window_by_name(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exw");
    char *g = tu_fmt("%s/m.gguf", dir);
    char *args = tu_fmt("'%s/mistral' --format gguf -o '%s'", FX, g);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "sliding_window"));
    assert_non_null(strstr(err, "16 tokens"));
    assert_false(tu_exists(g));
    free(args);
    free(out);
    free(err);
    args = tu_fmt("'%s/mistral' --format gguf --ignore-sliding-window -o "
                  "'%s' -q", FX, g);
    assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
    assert_true(tu_exists(g));
    free(args);
    /* dynamic RoPE has no GGUF form */
    args = tu_fmt("'%s/llama-dynamic' --format gguf -o '%s'", FX, g);
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "rope_scaling"));
    free(args);
    free(out);
    free(err);
    /* llama3 RoPE: the factors tensor the converter writes */
    args = tu_fmt("'%s/llama3-rope' --format gguf -o '%s' -q", FX, g);
    assert_int_equal(tu_x_run_export(args, NULL, NULL), 0);
    tg_file f;
    assert_int_equal(tg_open(g, &f), 0);
    const tg_tensor *rf = tg_tensor_find(&f, "rope_freqs.weight");
    assert_non_null(rf);
    assert_int_equal(rf->ne[0], 8); /* head_dim 16 / 2 */
    float v[8];
    tg_row_f32(rf, 0, v);
    assert_true(v[0] == 1.0f && v[7] == 8.0f); /* short and long waves */
    tg_close(&f);
    free(args);
    tu_rmtree(dir);
    free(g);
    free(dir);
}

static void test_export_usage_errors_and_overwrite(void **state)
{
    (void)state;
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_x_run_export("--help", &out, &err), 0);
    assert_non_null(strstr(out, "usage: mcompile export INPUT"));
    free(out);
    free(err);
    const char *bad[] = {"", FX "/llama -o /tmp/x",
                         FX "/llama --format gguf",
                         FX "/llama --format onnx -o /tmp/x",
                         FX "/llama --format gguf -o /tmp/x --frob",
                         FX "/llama " FX "/qwen2 --format gguf -o /tmp/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(tu_x_run_export(bad[i], &out, &err), 2);
        assert_non_null(strstr(err, "mcompile export:"));
        free(out);
        free(err);
    }
    /* invalid combinations of options are refused by name */
    static const char *const combo[][3] = {
        {FX "/llama --format compressed-tensors -o /tmp/x --gguf-int4 q5_0",
         "--gguf-int4", "compressed-tensors"},
        {FX "/llama --format gguf -o /tmp/x --gguf-int4 q4_0", "--gguf-int4",
         "q4_0"},
        {FX "/llama --format gguf -o /tmp/x --gguf-int4", "--gguf-int4",
         "needs a value"},
        {FX "/mistral --format compressed-tensors -o /tmp/x "
            "--ignore-sliding-window", "--ignore-sliding-window",
         "compressed-tensors"}};
    for (size_t i = 0; i < sizeof combo / sizeof *combo; i++) {
        assert_int_equal(tu_x_run_export(combo[i][0], &out, &err), 2);
        assert_non_null(strstr(err, combo[i][1]));
        assert_non_null(strstr(err, combo[i][2]));
        free(out);
        free(err);
    }
    /* a directory output that holds the input would replace it */
    char *dir = tu_mkdtemp("exo");
    char *mca = tu_fmt("%s/m.mca", dir);
    tu_x_compile(FX "/llama", mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format compressed-tensors -o '%s'", mca, dir);
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "overwrite the input"));
    assert_true(tu_exists(mca));
    free(args);
    free(out);
    free(err);
    args = tu_fmt("'%s' --format gguf -o '%s' --json", mca, mca);
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    json_t *j = json_loads(out, 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "status")),
                     MC_ERR_INVALID_ARG);
    json_decref(j);
    free(args);
    free(out);
    free(err);
    tu_rmtree(dir);
    free(mca);
    free(dir);
}

/* A tied embedding row whose int8 scale is beyond f16's 65504 keeps its
 * f32 scale in the artifact (cmp_quant.h CMP_Q8_F16); GGUF's Q8_0 cannot
 * hold it, and the export refuses, naming the tensor and row, leaving
 * nothing behind. */
static void test_export_refuses_q8_scale_beyond_f16(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exq");
    char *md = tu_fmt("%s/model", dir), *mca = tu_fmt("%s/m.mca", dir);
    char *gg = tu_fmt("%s/m.gguf", dir);
    assert_int_equal(mkdir(md, 0755), 0);
    tu_x_write_wide_model(md, 1, 1e9f);
    tu_x_compile(md, mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s'", mca, gg);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_x_run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "model.embed_tokens.weight"));
    assert_non_null(strstr(err, "row 0's int8 scale"));
    assert_false(tu_exists(gg));
    free(args);
    free(out);
    free(err);
    tu_rmtree(dir);
    free(md);
    free(mca);
    free(gg);
    free(dir);
}

/* The export holds about one tensor: on a model 18x its largest tensor,
 * the tracked peak is the output file's fixed 1 MiB write buffer plus a
 * few times the largest tensor, far below the model. */
static void test_export_memory_is_about_one_tensor(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exm");
    char *g = tu_fmt("%s/m.gguf", dir), *ct = tu_fmt("%s/ct", dir);
    char *md = tu_fmt("%s/model", dir);
    assert_int_equal(mkdir(md, 0755), 0);
    tu_x_write_wide_model(md, 0, 0);
    for (int k = 0; k < 2; k++) {
        cmp_export_opts o = {k ? CMP_EXPORT_CT : CMP_EXPORT_GGUF, 0, 0};
        cmp_export_report rep;
        mc_error err;
        mc_alloc_track(1);
        mc_alloc_reset_peak();
        int64_t base = mc_alloc_live_bytes();
        assert_int_equal(cmp_export(md, k ? ct : g, &o, &rep, &err), MC_OK);
        int64_t peak = mc_alloc_peak_bytes() - base;
        mc_alloc_track(0);
        printf("export %s: peak %lld bytes, largest tensor %llu bytes, "
               "%zu tensors, %llu bytes written\n", k ? "c-t" : "gguf",
               (long long)peak, (unsigned long long)rep.largest_tensor,
               rep.tensors, (unsigned long long)rep.bytes);
        assert_true(rep.bytes > 17 * rep.largest_tensor);
        assert_true(peak < (int64_t)((1u << 20) + 3 * rep.largest_tensor +
                                     256 * 1024));
    }
    tu_rmtree(dir);
    free(md);
    free(g);
    free(ct);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_gguf_holds_the_artifacts_values),
        cmocka_unit_test(test_export_ragged_rows_fall_back_or_are_refused),
        cmocka_unit_test(test_export_compressed_tensors_layout_and_values),
        cmocka_unit_test(test_export_tied_int8_embedding),
        cmocka_unit_test(test_export_int4_output_layer),
        cmocka_unit_test(test_export_refuses_q8_scale_beyond_f16),
        cmocka_unit_test(test_export_refuses_sliding_window_by_name),
        cmocka_unit_test(test_export_usage_errors_and_overwrite),
        cmocka_unit_test(test_export_memory_is_about_one_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

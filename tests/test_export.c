/* test_export.c - `mcompile export` end to end: artifacts compiled from
 * the fixtures (and stories260k when ../shared has it) are exported to
 * GGUF and compressed-tensors, and the files are read back by readers
 * written from the formats' specifications (helpers/gguf_read.c; the
 * pack_to_int32 layout of compressed-tensors, unpacked here) and compared
 * value by value with our own dequantization of the artifact.  Also: the
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
#include "gguf_read.h"
#include "mc_alloc.h"
#include "testutil.h"

#define BIN MC_BIN_DIR "/mcompile"
#define FX MC_FIXTURE_DIR

/* Compile model into path with the library (linear format fmt, group). */
static void compile(const char *model, const char *path, const char *quant,
                    kn_wformat fmt, uint32_t group, int compress)
{
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse(quant, group, &o.req.policy, NULL),
                     MC_OK);
    if (fmt != KN_W_COUNT_)
        o.req.policy.linear = fmt;
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 1;
    o.req.max_seq = 64;
    o.model = model;
    o.out = path;
    o.compress = compress;
    mc_error err;
    mc_status st = cmp_compile(&o, NULL, &err);
    if (st != MC_OK)
        fail_msg("compile %s: %s", model, err.message);
}

static int run_export(const char *args, char **out, char **err)
{
    char *cmd = tu_fmt("'%s' export %s", BIN, args);
    int rc = tu_run(cmd, out, err);
    free(cmd);
    return rc;
}

/* The GGUF name of a Hugging Face tensor, as convert_hf_to_gguf.py's
 * tensor map gives it; *qk = 1 for q/k projections (permuted rows). */
static void gguf_name(const char *hf, char *out, size_t cap, int *qk)
{
    static const char *const map[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
        {"input_layernorm", "attn_norm"},
        {"post_attention_layernorm", "ffn_norm"},
        {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"},
        {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"}};
    *qk = strstr(hf, "q_proj") || strstr(hf, "k_proj");
    for (int i = 0; i < 3; i++)
        if (!strcmp(hf, map[i][0])) {
            snprintf(out, cap, "%s", map[i][1]);
            return;
        }
    unsigned l;
    char part[64], kind[16];
    assert_int_equal(sscanf(hf, "model.layers.%u.%63[a-z_.]", &l, part), 2);
    char *dot = strrchr(part, '.');
    snprintf(kind, sizeof kind, "%s", dot + 1);
    *dot = 0;
    for (int i = 3; i < 12; i++)
        if (!strcmp(part, map[i][0])) {
            snprintf(out, cap, "blk.%u.%s.%s", l, map[i][1], kind);
            return;
        }
    fail_msg("no GGUF name for %s", hf);
}

/* The Hugging Face row (or bias element) that GGUF row r holds: the
 * converter's permute takes a head's [2][hd/2] to [hd/2][2]. */
static uint32_t hf_row(uint32_t r, uint32_t hd, int permuted)
{
    uint32_t h = r / hd, w = r % hd;
    return permuted ? h * hd + (w % 2) * (hd / 2) + w / 2 : r;
}

/* Every tensor of the artifact against the GGUF: same values within the
 * conversion's stated rounding (Q4_0 and F32 exact; Q8_0's scale and
 * Q4_1's m rounded to f16), q/k rows permuted per head as llama.cpp's
 * converter does.  Returns how many GGUF tensors had type `want`. */
static int check_gguf_values(const char *mca, const char *gguf,
                             uint32_t want, int permute)
{
    cmp_xsrc *s;
    mc_error err;
    assert_int_equal(cmp_xsrc_open(mca, &s, &err), MC_OK);
    const fmt_model_config *c = cmp_xsrc_config(s);
    tg_file f;
    if (tg_open(gguf, &f))
        fail_msg("%s: %s", gguf, f.why);
    assert_int_equal(f.nt, cmp_xsrc_count(s));
    assert_int_equal(tg_kv_u32(&f, "general.quantization_version"), 2);
    size_t n;
    const char *arch = tg_kv_str(&f, "general.architecture", &n);
    char key[64];
    snprintf(key, sizeof key, "%.*s.block_count", (int)n, arch);
    assert_int_equal(tg_kv_u32(&f, key), c->num_layers);
    snprintf(key, sizeof key, "%.*s.attention.head_count_kv", (int)n, arch);
    assert_int_equal(tg_kv_u32(&f, key), c->num_kv_heads);
    snprintf(key, sizeof key, "%.*s.rope.dimension_count", (int)n, arch);
    assert_int_equal(tg_kv_u32(&f, key), c->head_dim);
    snprintf(key, sizeof key, "%.*s.attention.layer_norm_rms_epsilon",
             (int)n, arch);
    assert_true(tg_kv_f32(&f, key) == (float)c->rms_norm_eps);
    int count = 0;
    for (size_t i = 0; i < cmp_xsrc_count(s); i++) {
        cmp_xtensor t;
        assert_int_equal(cmp_xsrc_load(s, i, &t, &err), MC_OK);
        char name[96];
        int qk;
        gguf_name(t.name, name, sizeof name, &qk);
        const tg_tensor *g = tg_tensor_find(&f, name);
        if (!g)
            fail_msg("%s (%s) missing from %s", name, t.name, gguf);
        assert_int_equal(g->ne[0], t.cols);
        assert_int_equal(g->ne[1], t.rows);
        count += g->type == want;
        float *a = malloc((size_t)t.cols * 4), *b = malloc((size_t)t.cols * 4);
        uint32_t hd = c->head_dim;
        if (t.ndim == 1) {
            cmp_xtensor_row_f32(&t, 0, a);
            assert_int_equal(tg_row_f32(g, 0, b), 0);
            for (uint32_t e = 0; e < t.cols; e++) /* biases move too */
                assert_true(b[e] == a[hf_row(e, hd, qk && permute)]);
        }
        for (uint32_t r = 0; t.ndim == 2 && r < t.rows; r++) {
            cmp_xtensor_row_f32(&t, hf_row(r, hd, qk && permute), a);
            assert_int_equal(tg_row_f32(g, r, b), 0);
            uint32_t src = hf_row(r, hd, qk && permute);
            float rs = 0; /* Q8: the row's scale */
            if (t.fmt == KN_W_Q8)
                memcpy(&rs, t.scales + 4 * (uint64_t)src, 4);
            for (uint32_t k = 0; k < t.cols; k++) {
                /* Q8_0: the row scale rounded to f16, 2^-11 relative;
                 * exact when the scale is an f16 value (tied embedding) */
                double tol = g->type == FMT_GGUF_T_Q8_0 && t.fmt == KN_W_Q8 &&
                                     !cmp_quant_f16_exact(rs)
                                 ? fabs(a[k]) / 2048 + 1e-9 : 0;
                if (g->type != FMT_GGUF_T_Q4_1 && fabs(b[k] - a[k]) > tol)
                    fail_msg("%s row %u col %u: gguf %g, artifact %g (%s)",
                             t.name, r, k, b[k], a[k],
                             fmt_gguf_ttype_name((fmt_gguf_ttype)g->type));
            }
            /* Q4_1: per 32-block, no more squared error than d = s with
             * m = -s z rounded to the nearest f16 (a constant shift) */
            for (uint32_t k0 = 0; g->type == FMT_GGUF_T_Q4_1 && k0 < t.cols;
                 k0 += 32) {
                uint32_t ng = (t.cols + t.group - 1) / t.group;
                uint64_t gi = (uint64_t)src * ng + k0 / t.group;
                uint16_t sb = (uint16_t)(t.scales[2 * gi] |
                                         t.scales[2 * gi + 1] << 8);
                double sc = fmt_f16_to_f32(sb), z = t.zeros[gi];
                double shift = fmt_f16_to_f32(fmt_f32_to_f16(
                                   (float)(-sc * z))) + sc * z;
                double e = 0;
                for (uint32_t k = k0; k < k0 + 32; k++)
                    e += ((double)b[k] - a[k]) * ((double)b[k] - a[k]);
                if (e > 32 * shift * shift * (1 + 1e-6) + 1e-12)
                    fail_msg("%s row %u block %u: squared error %g over the "
                             "nearest-m bound %g", t.name, r, k0 / 32, e,
                             32 * shift * shift);
            }
        }
        free(a);
        free(b);
    }
    tg_close(&f);
    cmp_xsrc_close(s);
    return count;
}

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
        compile(model, mca, cases[i].quant, cases[i].fmt, cases[i].group,
                cases[i].compress);
        char *args = tu_fmt("'%s' --format gguf -o '%s' -q%s%s", mca, gg,
                            strcmp(cases[i].model, "qwen2")
                                ? ""
                                : " --ignore-sliding-window",
                            cases[i].extra);
        char *out = NULL, *err = NULL;
        assert_int_equal(run_export(args, &out, &err), 0);
        assert_string_equal(out, "");
        int n = check_gguf_values(mca, gg, cases[i].want, cases[i].permute);
        /* every linear (7 per layer) got the expected type */
        assert_true(n >= cases[i].linears);
        free(args);
        free(out);
        free(err);
        free(model);
    }
    /* the report states what Q4_1 rounds: how many blocks, and by how
     * much of a scale (at most half an f16 step of 15 scales, 15/2048) */
    compile(FX "/llama", mca, "int4", KN_W_COUNT_, 32, 0);
    for (int k = 0; k < 2; k++) {
        char *a = tu_fmt("'%s' --format gguf -o '%s' --json%s", mca, gg,
                         k ? " --gguf-int4 q4_1" : "");
        char *out = NULL;
        assert_int_equal(run_export(a, &out, NULL), 0);
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
    assert_int_equal(run_export(args, NULL, NULL), 0);
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
    compile(stories, mca, "int4", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s'", mca, gg);
    char *out = NULL, *err = NULL;
    assert_int_equal(run_export(args, &out, &err), 0);
    assert_non_null(strstr(out, "5 quantized tensors written as float32"));
    assert_non_null(strstr(out, "model.layers.0.mlp.down_proj.weight"));
    check_gguf_values(mca, gg, FMT_GGUF_T_Q5_0, 1);
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
    assert_int_equal(run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "model.layers.0.mlp.down_proj.weight"));
    assert_non_null(strstr(err, "--strict"));
    assert_false(tu_exists(g2));
    free(args);
    free(out);
    free(err);
    char *ct = tu_fmt("%s/ct", dir);
    args = tu_fmt("'%s' --format compressed-tensors --strict -o '%s'", mca,
                  ct);
    assert_int_equal(run_export(args, &out, &err), 1);
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

/* compressed-tensors' pack_to_int32: element i at bits (i*b) % 32 of
 * word i*b/32, stored q + 2^(b-1). */
static int unpack(const uint8_t *words, uint64_t i, int bits)
{
    uint64_t bit = i * (uint64_t)bits;
    uint32_t w;
    memcpy(&w, words + bit / 32 * 4, 4);
    return (int)((w >> (bit % 32)) & ((1u << bits) - 1)) - (1 << (bits - 1));
}

static void check_ct_values(const char *mca, const char *dir)
{
    cmp_xsrc *s;
    mc_error err;
    assert_int_equal(cmp_xsrc_open(mca, &s, &err), MC_OK);
    char *p = tu_fmt("%s/model.safetensors", dir);
    fmt_st_file *st;
    assert_int_equal(fmt_st_open(p, &st, &err), MC_OK);
    char *cp = tu_fmt("%s/config.json", dir);
    json_t *cfg = json_load_file(cp, 0, NULL);
    assert_non_null(cfg);
    json_t *q = json_object_get(cfg, "quantization_config");
    assert_string_equal(json_string_value(json_object_get(q, "quant_method")),
                        "compressed-tensors");
    assert_string_equal(json_string_value(json_object_get(q, "format")),
                        "pack-quantized");
    for (size_t i = 0; i < cmp_xsrc_count(s); i++) {
        cmp_xtensor t;
        assert_int_equal(cmp_xsrc_load(s, i, &t, &err), MC_OK);
        float *a = malloc((size_t)t.cols * 4);
        char mod[200], nm[256];
        snprintf(mod, sizeof mod, "%.*s", (int)strlen(t.name) - 7, t.name);
        snprintf(nm, sizeof nm, "%s.weight_packed", mod);
        const fmt_st_tensor *pk = fmt_st_find(st, nm);
        if (!pk || strncmp(t.name, "model.layers.", 13)) {
            const fmt_st_tensor *d = fmt_st_find(st, t.name);
            assert_non_null(d);
            for (uint32_t r = 0; r < t.rows; r++) {
                cmp_xtensor_row_f32(&t, r, a);
                for (uint32_t k = 0; k < t.cols; k++) {
                    uint64_t e = (uint64_t)r * t.cols + k;
                    float v = d->dtype == FMT_DT_F32
                                  ? ((const float *)d->data)[e]
                                  : d->dtype == FMT_DT_F16
                                        ? fmt_f16_to_f32(((const uint16_t *)
                                                              d->data)[e])
                                        : fmt_bf16_to_f32(((const uint16_t *)
                                                               d->data)[e]);
                    assert_true(v == a[k]);
                }
            }
            free(a);
            continue;
        }
        int bits = t.fmt == KN_W_Q8 ? 8 : 4;
        assert_int_equal(pk->dtype, FMT_DT_I32);
        assert_int_equal(pk->shape[0], t.rows);
        assert_int_equal(pk->shape[1], ((uint64_t)t.cols * bits + 31) / 32);
        snprintf(nm, sizeof nm, "%s.weight_scale", mod);
        const fmt_st_tensor *sc = fmt_st_find(st, nm);
        snprintf(nm, sizeof nm, "%s.weight_shape", mod);
        const fmt_st_tensor *sh = fmt_st_find(st, nm);
        snprintf(nm, sizeof nm, "%s.weight_zero_point", mod);
        const fmt_st_tensor *zp = fmt_st_find(st, nm);
        assert_non_null(sc);
        assert_non_null(sh);
        assert_int_equal(sh->dtype, FMT_DT_I64);
        assert_int_equal(((const int64_t *)sh->data)[0], t.rows);
        assert_int_equal(((const int64_t *)sh->data)[1], t.cols);
        uint64_t ng = sc->shape[1];
        assert_int_equal(zp != NULL, t.fmt == KN_W_Q4);
        if (zp) {
            assert_int_equal(zp->shape[0], (t.rows + 7) / 8);
            assert_int_equal(zp->shape[1], ng);
        }
        uint64_t gs = t.fmt == KN_W_Q8 ? t.cols : t.group;
        for (uint32_t r = 0; r < t.rows; r++) {
            cmp_xtensor_row_f32(&t, r, a);
            const uint8_t *row = (const uint8_t *)pk->data +
                                 (uint64_t)r * pk->shape[1] * 4;
            for (uint32_t k = 0; k < t.cols; k++) {
                uint64_t g = k / gs;
                float scale = ((const float *)sc->data)[r * ng + g];
                int z = 0;
                if (zp) { /* zero points packed down the rows */
                    uint32_t w;
                    memcpy(&w, (const uint8_t *)zp->data +
                                   ((r / 8) * ng + g) * 4, 4);
                    z = (int)((w >> (4 * (r % 8))) & 15) - 8;
                }
                float v = (float)(unpack(row, k, bits) - z) * scale;
                if (v != a[k])
                    fail_msg("%s [%u][%u]: c-t %g, artifact %g", t.name, r, k,
                             v, a[k]);
            }
        }
        free(a);
    }
    json_decref(cfg);
    free(cp);
    fmt_st_close(st);
    free(p);
    cmp_xsrc_close(s);
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
        compile(model, mca, cases[i].quant, cases[i].fmt, cases[i].group, 1);
        char *args = tu_fmt("'%s' --format compressed-tensors -o '%s' -q",
                            mca, ct);
        assert_int_equal(run_export(args, NULL, NULL), 0);
        check_ct_values(mca, ct);
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
    compile(FX "/qwen2", mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s' --json "
                        "--ignore-sliding-window", mca, gg);
    char *out = NULL;
    assert_int_equal(run_export(args, &out, NULL), 0);
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
    check_gguf_values(mca, gg, FMT_GGUF_T_Q8_0, 0);
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
    assert_int_equal(run_export(args, &out, NULL), 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "dense_embed")));
    assert_int_equal(json_integer_value(json_object_get(j, "fallback")), 0);
    json_decref(j);
    free(out);
    free(args);
    check_ct_values(mca, ct);
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
    assert_int_equal(run_export(args, NULL, NULL), 0);
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

static void test_export_refuses_sliding_window_by_name(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("exw");
    char *g = tu_fmt("%s/m.gguf", dir);
    char *args = tu_fmt("'%s/mistral' --format gguf -o '%s'", FX, g);
    char *out = NULL, *err = NULL;
    assert_int_equal(run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "sliding_window"));
    assert_non_null(strstr(err, "16 tokens"));
    assert_false(tu_exists(g));
    free(args);
    free(out);
    free(err);
    args = tu_fmt("'%s/mistral' --format gguf --ignore-sliding-window -o "
                  "'%s' -q", FX, g);
    assert_int_equal(run_export(args, NULL, NULL), 0);
    assert_true(tu_exists(g));
    free(args);
    /* dynamic RoPE has no GGUF form */
    args = tu_fmt("'%s/llama-dynamic' --format gguf -o '%s'", FX, g);
    assert_int_equal(run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "rope_scaling"));
    free(args);
    free(out);
    free(err);
    /* llama3 RoPE: the factors tensor the converter writes */
    args = tu_fmt("'%s/llama3-rope' --format gguf -o '%s' -q", FX, g);
    assert_int_equal(run_export(args, NULL, NULL), 0);
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
    assert_int_equal(run_export("--help", &out, &err), 0);
    assert_non_null(strstr(out, "usage: mcompile export INPUT"));
    free(out);
    free(err);
    const char *bad[] = {"", FX "/llama -o /tmp/x",
                         FX "/llama --format gguf",
                         FX "/llama --format onnx -o /tmp/x",
                         FX "/llama --format gguf -o /tmp/x --frob",
                         FX "/llama " FX "/qwen2 --format gguf -o /tmp/x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(run_export(bad[i], &out, &err), 2);
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
        assert_int_equal(run_export(combo[i][0], &out, &err), 2);
        assert_non_null(strstr(err, combo[i][1]));
        assert_non_null(strstr(err, combo[i][2]));
        free(out);
        free(err);
    }
    /* a directory output that holds the input would replace it */
    char *dir = tu_mkdtemp("exo");
    char *mca = tu_fmt("%s/m.mca", dir);
    compile(FX "/llama", mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format compressed-tensors -o '%s'", mca, dir);
    assert_int_equal(run_export(args, &out, &err), 1);
    assert_non_null(strstr(err, "overwrite the input"));
    assert_true(tu_exists(mca));
    free(args);
    free(out);
    free(err);
    args = tu_fmt("'%s' --format gguf -o '%s' --json", mca, mca);
    assert_int_equal(run_export(args, &out, &err), 1);
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

/* A Llama of 12.6 MiB (hidden 256, FFN 704, 4 layers, vocab 512, f32)
 * whose largest tensor is 704 KiB, written into dir; tied: no lm_head,
 * and the embedding's row 0 times row0 (when not 0). */
static void write_wide_model(const char *dir, int tied, float row0)
{
    char *cp = tu_fmt("%s/config.json", dir);
    char *cfg = tu_fmt(
        "{\"model_type\": \"llama\", \"hidden_size\": 256, "
        "\"intermediate_size\": 704, \"num_hidden_layers\": 4, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
        "\"vocab_size\": 512, \"max_position_embeddings\": 128, "
        "\"rms_norm_eps\": 1e-5, \"hidden_act\": \"silu\", "
        "\"torch_dtype\": \"float32\", \"tie_word_embeddings\": %s}",
        tied ? "true" : "false");
    assert_int_equal(tu_write_file(cp, cfg, strlen(cfg)), 0);
    free(cfg);
    char *mp = tu_fmt("%s/model.safetensors", dir);
    fmt_st_writer *w;
    mc_error err;
    assert_int_equal(fmt_st_writer_create(mp, &w, &err), MC_OK);
    static const struct {
        const char *name;
        uint64_t rows, cols;
    } lin[] = {{"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 256, 256},
               {"self_attn.v_proj", 256, 256}, {"self_attn.o_proj", 256, 256},
               {"mlp.gate_proj", 704, 256},    {"mlp.up_proj", 704, 256},
               {"mlp.down_proj", 256, 704}};
    uint64_t sh[2] = {512, 256}, n1[1] = {256};
    assert_int_equal(fmt_st_writer_add(w, "model.embed_tokens.weight",
                                       FMT_DT_F32, 2, sh, &err), MC_OK);
    for (int l = 0; l < 4; l++) {
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        assert_int_equal(fmt_st_writer_add(w, nm, FMT_DT_F32, 1, n1, &err),
                         MC_OK);
        snprintf(nm, sizeof nm,
                 "model.layers.%d.post_attention_layernorm.weight", l);
        assert_int_equal(fmt_st_writer_add(w, nm, FMT_DT_F32, 1, n1, &err),
                         MC_OK);
        for (int k = 0; k < 7; k++) {
            uint64_t s2[2] = {lin[k].rows, lin[k].cols};
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", l,
                     lin[k].name);
            assert_int_equal(fmt_st_writer_add(w, nm, FMT_DT_F32, 2, s2,
                                               &err), MC_OK);
        }
    }
    assert_int_equal(fmt_st_writer_add(w, "model.norm.weight", FMT_DT_F32, 1,
                                       n1, &err), MC_OK);
    if (!tied)
        assert_int_equal(fmt_st_writer_add(w, "lm_head.weight", FMT_DT_F32,
                                           2, sh, &err), MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &err), MC_OK);
    static tu_rng g = {0x5eed};
    float buf[4096];
    uint64_t total = (512 * 256 * (tied ? 1 : 2) + 256) +
                     4 * (256 * 2 + 4 * 256 * 256 + 3 * 704 * 256);
    for (uint64_t done = 0; done < total; done += 4096) {
        size_t k = total - done < 4096 ? (size_t)(total - done) : 4096;
        tu_rng_fill(&g, buf, k, 0.1f);
        for (size_t i = 0; done == 0 && row0 != 0 && i < 256; i++)
            buf[i] *= row0;
        assert_int_equal(fmt_st_writer_write(w, buf, k * 4, &err), MC_OK);
    }
    assert_int_equal(fmt_st_writer_finish(w, &err), MC_OK);
    free(cp);
    free(mp);
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
    write_wide_model(md, 1, 1e9f);
    compile(md, mca, "int8", KN_W_COUNT_, 32, 0);
    char *args = tu_fmt("'%s' --format gguf -o '%s'", mca, gg);
    char *out = NULL, *err = NULL;
    assert_int_equal(run_export(args, &out, &err), 1);
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
    write_wide_model(md, 0, 0);
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
        cmocka_unit_test(test_export_refuses_q8_scale_beyond_f16),
        cmocka_unit_test(test_export_refuses_sliding_window_by_name),
        cmocka_unit_test(test_export_usage_errors_and_overwrite),
        cmocka_unit_test(test_export_memory_is_about_one_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

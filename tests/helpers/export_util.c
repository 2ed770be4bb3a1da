/* export_util.c - see export_util.h. */
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

#include "cmp_compile.h"
#include "cmp_export.h"
#include "cmp_quant.h"
#include "export_util.h"
#include "fmt_dtype.h"
#include "fmt_gguf.h"
#include "fmt_safetensors.h"
#include "gguf_read.h"
#include "testutil.h"

#define BIN MC_BIN_DIR "/mcompile"

/* Compile model into path with the library (linear format fmt, group). */
void tu_x_compile(const char *model, const char *path, const char *quant,
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

int tu_x_run_export(const char *args, char **out, char **err)
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
int tu_x_check_gguf_values(const char *mca, const char *gguf,
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

/* compressed-tensors' pack_to_int32: element i at bits (i*b) % 32 of
 * word i*b/32, stored q + 2^(b-1). */
static int unpack(const uint8_t *words, uint64_t i, int bits)
{
    uint64_t bit = i * (uint64_t)bits;
    uint32_t w;
    memcpy(&w, words + bit / 32 * 4, 4);
    return (int)((w >> (bit % 32)) & ((1u << bits) - 1)) - (1 << (bits - 1));
}

void tu_x_check_ct_values(const char *mca, const char *dir)
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

/* A Llama of 12.6 MiB (hidden 256, FFN 704, 4 layers, vocab 512, f32)
 * whose largest tensor is 704 KiB, written into dir; tied: no lm_head,
 * and the embedding's row 0 times row0 (when not 0). */
void tu_x_write_wide_model(const char *dir, int tied, float row0)
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

/* cmp_export_gguf.c - the GGUF export (cmp_export.h): names, metadata and
 * the block conversions llama.cpp's converter would have produced from
 * the same weights.
 *
 * Metadata follows convert_hf_to_gguf.py for LlamaForCausalLM (also used
 * for Mistral) and Qwen2ForCausalLM: general.*, <arch>.* hyperparameters,
 * RoPE scaling (linear, yarn; llama3 as a rope_freqs.weight tensor of
 * per-frequency factors), tokenizer.ggml.* (cmp_export_tok.c) or, for a
 * model without a tokenizer, tokenizer.ggml.model = "no_vocab" (llama.cpp
 * then makes vocab_size placeholder tokens and runs on token ids). */
#include "cmp_export.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "fmt_gguf.h"
#include "mc_alloc.h"
#include "mc_checked.h"

/* llama.cpp's llama_ftype values for general.file_type. */
enum { FT_ALL_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7,
       FT_Q5_0 = 8, FT_BF16 = 32 };

/* Hugging Face name -> GGUF name into out; *qk gets 'q' or 'k' for the
 * q/k projections (whose rows the llama graph wants permuted), else 0.
 * Returns 0 for a tensor llama.cpp has no place for. */
static int gguf_name(const char *hf, char *out, size_t cap, char *qk)
{
    static const struct {
        const char *hf, *gg;
    } top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
               {"model.norm.weight", "output_norm.weight"},
               {"lm_head.weight", "output.weight"}};
    static const struct {
        const char *hf, *gg;
        char qk;
    } blk[] = {{"input_layernorm", "attn_norm", 0},
               {"post_attention_layernorm", "ffn_norm", 0},
               {"self_attn.q_proj", "attn_q", 'q'},
               {"self_attn.k_proj", "attn_k", 'k'},
               {"self_attn.v_proj", "attn_v", 0},
               {"self_attn.o_proj", "attn_output", 0},
               {"mlp.gate_proj", "ffn_gate", 0},
               {"mlp.up_proj", "ffn_up", 0},
               {"mlp.down_proj", "ffn_down", 0}};
    *qk = 0;
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (strcmp(hf, top[i].hf) == 0)
            return snprintf(out, cap, "%s", top[i].gg) > 0;
    unsigned layer;
    int n = 0;
    if (sscanf(hf, "model.layers.%u.%n", &layer, &n) != 1 || n == 0)
        return 0;
    const char *rest = hf + n;
    for (size_t i = 0; i < sizeof blk / sizeof *blk; i++) {
        size_t l = strlen(blk[i].hf);
        if (strncmp(rest, blk[i].hf, l) == 0 &&
            (strcmp(rest + l, ".weight") == 0 ||
             strcmp(rest + l, ".bias") == 0)) {
            *qk = blk[i].qk;
            return snprintf(out, cap, "blk.%u.%s%s", layer, blk[i].gg,
                            rest + l) < (int)cap;
        }
    }
    return 0;
}

/* The GGUF type of t, and whether it is the f32 fallback. */
static fmt_gguf_ttype pick_type(const cmp_xtensor *t, cmp_gguf_int4 q4,
                                int *fallback)
{
    *fallback = 0;
    if (t->ndim == 1)
        return FMT_GGUF_T_F32; /* norms and biases: llama.cpp wants F32 */
    int blocks = t->cols % FMT_GGUF_QK == 0;
    switch (t->fmt) {
    case KN_W_F32: return FMT_GGUF_T_F32;
    case KN_W_F16: return FMT_GGUF_T_F16;
    case KN_W_BF16: return FMT_GGUF_T_BF16;
    case KN_W_Q8: if (blocks) return FMT_GGUF_T_Q8_0; break;
    case KN_W_Q4S: if (blocks) return FMT_GGUF_T_Q4_0; break;
    case KN_W_Q4:
        if (blocks)
            return q4 == CMP_GGUF_INT4_Q5_0   ? FMT_GGUF_T_Q5_0
                   : q4 == CMP_GGUF_INT4_Q8_0 ? FMT_GGUF_T_Q8_0
                                              : FMT_GGUF_T_Q4_1;
        break;
    default: break;
    }
    *fallback = 1;
    return FMT_GGUF_T_F32;
}

/* Input row for output row g: llama.cpp's LlamaModel.permute takes each
 * head's rows from [2][hd/2] (rotate_half halves) to [hd/2][2] (pairs). */
static uint32_t src_row(uint32_t g, uint32_t head_dim, char qk, int permute)
{
    if (!qk || !permute)
        return g;
    uint32_t h = g / head_dim, w = g % head_dim, half = head_dim / 2;
    return h * head_dim + (w % 2) * half + w / 2;
}

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* Our int4 code of element c of a packed row. */
static int q4_at(const uint8_t *row, uint32_t c)
{
    return c & 1 ? row[c / 2] >> 4 : row[c / 2] & 15;
}

/* Q4_1's (d, m) for one block whose exact values are s (q - z): d = s and
 * m = -s z would be exact, but m must be an f16, which rounds it by up to
 * 2^-11 of |s z| (under 1/136 of s): a shift of the whole block.  d stays
 * s and m is rounded to nearest.  A search over neighbouring (d, m) pairs
 * for the least squared error per block was measured and dropped: it moves
 * d, which tilts the error with the code, and on stories260k int4 it gave
 * a higher KLD at g32 (1.24e-4 against 1.11e-4) and 44 or 4 greedy ids of
 * 64 where this gives 64 (docs/export.md).  Returns the largest |error| of
 * the block as a multiple of s (0: exact). */
static double q4_1_params(uint16_t s_bits, uint8_t z, uint8_t *blk)
{
    double s = fmt_f16_to_f32(s_bits);
    uint16_t mb = fmt_f32_to_f16((float)(-s * z));
    double shift = fmt_f16_to_f32(mb) + s * z; /* the same for every code */
    put_u16(blk, s_bits);
    put_u16(blk + 2, mb);
    return s != 0 ? fabs(shift) / fabs(s) : 0;
}

/* One 32-block of an asymmetric int4 row (codes q, scale s_bits, zero z)
 * held exactly: Q5_0 as d = s, c = q - z + 16 (1..31), or Q8_0 as d = s,
 * c = q - z. */
static void q4_exact_block(const uint8_t *row, uint32_t c0, uint16_t s_bits,
                           uint8_t z, fmt_gguf_ttype ty, uint8_t *blk)
{
    put_u16(blk, s_bits);
    if (ty == FMT_GGUF_T_Q8_0) {
        for (uint32_t c = 0; c < FMT_GGUF_QK; c++)
            blk[2 + c] = (uint8_t)(int8_t)(q4_at(row, c0 + c) - z);
        return;
    }
    uint32_t qh = 0;
    uint8_t *qs = blk + 6;
    for (uint32_t j = 0; j < FMT_GGUF_QK / 2; j++) {
        unsigned lo = (unsigned)(q4_at(row, c0 + j) - z + 16);
        unsigned hi = (unsigned)(q4_at(row, c0 + j + 16) - z + 16);
        qs[j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
        qh |= (uint32_t)(lo >> 4) << j | (uint32_t)(hi >> 4) << (j + 16);
    }
    for (int b = 0; b < 4; b++)
        blk[2 + b] = (uint8_t)(qh >> (8 * b));
}

/* One row r of t as ggml type ty into out. */
static mc_status convert_row(const cmp_xtensor *t, uint32_t r,
                             fmt_gguf_ttype ty, uint8_t *out, float *tmp,
                             cmp_export_report *rep, mc_error *err)
{
    uint32_t n = t->cols;
    if (ty == FMT_GGUF_T_F32) {
        cmp_xtensor_row_f32(t, r, tmp);
        memcpy(out, tmp, (size_t)n * 4);
        return MC_OK;
    }
    if (ty == FMT_GGUF_T_F16 || ty == FMT_GGUF_T_BF16) {
        memcpy(out, t->data + (uint64_t)r * n * 2, (size_t)n * 2);
        return MC_OK;
    }
    if (ty == FMT_GGUF_T_Q8_0 && t->fmt == KN_W_Q8) {
        float s;
        memcpy(&s, t->scales + 4 * (uint64_t)r, 4);
        uint16_t d = fmt_f32_to_f16(s);
        float h = fmt_f16_to_f32(d);
        if (!isfinite(h))
            return mc_fail(err, MC_ERR_NONFINITE, NULL, t->name, -1,
                           "row %u's int8 scale %g does not fit an f16 "
                           "Q8_0 block scale", r, (double)s);
        if (h != s) { /* every value of the row moves by this ratio */
            rep->q8_rows_inexact++;
            rep->q8_max_err = fmax(rep->q8_max_err,
                                   fabs((double)h - s) / fabs((double)s));
        }
        const uint8_t *q = t->data + (uint64_t)r * n;
        for (uint32_t b = 0; b < n / FMT_GGUF_QK; b++) {
            uint8_t *blk = out + (size_t)b * FMT_GGUF_Q8_0_BYTES;
            put_u16(blk, d);
            memcpy(blk + 2, q + (size_t)b * FMT_GGUF_QK, FMT_GGUF_QK);
        }
        return MC_OK;
    }
    /* Q4_0 (from Q4S), or Q4_1 / Q5_0 / Q8_0 (from Q4): each block repeats
     * its group's scale (and zero); groups are multiples of 32 so no block
     * straddles two */
    uint32_t ng = kn_q4_ngroups(n, t->group);
    const uint8_t *q = t->data + (uint64_t)r * kn_q4_row_bytes(n);
    uint64_t bsz;
    fmt_gguf_row_bytes(ty, FMT_GGUF_QK, NULL, &bsz, NULL);
    for (uint32_t b = 0; b < n / FMT_GGUF_QK; b++) {
        uint32_t c0 = b * FMT_GGUF_QK;
        uint64_t g = (uint64_t)r * ng + c0 / t->group;
        uint16_t d = get_u16(t->scales + 2 * g);
        uint8_t *blk = out + (size_t)b * bsz;
        if (t->fmt == KN_W_Q4 && ty != FMT_GGUF_T_Q4_1) {
            q4_exact_block(q, c0, d, t->zeros[g], ty, blk);
            continue;
        }
        uint8_t *qs = blk + 2;
        put_u16(blk, d);
        if (ty == FMT_GGUF_T_Q4_1) {
            double e = q4_1_params(d, t->zeros[g], blk);
            rep->q4_1_blocks++;
            rep->q4_1_inexact += e > 0;
            rep->q4_1_max_err = fmax(rep->q4_1_max_err, e);
            qs = blk + 4;
        }
        for (uint32_t j = 0; j < 16; j++)
            qs[j] = (uint8_t)(q4_at(q, c0 + j) | q4_at(q, c0 + j + 16) << 4);
    }
    return MC_OK;
}

/* After a Q8_0 tensor from int8 (name, its GGUF name): exact when none
 * of its rows' scales was rounded (q8_rows_inexact still `before`). */
static void q8_note(cmp_export_report *rep, const char *name,
                    uint64_t before)
{
    rep->q8_tensors++;
    if (rep->q8_rows_inexact > before) {
        if (!rep->q8_inexact_first[0])
            snprintf(rep->q8_inexact_first, sizeof rep->q8_inexact_first,
                     "%s", name);
        return;
    }
    rep->q8_exact++;
    char *l = rep->q8_exact_names;
    size_t cap = sizeof rep->q8_exact_names, n = strlen(l);
    if (n + 3 >= cap || strcmp(l + n - (n >= 3 ? 3 : n), "...") == 0)
        return;
    if (snprintf(l + n, cap - n, "%s%s", n ? ", " : "", name) >=
        (int)(cap - n))
        snprintf(l + cap - 4, 4, "...");
}

/* llama3 RoPE as convert_hf_to_gguf.py writes it: one factor per
 * frequency, 1 for short wavelengths, `factor` for long ones, smooth
 * between. */
static void llama3_factors(const fmt_model_config *c, float *f)
{
    const fmt_rope *r = &c->rope;
    double old = r->original_max_pos ? (double)r->original_max_pos : 8192.0;
    double lo = old / r->low_freq_factor, hi = old / r->high_freq_factor;
    uint32_t d = c->head_dim;
    for (uint32_t i = 0; i < d / 2; i++) {
        double freq = 1.0 / pow(r->theta, (double)(2 * i) / d);
        double wl = 2 * 3.14159265358979323846 / freq;
        if (wl < hi) {
            f[i] = 1.0f;
        } else if (wl > lo) {
            f[i] = (float)r->factor;
        } else {
            double sm = (old / wl - r->low_freq_factor) /
                        (r->high_freq_factor - r->low_freq_factor);
            f[i] = (float)(1.0 / ((1 - sm) / r->factor + sm));
        }
    }
}

#define KEY(k) (snprintf(key, sizeof key, "%s." k, arch), key)

static mc_status add_hparams(fmt_gguf_writer *w, const fmt_model_config *c,
                             const char *arch, const char *src, mc_error *err)
{
    char key[96];
    mc_status st;
    uint64_t ctx = c->max_position_embeddings;
    if ((st = fmt_gguf_add_u32(w, KEY("context_length"),
                               ctx > UINT32_MAX ? UINT32_MAX : (uint32_t)ctx,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("embedding_length"), c->hidden_size,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("block_count"), c->num_layers, err)) !=
            MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("feed_forward_length"),
                               c->intermediate_size, err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("attention.head_count"), c->num_heads,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("attention.head_count_kv"),
                               c->num_kv_heads, err)) != MC_OK ||
        (st = fmt_gguf_add_f32(w, KEY("attention.layer_norm_rms_epsilon"),
                               (float)c->rms_norm_eps, err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("attention.key_length"), c->head_dim,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("attention.value_length"), c->head_dim,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_f32(w, KEY("rope.freq_base"), (float)c->rope.theta,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("rope.dimension_count"), c->head_dim,
                               err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, KEY("vocab_size"), c->vocab_size, err)) !=
            MC_OK)
        return st;
    const fmt_rope *r = &c->rope;
    const char *type = r->type == FMT_ROPE_LINEAR ? "linear"
                       : r->type == FMT_ROPE_YARN ? "yarn"
                                                  : NULL;
    if (r->type == FMT_ROPE_DYNAMIC)
        return mc_fail(err, MC_ERR_UNSUPPORTED, src, "rope_scaling", -1,
                       "dynamic (NTK) RoPE scaling has no GGUF form: "
                       "llama.cpp's graphs do not grow theta with the "
                       "sequence");
    if (type &&
        ((st = fmt_gguf_add_string(w, KEY("rope.scaling.type"), type,
                                   strlen(type), err)) != MC_OK ||
         (st = fmt_gguf_add_f32(w, KEY("rope.scaling.factor"),
                                (float)r->factor, err)) != MC_OK))
        return st;
    if (r->type == FMT_ROPE_YARN && r->original_max_pos &&
        (st = fmt_gguf_add_u32(w, KEY("rope.scaling.original_context_length"),
                               (uint32_t)r->original_max_pos, err)) != MC_OK)
        return st;
    return MC_OK;
}

static mc_status add_general(fmt_gguf_writer *w, const fmt_model_config *c,
                             const char *arch, uint32_t ftype,
                             const char *src, mc_error *err)
{
    /* the output's file name without ".gguf" names the model */
    const char *base = strrchr(src, '/');
    base = base && base[1] ? base + 1 : src;
    size_t bl = strlen(base);
    if (bl > 5 && strcmp(base + bl - 5, ".gguf") == 0)
        bl -= 5;
    mc_status st;
    /* general.quantized_by (GGUF's key for the tool) also marks the file
     * as ours: a later export may replace it (cmp_export.c) */
    if ((st = fmt_gguf_add_string(w, "general.architecture", arch,
                                  strlen(arch), err)) != MC_OK ||
        (st = fmt_gguf_add_string(w, "general.quantized_by",
                                  CMP_EXPORT_GGUF_BY, strlen(CMP_EXPORT_GGUF_BY),
                                  err)) != MC_OK ||
        (st = fmt_gguf_add_string(w, "general.name", base, bl, err)) !=
            MC_OK ||
        (st = fmt_gguf_add_u32(w, "general.file_type", ftype, err)) != MC_OK ||
        (st = fmt_gguf_add_u32(w, "general.quantization_version", 2, err)) !=
            MC_OK)
        return st;
    return add_hparams(w, c, arch, src, err);
}

/* Refusals that depend on the model, not on a tensor. */
static mc_status check_model(const fmt_model_config *c,
                             const cmp_export_opts *o, const char *src,
                             mc_error *err)
{
    for (uint32_t l = 0; l < c->num_layers && !o->ignore_window; l++) {
        uint32_t win = fmt_config_layer_window(c, l);
        if (win && win < c->max_position_embeddings)
            return mc_fail(err, MC_ERR_UNSUPPORTED, src, "sliding_window", -1,
                           "layer %u attends to a window of %u tokens; "
                           "llama.cpp's %s graph attends to the whole "
                           "context, so outputs would differ past %u tokens "
                           "(--ignore-sliding-window exports anyway)", l, win,
                           c->arch == FMT_ARCH_QWEN2 ? "qwen2" : "llama", win);
    }
    if (c->head_dim % 2)
        return mc_fail(err, MC_ERR_SHAPE, src, "head_dim", -1,
                       "head_dim %u is odd; RoPE needs pairs", c->head_dim);
    return MC_OK;
}

mc_status cmp_export_gguf(cmp_xsrc *s, const char *out,
                          const cmp_export_opts *o, cmp_export_report *rep,
                          mc_error *err)
{
    const fmt_model_config *c = cmp_xsrc_config(s);
    const char *arch = c->arch == FMT_ARCH_QWEN2 ? "qwen2" : "llama";
    /* only llama.cpp's "llama" graph uses adjacent-pair RoPE */
    int permute = c->arch != FMT_ARCH_QWEN2;
    mc_status st = check_model(c, o, out, err);
    if (st != MC_OK)
        return st;
    snprintf(rep->arch, sizeof rep->arch, "%s", arch);
    size_t n = cmp_xsrc_count(s);
    fmt_gguf_ttype *types = mc_calloc(n + 1, sizeof *types);
    char (*names)[96] = mc_calloc(n + 1, sizeof *names);
    char *qks = mc_calloc(n + 1, 1);
    fmt_gguf_writer *w = NULL;
    uint8_t *obuf = NULL;
    float *tmp = NULL;
    uint64_t obuf_cap = 0, cols_max = 0;
    uint32_t ftype = FT_ALL_F32;
    if (!types || !names || !qks) {
        st = mc_fail(err, MC_ERR_NOMEM, out, NULL, -1, "out of memory");
        goto out;
    }
    /* pass 1: names and types, refusals before anything is written */
    for (size_t i = 0; i < n; i++) {
        cmp_xtensor t;
        if ((st = cmp_xsrc_info(s, i, &t, err)) != MC_OK)
            goto out;
        if (!gguf_name(t.name, names[i], sizeof names[i], &qks[i])) {
            st = mc_fail(err, MC_ERR_UNSUPPORTED, out, t.name, -1,
                         "tensor '%s' has no llama.cpp %s counterpart",
                         t.name, arch);
            goto out;
        }
        int fb;
        types[i] = pick_type(&t, o->gguf_int4, &fb);
        if (fb && o->strict) {
            st = mc_fail(err, MC_ERR_UNSUPPORTED, out, t.name, -1,
                         "%s %ux%u: a row of %u is not a multiple of the "
                         "32-element ggml blocks (--strict refuses the "
                         "float32 fallback)", t.name, t.rows, t.cols, t.cols);
            goto out;
        }
        if (fb && rep->fallback++ == 0) {
            snprintf(rep->fallback_first, sizeof rep->fallback_first, "%s",
                     t.name);
            snprintf(rep->fallback_why, sizeof rep->fallback_why,
                     "a row of %u is not a multiple of ggml's 32-element "
                     "blocks", t.cols);
        }
        uint32_t units = t.ndim == 1 ? t.cols : t.rows; /* permuted */
        if (qks[i] && permute && units % c->head_dim) {
            st = mc_fail(err, MC_ERR_SHAPE, out, t.name, -1,
                         "%u rows are not whole heads of %u", units,
                         c->head_dim);
            goto out;
        }
        if (strstr(t.name, "layers.0.self_attn.q_proj.weight"))
            ftype = types[i] == FMT_GGUF_T_Q8_0   ? FT_Q8_0
                    : types[i] == FMT_GGUF_T_Q4_0 ? FT_Q4_0
                    : types[i] == FMT_GGUF_T_Q4_1 ? FT_Q4_1
                    : types[i] == FMT_GGUF_T_Q5_0 ? FT_Q5_0
                    : types[i] == FMT_GGUF_T_F16  ? FT_F16
                    : types[i] == FMT_GGUF_T_BF16 ? FT_BF16
                                                  : FT_ALL_F32;
        uint64_t b = cmp_xtensor_bytes(&t);
        if (b > rep->largest_tensor)
            rep->largest_tensor = b;
        if (t.cols > cols_max)
            cols_max = t.cols;
    }
    if ((st = fmt_gguf_writer_create(out, &w, err)) != MC_OK ||
        (st = add_general(w, c, arch, ftype, out, err)) != MC_OK)
        goto out;
    size_t tlen;
    const char *tok = cmp_xsrc_tokenizer(s, &tlen);
    if (tok) {
        st = cmp_export_gguf_tokenizer(w, tok, tlen, c, out, rep->tokenizer,
                                       sizeof rep->tokenizer,
                                       rep->tokenizer_note,
                                       sizeof rep->tokenizer_note, err);
    } else {
        snprintf(rep->tokenizer, sizeof rep->tokenizer,
                 "none (no_vocab: token ids only)");
        st = fmt_gguf_add_string(w, "tokenizer.ggml.model", "no_vocab", 8,
                                 err);
    }
    if (st != MC_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        cmp_xtensor t;
        cmp_xsrc_info(s, i, &t, NULL);
        uint64_t ne[2] = {t.cols, t.rows};
        if ((st = fmt_gguf_add_tensor(w, names[i], types[i], t.ndim, ne,
                                      err)) != MC_OK)
            goto out;
        uint64_t b = fmt_gguf_tensor_bytes(w, i);
        if (b > obuf_cap)
            obuf_cap = b;
    }
    float rf[512];
    int llama3 = c->rope.type == FMT_ROPE_LLAMA3;
    if (llama3) {
        uint64_t ne[1] = {c->head_dim / 2};
        if (c->head_dim / 2 > sizeof rf / sizeof *rf) {
            st = mc_fail(err, MC_ERR_UNSUPPORTED, out, "head_dim", -1,
                         "head_dim %u over 1024 for llama3 RoPE factors",
                         c->head_dim);
            goto out;
        }
        llama3_factors(c, rf);
        if ((st = fmt_gguf_add_tensor(w, "rope_freqs.weight", FMT_GGUF_T_F32,
                                      1, ne, err)) != MC_OK)
            goto out;
    }
    if (obuf_cap > SIZE_MAX ||
        !(obuf = mc_malloc(obuf_cap ? (size_t)obuf_cap : 1)) ||
        !(tmp = mc_malloc_array(cols_max + 1, sizeof *tmp))) {
        st = mc_fail(err, MC_ERR_NOMEM, out, NULL, -1,
                     "out of memory for a %llu-byte tensor",
                     (unsigned long long)obuf_cap);
        goto out;
    }
    if ((st = fmt_gguf_begin_data(w, err)) != MC_OK)
        goto out;
    /* pass 2: one tensor at a time, converted whole, written once */
    for (size_t i = 0; i < n; i++) {
        cmp_xtensor t;
        if ((st = cmp_xsrc_load(s, i, &t, err)) != MC_OK)
            goto out;
        uint64_t rb = fmt_gguf_tensor_bytes(w, i) / t.rows;
        if (t.ndim == 1) { /* a q/k bias is permuted like the rows */
            cmp_xtensor_row_f32(&t, 0, tmp);
            float *o32 = (float *)(void *)obuf;
            for (uint32_t g = 0; g < t.cols; g++)
                o32[g] = tmp[src_row(g, c->head_dim, qks[i], permute)];
        }
        uint64_t inexact = rep->q8_rows_inexact;
        for (uint32_t g = 0; t.ndim == 2 && g < t.rows && st == MC_OK; g++)
            st = convert_row(&t, src_row(g, c->head_dim, qks[i], permute),
                             types[i], obuf + g * rb, tmp, rep, err);
        if (st == MC_OK && types[i] == FMT_GGUF_T_Q8_0 && t.fmt == KN_W_Q8)
            q8_note(rep, names[i], inexact);
        if (st == MC_OK)
            st = fmt_gguf_write(w, obuf, (size_t)(rb * t.rows), err);
        if (st != MC_OK)
            goto out;
        rep->tensors++;
        rep->quantized += types[i] == FMT_GGUF_T_Q8_0 ||
                          types[i] == FMT_GGUF_T_Q4_0 ||
                          types[i] == FMT_GGUF_T_Q4_1 ||
                          types[i] == FMT_GGUF_T_Q5_0;
        rep->bytes += rb * t.rows;
    }
    if (llama3 && (st = fmt_gguf_write(w, rf, (size_t)c->head_dim / 2 * 4,
                                       err)) != MC_OK)
        goto out;
    st = fmt_gguf_finish(w, err);
    w = NULL;
out:
    fmt_gguf_abort(w);
    mc_free(obuf);
    mc_free(tmp);
    mc_free(types);
    mc_free(names);
    mc_free(qks);
    return st;
}

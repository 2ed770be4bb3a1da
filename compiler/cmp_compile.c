/* cmp_compile.c - merge, convert, plan and emit one artifact (see
 * cmp_compile.h). */
#include "cmp_compile.h"
#include "cmp_compile_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmp_quant.h"
#include "cmp_par.h"
#include "fmt_artifact.h"
#include "fmt_dtype.h"
#include "fmt_file.h"
#include "fmt_model.h"
#include "kn_cpus.h"
#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_tokenizer.h"

/* Where float32 values of a tensor come from: the merge (when adapters are
 * given) or the base checkpoint directly. */
typedef struct source {
    fmt_model *base;
    cmp_merge *merge;
    const char *model;
    char *tok;       /* tokenizer.json's bytes, read and checked once
                        (take_tokenizer); NULL when absent or empty */
    size_t toklen;
} source;

static int shape_matches(const cmp_tensor_plan *t, int ndim,
                         const uint64_t *shape)
{
    if (t->ndim == 2)
        return ndim == 2 && shape[0] == t->rows && shape[1] == t->cols;
    return ndim == 1 && shape[0] == t->cols;
}

static mc_status read_f32(source *s, const cmp_tensor_plan *t, float *out,
                          mc_error *err)
{
    if (s->merge) {
        fmt_dtype dt;
        int ndim;
        uint64_t shape[FMT_ST_MAX_DIMS];
        if (!cmp_merge_tensor_info(s->merge, t->name, &dt, &ndim, shape, NULL))
            return mc_fail(err, MC_ERR_NOT_FOUND, s->model, t->name, -1,
                           "tensor '%s' is missing from the (merged) model",
                           t->name);
        if (!shape_matches(t, ndim, shape))
            return mc_fail(err, MC_ERR_SHAPE, s->model, t->name, -1,
                           "tensor '%s' has a shape the config does not "
                           "imply (expected [%u, %u])", t->name, t->rows,
                           t->cols);
        return cmp_merge_tensor_f32(s->merge, t->name, out, err);
    }
    const fmt_st_tensor *st = fmt_model_find(s->base, t->name, NULL);
    if (!st)
        return mc_fail(err, MC_ERR_NOT_FOUND, s->model, t->name, -1,
                       "tensor '%s' is missing from the model", t->name);
    if (!shape_matches(t, st->ndim, st->shape))
        return mc_fail(err, MC_ERR_SHAPE, s->model, t->name,
                       (int64_t)st->file_offset,
                       "tensor '%s' has a shape the config does not imply "
                       "(expected [%u, %u])", t->name, t->rows, t->cols);
    if (fmt_to_f32(st->dtype, st->data, out, (size_t)st->nelem) != 0)
        return mc_fail(err, MC_ERR_UNSUPPORTED, s->model, t->name,
                       (int64_t)st->file_offset, "tensor '%s' has dtype %s; "
                       "F32, F16 or BF16 expected", t->name,
                       fmt_dtype_name(st->dtype));
    return MC_OK;
}

/* A compiled model must never hold a NaN or an Inf that the input did not
 * make obvious: refuse non-finite values, and values that overflow the
 * output type (f16 tops out at 65504), naming the tensor and element. */
static mc_status check_finite(const cmp_tensor_plan *t, const float *w,
                              size_t n, mc_error *err)
{
    float limit = t->fmt == KN_W_F16 ? 65504.0f : FLT_MAX;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i]) || fabsf(w[i]) > limit)
            return mc_fail(err, MC_ERR_NONFINITE, NULL, t->name, -1,
                           "tensor '%s' element %zu (row %zu, col %zu) is "
                           "%g: %s", t->name, i, i / t->cols, i % t->cols,
                           (double)w[i],
                           isfinite(w[i]) ? "outside the f16 range; compile "
                                            "with --quant f32 or bf16"
                                          : "weights must be finite");
    return MC_OK;
}

/* Convert values w of t into its section bytes sec (zeroed, section_bytes). */
static mc_status convert(const cmp_tensor_plan *t, const float *w, uint8_t *sec,
                         mc_error *err)
{
    size_t n = (size_t)t->rows * t->cols;
    mc_status st = check_finite(t, w, n, err);
    if (st != MC_OK)
        return st;
    switch (t->fmt) {
    case KN_W_F32:
        fmt_from_f32(FMT_DT_F32, w, sec, n);
        return MC_OK;
    case KN_W_F16:
        fmt_from_f32(FMT_DT_F16, w, sec, n);
        return MC_OK;
    case KN_W_BF16:
        fmt_from_f32(FMT_DT_BF16, w, sec, n);
        return MC_OK;
    default: {
        cmp_qbuf b = cmp_compile_qbuf(t, sec);
        st = cmp_quant_matrix(w, NULL, &b, err);
        if (st != MC_OK && err) {
            /* the quantizer names the element ("row R col C"); the user
             * needs the tensor first */
            char inner[sizeof err->field];
            snprintf(inner, sizeof inner, "%s", err->field);
            snprintf(err->field, sizeof err->field, "%.120s%s%.120s", t->name,
                     inner[0] ? " " : "", inner);
        }
        return st;
    }
    }
}

static json_t *hexj(uint64_t h)
{
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return json_string(buf);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s && s[1] ? s + 1 : p;
}

/* Append {"file", "xxh3", "bytes"} for dir/name when it is a regular file
 * (optional files that are absent are skipped). */
static mc_status file_checksum(const char *dir, const char *name, json_t *arr,
                               mc_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return MC_OK;
    uint64_t h;
    mc_status s = fmt_art_file_xxh3(path, &h, err);
    if (s == MC_OK &&
        json_array_append_new(arr, json_pack("{s:s, s:o, s:I}", "file", name,
                                             "xxh3", hexj(h), "bytes",
                                             (json_int_t)st.st_size)))
        s = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    return s;
}

static json_t *provenance(source *s, const cmp_compile_opts *o, int tok,
                          mc_error *err, mc_status *st)
{
    json_t *p = json_object(), *inputs = json_array(), *ads = json_array();
    const char *dir = fmt_model_dir(s->base);
    *st = file_checksum(dir, "config.json", inputs, err);
    if (*st == MC_OK && fmt_model_is_sharded(s->base))
        *st = file_checksum(dir, "model.safetensors.index.json", inputs, err);
    for (size_t i = 0; *st == MC_OK && i < fmt_model_shard_count(s->base); i++)
        *st = file_checksum(dir, fmt_model_shard_name(s->base, i), inputs, err);
    if (*st == MC_OK && tok)
        *st = file_checksum(dir, "tokenizer.json", inputs, err);
    for (size_t i = 0; *st == MC_OK && i < o->n_adapters; i++) {
        json_t *files = json_array();
        *st = file_checksum(o->adapters[i].dir, "adapter_config.json", files,
                            err);
        if (*st == MC_OK)
            *st = file_checksum(o->adapters[i].dir,
                                "adapter_model.safetensors", files, err);
        if (json_array_append_new(ads, json_pack("{s:s, s:f, s:o}", "name",
                                             base_name(o->adapters[i].dir),
                                             "weight", o->adapters[i].weight,
                                             "files", files)) &&
            *st == MC_OK)
            *st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    }
    int bad = json_object_set_new(p, "compiler",
                                  json_string("mcompile " MC_VERSION)) |
              json_object_set_new(p, "model", json_string(base_name(o->model))) |
              json_object_set_new(p, "inputs", inputs) |
              json_object_set_new(p, "adapters", ads);
    if (bad) {
        json_decref(p);
        return NULL;
    }
    return p;
}

/* The calibration result's values for t: *q (a quantized linear) or *vals
 * (float32: a linear kept float, an AWQ-folded norm, a bias; with a
 * rotation also the embeddings, final norm and lm_head).  Returns 0 when t
 * does not come from r (embed, final norm, lm_head of an unrotated model;
 * or no r). */
static int calib_part(const cmp_calib_result *r, const cmp_tensor_plan *t,
                      const cmp_calib_tensor **q, const float **vals)
{
    *q = NULL;
    *vals = NULL;
    if (r && r->rotated) {
        /* the rotated model's ends come from r too */
        if (strcmp(t->name, "model.embed_tokens.weight") == 0)
            *vals = r->embed;
        else if (strcmp(t->name, "model.norm.weight") == 0)
            *vals = r->final_norm;
        else if (strcmp(t->name, "lm_head.weight") == 0)
            *vals = r->lm_head_f32;
        if (*vals)
            return 1;
    }
    uint32_t l = 0;
    int slot;
    int k = r ? cmp_compile_tensor_kind(t->name, &l, &slot) : CMP_TK_OTHER;
    if (k == CMP_TK_OTHER || l >= r->layers)
        return 0;
    size_t i = (size_t)l * CMP_LIN_COUNT + (size_t)(slot < 0 ? 0 : slot);
    if (k == CMP_TK_WEIGHT) {
        if (cmp_quant_is_quantized(r->t[i].fmt))
            *q = &r->t[i];
        else
            *vals = r->t[i].f32;
    } else if (k == CMP_TK_BIAS) {
        *vals = r->bias[i];
    } else {
        *vals = k == CMP_TK_ATTN_NORM ? r->attn_norm[l] : r->mlp_norm[l];
    }
    return 1;
}

/* Copy a calibrated linear's buffers into its section; they must be
 * exactly what the plan sized (kn_wformat_*_bytes). */
static mc_status copy_quantized(const cmp_tensor_plan *t,
                                const cmp_calib_tensor *c, uint8_t *sec,
                                mc_error *err)
{
    const cmp_qbuf *b = &c->q;
    if (b->fmt != t->fmt || b->rows != t->rows || b->cols != t->cols ||
        (t->group && b->group != t->group) ||
        kn_wformat_data_bytes(b->fmt, b->rows, b->cols) != t->data_bytes ||
        kn_wformat_scale_bytes(b->fmt, b->rows, b->cols, b->group) !=
            t->scale_bytes ||
        kn_wformat_zero_bytes(b->fmt, b->rows, b->cols, b->group) !=
            t->zero_bytes)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, t->name, -1,
                       "calibrated '%s' is %s %ux%u group %u; the plan has "
                       "%s %ux%u group %u", t->name, kn_wformat_name(b->fmt),
                       b->rows, b->cols, b->group, kn_wformat_name(t->fmt),
                       t->rows, t->cols, t->group);
    memcpy(sec + t->data_off, b->data, (size_t)t->data_bytes);
    memcpy(sec + t->scale_off, b->scales, (size_t)t->scale_bytes);
    if (t->zero_bytes)
        memcpy(sec + t->zero_off, b->zeros, (size_t)t->zero_bytes);
    return MC_OK;
}

/* Section bytes of t from the calibration result r (*done = 1), or
 * nothing (*done = 0) when t comes from the model itself. */
static mc_status calib_section(const cmp_calib_result *r,
                               const cmp_tensor_plan *t, uint8_t *sec,
                               int *done, mc_error *err)
{
    const cmp_calib_tensor *q;
    const float *vals;
    *done = calib_part(r, t, &q, &vals);
    if (!*done)
        return MC_OK;
    if (q)
        return copy_quantized(t, q, sec, err);
    if (!vals)
        return mc_fail(err, MC_ERR_NOT_FOUND, NULL, t->name, -1,
                       "the calibration result has no values for '%s'",
                       t->name);
    return convert(t, vals, sec, err);
}

static json_t *tensor_json(const cmp_tensor_plan *t, size_t section,
                           const cmp_calib_result *r)
{
    json_t *shape = t->ndim == 2 ? json_pack("[I, I]", (json_int_t)t->rows,
                                             (json_int_t)t->cols)
                                 : json_pack("[I]", (json_int_t)t->cols);
    json_t *j = json_pack("{s:s, s:s, s:o, s:I, s:I, s:[I, I], s:[I, I], s:[I, I]}",
                     "name", t->name, "format", kn_wformat_name(t->fmt),
                     "shape", shape, "group", (json_int_t)t->group, "section",
                     (json_int_t)section, "data", (json_int_t)t->data_off,
                     (json_int_t)t->data_bytes, "scales",
                     (json_int_t)t->scale_off, (json_int_t)t->scale_bytes,
                     "zeros", (json_int_t)t->zero_off,
                     (json_int_t)t->zero_bytes);
    const cmp_calib_tensor *c = NULL;
    const float *vals;
    if (j && calib_part(r, t, &c, &vals) && !c) {
        uint32_t l = 0;
        int slot;
        if (cmp_compile_tensor_kind(t->name, &l, &slot) == CMP_TK_WEIGHT)
            c = &r->t[(size_t)l * CMP_LIN_COUNT + (size_t)slot];
    }
    if (j && c &&
        (json_object_set_new(j, "method",
                             json_string(cmp_qmethod_name(c->method))) |
         json_object_set_new(j, "err", json_real(c->err)) |
         json_object_set_new(j, "err_rtn", json_real(c->err_rtn)) |
         json_object_set_new(j, "alpha", json_real(c->alpha)) |
         /* a sampled baseline says on how many rows */
         (c->err_rtn_rows && c->err_rtn_rows < c->q.rows
              ? json_object_set_new(j, "err_rtn_rows", json_integer(c->err_rtn_rows))
              : 0))) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* The manifest's "calibration" object (see cmp_compile.h). */
static json_t *calib_json(const cmp_calib_stage *cs, const cmp_compile_opts *o,
                          const cmp_plan_request *req)
{
    const cmp_calib_result *r = cs->r;
    json_t *c = json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I}", "method",
                          cmp_qmethod_name(cs->effort.method), "ids_xxh3",
                          hexj(cs->calib_xxh3), "ids_bytes",
                          (json_int_t)cs->calib_bytes, "sequences",
                          (json_int_t)cs->ids->n_seqs, "heldout_sequences",
                          (json_int_t)cs->heldout, "tokens",
                          (json_int_t)r->calib_tokens, "group",
                          (json_int_t)cmp_wpolicy_linear_group(&req->policy));
    /* Fewer stages than the default are named (the default's manifest
     * stays what it was before the option) */
    if (c && cs->effort.stages != CMP_CALIB_STAGES_DEFAULT &&
        json_object_set_new(c, "stages", json_integer(cs->effort.stages))) {
        json_decref(c);
        return NULL;
    }
    /* A cut of the full-precision statistics is named (every block, the
     * default, keeps the manifest of before) */
    if (c && cs->effort.full_layers &&
        json_object_set_new(c, "full_layers",
                            json_integer(cs->effort.full_layers))) {
        json_decref(c);
        return NULL;
    }
    /* Unrefined GPTQ codes are named (refined, the default, keeps the
     * manifest of before) */
    if (c && cs->effort.no_refine &&
        json_object_set_new(c, "refine", json_false())) {
        json_decref(c);
        return NULL;
    }
    /* Only the coarse walk is named: a full-grid artifact keeps the
     * manifest, and so the bytes, of the compilers before it existed. */
    if (c && !o->awq_full_grid &&
        json_object_set_new(c, "awq_grid", json_string("coarse"))) {
        json_decref(c);
        return NULL;
    }
    /* Likewise only the bfloat16 products are named (--calib-stats f32
     * gives the bytes of the compilers before the option). */
    if (c && !o->calib_stats_f32 &&
        json_object_set_new(c, "statistics", json_string("bf16"))) {
        json_decref(c);
        return NULL;
    }
    /* and the bfloat16 quantized pass (--calib-forward f32: before it) */
    if (c && !o->calib_fwd_f32 &&
        json_object_set_new(c, "forward", json_string("bf16"))) {
        json_decref(c);
        return NULL;
    }
    /* and the bfloat16 full-precision weights (--calib-full-pass) */
    if (c && r->full_bf16 &&
        json_object_set_new(c, "full_pass", json_string("bf16"))) {
        json_decref(c);
        return NULL;
    }
    if (c && json_object_set_new(
                 c, "rotation",
                 r->rotated ? json_pack("{s:s, s:I, s:I, s:o}", "kind",
                                        "randomized-hadamard", "block",
                                        (json_int_t)r->rot_block, "head_block",
                                        (json_int_t)r->rot_head_block, "seed",
                                        hexj(r->rot_seed))
                            : json_null())) {
        json_decref(c);
        return NULL;
    }
    if (c && r->has_heldout) {
        const cmp_eval_report *h = &r->heldout;
        if (json_object_set_new(c, "heldout",
                                json_pack("{s:f, s:f, s:f, s:f, s:f, s:I}",
                                          "kld_mean", h->kld_mean, "kld_p99",
                                          h->kld_p99, "top1", h->top1,
                                          "ppl_ref", h->ppl_ref, "ppl", h->ppl,
                                          "tokens", (json_int_t)h->tokens))) {
            json_decref(c);
            return NULL;
        }
    }
    if (c && cs->is_auto &&
        json_object_set_new(c, "auto",
                            json_pack("{s:I, s:I, s:f}", "weights_bytes",
                                      (json_int_t)cs->autoplan.weights_bytes,
                                      "total_bytes",
                                      (json_int_t)cs->autoplan.total_bytes,
                                      "err_sum", cs->autoplan.err_sum))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

/* The tokenizer.json compile embeds is parsed as the runtime will parse it
 * (it was copied unread, so a broken one failed only at mrun's first
 * prompt).  The model does not need it (prompts may come as ids, and an
 * export copies it for other tools, which may read forms mrun does not,
 * a Unigram model say): one mrun cannot read is embedded as it is, with
 * a note saying why (note, notecap); an empty one is left out, with a
 * note.  What is refused is a mismatch with the model: an id at or past
 * vocab_size would index past the embedding. */
static mc_status check_tokenizer(const char *path, const char *bytes,
                                 size_t len, const fmt_model_config *cfg,
                                 char *note, size_t notecap, mc_error *err)
{
    if (len == 0) {
        /* a note is one line of a report: long paths are cut */
        snprintf(note, notecap, "%.1024s is empty: no tokenizer embedded",
                 path);
        return MC_OK;
    }
    rt_tokenizer *t = NULL;
    mc_error le;
    mc_error_clear(&le);
    mc_status st = rt_tokenizer_load_memory(bytes, len, path, &t, &le);
    if (st == MC_ERR_NOMEM) {
        if (err)
            *err = le;
        return st;
    }
    if (st != MC_OK) {
        char buf[1024];
        snprintf(note, notecap, "mrun cannot read this tokenizer (%.1100s); it "
                 "is embedded as it is: give mrun prompts as ids "
                 "(--tokens, \"ids\")", mc_error_format(&le, buf, sizeof buf));
        return MC_OK;
    }
    size_t n = rt_tokenizer_vocab_size(t);
    rt_tokenizer_free(t);
    if (n > cfg->vocab_size)
        return mc_fail(err, MC_ERR_SHAPE, path, "model.vocab", -1,
                       "the tokenizer has ids up to %zu, but config.json's "
                       "vocab_size is %u: expected every id below it", n - 1,
                       cfg->vocab_size);
    return MC_OK;
}

/* The tokenizer.json beside the model, read and checked once (a file
 * over 1 GiB, ids past vocab_size refused) into s->tok, the bytes emit
 * embeds: right after config.json, so a compile fails before its
 * calibration and its plan (whose reserve would count a huge file's
 * bytes) rather than after.  Optional: an absent file is fine; one that
 * cannot be read (a FIFO, a directory, an I/O error) is an error, not a
 * silent skip. */
static mc_status take_tokenizer(source *s, const fmt_model_config *cfg,
                                char *note, size_t notecap, mc_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", fmt_model_dir(s->base));
    mc_status st = fmt_file_read(path, 1u << 30, "1 GiB", &s->tok, &s->toklen,
                                 err);
    if (st == MC_ERR_NOT_FOUND) {
        mc_error_clear(err);
        st = MC_OK;
    } else if (st == MC_OK) {
        st = check_tokenizer(path, s->tok, s->toklen, cfg, note, notecap, err);
    }
    if (st != MC_OK || !s->toklen) {
        mc_free(s->tok);
        s->tok = NULL;
        s->toklen = 0;
    }
    return st;
}

/* Every tensor of the checkpoint is one config.json implies (names from
 * cmp_plan_tensors, the compile's own list): a layer past
 * num_hidden_layers, a stray module or a tied model's lm_head.weight that
 * is not the embedding would otherwise be dropped without a word (and the
 * compiled model would not be the checkpoint).  RoPE's inv_freq buffers,
 * which old Llama conversions store, are skipped as transformers does; a
 * tied model's lm_head.weight equal to its embedding (some checkpoints
 * store both) is fine. */
static mc_status check_checkpoint_tensors(const fmt_model *base,
                                          const fmt_model_config *cfg,
                                          const cmp_wpolicy *policy,
                                          const char *path, mc_error *err)
{
    cmp_tensor_plan *ts = NULL;
    size_t nt = 0;
    mc_status st = cmp_plan_tensors(cfg, policy, &ts, &nt, err);
    for (size_t i = 0; st == MC_OK && i < fmt_model_tensor_count(base); i++) {
        const fmt_st_tensor *t = fmt_model_tensor(base, i, NULL);
        int known = 0;
        for (size_t k = 0; !known && k < nt; k++)
            known = strcmp(ts[k].name, t->name) == 0;
        size_t nl = strlen(t->name), sl = strlen(".rotary_emb.inv_freq");
        if (known || (nl > sl && !strcmp(t->name + nl - sl, ".rotary_emb.inv_freq")))
            continue;
        if (cfg->tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) {
            const fmt_st_tensor *e =
                fmt_model_find(base, "model.embed_tokens.weight", NULL);
            if (fmt_st_tensor_same(t, e))
                continue;
            st = mc_fail(err, MC_ERR_SHAPE, path, t->name, -1,
                         "config.json ties the output layer to the embedding "
                         "(tie_word_embeddings true), but the checkpoint's "
                         "lm_head.weight differs from model.embed_tokens."
                         "weight; set tie_word_embeddings to false to use it");
            break;
        }
        unsigned layer;
        if (sscanf(t->name, "model.layers.%u.", &layer) == 1 &&
            layer >= cfg->num_layers)
            st = mc_fail(err, MC_ERR_SHAPE, path, t->name, -1,
                         "the checkpoint has layer %u, but config.json's "
                         "num_hidden_layers is %u", layer, cfg->num_layers);
        else
            st = mc_fail(err, MC_ERR_FORMAT, path, t->name, -1,
                         "the checkpoint holds '%s', which config.json "
                         "(%s, %u layers%s%s%s) has no place for; expected "
                         "only the tensors it implies", t->name,
                         cfg->model_type, cfg->num_layers,
                         cfg->qkv_bias ? ", q/k/v bias" : "",
                         cfg->o_bias ? ", o bias" : "",
                         cfg->mlp_bias ? ", mlp bias" : "");
    }
    mc_free(ts);
    return st;
}

static mc_status emit(source *s, const cmp_compile_opts *o,
                      const cmp_plan_request *req, const cmp_calib_stage *cs,
                      const fmt_model_config *cfg, cmp_compile_report *rep,
                      mc_error *err)
{
    cmp_tensor_plan *ts = NULL;
    size_t nt = 0;
    const cmp_calib_result *cr = cs ? cs->r : NULL;
    mc_status st = cmp_plan_tensors(cfg, &req->policy, &ts, &nt, err);
    if (st != MC_OK)
        return st;
    const char *tok = s->tok; /* take_tokenizer's, checked */
    size_t toklen = s->toklen;

    fmt_art_writer *w = NULL;
    json_t *man = json_object(), *tj = json_array();
    float *wbuf = NULL;
    uint8_t *sec = NULL;
    float *rows = NULL;
    uint64_t maxn = 0, maxsec = 0, maxcols = 0;
    for (size_t i = 0; i < nt; i++) {
        uint64_t n = (uint64_t)ts[i].rows * ts[i].cols;
        maxcols = ts[i].cols > maxcols ? ts[i].cols : maxcols;
        maxn = n > maxn ? n : maxn;
        maxsec = ts[i].section_bytes > maxsec ? ts[i].section_bytes : maxsec;
    }
    /* the fast path's threads and their row scratch (any count gives the
     * same bytes) */
    int nthreads = o->threads > 0 ? o->threads : kn_cpu_count();
    nthreads = nthreads > CMP_RTN_MAX_THREADS ? CMP_RTN_MAX_THREADS : nthreads;
    if (!man || !tj || !(wbuf = mc_malloc_array((size_t)maxn, sizeof(float))) ||
        !(rows = mc_malloc_array((size_t)maxcols * (size_t)nthreads,
                                 sizeof(float)))) {
        st = mc_fail(err, MC_ERR_NOMEM, o->model, NULL, -1, "out of memory");
        goto done;
    }
    fmt_art_codec codec = o->compress ? FMT_ART_CODEC_ZSTD : FMT_ART_CODEC_RAW;
    if ((st = fmt_art_writer_create(o->out, &w, err)) != MC_OK)
        goto done;
    if (o->zstd_level)
        fmt_art_writer_set_level(w, o->zstd_level);
    for (size_t i = 0; i < nt && st == MC_OK; i++) {
        st = fmt_art_writer_add_section(w, ts[i].name, "tensor",
                                        ts[i].section_bytes, codec, err);
        if (st == MC_OK && json_array_append_new(tj, tensor_json(&ts[i], i, cr)))
            st = mc_fail(err, MC_ERR_NOMEM, o->model, NULL, -1,
                         "out of memory");
    }
    if (st == MC_OK && tok)
        st = fmt_art_writer_add_section(w, "tokenizer", "tokenizer", toklen,
                                        codec, err);
    if (st != MC_OK)
        goto done;
    char *ctext = fmt_config_to_json(cfg);
    json_t *cj = ctext ? json_loads(ctext, 0, NULL) : NULL;
    mc_free(ctext);
    json_t *pj = cmp_plan_to_json(&rep->plan);
    json_t *prov = provenance(s, o, tok != NULL, err, &st);
    int bad = !cj || !pj || !prov;
    bad |= json_object_set_new(man, "config", cj ? cj : json_object());
    bad |= json_object_set_new(man, "plan", pj ? pj : json_object());
    bad |= json_object_set_new(man, "provenance", prov ? prov : json_object());
    bad |= json_object_set_new(man, "tensors", tj);
    tj = NULL;
    bad |= json_object_set_new(man, "tokenizer", json_boolean(tok != NULL));
    if (cr) {
        json_t *calj = calib_json(cs, o, req);
        bad |= !calj;
        bad |= json_object_set_new(man, "calibration", calj ? calj : json_object());
    }
    if (st == MC_OK && bad)
        st = mc_fail(err, MC_ERR_NOMEM, o->model, NULL, -1, "out of memory");
    if (st == MC_OK)
        st = fmt_art_writer_begin(w, man, err);
    /* a second thread writes each section while the next is computed */
    cmp_sec_pipe *pipe = NULL;
    if (st == MC_OK)
        st = cmp_sec_pipe_create(w, (size_t)maxsec, &pipe, err);
    for (size_t i = 0; i < nt && st == MC_OK; i++) {
        if (!(sec = cmp_sec_pipe_buffer(pipe)))
            break; /* a write failed: cmp_sec_pipe_finish says why */
        memset(sec, 0, (size_t)ts[i].section_bytes);
        int done = 0;
        st = calib_section(cr, &ts[i], sec, &done, err);
        if (st == MC_OK && !done && !s->merge)
            done = cmp_compile_rtn_section(fmt_model_find(s->base, ts[i].name,
                                                          NULL),
                                           &ts[i], sec, nthreads, rows);
        if (st == MC_OK && !done) {
            memset(sec, 0, (size_t)ts[i].section_bytes); /* partly written */
            st = read_f32(s, &ts[i], wbuf, err);
            if (st == MC_OK)
                st = convert(&ts[i], wbuf, sec, err);
            /* name the file the values came from (the tensor is named) */
            if (st == MC_ERR_NONFINITE && err && !err->file[0]) {
                size_t sh = 0;
                const fmt_st_tensor *src = fmt_model_find(s->base, ts[i].name,
                                                          &sh);
                if (s->merge) /* the value is the merge's, not the file's */
                    snprintf(err->file, sizeof err->file, "%s merged with "
                             "its --lora adapters", o->model);
                else if (src)
                    snprintf(err->file, sizeof err->file, "%s/%s",
                             fmt_model_dir(s->base),
                             fmt_model_shard_name(s->base, sh));
                else
                    snprintf(err->file, sizeof err->file, "%s", o->model);
            }
        }
        if (st == MC_OK)
            cmp_sec_pipe_submit(pipe, (size_t)ts[i].section_bytes);
    }
    sec = NULL; /* the pipe's */
    mc_status wst = cmp_sec_pipe_finish(pipe, st == MC_OK ? err : NULL);
    if (st == MC_OK)
        st = wst;
    if (st == MC_OK && tok)
        st = fmt_art_writer_write(w, tok, toklen, err);
    if (st == MC_OK) {
        st = fmt_art_writer_finish(w, err);
        w = NULL;
    }
    if (st == MC_OK) {
        rep->tensors = nt;
        rep->weights_bytes = cmp_plan_weight_bytes(ts, nt);
        for (size_t i = 0; i < nt; i++) {
            int part = ts[i].role == CMP_ROLE_EMBED     ? CMP_PART_EMBED
                       : ts[i].role == CMP_ROLE_LM_HEAD ? CMP_PART_LM_HEAD
                       : ts[i].role == CMP_ROLE_LINEAR  ? CMP_PART_LINEARS
                                                        : CMP_PART_OTHER;
            rep->part_bytes[part] += cmp_plan_weight_bytes(&ts[i], 1);
            /* tied: the embedding's format is the output layer's */
            if (part == CMP_PART_LM_HEAD ||
                (part == CMP_PART_EMBED && cfg->tie_word_embeddings))
                rep->lm_head_fmt = ts[i].fmt;
        }
        rep->lm_head_tied = rep->part_bytes[CMP_PART_LM_HEAD] == 0;
        rep->tokenizer = tok != NULL;
        FILE *f = fopen(o->out, "rb");
        if (f) {
            if (fseek(f, 0, SEEK_END) == 0)
                rep->file_bytes = (uint64_t)ftell(f);
            fclose(f);
        }
    }
done:
    fmt_art_writer_abort(w);
    json_decref(man);
    json_decref(tj);
    mc_free(wbuf);
    mc_free(rows);
    mc_free(sec);
    mc_free(ts);
    return st;
}

mc_status cmp_compile(const cmp_compile_opts *o, cmp_compile_report *rep_out,
                      mc_error *err)
{
    cmp_compile_report local, *rep = rep_out ? rep_out : &local;
    memset(rep, 0, sizeof *rep);
    source s = {NULL, NULL, o->model, NULL, 0};
    mc_status st = fmt_model_open(o->model, &s.base, err);
    if (st != MC_OK)
        return st;
    fmt_model_config cfg;
    st = fmt_config_load(fmt_model_config_path(s.base), &cfg, err);
    if (st == MC_OK)
        st = check_checkpoint_tensors(s.base, &cfg, &o->req.policy, o->model,
                                      err);
    if (st == MC_OK) /* before a calibration's minutes, not after */
        st = take_tokenizer(&s, &cfg, rep->tokenizer_note,
                            sizeof rep->tokenizer_note, err);
    if (st == MC_OK && o->n_adapters) {
        st = cmp_merge_open(s.base, o->adapters, o->n_adapters, &s.merge, err);
        if (st == MC_OK && cmp_merge_unties_lm_head(s.merge))
            cfg.tie_word_embeddings = 0;
        rep->adapters = o->n_adapters;
    }
    /* The calibrated path decides the linears' formats (auto) before the
     * plan; req (and so the plan) then points at the stage's choice. */
    cmp_plan_request req = o->req;
    cmp_calib_stage cs;
    memset(&cs, 0, sizeof cs);
    int calib = o->calib || o->quant_auto;
    double t0 = cmp_par_now();
    if (st == MC_OK && calib)
        st = cmp_calib_stage_run(o, &cfg, s.merge, &req, &cs, err);
    rep->calib_seconds = calib ? cmp_par_now() - t0 : 0.0;
    if (st == MC_OK) {
        rep->cfg = cfg;
        /* the tokenizer emit embeds is part of the runtime's reserve */
        req.tokenizer_bytes = cmp_plan_tokenizer_bytes(fmt_model_dir(s.base));
        st = cmp_plan_build(&cfg, &req, &rep->plan, err);
    }
    t0 = cmp_par_now();
    if (st == MC_OK)
        st = emit(&s, o, &req, calib ? &cs : NULL, &cfg, rep, err);
    rep->write_seconds = cmp_par_now() - t0;
    if (st == MC_OK && calib) {
        rep->calib = cs.r;
        cs.r = NULL;
        rep->calib_group = cmp_wpolicy_linear_group(&req.policy);
        rep->calib_seqs = cs.ids->n_seqs;
        rep->heldout_seqs = cs.heldout;
        rep->auto_total_bytes = cs.is_auto ? cs.autoplan.total_bytes : 0;
        rep->calib_effort = cs.effort;
        rep->calib_effort_most = cs.most;
        rep->calib_budget_s = o->calib_time_s;
        rep->calib_passes = cs.cap_s > 0.0 ? o->calib_passes : 0.0;
        rep->calib_cap_s = cs.cap_s;
        rep->calib_capped = cs.capped;
    }
    /* the plan echoes req; its per-linear table dies with the stage */
    rep->plan.req.policy.linear_fmt = NULL;
    cmp_calib_stage_free(&cs);
    if (!rep_out)
        cmp_compile_report_release(rep);
    cmp_merge_close(s.merge);
    fmt_model_close(s.base);
    mc_free(s.tok);
    return st;
}

void cmp_compile_report_release(cmp_compile_report *rep)
{
    if (!rep)
        return;
    cmp_calib_result_free(rep->calib);
    rep->calib = NULL;
}

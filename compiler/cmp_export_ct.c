/* cmp_export_ct.c - the compressed-tensors export (cmp_export.h): a
 * Hugging Face directory that vLLM and transformers load.
 *
 * Every quantized linear is "pack-quantized" (compressed-tensors'
 * pack_to_int32: element i of a row sits at bits (i * b) % 32 of int32
 * word i * b / 32, stored as q + 2^(b-1); the columns are padded to whole
 * words).  For int4 that is byte for byte our nibble order (kn_quant.h:
 * element c in byte c/2, low nibble first) with our unsigned code q, since
 * compressed-tensors' signed q_s = q - 8 and zero_point z_s = z - 8 give
 * (q_s - z_s) * scale = (q - z) * scale; the zero points (asymmetric only)
 * are packed the same way down the rows ([ceil(rows/8), groups]).  int8
 * is the 8-bit case of the same format (vLLM's W8A16 path: weight-only
 * int8 is served from pack-quantized, not int-quantized), per channel,
 * symmetric, stored q + 128.  Scales are float32 (our f16 group scales and
 * f32 row scales exactly).  weight_shape is int64 [rows, cols].
 *
 * Not representable, written dequantized in float32 and listed in
 * "ignore": an int4 linear whose row is not a whole number of groups
 * (compressed-tensors' grouped shapes and vLLM's kernels need it), and a
 * quantized lm_head (the engines load it dense).  --strict refuses
 * instead.  Float linears keep their dtype and go in "ignore" too.  A
 * tied model's int8 embedding is written dequantized in float32 too, as
 * the embedding's one form (no module to list, and --strict allows it). */
#include "cmp_export.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "fmt_atomic.h"
#include "fmt_safetensors.h"
#include "mc_alloc.h"

#define MAX_SCHEMES 8

typedef struct scheme {
    kn_wformat fmt;   /* KN_W_Q8, KN_W_Q4, KN_W_Q4S */
    uint32_t group;   /* 0 for Q8 (per channel) */
    json_t *targets;  /* module names */
} scheme;

typedef struct ctx {
    const char *out;
    cmp_xsrc *s;
    const cmp_export_opts *o;
    cmp_export_report *rep;
    int *kind;        /* per tensor: -1 float as stored, -2 float32
                         fallback, else the scheme index */
    scheme sch[MAX_SCHEMES];
    int nsch;
    json_t *ignore;
    uint8_t *buf;     /* one tensor part, converted */
    size_t buf_cap;
} ctx;

static int is_linear(const cmp_xtensor *t)
{
    size_t n = strlen(t->name);
    return t->ndim == 2 && strncmp(t->name, "model.layers.", 13) == 0 &&
           n > 7 && strcmp(t->name + n - 7, ".weight") == 0;
}

static int is_quant(kn_wformat f)
{
    return f == KN_W_Q8 || f == KN_W_Q4 || f == KN_W_Q4S;
}

/* module name of "X.weight" into out */
static void module_of(const char *name, char *out, size_t cap)
{
    size_t n = strlen(name) - 7;
    snprintf(out, cap, "%.*s", (int)n, name);
}

static mc_status nomem(const ctx *c, const char *what, mc_error *err)
{
    return mc_fail(err, MC_ERR_NOMEM, c->out, what, -1, "out of memory");
}

/* Classify tensor i; record its scheme or its place in "ignore". */
static mc_status classify(ctx *c, size_t i, const cmp_xtensor *t,
                          mc_error *err)
{
    char mod[256];
    c->kind[i] = -1;
    int lin = is_linear(t), lm = strcmp(t->name, "lm_head.weight") == 0;
    if (lin || lm)
        module_of(t->name, mod, sizeof mod);
    if (!is_quant(t->fmt)) {
        if ((lin || lm) && json_array_append_new(c->ignore, json_string(mod)))
            return nomem(c, t->name, err);
        return MC_OK;
    }
    if (strcmp(t->name, "model.embed_tokens.weight") == 0) {
        /* a tied model's quantized embedding (its output layer): the engines
         * look embeddings up dense, so float32 is its form here, not a
         * fallback; the values are the runtime's lookup's, q * scale */
        c->kind[i] = -2;
        c->rep->dense_embed = 1;
        return MC_OK;
    }
    const char *why = NULL;
    if (!lin)
        why = "a quantized tensor outside the decoder layers (the engines "
              "load lm_head and embeddings dense)";
    else if (t->fmt != KN_W_Q8 && t->cols % t->group)
        why = "its row is not a whole number of int4 groups, which "
              "compressed-tensors' grouped layout and vLLM's kernels need";
    if (why) {
        if (c->o->strict)
            return mc_fail(err, MC_ERR_UNSUPPORTED, c->out, t->name, -1,
                           "%s %ux%u group %u: %s (--strict refuses the "
                           "float32 fallback)", t->name, t->rows, t->cols,
                           t->group, why);
        c->kind[i] = -2;
        if (c->rep->fallback++ == 0) {
            snprintf(c->rep->fallback_first, sizeof c->rep->fallback_first,
                     "%s", t->name);
            snprintf(c->rep->fallback_why, sizeof c->rep->fallback_why,
                     "%s", lin ? "its row is not a whole number of int4 "
                               "groups" : "the engines load it dense");
        }
        if ((lin || lm) && json_array_append_new(c->ignore, json_string(mod)))
            return nomem(c, t->name, err);
        return MC_OK;
    }
    uint32_t g = t->fmt == KN_W_Q8 ? 0 : t->group;
    int k = 0;
    while (k < c->nsch && !(c->sch[k].fmt == t->fmt && c->sch[k].group == g))
        k++;
    if (k == c->nsch) {
        if (k == MAX_SCHEMES)
            return mc_fail(err, MC_ERR_UNSUPPORTED, c->out, t->name, -1,
                           "more than %d quantization schemes", MAX_SCHEMES);
        c->sch[k].fmt = t->fmt;
        c->sch[k].group = g;
        if (!(c->sch[k].targets = json_array()))
            return nomem(c, t->name, err);
        c->nsch++;
    }
    if (json_array_append_new(c->sch[k].targets, json_string(mod)))
        return nomem(c, t->name, err);
    c->kind[i] = k;
    return MC_OK;
}

static uint64_t packed_words(uint32_t cols, int bits)
{
    return ((uint64_t)cols * (uint64_t)bits + 31) / 32;
}

/* Declare tensor i's safetensors entries; *part_max grows to its largest
 * converted part. */
static mc_status declare(ctx *c, fmt_st_writer *w, size_t i,
                         const cmp_xtensor *t, uint64_t *part_max,
                         mc_error *err)
{
    char nm[300], mod[256];
    mc_status st;
    if (c->kind[i] < 0) {
        fmt_dtype dt = c->kind[i] == -2 || t->fmt == KN_W_F32 ? FMT_DT_F32
                       : t->fmt == KN_W_F16                  ? FMT_DT_F16
                                                             : FMT_DT_BF16;
        uint64_t sh[2] = {t->rows, t->cols};
        uint64_t b = (uint64_t)t->rows * t->cols * 4;
        if (b > *part_max)
            *part_max = b;
        return fmt_st_writer_add(w, t->name, dt, t->ndim,
                                 t->ndim == 2 ? sh : sh + 1, err);
    }
    const scheme *k = &c->sch[c->kind[i]];
    int bits = k->fmt == KN_W_Q8 ? 8 : 4;
    uint32_t ng = k->fmt == KN_W_Q8 ? 1 : kn_q4_ngroups(t->cols, t->group);
    module_of(t->name, mod, sizeof mod);
    uint64_t shp[2] = {t->rows, packed_words(t->cols, bits)};
    uint64_t shs[2] = {t->rows, ng};
    uint64_t shz[2] = {packed_words(t->rows, 4), ng};
    uint64_t sh2[1] = {2};
    uint64_t b = shp[0] * shp[1] * 4;
    if (b > *part_max)
        *part_max = b;
    if ((uint64_t)t->rows * ng * 4 > *part_max)
        *part_max = (uint64_t)t->rows * ng * 4;
    snprintf(nm, sizeof nm, "%s.weight_packed", mod);
    if ((st = fmt_st_writer_add(w, nm, FMT_DT_I32, 2, shp, err)) != MC_OK)
        return st;
    snprintf(nm, sizeof nm, "%s.weight_scale", mod);
    if ((st = fmt_st_writer_add(w, nm, FMT_DT_F32, 2, shs, err)) != MC_OK)
        return st;
    snprintf(nm, sizeof nm, "%s.weight_shape", mod);
    if ((st = fmt_st_writer_add(w, nm, FMT_DT_I64, 1, sh2, err)) != MC_OK)
        return st;
    if (k->fmt != KN_W_Q4)
        return MC_OK;
    snprintf(nm, sizeof nm, "%s.weight_zero_point", mod);
    return fmt_st_writer_add(w, nm, FMT_DT_I32, 2, shz, err);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* Tensor i's converted bytes, in declaration order. */
static mc_status emit(ctx *c, fmt_st_writer *w, size_t i, mc_error *err)
{
    cmp_xtensor t;
    mc_status st = cmp_xsrc_load(c->s, i, &t, err);
    if (st != MC_OK)
        return st;
    uint8_t *b = c->buf;
    if (c->kind[i] == -1)
        return fmt_st_writer_write(w, t.data,
                                   (size_t)kn_wformat_data_bytes(t.fmt, t.rows,
                                                                 t.cols), err);
    if (c->kind[i] == -2) {
        for (uint32_t r = 0; r < t.rows; r++)
            cmp_xtensor_row_f32(&t, r, (float *)(void *)(b +
                                (size_t)r * t.cols * 4));
        return fmt_st_writer_write(w, b, (size_t)t.rows * t.cols * 4, err);
    }
    const scheme *k = &c->sch[c->kind[i]];
    int q8 = k->fmt == KN_W_Q8;
    uint64_t words = packed_words(t.cols, q8 ? 8 : 4);
    size_t rowb = (size_t)words * 4;
    /* weight_packed */
    for (uint32_t r = 0; r < t.rows; r++) {
        uint8_t *o = b + (size_t)r * rowb;
        memset(o, 0, rowb);
        if (q8) { /* stored q + 128: flip the sign bit of the int8 code */
            const uint8_t *q = t.data + (size_t)r * t.cols;
            for (uint32_t j = 0; j < t.cols; j++)
                o[j] = q[j] ^ 0x80u;
        } else {
            memcpy(o, t.data + (size_t)r * kn_q4_row_bytes(t.cols),
                   (size_t)kn_q4_row_bytes(t.cols));
        }
    }
    if ((st = fmt_st_writer_write(w, b, (size_t)t.rows * rowb, err)) != MC_OK)
        return st;
    /* weight_scale as float32 */
    uint32_t ng = q8 ? 1 : kn_q4_ngroups(t.cols, t.group);
    float *sc = (float *)(void *)b;
    for (uint64_t j = 0; j < (uint64_t)t.rows * ng; j++) {
        if (q8)
            memcpy(&sc[j], t.scales + 4 * j, 4);
        else
            sc[j] = fmt_f16_to_f32(get_u16(t.scales + 2 * j));
    }
    if ((st = fmt_st_writer_write(w, b, (size_t)t.rows * ng * 4, err)) !=
        MC_OK)
        return st;
    int64_t shape[2] = {t.rows, t.cols};
    if ((st = fmt_st_writer_write(w, shape, sizeof shape, err)) != MC_OK)
        return st;
    if (k->fmt != KN_W_Q4)
        return MC_OK;
    /* weight_zero_point packed down the rows: word (w, g) holds rows
     * 8w..8w+7 of group g */
    uint64_t zw = packed_words(t.rows, 4);
    for (uint64_t wd = 0; wd < zw; wd++)
        for (uint32_t g = 0; g < ng; g++) {
            uint32_t v = 0;
            for (uint32_t k8 = 0; k8 < 8 && wd * 8 + k8 < t.rows; k8++)
                v |= (uint32_t)(t.zeros[(wd * 8 + k8) * ng + g] & 15)
                     << (4 * k8);
            put_le32(b + 4 * (wd * ng + g), v);
        }
    return fmt_st_writer_write(w, b, (size_t)(zw * ng * 4), err);
}

static json_t *quant_config(const ctx *c)
{
    json_t *groups = json_object();
    for (int k = 0; groups && k < c->nsch; k++) {
        const scheme *s = &c->sch[k];
        int q8 = s->fmt == KN_W_Q8;
        json_t *wq = json_pack(
            "{s:i, s:s, s:b, s:s, s:o, s:b, s:n, s:s, s:{}}", "num_bits",
            q8 ? 8 : 4, "type", "int", "symmetric", s->fmt != KN_W_Q4,
            "strategy", q8 ? "channel" : "group", "group_size",
            q8 ? json_null() : json_integer(s->group), "dynamic", 0,
            "actorder", "observer", "minmax", "observer_kwargs");
        json_t *g = json_pack("{s:O, s:o, s:n, s:n, s:s}", "targets",
                              s->targets, "weights", wq, "input_activations",
                              "output_activations", "format",
                              "pack-quantized");
        char name[24]; /* "group_" and an int */
        snprintf(name, sizeof name, "group_%d", k);
        if (!g || json_object_set_new(groups, name, g)) {
            json_decref(groups);
            return NULL;
        }
    }
    return json_pack("{s:s, s:s, s:s, s:o, s:O, s:n, s:n}", "quant_method",
                     "compressed-tensors", "format", "pack-quantized",
                     "quantization_status", "compressed", "config_groups",
                     groups, "ignore", c->ignore, "kv_cache_scheme",
                     "global_compression_ratio");
}

/* Write text to dir/name atomically. */
static mc_status put_file(const char *dir, const char *name, const char *text,
                          size_t len, mc_error *err)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return mc_fail(err, MC_ERR_INVALID_ARG, dir, name, -1,
                       "path too long");
    fmt_atomic_file *f;
    mc_status st = fmt_atomic_create(path, &f, err);
    if (st != MC_OK)
        return st;
    if ((st = fmt_atomic_write(f, text, len, err)) != MC_OK) {
        fmt_atomic_abort(f);
        return st;
    }
    return fmt_atomic_commit(f, err);
}

static mc_status put_json(const char *dir, const char *name, json_t *j,
                          mc_error *err)
{
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS |
                                    JSON_REAL_PRECISION(17))
                : NULL;
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, dir, name, -1, "out of memory");
    mc_status st = put_file(dir, name, s, strlen(s), err);
    json_free_t jfree;
    json_get_alloc_funcs(NULL, &jfree);
    jfree(s);
    return st;
}

/* config.json: the model's fields, the architecture class, the tie that
 * the tensors really have, and the quantization_config. */
static mc_status write_config(const ctx *c, const char *dir, mc_error *err)
{
    const fmt_model_config *cfg = cmp_xsrc_config(c->s);
    char *text = fmt_config_to_json(cfg);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    mc_free(text);
    static const char *const cls[] = {"LlamaForCausalLM",
                                      "MistralForCausalLM",
                                      "Qwen2ForCausalLM"};
    json_t *q = c->nsch ? quant_config(c) : json_null();
    int tied = !cmp_xsrc_has(c->s, "lm_head.weight");
    if (!j || !q ||
        json_object_set_new(j, "architectures",
                            json_pack("[s]", cls[cfg->arch])) ||
        json_object_set_new(j, "tie_word_embeddings", json_boolean(tied)) ||
        (c->nsch && json_object_set(j, "quantization_config", q))) {
        json_decref(j);
        json_decref(q);
        return mc_fail(err, MC_ERR_NOMEM, dir, "config.json", -1,
                       "out of memory");
    }
    json_decref(q);
    mc_status st = put_json(dir, "config.json", j, err);
    json_decref(j);
    return st;
}

/* tokenizer.json as embedded, and a tokenizer_config.json that names the
 * fast tokenizer and the BOS/EOS tokens by id's text. */
static mc_status write_tokenizer(const ctx *c, const char *dir, mc_error *err)
{
    size_t len;
    const char *tok = cmp_xsrc_tokenizer(c->s, &len);
    if (!tok) {
        snprintf(c->rep->tokenizer, sizeof c->rep->tokenizer, "none");
        return MC_OK;
    }
    mc_status st = put_file(dir, "tokenizer.json", tok, len, err);
    if (st != MC_OK)
        return st;
    json_t *tj = json_loadb(tok, len, 0, NULL);
    json_t *tc = json_pack("{s:s}", "tokenizer_class",
                           "PreTrainedTokenizerFast");
    const fmt_model_config *cfg = cmp_xsrc_config(c->s);
    const json_t *added = json_object_get(tj, "added_tokens");
    for (size_t i = 0; tc && i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const json_t *content = json_object_get(a, "content");
        if (id == cfg->bos_token_id)
            json_object_set(tc, "bos_token", (json_t *)content);
        if (cfg->n_eos && id == cfg->eos_token_ids[0])
            json_object_set(tc, "eos_token", (json_t *)content);
    }
    st = put_json(dir, "tokenizer_config.json", tc, err);
    json_decref(tc);
    json_decref(tj);
    snprintf(c->rep->tokenizer, sizeof c->rep->tokenizer,
             "tokenizer.json (%zu bytes)", len);
    return st;
}

mc_status cmp_export_ct(cmp_xsrc *s, const char *out,
                        const cmp_export_opts *o, cmp_export_report *rep,
                        mc_error *err)
{
    size_t n = cmp_xsrc_count(s);
    ctx c = {out, s, o, rep, mc_calloc(n + 1, sizeof(int)), {{0}}, 0,
             json_array(), NULL, 0};
    fmt_atomic_dir *d = NULL;
    fmt_st_writer *w = NULL;
    mc_status st = MC_OK;
    snprintf(rep->arch, sizeof rep->arch, "%s",
             cmp_xsrc_config(s)->model_type);
    if (!c.kind || !c.ignore) {
        st = nomem(&c, NULL, err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        cmp_xtensor t;
        if ((st = cmp_xsrc_info(s, i, &t, err)) != MC_OK ||
            (st = classify(&c, i, &t, err)) != MC_OK)
            goto out;
        uint64_t b = cmp_xtensor_bytes(&t);
        if (b > rep->largest_tensor)
            rep->largest_tensor = b;
    }
    if ((st = fmt_atomic_dir_create(out, &d, err)) != MC_OK)
        goto out;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", fmt_atomic_dir_path(d));
    if ((st = fmt_st_writer_create(path, &w, err)) != MC_OK)
        goto out;
    uint64_t part_max = 16;
    for (size_t i = 0; i < n; i++) {
        cmp_xtensor t;
        cmp_xsrc_info(s, i, &t, NULL);
        if ((st = declare(&c, w, i, &t, &part_max, err)) != MC_OK)
            goto out;
        rep->quantized += c.kind[i] >= 0;
    }
    if (part_max > SIZE_MAX || !(c.buf = mc_malloc((size_t)part_max))) {
        st = nomem(&c, NULL, err);
        goto out;
    }
    if ((st = fmt_st_writer_set_metadata(w, "mcompile.export",
                                         "compressed-tensors", err)) != MC_OK ||
        (st = fmt_st_writer_begin_data(w, err)) != MC_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if ((st = emit(&c, w, i, err)) != MC_OK)
            goto out;
        rep->tensors++;
    }
    rep->bytes = fmt_st_writer_total_bytes(w);
    st = fmt_st_writer_finish(w, err);
    w = NULL;
    if (st == MC_OK)
        st = write_config(&c, fmt_atomic_dir_path(d), err);
    if (st == MC_OK)
        st = write_tokenizer(&c, fmt_atomic_dir_path(d), err);
    if (st == MC_OK) {
        st = fmt_atomic_dir_commit(d, err);
        d = NULL;
    }
out:
    fmt_st_writer_abort(w);
    fmt_atomic_dir_abort(d);
    for (int k = 0; k < c.nsch; k++)
        json_decref(c.sch[k].targets);
    json_decref(c.ignore);
    mc_free(c.kind);
    mc_free(c.buf);
    return st;
}

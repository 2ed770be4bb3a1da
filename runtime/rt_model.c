/* rt_model.c - building an rt_model from a Hugging Face checkpoint (see
 * rt_model.h).  Matrices are views into the mmapped safetensors files;
 * norms and biases are converted to float32 into one owned block. */
#include "rt_model.h"

#include "rt_artifact.h"

#include <stdio.h>
#include <string.h>

#include "fmt_model.h"
#include "mc_alloc.h"
#include "mc_checked.h"

void rt_model_layer_dims(const fmt_model_config *cfg, uint32_t layer,
                         kn_block_dims *out)
{
    out->hidden = cfg->hidden_size;
    out->heads = cfg->num_heads;
    out->kv_heads = cfg->num_kv_heads;
    out->head_dim = cfg->head_dim;
    out->ffn = cfg->intermediate_size;
    out->eps = (float)cfg->rms_norm_eps;
    out->window = fmt_config_layer_window(cfg, layer);
}

void rt_model_free(rt_model *m)
{
    if (!m)
        return;
    if (m->owner_free)
        m->owner_free(m->owner);
    mc_free(m->owned);
    mc_free(m->layers);
    mc_free(m);
}

static uint64_t matrix_elems(const kn_matrix *w)
{
    return (uint64_t)w->rows * w->cols;
}

uint64_t rt_model_param_count(const rt_model *m)
{
    uint64_t n = matrix_elems(&m->embed);
    if (m->lm_head.data != m->embed.data)
        n += matrix_elems(&m->lm_head);
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        const kn_block_weights *w = &m->layers[l].w;
        n += matrix_elems(&w->wq) + matrix_elems(&w->wk) +
             matrix_elems(&w->wv) + matrix_elems(&w->wo) +
             matrix_elems(&w->w_gate) + matrix_elems(&w->w_up) +
             matrix_elems(&w->w_down);
    }
    /* owned holds exactly the norms and biases unless matrices were copied;
     * count norms and biases from the config instead. */
    const fmt_model_config *c = &m->cfg;
    uint64_t qd = fmt_config_q_dim(c), kd = fmt_config_kv_dim(c);
    uint64_t per = 2ull * c->hidden_size;
    if (c->qkv_bias)
        per += qd + 2 * kd;
    if (c->o_bias)
        per += c->hidden_size;
    if (c->mlp_bias)
        per += 2ull * c->intermediate_size + c->hidden_size;
    return n + per * c->num_layers + c->hidden_size;
}

/* ---- Hugging Face loader ------------------------------------------------ */

typedef struct hf_loader {
    fmt_model *fm;
    rt_model *m;
    uint64_t owned_used;      /* floats handed out of m->owned */
    mc_error *err;
} hf_loader;

static void owner_close(void *owner)
{
    fmt_model_close(owner);
}

static const fmt_st_tensor *need(hf_loader *L, const char *name,
                                 uint64_t d0, uint64_t d1, mc_status *st)
{
    const fmt_st_tensor *t = fmt_model_find(L->fm, name, NULL);
    if (!t) {
        *st = mc_fail(L->err, MC_ERR_NOT_FOUND, L->m->path, name, -1,
                      "tensor missing from the checkpoint");
        return NULL;
    }
    int ndim = d1 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (d1 && t->shape[1] != d1)) {
        if (d1)
            *st = mc_fail(L->err, MC_ERR_SHAPE, L->m->path, name,
                          (int64_t)t->file_offset,
                          "expected shape [%llu, %llu] from config.json",
                          (unsigned long long)d0, (unsigned long long)d1);
        else
            *st = mc_fail(L->err, MC_ERR_SHAPE, L->m->path, name,
                          (int64_t)t->file_offset,
                          "expected shape [%llu] from config.json",
                          (unsigned long long)d0);
        return NULL;
    }
    if (t->dtype != FMT_DT_F32 && t->dtype != FMT_DT_F16 &&
        t->dtype != FMT_DT_BF16) {
        *st = mc_fail(L->err, MC_ERR_UNSUPPORTED, L->m->path, name,
                      (int64_t)t->file_offset,
                      "dtype %s not supported (F32, F16 or BF16)",
                      fmt_dtype_name(t->dtype));
        return NULL;
    }
    *st = MC_OK;
    return t;
}

/* A float32 vector in owned (converted).  Counting pass when owned is NULL. */
static mc_status vec(hf_loader *L, const char *name, uint64_t n,
                     const float **out)
{
    mc_status st;
    const fmt_st_tensor *t = need(L, name, n, 0, &st);
    if (!t)
        return st;
    if (L->m->owned) {
        float *dst = L->m->owned + L->owned_used;
        fmt_to_f32(t->dtype, t->data, dst, n);
        *out = dst;
    }
    L->owned_used += n;
    return MC_OK;
}

static mc_status mat(hf_loader *L, const char *name, uint64_t rows,
                     uint64_t cols, kn_matrix *out)
{
    mc_status st;
    const fmt_st_tensor *t = need(L, name, rows, cols, &st);
    if (!t)
        return st;
    size_t esz = fmt_dtype_size(t->dtype);
    memset(out, 0, sizeof *out);
    out->rows = (uint32_t)rows;
    out->cols = (uint32_t)cols;
    if ((uintptr_t)t->data % esz == 0) {
        out->fmt = t->dtype == FMT_DT_F32   ? KN_W_F32
                   : t->dtype == FMT_DT_F16 ? KN_W_F16
                                            : KN_W_BF16;
        out->data = t->data;
        return MC_OK;
    }
    /* Misaligned for its element type: copy to float32 (writers that
     * follow the format align, so this is for odd files only). */
    out->fmt = KN_W_F32;
    if (L->m->owned) {
        float *dst = L->m->owned + L->owned_used;
        fmt_to_f32(t->dtype, t->data, dst, rows * cols);
        out->data = dst;
    }
    L->owned_used += rows * cols;
    return MC_OK;
}

static mc_status layer_tensors(hf_loader *L, uint32_t i)
{
    const fmt_model_config *c = &L->m->cfg;
    kn_block_weights *w = &L->m->layers[i].w;
    uint64_t h = c->hidden_size, f = c->intermediate_size;
    uint64_t qd = fmt_config_q_dim(c), kd = fmt_config_kv_dim(c);
    char n[160];
    mc_status st = MC_OK;
#define P(suffix) (snprintf(n, sizeof n, "model.layers.%u.%s", i, suffix), n)
    if ((st = vec(L, P("input_layernorm.weight"), h, &w->attn_norm)) ||
        (st = mat(L, P("self_attn.q_proj.weight"), qd, h, &w->wq)) ||
        (st = mat(L, P("self_attn.k_proj.weight"), kd, h, &w->wk)) ||
        (st = mat(L, P("self_attn.v_proj.weight"), kd, h, &w->wv)) ||
        (st = mat(L, P("self_attn.o_proj.weight"), h, qd, &w->wo)) ||
        (st = vec(L, P("post_attention_layernorm.weight"), h, &w->mlp_norm)) ||
        (st = mat(L, P("mlp.gate_proj.weight"), f, h, &w->w_gate)) ||
        (st = mat(L, P("mlp.up_proj.weight"), f, h, &w->w_up)) ||
        (st = mat(L, P("mlp.down_proj.weight"), h, f, &w->w_down)))
        return st;
    if (c->qkv_bias &&
        ((st = vec(L, P("self_attn.q_proj.bias"), qd, &w->bq)) ||
         (st = vec(L, P("self_attn.k_proj.bias"), kd, &w->bk)) ||
         (st = vec(L, P("self_attn.v_proj.bias"), kd, &w->bv))))
        return st;
    if (c->o_bias && (st = vec(L, P("self_attn.o_proj.bias"), h, &w->bo)))
        return st;
    if (c->mlp_bias &&
        ((st = vec(L, P("mlp.gate_proj.bias"), f, &w->b_gate)) ||
         (st = vec(L, P("mlp.up_proj.bias"), f, &w->b_up)) ||
         (st = vec(L, P("mlp.down_proj.bias"), h, &w->b_down))))
        return st;
#undef P
    rt_model_layer_dims(c, i, &L->m->layers[i].dims);
    return MC_OK;
}

/* One pass over every tensor: with owned NULL it only counts floats. */
static mc_status all_tensors(hf_loader *L)
{
    rt_model *m = L->m;
    const fmt_model_config *c = &m->cfg;
    mc_status st;
    L->owned_used = 0;
    if ((st = mat(L, "model.embed_tokens.weight", c->vocab_size,
                  c->hidden_size, &m->embed)))
        return st;
    for (uint32_t i = 0; i < c->num_layers; i++)
        if ((st = layer_tensors(L, i)))
            return st;
    if ((st = vec(L, "model.norm.weight", c->hidden_size, &m->final_norm)))
        return st;
    if (c->tie_word_embeddings) {
        /* Some exporters store the tied layer twice; transformers ties it
         * to the embedding whatever the file holds.  The same bytes are
         * the embedding; other bytes would make a different model than
         * the config says (mcompile refuses them the same way). */
        const fmt_st_tensor *h = fmt_model_find(L->fm, "lm_head.weight", NULL);
        const fmt_st_tensor *e =
            fmt_model_find(L->fm, "model.embed_tokens.weight", NULL);
        if (h && !fmt_st_tensor_same(h, e))
            return mc_fail(L->err, MC_ERR_SHAPE, L->m->path, "lm_head.weight",
                           -1, "config.json ties the output layer to the "
                           "embedding (tie_word_embeddings true), but the "
                           "checkpoint's lm_head.weight differs from "
                           "model.embed_tokens.weight; set "
                           "tie_word_embeddings to false to use it");
        m->lm_head = m->embed;
        return MC_OK;
    }
    return mat(L, "lm_head.weight", c->vocab_size, c->hidden_size,
               &m->lm_head);
}

static uint64_t matrix_bytes(const kn_matrix *w)
{
    return kn_wformat_data_bytes(w->fmt, w->rows, w->cols) +
           kn_wformat_scale_bytes(w->fmt, w->rows, w->cols, w->group) +
           kn_wformat_zero_bytes(w->fmt, w->rows, w->cols, w->group);
}

static uint64_t weight_bytes(const rt_model *m)
{
    uint64_t n = matrix_bytes(&m->lm_head);
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        const kn_block_weights *w = &m->layers[l].w;
        n += matrix_bytes(&w->wq) + matrix_bytes(&w->wk) +
             matrix_bytes(&w->wv) + matrix_bytes(&w->wo) +
             matrix_bytes(&w->w_gate) + matrix_bytes(&w->w_up) +
             matrix_bytes(&w->w_down);
    }
    return n;
}

mc_status rt_model_open_hf(const char *path, rt_model **out, mc_error *err)
{
    *out = NULL;
    rt_model *m = mc_calloc(1, sizeof *m);
    if (!m)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "model struct");
    snprintf(m->path, sizeof m->path, "%s", path);
    fmt_model *fm = NULL;
    mc_status st = fmt_model_open(path, &fm, err);
    if (st) {
        mc_free(m);
        return st;
    }
    m->owner = fm;
    m->owner_free = owner_close;
    if ((st = fmt_config_load(fmt_model_config_path(fm), &m->cfg, err)))
        goto fail;
    const fmt_model_config *c = &m->cfg;
    if (c->head_dim % 2 || c->num_kv_heads == 0 ||
        c->num_heads % c->num_kv_heads) {
        st = mc_fail(err, MC_ERR_UNSUPPORTED, fmt_model_config_path(fm),
                     "head_dim", -1,
                     "head_dim %u must be even and heads (%u) a multiple of "
                     "kv heads (%u)", c->head_dim, c->num_heads,
                     c->num_kv_heads);
        goto fail;
    }
    m->layers = mc_calloc(c->num_layers, sizeof *m->layers);
    if (!m->layers) {
        st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "layer table");
        goto fail;
    }
    hf_loader L = {.fm = fm, .m = m, .err = err};
    if ((st = all_tensors(&L)))                /* validate and count */
        goto fail;
    m->owned_floats = L.owned_used;
    m->owned = mc_malloc_array(L.owned_used ? L.owned_used : 1, sizeof(float));
    if (!m->owned) {
        st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1,
                     "%llu floats of norms and biases",
                     (unsigned long long)L.owned_used);
        goto fail;
    }
    if ((st = all_tensors(&L)))                /* fill */
        goto fail;
    m->weight_bytes = weight_bytes(m);
    *out = m;
    return MC_OK;
fail:
    rt_model_free(m);
    return st;
}

mc_status rt_model_open_ex(const char *path, unsigned flags, rt_model **out,
                           mc_error *err)
{
    /* An artifact is recognised by its magic; anything else is a Hugging
     * Face directory or file. */
    if (rt_artifact_is(path))
        return rt_model_open_artifact_ex(path, flags, out, err);
    /* A file named like an artifact without the magic is a damaged one
     * (or not one): the artifact reader says so ("bad magic"), where the
     * checkpoint reader would report a safetensors header. */
    size_t n = strlen(path);
    if (n > 4 && strcmp(path + n - 4, ".mca") == 0)
        return rt_model_open_artifact_ex(path, flags, out, err);
    return rt_model_open_hf(path, out, err);
}

mc_status rt_model_open(const char *path, rt_model **out, mc_error *err)
{
    return rt_model_open_ex(path, 0, out, err);
}

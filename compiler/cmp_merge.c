/* cmp_merge.c - matching adapters against the base and computing merged
 * tensors (contract in cmp_merge.h; output in cmp_merge_write.c). */
#include "cmp_merge_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_par.h"
#include "fmt_json_strict.h"
#include "kn_cpus.h"
#include "mc_alloc.h"
#include "mc_checked.h"

#define EMBED_NAME "model.embed_tokens.weight"
#define LM_HEAD_NAME "lm_head.weight"
#define MAX_MISSING_LISTED 5

void cmp_merge_dims_(const fmt_st_tensor *t, uint64_t *rows, uint64_t *cols)
{
    if (t->ndim <= 1) {
        *rows = 1;
        *cols = t->nelem;
        return;
    }
    *rows = t->shape[0];
    *cols = t->shape[0] ? t->nelem / t->shape[0] : 0;
}

static int cmp_idx(const void *a, const void *b, void *ctx)
{
    const merge_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

const merge_tensor *cmp_merge_find_(const cmp_merge *m, const char *name)
{
    size_t lo = 0, hi = m->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->tensors[m->by_name[mid]].name, name);
        if (c == 0)
            return &m->tensors[m->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* tie_word_embeddings from config.json into *tied (raw: the merge must not
 * depend on the architecture being one the runtime supports).  No config
 * (a bare .safetensors): not tied.  A config that cannot be read or parsed
 * is an error, not "untied": the answer decides whether lm_head is
 * written out. */
static mc_status base_is_tied(const fmt_model *base, int *tied, mc_error *err)
{
    *tied = 0;
    const char *path = fmt_model_config_path(base);
    if (!path || access(path, F_OK) != 0)
        return MC_OK;
    json_t *root = NULL;
    mc_status st = fmt_json_load_file_strict(path, &root, err);
    if (st == MC_OK)
        *tied = json_is_true(json_object_get(root, "tie_word_embeddings"));
    json_decref(root);
    return st;
}

static mc_status add_op(merge_tensor *t, const merge_op *op, mc_error *err)
{
    if (t->n_ops == t->cap_ops) {
        size_t nc = t->cap_ops ? 2 * t->cap_ops : 2;
        merge_op *o = mc_realloc(t->ops, nc * sizeof *o);
        if (!o)
            return mc_fail(err, MC_ERR_NOMEM, NULL, t->name, -1,
                           "out of memory");
        t->ops = o;
        t->cap_ops = nc;
    }
    t->ops[t->n_ops++] = *op;
    return MC_OK;
}

static mc_status build_tensor_list(cmp_merge *m, mc_error *err)
{
    size_t n = fmt_model_tensor_count(m->base);
    m->tensors = mc_calloc(n + 1, sizeof *m->tensors);
    m->by_name = mc_calloc(n + 1, sizeof *m->by_name);
    if (!m->tensors || !m->by_name)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t shard = 0;
        const fmt_st_tensor *t = fmt_model_tensor(m->base, i, &shard);
        m->tensors[i].name = t->name;
        m->tensors[i].src = t;
        m->tensors[i].shard = shard;
        m->by_name[i] = i;
    }
    m->n_tensors = n;
    qsort_r(m->by_name, n, sizeof *m->by_name, cmp_idx, m->tensors);
    return MC_OK;
}

/* Insert the untied lm_head right after the last tensor of embed_tokens'
 * shard. */
static mc_status untie(cmp_merge *m, merge_tensor **out, mc_error *err)
{
    const merge_tensor *e = cmp_merge_find_(m, EMBED_NAME);
    if (!e)
        return mc_fail(err, MC_ERR_NOT_FOUND, fmt_model_dir(m->base),
                       EMBED_NAME, -1, "tied model without %s", EMBED_NAME);
    size_t shard = e->shard, pos = 0;
    const fmt_st_tensor *src = e->src;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].shard <= shard)
            pos = i + 1;
    memmove(&m->tensors[pos + 1], &m->tensors[pos],
            (m->n_tensors - pos) * sizeof *m->tensors);
    merge_tensor *t = &m->tensors[pos];
    memset(t, 0, sizeof *t);
    t->name = LM_HEAD_NAME;
    t->src = src;
    t->shard = shard;
    t->untied = 1;
    m->n_tensors++;
    for (size_t i = 0; i < m->n_tensors; i++)
        m->by_name[i] = i;
    qsort_r(m->by_name, m->n_tensors, sizeof *m->by_name, cmp_idx, m->tensors);
    m->untie = 1;
    *out = t;
    return MC_OK;
}

/* Base tensor for name, untying lm_head when needed (name is lm_head on a
 * tied model).  *out NULL if absent. */
static mc_status lookup(cmp_merge *m, const char *name, int tied,
                        merge_tensor **out, mc_error *err)
{
    *out = (merge_tensor *)cmp_merge_find_(m, name);
    if (strcmp(name, LM_HEAD_NAME) != 0 || !tied)
        return MC_OK;
    if (*out) {
        /* A tied config with a stored lm_head: loaders would re-tie it and
         * drop the delta, so the config must say untied. */
        m->untie = 1;
        return MC_OK;
    }
    return untie(m, out, err);
}

static mc_status check_float(const cmp_merge *m, const merge_tensor *t,
                             mc_error *err)
{
    if (fmt_dtype_is_float(t->src->dtype))
        return MC_OK;
    return mc_fail(err, MC_ERR_UNSUPPORTED, fmt_model_dir(m->base), t->name,
                   -1, "base tensor has dtype %s; only F32/F16/BF16 tensors "
                   "can be merged", fmt_dtype_name(t->src->dtype));
}

static mc_status shape_error(const cmp_merge *m, const fmt_peft_adapter *a,
                             const fmt_peft_module *mod, const merge_tensor *t,
                             mc_error *err)
{
    char got[64] = "";
    if (t->src->ndim == 2)
        snprintf(got, sizeof got, "[%llu, %llu]",
                 (unsigned long long)t->src->shape[0],
                 (unsigned long long)t->src->shape[1]);
    else
        snprintf(got, sizeof got, "a %d-dimensional tensor", t->src->ndim);
    (void)m;
    int emb = mod->kind == FMT_PEFT_EMBEDDING;
    return mc_fail(err, MC_ERR_SHAPE, fmt_peft_dir(a), mod->name, -1,
                   "LoRA A [%llu, %llu] and B [%llu, %llu] give a delta of "
                   "[%llu, %llu]%s, but base tensor '%s' is %s",
                   (unsigned long long)mod->A->shape[0],
                   (unsigned long long)mod->A->shape[1],
                   (unsigned long long)mod->B->shape[0],
                   (unsigned long long)mod->B->shape[1],
                   (unsigned long long)(emb ? mod->A->shape[1]
                                            : mod->B->shape[0]),
                   (unsigned long long)(emb ? mod->B->shape[0]
                                            : mod->A->shape[1]),
                   emb ? " (embedding: (B@A)^T)" : "", t->name, got);
}

static mc_status add_module(cmp_merge *m, const fmt_peft_adapter *a,
                            const fmt_peft_module *mod, double weight, int tied,
                            char *missing, size_t *n_missing, mc_error *err)
{
    char name[600];
    snprintf(name, sizeof name, "%s.weight", mod->name);
    merge_tensor *t;
    mc_status st;
    /* A delta on a tied model's embedding: PEFT's forward (what was
     * trained) applies it to the embedding lookup only, the output layer
     * keeps the weight the embedding had, so lm_head is written out with
     * it (a changed base_layer copy included).  peft 0.21's
     * merge_and_unload instead adds the delta into the shared weight,
     * changing the output layer too: the merged model would not be the
     * one that was trained (docs/ci-merge.md). */
    if (tied && strcmp(name, EMBED_NAME) == 0) {
        int fresh = !cmp_merge_find_(m, LM_HEAD_NAME);
        if ((st = lookup(m, LM_HEAD_NAME, tied, &t, err)))
            return st;
        const merge_tensor *e = cmp_merge_find_(m, EMBED_NAME);
        for (size_t i = 0; fresh && e && i < e->n_ops; i++)
            if (e->ops[i].kind == OP_REPLACE &&
                (st = add_op(t, &e->ops[i], err)))
                return st;
    }
    st = lookup(m, name, tied, &t, err);
    if (st)
        return st;
    if (!t) {
        if ((*n_missing)++ < MAX_MISSING_LISTED) {
            size_t l = strlen(missing);
            snprintf(missing + l, 1024 - l, "%s'%s'", l ? ", " : "", name);
        }
        return MC_OK;
    }
    if ((st = check_float(m, t, err)))
        return st;
    const fmt_st_tensor *w = t->src;
    uint64_t in = mod->A->shape[1], out = mod->B->shape[0];
    merge_op op = {.kind = OP_DELTA, .mod = mod, .coef = weight * mod->scaling,
                   .dora = mod->magnitude != NULL};
    int fits = w->ndim == 2;
    if (mod->kind == FMT_PEFT_EMBEDDING) {
        op.transposed = 1;
        fits = fits && w->shape[0] == in && w->shape[1] == out;
    } else if (fits && w->shape[0] == out && w->shape[1] == in) {
        op.transposed = 0; /* nn.Linear: PEFT ignores fan_in_fan_out */
    } else if (fits && fmt_peft_get_config(a)->fan_in_fan_out &&
               w->shape[0] == in && w->shape[1] == out) {
        op.transposed = 1;
    } else {
        fits = 0;
    }
    if (!fits)
        return shape_error(m, a, mod, t, err);
    if ((st = add_op(t, &op, err)))
        return st;
    m->lora_modules++;
    if (!mod->b_bias)
        return MC_OK;
    snprintf(name, sizeof name, "%s.bias", mod->name);
    merge_tensor *b = (merge_tensor *)cmp_merge_find_(m, name);
    if (!b)
        return mc_fail(err, MC_ERR_NOT_FOUND, fmt_peft_dir(a), name, -1,
                       "adapter has lora_B.bias (lora_bias) but the base "
                       "layer has no bias");
    if ((st = check_float(m, b, err)))
        return st;
    if (b->src->nelem != out || b->src->ndim != 1)
        return mc_fail(err, MC_ERR_SHAPE, fmt_peft_dir(a), name, -1,
                       "lora_B.bias has %llu entries, base bias has %llu",
                       (unsigned long long)out,
                       (unsigned long long)b->src->nelem);
    merge_op bop = {.kind = OP_BIAS_ADD, .mod = mod, .coef = op.coef};
    return add_op(b, &bop, err);
}

/* 1 if tensors a and b (same element count) hold the same values. */
static int same_values(const fmt_st_tensor *a, const fmt_st_tensor *b)
{
    float x[512], y[512];
    size_t ea = fmt_dtype_size(a->dtype), eb = fmt_dtype_size(b->dtype);
    for (uint64_t i = 0; i < a->nelem; i += 512) {
        size_t k = a->nelem - i < 512 ? (size_t)(a->nelem - i) : 512;
        fmt_to_f32(a->dtype, (const unsigned char *)a->data + i * ea, x, k);
        fmt_to_f32(b->dtype, (const unsigned char *)b->data + i * eb, y, k);
        if (memcmp(x, y, k * sizeof *x) != 0)
            return 0;
    }
    return 1;
}

static mc_status add_replace(cmp_merge *m, const fmt_peft_adapter *a,
                             const fmt_peft_replace *r, int tied,
                             char *missing, size_t *n_missing, mc_error *err)
{
    merge_tensor *t;
    /* modules_to_save on a tied model's embedding: PEFT swaps in a trained
     * copy of the module and the output layer keeps the original weight,
     * so lm_head is written out (untied) with the original values.  A
     * base_layer copy is loaded into the shared weight instead and stays
     * tied. */
    if (tied && !r->base_layer && strcmp(r->tensor, EMBED_NAME) == 0) {
        mc_status st = lookup(m, LM_HEAD_NAME, tied, &t, err);
        if (st)
            return st;
    }
    mc_status st = lookup(m, r->tensor, tied, &t, err);
    if (st)
        return st;
    if (!t) {
        if ((*n_missing)++ < MAX_MISSING_LISTED) {
            size_t l = strlen(missing);
            snprintf(missing + l, 1024 - l, "%s'%s'", l ? ", " : "",
                     r->tensor);
        }
        return MC_OK;
    }
    if ((st = check_float(m, t, err)))
        return st;
    if (t->src->ndim != r->t->ndim ||
        memcmp(t->src->shape, r->t->shape, sizeof(uint64_t) * (size_t)r->t->ndim))
        return mc_fail(err, MC_ERR_SHAPE, fmt_peft_dir(a), r->tensor, -1,
                       "shape mismatch: replacement tensor has %llu elements "
                       "in %d dimensions, base has %llu in %d",
                       (unsigned long long)r->t->nelem, r->t->ndim,
                       (unsigned long long)t->src->nelem, t->src->ndim);
    /* PEFT saves the full base weight of an embedding / lm_head LoRA
     * (save_embedding_layers); unchanged, it is no change at all. */
    if (r->base_layer && same_values(t->src, r->t))
        return MC_OK;
    if (t->n_ops)
        return mc_fail(err, MC_ERR_UNSUPPORTED, fmt_peft_dir(a), r->tensor, -1,
                       "tensor is replaced (modules_to_save / bias) after an "
                       "earlier adapter changed it; put this adapter first");
    merge_op op = {.kind = OP_REPLACE, .rep = r->t};
    m->replaced++;
    return add_op(t, &op, err);
}

static mc_status missing_error(const cmp_merge *m, const fmt_peft_adapter *a,
                               const char *missing, size_t n_missing,
                               mc_error *err)
{
    /* A hint about the usual cause: keys relative to another root. */
    const char *hint = "adapter keys are base_model.model.<name in the base>";
    const fmt_peft_module *mod = fmt_peft_module_at(a, 0);
    char probe[700];
    if (mod) {
        snprintf(probe, sizeof probe, "model.%s.weight", mod->name);
        if (fmt_model_find(m->base, probe, NULL))
            hint = "the base names these with a \"model.\" prefix: the "
                   "adapter was saved from the inner model, not the "
                   "*ForCausalLM";
        else if (strncmp(mod->name, "model.", 6) == 0) {
            snprintf(probe, sizeof probe, "%s.weight", mod->name + 6);
            if (fmt_model_find(m->base, probe, NULL))
                hint = "the base names these without the \"model.\" prefix";
        }
    }
    const char *bm = fmt_peft_get_config(a)->base_model;
    return mc_fail(err, MC_ERR_NOT_FOUND, fmt_peft_dir(a), NULL, -1,
                   "%zu adapter module(s) not found in the base model: %s%s; "
                   "%s; check that the base matches the adapter%s%s%s",
                   n_missing, missing,
                   n_missing > MAX_MISSING_LISTED ? ", ..." : "", hint,
                   bm[0] ? " (base_model_name_or_path \"" : "", bm,
                   bm[0] ? "\")" : "");
}

static mc_status open_into(cmp_merge *m, const cmp_adapter_spec *specs,
                           size_t n, mc_error *err)
{
    mc_status st = build_tensor_list(m, err);
    if (st)
        return st;
    m->adapters = mc_calloc(n ? n : 1, sizeof *m->adapters);
    if (!m->adapters)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    int tied;
    if ((st = base_is_tied(m->base, &tied, err)) != MC_OK)
        return st;
    for (size_t k = 0; k < n; k++) {
        if (!specs[k].dir || !isfinite(specs[k].weight))
            return mc_fail(err, MC_ERR_INVALID_ARG, specs[k].dir, NULL, -1,
                           "adapter weight must be a finite number");
        if ((st = fmt_peft_open(specs[k].dir, &m->adapters[k], err)))
            return st;
        m->n_adapters++;
        const fmt_peft_adapter *a = m->adapters[k];
        char missing[1024] = "";
        size_t n_missing = 0;
        for (size_t i = 0; i < fmt_peft_replace_count(a); i++)
            if ((st = add_replace(m, a, fmt_peft_replace_at(a, i), tied,
                                  missing, &n_missing, err)))
                return st;
        for (size_t i = 0; i < fmt_peft_module_count(a); i++)
            if ((st = add_module(m, a, fmt_peft_module_at(a, i),
                                 specs[k].weight, tied, missing, &n_missing,
                                 err)))
                return st;
        if (n_missing)
            return missing_error(m, a, missing, n_missing, err);
    }
    return MC_OK;
}

mc_status cmp_merge_open(const fmt_model *base, const cmp_adapter_spec *adapters,
                         size_t n, cmp_merge **out, mc_error *err)
{
    if (!out || !base || (n && !adapters))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "NULL argument");
    *out = NULL;
    cmp_merge *m = mc_calloc(1, sizeof *m);
    if (!m)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    m->base = base;
    /* Every CPU this process may use (kn_cpus.h) computes rows, on
     * threads started per chunk (cmp_par_spawn: nothing spins beside the
     * writer thread). */
    int ncpu = kn_cpu_count();
    m->threads = ncpu > CMP_PAR_MAX_SPAWN ? CMP_PAR_MAX_SPAWN : ncpu;
    mc_status st = open_into(m, adapters, n, err);
    if (st) {
        cmp_merge_close(m);
        return st;
    }
    *out = m;
    return MC_OK;
}

void cmp_merge_close(cmp_merge *m)
{
    if (!m)
        return;
    cmp_merge_release_(m);
    for (size_t i = 0; i < m->n_tensors; i++)
        mc_free(m->tensors[i].ops);
    mc_free(m->tensors);
    mc_free(m->by_name);
    for (size_t i = 0; i < m->n_adapters; i++)
        fmt_peft_close(m->adapters[i]);
    mc_free(m->adapters);
    mc_free(m);
}

size_t cmp_merge_tensor_count(const cmp_merge *m)
{
    return m ? m->n_tensors : 0;
}

const char *cmp_merge_tensor_name(const cmp_merge *m, size_t i)
{
    return m && i < m->n_tensors ? m->tensors[i].name : NULL;
}

int cmp_merge_tensor_info(const cmp_merge *m, const char *name,
                          fmt_dtype *dtype, int *ndim, uint64_t *shape,
                          int *touched)
{
    const merge_tensor *t = m && name ? cmp_merge_find_(m, name) : NULL;
    if (!t)
        return 0;
    if (dtype)
        *dtype = t->src->dtype;
    if (ndim)
        *ndim = t->src->ndim;
    if (shape)
        memcpy(shape, t->src->shape, sizeof(uint64_t) * (size_t)t->src->ndim);
    if (touched)
        *touched = t->n_ops > 0 || t->untied;
    return 1;
}

int cmp_merge_unties_lm_head(const cmp_merge *m)
{
    return m ? m->untie : 0;
}

mc_status cmp_merge_tensor_f32(cmp_merge *m, const char *name, float *out,
                               mc_error *err)
{
    const merge_tensor *t = m && name ? cmp_merge_find_(m, name) : NULL;
    if (!t || !out)
        return mc_fail(err, MC_ERR_NOT_FOUND, NULL, name, -1,
                       "no such tensor in the merged model");
    if (!fmt_dtype_is_float(t->src->dtype))
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, name, -1,
                       "dtype %s is not a float type",
                       fmt_dtype_name(t->src->dtype));
    uint64_t rows, cols;
    cmp_merge_dims_(t->src, &rows, &cols);
    mc_status st = cmp_merge_rows_(m, t, 0, rows, FMT_DT_F32, out, err);
    cmp_merge_release_(m);
    return st;
}

void cmp_merge_set_progress(cmp_merge *m, cmp_merge_progress_fn fn, void *ctx)
{
    if (!m)
        return;
    m->progress = fn;
    m->progress_ctx = ctx;
}

/* fmt_peft_open.c - reading a PEFT adapter directory: key mapping and the
 * validation that needs no base model (contract in fmt_peft.h). */
#include "fmt_peft.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_dtype.h"
#include "fmt_file.h"
#include "mc_alloc.h"

#define KEY_PREFIX "base_model.model."

struct fmt_peft_adapter {
    char *dir;
    char *st_path;                /* adapter_model.safetensors */
    fmt_peft_config cfg;
    fmt_st_file *st;
    fmt_peft_module *mods;        /* sorted by name */
    size_t n_mods, cap_mods;
    fmt_peft_replace *reps;       /* sorted by tensor */
    size_t n_reps, cap_reps;
};

static mc_status nomem(const char *file, mc_error *err)
{
    return mc_fail(err, MC_ERR_NOMEM, file, NULL, -1, "out of memory");
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = mc_malloc(la + lb + 2);
    if (s) {
        memcpy(s, a, la);
        s[la] = '/';
        memcpy(s + la + 1, b, lb + 1);
    }
    return s;
}


static int ends_with(const char *s, size_t n, const char *suf, size_t *stem)
{
    size_t k = strlen(suf);
    if (n <= k || memcmp(s + n - k, suf, k) != 0)
        return 0;
    *stem = n - k;
    return 1;
}

static fmt_peft_module *get_module(fmt_peft_adapter *a, const char *name,
                                   size_t len)
{
    for (size_t i = 0; i < a->n_mods; i++)
        if (strlen(a->mods[i].name) == len &&
            memcmp(a->mods[i].name, name, len) == 0)
            return &a->mods[i];
    if (a->n_mods == a->cap_mods) {
        size_t nc = a->cap_mods ? 2 * a->cap_mods : 16;
        fmt_peft_module *m = mc_realloc(a->mods, nc * sizeof *m);
        if (!m)
            return NULL;
        a->mods = m;
        a->cap_mods = nc;
    }
    fmt_peft_module *m = &a->mods[a->n_mods];
    memset(m, 0, sizeof *m);
    if (!(m->name = mc_malloc(len + 1)))
        return NULL;
    memcpy(m->name, name, len);
    m->name[len] = '\0';
    a->n_mods++;
    return m;
}

static int in_list(char **v, size_t n, const char *module)
{
    size_t lm = strlen(module);
    for (size_t i = 0; i < n; i++) {
        size_t le = strlen(v[i]);
        if (strcmp(module, v[i]) == 0 ||
            (lm > le && module[lm - le - 1] == '.' &&
             strcmp(module + lm - le, v[i]) == 0))
            return 1;
    }
    return 0;
}

/* A full replacement tensor: "<module>.weight" for modules_to_save, or a
 * trained "<module>.bias" (bias != none). */
static mc_status add_replace(fmt_peft_adapter *a, const char *tensor,
                             const fmt_st_tensor *t, const char *key,
                             int base_layer, mc_error *err)
{
    size_t n = strlen(tensor), stem;
    int is_bias = ends_with(tensor, n, ".bias", &stem);
    if (!is_bias && !ends_with(tensor, n, ".weight", &stem))
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                       "unexpected key: not a LoRA part (lora_A, lora_B, "
                       "lora_embedding_A/B, lora_magnitude_vector) nor a "
                       "module weight or bias");
    char module[512];
    snprintf(module, sizeof module, "%.*s", (int)stem, tensor);
    int saved = in_list(a->cfg.modules_to_save, a->cfg.n_modules_to_save,
                        module);
    /* A base_layer weight must belong to a module this adapter adapts:
     * checked once all keys are mapped (fmt_peft_open). */
    if (base_layer && !is_bias)
        saved = 1;
    if (!saved && !(is_bias && a->cfg.bias != FMT_PEFT_BIAS_NONE))
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                       is_bias ? "trained bias present but adapter_config "
                                 "has bias \"none\" and the module is not in "
                                 "modules_to_save"
                               : "full weight present but the module is not "
                                 "in modules_to_save");
    for (size_t i = 0; i < a->n_reps; i++)
        if (strcmp(a->reps[i].tensor, tensor) == 0)
            return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                           "tensor '%s' is given twice", tensor);
    if (a->n_reps == a->cap_reps) {
        size_t nc = a->cap_reps ? 2 * a->cap_reps : 8;
        fmt_peft_replace *r = mc_realloc(a->reps, nc * sizeof *r);
        if (!r)
            return nomem(a->st_path, err);
        a->reps = r;
        a->cap_reps = nc;
    }
    if (!(a->reps[a->n_reps].tensor = mc_strdup(tensor)))
        return nomem(a->st_path, err);
    a->reps[a->n_reps].base_layer = base_layer;
    a->reps[a->n_reps++].t = t;
    return MC_OK;
}

static mc_status map_key(fmt_peft_adapter *a, const fmt_st_tensor *t,
                         mc_error *err)
{
    const char *key = t->name;
    size_t plen = strlen(KEY_PREFIX);
    if (strncmp(key, KEY_PREFIX, plen) != 0)
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                       "key does not start with \"" KEY_PREFIX "\" (not a "
                       "PEFT adapter state dict?)");
    const char *rest = key + plen;
    size_t n = strlen(rest), stem;
    static const struct {
        const char *suffix;
        int part; /* 0 A, 1 B, 2 embA, 3 embB, 4 magnitude, 5 B bias */
    } parts[] = {
        {".lora_A.weight", 0},         {".lora_B.weight", 1},
        {".lora_embedding_A", 2},      {".lora_embedding_B", 3},
        {".lora_magnitude_vector", 4}, {".lora_magnitude_vector.weight", 4},
        {".lora_B.bias", 5},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!ends_with(rest, n, parts[i].suffix, &stem))
            continue;
        fmt_peft_module *m = get_module(a, rest, stem);
        if (!m)
            return nomem(a->st_path, err);
        const fmt_st_tensor **slot;
        switch (parts[i].part) {
        case 0: case 2: slot = &m->A; break;
        case 1: case 3: slot = &m->B; break;
        case 4: slot = &m->magnitude; break;
        default: slot = &m->b_bias; break;
        }
        if (*slot)
            return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                           "module '%s' has this part twice", m->name);
        if (parts[i].part <= 3) {
            fmt_peft_kind k = parts[i].part >= 2 ? FMT_PEFT_EMBEDDING
                                                 : FMT_PEFT_LINEAR;
            if ((m->A || m->B) && m->kind != k)
                return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                               "module '%s' mixes lora_A/B and "
                               "lora_embedding_A/B", m->name);
            m->kind = k;
        }
        *slot = t;
        return MC_OK;
    }
    if (strstr(rest, ".lora_"))
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                       "unknown LoRA part (adapter name in the key, or a "
                       "LoRA variant that is not supported)");
    /* modules_to_save entries may carry PEFT's wrapper path. */
    const char *wrap = strstr(rest, ".modules_to_save.");
    if (wrap) {
        const char *after = strchr(wrap + strlen(".modules_to_save."), '.');
        if (!after)
            return mc_fail(err, MC_ERR_FORMAT, a->st_path, key, -1,
                           "malformed modules_to_save key");
        char tensor[600];
        snprintf(tensor, sizeof tensor, "%.*s%s", (int)(wrap - rest), rest,
                 after);
        return add_replace(a, tensor, t, key, 0, err);
    }
    if (strstr(rest, ".original_module."))
        return MC_OK; /* PEFT's untouched copy of a modules_to_save module */
    /* The base layer of a LoRA-wrapped module, as PEFT writes it: the
     * embedding / output layer whose LoRA is saved with its full weight
     * (save_embedding_layers), or a trained bias (bias "all" or
     * "lora_only").  PEFT loads it into the base layer, so it replaces the
     * base tensor of that name. */
    const char *bl = strstr(rest, ".base_layer.");
    if (bl && !strchr(bl + strlen(".base_layer."), '.')) {
        char tensor[600];
        snprintf(tensor, sizeof tensor, "%.*s.%s", (int)(bl - rest), rest,
                 bl + strlen(".base_layer."));
        return add_replace(a, tensor, t, key, 1, err);
    }
    return add_replace(a, rest, t, key, 0, err);
}

/* Index of the first non-finite element of t, or -1. */
static int64_t first_nonfinite(const fmt_st_tensor *t)
{
    float buf[1024];
    size_t es = fmt_dtype_size(t->dtype);
    for (uint64_t i = 0; i < t->nelem; i += 1024) {
        size_t k = t->nelem - i < 1024 ? (size_t)(t->nelem - i) : 1024;
        if (fmt_to_f32(t->dtype, (const unsigned char *)t->data + i * es, buf,
                       k) != 0)
            return 0;
        for (size_t j = 0; j < k; j++)
            if (!isfinite(buf[j]))
                return (int64_t)(i + j);
    }
    return -1;
}

static mc_status check_tensor(fmt_peft_adapter *a, const fmt_st_tensor *t,
                              int ndim, mc_error *err)
{
    if (!fmt_dtype_is_float(t->dtype))
        return mc_fail(err, MC_ERR_UNSUPPORTED, a->st_path, t->name,
                       (int64_t)t->file_offset,
                       "dtype %s: adapter tensors must be F32, F16 or BF16",
                       fmt_dtype_name(t->dtype));
    if (ndim && t->ndim != ndim)
        return mc_fail(err, MC_ERR_SHAPE, a->st_path, t->name,
                       (int64_t)t->file_offset,
                       "expected a %d-dimensional tensor, got %d dimensions",
                       ndim, t->ndim);
    int64_t bad = first_nonfinite(t);
    if (bad >= 0)
        return mc_fail(err, MC_ERR_NONFINITE, a->st_path, t->name,
                       (int64_t)(t->file_offset +
                                 (uint64_t)bad * fmt_dtype_size(t->dtype)),
                       "element %lld is NaN or infinite: the adapter is "
                       "broken", (long long)bad);
    return MC_OK;
}

static int is_output_layer(const char *module)
{
    const char *dot = strrchr(module, '.');
    return strcmp(dot ? dot + 1 : module, "lm_head") == 0;
}

static mc_status check_module(fmt_peft_adapter *a, fmt_peft_module *m,
                              mc_error *err)
{
    const char *f = a->st_path;
    const char *an = m->kind == FMT_PEFT_EMBEDDING ? "lora_embedding_A"
                                                   : "lora_A";
    const char *bn = m->kind == FMT_PEFT_EMBEDDING ? "lora_embedding_B"
                                                   : "lora_B";
    if (!m->A || !m->B)
        return mc_fail(err, MC_ERR_NOT_FOUND, f, m->name, -1,
                       "module has %s but no %s", m->A ? an : bn,
                       m->A ? bn : an);
    mc_status st;
    if ((st = check_tensor(a, m->A, 2, err)) ||
        (st = check_tensor(a, m->B, 2, err)))
        return st;
    if (m->A->shape[0] != m->B->shape[1])
        return mc_fail(err, MC_ERR_SHAPE, f, m->name, -1,
                       "rank mismatch between A and B: %s has %llu rows, %s "
                       "has %llu columns", an,
                       (unsigned long long)m->A->shape[0], bn,
                       (unsigned long long)m->B->shape[1]);
    fmt_peft_module_params(&a->cfg, m->name, &m->r, &m->alpha, &m->scaling);
    if (m->A->shape[0] != m->r)
        return mc_fail(err, MC_ERR_SHAPE, f, m->name, -1,
                       "rank mismatch: %s has %llu rows but adapter_config "
                       "gives r = %u for this module (r / rank_pattern)",
                       an, (unsigned long long)m->A->shape[0], m->r);
    if (m->A->shape[0] == 0 || m->A->shape[1] == 0 || m->B->shape[0] == 0)
        return mc_fail(err, MC_ERR_SHAPE, f, m->name, -1,
                       "empty LoRA matrices");
    uint64_t out = m->B->shape[0];
    if (m->magnitude) {
        if (!a->cfg.use_dora)
            return mc_fail(err, MC_ERR_FORMAT, f, m->name, -1,
                           "lora_magnitude_vector present but use_dora is "
                           "false");
        if ((st = check_tensor(a, m->magnitude, 1, err)))
            return st;
        if (m->magnitude->shape[0] != out)
            return mc_fail(err, MC_ERR_SHAPE, f, m->name, -1,
                           "lora_magnitude_vector has %llu entries, expected "
                           "%llu (one per output feature)",
                           (unsigned long long)m->magnitude->shape[0],
                           (unsigned long long)out);
    } else if (a->cfg.use_dora) {
        return mc_fail(err, MC_ERR_NOT_FOUND, f, m->name, -1,
                       "use_dora is true but the module has no "
                       "lora_magnitude_vector");
    }
    if (m->b_bias) {
        if (!a->cfg.lora_bias)
            return mc_fail(err, MC_ERR_FORMAT, f, m->name, -1,
                           "lora_B.bias present but lora_bias is false");
        if (m->kind != FMT_PEFT_LINEAR)
            return mc_fail(err, MC_ERR_FORMAT, f, m->name, -1,
                           "lora_B.bias on an embedding");
        if ((st = check_tensor(a, m->b_bias, 1, err)))
            return st;
        if (m->b_bias->shape[0] != out)
            return mc_fail(err, MC_ERR_SHAPE, f, m->name, -1,
                           "lora_B.bias has %llu entries, expected %llu",
                           (unsigned long long)m->b_bias->shape[0],
                           (unsigned long long)out);
    }
    int linear = m->kind == FMT_PEFT_LINEAR && !is_output_layer(m->name);
    if (!fmt_peft_selects(&a->cfg, m->name, linear))
        return mc_fail(err, MC_ERR_FORMAT, f, m->name, -1,
                       "the adapter has weights for this module but "
                       "target_modules / exclude_modules / "
                       "layers_to_transform do not select it");
    return MC_OK;
}

/* A "<module>.base_layer.weight" key: PEFT writes one only for a module it
 * wraps with LoRA, so the adapter must have LoRA weights for it. */
static mc_status check_base_layer(fmt_peft_adapter *a,
                                  const fmt_peft_replace *r, mc_error *err)
{
    size_t n = strlen(r->tensor), stem;
    if (!r->base_layer || !ends_with(r->tensor, n, ".weight", &stem))
        return MC_OK;
    for (size_t i = 0; i < a->n_mods; i++)
        if (strlen(a->mods[i].name) == stem &&
            memcmp(a->mods[i].name, r->tensor, stem) == 0)
            return MC_OK;
    return mc_fail(err, MC_ERR_FORMAT, a->st_path, r->tensor, -1,
                   "base_layer weight present but the adapter has no LoRA "
                   "weights for this module (PEFT saves base_layer weights "
                   "only for modules it adapts)");
}

static int cmp_mod(const void *x, const void *y)
{
    return strcmp(((const fmt_peft_module *)x)->name,
                  ((const fmt_peft_module *)y)->name);
}

static int cmp_rep(const void *x, const void *y)
{
    return strcmp(((const fmt_peft_replace *)x)->tensor,
                  ((const fmt_peft_replace *)y)->tensor);
}

static mc_status open_into(fmt_peft_adapter *a, const char *dir, mc_error *err)
{
    mc_status st;
    if (!(a->dir = mc_strdup(dir)))
        return nomem(dir, err);
    char *cfg_path = join(dir, "adapter_config.json");
    if (!cfg_path)
        return nomem(dir, err);
    char *text = NULL;
    size_t len = 0;
    /* adapter configs are a few KiB */
    st = fmt_file_read(cfg_path, 16u << 20, "16 MiB", &text, &len, err);
    if (st == MC_OK)
        st = fmt_peft_config_parse(text, len, cfg_path, &a->cfg, err);
    mc_free(text);
    mc_free(cfg_path);
    if (st)
        return st;
    if (!(a->st_path = join(dir, "adapter_model.safetensors")))
        return nomem(dir, err);
    if ((st = fmt_st_open(a->st_path, &a->st, err)))
        return st;
    size_t n = fmt_st_count(a->st);
    if (n == 0)
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, NULL, -1,
                       "adapter has no tensors");
    for (size_t i = 0; i < n; i++)
        if ((st = map_key(a, fmt_st_get(a->st, i), err)))
            return st;
    for (size_t i = 0; i < a->n_mods; i++)
        if ((st = check_module(a, &a->mods[i], err)))
            return st;
    for (size_t i = 0; i < a->n_reps; i++)
        if ((st = check_tensor(a, a->reps[i].t, 0, err)) ||
            (st = check_base_layer(a, &a->reps[i], err)))
            return st;
    if (a->n_mods == 0 && a->n_reps == 0)
        return mc_fail(err, MC_ERR_FORMAT, a->st_path, NULL, -1,
                       "adapter has no LoRA modules and no replaced tensors "
                       "(%zu tensors, none of them lora_A/lora_B or a "
                       "modules_to_save copy)", n);
    if (a->n_mods)
        qsort(a->mods, a->n_mods, sizeof *a->mods, cmp_mod);
    if (a->n_reps)
        qsort(a->reps, a->n_reps, sizeof *a->reps, cmp_rep);
    return MC_OK;
}

mc_status fmt_peft_open(const char *dir, fmt_peft_adapter **out,
                        mc_error *err)
{
    if (!out || !dir)
        return mc_fail(err, MC_ERR_INVALID_ARG, dir, NULL, -1,
                       "NULL argument");
    *out = NULL;
    fmt_peft_adapter *a = mc_calloc(1, sizeof *a);
    if (!a)
        return nomem(dir, err);
    mc_status st = open_into(a, dir, err);
    if (st) {
        fmt_peft_close(a);
        return st;
    }
    *out = a;
    return MC_OK;
}

void fmt_peft_close(fmt_peft_adapter *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_mods; i++)
        mc_free(a->mods[i].name);
    mc_free(a->mods);
    for (size_t i = 0; i < a->n_reps; i++)
        mc_free(a->reps[i].tensor);
    mc_free(a->reps);
    fmt_st_close(a->st);
    fmt_peft_config_free(&a->cfg);
    mc_free(a->st_path);
    mc_free(a->dir);
    mc_free(a);
}

const char *fmt_peft_dir(const fmt_peft_adapter *a) { return a ? a->dir : NULL; }

const fmt_peft_config *fmt_peft_get_config(const fmt_peft_adapter *a)
{
    return a ? &a->cfg : NULL;
}

size_t fmt_peft_module_count(const fmt_peft_adapter *a)
{
    return a ? a->n_mods : 0;
}

const fmt_peft_module *fmt_peft_module_at(const fmt_peft_adapter *a, size_t i)
{
    return a && i < a->n_mods ? &a->mods[i] : NULL;
}

const fmt_peft_module *fmt_peft_find_module(const fmt_peft_adapter *a,
                                            const char *name)
{
    if (!a || !name)
        return NULL;
    fmt_peft_module key = {.name = (char *)name};
    return a->n_mods ? bsearch(&key, a->mods, a->n_mods, sizeof *a->mods,
                               cmp_mod)
                     : NULL;
}

size_t fmt_peft_replace_count(const fmt_peft_adapter *a)
{
    return a ? a->n_reps : 0;
}

const fmt_peft_replace *fmt_peft_replace_at(const fmt_peft_adapter *a,
                                            size_t i)
{
    return a && i < a->n_reps ? &a->reps[i] : NULL;
}

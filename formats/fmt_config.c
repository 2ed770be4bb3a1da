/* fmt_config.c - Hugging Face config.json for Llama, Mistral and Qwen2
 * (contract in fmt_config.h and docs/formats.md). */
#include "fmt_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmt_input.h"
#include "mc_alloc.h"
#include "mc_checked.h"

/* Upper bounds for counts.  Far above any released model, low enough that
 * products of two of them (vocab x hidden, heads x head_dim x layers) stay
 * far inside 64 bits and that a typo such as an extra digit is caught. */
#define MAX_HIDDEN (1u << 20)
#define MAX_FFN (1u << 22)
#define MAX_LAYERS 4096u
#define MAX_HEADS 4096u
#define MAX_HEAD_DIM 4096u
#define MAX_VOCAB (1u << 24)
#define MAX_POSITIONS (1ull << 32)
#define MAX_WINDOW (1ull << 32)

typedef struct parse_ctx {
    const char *name; /* file name for messages */
    mc_error *err;
} parse_ctx;

static mc_status bad(parse_ctx *p, mc_status st, const char *field,
                     const char *what)
{
    return mc_fail(p->err, st, p->name, field, -1, "%s", what);
}

/* Fetch key as an integer in [lo, hi].  Absent or null: *out = def and
 * *present = 0 (when present is non-NULL), or an error if required. */
static mc_status get_uint(parse_ctx *p, json_t *obj, const char *key,
                          uint64_t lo, uint64_t hi, int required,
                          uint64_t def, uint64_t *out, int *present)
{
    json_t *v = json_object_get(obj, key);
    if (present)
        *present = 0;
    if (!v || json_is_null(v)) {
        if (required)
            return mc_fail(p->err, MC_ERR_NOT_FOUND, p->name, key, -1,
                           "required field \"%s\" is missing", key);
        *out = def;
        return MC_OK;
    }
    if (!json_is_integer(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" = %lld is out of range [%llu, %llu]", key,
                       (long long)x, (unsigned long long)lo,
                       (unsigned long long)hi);
    *out = (uint64_t)x;
    if (present)
        *present = 1;
    return MC_OK;
}

/* Fetch key as a finite number (integer or real) in (lo, hi] unless
 * lo_inclusive.  Absent or null gives def. */
static mc_status get_num(parse_ctx *p, json_t *obj, const char *key,
                         double lo, double hi, double def, double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MC_OK;
    }
    if (!json_is_number(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || !(x > lo) || x > hi)
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" = %g is out of range (%g, %g]", key, x, lo, hi);
    *out = x;
    return MC_OK;
}

static mc_status get_bool(parse_ctx *p, json_t *obj, const char *key, int def,
                          int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return MC_OK;
    }
    if (!json_is_boolean(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return MC_OK;
}

static mc_status parse_arch(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    static const struct {
        const char *type, *archname;
        fmt_arch arch;
    } known[] = {
        {"llama", "LlamaForCausalLM", FMT_ARCH_LLAMA},
        {"mistral", "MistralForCausalLM", FMT_ARCH_MISTRAL},
        {"qwen2", "Qwen2ForCausalLM", FMT_ARCH_QWEN2},
    };
    const size_t nknown = sizeof known / sizeof known[0];
    json_t *mt = json_object_get(root, "model_type");
    const char *type = NULL;
    if (mt && !json_is_null(mt)) {
        if (!json_is_string(mt))
            return bad(p, MC_ERR_FORMAT, "model_type",
                       "\"model_type\" must be a string");
        type = json_string_value(mt);
        for (size_t i = 0; i < nknown; i++)
            if (strcmp(type, known[i].type) == 0) {
                c->arch = known[i].arch;
                snprintf(c->model_type, sizeof c->model_type, "%s", type);
                return MC_OK;
            }
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "model_type", -1,
                       "model_type \"%.64s\" is not supported (expected "
                       "llama, mistral or qwen2)", type);
    }
    /* Old configs without model_type: fall back on architectures[0]. */
    json_t *archs = json_object_get(root, "architectures");
    json_t *a0 = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    if (json_is_string(a0)) {
        for (size_t i = 0; i < nknown; i++)
            if (strcmp(json_string_value(a0), known[i].archname) == 0) {
                c->arch = known[i].arch;
                snprintf(c->model_type, sizeof c->model_type, "%s",
                         known[i].type);
                return MC_OK;
            }
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "architectures",
                       -1, "architecture \"%.64s\" is not supported (expected "
                       "Llama, Mistral or Qwen2)", json_string_value(a0));
    }
    return bad(p, MC_ERR_NOT_FOUND, "model_type",
               "required field \"model_type\" is missing");
}

static mc_status parse_dtype(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    const char *key = json_object_get(root, "dtype") ? "dtype" : "torch_dtype";
    json_t *v = json_object_get(root, key);
    c->torch_dtype = FMT_DT_INVALID;
    if (!v || json_is_null(v))
        return MC_OK;
    if (!json_is_string(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be a string", key);
    const char *s = json_string_value(v);
    if (strncmp(s, "torch.", 6) == 0)
        s += 6;
    if (strcmp(s, "float32") == 0 || strcmp(s, "float") == 0)
        c->torch_dtype = FMT_DT_F32;
    else if (strcmp(s, "float16") == 0 || strcmp(s, "half") == 0)
        c->torch_dtype = FMT_DT_F16;
    else if (strcmp(s, "bfloat16") == 0)
        c->torch_dtype = FMT_DT_BF16;
    else if (strcmp(s, "auto") != 0)
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, key, -1,
                       "%s \"%.32s\" is not supported (expected float32, "
                       "float16 or bfloat16)", key, s);
    return MC_OK;
}

/* rope_scaling or rope_parameters object (obj may be NULL/null). */
static mc_status parse_rope(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    fmt_rope *r = &c->rope;
    memset(r, 0, sizeof *r);
    r->type = FMT_ROPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    mc_status st;
    json_t *params = json_object_get(root, "rope_parameters");
    json_t *obj = params;
    const char *objname = "rope_parameters";
    if (!obj || json_is_null(obj)) {
        obj = json_object_get(root, "rope_scaling");
        objname = "rope_scaling";
    }
    double theta_top;
    if ((st = get_num(p, root, "rope_theta", 0.0, 1e12, 10000.0, &theta_top)))
        return st;
    r->theta = theta_top;
    if (!obj || json_is_null(obj))
        return MC_OK;
    if (!json_is_object(obj))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, objname, -1,
                       "\"%s\" must be an object or null", objname);
    if (obj == params) {
        parse_ctx q = *p;
        if ((st = get_num(&q, obj, "rope_theta", 0.0, 1e12, theta_top,
                          &r->theta)))
            return st;
    }
    json_t *t = json_object_get(obj, "rope_type");
    const char *tkey = "rope_type";
    if (!t) {
        t = json_object_get(obj, "type");
        tkey = "type";
    }
    const char *type = "default";
    if (t && !json_is_null(t)) {
        if (!json_is_string(t))
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, objname, -1,
                           "%s.%s must be a string", objname, tkey);
        type = json_string_value(t);
    } else if (obj != params) {
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, objname, -1,
                       "%s needs \"rope_type\" (or \"type\")", objname);
    }
    static const struct {
        const char *name;
        fmt_rope_type type;
    } types[] = {{"default", FMT_ROPE_DEFAULT}, {"linear", FMT_ROPE_LINEAR},
                 {"dynamic", FMT_ROPE_DYNAMIC}, {"yarn", FMT_ROPE_YARN},
                 {"llama3", FMT_ROPE_LLAMA3}};
    size_t i, n = sizeof types / sizeof types[0];
    for (i = 0; i < n; i++)
        if (strcmp(type, types[i].name) == 0)
            break;
    if (i == n)
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, objname, -1,
                       "rope type \"%.32s\" is not supported (expected "
                       "default, linear, dynamic, yarn or llama3)", type);
    r->type = types[i].type;
    if (r->type == FMT_ROPE_DEFAULT)
        return MC_OK;
    /* Field names below are reported inside the object, e.g.
     * "rope_scaling.factor". */
    char fname[64];
    snprintf(fname, sizeof fname, "%s.factor", objname);
    json_t *f = json_object_get(obj, "factor");
    if (!f || json_is_null(f))
        return mc_fail(p->err, MC_ERR_NOT_FOUND, p->name, fname, -1,
                       "rope type \"%s\" needs \"factor\"", type);
    if (!json_is_number(f) || !isfinite(json_number_value(f)) ||
        json_number_value(f) <= 0.0 || json_number_value(f) > 1e6)
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, fname, -1,
                       "\"factor\" must be a number in (0, 1e6]");
    r->factor = json_number_value(f);
    uint64_t omp = 0;
    int have_omp = 0;
    parse_ctx q = *p;
    if ((st = get_uint(&q, obj, "original_max_position_embeddings", 1,
                       MAX_POSITIONS, 0, 0, &omp, &have_omp)))
        return st;
    r->original_max_pos = omp;
    if (r->type == FMT_ROPE_LLAMA3) {
        if (!have_omp)
            return mc_fail(p->err, MC_ERR_NOT_FOUND, p->name,
                           "original_max_position_embeddings", -1,
                           "llama3 rope needs original_max_position_embeddings");
        if (!json_object_get(obj, "low_freq_factor") ||
            !json_object_get(obj, "high_freq_factor"))
            return mc_fail(p->err, MC_ERR_NOT_FOUND, p->name,
                           "low_freq_factor", -1,
                           "llama3 rope needs low_freq_factor and "
                           "high_freq_factor");
        if ((st = get_num(p, obj, "low_freq_factor", 0.0, 1e6, 1.0,
                          &r->low_freq_factor)) ||
            (st = get_num(p, obj, "high_freq_factor", 0.0, 1e6, 4.0,
                          &r->high_freq_factor)))
            return st;
        if (!(r->high_freq_factor > r->low_freq_factor))
            return bad(p, MC_ERR_FORMAT, "high_freq_factor",
                       "llama3 rope needs high_freq_factor > low_freq_factor");
    } else if (r->type == FMT_ROPE_YARN) {
        if ((st = get_num(p, obj, "beta_fast", 0.0, 1e6, 32.0,
                          &r->beta_fast)) ||
            (st = get_num(p, obj, "beta_slow", 0.0, 1e6, 1.0, &r->beta_slow)))
            return st;
        json_t *af = json_object_get(obj, "attention_factor");
        if (af && !json_is_null(af) &&
            (st = get_num(p, obj, "attention_factor", 0.0, 1e6, 0.0,
                          &r->attention_factor)))
            return st;
    }
    return MC_OK;
}

static mc_status parse_eos(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    json_t *v = json_object_get(root, "eos_token_id");
    c->n_eos = 0;
    if (!v || json_is_null(v))
        return MC_OK;
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > FMT_MAX_EOS)
            return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "eos_token_id",
                           -1, "%zu eos token ids, at most %d supported", n,
                           FMT_MAX_EOS);
        items = NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = items ? items[i] : json_array_get(v, i);
        if (!json_is_integer(e))
            return bad(p, MC_ERR_FORMAT, "eos_token_id",
                       "\"eos_token_id\" must be an integer or a list of "
                       "integers");
        json_int_t x = json_integer_value(e);
        if (x < 0 || (uint64_t)x >= c->vocab_size)
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, "eos_token_id", -1,
                           "eos token id %lld is outside the vocabulary "
                           "[0, %u)", (long long)x, c->vocab_size);
        c->eos_token_ids[c->n_eos++] = (int32_t)x;
    }
    return MC_OK;
}

static mc_status parse_shapes(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    mc_status st;
    uint64_t v;
    if ((st = get_uint(p, root, "hidden_size", 1, MAX_HIDDEN, 1, 0, &v, NULL)))
        return st;
    c->hidden_size = (uint32_t)v;
    if ((st = get_uint(p, root, "intermediate_size", 1, MAX_FFN, 1, 0, &v,
                       NULL)))
        return st;
    c->intermediate_size = (uint32_t)v;
    if ((st = get_uint(p, root, "num_hidden_layers", 1, MAX_LAYERS, 1, 0, &v,
                       NULL)))
        return st;
    c->num_layers = (uint32_t)v;
    if ((st = get_uint(p, root, "num_attention_heads", 1, MAX_HEADS, 1, 0, &v,
                       NULL)))
        return st;
    c->num_heads = (uint32_t)v;
    uint64_t kv_def = c->arch == FMT_ARCH_MISTRAL ? 8 : c->num_heads;
    if ((st = get_uint(p, root, "num_key_value_heads", 1, MAX_HEADS, 0, kv_def,
                       &v, NULL)))
        return st;
    c->num_kv_heads = (uint32_t)v;
    if (c->num_kv_heads > c->num_heads || c->num_heads % c->num_kv_heads)
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, "num_key_value_heads",
                       -1, "num_key_value_heads = %u must divide "
                       "num_attention_heads = %u", c->num_kv_heads,
                       c->num_heads);
    int have_hd = 0;
    if ((st = get_uint(p, root, "head_dim", 2, MAX_HEAD_DIM, 0, 0, &v,
                       &have_hd)))
        return st;
    if (!have_hd) {
        if (c->hidden_size % c->num_heads)
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, "hidden_size", -1,
                           "hidden_size = %u is not a multiple of "
                           "num_attention_heads = %u (and no head_dim given)",
                           c->hidden_size, c->num_heads);
        v = c->hidden_size / c->num_heads;
    }
    if (v < 2 || v > MAX_HEAD_DIM || v % 2)
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, "head_dim", -1,
                       "head_dim = %llu must be even and in [2, %u] (RoPE "
                       "rotates pairs)", (unsigned long long)v, MAX_HEAD_DIM);
    c->head_dim = (uint32_t)v;
    if ((st = get_uint(p, root, "vocab_size", 1, MAX_VOCAB, 1, 0, &v, NULL)))
        return st;
    c->vocab_size = (uint32_t)v;
    if ((st = get_uint(p, root, "max_position_embeddings", 1, MAX_POSITIONS, 0,
                       2048, &c->max_position_embeddings, NULL)))
        return st;
    /* With the bounds above, vocab*hidden and layers*heads*head_dim*hidden
     * fit easily; check the largest product anyway so a future bound change
     * cannot silently overflow. */
    uint64_t t;
    if (!mc_mul_u64((uint64_t)c->num_heads * c->head_dim, c->hidden_size, &t) ||
        !mc_mul_u64(t, c->num_layers, &t) ||
        !mc_mul_u64(c->vocab_size, c->hidden_size, &t))
        return bad(p, MC_ERR_OVERFLOW, "hidden_size",
                   "parameter count overflows 64 bits");
    return MC_OK;
}

static mc_status parse_root(parse_ctx *p, json_t *root, fmt_model_config *c)
{
    mc_status st;
    if (!json_is_object(root))
        return bad(p, MC_ERR_FORMAT, NULL, "config must be a JSON object");
    if ((st = parse_arch(p, root, c)) || (st = parse_shapes(p, root, c)))
        return st;
    double eps_def = c->arch == FMT_ARCH_MISTRAL ? 1e-5 : 1e-6;
    if ((st = get_num(p, root, "rms_norm_eps", 0.0, 1.0, eps_def,
                      &c->rms_norm_eps)))
        return st;
    if ((st = get_bool(p, root, "tie_word_embeddings", 0,
                       &c->tie_word_embeddings)))
        return st;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act)) {
        if (!json_is_string(act))
            return bad(p, MC_ERR_FORMAT, "hidden_act",
                       "\"hidden_act\" must be a string");
        if (strcmp(json_string_value(act), "silu") != 0)
            return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "hidden_act",
                           -1, "hidden_act \"%.32s\" is not supported "
                           "(expected silu)", json_string_value(act));
    }
    uint64_t v;
    switch (c->arch) {
    case FMT_ARCH_LLAMA:
        if ((st = get_bool(p, root, "attention_bias", 0, &c->qkv_bias)) ||
            (st = get_bool(p, root, "mlp_bias", 0, &c->mlp_bias)))
            return st;
        c->o_bias = c->qkv_bias;
        break;
    case FMT_ARCH_MISTRAL:
        if ((st = get_uint(p, root, "sliding_window", 1, MAX_WINDOW, 0, 4096,
                           &v, NULL)))
            return st;
        /* An explicit null means "no window" (Mistral v0.2 and later). */
        if (json_is_null(json_object_get(root, "sliding_window")))
            v = 0;
        c->sliding_window = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
        c->max_window_layers = 0;
        break;
    case FMT_ARCH_QWEN2: {
        c->qkv_bias = 1;
        int use_sw = 0;
        if ((st = get_bool(p, root, "use_sliding_window", 0, &use_sw)))
            return st;
        if (use_sw) {
            if ((st = get_uint(p, root, "sliding_window", 1, MAX_WINDOW, 0,
                               4096, &v, NULL)))
                return st;
            if (json_is_null(json_object_get(root, "sliding_window")))
                v = 0;
            c->sliding_window = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
            if ((st = get_uint(p, root, "max_window_layers", 0, MAX_LAYERS, 0,
                               28, &v, NULL)))
                return st;
            c->max_window_layers = (uint32_t)v;
        }
        break;
    }
    }
    if ((st = parse_rope(p, root, c)) || (st = parse_dtype(p, root, c)))
        return st;
    c->bos_token_id = -1;
    json_t *bos = json_object_get(root, "bos_token_id");
    if (bos && !json_is_null(bos)) {
        if ((st = get_uint(p, root, "bos_token_id", 0, c->vocab_size - 1, 0, 0,
                           &v, NULL)))
            return st;
        c->bos_token_id = (int32_t)v;
    }
    return parse_eos(p, root, c);
}

/* jansson reports most allocation failures as syntax errors ("string or
 * '}' expected"); when a small probe allocation fails as well, the parse
 * failed for lack of memory, not because the text is bad. */
static int fmt_json_oom(const json_error_t *je)
{
    if (json_error_code(je) == json_error_out_of_memory)
        return 1;
    void *probe = mc_malloc(64);
    mc_free(probe);
    return probe == NULL;
}

mc_status fmt_config_parse(const char *text, size_t len, const char *name,
                           fmt_model_config *out, mc_error *err)
{
    parse_ctx p = {name ? name : "config.json", err};
    if (!text || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, p.name, NULL, -1,
                       "NULL argument");
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (fmt_json_oom(&je))
            return mc_fail(err, MC_ERR_NOMEM, p.name, NULL, -1,
                           "out of memory parsing JSON");
        return mc_fail(err, MC_ERR_FORMAT, p.name, NULL, je.position,
                       "invalid JSON at line %d column %d: %s", je.line,
                       je.column, je.text);
    }
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    mc_status st = parse_root(&p, root, &c);
    json_decref(root);
    if (st == MC_OK)
        *out = c;
    return st;
}

mc_status fmt_config_load(const char *path, fmt_model_config *out,
                          mc_error *err)
{
    if (!path || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "NULL argument");
    FILE *f;
    mc_status ost = fmt_input_fopen(path, &f, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    /* A config.json is a few KiB; 16 MiB is a generous cap that keeps a
     * wrong path (a weights file) from being read whole. */
    const size_t cap = 16u << 20;
    char *buf = mc_malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    }
    size_t n = fread(buf, 1, cap + 1, f);
    int rerr = ferror(f);
    fclose(f);
    mc_status st;
    if (rerr)
        st = mc_fail(err, MC_ERR_IO, path, NULL, -1, "read failed");
    else if (n > cap)
        st = mc_fail(err, MC_ERR_FORMAT, path, NULL, -1,
                     "larger than 16 MiB: not a config.json");
    else
        st = fmt_config_parse(buf, n, path, out, err);
    mc_free(buf);
    return st;
}

uint32_t fmt_config_layer_window(const fmt_model_config *c, uint32_t layer)
{
    if (!c || c->sliding_window == 0 || layer < c->max_window_layers)
        return 0;
    return c->sliding_window;
}

uint64_t fmt_config_q_dim(const fmt_model_config *c)
{
    return c ? (uint64_t)c->num_heads * c->head_dim : 0;
}

uint64_t fmt_config_kv_dim(const fmt_model_config *c)
{
    return c ? (uint64_t)c->num_kv_heads * c->head_dim : 0;
}

static const char *rope_type_name(fmt_rope_type t)
{
    switch (t) {
    case FMT_ROPE_LINEAR: return "linear";
    case FMT_ROPE_DYNAMIC: return "dynamic";
    case FMT_ROPE_YARN: return "yarn";
    case FMT_ROPE_LLAMA3: return "llama3";
    default: return "default";
    }
}

/* Set key on obj, stealing v; returns 0 on failure (v is released). */
static int put(json_t *obj, const char *key, json_t *v)
{
    return v && json_object_set_new(obj, key, v) == 0;
}

static json_t *rope_to_json(const fmt_rope *r)
{
    json_t *o = json_object();
    int ok = o && put(o, "rope_type", json_string(rope_type_name(r->type))) &&
             put(o, "factor", json_real(r->factor));
    if (ok && r->original_max_pos)
        ok = put(o, "original_max_position_embeddings",
                 json_integer((json_int_t)r->original_max_pos));
    if (ok && r->type == FMT_ROPE_LLAMA3)
        ok = put(o, "low_freq_factor", json_real(r->low_freq_factor)) &&
             put(o, "high_freq_factor", json_real(r->high_freq_factor));
    if (ok && r->type == FMT_ROPE_YARN) {
        ok = put(o, "beta_fast", json_real(r->beta_fast)) &&
             put(o, "beta_slow", json_real(r->beta_slow));
        if (ok && r->attention_factor > 0)
            ok = put(o, "attention_factor", json_real(r->attention_factor));
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *fmt_config_to_json(const fmt_model_config *c)
{
    if (!c)
        return NULL;
    json_t *o = json_object();
    const char *dt = c->torch_dtype == FMT_DT_F32    ? "float32"
                     : c->torch_dtype == FMT_DT_F16  ? "float16"
                     : c->torch_dtype == FMT_DT_BF16 ? "bfloat16"
                                                     : NULL;
    int ok = o && put(o, "model_type", json_string(c->model_type)) &&
             put(o, "hidden_size", json_integer(c->hidden_size)) &&
             put(o, "intermediate_size", json_integer(c->intermediate_size)) &&
             put(o, "num_hidden_layers", json_integer(c->num_layers)) &&
             put(o, "num_attention_heads", json_integer(c->num_heads)) &&
             put(o, "num_key_value_heads", json_integer(c->num_kv_heads)) &&
             put(o, "head_dim", json_integer(c->head_dim)) &&
             put(o, "vocab_size", json_integer(c->vocab_size)) &&
             put(o, "max_position_embeddings",
                 json_integer((json_int_t)c->max_position_embeddings)) &&
             put(o, "rms_norm_eps", json_real(c->rms_norm_eps)) &&
             put(o, "hidden_act", json_string("silu")) &&
             put(o, "tie_word_embeddings",
                 json_boolean(c->tie_word_embeddings)) &&
             put(o, "rope_theta", json_real(c->rope.theta)) &&
             put(o, "rope_scaling", c->rope.type == FMT_ROPE_DEFAULT
                                        ? json_null()
                                        : rope_to_json(&c->rope));
    if (ok && c->arch == FMT_ARCH_LLAMA)
        ok = put(o, "attention_bias", json_boolean(c->qkv_bias)) &&
             put(o, "mlp_bias", json_boolean(c->mlp_bias));
    if (ok && c->arch == FMT_ARCH_MISTRAL)
        ok = put(o, "sliding_window", c->sliding_window
                                          ? json_integer(c->sliding_window)
                                          : json_null());
    if (ok && c->arch == FMT_ARCH_QWEN2) {
        ok = put(o, "use_sliding_window", json_boolean(c->sliding_window != 0));
        if (ok && c->sliding_window)
            ok = put(o, "sliding_window", json_integer(c->sliding_window)) &&
                 put(o, "max_window_layers",
                     json_integer(c->max_window_layers));
    }
    if (ok)
        ok = put(o, "torch_dtype", dt ? json_string(dt) : json_null());
    if (ok && c->bos_token_id >= 0)
        ok = put(o, "bos_token_id", json_integer(c->bos_token_id));
    if (ok && c->n_eos == 1)
        ok = put(o, "eos_token_id", json_integer(c->eos_token_ids[0]));
    else if (ok && c->n_eos > 1) {
        json_t *a = json_array();
        for (int i = 0; ok && a && i < c->n_eos; i++)
            ok = json_array_append_new(a, json_integer(c->eos_token_ids[i])) ==
                 0;
        ok = ok && put(o, "eos_token_id", a);
    }
    char *text = NULL;
    if (ok) {
        /* json_dumps allocates through jansson's allocator, which the
         * programs route to mc_malloc; copy so mc_free is always right. */
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
        if (s) {
            text = mc_strdup(s);
            json_free_t jfree;
            json_get_alloc_funcs(NULL, &jfree);
            jfree(s);
        }
    }
    json_decref(o);
    return text;
}

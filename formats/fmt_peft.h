/*
 * fmt_peft.h - PEFT LoRA adapters: adapter_config.json and
 * adapter_model.safetensors, read and validated, keys mapped to the base
 * model's module names.
 *
 * Files of an adapter directory:
 *   adapter_config.json        {"peft_type": "LORA", "r": 8, "lora_alpha": 16,
 *                               "target_modules": [...] | "regex" | "all-linear",
 *                               "exclude_modules", "layers_to_transform",
 *                               "layers_pattern", "rank_pattern",
 *                               "alpha_pattern", "use_rslora", "use_dora",
 *                               "fan_in_fan_out", "bias", "lora_bias",
 *                               "modules_to_save", "init_lora_weights",
 *                               "base_model_name_or_path", ...}
 *   adapter_model.safetensors  keys "base_model.model.<module>.<part>":
 *     lora_A.weight [r, in]     lora_B.weight [out, r]   (linear layers)
 *     lora_embedding_A [r, num_embeddings]   lora_embedding_B [dim, r]
 *     lora_magnitude_vector[.weight] [out] (DoRA; [dim] for embeddings)
 *     lora_B.bias [out]         (lora_bias = true)
 *     <module>.weight / <module>.bias, optionally written as
 *     <module>.modules_to_save.default.weight: full replacement tensors
 *     (modules_to_save, trained biases when bias != "none").
 *     <module>.base_layer.weight / .bias: the base layer of a LoRA module
 *     as PEFT saves it (the full embedding / lm_head weight of an
 *     embedding or output-layer LoRA; a trained bias with bias "all" or
 *     "lora_only"): loaded into the base layer, i.e. a replacement; a
 *     base_layer weight needs LoRA weights for the same module.
 *
 * Module selection follows PEFT's check_target_module_exists:
 *   target_modules list: a module matches if its name equals an entry or
 *   ends with "." + entry; a string is a regex that must match the whole
 *   name (POSIX ERE; \d \w \s are translated); "all-linear" selects every
 *   linear layer except the output layer (lm_head).  exclude_modules (same
 *   forms) wins.  layers_to_transform (int or list) keeps only modules whose
 *   name has ".<pattern>.<N>." with N listed (pattern from layers_pattern,
 *   else any component); it applies to list targets only, as in PEFT.
 *   rank_pattern / alpha_pattern: the first key k (in file order) for which
 *   the module name matches "(.*\.)?(k)$" gives r / alpha.
 *   scaling = alpha / r, or alpha / sqrt(r) with use_rslora.
 *
 * fmt_peft_open() validates everything that does not need the base model:
 * config fields and types; refuses init_lora_weights of pissa / olora /
 * corda / loftq / lora_ga (such adapters change the base at init and are
 * valid only if converted when saved); every tensor key maps to a known
 * part; A and B present in pairs with rank agreement (A rows == B cols ==
 * r of the module); the module is selected by target_modules; float
 * dtypes only; every value finite.  Matching against the base (module
 * present, shapes) is the merge's job (compiler/cmp_merge.h).
 */
#ifndef FMT_PEFT_H
#define FMT_PEFT_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_safetensors.h"
#include "mc_error.h"

typedef enum fmt_peft_bias {
    FMT_PEFT_BIAS_NONE = 0,
    FMT_PEFT_BIAS_ALL,        /* every bias of the model was trained */
    FMT_PEFT_BIAS_LORA_ONLY,  /* biases of adapted layers were trained */
} fmt_peft_bias;

/* A regex -> value pair of rank_pattern / alpha_pattern. */
typedef struct fmt_peft_pattern {
    char *key;     /* regex, as in the file */
    double value;  /* r (integer) or alpha */
} fmt_peft_pattern;

/* A module selector: a list of names, a regex, or all linear layers. */
typedef struct fmt_peft_select {
    int present;     /* 0: field absent or null (selects nothing) */
    int all_linear;  /* "all-linear" */
    char *regex;     /* string form (full match), or NULL */
    char **names;    /* list form: exact or ".name" suffix */
    size_t n_names;
} fmt_peft_select;

/* adapter_config.json, parsed.  All strings and arrays are owned
 * (fmt_peft_config_free). */
typedef struct fmt_peft_config {
    uint32_t r;                     /* default rank */
    double lora_alpha;              /* default alpha (PEFT default 8) */
    int use_rslora, use_dora;
    int fan_in_fan_out;             /* base stores weights [in, out] */
    int lora_bias;                  /* lora_B has a bias */
    fmt_peft_bias bias;
    fmt_peft_select target;         /* target_modules */
    fmt_peft_select exclude;        /* exclude_modules */
    int64_t *layers;                /* layers_to_transform, or NULL */
    size_t n_layers;
    char **layers_pattern;          /* NULL: any ".<name>.<N>." component */
    size_t n_layers_pattern;
    fmt_peft_pattern *rank_pattern; /* in file order */
    size_t n_rank_pattern;
    fmt_peft_pattern *alpha_pattern;
    size_t n_alpha_pattern;
    char **modules_to_save;
    size_t n_modules_to_save;
    char base_model[512];           /* base_model_name_or_path, "" if none */
    char init[32];                  /* init_lora_weights as text ("true") */
} fmt_peft_config;

/* Parse adapter_config.json text (len bytes).  name is used in errors.
 * On success *out owns its strings (fmt_peft_config_free); on failure *out
 * is left empty (safe to free). */
mc_status fmt_peft_config_parse(const char *text, size_t len, const char *name,
                                fmt_peft_config *out, mc_error *err);
void fmt_peft_config_free(fmt_peft_config *c); /* NULL is a no-op */

/* 1 if module (e.g. "model.layers.0.self_attn.q_proj") is selected by
 * target_modules / exclude_modules / layers_to_transform.  is_linear says
 * whether it is a linear layer other than the output layer (for
 * "all-linear"). */
int fmt_peft_selects(const fmt_peft_config *c, const char *module,
                     int is_linear);
/* r, alpha and scaling of module after rank_pattern / alpha_pattern. */
void fmt_peft_module_params(const fmt_peft_config *c, const char *module,
                            uint32_t *r, double *alpha, double *scaling);

typedef enum fmt_peft_kind {
    FMT_PEFT_LINEAR = 0,   /* lora_A/lora_B on an nn.Linear */
    FMT_PEFT_EMBEDDING,    /* lora_embedding_A/B on an nn.Embedding */
} fmt_peft_kind;

/* One adapted module. */
typedef struct fmt_peft_module {
    char *name;                     /* base module path, without ".weight" */
    fmt_peft_kind kind;
    const fmt_st_tensor *A;         /* [r, in] (embedding: [r, num_embeddings]) */
    const fmt_st_tensor *B;         /* [out, r] (embedding: [dim, r]) */
    const fmt_st_tensor *magnitude; /* DoRA [out] ([dim]), or NULL */
    const fmt_st_tensor *b_bias;    /* lora_B.bias [out], or NULL */
    uint32_t r;                     /* rank (rows of A) */
    double alpha;
    double scaling;                 /* alpha/r or alpha/sqrt(r) */
} fmt_peft_module;

/* A full tensor that replaces the base tensor of the same name. */
typedef struct fmt_peft_replace {
    char *tensor;                   /* base tensor name ("lm_head.weight") */
    const fmt_st_tensor *t;
    int base_layer;                 /* saved as <module>.base_layer.<part> */
} fmt_peft_replace;

typedef struct fmt_peft_adapter fmt_peft_adapter;

/* Open and validate adapter directory dir (see the checks above).  *out is
 * owned by the caller (fmt_peft_close); tensors are views into the mapped
 * adapter_model.safetensors and live as long as the adapter. */
mc_status fmt_peft_open(const char *dir, fmt_peft_adapter **out,
                        mc_error *err);
void fmt_peft_close(fmt_peft_adapter *a); /* NULL is a no-op */

const char *fmt_peft_dir(const fmt_peft_adapter *a);
const fmt_peft_config *fmt_peft_get_config(const fmt_peft_adapter *a);
/* Adapted modules, sorted by name (borrowed). */
size_t fmt_peft_module_count(const fmt_peft_adapter *a);
const fmt_peft_module *fmt_peft_module_at(const fmt_peft_adapter *a,
                                          size_t i);
/* Module by name, or NULL. */
const fmt_peft_module *fmt_peft_find_module(const fmt_peft_adapter *a,
                                            const char *name);
/* Replacement tensors, sorted by tensor name (borrowed). */
size_t fmt_peft_replace_count(const fmt_peft_adapter *a);
const fmt_peft_replace *fmt_peft_replace_at(const fmt_peft_adapter *a,
                                            size_t i);

#endif /* FMT_PEFT_H */

/*
 * fmt_config.h - Hugging Face config.json for Llama, Mistral and Qwen2.
 *
 * Parses the fields listed in docs/formats.md with their documented
 * defaults:
 *   num_key_value_heads  llama/qwen2: = num_attention_heads; mistral: 8
 *   head_dim             hidden_size / num_attention_heads (must divide)
 *   rms_norm_eps         llama 1e-6, mistral 1e-5, qwen2 1e-6
 *   tie_word_embeddings  false
 *   rope_theta           10000 (mistral/qwen2 configs always give it)
 *   attention_bias/mlp_bias (llama only); qwen2: q/k/v bias always, o never
 *   sliding window       mistral: "sliding_window" (null = none);
 *                        qwen2: only if use_sliding_window, and only for
 *                        layers >= max_window_layers
 * RoPE scaling comes from "rope_scaling" (key "rope_type" or older "type")
 * or from "rope_parameters" (newer configs, which also hold rope_theta).
 * hidden_act must be "silu".  Every count is checked for range (non-zero,
 * divisibility, products fit in 64 bits) and errors name the field.
 */
#ifndef FMT_CONFIG_H
#define FMT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_dtype.h"
#include "mc_error.h"

typedef enum fmt_arch {
    FMT_ARCH_LLAMA = 0,
    FMT_ARCH_MISTRAL = 1,
    FMT_ARCH_QWEN2 = 2,
} fmt_arch;

typedef enum fmt_rope_type {
    FMT_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i/d) */
    FMT_ROPE_LINEAR,      /* positions divided by factor */
    FMT_ROPE_DYNAMIC,     /* NTK-aware theta growth past original max */
    FMT_ROPE_YARN,
    FMT_ROPE_LLAMA3,
} fmt_rope_type;

typedef struct fmt_rope {
    fmt_rope_type type;
    double theta;                 /* base, rope_theta */
    double factor;                /* scaling factor (1 if none) */
    double low_freq_factor;       /* llama3 */
    double high_freq_factor;      /* llama3 */
    uint64_t original_max_pos;    /* llama3/yarn/dynamic; 0 = max_position */
    double beta_fast, beta_slow;  /* yarn (defaults 32, 1) */
    double attention_factor;      /* yarn mscale; 0 = derive from factor */
} fmt_rope;

#define FMT_MAX_EOS 8

typedef struct fmt_model_config {
    fmt_arch arch;
    char model_type[32];          /* "llama", "mistral", "qwen2" */
    uint32_t hidden_size;         /* d_model */
    uint32_t intermediate_size;   /* FFN width */
    uint32_t num_layers;          /* num_hidden_layers */
    uint32_t num_heads;           /* query heads */
    uint32_t num_kv_heads;        /* key/value heads (GQA when < num_heads) */
    uint32_t head_dim;            /* per-head width */
    uint32_t vocab_size;
    uint64_t max_position_embeddings;
    double rms_norm_eps;
    int tie_word_embeddings;      /* 1: output layer is embed_tokens */
    int qkv_bias;                 /* q/k/v projections have biases */
    int o_bias;                   /* o_proj has a bias */
    int mlp_bias;                 /* gate/up/down have biases */
    fmt_rope rope;
    uint32_t sliding_window;      /* tokens; 0 = full attention */
    uint32_t max_window_layers;   /* window applies to layers >= this */
    fmt_dtype torch_dtype;        /* declared dtype (F32/F16/BF16), or INVALID */
    int32_t bos_token_id;         /* -1 if absent */
    int32_t eos_token_ids[FMT_MAX_EOS];
    int n_eos;
} fmt_model_config;

/* Parse config text (len bytes, need not be NUL-terminated).  name is the
 * file name for messages. */
mc_status fmt_config_parse(const char *text, size_t len, const char *name,
                           fmt_model_config *out, mc_error *err);
/* Read and parse a config.json file. */
mc_status fmt_config_load(const char *path, fmt_model_config *out,
                          mc_error *err);
/* Sliding window (tokens) of layer, or 0 for full attention. */
uint32_t fmt_config_layer_window(const fmt_model_config *c, uint32_t layer);
/* q/kv output widths: num_heads*head_dim and num_kv_heads*head_dim. */
uint64_t fmt_config_q_dim(const fmt_model_config *c);
uint64_t fmt_config_kv_dim(const fmt_model_config *c);
/* Serialize the parsed config back to JSON text (HF field names, for the
 * artifact manifest).  Caller frees with mc_free. */
char *fmt_config_to_json(const fmt_model_config *c);

#endif /* FMT_CONFIG_H */

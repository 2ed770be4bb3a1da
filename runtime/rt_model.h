/*
 * rt_model.h - a loaded model the runtime can run: config plus read-only
 * weight views, in the style of llama2.c's TransformerWeights.
 *
 * The struct is public and filled by two loaders:
 *   rt_model_open_hf        (rt_model.c)    a Hugging Face directory or
 *                           .safetensors file; F32/F16/BF16 matrices are
 *                           used in place through the mmap (no copy)
 *   rt_model_open_artifact  (rt_artifact.c) an mcompile artifact; matrices
 *                           are views into its sections (Q8/Q4/...)
 * rt_model_open dispatches on the path (the one place to add formats).
 *
 * Invariants: every kn_matrix points into memory kept alive by `owner`
 * (or into `owned`); norms and biases are float32 in `owned` (converted
 * from bf16/f16 once at load); lm_head equals embed when tied.  The model is
 * immutable after loading and may be shared by several sessions.  Loading
 * allocates; nothing that runs tokens does.
 */
#ifndef RT_MODEL_H
#define RT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_config.h"
#include "kn_block.h"
#include "kn_ops.h"
#include "mc_error.h"
#include "rt_layout.h"
#include "rt_plan.h"

typedef struct rt_layer {
    kn_block_weights w;        /* views; norms/biases point into owned */
    kn_block_dims dims;        /* shape incl. this layer's window */
} rt_layer;

typedef struct rt_model {
    fmt_model_config cfg;      /* parsed config (arch, shapes, rope, eos) */
    kn_matrix embed;           /* [vocab][hidden] embed_tokens */
    rt_layer *layers;          /* [num_layers], owned (mc_free) */
    const float *final_norm;   /* [hidden] model.norm, into owned */
    kn_matrix lm_head;         /* [vocab][hidden]; == embed when tied */
    float *owned;              /* f32 norms+biases (+ any copied matrix),
                                  one mc_malloc block, owned */
    uint64_t owned_floats;     /* size of owned in floats */
    void *owner;               /* keeps weight bytes alive (fmt_model*,
                                  artifact mapping, ...) */
    void (*owner_free)(void *owner); /* releases owner; NULL = nothing */
    uint64_t weight_bytes;     /* bytes of all matrices read per token
                                  (embed row excluded, lm_head included) */
    int has_plan;              /* 1: plan came with the model (artifact);
                                  sessions default to its layout */
    rt_plan plan;              /* valid when has_plan, checked by
                                  rt_plan_from_json: the layout with its
                                  limits, weights, reserve and total bytes,
                                  and plan.cuda (run on the CUDA backend) */
    char path[1024];           /* what was opened, for messages */
} rt_model;

/* Open a model from path: today a Hugging Face directory, a .safetensors
 * file with config.json beside it, or an index.json.  (Artifacts: check the
 * magic here and call rt_model_open_artifact.)  *out owned by the caller,
 * released with rt_model_free. */
mc_status rt_model_open(const char *path, rt_model **out, mc_error *err);
/* rt_model_open with flags for an artifact (RT_ART_*, rt_artifact.h; a
 * Hugging Face checkpoint ignores them). */
mc_status rt_model_open_ex(const char *path, unsigned flags, rt_model **out,
                           mc_error *err);

/* Hugging Face checkpoint (see fmt_model.h for what path may be).  Checks
 * every tensor's presence, dtype (F32/F16/BF16) and shape against the
 * config; errors name the tensor.  Matrices with a misaligned data pointer
 * are copied into owned float32 (rare: writers align to 8). */
mc_status rt_model_open_hf(const char *path, rt_model **out, mc_error *err);

/* Release everything (owner_free(owner), owned, layers, the struct).
 * NULL is a no-op.  Works for any loader that filled the fields above. */
void rt_model_free(rt_model *m);

/* Total parameters (matrix elements + norm/bias floats). */
uint64_t rt_model_param_count(const rt_model *m);

/* Helper for loaders: dims of layer l from the config. */
void rt_model_layer_dims(const fmt_model_config *cfg, uint32_t layer,
                         kn_block_dims *out);

#endif /* RT_MODEL_H */

/*
 * ref_forward.h - an independent double-precision forward pass for tests.
 *
 * The yardstick every optimized path (kernels, runtime, CUDA, quantized
 * artifacts) is compared against.  It shares no math with kernels/ or
 * runtime/: plain C loops in double, weights decoded from the safetensors
 * bytes by this file (F32/F16/BF16), RoPE frequencies computed here from
 * the formulas of transformers' modeling_rope_utils.  Only the file and
 * config parsing (fmt_model, fmt_config) are shared with the product.
 *
 * Model semantics (Hugging Face Llama / Mistral / Qwen2):
 *   x = embed[id]
 *   per layer: h = rmsnorm(x) * w_in;  q,k,v = W h (+ bias)
 *              RoPE on q, k in rotate_half layout (dim i pairs with i+d/2)
 *              GQA: query head h reads kv head h / (heads / kv_heads)
 *              causal softmax(q.k / sqrt(head_dim)) over positions j with
 *              j <= i and, for a layer with window W > 0, j > i - W
 *              (the last W tokens including i: transformers' masks)
 *              x += Wo attn (+ bias)
 *              x += Wd (silu(Wg h2) * Wu h2) (+ biases), h2 = rmsnorm(x) * w
 *   logits = lm_head rmsnorm(x) * w_final (lm_head = embed when tied)
 *   rmsnorm(x) = x / sqrt(mean(x^2) + eps)
 * RoPE types: default, linear, dynamic, yarn, llama3.  yarn multiplies cos
 * and sin by its attention factor (so scores by its square).  dynamic NTK
 * depends on the sequence length the way transformers' full forward does:
 * positions fed together in one call use seq_len = (last position + 1),
 * floored at max_position_embeddings; feeding one token at a time gives
 * each token the frequencies for its own length (transformers' generate
 * with a KV cache).  For every other type the split does not matter.
 *
 * Not thread-safe per cache; a model may be shared read-only by threads.
 * Load failures print the reason to stderr (this is a test helper).
 */
#ifndef TESTS_REF_FORWARD_H
#define TESTS_REF_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_config.h"

typedef struct tu_ref_model tu_ref_model;
typedef struct tu_ref_cache tu_ref_cache;

/* Load a model directory (or anything fmt_model_open accepts): config via
 * fmt_config, every weight converted to double and shape-checked against
 * the config.  Returns NULL (after printing why) on failure.  Caller frees
 * with tu_ref_free. */
tu_ref_model *tu_ref_load(const char *dir);
void tu_ref_free(tu_ref_model *m); /* NULL is a no-op */

size_t tu_ref_vocab(const tu_ref_model *m);
const fmt_model_config *tu_ref_config(const tu_ref_model *m); /* borrowed */

/* The weights as doubles, by Hugging Face tensor name (row-major, [out, in]
 * for linears), writable so a test can perturb or replace them; NULL if
 * the model has no such tensor.  *nelem (if non-NULL) gets the count. */
double *tu_ref_tensor(tu_ref_model *m, const char *name, size_t *nelem);

/* Full sequence from position 0: logits[n][vocab] for every position.
 * Aborts the test process (after printing why) on allocation failure or
 * an id outside [0, vocab): a test must not go on with garbage. */
void tu_ref_forward(const tu_ref_model *m, const int32_t *ids, size_t n,
                    double *logits);

/* Incremental use: a KV cache for up to max_tokens positions. */
tu_ref_cache *tu_ref_cache_create(const tu_ref_model *m, size_t max_tokens);
void tu_ref_cache_free(tu_ref_cache *c); /* NULL is a no-op */
size_t tu_ref_cache_len(const tu_ref_cache *c); /* positions fed so far */
/* Feed n tokens at positions len .. len+n-1 (see dynamic RoPE above).
 * logits: [n][vocab], or NULL when not needed.  Returns 0, or -1 if the
 * cache would overflow or an id is outside [0, vocab). */
int tu_ref_feed(const tu_ref_model *m, tu_ref_cache *c, const int32_t *ids,
                size_t n, double *logits);

/* Greedy decoding: feed prompt[0..n_prompt), then n_new argmax steps
 * (ties: lowest id).  out gets the n_new generated ids.  Returns 0 or -1. */
int tu_ref_greedy(const tu_ref_model *m, const int32_t *prompt,
                  size_t n_prompt, size_t n_new, int32_t *out);

/* The RoPE tables the reference uses for a chunk ending at seq_len
 * positions: inv_freq[head_dim/2] (radians per position) and the factor
 * cos and sin are multiplied by (yarn's attention factor, else 1). */
void tu_ref_rope_freqs(const tu_ref_model *m, size_t seq_len,
                       double *inv_freq, double *mult);

/* Index of the largest of v[0..n) (lowest index on ties). */
size_t tu_ref_argmax(const double *v, size_t n);

#endif /* TESTS_REF_FORWARD_H */

/*
 * cmp_merge.h - merging PEFT LoRA adapters into base weights, as PEFT's
 * merge_and_unload does, one tensor at a time.
 *
 * A cmp_merge is a TENSOR SOURCE: after cmp_merge_open() every tensor of
 * the merged model (base tensors, plus lm_head.weight when a tied lm_head
 * receives a delta) can be asked for as float32 with cmp_merge_tensor_f32(),
 * so the compile pipeline can quantize merged weights without writing them
 * to disk; cmp_merge_write() streams the same values into a model directory
 * that mirrors the input.
 *
 * Semantics per base tensor W (values computed in double and rounded
 * once, to nearest even, to the output dtype: float32, or bf16/f16
 * directly from the double), adapters applied in the order given, each
 * with coef = weight x scaling:
 *   plain LoRA      W += coef * (B @ A)            W is [out, in]
 *   fan_in_fan_out  W += coef * (B @ A)^T          when W is stored [in, out]
 *                   (a base stored [out, in] is an nn.Linear, for which PEFT
 *                   ignores the flag; so do we)
 *   embedding       W += coef * (B @ A)^T          W is [num_embeddings, dim]
 *   DoRA            V = W0 + delta; W = (W - W0) + (m / ||V||) * V, the
 *                   norm taken per output feature (rows of [out, in];
 *                   columns of embeddings and of [in, out] weights),
 *                   m = lora_magnitude_vector, W0 = the base after any
 *                   replacement: a DoRA adapter normalises only its own
 *                   delta, as PEFT 0.21 does in its forward and its merge
 *   lora_B.bias     bias += coef * lora_B.bias
 *   replacement     W = modules_to_save tensor / trained bias / a changed
 *                   <module>.base_layer copy (must be the first change of
 *                   its tensor; weights do not apply; an unchanged
 *                   base_layer copy is no change)
 * Several plain adapters therefore sum their deltas exactly.
 * A tied model (tie_word_embeddings, no lm_head.weight) is untied when
 * lm_head receives a delta (lm_head.weight = embed_tokens + delta), or when
 * embed_tokens is replaced by modules_to_save or receives a delta
 * (lm_head.weight = the original embedding, as PEFT's forward uses it):
 * lm_head.weight is written after embed_tokens in its shard and
 * config.json gets tie_word_embeddings = false.
 *
 * Open refuses (nothing is computed yet): an adapter module missing from
 * the base (names the first few, with a hint about prefixes); shapes that
 * do not fit the base tensor; non-float base tensors; a replacement after
 * another change.  Adapter-level checks (rank agreement, non-finite values,
 * unsupported init) happen in fmt_peft_open().
 *
 * Memory: the base and adapters are mapped; computing a tensor holds its
 * adapters' A/B (as double), O(8 rows) scratch per thread, and the
 * caller's output.  The writer streams rows in chunks of a few MiB and
 * drops mapped pages it has consumed, so peak RSS stays near one chunk,
 * not the model.  Rows are computed on every CPU the process may use
 * (kn_cpus.h; 16-row blocks taken in turn; AVX-512 where the CPU has it,
 * MC_NO_AVX512=1 for AVX2);
 * the result does not depend on the number of threads or the CPU's SIMD.
 * Writeback to disk starts as the shards are written (fmt_atomic), so the
 * commit does not wait for a whole shard.
 * The writer reads its shards back before committing (check sums on all
 * row threads): every changed tensor must hold exactly the bytes
 * computed for it.
 */
#ifndef CMP_MERGE_H
#define CMP_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_peft.h"
#include "mc_error.h"

typedef struct cmp_adapter_spec {
    const char *dir; /* adapter directory (adapter_config.json + weights) */
    double weight;   /* multiplies the adapter's scaling; 1.0 = as trained */
} cmp_adapter_spec;

typedef struct cmp_merge_report {
    size_t tensors;          /* tensors in the merged model */
    size_t tensors_touched;  /* tensors changed by some adapter */
    size_t adapters;         /* adapters applied */
    size_t lora_modules;     /* LoRA modules applied, over all adapters */
    size_t replaced;         /* tensors replaced (modules_to_save, biases) */
    int untied_lm_head;      /* 1 if lm_head.weight was written out */
    double max_abs_delta;    /* max |merged - base| (float32 values) */
    uint64_t bytes_written;  /* bytes of all output files */
    double seconds;          /* wall time of cmp_merge_write */
} cmp_merge_report;

typedef struct cmp_merge cmp_merge;

/* Open the adapters (fmt_peft_open) and match them against base, which is
 * borrowed and must outlive the merge.  Returns MC_OK and *out (caller
 * closes it with cmp_merge_close) or an error with nothing allocated. */
mc_status cmp_merge_open(const fmt_model *base, const cmp_adapter_spec *adapters,
                         size_t n, cmp_merge **out, mc_error *err);
void cmp_merge_close(cmp_merge *m); /* NULL is a no-op */

/* Tensors of the merged model in output order (base shard order, then
 * data order; an untied lm_head right after embed_tokens' shard tensors). */
size_t cmp_merge_tensor_count(const cmp_merge *m);
const char *cmp_merge_tensor_name(const cmp_merge *m, size_t i);
/* Shape and base dtype of a tensor; 0 if name is not in the merged model.
 * *touched (may be NULL) says whether an adapter changes it. */
int cmp_merge_tensor_info(const cmp_merge *m, const char *name,
                          fmt_dtype *dtype, int *ndim, uint64_t *shape,
                          int *touched);
/* Merged float32 values of tensor name (touched or not) into out, which
 * holds the tensor's element count.  Float tensors only. */
mc_status cmp_merge_tensor_f32(cmp_merge *m, const char *name, float *out,
                               mc_error *err);
/* 1 if the tied lm_head gets written out (untied). */
int cmp_merge_unties_lm_head(const cmp_merge *m);

/* Progress of cmp_merge_write: called after each tensor with the output
 * tensor bytes done so far and their total.  fn may be NULL (none). */
typedef void (*cmp_merge_progress_fn)(uint64_t done, uint64_t total,
                                      void *ctx);
void cmp_merge_set_progress(cmp_merge *m, cmp_merge_progress_fn fn, void *ctx);

/* Write the merged model to out_dir (atomically: a failure or a signal
 * leaves any previous out_dir intact and no temporary files).  out_dtype:
 * FMT_DT_INVALID keeps each tensor's dtype, else F32/F16/BF16 for every
 * float tensor.  Refuses an out_dir that is, contains or lies inside the
 * base or an adapter directory.  report (may be NULL) is filled on success. */
mc_status cmp_merge_write(cmp_merge *m, const char *out_dir,
                          fmt_dtype out_dtype, cmp_merge_report *report,
                          mc_error *err);

#endif /* CMP_MERGE_H */

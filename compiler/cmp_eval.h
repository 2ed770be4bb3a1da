/*
 * cmp_eval.h - quantization quality: a reference model and a quantized one
 * over the same tokens: KLD, top-1 agreement, perplexities
 * (docs/quantization.md, "Quality report").
 *
 * Two parts:
 *  - cmp_fwd: a sequence forward pass over an rt_model built from the
 *    runtime's own pieces (kn_block_forward for every block, the same
 *    kernels and KV layout), with the three stages exposed separately so the
 *    calibration driver can run the model one block at a time:
 *    embed -> block 0..L-1 -> head (final norm + lm_head).
 *  - cmp_eval_acc: per position, p = softmax(ref logits), q = softmax(quant
 *    logits) in double via log-softmax; KL(p || q) = sum p (log p - log q);
 *    top-1 agreement (same argmax); NLL of the actual next token under each
 *    (perplexity = exp(mean NLL)).  Positions without a next token (the last
 *    of a sequence) are not scored.  kld_p99 is the nearest-rank 99th
 *    percentile.
 */
#ifndef CMP_EVAL_H
#define CMP_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "mc_error.h"
#include "rt_model.h"

/* ---- forward pass -------------------------------------------------------- */

typedef struct cmp_fwd cmp_fwd;

/* A forward context for sequences of up to max_T tokens on model m
 * (borrowed; must outlive the context).  pool may be NULL (one thread). */
mc_status cmp_fwd_create(const rt_model *m, size_t max_T, kn_pool *pool,
                         cmp_fwd **out, mc_error *err);
void cmp_fwd_free(cmp_fwd *f); /* NULL is a no-op */
/* Bytes cmp_fwd_create allocates for a model of config c, sequences of up
 * to max_T tokens and a pool of `threads` threads (1 without a pool). */
uint64_t cmp_fwd_bytes(const fmt_model_config *c, size_t max_T, int threads);

/* x [T][hidden] = embedding rows of tok[0..T).  Token ids out of range give
 * MC_ERR_INVALID_ARG naming the position. */
mc_status cmp_fwd_embed(cmp_fwd *f, const int32_t *tok, size_t T, float *x,
                        mc_error *err);
/* Run one block (weights w, dims d) over one sequence x [T][hidden] at
 * positions 0..T-1 with a fresh KV cache, in place; tap as in kn_block.h. */
void cmp_fwd_block(cmp_fwd *f, const kn_block_weights *w,
                   const kn_block_dims *d, float *x, size_t T, kn_tap_fn tap,
                   void *tap_ctx);
/* The same, returning right after the tap at point stop - 1 (stop: 1 + a
 * kn_tap_point; 0 = the whole block): x is then partly updated.  For a
 * statistics pass that needs no later input. */
void cmp_fwd_block_until(cmp_fwd *f, const kn_block_weights *w,
                         const kn_block_dims *d, float *x, size_t T,
                         kn_tap_fn tap, void *tap_ctx, int stop);
/* 1: the block passes below also call their tap with down's output
 * (KN_TAP_DOWN_OUT, kn_block.h); 0 (the default): not. */
void cmp_fwd_set_down_out(cmp_fwd *f, int on);
/* 1: the block passes below multiply quantized matrices by bfloat16-
 * rounded activations (kn_block_scratch.bf16_dot: the calibration's
 * quantized pass); 2: f32 matrices too, their weights rounded to bfloat16;
 * 0 (the default): float activations. */
void cmp_fwd_set_bf16_dot(cmp_fwd *f, int level);
/* Y = X W^T + bias for T <= max_T rows of X [T][W->cols], W->cols <= the
 * model's intermediate size: a block's linear as cmp_fwd_block runs it. */
void cmp_fwd_linear(cmp_fwd *f, const kn_matrix *W, const float *X, size_t T,
                    float *Y, const float *bias);

/* The same from point start (kn_block_scratch.tap_start: 0 = the block's
 * input; 1 + KN_TAP_O_IN: x is the block's input and att holds the
 * attention output of an earlier pass of the same q/k/v weights over the
 * same x; 1 + KN_TAP_GATE_UP_IN: x is the residual after the attention,
 * as a pass stopped at that tap leaves it) to stop.  att, when not NULL,
 * is where the attention output [T][q_dim] lives: written when the pass
 * computes it, read when it starts at o.  Same bits as the whole pass. */
void cmp_fwd_block_span(cmp_fwd *f, const kn_block_weights *w,
                        const kn_block_dims *d, float *x, size_t T,
                        kn_tap_fn tap, void *tap_ctx, int start, int stop,
                        float *att);
/* logits [T][vocab] = lm_head(rmsnorm(x) * final_norm); x is overwritten. */
void cmp_fwd_head(cmp_fwd *f, float *x, size_t T, float *logits);
/* The same head for model m outside a forward context (the held-out
 * evaluation streamed with the calibration, cmp_calib_heldout.c). */
void cmp_model_head(const rt_model *m, kn_pool *pool, float *x, size_t T,
                    float *logits);
/* The whole model: logits [T][vocab] for tok[0..T) (T <= max_T). */
mc_status cmp_fwd_logits(cmp_fwd *f, const int32_t *tok, size_t T,
                         float *logits, mc_error *err);

/* ---- metrics ------------------------------------------------------------- */

typedef struct cmp_eval_report {
    double kld_mean;   /* mean KL(ref || quant) over scored positions, nats */
    double kld_p99;    /* 99th percentile (nearest rank) */
    double top1;       /* fraction of positions with equal argmax, 0..1 */
    double ppl_ref;    /* exp(mean NLL of the next token), reference */
    double ppl;        /* same for the quantized model */
    uint64_t tokens;   /* scored positions */
} cmp_eval_report;

typedef struct cmp_eval_acc {
    double kld_sum, nll_ref_sum, nll_sum;
    uint64_t top1, n;  /* positions scored */
    uint64_t n_nll;    /* positions with a next token (perplexity) */
    double *klds;      /* per position KLD (for the percentile), owned */
    size_t cap;
} cmp_eval_acc;

void cmp_eval_acc_init(cmp_eval_acc *a);
void cmp_eval_acc_free(cmp_eval_acc *a);
/* Score one position: ref and quant logits [vocab]; next: the actual next
 * token, or -1 to score KLD and top-1 only (perplexity then averages over
 * the positions that had one).  Returns MC_OK or MC_ERR_NOMEM. */
mc_status cmp_eval_acc_add(cmp_eval_acc *a, const float *ref,
                           const float *quant, uint32_t vocab, int32_t next);
/* Score one sequence tok[0..T): ref and quant logits [T][vocab], every
 * position with a next token (T - 1 of them; none when T < 2).  MC_OK or
 * MC_ERR_NOMEM (named in err). */
mc_status cmp_eval_acc_seq(cmp_eval_acc *a, const float *ref,
                           const float *quant, uint32_t vocab,
                           const int32_t *tok, size_t T, mc_error *err);
/* Summaries (zeros when nothing was scored); sorts a copy of the KLDs. */
mc_status cmp_eval_acc_report(const cmp_eval_acc *a, cmp_eval_report *out);

/* *maxT = the longest of nseq sequences (seq i = off[i] .. off[i+1]);
 * MC_ERR_INVALID_ARG (field "tokens") when it is past c's context. */
mc_status cmp_eval_longest(const fmt_model_config *c, const size_t *off,
                           size_t nseq, size_t *maxT, mc_error *err);
/* Run ref and quant over nseq sequences (seq i = tok[off[i] .. off[i+1]))
 * and report.  Sequences longer than the models' context are refused
 * (MC_ERR_INVALID_ARG).  progress (optional) is called after each sequence
 * with (done, total). */
mc_status cmp_eval_models(const rt_model *ref, const rt_model *quant,
                          const int32_t *tok, const size_t *off, size_t nseq,
                          kn_pool *pool,
                          void (*progress)(void *ctx, size_t done, size_t total),
                          void *progress_ctx, cmp_eval_report *out,
                          mc_error *err);
/* The scoring's bytes (cmp_eval_models' and the calibration's streamed
 * held-out summary's): both logits buffers for sequences of up to max_T
 * tokens, the KLD list of `positions` and the percentile's copy; the
 * forward contexts are cmp_fwd_bytes each. */
uint64_t cmp_eval_scores_bytes(const fmt_model_config *c, size_t max_T,
                               size_t positions);

/* Read a token-id file with fmt_ids_load (formats/fmt_ids.h: one sequence
 * per line, ids separated by spaces or tabs, '#' comment lines and blank
 * lines skipped) into flat arrays: *tok and *off (nseq + 1 entries) are
 * mc_malloc'ed and owned by the caller.  Errors name the line. */
mc_status cmp_ids_load(const char *path, int32_t **tok, size_t **off,
                       size_t *nseq, mc_error *err);

#endif /* CMP_EVAL_H */

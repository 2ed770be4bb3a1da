/*
 * rt_session.h - running a model: one arena, a KV cache per batch slot,
 * chunked batched prefill, decode, generation, scoring.
 *
 * rt_session_create allocates exactly one arena of layout.arena_bytes (plus
 * the small session struct and its thread pool) and never allocates again:
 * rt_session_generate / _score / _logits run with mc_malloc failing.
 *
 * Scheduling of a call on n <= max_batch sequences (slot i = sequence i):
 * each step takes up to prefill_chunk token rows: first one row for every
 * sequence that is decoding, then prompt rows of the sequences still in
 * prefill, in sequence order (a prompt may be split across steps, several
 * may share a step).  Logits are computed only for rows that need them (the
 * last row of a sequence about to sample; continuation rows when scoring;
 * every row for rt_session_logits), in groups of at most max_batch rows.
 * Each row's result depends only on its own sequence, so a sequence gives
 * bit-identical logits and tokens alone or in a batch (given per-row
 * deterministic kernels, see kn_block.h).
 *
 * Continuous batching (rt_session_admit_* / rt_session_step): instead of a
 * whole call, the caller admits one request into a free slot at a time
 * and runs steps; a slot is freed the step its request finishes and can
 * take the next request before the next step, so new prompt rows run
 * beside the rows of sequences already decoding.  Prompt rows go to the
 * oldest admitted request first.  The arena and the plan do not change: a
 * slot is one of the plan's max_batch KV regions of max_seq positions, and
 * a request is admitted only when prompt + max_new_tokens (or prompt + the
 * longer of its continuation and its longest label) fits in it.  Sequence
 * results do not depend on what shares the steps (as above), and a
 * request's RNG is seeded from its own (seed, seq_index0), so a request
 * gives the same tokens in any batch.
 *
 * Requests beyond the plan are refused with MC_ERR_PLAN and a message that
 * states the limits (n > max_batch: use the waves of mcrt.h; prompt +
 * max_new_tokens > max_seq: refused unless truncation is asked for).
 * One scheduler (rt_sched.c) serves every backend (rt_backend.h: the CPU
 * one of rt_cpu.c, the CUDA one of rt_cuda*.c), so the scheduling above,
 * the checks and the refusals are the same on every device.
 * Not thread-safe: one call at a time per session.
 */
#ifndef RT_SESSION_H
#define RT_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_layout.h"
#include "rt_model.h"
#include "rt_sample.h"

typedef struct rt_session rt_session;
typedef struct rt_backend rt_backend;

/* Where a session runs (rt_backend.h). */
typedef enum rt_device {
    RT_DEVICE_CPU = 0,
    RT_DEVICE_CUDA = 1,
} rt_device;

/* "cpu" / "cuda" -> *out; MC_ERR_INVALID_ARG for anything else. */
mc_status rt_device_parse(const char *name, rt_device *out);
const char *rt_device_name(rt_device dev);

typedef enum rt_truncate {
    RT_TRUNC_NONE = 0,         /* refuse sequences that do not fit */
    RT_TRUNC_LEFT = 1,         /* drop the oldest prompt tokens */
    RT_TRUNC_RIGHT = 2,        /* drop the newest prompt tokens */
} rt_truncate;

typedef enum rt_stop_reason {
    RT_STOP_NONE = 0,          /* not run */
    RT_STOP_LENGTH = 1,        /* max_new_tokens reached */
    RT_STOP_TOKEN = 2,         /* a stop token was sampled */
    RT_STOP_STRING = 3,        /* on_token ended it (a stop string) */
} rt_stop_reason;

/* One prompt (ids borrowed for the duration of the call). */
typedef struct rt_prompt {
    const int32_t *ids;
    size_t n;                  /* >= 1 */
} rt_prompt;

typedef struct rt_gen_params {
    uint32_t max_new_tokens;   /* 0: only prefill */
    rt_sampler sampler;        /* greedy / temperature / top-k / top-p */
    uint64_t seed;             /* RNG of sequence i: (seed, seq_index0 + i) */
    uint64_t seq_index0;       /* index of the first prompt in the request */
    const int32_t *stop;       /* stop tokens (borrowed), n_stop of them */
    size_t n_stop;
    rt_truncate truncate;      /* when prompt + max_new > max_seq */
    /* Optional: called with the logits row each generated token was
     * sampled from (seq = index in this call, step = 0, 1, ...). */
    void (*on_logits)(void *ctx, size_t seq, size_t step,
                      const float *logits, uint32_t vocab);
    void *on_logits_ctx;
    /* Optional: called after each generated token is stored (seq = index
     * in this call, or the slot of an admitted request; ids[0..n) the
     * tokens so far); nonzero ends the sequence with RT_STOP_STRING, the
     * token kept.  Runs inside the step: it must not allocate (stop
     * strings: rt_stopstr.h). */
    int (*on_token)(void *ctx, size_t seq, const int32_t *ids, size_t n);
    void *on_token_ctx;
} rt_gen_params;

typedef struct rt_gen_result {
    int32_t *ids;              /* caller buffer, >= max_new_tokens entries */
    size_t n;                  /* out: tokens generated (stop token excluded) */
    rt_stop_reason stop;       /* out */
    int32_t stop_token;        /* out: the stop token sampled, or -1 */
    size_t prompt_used;        /* out: prompt tokens fed (after truncation) */
} rt_gen_result;

/* Labels to score after a prompt (all borrowed): label j is the tokens
 * seq[j][0 .. len[j]), or, when seq is NULL, the one token ids[j].  A
 * label's score is the sum of the log-probabilities of its tokens, each
 * given the prompt and the label's tokens before it (teacher-forced, as
 * lm-evaluation-harness scores a choice); it equals the continuation sum
 * of the same tokens scored alone, float((double)lp0 + lp1 + ...), bit for
 * bit.  A label of m >= 2 tokens feeds its first m - 1 tokens after the
 * prompt in the request's own slot, one label after the other, over the
 * same prompt KV (the prompt runs once).  Each label needs prompt + m <=
 * max_seq (truncation makes room for the longest label). */
typedef struct rt_labels {
    const int32_t *const *seq; /* [n] label tokens, or NULL (see ids) */
    const size_t *len;         /* [n] tokens of each seq[j] */
    const int32_t *ids;        /* [n] one-token labels when seq is NULL */
    size_t n;
} rt_labels;

/* Scoring item: log-probabilities of cont[] after prompt (each token given
 * the prompt and the continuation before it), and/or of each of the call's
 * labels (rt_labels) after the prompt. */
typedef struct rt_score_item {
    rt_prompt prompt;
    const int32_t *cont;       /* may be NULL when n_cont == 0 */
    size_t n_cont;
    float *cont_logprobs;      /* out [n_cont] (may be NULL if n_cont == 0) */
    float *label_logprobs;     /* out [n_labels] (may be NULL if none) */
} rt_score_item;

/* Timing counters since create (or rt_session_reset_stats). */
typedef struct rt_session_stats {
    uint64_t prefill_tokens;   /* prompt rows run */
    uint64_t decode_tokens;    /* generated-token rows run + first samples */
    double prefill_seconds;    /* wall time attributed to prefill rows */
    double decode_seconds;     /* wall time attributed to decode rows */
    uint64_t steps;            /* forward steps */
    uint64_t logit_rows;       /* rows that went through the lm head */
} rt_session_stats;

/* Create a session for model (borrowed; must outlive the session) under
 * lim.  layout NULL: built from (model cfg, lim).  A given layout (an
 * artifact's stored plan) must be exactly what rt_layout_build produces for
 * this config and the same limits (checked: MC_ERR_PLAN); the session then
 * runs with at most the plan's thread count (its attention scratch).
 * Allocates the arena (filled with a canary pattern for the high-water
 * measurement) and the thread pool. */
mc_status rt_session_create(const rt_model *model, const rt_limits *lim,
                            const rt_layout *layout, rt_session **out,
                            mc_error *err);
void rt_session_free(rt_session *s); /* NULL is a no-op */

/* rt_session_create on device dev: RT_DEVICE_CPU is rt_session_create;
 * RT_DEVICE_CUDA is rt_cuda_session_create with default options (its
 * errors: MC_ERR_UNSUPPORTED without a CUDA build or device, ...). */
mc_status rt_session_create_on(const rt_model *model, const rt_limits *lim,
                               const rt_layout *layout, rt_device dev,
                               rt_session **out, mc_error *err);

/* The scheduler over a created backend (rt_backend.h), which it takes
 * over: *be is cleared, and freed on failure too.  model borrowed. */
mc_status rt_session_create_backend(const rt_model *model, rt_backend *be,
                                    rt_session **out, mc_error *err);
/* The backend a session runs on (borrowed). */
const rt_backend *rt_session_backend(const rt_session *s);

const rt_layout *rt_session_layout(const rt_session *s);
const rt_model *rt_session_model(const rt_session *s);

/* Generate for n prompts (n <= max_batch).  res[i].ids must have room for
 * p->max_new_tokens ids. */
mc_status rt_session_generate(rt_session *s, const rt_prompt *prompts,
                              size_t n, const rt_gen_params *p,
                              rt_gen_result *res, mc_error *err);

/* Score n items (n <= max_batch) without generating.  labels (n_labels
 * single tokens, borrowed) are shared by all items.  truncate applies to
 * prompts whose prompt + the longer of the continuation and the longest
 * label exceed max_seq. */
mc_status rt_session_score(rt_session *s, rt_score_item *items, size_t n,
                           const int32_t *labels, size_t n_labels,
                           rt_truncate truncate, mc_error *err);
/* The same with labels of any length (rt_labels; labels == NULL: none). */
mc_status rt_session_score_labels(rt_session *s, rt_score_item *items,
                                  size_t n, const rt_labels *labels,
                                  rt_truncate truncate, mc_error *err);

/* Logits at every position of n prompts: out[i] is [prompts[i].n][vocab]
 * (caller buffers).  For evaluation (perplexity, KL divergence) and tests. */
mc_status rt_session_logits(rt_session *s, const rt_prompt *prompts,
                            size_t n, float *const *out, mc_error *err);

/* Continuous batching (see the top of this file).  Admit one request
 * into free slot (< max_batch): the same checks and refusals as
 * rt_session_generate / rt_session_score on one sequence (the prompt is
 * "sequence 0" in messages; its RNG is (p->seed, p->seq_index0)).  prompt
 * ids, p, res / item and labels are borrowed until the slot is reported
 * done.  Nothing runs until rt_session_step.  MC_ERR_INVALID_ARG when the
 * slot is busy; the whole-call functions above refuse to run (also
 * MC_ERR_INVALID_ARG) while any slot is busy. */
mc_status rt_session_admit_generate(rt_session *s, uint32_t slot,
                                    const rt_prompt *prompt,
                                    const rt_gen_params *p,
                                    rt_gen_result *res, mc_error *err);
mc_status rt_session_admit_score(rt_session *s, uint32_t slot,
                                 rt_score_item *item, const int32_t *labels,
                                 size_t n_labels, rt_truncate truncate,
                                 mc_error *err);
/* The same with labels of any length (rt_labels; labels == NULL: none). */
mc_status rt_session_admit_score_labels(rt_session *s, uint32_t slot,
                                        rt_score_item *item,
                                        const rt_labels *labels,
                                        rt_truncate truncate, mc_error *err);

/* Run one step over the busy slots (decode rows first, then up to
 * prefill_chunk prompt rows).  The slots whose requests finished are freed
 * and written to done[] (caller buffer of max_batch), their count to
 * *n_done; their results are complete.  No busy slot: nothing runs,
 * *n_done = 0.  On failure (MC_ERR_NONFINITE) every busy slot is freed
 * without a result and err names the sequence's slot.  Never allocates. */
mc_status rt_session_step(rt_session *s, uint32_t *done, size_t *n_done,
                          mc_error *err);

/* Number of busy slots; 1 if slot is busy. */
size_t rt_session_busy(const rt_session *s);
int rt_session_slot_is_busy(const rt_session *s, uint32_t slot);
/* Free every busy slot without finishing its request. */
void rt_session_abort(rt_session *s);

/* The tap of kn_block.h, called for every layer (layer index added) during
 * the next calls until cleared with fn NULL.  For calibration; CPU
 * backend only (ignored on others). */
typedef void (*rt_tap_fn)(void *ctx, uint32_t layer, kn_tap_point where,
                          const float *x, size_t T, size_t width);
void rt_session_set_tap(rt_session *s, rt_tap_fn fn, void *ctx);

/* Highest byte offset + 1 of the arena that no longer holds the canary
 * written at create: a measurement of how much of the arena ran.  0 when
 * the arena is on a device (this and the count below). */
uint64_t rt_session_arena_high_water(const rt_session *s);
/* Number of arena bytes that no longer hold the canary: the bytes a run
 * really wrote (a byte that happens to be written with the canary value is
 * not counted, so it can undercount by a fraction of a percent).  Lifetime
 * reuse makes the high-water mark reach the top of the arena as soon as a
 * small buffer there is used; this count says how full the plan was.
 * Scans the whole arena: for reports, not the hot path. */
uint64_t rt_session_arena_touched_bytes(const rt_session *s);

void rt_session_stats_get(const rt_session *s, rt_session_stats *out);
void rt_session_reset_stats(rt_session *s);

#endif /* RT_SESSION_H */

/*
 * rt_request.h - the per-request checks and per-sequence state shared by
 * every backend through the one scheduler (rt_sched.c), so
 * both refuse the same requests with the same messages.
 *
 * A sequence of a call lives in batch slot = its index: its prompt (after
 * truncation), the tokens after it (a continuation to score, or the ids
 * generated so far), how many positions are in the KV cache, and its own
 * sampling RNG (seeded from the call's seed and the sequence's index, so a
 * sequence samples the same alone or in a batch).
 */
#ifndef RT_REQUEST_H
#define RT_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_layout.h"
#include "rt_sample.h"
#include "rt_session.h"

typedef struct rt_seq {
    const int32_t *a;          /* prompt (after truncation), borrowed */
    size_t na;
    const int32_t *b;          /* continuation (score) / generated ids */
    size_t nb;                 /* tokens of b available to feed */
    size_t fed;                /* positions stored in the KV cache */
    int done;                  /* nothing more to feed or sample */
    rt_rng rng;
} rt_seq;

/* MC_ERR_PLAN when n sequences exceed the plan's max_batch (the caller
 * above the session runs larger batches in waves). */
mc_status rt_request_check_batch(const rt_limits *L, size_t n, mc_error *err);

/* MC_ERR_INVALID_ARG when an id of ids[0..n) is outside [0, vocab); seq
 * and what ("prompt", "labels", ...) name it in the message. */
mc_status rt_request_check_ids(uint32_t vocab, const int32_t *ids, size_t n,
                               size_t seq, const char *what, mc_error *err);

/* Fit prompt p of sequence i plus `extra` later tokens into max_seq,
 * truncating left or right when tr asks; sets q->a and q->na.  MC_ERR_PLAN
 * (with the plan's limits in the message) when it does not fit. */
mc_status rt_request_fit_prompt(const rt_limits *L, const rt_prompt *p,
                                size_t extra, rt_truncate tr, size_t i,
                                rt_seq *q, mc_error *err);

/* Per-call setup of seq[0..n) (every check above, then the sequences'
 * state), identical for both sessions.  Generate: prompts fitted with
 * room for p->max_new_tokens, res[i] reset (ids must be given when tokens
 * are asked), RNGs seeded.  Score: labels checked, each continuation fed
 * but its last token (nothing scores what follows it), output buffers
 * required; labels (may be NULL) checked, none empty, and the prompt
 * fitted with room for the longer of the continuation and the longest
 * label.  Logits: prompts fitted untruncated, out[i] required.  Errors
 * leave the session state to be overwritten by the next call. */
mc_status rt_request_setup_generate(const rt_limits *L, uint32_t vocab,
                                    rt_seq *seq, const rt_prompt *prompts,
                                    size_t n, const rt_gen_params *p,
                                    rt_gen_result *res, mc_error *err);
mc_status rt_request_setup_score(const rt_limits *L, uint32_t vocab,
                                 rt_seq *seq, rt_score_item *items, size_t n,
                                 const rt_labels *labels,
                                 rt_truncate truncate, mc_error *err);

/* Label j of l: its tokens (borrowed) and their count. */
const int32_t *rt_labels_tokens(const rt_labels *l, size_t j);
size_t rt_labels_len(const rt_labels *l, size_t j);
mc_status rt_request_setup_logits(const rt_limits *L, uint32_t vocab,
                                  rt_seq *seq, const rt_prompt *prompts,
                                  size_t n, float *const *out, mc_error *err);

/* Add one step of T rows (ndec of them decode rows, nrows through the
 * head) that took dt seconds to st: the wall time is split between
 * prefill and decode by their share of the rows.  T >= 1. */
void rt_request_count_step(rt_session_stats *st, size_t T, size_t ndec,
                           size_t nrows, double dt);

#endif /* RT_REQUEST_H */

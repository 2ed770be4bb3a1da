/* rt_request.c - request checks shared by the CPU and GPU sessions (see
 * rt_request.h). */
#include "rt_request.h"

#include <string.h>

mc_status rt_request_check_batch(const rt_limits *L, size_t n, mc_error *err)
{
    if (n > L->max_batch)
        return mc_fail(err, MC_ERR_PLAN, NULL, "batch", -1,
                       "batch of %zu sequences exceeds the plan's max_batch "
                       "%u (plan: max_batch %u, max_seq %llu, prefill_chunk "
                       "%u)", n, L->max_batch, L->max_batch,
                       (unsigned long long)L->max_seq, L->prefill_chunk);
    return MC_OK;
}

mc_status rt_request_check_ids(uint32_t vocab, const int32_t *ids, size_t n,
                               size_t seq, const char *what, mc_error *err)
{
    for (size_t j = 0; j < n; j++)
        if (ids[j] < 0 || (uint32_t)ids[j] >= vocab)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, what, -1,
                           "sequence %zu: token %zu is %d, outside the "
                           "vocabulary [0, %u)", seq, j, (int)ids[j], vocab);
    return MC_OK;
}

mc_status rt_request_fit_prompt(const rt_limits *L, const rt_prompt *p,
                                size_t extra, rt_truncate tr, size_t i,
                                rt_seq *q, mc_error *err)
{
    if (!p->ids || p->n == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "prompt", -1,
                       "sequence %zu: empty prompt (at least one token, "
                       "e.g. BOS, is needed)", i);
    q->a = p->ids;
    q->na = p->n;
    if (extra < L->max_seq && p->n <= L->max_seq - extra)
        return MC_OK;
    size_t room = extra < L->max_seq ? (size_t)(L->max_seq - extra) : 0;
    if (tr == RT_TRUNC_NONE || room == 0)
        return mc_fail(err, MC_ERR_PLAN, NULL, "max_seq", -1,
                       "sequence %zu: %zu prompt tokens + %zu more exceed "
                       "the plan's max_seq %llu (plan: max_batch %u, "
                       "max_seq %llu, prefill_chunk %u)%s",
                       i, p->n, extra, (unsigned long long)L->max_seq,
                       L->max_batch, (unsigned long long)L->max_seq,
                       L->prefill_chunk,
                       room ? "; truncation left/right can be asked for" : "");
    if (tr == RT_TRUNC_LEFT)
        q->a = p->ids + (p->n - room);
    q->na = room;
    return MC_OK;
}

mc_status rt_request_setup_generate(const rt_limits *L, uint32_t vocab,
                                    rt_seq *seq, const rt_prompt *prompts,
                                    size_t n, const rt_gen_params *p,
                                    rt_gen_result *res, mc_error *err)
{
    mc_status st = rt_request_check_batch(L, n, err);
    if (st)
        return st;
    for (size_t i = 0; i < n; i++) {
        rt_seq *q = &seq[i];
        memset(q, 0, sizeof *q);
        if ((st = rt_request_fit_prompt(L, &prompts[i], p->max_new_tokens,
                                        p->truncate, i, q, err)) ||
            (st = rt_request_check_ids(vocab, q->a, q->na, i, "prompt", err)))
            return st;
        if (p->max_new_tokens > 0 && !res[i].ids)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "ids", -1,
                           "sequence %zu: no output buffer", i);
        q->b = res[i].ids;
        rt_rng_seed(&q->rng, p->seed, p->seq_index0 + i);
        res[i].n = 0;
        res[i].stop = p->max_new_tokens ? RT_STOP_NONE : RT_STOP_LENGTH;
        res[i].stop_token = -1;
        res[i].prompt_used = q->na;
    }
    return MC_OK;
}

const int32_t *rt_labels_tokens(const rt_labels *l, size_t j)
{
    return l->seq ? l->seq[j] : l->ids + j;
}

size_t rt_labels_len(const rt_labels *l, size_t j)
{
    return l->seq ? l->len[j] : 1;
}

/* Every label: at least one token, every id in the vocabulary.
 * *longest gets the longest label's token count (0 without labels). */
static mc_status check_labels(uint32_t vocab, const rt_labels *l,
                              size_t *longest, mc_error *err)
{
    *longest = 0;
    for (size_t j = 0; l && j < l->n; j++) {
        size_t m = rt_labels_len(l, j);
        const int32_t *t = rt_labels_tokens(l, j);
        if (m == 0 || !t)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "labels", -1,
                           "label %zu has no tokens (a label needs at least "
                           "one)", j);
        mc_status st = rt_request_check_ids(vocab, t, m, 0, "labels", err);
        if (st)
            return st;
        if (m > *longest)
            *longest = m;
    }
    return MC_OK;
}

mc_status rt_request_setup_score(const rt_limits *L, uint32_t vocab,
                                 rt_seq *seq, rt_score_item *items, size_t n,
                                 const rt_labels *labels,
                                 rt_truncate truncate, mc_error *err)
{
    size_t longest = 0;
    const size_t n_labels = labels ? labels->n : 0;
    mc_status st = rt_request_check_batch(L, n, err);
    if (st || (st = check_labels(vocab, labels, &longest, err)))
        return st;
    for (size_t i = 0; i < n; i++) {
        rt_seq *q = &seq[i];
        rt_score_item *it = &items[i];
        memset(q, 0, sizeof *q);
        /* Room for the longer of the continuation and the longest label:
         * each is fed after the same prompt. */
        size_t extra = it->n_cont > longest ? it->n_cont : longest;
        if ((st = rt_request_fit_prompt(L, &it->prompt, extra, truncate, i,
                                        q, err)) ||
            (st = rt_request_check_ids(vocab, q->a, q->na, i, "prompt", err)) ||
            (st = rt_request_check_ids(vocab, it->cont, it->n_cont, i,
                                       "continuation", err)))
            return st;
        if ((it->n_cont && !it->cont_logprobs) ||
            (n_labels && !it->label_logprobs))
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "score", -1,
                           "sequence %zu: missing output buffer", i);
        /* Feed the continuation except its last token (nothing scores
         * what follows it); multi-token labels come after it (rt_sched.c). */
        q->b = it->cont;
        q->nb = it->n_cont ? it->n_cont - 1 : 0;
    }
    return MC_OK;
}

mc_status rt_request_setup_logits(const rt_limits *L, uint32_t vocab,
                                  rt_seq *seq, const rt_prompt *prompts,
                                  size_t n, float *const *out, mc_error *err)
{
    mc_status st = rt_request_check_batch(L, n, err);
    if (st)
        return st;
    for (size_t i = 0; i < n; i++) {
        rt_seq *q = &seq[i];
        memset(q, 0, sizeof *q);
        if ((st = rt_request_fit_prompt(L, &prompts[i], 0, RT_TRUNC_NONE, i,
                                        q, err)) ||
            (st = rt_request_check_ids(vocab, q->a, q->na, i, "prompt", err)))
            return st;
        if (!out[i])
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "logits", -1,
                           "sequence %zu: no output buffer", i);
    }
    return MC_OK;
}

void rt_request_count_step(rt_session_stats *st, size_t T, size_t ndec,
                           size_t nrows, double dt)
{
    size_t npre = T - ndec;
    st->steps++;
    st->logit_rows += nrows;
    st->prefill_tokens += npre;
    st->decode_tokens += ndec;
    st->prefill_seconds += dt * (double)npre / (double)T;
    st->decode_seconds += dt * (double)ndec / (double)T;
}

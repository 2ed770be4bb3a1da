/* rt_request.c - request checks shared by the CPU and GPU sessions (see
 * rt_request.h). */
#include "rt_request.h"

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

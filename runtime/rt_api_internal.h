/*
 * rt_api_internal.h - what the runtime's own programs (mrun's JSONL job)
 * reach below the public API (mcrt.h): the handle's session, to admit
 * requests one slot at a time (rt_session.h, continuous batching).
 * Embedders use mcrt.h only.
 */
#ifndef RT_API_INTERNAL_H
#define RT_API_INTERNAL_H

#include "mcrt.h"
#include "rt_session.h"

/* The session of h (borrowed, valid until mcrt_close).  Requests run on
 * it directly are not in mcrt_get_stats' request counters. */
rt_session *rt_api_session(mcrt *h);

#endif /* RT_API_INTERNAL_H */

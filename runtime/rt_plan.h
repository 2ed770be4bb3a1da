/*
 * rt_plan.h - the stored memory plan: the ONE definition of what an
 * artifact's plan holds, how it is written as JSON, read back and checked.
 *
 * The compiler's planner (compiler/cmp_plan.h) chooses the limits and adds
 * its own report keys (frontier, target, fits, quant...); the part a
 * session depends on it writes with rt_plan_to_json.  The runtime reads it
 * with rt_plan_from_json when it opens an artifact, and a session created
 * on a stored layout takes it through rt_plan_session_layout.  Nothing else
 * parses or re-checks a plan.
 *
 * The stored keys (the manifest's "plan" object; docs/artifact.md):
 *
 *   max_batch, max_seq, prefill_chunk, threads   integers, the resolved
 *                        limits (rt_layout_build's out->limits)
 *   kv_type              "f32" | "f16" | "int8" (kn_kvtype_name)
 *   kv_slot_bytes        K+V bytes of one position of one layer
 *   weights_bytes        data + scales + zeros of every tensor
 *   kv_bytes, activation_bytes, arena_bytes      the layout's
 *   reserve_bytes        the process outside weights and arena
 *   total_bytes          weights + arena + reserve
 *   target_bytes         the memory the plan was made for (optional: a
 *                        report key; 0 when absent), which the dataset
 *                        job's budget (below) must fit beside total_bytes
 *   device               "cpu" | "cuda" (optional; absent: cpu)
 *   buffers              RT_BUF_COUNT_ x {id, name, offset, bytes, first,
 *                        last}, in id order
 *
 * A stored plan is trusted only as far as it equals what this runtime
 * computes: the layout is rebuilt from the stored limits with
 * rt_layout_build and every buffer's offset and size, the arena and the
 * totals must match; anything else is refused, naming the key.
 */
#ifndef RT_PLAN_H
#define RT_PLAN_H

#include <stdint.h>

#include <jansson.h>

#include "fmt_config.h"
#include "mc_error.h"
#include "rt_layout.h"

typedef struct rt_plan {
    rt_layout layout;          /* with its resolved limits (layout.limits) */
    uint64_t weights_bytes;    /* every tensor's data + scales + zeros */
    uint64_t reserve_bytes;    /* the process outside weights and arena */
    uint64_t total_bytes;      /* weights + arena + reserve */
    int cuda;                  /* planned for a CUDA device ("device":
                                  "cuda"; absent in older manifests: cpu) */
    uint64_t target_bytes;     /* memory planned for (0: not stored) */
} rt_plan;

/*
 * The dataset job (mrun --input; runtime/mrun_job.h) holds, beside the
 * session's weights + arena + reserve, host buffers that are all sized
 * when it starts, so that a job with long lines cannot pass its plan:
 *
 *   job   = line + scratch + hold + one_line
 *   line      line_bytes + 1: the input line (--max-line-bytes); a
 *             longer line is an error line, read past without buffering
 *   scratch   RT_JOB_SCRATCH_PER_LINE_BYTE x line_bytes: one line's
 *             parsed JSON while it is read, then one result line's
 *             decoded text and bytes while it is written (in pieces
 *             when it does not fit)
 *   hold      hold_bytes (--hold-bytes): every line read and not yet
 *             written (its request, its token buffers: malloc's chunks,
 *             counted by rt_plan_heap_chunk); no line is read while
 *             they hold hold_bytes or more (back-pressure), unless none
 *             is held, so the oldest line always runs
 *   one_line  the most one line may hold (it may pass the hold budget by
 *             that much): RT_JOB_LINE_PER_LINE_BYTE x line_bytes +
 *             RT_JOB_LINE_PER_TOKEN x max_seq + RT_JOB_LINE_BASE; a line
 *             that would hold more is an error line
 *
 * The job's planned bytes are total_bytes + job (CPU plans: the job's
 * buffers live in the same process); the compiler plans the default
 * budget inside --target, and the job refuses at start a budget that
 * does not fit target_bytes beside total_bytes.
 */
#define RT_JOB_DEFAULT_LINE_BYTES (1ull << 20) /* 1 MiB */
#define RT_JOB_DEFAULT_HOLD_BYTES (4ull << 20) /* 4 MiB */
#define RT_JOB_MIN_LINE_BYTES 256ull
#define RT_JOB_MAX_LINE_BYTES (1ull << 30)
/* jansson's tree per byte of text (measured): 3 for a text prompt,
 * 9.3-12 for ids of 3-5 digits, 16 for a list of short strings, up to 77
 * for hostile lines ([{},{},...]), which then get an error line */
#define RT_JOB_SCRATCH_PER_LINE_BYTE 16ull
#define RT_JOB_LINE_PER_LINE_BYTE 4ull   /* its ids (4 bytes per >= 2 of
                                            text), labels, stop strings */
#define RT_JOB_LINE_PER_TOKEN 16ull      /* generated ids, log-probs */
#define RT_JOB_LINE_BASE (64ull << 10)   /* the entry, stop-string window */

typedef struct rt_job_budget {
    uint64_t line_bytes;       /* the longest input line (no '\n') */
    uint64_t hold_bytes;       /* the back-pressure budget */
    uint64_t scratch_bytes;    /* parse / format scratch */
    uint64_t one_line_bytes;   /* the most one line may hold */
    uint64_t total_bytes;      /* line + 1 + scratch + hold + one_line */
} rt_job_budget;

/* The budget of a job reading lines of at most line_bytes (in
 * [RT_JOB_MIN_LINE_BYTES, RT_JOB_MAX_LINE_BYTES]) with hold_bytes of
 * held lines (>= 1) on a plan of max_seq tokens.  MC_ERR_INVALID_ARG
 * naming the option out of range, MC_ERR_OVERFLOW. */
mc_status rt_plan_job_budget(uint64_t line_bytes, uint64_t hold_bytes,
                             uint64_t max_seq, rt_job_budget *out,
                             mc_error *err);

/* The bytes malloc takes for a block of n bytes (glibc: n + 8 rounded up
 * to 16, at least 32): what the job charges to its hold budget. */
uint64_t rt_plan_heap_chunk(uint64_t n);

/* Build the plan of cfg under lim: the layout (rt_layout_build) and the
 * totals.  MC_ERR_OVERFLOW when the total does not fit 64 bits; the
 * layout's errors otherwise. */
mc_status rt_plan_make(const fmt_model_config *cfg, const rt_limits *lim,
                       uint64_t weights_bytes, uint64_t reserve_bytes,
                       rt_plan *out, mc_error *err);

/* Set the stored keys (above) on the object o.  Returns 0, or -1 when an
 * allocation failed (o may then hold some of the keys: drop it). */
int rt_plan_to_json(const rt_plan *p, json_t *o);

/* Read the stored plan o (borrowed) of the model cfg whose tensors hold
 * weights_bytes, and check it (see the top).  path names the file in
 * errors: MC_ERR_FORMAT for a missing or out-of-range key or totals that
 * disagree, MC_ERR_PLAN for a layout this runtime lays out otherwise
 * (recompile).  out is filled on MC_OK. */
mc_status rt_plan_from_json(const json_t *o, const fmt_model_config *cfg,
                            uint64_t weights_bytes, const char *path,
                            rt_plan *out, mc_error *err);

/* The layout of a session on cfg for the limits lim: rt_layout_build's, or,
 * with a stored layout (an artifact's; may be NULL), that one, which must
 * be exactly what rt_layout_build gives for its own limits and be for the
 * limits asked; its thread count sized the attention scratch, so the
 * session runs with at most that many (the fewer of the two).  MC_ERR_PLAN
 * naming path and both sets of limits otherwise. */
mc_status rt_plan_session_layout(const fmt_model_config *cfg,
                                 const rt_limits *lim,
                                 const rt_layout *stored, const char *path,
                                 rt_layout *out, mc_error *err);

#endif /* RT_PLAN_H */

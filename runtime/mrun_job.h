/*
 * mrun_job.h - mrun's dataset job: JSONL in, JSONL out (mrun --input
 * FILE --output FILE), continuously batched within the plan, resumable.
 *
 * Part of the mrun program (it prints and handles signals), not of the
 * runtime library.  Lines are read one at a time (rt_jsonl.h), admitted
 * into free session slots as they come (rt_session.h, continuous
 * batching), and their result lines are written in input order, each with
 * one write() as soon as every earlier line is written; a line that
 * finishes early waits in memory (at most a few times max_batch lines).
 *
 * Memory: beside the session, only the buffers of rt_plan.h's
 * rt_job_budget, sized at start and refused there when they do not fit
 * the artifact's target: the input line (a longer line is an error
 * line, read past without buffering), one scratch for parsing a line
 * and formatting a result, and the lines read but not written, whose
 * bytes are a budget (--hold-bytes) that reading waits on.
 *
 * Guarantees:
 *   - a request beyond the plan or a malformed line gets an "error" line
 *     and the job goes on; the exit status is 1 when any line failed
 *     (stderr says how many, by reason), 0 when all were served;
 *   - --resume reads the output, drops a partial last line, skips input
 *     lines whose id is already there and appends the rest: the final
 *     file is byte-identical to an uninterrupted run (greedy or seeded
 *     sampling: a request's RNG depends on its line only);
 *   - SIGINT/SIGTERM: no new line is started, the lines in flight finish
 *     and are written, exit 1 ("rerun with --resume"); a second signal
 *     kills at once (the output still ends in complete lines or one
 *     partial line, which --resume drops);
 *   - stop strings (a line's "stop" texts and the job's --stop-string)
 *     are matched token by token inside the step (rt_stopstr.h) with a
 *     window allocated when the line is admitted; the token tables are
 *     built once, at the first line that has stop strings;
 *   - a progress line on stderr only when it is a terminal; --metrics
 *     rewritten atomically every metrics_period seconds and at the end
 *     (a metrics file that cannot be written is reported once; the job
 *     goes on and exits 1).
 */
#ifndef MRUN_JOB_H
#define MRUN_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "mcrt.h"
#include "rt_jsonl.h"
#include "rt_plan.h"
#include "rt_tokenizer.h"

typedef struct mrun_job_opts {
    const char *input;         /* path, or "-" for stdin */
    const char *output;        /* path, or "-" for stdout */
    const char *metrics;       /* Prometheus file, or NULL */
    double metrics_period;     /* seconds between --metrics rewrites */
    int resume;                /* continue an existing output */
    int waves;                 /* admit only into an idle session (the
                                  behaviour before continuous batching,
                                  kept for comparison) */
    rt_jsonl_defaults defaults;
    const int32_t *stop;       /* job-wide extra stop tokens (borrowed) */
    size_t n_stop;
    const char *const *stop_str; /* job-wide stop strings (borrowed) */
    const size_t *stop_str_len;  /* their bytes, >= 1 */
    size_t n_stop_str;
    int use_model_eos;
    int truncate;              /* 0 refuse, 1 left, 2 right */
    uint64_t max_line_bytes;   /* the longest input line (0: default,
                                  RT_JOB_DEFAULT_LINE_BYTES) */
    uint64_t hold_bytes;       /* the held lines' budget (0: default,
                                  RT_JOB_DEFAULT_HOLD_BYTES) */
    int quiet, verbose;
} mrun_job_opts;

/* Run the job on h (open) with tok (may be NULL: "prompt" text lines then
 * fail).  Returns the exit code: 0 all served, 1 some failed or
 * interrupted or an I/O error, 2 usage (an existing output without
 * --resume). */
int mrun_job_run(const mrun_job_opts *o, mcrt *h, const rt_tokenizer *tok);

#endif /* MRUN_JOB_H */

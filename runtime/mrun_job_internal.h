/*
 * mrun_job_internal.h - the dataset job's state, shared by mrun_job.c (the
 * loop: files, scheduling, progress, metrics, summary) and
 * mrun_job_lines.c (one line: read within --max-line-bytes, parsed in the
 * scratch, charged to the hold budget, admitted, failed, written; the
 * job's buffers).  Part of the mrun program: these print.
 */
#ifndef MRUN_JOB_INTERNAL_H
#define MRUN_JOB_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mrun_job.h"
#include "mrun_resume.h"
#include "rt_api_internal.h"
#include "rt_metrics.h"
#include "rt_stopstr.h"

/* One input line on its way to the output.  A finished line keeps its
 * results (ids, log-probs), not its text: the line is formatted in the
 * job's scratch when its turn to be written comes. */
typedef struct entry {
    rt_jsonl_req req;
    int done;                  /* finished: its line can be written */
    int failed;                /* an error line: msg, and the plan's limits
                                  when plan */
    int plan;
    char msg[1024];
    uint64_t bytes;            /* heap bytes it holds (the hold budget's) */
    uint32_t slot;             /* while running */
    int32_t *gen;              /* [max_new_tokens] generated ids */
    int32_t *stops;            /* line's + job's + model's stop ids */
    rt_gen_params gp;
    rt_gen_result gres;
    rt_score_item item;
    rt_labels labels;          /* views of req's labels */
    float *lab_lp, *cont_lp;   /* [n_labels], [n_cont] */
    /* stop strings: the line's then the job's (views), the matcher and
     * its window (sized at admission) */
    const char **sstr;
    size_t *slen;
    size_t n_sstr;
    char *swin;
    size_t swin_bytes;
    size_t gen_cap;            /* gen holds gen_cap + 1 ids */
    rt_stop_match sm;
} entry;

typedef struct job {
    const mrun_job_opts *o;
    mcrt *h;
    rt_session *s;
    const rt_tokenizer *tok;
    rt_stop_pieces *pieces;    /* token texts for stop strings, or NULL */
    int pieces_refused;        /* the table did not fit the plan */
    char pieces_why[256];
    mcrt_info info;
    FILE *in;
    int out_fd;
    int out_is_file;
    /* the job's buffers, sized and allocated once (rt_job_budget) */
    rt_job_budget budget;
    char *line;                /* [budget.line_bytes] the input line */
    rt_jsonl_scratch scratch;  /* [budget.scratch_bytes] */
    uint64_t held, held_peak;  /* bytes the window's lines hold */
    uint64_t planned;          /* the session's plan + the job's buffers
                                  (CPU: the same process) */
    uint64_t waits;            /* admissions that waited on the budget */
    /* lines in input order: a ring of cap entries */
    entry **win;
    size_t cap, head, count;
    entry **slot_entry;        /* [max_batch] */
    uint32_t *free_slots;      /* [max_batch] stack */
    size_t n_free;
    uint32_t *done_slots;      /* [max_batch] */
    mrun_resume prev;          /* --resume: the lines already written */
    /* counters */
    uint64_t line_no, total_lines, written, skipped;
    uint64_t served;           /* lines finished with a result */
    int metrics_failed;        /* --metrics could not be written (once) */
    uint64_t refused[RT_REFUSE_COUNT_];
    double t0, t_end;          /* the loop's start and end (seconds) */
    double step_seconds, last_progress, last_metrics;
    double sync_seconds;       /* in the periodic metrics writes + syncs */
    int progress, eof, io_failed;
} job;

/* The k-th line of the window (0: the oldest). */
static inline entry *mrun_win_at(const job *j, size_t k)
{
    return j->win[(j->head + k) % j->cap];
}

/* The job's buffers (rt_plan.h rt_job_budget), checked against the
 * artifact's target and allocated once.  0, or an exit code after a
 * message (2: options that do not fit). */
int mrun_job_buffers(job *j);

/* The --resume table (mrun_resume.h, loaded by now) joins the job's
 * planned bytes; a table that does not fit the target beside the job's
 * buffers is refused.  0, or an exit code after a message. */
int mrun_job_resume_fits(job *j);

/* Free e and what it owns; NULL is a no-op. */
void mrun_line_free(entry *e);

/* Make e an error line (msg from the parser or the session: the line
 * says "line N: what") and count it by the reason status gives. */
void mrun_line_fail(job *j, entry *e, int status, const char *msg);

/* e's request finished (its results are in its buffers). */
void mrun_line_finish(job *j, entry *e);

/* Write the line of the finished e to the output.  MC_ERR_IO when a
 * write failed (errno says why). */
mc_status mrun_line_write(job *j, entry *e);

/* Read, parse and (if it can run) admit the next non-blank line into the
 * window.  0 when a line was taken, -1 at the end of the input. */
int mrun_line_take(job *j);

#endif /* MRUN_JOB_INTERNAL_H */

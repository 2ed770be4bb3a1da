/* mrun_job.c - the JSONL dataset job (see mrun_job.h). */
#include "mrun_job.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fmt_input.h"
#include "mrun_resume.h"
#include "rt_api_internal.h"
#include "rt_metrics.h"
#include "rt_stopstr.h"

/* Lines held at once: in flight (<= max_batch) plus finished lines waiting
 * for an earlier one, plus failed lines read meanwhile; their bytes are
 * bounded apart, by the hold budget (rt_plan.h rt_job_budget). */
#define WINDOW_PER_SLOT 4
#define WINDOW_EXTRA 64
#define PROGRESS_PERIOD 0.25 /* seconds */

static volatile sig_atomic_t g_stop_signal;

static void on_signal(int sig)
{
    g_stop_signal = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

/* ---- small helpers -------------------------------------------------------- */

/* Free what e owns (not e) and clear the pointers. */
static void entry_free_buffers(entry *e)
{
    rt_jsonl_req_free(&e->req);
    free(e->gen);
    free(e->stops);
    free(e->lab_lp);
    free(e->cont_lp);
    free(e->sstr);
    free(e->slen);
    free(e->swin);
    e->gen = e->stops = NULL;
    e->lab_lp = e->cont_lp = NULL;
    e->sstr = NULL;
    e->slen = NULL;
    e->swin = NULL;
    e->n_sstr = 0;
}

static void entry_free(entry *e)
{
    if (!e)
        return;
    entry_free_buffers(e);
    free(e);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- files ---------------------------------------------------------------- */

/* Open input and output.  Returns 0 or an exit code after a message. */
static int open_files(job *j)
{
    const mrun_job_opts *o = j->o;
    char buf[1400];
    mc_error err;
    if (strcmp(o->input, "-")) {
        /* Non-blocking open, regular file required: a FIFO fails at once,
         * and the input joins the run's inputs for the output guard. */
        if (fmt_input_fopen(o->input, &j->in, &err) != MC_OK) {
            fprintf(stderr, "mrun: --input: %s\n",
                    mc_error_format(&err, buf, sizeof buf));
            return 1;
        }
    } else {
        j->in = stdin;
    }
    /* Every input is open now: the output and the metrics file may not be
     * one of them, nor a device or a FIFO (the one output guard). */
    if (o->metrics && fmt_output_check_file(o->metrics, &err) != MC_OK) {
        fprintf(stderr, "mrun: --metrics: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    if (!strcmp(o->output, "-")) {
        j->out_fd = STDOUT_FILENO;
        return 0;
    }
    if (fmt_output_check_file(o->output, &err) != MC_OK) {
        fprintf(stderr, "mrun: --output: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    struct stat st;
    if (!o->resume && stat(o->output, &st) == 0 && st.st_size > 0) {
        fprintf(stderr,
                "mrun: %s exists (%lld bytes): add --resume to continue "
                "it, or remove it\n",
                o->output, (long long)st.st_size);
        return 2;
    }
    int rc = o->resume ? mrun_resume_load(o->output, o->quiet, &j->prev) : 0;
    if (rc)
        return rc;
    /* Appending, not a temp file + rename: a crash must leave every line
     * written so far for --resume (each line is one write()). */
    j->out_fd = open(o->output, O_WRONLY | O_CREAT | O_APPEND |
                                    (o->resume ? 0 : O_TRUNC), 0644);
    if (j->out_fd < 0) {
        fprintf(stderr, "mrun: cannot write %s: %s\n", o->output,
                strerror(errno));
        return 1;
    }
    j->out_is_file = 1;
    return 0;
}

/* ---- lines ---------------------------------------------------------------- */

/* The error line of e.  msg comes from the parser (it starts with "line
 * N: ") or from the session (about its one request, "sequence 0: "):
 * either way the line says "line N: what". */
static void fail_entry(job *j, entry *e, int status, const char *msg)
{
    e->plan = status == MC_ERR_PLAN;
    if (!strncmp(msg, "sequence 0: ", 12))
        msg += 12;
    if (strncmp(msg, "line ", 5))
        snprintf(e->msg, sizeof e->msg, "line %llu: %s",
                 (unsigned long long)e->req.line, msg);
    else
        snprintf(e->msg, sizeof e->msg, "%s", msg);
    e->failed = e->done = 1;
    j->refused[rt_metrics_reason_of_status(status)]++;
    if (j->o->verbose)
        fprintf(stderr, "mrun: %s\n", e->msg);
}

/* Inside the step (no allocation): feed the token to the matcher. */
static int on_token(void *ctx, size_t seq, const int32_t *ids, size_t n)
{
    (void)seq;
    entry *e = ctx;
    return rt_stop_match_push(&e->sm, ids[n - 1]);
}

/* The stop strings of a line (its own, then the job's) and a matcher
 * whose window is allocated now, not per token. */
static mc_status stop_strings(job *j, entry *e, mc_error *err)
{
    const rt_jsonl_req *r = &e->req;
    const mrun_job_opts *o = j->o;
    size_t n = r->n_stop_str + o->n_stop_str;
    if (n == 0)
        return MC_OK;
    mc_status st;
    if (!j->pieces && (st = rt_stop_pieces_build(j->tok, &j->pieces, err)))
        return st;
    e->sstr = malloc(n * sizeof *e->sstr);
    e->slen = malloc(n * sizeof *e->slen);
    if (!e->sstr || !e->slen)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "line buffers");
    for (size_t i = 0; i < r->n_stop_str; i++) {
        e->sstr[e->n_sstr] = r->stop_str[i];
        e->slen[e->n_sstr++] = r->stop_str_len[i];
    }
    for (size_t i = 0; i < o->n_stop_str; i++) {
        e->sstr[e->n_sstr] = o->stop_str[i];
        e->slen[e->n_sstr++] = o->stop_str_len[i];
    }
    e->swin_bytes = rt_stop_match_bytes(j->pieces, e->slen, n);
    e->swin = malloc(e->swin_bytes);
    if (!e->swin)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "line buffers");
    rt_stop_match_init(&e->sm, j->pieces, e->sstr, e->slen, n, e->swin);
    e->gp.on_token = on_token;
    e->gp.on_token_ctx = e;
    return MC_OK;
}

/* The heap bytes e holds: what it is charged against the hold budget
 * (the mallocs of this file and of its parsed request). */
static uint64_t entry_bytes(const entry *e)
{
    const rt_jsonl_req *r = &e->req;
    uint64_t n = rt_plan_heap_chunk(sizeof *e) + rt_jsonl_req_bytes(r);
    if (e->lab_lp)
        n += rt_plan_heap_chunk((r->n_labels + 1) * sizeof *e->lab_lp);
    if (e->cont_lp)
        n += rt_plan_heap_chunk((r->n_cont + 1) * sizeof *e->cont_lp);
    if (e->gen)
        n += rt_plan_heap_chunk((e->gen_cap + 1) * sizeof *e->gen);
    if (e->stops)
        n += rt_plan_heap_chunk((e->gp.n_stop + 1) * sizeof *e->stops);
    if (e->sstr)
        n += rt_plan_heap_chunk(e->n_sstr * sizeof *e->sstr) +
             rt_plan_heap_chunk(e->n_sstr * sizeof *e->slen);
    if (e->swin)
        n += rt_plan_heap_chunk(e->swin_bytes);
    return n;
}

/* The budget's cap on one line: a line may pass the hold budget only by
 * what one line can hold, so a longer request is an error line. */
static mc_status check_one_line(const job *j, entry *e, mc_error *err)
{
    e->bytes = entry_bytes(e);
    if (e->bytes <= j->budget.one_line_bytes)
        return MC_OK;
    return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                   "line %llu: its request holds %llu bytes, more than one "
                   "line may (%llu: %llu x --max-line-bytes + %llu x max_seq "
                   "+ %llu)", (unsigned long long)e->req.line,
                   (unsigned long long)e->bytes,
                   (unsigned long long)j->budget.one_line_bytes,
                   RT_JOB_LINE_PER_LINE_BYTE, RT_JOB_LINE_PER_TOKEN,
                   RT_JOB_LINE_BASE);
}

/* Buffers and parameters of a parsed line, then admission into slot. */
static mc_status admit_entry(job *j, entry *e, uint32_t slot, mc_error *err)
{
    const mrun_job_opts *o = j->o;
    rt_jsonl_req *r = &e->req;
    e->slot = slot;
    if (r->score) {
        e->lab_lp = calloc(r->n_labels + 1, sizeof *e->lab_lp);
        e->cont_lp = calloc(r->n_cont + 1, sizeof *e->cont_lp);
        if (!e->lab_lp || !e->cont_lp)
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "line buffers");
        e->item = (rt_score_item){
            .prompt = {r->ids, r->n_ids}, .cont = r->cont,
            .n_cont = r->n_cont, .cont_logprobs = e->cont_lp,
            .label_logprobs = r->n_labels ? e->lab_lp : NULL};
        e->labels = (rt_labels){(const int32_t *const *)r->label_seq,
                                r->label_len, NULL, r->n_labels};
        mc_status st = check_one_line(j, e, err);
        if (st)
            return st;
        return rt_session_admit_score_labels(j->s, slot, &e->item, &e->labels,
                                             (rt_truncate)o->truncate, err);
    }
    size_t ns = r->n_stop + o->n_stop + (size_t)j->info.n_eos;
    /* At most max_seq - 1 tokens can be generated (admission refuses
     * more): a line asking for a million must not make the job allocate
     * for them before it is refused. */
    size_t cap = r->max_new_tokens < j->info.max_seq
                     ? r->max_new_tokens
                     : (size_t)j->info.max_seq;
    e->gen_cap = cap;
    e->gen = malloc((cap + 1) * sizeof *e->gen);
    e->stops = malloc((ns + 1) * sizeof *e->stops);
    if (!e->gen || !e->stops)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "line buffers");
    ns = 0;
    for (size_t i = 0; i < r->n_stop; i++)
        e->stops[ns++] = r->stop[i];
    for (size_t i = 0; i < o->n_stop; i++)
        e->stops[ns++] = o->stop[i];
    for (int i = 0; o->use_model_eos && i < j->info.n_eos; i++)
        e->stops[ns++] = j->info.eos_ids[i];
    e->gp = (rt_gen_params){
        .max_new_tokens = r->max_new_tokens,
        .sampler = {r->temperature, r->top_k, r->top_p},
        .seed = r->seed, .seq_index0 = r->seq_index, .stop = e->stops,
        .n_stop = ns, .truncate = (rt_truncate)o->truncate};
    e->gres = (rt_gen_result){.ids = e->gen};
    mc_status st = stop_strings(j, e, err);
    if (st || (st = check_one_line(j, e, err)))
        return st;
    rt_prompt p = {r->ids, r->n_ids};
    return rt_session_admit_generate(j->s, slot, &p, &e->gp, &e->gres, err);
}

/* The results of e are in its buffers: its line is formatted when it is
 * written (write_entry). */
static void finish_entry(job *j, entry *e)
{
    e->done = 1;
    j->served++;
}

static int sink_write(void *ctx, const char *p, size_t n)
{
    const job *j = ctx;
    return write_all(j->out_fd, p, n);
}

/* Write the line of the finished entry e: its text decoded into the
 * front of the scratch, the line built behind it and written at once
 * (in pieces only when longer than the rest of the scratch). */
static mc_status write_entry(job *j, entry *e)
{
    const rt_jsonl_req *r = &e->req;
    char *sb = j->scratch.buf;
    size_t cap = j->scratch.cap, text_len = 0;
    rt_jsonl_result res = {0};
    if (!e->failed && r->score) {
        size_t S = (size_t)j->info.max_seq, x = rt_jsonl_score_extra(r);
        res.prompt_tokens = r->n_ids + x > S ? S - x : r->n_ids;
        res.label_logprobs = e->lab_lp;
        res.cont_logprobs = e->cont_lp;
    } else if (!e->failed) {
        res.prompt_tokens = e->gres.prompt_used;
        res.gen_ids = e->gen;
        res.n_gen = e->gres.n;
        res.stop_token = e->gres.stop == RT_STOP_TOKEN;
        res.stop_string = e->gres.stop == RT_STOP_STRING;
        size_t need = 0;
        if (j->tok) {
            rt_tokenizer_decode(j->tok, e->gen, e->gres.n, 1, NULL, 0, &need);
            /* Half the scratch for the text, at least half for the line:
             * max_seq tokens of even 256 bytes each fit the default. */
            if (need + 1 > cap / 2) {
                j->served--; /* an error line after all */
                fail_entry(j, e, MC_ERR_INVALID_ARG, "the generated text "
                           "does not fit half the job's scratch (raise "
                           "--max-line-bytes)");
            }
            else if (rt_tokenizer_decode(j->tok, e->gen, e->gres.n, 1, sb,
                                         need + 1, &text_len) == MC_OK)
                res.text = sb;
        }
        /* Cut before the stop string, as vLLM and OpenAI do. */
        if (res.text && res.stop_string)
            text_len = rt_stop_find(res.text, text_len,
                                    (const char *const *)e->sstr, e->slen,
                                    e->n_sstr);
        res.text_len = text_len;
        if (res.text) {
            size_t used = (text_len + 16) & ~(size_t)15;
            sb += used;
            cap -= used;
        }
    }
    rt_jsonl_sink sink = {sb, cap, sink_write, j};
    if (e->failed)
        return rt_jsonl_write_error(r->id, r->line, e->msg,
                                    e->plan ? j->info.max_batch : 0,
                                    e->plan ? j->info.max_seq : 0, &sink);
    return rt_jsonl_write_result(r, &res, &sink);
}

static entry *win_at(const job *j, size_t k)
{
    return j->win[(j->head + k) % j->cap];
}

/* Write the finished lines at the front of the window, in order. */
static void flush_ready(job *j)
{
    while (j->count > 0 && win_at(j, 0)->done) {
        entry *e = win_at(j, 0);
        if (!j->io_failed && write_entry(j, e) != MC_OK) {
            fprintf(stderr, "mrun: writing %s failed: %s\n", j->o->output,
                    strerror(errno));
            j->io_failed = 1;
        }
        j->written++;
        j->held -= e->bytes;
        entry_free(e);
        j->head = (j->head + 1) % j->cap;
        j->count--;
    }
}

/* The next input line into j->line, without its '\n': *len bytes kept,
 * *full its length (a line longer than the buffer is read past, not
 * kept: full > len).  Returns -1 at the end of the input. */
static int read_line(job *j, size_t *len, uint64_t *full)
{
    const size_t cap = (size_t)j->budget.line_bytes;
    size_t n = 0;
    uint64_t all = 0;
    int c;
    while ((c = getc_unlocked(j->in)) != EOF && c != '\n') {
        if (n < cap)
            j->line[n++] = (char)c;
        all++;
    }
    if (c == EOF && all == 0)
        return -1;
    *len = n;
    *full = all;
    return 0;
}

/* What a failed line keeps for its error line: its id. */
static void drop_request(entry *e)
{
    char *id = e->req.id;
    uint64_t line = e->req.line;
    e->req.id = NULL;
    entry_free_buffers(e);
    e->req.id = id;
    e->req.line = line;
}

/* Read, parse and (if it can run) admit the next non-blank line.  Returns
 * 0 when a line was taken, -1 at the end of the input. */
static int take_line(job *j)
{
    for (;;) {
        size_t len;
        uint64_t full;
        if (read_line(j, &len, &full) < 0)
            return -1;
        j->line_no++;
        if (full == len && rt_jsonl_is_blank(j->line, len))
            continue;
        entry *e = calloc(1, sizeof *e);
        if (!e) {
            fprintf(stderr, "mrun: out of memory\n");
            j->io_failed = 1;
            return -1;
        }
        mc_error err;
        mc_error_clear(&err);
        mc_status st;
        if (full > len) {
            /* Too long to hold: an error line under its line number. */
            e->req.line = j->line_no;
            st = mc_fail(&err, MC_ERR_FORMAT, NULL, NULL, -1,
                         "line %llu: %llu bytes, longer than "
                         "--max-line-bytes %llu (skipped)",
                         (unsigned long long)j->line_no,
                         (unsigned long long)full,
                         (unsigned long long)j->budget.line_bytes);
        } else {
            st = rt_jsonl_parse_in(j->line, len, j->line_no,
                                   &j->o->defaults, j->tok, &j->scratch,
                                   &e->req, &err);
        }
        /* A malformed line's error line is in the output too: skip it by
         * its id, which is its line number when it had no valid "id". */
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)j->line_no);
        if (st != MC_ERR_NOMEM &&
            mrun_resume_has(&j->prev, e->req.id ? e->req.id : num)) {
            entry_free(e);
            j->skipped++;
            continue;
        }
        if (st == MC_OK && (st = check_one_line(j, e, &err)) == MC_OK) {
            uint32_t slot = j->free_slots[j->n_free - 1];
            st = admit_entry(j, e, slot, &err);
            if (st == MC_OK) {
                j->n_free--;
                j->slot_entry[slot] = e;
            }
        } else if (st != MC_ERR_NOMEM && st != MC_ERR_INVALID_ARG) {
            st = MC_ERR_INVALID_ARG; /* malformed: refused as input */
        }
        if (st) {
            fail_entry(j, e, st, err.message);
            drop_request(e);
        }
        e->bytes = entry_bytes(e);
        j->held += e->bytes;
        if (j->held > j->held_peak)
            j->held_peak = j->held;
        j->win[(j->head + j->count++) % j->cap] = e;
        return 0;
    }
}

/* ---- figures -------------------------------------------------------------- */

static void fill_metrics(const job *j, rt_metrics *m, int final)
{
    rt_session_stats ss;
    rt_session_stats_get(j->s, &ss);
    rt_metrics_init(m);
    m->planned_bytes = j->planned;
    m->arena_bytes = j->info.arena_bytes;
    m->arena_high_water_bytes = rt_session_arena_high_water(j->s);
    /* A scan of the whole arena: only once, at the end. */
    m->arena_touched_bytes = final ? rt_session_arena_touched_bytes(j->s) : 0;
    m->peak_rss_bytes = rt_metrics_peak_rss_bytes();
    m->prefill_tokens = ss.prefill_tokens;
    m->prefill_seconds = ss.prefill_seconds;
    m->decode_tokens = ss.decode_tokens;
    m->decode_seconds = ss.decode_seconds;
    for (int r = 0; r < RT_REFUSE_COUNT_; r++)
        m->requests_refused[r] = j->refused[r];
    m->requests_served = j->served;
}

static void write_metrics(job *j, int final)
{
    if (!j->o->metrics)
        return;
    rt_metrics m;
    fill_metrics(j, &m, final);
    mc_error e;
    mc_error_clear(&e);
    /* A metrics file that cannot be written does not stop the job (the
     * results matter more); it is said once and fails the exit status. */
    if (rt_metrics_write_prometheus(&m, j->o->metrics, &e) != MC_OK &&
        !j->metrics_failed) {
        char buf[1400];
        fprintf(stderr, "mrun: cannot write metrics: %s\n",
                mc_error_format(&e, buf, sizeof buf));
        j->metrics_failed = 1;
    }
}

static void progress(job *j, int last)
{
    rt_session_stats ss;
    rt_session_stats_get(j->s, &ss);
    double el = now_s() - j->t0;
    uint64_t done = j->written + j->skipped;
    uint64_t failed = 0;
    for (int r = 0; r < RT_REFUSE_COUNT_; r++)
        failed += j->refused[r];
    char eta[32] = "?";
    if (j->total_lines && j->written > 0 && done <= j->total_lines) {
        double s = el / (double)j->written * (double)(j->total_lines - done);
        snprintf(eta, sizeof eta, "%dm%02ds", (int)(s / 60), (int)s % 60);
    }
    char total[32] = "?";
    if (j->total_lines)
        snprintf(total, sizeof total, "%llu",
                 (unsigned long long)j->total_lines);
    uint64_t rss = rt_metrics_peak_rss_bytes();
    fprintf(stderr,
            "\rmrun: %llu/%s lines (%llu failed), %.0f tok/s, ETA %s, "
            "slots %zu/%u busy, peak RSS %.0f of %.0f MiB planned   %s",
            (unsigned long long)done, total, (unsigned long long)failed,
            el > 0 ? (double)(ss.prefill_tokens + ss.decode_tokens) / el : 0,
            eta, rt_session_busy(j->s), j->info.max_batch,
            (double)rss / 1048576.0, (double)j->planned / 1048576.0,
            last ? "\n" : "");
}

/* Progress, metrics and a data sync, each at its own period. */
static void periodic(job *j)
{
    double t = now_s();
    if (j->progress && t - j->last_progress >= PROGRESS_PERIOD) {
        progress(j, 0);
        j->last_progress = t;
    }
    if (t - j->last_metrics >= j->o->metrics_period) {
        write_metrics(j, 0);
        if (j->out_is_file)
            fdatasync(j->out_fd);
        j->last_metrics = now_s();
        j->sync_seconds += j->last_metrics - t;
    }
}

/* ---- the loop ------------------------------------------------------------- */

/* Run one step and finish the entries whose slots it freed. */
static void step(job *j)
{
    mc_error err;
    mc_error_clear(&err);
    size_t nd = 0;
    double t = now_s();
    mc_status st = rt_session_step(j->s, j->done_slots, &nd, &err);
    j->step_seconds += now_s() - t;
    if (st) {
        /* The session freed every slot: those lines failed. */
        for (uint32_t b = 0; b < j->info.max_batch; b++)
            if (j->slot_entry[b]) {
                fail_entry(j, j->slot_entry[b], st, err.message);
                j->slot_entry[b] = NULL;
                j->free_slots[j->n_free++] = b;
            }
        return;
    }
    for (size_t k = 0; k < nd; k++) {
        uint32_t b = j->done_slots[k];
        finish_entry(j, j->slot_entry[b]);
        j->slot_entry[b] = NULL;
        j->free_slots[j->n_free++] = b;
    }
}

/* Back-pressure: no line is read while the held lines reach the budget,
 * unless none is held.  The oldest line is then always admitted or
 * already running, and each step moves it on, so a job never waits on
 * itself, whatever one line holds. */
static int budget_open(job *j)
{
    if (j->count == 0 || j->held < j->budget.hold_bytes)
        return 1;
    j->waits++;
    return 0;
}

static void run_loop(job *j)
{
    for (;;) {
        /* Waves: a new wave starts only when the last one is done. */
        int open = !j->o->waves || rt_session_busy(j->s) == 0;
        while (open && !j->eof && !g_stop_signal && !j->io_failed &&
               j->n_free > 0 && j->count < j->cap && budget_open(j))
            if (take_line(j) < 0)
                j->eof = 1;
        flush_ready(j);
        if (rt_session_busy(j->s) > 0)
            step(j);
        else if (j->eof || g_stop_signal || j->io_failed)
            break;
        flush_ready(j);
        periodic(j);
    }
    flush_ready(j);
}

static void job_free(job *j)
{
    for (size_t k = 0; k < j->count; k++)
        entry_free(win_at(j, k));
    free(j->win);
    free(j->slot_entry);
    free(j->free_slots);
    free(j->done_slots);
    free(j->line);
    free(j->scratch.buf);
    mrun_resume_free(&j->prev);
    rt_stop_pieces_free(j->pieces);
    if (j->in && j->in != stdin)
        fclose(j->in);
    if (j->out_is_file)
        close(j->out_fd);
}

/* The job's buffers (rt_plan.h rt_job_budget), checked against the plan
 * and allocated once.  Returns 0 or an exit code after a message. */
static int job_buffers(job *j)
{
    const mrun_job_opts *o = j->o;
    mc_error err;
    char buf[1400];
    if (rt_plan_job_budget(o->max_line_bytes ? o->max_line_bytes
                                             : RT_JOB_DEFAULT_LINE_BYTES,
                           o->hold_bytes ? o->hold_bytes
                                         : RT_JOB_DEFAULT_HOLD_BYTES,
                           j->info.max_seq, &j->budget, &err) != MC_OK) {
        fprintf(stderr, "mrun: %s\n", mc_error_format(&err, buf, sizeof buf));
        return 2;
    }
    const rt_job_budget *b = &j->budget;
    int cpu = j->info.device == MCRT_DEVICE_CPU;
    j->planned = j->info.planned_bytes + (cpu ? b->total_bytes : 0);
    if (cpu && j->info.target_bytes &&
        (j->info.planned_bytes > j->info.target_bytes ||
         b->total_bytes > j->info.target_bytes - j->info.planned_bytes)) {
        fprintf(stderr,
                "mrun: the job's buffers (%llu bytes for --max-line-bytes "
                "%llu and --hold-bytes %llu; docs/plan.md) do not fit the "
                "plan: %llu planned + %llu > target %llu; lower them, or "
                "recompile with a larger --target\n",
                (unsigned long long)b->total_bytes,
                (unsigned long long)b->line_bytes,
                (unsigned long long)b->hold_bytes,
                (unsigned long long)j->info.planned_bytes,
                (unsigned long long)b->total_bytes,
                (unsigned long long)j->info.target_bytes);
        return 2;
    }
    /* size_t: checked by rt_plan_job_budget's range (<= 8 GiB of
     * scratch) only on 64-bit hosts, where mrun runs. */
    j->line = malloc((size_t)b->line_bytes + 1);
    j->scratch.cap = (size_t)b->scratch_bytes;
    j->scratch.buf = malloc(j->scratch.cap);
    if (!j->line || !j->scratch.buf) {
        fprintf(stderr, "mrun: out of memory for the job's buffers (%llu "
                "bytes)\n", (unsigned long long)b->total_bytes);
        return 1;
    }
    return 0;
}

/* The closing summary.  Returns the exit code. */
static int summary(job *j)
{
    const mrun_job_opts *o = j->o;
    uint64_t failed = 0;
    for (int r = 0; r < RT_REFUSE_COUNT_; r++)
        failed += j->refused[r];
    rt_metrics m;
    fill_metrics(j, &m, 1);
    /* Overhead: the loop's wall time outside the model's steps (reading,
     * parsing, admission, formatting, writing), per line; the periodic
     * syncs cost per second, not per line, so they are said apart. */
    double el = j->t_end - j->t0;
    uint64_t run = j->written;
    if (!o->quiet || failed || j->prev.failed)
        fprintf(stderr,
                "mrun: %llu lines written (%llu failed: plan %llu, input "
                "%llu, other %llu), %llu skipped (--resume; %llu of them "
                "failed in an earlier run); prefill %llu "
                "tokens (%.1f tok/s), decode %llu tokens (%.1f tok/s); "
                "%.3f s, overhead %.3f ms/line (+ %.3f s of periodic "
                "syncs)\n",
                (unsigned long long)j->written, (unsigned long long)failed,
                (unsigned long long)j->refused[RT_REFUSE_PLAN],
                (unsigned long long)j->refused[RT_REFUSE_INPUT],
                (unsigned long long)j->refused[RT_REFUSE_OTHER],
                (unsigned long long)j->skipped,
                (unsigned long long)j->prev.failed,
                (unsigned long long)m.prefill_tokens,
                m.prefill_seconds > 0 ? m.prefill_tokens / m.prefill_seconds
                                      : 0.0,
                (unsigned long long)m.decode_tokens,
                m.decode_seconds > 0 ? m.decode_tokens / m.decode_seconds
                                     : 0.0,
                el,
                run ? 1e3 * (el - j->step_seconds - j->sync_seconds) /
                          (double)run
                    : 0.0,
                j->sync_seconds);
    if (o->verbose)
        fprintf(stderr,
                "mrun: job buffers %llu bytes: line %llu, scratch %llu, "
                "hold %llu (held at most %llu; reading waited %llu times), "
                "one line %llu\n",
                (unsigned long long)j->budget.total_bytes,
                (unsigned long long)j->budget.line_bytes + 1,
                (unsigned long long)j->budget.scratch_bytes,
                (unsigned long long)j->budget.hold_bytes,
                (unsigned long long)j->held_peak,
                (unsigned long long)j->waits,
                (unsigned long long)j->budget.one_line_bytes);
    if (o->verbose)
        fprintf(stderr,
                "mrun: memory: planned %llu (with the job's buffers), arena "
                "%llu (high water %llu, touched %llu), peak RSS %llu bytes\n",
                (unsigned long long)m.planned_bytes,
                (unsigned long long)m.arena_bytes,
                (unsigned long long)m.arena_high_water_bytes,
                (unsigned long long)m.arena_touched_bytes,
                (unsigned long long)m.peak_rss_bytes);
    if (o->verbose) {
        /* How the scheduler cut the work: rows per step is what the
         * matrix kernels get to amortize a weight read over. */
        rt_session_stats ss;
        rt_session_stats_get(j->s, &ss);
        uint64_t rows = ss.prefill_tokens + ss.decode_tokens;
        fprintf(stderr,
                "mrun: steps %llu (%.1f rows per step), logit rows %llu\n",
                (unsigned long long)ss.steps,
                ss.steps ? (double)rows / (double)ss.steps : 0.0,
                (unsigned long long)ss.logit_rows);
    }
    if (g_stop_signal)
        fprintf(stderr,
                "mrun: interrupted by signal %d: the lines in flight were "
                "finished and written; rerun with --resume to continue\n",
                (int)g_stop_signal);
    /* The status is the whole file's: lines that failed in an earlier run
     * of a resumed job count too. */
    return j->io_failed || j->metrics_failed || failed || j->prev.failed ||
                   g_stop_signal
               ? 1
               : 0;
}

int mrun_job_run(const mrun_job_opts *o, mcrt *h, const rt_tokenizer *tok)
{
    job j;
    memset(&j, 0, sizeof j);
    j.o = o;
    j.h = h;
    j.s = rt_api_session(h);
    j.tok = tok;
    j.out_fd = -1;
    mcrt_get_info(h, &j.info);
    const uint32_t B = j.info.max_batch;
    j.cap = (size_t)B * WINDOW_PER_SLOT + WINDOW_EXTRA;
    j.win = calloc(j.cap, sizeof *j.win);
    j.slot_entry = calloc(B, sizeof *j.slot_entry);
    j.free_slots = calloc(B, sizeof *j.free_slots);
    j.done_slots = calloc(B, sizeof *j.done_slots);
    if (!j.win || !j.slot_entry || !j.free_slots || !j.done_slots) {
        fprintf(stderr, "mrun: out of memory\n");
        job_free(&j);
        return 1;
    }
    int rc = job_buffers(&j);
    if (rc) {
        job_free(&j);
        return rc;
    }
    /* Slot 0 on top of the stack: the first line takes slot 0. */
    for (uint32_t b = 0; b < B; b++)
        j.free_slots[j.n_free++] = B - 1 - b;
    if (o->n_stop_str && !tok) {
        fprintf(stderr, "mrun: --stop-string needs a tokenizer (none is "
                "embedded in the artifact or beside the model)\n");
        job_free(&j);
        return 1;
    }
    rc = open_files(&j);
    if (rc) {
        job_free(&j);
        return rc;
    }
    j.progress = !o->quiet && isatty(STDERR_FILENO);
    if (j.progress && strcmp(o->input, "-"))
        j.total_lines = mrun_count_lines(o->input);
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART | SA_RESETHAND; /* a second signal kills */
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    j.t0 = j.last_progress = j.last_metrics = now_s();
    run_loop(&j);
    j.t_end = now_s();
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (j.out_is_file && fsync(j.out_fd) != 0 && !j.io_failed) {
        fprintf(stderr, "mrun: fsync %s failed: %s\n", o->output,
                strerror(errno));
        j.io_failed = 1;
    }
    if (j.progress)
        progress(&j, 1);
    write_metrics(&j, 1);
    rc = summary(&j);
    job_free(&j);
    return rc;
}

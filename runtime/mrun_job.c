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
#include "mrun_job_internal.h"

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
    if (o->metrics && rt_metrics_check_path(o->metrics, &err) != MC_OK) {
        fprintf(stderr, "mrun: --metrics: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    if (!strcmp(o->output, "-")) {
        j->out_fd = STDOUT_FILENO;
        return 0;
    }
    /* The results are appended in place (no rename), so an output that
     * is a link to an existing file (a DVC or git-annex path) is written
     * through: the guard checks the file it names.  A dangling link is
     * refused: creating its target would write wherever it points. */
    struct stat st;
    char *resolved = NULL;
    const char *out = o->output;
    if (lstat(out, &st) == 0 && S_ISLNK(st.st_mode)) {
        resolved = realpath(out, NULL);
        if (!resolved) {
            fprintf(stderr, "mrun: --output: %s is a symbolic link to "
                    "nothing (%s); name the file itself\n", out,
                    strerror(errno));
            return 1;
        }
        out = resolved;
    }
    int rc = 0;
    if (fmt_output_check_file(out, &err) != MC_OK) {
        fprintf(stderr, "mrun: --output: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        rc = 1;
    } else if (!o->resume && stat(out, &st) == 0 && st.st_size > 0) {
        fprintf(stderr,
                "mrun: %s exists (%lld bytes): add --resume to continue "
                "it, or remove it\n",
                o->output, (long long)st.st_size);
        rc = 2;
    } else if (o->resume) {
        rc = mrun_resume_load(out, o->quiet, &j->prev);
    }
    if (rc == 0) {
        /* Appending, not a temp file + rename: a crash must leave every
         * line written so far for --resume (each line is one write()). */
        j->out_fd = open(out, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW |
                                  (o->resume ? 0 : O_TRUNC), 0644);
        if (j->out_fd < 0) {
            fprintf(stderr, "mrun: cannot write %s: %s\n", o->output,
                    strerror(errno));
            rc = 1;
        }
    }
    free(resolved);
    if (rc)
        return rc;
    j->out_is_file = 1;
    return 0;
}

/* Write the finished lines at the front of the window, in order. */
static void flush_ready(job *j)
{
    while (j->count > 0 && mrun_win_at(j, 0)->done) {
        entry *e = mrun_win_at(j, 0);
        if (!j->io_failed && mrun_line_write(j, e) != MC_OK) {
            fprintf(stderr, "mrun: writing %s failed: %s\n", j->o->output,
                    strerror(errno));
            j->io_failed = 1;
        }
        j->written++;
        j->held -= e->bytes;
        mrun_line_free(e);
        j->head = (j->head + 1) % j->cap;
        j->count--;
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
                mrun_line_fail(j, j->slot_entry[b], st, err.message);
                j->slot_entry[b] = NULL;
                j->free_slots[j->n_free++] = b;
            }
        return;
    }
    for (size_t k = 0; k < nd; k++) {
        uint32_t b = j->done_slots[k];
        mrun_line_finish(j, j->slot_entry[b]);
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
            if (mrun_line_take(j) < 0)
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
        mrun_line_free(mrun_win_at(j, k));
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
    int rc = mrun_job_buffers(&j);
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
    if (!rc)
        rc = mrun_job_resume_fits(&j);
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

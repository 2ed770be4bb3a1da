/* mrun_job_lines.c - one line of the dataset job: read within the cap,
 * parsed in the scratch, charged to the hold budget, admitted, failed,
 * written; and the job's buffers (see mrun_job_internal.h, mrun_job.h). */
#include "mrun_job_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

void mrun_line_free(entry *e)
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

/* The error line of e.  msg comes from the parser (it starts with "line
 * N: ") or from the session (about its one request, "sequence 0: "):
 * either way the line says "line N: what". */
void mrun_line_fail(job *j, entry *e, int status, const char *msg)
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

/* The token text table of stop strings, built at the first line that
 * has them: its bytes join the job's planned bytes, and a table that
 * does not fit the target beside the job's buffers is refused (the
 * line's error says so; later lines are refused without building it). */
static mc_status stop_table(job *j, mc_error *err)
{
    if (j->pieces_refused)
        return mc_fail(err, MC_ERR_PLAN, NULL, "stop", -1, "%s",
                       j->pieces_why);
    mc_status st = rt_stop_pieces_build(j->tok, &j->pieces, err);
    if (st)
        return st;
    /* six blocks, each rounded up by malloc by less than 32 bytes */
    uint64_t tb = rt_stop_pieces_bytes(j->pieces) + 6 * 32;
    if (j->info.device != MCRT_DEVICE_CPU || !j->info.target_bytes ||
        j->planned + tb <= j->info.target_bytes) {
        if (j->info.device == MCRT_DEVICE_CPU)
            j->planned += tb;
        return MC_OK;
    }
    rt_stop_pieces_free(j->pieces);
    j->pieces = NULL;
    j->pieces_refused = 1;
    snprintf(j->pieces_why, sizeof j->pieces_why,
             "stop strings need the token text table (%llu bytes), which "
             "does not fit the plan's target %llu beside the job's %llu "
             "planned bytes; lower --hold-bytes",
             (unsigned long long)tb, (unsigned long long)j->info.target_bytes,
             (unsigned long long)j->planned);
    return mc_fail(err, MC_ERR_PLAN, NULL, "stop", -1, "%s", j->pieces_why);
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
    if (!j->pieces && (st = stop_table(j, err)))
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
 * written (mrun_line_write). */
void mrun_line_finish(job *j, entry *e)
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
mc_status mrun_line_write(job *j, entry *e)
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
                mrun_line_fail(j, e, MC_ERR_INVALID_ARG, "the generated text "
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
int mrun_line_take(job *j)
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
            mrun_line_free(e);
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
            mrun_line_fail(j, e, st, err.message);
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

/* The job's buffers (rt_plan.h rt_job_budget), checked against the plan
 * and allocated once.  Returns 0 or an exit code after a message. */
int mrun_job_buffers(job *j)
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

int mrun_job_resume_fits(job *j)
{
    uint64_t rb = mrun_resume_bytes(&j->prev);
    if (j->info.device != MCRT_DEVICE_CPU || rb == 0)
        return 0;
    j->planned += rb;
    if (!j->info.target_bytes || j->planned <= j->info.target_bytes)
        return 0;
    fprintf(stderr,
            "mrun: --resume: the ids of the %zu lines already written take "
            "%llu bytes, which with the job's buffers (%llu) do not fit the "
            "plan's target %llu beside its %llu planned; lower "
            "--hold-bytes by %llu\n",
            j->prev.n, (unsigned long long)rb,
            (unsigned long long)j->budget.total_bytes,
            (unsigned long long)j->info.target_bytes,
            (unsigned long long)j->info.planned_bytes,
            (unsigned long long)(j->planned - j->info.target_bytes));
    return 2;
}

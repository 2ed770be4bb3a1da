/* rt_sched.c - the one scheduler behind rt_session.h: request checks,
 * slots and continuous-batching admission, step planning, row
 * consumption (sampling, scoring, logits), statistics.  It drives any
 * backend of rt_backend.h (rt_cpu.c, rt_cuda*.c) through its function
 * table; nothing here knows where the arena lives.
 *
 * Everything that runs tokens (step_once below) touches only the tables
 * allocated at create and the backend's step tables; it never calls
 * mc_malloc. */
#include "rt_session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mc_alloc.h"
#include "rt_backend.h"
#include "rt_cuda.h"
#include "rt_request.h"

typedef enum run_mode {
    MODE_GENERATE = 0,
    MODE_SCORE = 1,
    MODE_LOGITS = 2,
} run_mode;


/* What one batch slot is doing: the request it serves and where its
 * results go (borrowed from the caller until the slot is reported done). */
typedef struct rt_slot {
    run_mode mode;
    const rt_gen_params *gp;   /* generate */
    rt_gen_result *gres;       /* generate: this slot's result */
    rt_score_item *item;       /* score */
    rt_labels labels;          /* score: the labels (views) */
    /* Score: 0 while the prompt (and continuation) run; k >= 1 while the
     * tokens of label k - 1 (of >= 2 tokens) are fed after the prompt,
     * over the same prompt KV.  acc: that label's log-prob so far. */
    size_t label_phase;
    double acc;
    float *logits_out;         /* logits: [n][vocab] */
} rt_slot;

struct rt_session {
    const rt_model *m;
    rt_backend be;             /* owned; be.layout is the session's plan */
    int broken;                /* a device call failed: refuse more work */
    rt_seq *seq;               /* [max_batch] */
    rt_slot *slot;             /* [max_batch] */
    /* Busy slots in admission order: prompt rows are scheduled oldest
     * request first, so the request that output waits for goes first. */
    uint32_t *order;           /* [max_batch] */
    size_t n_order;
    size_t *seg_seq;           /* [max_batch] slot of each segment */
    rt_step step;              /* the step being run (views of be.tab) */
    rt_session_stats stats;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mc_status rt_session_create_backend(const rt_model *model, rt_backend *be,
                                    rt_session **out, mc_error *err)
{
    *out = NULL;
    rt_session *s = mc_calloc(1, sizeof *s);
    const uint32_t B = be->layout.limits.max_batch;
    if (s) {
        s->seq = mc_calloc(B, sizeof *s->seq);
        s->slot = mc_calloc(B, sizeof *s->slot);
        s->order = mc_calloc(B, sizeof *s->order);
        s->seg_seq = mc_calloc(B, sizeof *s->seg_seq);
    }
    if (!s || !s->seq || !s->slot || !s->order || !s->seg_seq) {
        if (s)
            s->be.i = NULL; /* be is still the caller's */
        rt_session_free(s);
        be->i->free(be->ctx);
        memset(be, 0, sizeof *be);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "session tables");
    }
    s->m = model;
    s->be = *be;
    memset(be, 0, sizeof *be);
    s->step.seg_slot = s->seg_seq;
    s->step.dynamic_rope = model->cfg.rope.type == FMT_ROPE_DYNAMIC;
    *out = s;
    return MC_OK;
}

mc_status rt_session_create(const rt_model *model, const rt_limits *lim,
                            const rt_layout *layout, rt_session **out,
                            mc_error *err)
{
    return rt_session_create_on(model, lim, layout, RT_DEVICE_CPU, out, err);
}

mc_status rt_session_create_on(const rt_model *model, const rt_limits *lim,
                               const rt_layout *layout, rt_device dev,
                               rt_session **out, mc_error *err)
{
    *out = NULL;
    if (!model || !lim)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_session_create: NULL model or limits");
    if (dev == RT_DEVICE_CUDA)
        return rt_cuda_session_create(model, lim, layout, NULL, out, err);
    if (dev != RT_DEVICE_CPU)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "device", -1,
                       "unknown device %d (expected cpu or cuda)", (int)dev);
    rt_backend be;
    mc_status st = rt_cpu_backend_create(model, lim, layout, &be, err);
    if (st)
        return st;
    return rt_session_create_backend(model, &be, out, err);
}

mc_status rt_device_parse(const char *name, rt_device *out)
{
    if (name && strcmp(name, "cpu") == 0)
        *out = RT_DEVICE_CPU;
    else if (name && strcmp(name, "cuda") == 0)
        *out = RT_DEVICE_CUDA;
    else
        return MC_ERR_INVALID_ARG;
    return MC_OK;
}

const char *rt_device_name(rt_device dev)
{
    return dev == RT_DEVICE_CUDA ? "cuda" : dev == RT_DEVICE_CPU ? "cpu" : "?";
}

void rt_session_free(rt_session *s)
{
    if (!s)
        return;
    if (s->be.i)
        s->be.i->free(s->be.ctx);
    mc_free(s->seq);
    mc_free(s->slot);
    mc_free(s->order);
    mc_free(s->seg_seq);
    mc_free(s);
}

const rt_layout *rt_session_layout(const rt_session *s)
{
    return &s->be.layout;
}

const rt_model *rt_session_model(const rt_session *s)
{
    return s->m;
}

const rt_backend *rt_session_backend(const rt_session *s)
{
    return &s->be;
}

void rt_session_set_tap(rt_session *s, rt_tap_fn fn, void *ctx)
{
    if (s->be.i == &rt_cpu_backend_i)
        rt_cpu_backend_set_tap(s->be.ctx, fn, ctx);
}

uint64_t rt_session_arena_high_water(const rt_session *s)
{
    const uint8_t *a = s->be.host_arena;
    if (!a)
        return 0;
    uint64_t n = s->be.layout.arena_bytes;
    while (n > 0 && a[n - 1] == RT_CANARY)
        n--;
    return n;
}

uint64_t rt_session_arena_touched_bytes(const rt_session *s)
{
    const uint8_t *a = s->be.host_arena;
    uint64_t n = 0;
    for (uint64_t i = 0; a && i < s->be.layout.arena_bytes; i++)
        n += a[i] != RT_CANARY;
    return n;
}

void rt_session_stats_get(const rt_session *s, rt_session_stats *out)
{
    *out = s->stats;
}

void rt_session_reset_stats(rt_session *s)
{
    memset(&s->stats, 0, sizeof s->stats);
}

/* ---- the step loop (no allocation below this line) ----------------------- */

static int32_t tok_at(const rt_seq *q, size_t i)
{
    return i < q->na ? q->a[i] : q->b[i - q->na];
}

/* Does the row at position p of slot i need logits? */
static int row_needs_logits(const rt_session *s, size_t i, size_t p)
{
    const rt_seq *q = &s->seq[i];
    const rt_slot *sl = &s->slot[i];
    switch (sl->mode) {
    case MODE_GENERATE:
        /* The last available token of a sequence that still samples. */
        return p + 1 == q->na + q->nb && q->nb < sl->gp->max_new_tokens;
    case MODE_SCORE: {
        const rt_score_item *it = sl->item;
        if (sl->label_phase > 0) /* every label row scores the next token */
            return 1;
        if (p + 1 == q->na && sl->labels.n > 0)
            return 1;
        return p + 1 >= q->na && p + 1 < q->na + it->n_cont;
    }
    default:
        return 1;
    }
}

/* Use the logits lg of (slot i, position p); lg NULL: a backend's device
 * argmax gave the greedy token tok (generate slots only). */
static void consume_row(rt_session *s, size_t i, size_t p, float *lg,
                        int32_t tok)
{
    const uint32_t V = s->m->cfg.vocab_size;
    rt_seq *q = &s->seq[i];
    rt_slot *sl = &s->slot[i];
    if (sl->mode == MODE_LOGITS) {
        memcpy(sl->logits_out + p * V, lg, (size_t)V * sizeof(float));
        return;
    }
    if (sl->mode == MODE_SCORE) {
        rt_score_item *it = sl->item;
        const rt_labels *L = &sl->labels;
        if (sl->label_phase > 0) {
            /* Row p predicts token p + 1 - na of the label (>= 1): summed
             * in double in token order, as a continuation sum is. */
            size_t k = sl->label_phase - 1;
            sl->acc += rt_logprob(lg, V, L->seq[k][p + 1 - q->na]);
            it->label_logprobs[k] = (float)sl->acc;
            return;
        }
        if (p + 1 == q->na)
            for (size_t j = 0; j < L->n; j++)
                it->label_logprobs[j] = rt_logprob(
                    lg, V, L->seq ? L->seq[j][0] : L->ids[j]);
        if (p + 1 >= q->na && p + 1 < q->na + it->n_cont) {
            size_t c = p + 1 - q->na;
            it->cont_logprobs[c] = rt_logprob(lg, V, it->cont[c]);
        }
        return;
    }
    const rt_gen_params *gp = sl->gp;
    rt_gen_result *res = sl->gres;
    /* The watcher sees the logits before sampling overwrites them with
     * probabilities (rt_sample.h: the row is the sampler's scratch). */
    if (gp->on_logits && lg)
        gp->on_logits(gp->on_logits_ctx, i, q->nb, lg, V);
    int32_t t = lg ? rt_sample(&gp->sampler, lg, V, &q->rng, s->be.tab.index)
                   : tok;
    if (rt_is_stop(t, gp->stop, gp->n_stop)) {
        res->stop = RT_STOP_TOKEN;
        res->stop_token = t;
        q->done = 1;
        return;
    }
    res->ids[q->nb++] = t;
    res->n = q->nb;
    if (gp->on_token && gp->on_token(gp->on_token_ctx, i, res->ids, q->nb)) {
        res->stop = RT_STOP_STRING;
        q->done = 1;
        return;
    }
    if (q->nb >= gp->max_new_tokens) {
        res->stop = RT_STOP_LENGTH;
        q->done = 1;
    }
}

/* Lay out one step: one row for every decoding slot first, then prompt
 * rows of the slots still in prefill, oldest admission first, up to
 * prefill_chunk rows.  Returns the number of rows T (0: nothing to run). */
static size_t plan_step(rt_session *s, size_t *nseg_out, size_t *nrows_out,
                        size_t *n_decode_rows)
{
    const size_t C = s->be.layout.limits.prefill_chunk;
    const rt_step_tables *tb = &s->be.tab;
    size_t T = 0, nseg = 0, nrows = 0;
    *n_decode_rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < s->n_order && T < C; k++) {
            size_t i = s->order[k];
            rt_seq *q = &s->seq[i];
            size_t avail = q->na + q->nb;
            if (q->done || q->fed >= avail)
                continue;
            int decoding = s->slot[i].mode == MODE_GENERATE &&
                           q->fed >= q->na;
            if (decoding != (pass == 0))
                continue;
            size_t take = avail - q->fed;
            if (take > C - T)
                take = C - T;
            kn_block_segment *g = &tb->segs[nseg];
            g->kv = NULL; /* set per layer */
            g->pos0 = (int64_t)q->fed;
            g->count = take;
            g->rope = NULL;
            if (s->step.dynamic_rope) {
                /* transformers: a call's positions use seq_len = last
                 * position + 1 (floored at max_position_embeddings). */
                const fmt_model_config *c = &s->m->cfg;
                const fmt_rope *r = &c->rope;
                kn_rope *sr = &tb->slot_rope[i];
                kn_rope_init((int)r->type, r->theta, r->factor,
                             r->low_freq_factor, r->high_freq_factor,
                             c->max_position_embeddings, r->beta_fast,
                             r->beta_slow, r->attention_factor, c->head_dim,
                             q->fed + take, sr->inv_freq, &sr->attn_scale);
                g->rope = sr;
            }
            s->seg_seq[nseg++] = i;
            for (size_t t = 0; t < take; t++) {
                size_t p = q->fed + t;
                tb->ids[T + t] = tok_at(q, p);
                tb->pos[T + t] = (int64_t)p;
                if (row_needs_logits(s, i, p)) {
                    tb->rows[2 * nrows] = (int32_t)(T + t);
                    tb->rows[2 * nrows + 1] = (int32_t)i;
                    nrows++;
                }
            }
            if (decoding)
                *n_decode_rows += take;
            q->fed += take;
            T += take;
        }
    }
    *nseg_out = nseg;
    *nrows_out = nrows;
    return T;
}

/* 1 if every one of the n values is finite. */
static int row_is_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Take slot i out of the admission order and clear it. */
static void slot_release(rt_session *s, size_t k)
{
    size_t i = s->order[k];
    memset(&s->slot[i], 0, sizeof s->slot[i]);
    s->seq[i].done = 1;
    memmove(s->order + k, s->order + k + 1,
            (s->n_order - k - 1) * sizeof *s->order);
    s->n_order--;
}

/* Release every busy slot (after a failed step: their state is not
 * consistent any more). */
static void release_all(rt_session *s)
{
    while (s->n_order > 0)
        slot_release(s, s->n_order - 1);
}

/* May the head group rows[r0 .. r0+g) take a device argmax instead of
 * logits?  Only when every row is a greedy generate row nobody watches. */
static int group_is_greedy(const rt_session *s, size_t r0, size_t g)
{
    for (size_t j = 0; j < g; j++) {
        const rt_slot *sl = &s->slot[s->be.tab.rows[2 * (r0 + j) + 1]];
        if (sl->mode != MODE_GENERATE || sl->gp->sampler.temperature > 0.0f ||
            sl->gp->on_logits)
            return 0;
    }
    return 1;
}

/* The backend part of a step: upload, the blocks, the head groups (each
 * row's logits or token consumed as it comes back), finish. */
static mc_status run_backend(rt_session *s, mc_error *err)
{
    const rt_backend_i *bi = s->be.i;
    void *ctx = s->be.ctx;
    const rt_step_tables *tb = &s->be.tab;
    const rt_step *sp = &s->step;
    const uint32_t B = s->be.layout.limits.max_batch;
    const size_t V = s->m->cfg.vocab_size;
    mc_status st = bi->upload(ctx, sp, err);
    for (uint32_t l = 0; st == MC_OK && l < s->m->cfg.num_layers; l++)
        st = bi->block_forward(ctx, sp, l, err);
    /* Head: only the rows that need logits, max_batch at a time. */
    for (size_t r0 = 0; st == MC_OK && r0 < sp->nrows; r0 += B) {
        size_t g = sp->nrows - r0 < B ? sp->nrows - r0 : B;
        float *lg = NULL;
        const int32_t *tok = NULL;
        if ((st = bi->head(ctx, sp, r0, g, group_is_greedy(s, r0, g), &lg,
                           &tok, err)))
            break;
        for (size_t j = 0; j < g; j++) {
            size_t row = (size_t)tb->rows[2 * (r0 + j)];
            size_t i = (size_t)tb->rows[2 * (r0 + j) + 1];
            if (lg && !row_is_finite(lg + j * V, V))
                return mc_fail(err, MC_ERR_NONFINITE, NULL, "logits", -1,
                               "sequence %zu: logits at position %lld "
                               "are not finite (NaN or Inf in the "
                               "weights, or activations overflowed)",
                               i, (long long)tb->pos[row]);
            consume_row(s, i, (size_t)tb->pos[row], lg ? lg + j * V : NULL,
                        tok ? tok[j] : 0);
        }
    }
    if (st == MC_OK && bi->finish)
        st = bi->finish(ctx, err);
    return st;
}

/* A score slot whose rows have all run: start its next label of >= 2
 * tokens (fed from the prompt's end, overwriting the KV positions the
 * previous one used).  Returns 1 if one started, 0 if the slot is done. */
static int next_label(rt_session *s, size_t i)
{
    rt_slot *sl = &s->slot[i];
    rt_seq *q = &s->seq[i];
    const rt_labels *L = &sl->labels;
    if (sl->mode != MODE_SCORE || !L->seq)
        return 0;
    for (size_t k = sl->label_phase; k < L->n; k++) {
        size_t m = L->len[k];
        if (m < 2)
            continue;
        sl->label_phase = k + 1;
        sl->acc = (double)sl->item->label_logprobs[k]; /* the first token */
        q->b = L->seq[k];
        q->nb = m - 1;
        q->fed = q->na;
        return 1;
    }
    return 0;
}

/* Run one step over the busy slots.  Slots that finish are released and
 * appended to done[] (room for max_batch; may be NULL).  A logits row that
 * is not finite fails the step with MC_ERR_NONFINITE and releases every
 * slot: sampling or scoring it would silently give token 0 forever or NaN
 * log-probabilities.  A failed device call (MC_ERR_CUDA) also releases
 * every slot and leaves the session unusable. */
static mc_status step_once(rt_session *s, uint32_t *done, size_t *n_done,
                           mc_error *err)
{
    double t0 = now_seconds();
    size_t nseg, nrows, ndec;
    size_t T = plan_step(s, &nseg, &nrows, &ndec);
    s->step.T = T;
    s->step.nseg = nseg;
    s->step.nrows = nrows;
    mc_status st = T > 0 ? run_backend(s, err) : MC_OK;
    if (st) {
        release_all(s);
        if (st == MC_ERR_CUDA)
            s->broken = 1;
        return st;
    }
    /* Slots whose last row ran and that sample nothing more are done (a
     * step that ran no row means nothing is left to run: done too). */
    for (size_t k = s->n_order; k-- > 0;) {
        size_t i = s->order[k];
        rt_seq *q = &s->seq[i];
        if (!q->done && q->fed == q->na + q->nb &&
            (s->slot[i].mode != MODE_GENERATE ||
             q->nb >= s->slot[i].gp->max_new_tokens) &&
            (T == 0 || !next_label(s, i)))
            q->done = 1;
        if (q->done || T == 0) {
            if (done)
                done[(*n_done)++] = (uint32_t)i;
            slot_release(s, k);
        }
    }
    if (T == 0)
        return MC_OK;
    rt_request_count_step(&s->stats, T, ndec, nrows, now_seconds() - t0);
    return MC_OK;
}

/* Run steps until every slot of the call is done. */
static mc_status run_calls(rt_session *s, mc_error *err)
{
    mc_status st = MC_OK;
    while (s->n_order > 0 && st == MC_OK)
        st = step_once(s, NULL, NULL, err);
    return st;
}

/* ---- request checks and entry points -------------------------------------- */

/* The whole-call entry points need every slot: none may be busy with
 * admitted requests. */
static mc_status check_usable(const rt_session *s, mc_error *err)
{
    if (s->broken)
        return mc_fail(err, MC_ERR_CUDA, NULL, "session", -1,
                       "the %s session is unusable after an earlier device "
                       "failure; free it and create a new one",
                       s->be.i->name);
    return MC_OK;
}

static mc_status check_idle(const rt_session *s, mc_error *err)
{
    if (check_usable(s, err))
        return MC_ERR_CUDA;
    if (s->n_order > 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "session", -1,
                       "%zu admitted request(s) still running: step the "
                       "session until they are done first", s->n_order);
    return MC_OK;
}

/* Mark slots 0..n-1 busy with mode (the caller fills the rest). */
static void claim_first(rt_session *s, size_t n, run_mode mode)
{
    for (size_t i = 0; i < n; i++) {
        memset(&s->slot[i], 0, sizeof s->slot[i]);
        s->slot[i].mode = mode;
        s->order[i] = (uint32_t)i;
    }
    s->n_order = n;
}

mc_status rt_session_generate(rt_session *s, const rt_prompt *prompts,
                              size_t n, const rt_gen_params *p,
                              rt_gen_result *res, mc_error *err)
{
    mc_status st = check_idle(s, err);
    if (st || (st = rt_request_setup_generate(&s->be.layout.limits,
                                              s->m->cfg.vocab_size, s->seq,
                                              prompts, n, p, res, err)))
        return st;
    claim_first(s, n, MODE_GENERATE);
    for (size_t i = 0; i < n; i++) {
        s->slot[i].gp = p;
        s->slot[i].gres = &res[i];
    }
    return run_calls(s, err);
}

/* The labels as a slot holds them (none: n = 0). */
static rt_labels label_view(const rt_labels *l)
{
    rt_labels v = {NULL, NULL, NULL, 0};
    return l ? *l : v;
}

mc_status rt_session_score_labels(rt_session *s, rt_score_item *items,
                                  size_t n, const rt_labels *labels,
                                  rt_truncate truncate, mc_error *err)
{
    mc_status st = check_idle(s, err);
    if (st || (st = rt_request_setup_score(&s->be.layout.limits,
                                           s->m->cfg.vocab_size, s->seq, items,
                                           n, labels, truncate, err)))
        return st;
    claim_first(s, n, MODE_SCORE);
    for (size_t i = 0; i < n; i++) {
        s->slot[i].item = &items[i];
        s->slot[i].labels = label_view(labels);
    }
    return run_calls(s, err);
}

mc_status rt_session_score(rt_session *s, rt_score_item *items, size_t n,
                           const int32_t *labels, size_t n_labels,
                           rt_truncate truncate, mc_error *err)
{
    rt_labels l = {NULL, NULL, labels, n_labels};
    return rt_session_score_labels(s, items, n, &l, truncate, err);
}

mc_status rt_session_logits(rt_session *s, const rt_prompt *prompts,
                            size_t n, float *const *out, mc_error *err)
{
    mc_status st = check_idle(s, err);
    if (st || (st = rt_request_setup_logits(&s->be.layout.limits,
                                            s->m->cfg.vocab_size, s->seq,
                                            prompts, n, out, err)))
        return st;
    claim_first(s, n, MODE_LOGITS);
    for (size_t i = 0; i < n; i++)
        s->slot[i].logits_out = out[i];
    return run_calls(s, err);
}

/* ---- continuous batching: one request per free slot ------------------------ */

static mc_status check_free_slot(const rt_session *s, uint32_t slot,
                                 mc_error *err)
{
    const uint32_t B = s->be.layout.limits.max_batch;
    if (check_usable(s, err))
        return MC_ERR_CUDA;
    if (slot >= B)
        return mc_fail(err, MC_ERR_PLAN, NULL, "slot", -1,
                       "slot %u is outside the plan's max_batch %u", slot, B);
    for (size_t k = 0; k < s->n_order; k++)
        if (s->order[k] == slot)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "slot", -1,
                           "slot %u is busy", slot);
    return MC_OK;
}

static void admit(rt_session *s, uint32_t slot)
{
    s->order[s->n_order++] = slot;
}

mc_status rt_session_admit_generate(rt_session *s, uint32_t slot,
                                    const rt_prompt *prompt,
                                    const rt_gen_params *p,
                                    rt_gen_result *res, mc_error *err)
{
    mc_status st = check_free_slot(s, slot, err);
    if (st || (st = rt_request_setup_generate(&s->be.layout.limits,
                                              s->m->cfg.vocab_size,
                                              &s->seq[slot], prompt, 1, p,
                                              res, err)))
        return st;
    memset(&s->slot[slot], 0, sizeof s->slot[slot]);
    s->slot[slot].mode = MODE_GENERATE;
    s->slot[slot].gp = p;
    s->slot[slot].gres = res;
    admit(s, slot);
    return MC_OK;
}

mc_status rt_session_admit_score_labels(rt_session *s, uint32_t slot,
                                        rt_score_item *item,
                                        const rt_labels *labels,
                                        rt_truncate truncate, mc_error *err)
{
    mc_status st = check_free_slot(s, slot, err);
    if (st || (st = rt_request_setup_score(&s->be.layout.limits,
                                           s->m->cfg.vocab_size,
                                           &s->seq[slot], item, 1, labels,
                                           truncate, err)))
        return st;
    memset(&s->slot[slot], 0, sizeof s->slot[slot]);
    s->slot[slot].mode = MODE_SCORE;
    s->slot[slot].item = item;
    s->slot[slot].labels = label_view(labels);
    admit(s, slot);
    return MC_OK;
}

mc_status rt_session_admit_score(rt_session *s, uint32_t slot,
                                 rt_score_item *item, const int32_t *labels,
                                 size_t n_labels, rt_truncate truncate,
                                 mc_error *err)
{
    rt_labels l = {NULL, NULL, labels, n_labels};
    return rt_session_admit_score_labels(s, slot, item, &l, truncate, err);
}

mc_status rt_session_step(rt_session *s, uint32_t *done, size_t *n_done,
                          mc_error *err)
{
    *n_done = 0;
    if (s->n_order == 0)
        return MC_OK;
    return step_once(s, done, n_done, err);
}

size_t rt_session_busy(const rt_session *s)
{
    return s->n_order;
}

int rt_session_slot_is_busy(const rt_session *s, uint32_t slot)
{
    for (size_t k = 0; k < s->n_order; k++)
        if (s->order[k] == slot)
            return 1;
    return 0;
}

void rt_session_abort(rt_session *s)
{
    release_all(s);
}

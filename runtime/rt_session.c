/* rt_session.c - sessions: the arena, the step scheduler, the head, and
 * generation / scoring / logits on top (see rt_session.h).
 *
 * Everything that runs tokens (run_calls below) touches only the arena and
 * the tables allocated at create; it never calls mc_malloc. */
#include "rt_session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "mc_alloc.h"
#include "rt_plan.h"
#include "rt_request.h"

#define RT_CANARY 0xA5u

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
    const int32_t *labels;     /* score: n_labels label ids */
    size_t n_labels;
    float *logits_out;         /* logits: [n][vocab] */
} rt_slot;

struct rt_session {
    const rt_model *m;
    rt_layout layout;
    uint8_t *arena;            /* layout.arena_bytes, posix_memalign */
    kn_pool *pool;
    kn_kv *kv;                 /* [num_layers][max_batch] cache views */
    rt_seq *seq;               /* [max_batch] */
    rt_slot *slot;             /* [max_batch] */
    /* Busy slots in admission order: prompt rows are scheduled oldest
     * request first, so the request that output waits for goes first. */
    uint32_t *order;           /* [max_batch] */
    size_t n_order;
    kn_rope *slot_rope;        /* [max_batch] dynamic-NTK RoPE per slot */
    size_t *seg_seq;           /* [max_batch] slot of each segment */
    kn_rope rope;              /* default RoPE (inv_freq in the arena) */
    int dynamic_rope;          /* rope type is dynamic NTK */
    /* views of the arena buffers */
    int32_t *ids;
    int64_t *pos;
    kn_block_segment *segs;
    int32_t *rows;             /* [chunk][2]: (row, slot) */
    float *x, *hx, *logits, *probs;
    int32_t *index;
    kn_block_scratch scratch;
    /* calibration tap */
    rt_tap_fn tap;
    void *tap_ctx;
    uint32_t tap_layer;
    rt_session_stats stats;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *buf_at(rt_session *s, rt_buf_id id)
{
    return s->arena + s->layout.buf[id].offset;
}

static size_t kv_elem_bytes(kn_kvtype t)
{
    return t == KN_KV_F32 ? 4 : t == KN_KV_F16 ? 2 : 1;
}

mc_status rt_session_create(const rt_model *model, const rt_limits *lim,
                            const rt_layout *layout, rt_session **out,
                            mc_error *err)
{
    *out = NULL;
    if (!model || !lim)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_session_create: NULL model or limits");
    const fmt_model_config *c = &model->cfg;
    rt_layout built;
    mc_status st = rt_plan_session_layout(c, lim, layout, model->path, &built,
                                          err);
    if (st)
        return st;
    rt_session *s = mc_calloc(1, sizeof *s);
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "session");
    s->m = model;
    s->layout = built;
    const uint32_t B = built.limits.max_batch;
    if (built.arena_bytes > SIZE_MAX ||
        posix_memalign((void **)&s->arena, RT_LAYOUT_ALIGN,
                       (size_t)built.arena_bytes) != 0) {
        s->arena = NULL;
        rt_session_free(s);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "arena", -1,
                       "cannot allocate the %llu-byte arena (KV %llu bytes "
                       "for batch %u x max_seq %llu)",
                       (unsigned long long)built.arena_bytes,
                       (unsigned long long)built.kv_bytes, B,
                       (unsigned long long)built.limits.max_seq);
    }
    memset(s->arena, RT_CANARY, (size_t)built.arena_bytes);
    s->kv = mc_calloc((size_t)c->num_layers * B, sizeof *s->kv);
    s->seq = mc_calloc(B, sizeof *s->seq);
    s->slot = mc_calloc(B, sizeof *s->slot);
    s->order = mc_calloc(B, sizeof *s->order);
    s->slot_rope = mc_calloc(B, sizeof *s->slot_rope);
    s->seg_seq = mc_calloc(B, sizeof *s->seg_seq);
    s->pool = kn_pool_create(built.limits.threads);
    if (!s->kv || !s->seq || !s->slot || !s->order || !s->slot_rope || !s->seg_seq || !s->pool) {
        rt_session_free(s);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "session tables or thread pool");
    }

    /* KV views: layer l, slot b -> [cap][K], [cap][V], scales (I8). */
    const uint64_t kvd = (uint64_t)c->num_kv_heads * c->head_dim;
    const size_t esz = kv_elem_bytes(built.limits.kv_type);
    for (uint32_t l = 0; l < c->num_layers; l++) {
        uint64_t cap = rt_layout_kv_cap(c, &built.limits, l);
        for (uint32_t b = 0; b < B; b++) {
            kn_kv *kv = &s->kv[(size_t)l * B + b];
            uint8_t *base = s->arena + rt_layout_kv_offset(&built, c, l, b);
            kv->type = built.limits.kv_type;
            kv->n_kv_heads = c->num_kv_heads;
            kv->head_dim = c->head_dim;
            kv->cap = cap;
            kv->k = base;
            kv->v = base + cap * kvd * esz;
            if (kv->type == KN_KV_I8) {
                kv->k_scale = (float *)(base + 2 * cap * kvd * esz);
                kv->v_scale = kv->k_scale + cap * c->num_kv_heads;
            }
        }
    }

    s->ids = buf_at(s, RT_BUF_IDS);
    s->pos = buf_at(s, RT_BUF_POS);
    s->segs = buf_at(s, RT_BUF_SEGS);
    s->rows = buf_at(s, RT_BUF_ROWS);
    s->x = buf_at(s, RT_BUF_X);
    s->hx = buf_at(s, RT_BUF_HX);
    s->logits = buf_at(s, RT_BUF_LOGITS);
    s->probs = buf_at(s, RT_BUF_PROBS);
    s->index = buf_at(s, RT_BUF_INDEX);
    s->scratch.xb = buf_at(s, RT_BUF_XB);
    s->scratch.q = buf_at(s, RT_BUF_Q);
    s->scratch.k = buf_at(s, RT_BUF_K);
    s->scratch.v = buf_at(s, RT_BUF_V);
    s->scratch.att = buf_at(s, RT_BUF_ATT);
    s->scratch.hb = buf_at(s, RT_BUF_HB);
    s->scratch.hb2 = buf_at(s, RT_BUF_HB2);
    s->scratch.attn = buf_at(s, RT_BUF_ATTN_SCRATCH);
    s->scratch.int_dot = 1; /* int8 activations for Q8/Q4 (kn_qdot.h) */

    /* RoPE: the default table, and per-slot tables for dynamic NTK. */
    const fmt_rope *r = &c->rope;
    s->dynamic_rope = r->type == FMT_ROPE_DYNAMIC;
    s->rope.head_dim = c->head_dim;
    s->rope.inv_freq = buf_at(s, RT_BUF_ROPE);
    uint64_t orig = r->original_max_pos ? r->original_max_pos
                                        : c->max_position_embeddings;
    if (s->dynamic_rope)
        orig = c->max_position_embeddings; /* as transformers does */
    kn_rope_init((int)r->type, r->theta, r->factor, r->low_freq_factor,
                 r->high_freq_factor, orig, r->beta_fast, r->beta_slow,
                 r->attention_factor, c->head_dim, 0, s->rope.inv_freq,
                 &s->rope.attn_scale);
    float *slot_inv = buf_at(s, RT_BUF_ROPE_SLOT);
    for (uint32_t b = 0; b < B; b++) {
        s->slot_rope[b].head_dim = c->head_dim;
        s->slot_rope[b].inv_freq = slot_inv + (size_t)b * (c->head_dim / 2);
        s->slot_rope[b].attn_scale = 1.0f;
    }
    *out = s;
    return MC_OK;
}

void rt_session_free(rt_session *s)
{
    if (!s)
        return;
    kn_pool_free(s->pool);
    free(s->arena); /* posix_memalign'ed */
    mc_free(s->kv);
    mc_free(s->seq);
    mc_free(s->slot);
    mc_free(s->order);
    mc_free(s->slot_rope);
    mc_free(s->seg_seq);
    mc_free(s);
}

const rt_layout *rt_session_layout(const rt_session *s)
{
    return &s->layout;
}

const rt_model *rt_session_model(const rt_session *s)
{
    return s->m;
}

void rt_session_set_tap(rt_session *s, rt_tap_fn fn, void *ctx)
{
    s->tap = fn;
    s->tap_ctx = ctx;
}

uint64_t rt_session_arena_high_water(const rt_session *s)
{
    uint64_t n = s->layout.arena_bytes;
    const uint8_t *a = s->arena;
    while (n > 0 && a[n - 1] == RT_CANARY)
        n--;
    return n;
}

uint64_t rt_session_arena_touched_bytes(const rt_session *s)
{
    uint64_t n = 0;
    const uint8_t *a = s->arena;
    for (uint64_t i = 0; i < s->layout.arena_bytes; i++)
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
        if (p + 1 == q->na && sl->n_labels > 0)
            return 1;
        return p + 1 >= q->na && p + 1 < q->na + it->n_cont;
    }
    default:
        return 1;
    }
}

static void tap_adapter(void *ctx, kn_tap_point where, const float *x,
                        size_t T, size_t width)
{
    rt_session *s = ctx;
    s->tap(s->tap_ctx, s->tap_layer, where, x, T, width);
}

/* Use the logits lg of (slot i, position p). */
static void consume_row(rt_session *s, size_t i, size_t p, const float *lg)
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
        if (p + 1 == q->na)
            for (size_t j = 0; j < sl->n_labels; j++)
                it->label_logprobs[j] = rt_logprob(lg, V, sl->labels[j]);
        if (p + 1 >= q->na && p + 1 < q->na + it->n_cont) {
            size_t c = p + 1 - q->na;
            it->cont_logprobs[c] = rt_logprob(lg, V, it->cont[c]);
        }
        return;
    }
    const rt_gen_params *gp = sl->gp;
    rt_gen_result *res = sl->gres;
    int32_t t = rt_sample(&gp->sampler, lg, V, &q->rng, s->probs, s->index);
    if (gp->on_logits)
        gp->on_logits(gp->on_logits_ctx, i, q->nb, lg, V);
    if (rt_is_stop(t, gp->stop, gp->n_stop)) {
        res->stop = RT_STOP_TOKEN;
        res->stop_token = t;
        q->done = 1;
        return;
    }
    res->ids[q->nb++] = t;
    res->n = q->nb;
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
    const size_t C = s->layout.limits.prefill_chunk;
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
            kn_block_segment *g = &s->segs[nseg];
            g->kv = NULL; /* set per layer */
            g->pos0 = (int64_t)q->fed;
            g->count = take;
            g->rope = NULL;
            if (s->dynamic_rope) {
                /* transformers: a call's positions use seq_len = last
                 * position + 1 (floored at max_position_embeddings). */
                const fmt_model_config *c = &s->m->cfg;
                const fmt_rope *r = &c->rope;
                kn_rope *sr = &s->slot_rope[i];
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
                s->ids[T + t] = tok_at(q, p);
                s->pos[T + t] = (int64_t)p;
                if (row_needs_logits(s, i, p)) {
                    s->rows[2 * nrows] = (int32_t)(T + t);
                    s->rows[2 * nrows + 1] = (int32_t)i;
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

/* Run one step over the busy slots.  Slots that finish are released and
 * appended to done[] (room for max_batch; may be NULL).  A logits row that
 * is not finite fails the step with MC_ERR_NONFINITE and releases every
 * slot: sampling or scoring it would silently give token 0 forever or NaN
 * log-probabilities. */
static mc_status step_once(rt_session *s, uint32_t *done, size_t *n_done,
                           mc_error *err)
{
    const rt_model *m = s->m;
    const fmt_model_config *c = &m->cfg;
    const uint32_t B = s->layout.limits.max_batch;
    const size_t H = c->hidden_size, V = c->vocab_size;
    double t0 = now_seconds();
    size_t nseg, nrows, ndec;
    size_t T = plan_step(s, &nseg, &nrows, &ndec);
    for (size_t t = 0; t < T; t++)
        kn_matrix_row(&m->embed, (uint32_t)s->ids[t], s->x + t * H);
    for (uint32_t l = 0; T > 0 && l < c->num_layers; l++) {
        for (size_t g = 0; g < nseg; g++)
            s->segs[g].kv = &s->kv[(size_t)l * B + s->seg_seq[g]];
        s->tap_layer = l;
        kn_block_forward(s->pool, &m->layers[l].w, &m->layers[l].dims,
                         &s->rope, s->x, T, s->pos, s->segs, nseg,
                         &s->scratch, s->tap ? tap_adapter : NULL, s);
    }
    /* Head: only the rows that need logits, max_batch at a time. */
    for (size_t r0 = 0; r0 < nrows; r0 += B) {
        size_t g = nrows - r0 < B ? nrows - r0 : B;
        for (size_t j = 0; j < g; j++)
            kn_rmsnorm(s->hx + j * H,
                       s->x + (size_t)s->rows[2 * (r0 + j)] * H,
                       m->final_norm, 1, H, (float)c->rms_norm_eps);
        kn_matmul(s->pool, &m->lm_head, s->hx, g, s->logits, NULL);
        for (size_t j = 0; j < g; j++) {
            size_t row = (size_t)s->rows[2 * (r0 + j)];
            size_t i = (size_t)s->rows[2 * (r0 + j) + 1];
            if (!row_is_finite(s->logits + j * V, V)) {
                release_all(s);
                return mc_fail(err, MC_ERR_NONFINITE, NULL, "logits", -1,
                               "sequence %zu: logits at position %lld "
                               "are not finite (NaN or Inf in the "
                               "weights, or activations overflowed)",
                               i, (long long)s->pos[row]);
            }
            consume_row(s, i, (size_t)s->pos[row], s->logits + j * V);
        }
    }
    /* Slots whose last row ran and that sample nothing more are done (a
     * step that ran no row means nothing is left to run: done too). */
    for (size_t k = s->n_order; k-- > 0;) {
        size_t i = s->order[k];
        rt_seq *q = &s->seq[i];
        if (!q->done && q->fed == q->na + q->nb &&
            (s->slot[i].mode != MODE_GENERATE ||
             q->nb >= s->slot[i].gp->max_new_tokens))
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
static mc_status check_idle(const rt_session *s, mc_error *err)
{
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
    if (st || (st = rt_request_setup_generate(&s->layout.limits,
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

mc_status rt_session_score(rt_session *s, rt_score_item *items, size_t n,
                           const int32_t *labels, size_t n_labels,
                           rt_truncate truncate, mc_error *err)
{
    mc_status st = check_idle(s, err);
    if (st || (st = rt_request_setup_score(&s->layout.limits,
                                           s->m->cfg.vocab_size, s->seq, items,
                                           n, labels, n_labels, truncate,
                                           err)))
        return st;
    claim_first(s, n, MODE_SCORE);
    for (size_t i = 0; i < n; i++) {
        s->slot[i].item = &items[i];
        s->slot[i].labels = labels;
        s->slot[i].n_labels = n_labels;
    }
    return run_calls(s, err);
}

mc_status rt_session_logits(rt_session *s, const rt_prompt *prompts,
                            size_t n, float *const *out, mc_error *err)
{
    mc_status st = check_idle(s, err);
    if (st || (st = rt_request_setup_logits(&s->layout.limits,
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
    const uint32_t B = s->layout.limits.max_batch;
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
    if (st || (st = rt_request_setup_generate(&s->layout.limits,
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

mc_status rt_session_admit_score(rt_session *s, uint32_t slot,
                                 rt_score_item *item, const int32_t *labels,
                                 size_t n_labels, rt_truncate truncate,
                                 mc_error *err)
{
    mc_status st = check_free_slot(s, slot, err);
    if (st || (st = rt_request_setup_score(&s->layout.limits,
                                           s->m->cfg.vocab_size,
                                           &s->seq[slot], item, 1, labels,
                                           n_labels, truncate, err)))
        return st;
    memset(&s->slot[slot], 0, sizeof s->slot[slot]);
    s->slot[slot].mode = MODE_SCORE;
    s->slot[slot].item = item;
    s->slot[slot].labels = labels;
    s->slot[slot].n_labels = n_labels;
    admit(s, slot);
    return MC_OK;
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

/* rt_api.c - the public embedding API (mcrt.h) over rt_model + rt_session:
 * defaults, waves of max_batch, error strings, request counters and the
 * memory figures (planned vs allocated vs measured).  Calls after
 * mcrt_open do not allocate either (every table is sized at open). */
#include "mcrt.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fmt_mapguard.h"
#include "kn_cpus.h"
#include "kn_quant.h"
#include "mc_alloc.h"
#include "rt_api_internal.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"

#define MCRT_MAX_STOP 64

/* A slot's mcrt_gen_params.on_token and the sequence index it reports. */
typedef struct slot_hook {
    int (*fn)(void *ctx, uint64_t seq, const int32_t *ids, size_t n);
    void *ctx;
    uint64_t seq;
} slot_hook;

struct mcrt {
    rt_model *model;
    rt_session *sess;
    rt_limits limits;
    rt_prompt *prompts;        /* [max_batch] */
    rt_gen_result *gres;       /* [max_batch] */
    rt_score_item *items;      /* [max_batch] */
    float *cont_scratch;       /* [max_batch][max_seq] when per_token NULL */
    int32_t stop[MCRT_MAX_STOP];
    /* continuous batching (mcrt_submit_generate / mcrt_step), per slot */
    rt_gen_params *slot_gp;    /* [max_batch] */
    int32_t *slot_stop;        /* [max_batch][MCRT_MAX_STOP] */
    mcrt_result **slot_res;    /* [max_batch] the caller's result */
    slot_hook *hook;           /* [max_batch] the caller's on_token */
    /* memory figures, fixed at open (see mcrt_info) */
    uint64_t planned_bytes, reserve_bytes, weights_all_bytes;
    int plan_source;           /* MCRT_PLAN_* */
    int device;                /* MCRT_DEVICE_CPU / _CUDA */
    /* request counters (see mcrt_stats) */
    uint64_t requests, refused_plan, refused_input, refused_other;
    char err[1400];
};

static _Thread_local char g_open_err[1400];

static int set_err(mcrt *h, const mc_error *e)
{
    char *dst = h ? h->err : g_open_err;
    mc_error_format(e, dst, sizeof h->err);
    return (int)e->status;
}

static int set_msg(mcrt *h, int status, const char *msg)
{
    mc_error e;
    mc_error_clear(&e);
    mc_fail(&e, (mc_status)status, NULL, NULL, -1, "%s", msg);
    return set_err(h, &e);
}

void mcrt_options_default(mcrt_options *o)
{
    memset(o, 0, sizeof *o);
}

void mcrt_gen_params_default(mcrt_gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->max_new_tokens = 16;
    p->top_p = 1.0f;
    p->use_model_eos = 1;
}

rt_session *rt_api_session(mcrt *h)
{
    return h->sess;
}

const char *mcrt_last_error(const mcrt *h)
{
    return h ? h->err : g_open_err;
}

void mcrt_close(mcrt *h)
{
    if (!h)
        return;
    rt_session_free(h->sess);
    rt_model_free(h->model);
    mc_free(h->prompts);
    mc_free(h->gres);
    mc_free(h->items);
    mc_free(h->cont_scratch);
    mc_free(h->slot_gp);
    mc_free(h->slot_stop);
    mc_free(h->slot_res);
    mc_free(h->hook);
    mc_free(h);
}

static uint64_t matrix_bytes(const kn_matrix *w)
{
    if (!w->data)
        return 0;
    return kn_wformat_data_bytes(w->fmt, w->rows, w->cols) +
           kn_wformat_scale_bytes(w->fmt, w->rows, w->cols, w->group) +
           kn_wformat_zero_bytes(w->fmt, w->rows, w->cols, w->group);
}

/* Bytes of w that are not inside m->owned (counted there already: a
 * misaligned matrix the HF loader copied to f32). */
static uint64_t view_bytes(const rt_model *m, const kn_matrix *w)
{
    const uint8_t *p = w->data, *o = (const uint8_t *)m->owned;
    if (o && p >= o && p < o + m->owned_floats * sizeof(float))
        return 0;
    return matrix_bytes(w);
}

/* Every weight byte the model holds: the embedding, lm_head when untied,
 * the layer matrices and the owned f32 block (norms, biases, copies).  For
 * an artifact this equals the plan's weights_bytes. */
static uint64_t weights_all_bytes(const rt_model *m)
{
    uint64_t n = view_bytes(m, &m->embed) + m->owned_floats * sizeof(float);
    if (m->lm_head.data != m->embed.data)
        n += view_bytes(m, &m->lm_head);
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        const kn_block_weights *w = &m->layers[l].w;
        n += view_bytes(m, &w->wq) + view_bytes(m, &w->wk) +
             view_bytes(m, &w->wv) + view_bytes(m, &w->wo) +
             view_bytes(m, &w->w_gate) + view_bytes(m, &w->w_up) +
             view_bytes(m, &w->w_down);
    }
    return n;
}

/* planned_bytes and its parts.  An artifact's totals (with the device
 * reserve, which only the plan knows) are the loaded model's plan, read
 * and checked once by rt_plan_from_json; a model without one plans
 * weights + arena. */
static void plan_figures(mcrt *h, int changed)
{
    const rt_model *m = h->model;
    const uint64_t arena = rt_session_layout(h->sess)->arena_bytes;
    uint64_t weights = weights_all_bytes(m), total = 0, reserve = 0;
    h->weights_all_bytes = weights;
    h->plan_source = MCRT_PLAN_RUNTIME;
    if (m->has_plan) {
        h->plan_source = changed ? MCRT_PLAN_OVERRIDDEN : MCRT_PLAN_STORED;
        total = m->plan.total_bytes;
        reserve = m->plan.reserve_bytes;
        weights = m->plan.weights_bytes;
    }
    h->reserve_bytes = reserve;
    if (h->plan_source != MCRT_PLAN_STORED)
        total = weights + arena + reserve;
    h->planned_bytes = total;
}

int mcrt_is_artifact(const char *path)
{
    return path ? rt_artifact_is(path) : 0;
}

const char *mcrt_tokenizer_json(const mcrt *h, size_t *len)
{
    size_t n = 0;
    const char *t = h ? rt_artifact_tokenizer(h->model, &n) : NULL;
    if (len)
        *len = t ? n : 0;
    return t;
}

/* Count n sequences of the current call as refused with status; returns
 * status. */
static int refuse(mcrt *h, size_t n, int status)
{
    if (status == MC_ERR_PLAN)
        h->refused_plan += n;
    else if (status == MC_ERR_INVALID_ARG)
        h->refused_input += n;
    else
        h->refused_other += n;
    return status;
}

int mcrt_open(const char *path, const mcrt_options *opts, mcrt **out)
{
    mc_error e;
    mc_error_clear(&e);
    g_open_err[0] = '\0';
    *out = NULL;
    if (!path)
        return set_msg(NULL, MC_ERR_INVALID_ARG, "mcrt_open: NULL path");
    mcrt_options o;
    if (opts)
        o = *opts;
    else
        mcrt_options_default(&o);
    mcrt *h = mc_calloc(1, sizeof *h);
    if (!h)
        return set_msg(NULL, MC_ERR_NOMEM, "mcrt_open: out of memory");
    mc_status st = rt_model_open(path, &h->model, &e);
    if (st) {
        mcrt_close(h);
        return set_err(NULL, &e);
    }
    const rt_model *m = h->model;
    rt_limits L;
    if (m->has_plan)
        L = m->plan.layout.limits;
    else
        rt_limits_default(&m->cfg, &L);
    if (!m->has_plan) {
        /* Size a plan-less session for the request when asked to. */
        if (o.want_batch && !o.max_batch)
            L.max_batch = o.want_batch < 8 ? o.want_batch : 8;
        if (o.want_seq && !o.max_seq) {
            uint64_t mp = m->cfg.max_position_embeddings;
            L.max_seq = mp && o.want_seq > mp ? mp : o.want_seq;
        }
        if (o.want_seq && !o.prefill_chunk && L.prefill_chunk > L.max_seq *
                                                  L.max_batch)
            L.prefill_chunk = (uint32_t)(L.max_seq * L.max_batch);
    }
    int changed = 0;
    if (o.max_batch && o.max_batch != L.max_batch) {
        L.max_batch = o.max_batch;
        changed = 1;
    }
    if (o.max_seq && o.max_seq != L.max_seq) {
        L.max_seq = o.max_seq;
        changed = 1;
    }
    if (o.prefill_chunk && o.prefill_chunk != L.prefill_chunk) {
        L.prefill_chunk = o.prefill_chunk;
        changed = 1;
    }
    if (L.prefill_chunk < L.max_batch) {
        L.prefill_chunk = L.max_batch;
        changed = 1;
    }
    if (o.kv_type < 0 || o.kv_type > 3) {
        mcrt_close(h);
        return set_msg(NULL, MC_ERR_INVALID_ARG,
                       "mcrt_open: kv_type must be 0 (default), 1 (f32), "
                       "2 (f16) or 3 (int8)");
    }
    if (o.kv_type > 0 && (kn_kvtype)(o.kv_type - 1) != L.kv_type) {
        L.kv_type = (kn_kvtype)(o.kv_type - 1);
        changed = 1;
    }
    if (o.threads > 0) {
        L.threads = o.threads;
    } else if (L.threads > 0) {
        /* A plan sized for more threads than this process may use (it is
         * made for 4, whatever machine compiled it): one more thread than
         * CPUs makes every step wait on a parked one (kn_cpus.h), so run
         * on the CPUs there are; the plan's per-thread scratch just goes
         * partly unused. */
        int cpus = kn_cpu_count();
        if (L.threads > cpus)
            L.threads = cpus;
    }
    const rt_layout *plan = m->has_plan && !changed ? &m->plan.layout : NULL;
    if (o.device < MCRT_DEVICE_DEFAULT || o.device > MCRT_DEVICE_CUDA) {
        mcrt_close(h);
        return set_msg(NULL, MC_ERR_INVALID_ARG,
                       "mcrt_open: device must be 0 (the plan's), 1 (cpu) "
                       "or 2 (cuda)");
    }
    int cuda = o.device == MCRT_DEVICE_CUDA ||
               (o.device == MCRT_DEVICE_DEFAULT && m->plan.cuda);
    h->device = cuda ? MCRT_DEVICE_CUDA : MCRT_DEVICE_CPU;
    if ((st = rt_session_create_on(m, &L, plan,
                                   cuda ? RT_DEVICE_CUDA : RT_DEVICE_CPU,
                                   &h->sess, &e))) {
        mcrt_close(h);
        return set_err(NULL, &e);
    }
    h->limits = rt_session_layout(h->sess)->limits;
    size_t B = h->limits.max_batch;
    h->prompts = mc_calloc(B, sizeof *h->prompts);
    h->gres = mc_calloc(B, sizeof *h->gres);
    h->items = mc_calloc(B, sizeof *h->items);
    h->cont_scratch = mc_malloc_array(B * (size_t)h->limits.max_seq,
                                      sizeof(float));
    h->slot_gp = mc_calloc(B, sizeof *h->slot_gp);
    h->slot_stop = mc_calloc(B * MCRT_MAX_STOP, sizeof *h->slot_stop);
    h->slot_res = mc_calloc(B, sizeof *h->slot_res);
    h->hook = mc_calloc(B, sizeof *h->hook);
    if (!h->prompts || !h->gres || !h->items || !h->cont_scratch ||
        !h->slot_gp || !h->slot_stop || !h->slot_res || !h->hook) {
        mcrt_close(h);
        return set_msg(NULL, MC_ERR_NOMEM, "mcrt_open: out of memory");
    }
    plan_figures(h, plan == NULL);
    *out = h;
    return 0;
}

int mcrt_get_info(const mcrt *h, mcrt_info *out)
{
    memset(out, 0, sizeof *out);
    const rt_model *m = h->model;
    const rt_layout *l = rt_session_layout(h->sess);
    out->vocab_size = m->cfg.vocab_size;
    out->hidden_size = m->cfg.hidden_size;
    out->num_layers = m->cfg.num_layers;
    out->max_seq = l->limits.max_seq;
    out->max_batch = l->limits.max_batch;
    out->prefill_chunk = l->limits.prefill_chunk;
    out->threads = l->limits.threads;
    out->bos_id = m->cfg.bos_token_id;
    out->n_eos = m->cfg.n_eos < 8 ? m->cfg.n_eos : 8;
    for (int i = 0; i < out->n_eos; i++)
        out->eos_ids[i] = m->cfg.eos_token_ids[i];
    out->arena_bytes = l->arena_bytes;
    out->kv_bytes = l->kv_bytes;
    out->weight_bytes = m->weight_bytes;
    out->params = rt_model_param_count(m);
    out->planned_bytes = h->planned_bytes;
    out->reserve_bytes = h->reserve_bytes;
    out->weights_mapped_bytes = h->weights_all_bytes;
    out->plan_source = h->plan_source;
    out->device = h->device;
    /* The target the stored limits were planned in; limits changed at
     * open void it (the dataset job then checks nothing against it). */
    out->target_bytes = m->has_plan && h->plan_source == MCRT_PLAN_STORED
                            ? m->plan.target_bytes
                            : 0;
    return 0;
}

void mcrt_get_stats(const mcrt *h, mcrt_stats *out)
{
    rt_session_stats s;
    rt_session_stats_get(h->sess, &s);
    out->prefill_tokens = s.prefill_tokens;
    out->decode_tokens = s.decode_tokens;
    out->prefill_seconds = s.prefill_seconds;
    out->decode_seconds = s.decode_seconds;
    out->requests = h->requests;
    out->refused_plan = h->refused_plan;
    out->refused_input = h->refused_input;
    out->refused_other = h->refused_other;
    out->refused = h->refused_plan + h->refused_input + h->refused_other;
    out->arena_high_water_bytes = rt_session_arena_high_water(h->sess);
    out->arena_touched_bytes = rt_session_arena_touched_bytes(h->sess);
}

static int check_truncate(mcrt *h, int t)
{
    if (t < 0 || t > 2)
        return set_msg(h, MC_ERR_INVALID_ARG,
                       "truncate must be 0 (refuse), 1 (left) or 2 (right)");
    return 0;
}

/* A whole call while submitted requests run (mcrt_submit_generate) would
 * overwrite their per-slot state: refused. */
static int busy_refusal(mcrt *h)
{
    return set_msg(h, MC_ERR_INVALID_ARG,
                   "submitted requests are still running: call mcrt_step "
                   "until they are done before a whole call");
}

/* The session's parameters for p, its stop ids (the caller's, then the
 * model's EOS ids when asked) written to stop[MCRT_MAX_STOP].  0 or the
 * status of a refusal (message set). */
/* The session's on_token (seq: the slot) to the caller's (seq: the
 * request's index). */
static int hook_of_slot(void *ctx, size_t slot, const int32_t *ids, size_t n)
{
    const slot_hook *k = &((mcrt *)ctx)->hook[slot];
    return k->fn(k->ctx, k->seq, ids, n);
}

static int gen_params_of(mcrt *h, const mcrt_gen_params *p, int32_t *stop,
                         rt_gen_params *gp)
{
    int rc = check_truncate(h, p->truncate);
    if (rc)
        return rc;
    /* NaN compares false with everything: it would pass the sampler's
     * "<= 0 is greedy" test and sample from NaN weights. */
    if (!isfinite(p->temperature) || !isfinite(p->top_p))
        return set_msg(h, MC_ERR_INVALID_ARG,
                       "temperature and top_p must be finite");
    size_t n_stop = 0;
    if (p->n_stop > MCRT_MAX_STOP - 8)
        return set_msg(h, MC_ERR_INVALID_ARG, "too many stop tokens (max 56)");
    for (size_t i = 0; i < p->n_stop; i++)
        stop[n_stop++] = p->stop_ids[i];
    if (p->use_model_eos)
        for (int i = 0; i < h->model->cfg.n_eos; i++)
            stop[n_stop++] = h->model->cfg.eos_token_ids[i];
    memset(gp, 0, sizeof *gp);
    gp->max_new_tokens = p->max_new_tokens;
    gp->sampler.temperature = p->temperature;
    gp->sampler.top_k = p->top_k;
    gp->sampler.top_p = p->top_p;
    gp->seed = p->seed;
    gp->stop = stop;
    gp->n_stop = n_stop;
    gp->truncate = (rt_truncate)p->truncate;
    if (p->on_token) {
        gp->on_token = hook_of_slot;
        gp->on_token_ctx = h;
    }
    return 0;
}

int mcrt_generate(mcrt *h, const int32_t *const *prompts, const size_t *lens,
                  size_t n, const mcrt_gen_params *p, mcrt_result *results)
{
    h->err[0] = '\0';
    h->requests += n;
    if (rt_session_busy(h->sess) > 0) /* their slots hold submitted work */
        return refuse(h, n, busy_refusal(h));
    rt_gen_params gp;
    int rc = gen_params_of(h, p, h->stop, &gp);
    if (rc)
        return refuse(h, n, rc);
    const size_t B = h->limits.max_batch;
    for (size_t w0 = 0; w0 < n; w0 += B) {
        size_t k = n - w0 < B ? n - w0 : B;
        for (size_t i = 0; i < k; i++) {
            h->prompts[i].ids = prompts[w0 + i];
            h->prompts[i].n = lens[w0 + i];
            memset(&h->gres[i], 0, sizeof h->gres[i]);
            h->gres[i].ids = results[w0 + i].ids;
            h->hook[i] = (slot_hook){p->on_token, p->on_token_ctx, w0 + i};
        }
        gp.seq_index0 = w0;
        mc_error e;
        mc_error_clear(&e);
        mc_status st = rt_session_generate(h->sess, h->prompts, k, &gp,
                                           h->gres, &e);
        if (st == MC_OK) /* weights read from a file that shrank: no result */
            st = fmt_mapguard_check(&e);
        if (st)
            return refuse(h, n - w0, set_err(h, &e));
        for (size_t i = 0; i < k; i++) {
            results[w0 + i].n_ids = h->gres[i].n;
            results[w0 + i].stop_reason = (int)h->gres[i].stop;
            results[w0 + i].prompt_used = h->gres[i].prompt_used;
        }
    }
    return 0;
}

static int score_waves(mcrt *h, const int32_t *const *prompts,
                       const size_t *lens, size_t n, const rt_labels *labels,
                       float *label_out,
                       const int32_t *const *conts, const size_t *cont_lens,
                       float *const *per_token, double *sum, int truncate)
{
    h->err[0] = '\0';
    h->requests += n;
    if (rt_session_busy(h->sess) > 0) /* their slots hold submitted work */
        return refuse(h, n, busy_refusal(h));
    int rc = check_truncate(h, truncate);
    if (rc)
        return refuse(h, n, rc);
    const size_t B = h->limits.max_batch;
    const size_t S = (size_t)h->limits.max_seq;
    for (size_t w0 = 0; w0 < n; w0 += B) {
        size_t k = n - w0 < B ? n - w0 : B;
        for (size_t i = 0; i < k; i++) {
            rt_score_item *it = &h->items[i];
            memset(it, 0, sizeof *it);
            it->prompt.ids = prompts[w0 + i];
            it->prompt.n = lens[w0 + i];
            if (conts) {
                it->cont = conts[w0 + i];
                it->n_cont = cont_lens[w0 + i];
                if (it->n_cont > S)
                    return refuse(h, n - w0,
                                  set_msg(h, MC_ERR_PLAN,
                                          "continuation longer than "
                                          "max_seq"));
                it->cont_logprobs = per_token && per_token[w0 + i]
                                        ? per_token[w0 + i]
                                        : h->cont_scratch + i * S;
            }
            if (label_out)
                it->label_logprobs = label_out + (w0 + i) * labels->n;
        }
        mc_error e;
        mc_error_clear(&e);
        mc_status st = rt_session_score_labels(h->sess, h->items, k, labels,
                                               (rt_truncate)truncate, &e);
        if (st == MC_OK)
            st = fmt_mapguard_check(&e);
        if (st)
            return refuse(h, n - w0, set_err(h, &e));
        if (sum)
            for (size_t i = 0; i < k; i++) {
                double t = 0.0;
                for (size_t j = 0; j < h->items[i].n_cont; j++)
                    t += h->items[i].cont_logprobs[j];
                sum[w0 + i] = t;
            }
    }
    return 0;
}

int mcrt_score_labels(mcrt *h, const int32_t *const *prompts,
                      const size_t *lens, size_t n, const int32_t *labels,
                      size_t n_labels, float *out, int truncate)
{
    rt_labels l = {NULL, NULL, labels, n_labels};
    return score_waves(h, prompts, lens, n, &l, out, NULL, NULL, NULL, NULL,
                       truncate);
}

int mcrt_score_label_seqs(mcrt *h, const int32_t *const *prompts,
                          const size_t *lens, size_t n,
                          const int32_t *const *labels,
                          const size_t *label_lens, size_t n_labels,
                          float *out, int truncate)
{
    rt_labels l = {labels, label_lens, NULL, n_labels};
    return score_waves(h, prompts, lens, n, &l, out, NULL, NULL, NULL, NULL,
                       truncate);
}

int mcrt_score_continuations(mcrt *h, const int32_t *const *prompts,
                             const size_t *lens, size_t n,
                             const int32_t *const *conts,
                             const size_t *cont_lens, float *const *per_token,
                             double *sum, int truncate)
{
    return score_waves(h, prompts, lens, n, NULL, NULL, conts, cont_lens,
                       per_token, sum, truncate);
}

int mcrt_logits(mcrt *h, const int32_t *const *prompts, const size_t *lens,
                size_t n, float *const *out)
{
    h->err[0] = '\0';
    h->requests += n;
    if (rt_session_busy(h->sess) > 0) /* their slots hold submitted work */
        return refuse(h, n, busy_refusal(h));
    const size_t B = h->limits.max_batch;
    for (size_t w0 = 0; w0 < n; w0 += B) {
        size_t k = n - w0 < B ? n - w0 : B;
        for (size_t i = 0; i < k; i++) {
            h->prompts[i].ids = prompts[w0 + i];
            h->prompts[i].n = lens[w0 + i];
        }
        mc_error e;
        mc_error_clear(&e);
        mc_status st = rt_session_logits(h->sess, h->prompts, k, out + w0, &e);
        if (st == MC_OK)
            st = fmt_mapguard_check(&e);
        if (st)
            return refuse(h, n - w0, set_err(h, &e));
    }
    return 0;
}

/* ---- continuous batching -------------------------------------------------- */

size_t mcrt_free_slots(const mcrt *h)
{
    return h->limits.max_batch - rt_session_busy(h->sess);
}

int mcrt_submit_generate(mcrt *h, const int32_t *prompt, size_t len,
                         const mcrt_gen_params *p, uint64_t seq_index,
                         mcrt_result *result, uint32_t *slot_out)
{
    h->err[0] = '\0';
    h->requests++;
    uint32_t slot = 0;
    while (slot < h->limits.max_batch &&
           rt_session_slot_is_busy(h->sess, slot))
        slot++;
    if (slot == h->limits.max_batch)
        return refuse(h, 1, set_msg(h, MC_ERR_INVALID_ARG,
                                    "no free slot: call mcrt_step until "
                                    "mcrt_free_slots is > 0"));
    rt_gen_params *gp = &h->slot_gp[slot];
    int rc = gen_params_of(h, p, h->slot_stop + (size_t)slot * MCRT_MAX_STOP,
                           gp);
    if (rc)
        return refuse(h, 1, rc);
    gp->seq_index0 = seq_index;
    h->hook[slot] = (slot_hook){p->on_token, p->on_token_ctx, seq_index};
    rt_prompt pr = {.ids = prompt, .n = len};
    memset(&h->gres[slot], 0, sizeof h->gres[slot]);
    h->gres[slot].ids = result->ids;
    mc_error e;
    mc_error_clear(&e);
    mc_status st = rt_session_admit_generate(h->sess, slot, &pr, gp,
                                             &h->gres[slot], &e);
    if (st)
        return refuse(h, 1, set_err(h, &e));
    h->slot_res[slot] = result;
    if (slot_out)
        *slot_out = slot;
    return 0;
}

int mcrt_step(mcrt *h, uint32_t *done, size_t *n_done)
{
    h->err[0] = '\0';
    size_t busy = rt_session_busy(h->sess);
    mc_error e;
    mc_error_clear(&e);
    mc_status st = rt_session_step(h->sess, done, n_done, &e);
    if (st == MC_OK && *n_done > 0) /* weights from a file that shrank */
        st = fmt_mapguard_check(&e);
    if (st) {
        /* the session freed every slot: those requests are refused */
        *n_done = 0;
        return refuse(h, busy, set_err(h, &e));
    }
    for (size_t k = 0; k < *n_done; k++) {
        uint32_t b = done[k];
        mcrt_result *r = h->slot_res[b];
        r->n_ids = h->gres[b].n;
        r->stop_reason = (int)h->gres[b].stop;
        r->prompt_used = h->gres[b].prompt_used;
        h->slot_res[b] = NULL;
    }
    return 0;
}

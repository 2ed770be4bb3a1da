/* rt_cuda_step.c - the GPU session's step loop and requests.  The
 * scheduling (which rows a step takes, which rows need logits, sampling,
 * scoring, refusals) is rt_session.c's, line for line, so both backends
 * answer a request the same way; the forward pass is kn_block.c's order
 * with the kn_cuda_* ops.  Nothing here allocates (host tables and device
 * buffers come from create). */
#include "rt_cuda.h"

#ifdef MC_HAVE_CUDA

#include <string.h>
#include <time.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "rt_cuda_internal.h"
#include "rt_sample.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int32_t tok_at(const rt_seq *q, size_t i)
{
    return i < q->na ? q->a[i] : q->b[i - q->na];
}

static int row_needs_logits(const rt_cuda_session *s, size_t i, size_t p)
{
    const rt_seq *q = &s->seq[i];
    switch (s->mode) {
    case RT_CU_GENERATE:
        return p + 1 == q->na + q->nb && q->nb < s->gp->max_new_tokens;
    case RT_CU_SCORE: {
        const rt_score_item *it = &s->items[i];
        if (p + 1 == q->na && s->n_labels > 0)
            return 1;
        return p + 1 >= q->na && p + 1 < q->na + it->n_cont;
    }
    default:
        return 1;
    }
}

/* Lay out one step (rt_session.c's plan_step): decoding sequences first,
 * then prompt rows.  Fills the host ids/pos/rows/segs tables. */
static size_t plan_step(rt_cuda_session *s, size_t n, size_t *nseg_out,
                        size_t *nrows_out, size_t *n_decode_rows)
{
    const size_t C = s->layout.limits.prefill_chunk;
    const fmt_model_config *c = &s->m->cfg;
    const size_t half = c->head_dim / 2;
    size_t T = 0, nseg = 0, nrows = 0;
    *n_decode_rows = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n && T < C; i++) {
            rt_seq *q = &s->seq[i];
            size_t avail = q->na + q->nb;
            if (q->done || q->fed >= avail)
                continue;
            int decoding = s->mode == RT_CU_GENERATE && q->fed >= q->na;
            if (decoding != (pass == 0))
                continue;
            size_t take = avail - q->fed;
            if (take > C - T)
                take = C - T;
            kn_block_segment *g = &s->segs[nseg];
            g->kv = NULL;
            g->pos0 = (int64_t)q->fed;
            g->count = take;
            g->rope = NULL;
            if (s->dynamic_rope) {
                const fmt_rope *r = &c->rope;
                kn_rope_init((int)r->type, r->theta, r->factor,
                             r->low_freq_factor, r->high_freq_factor,
                             c->max_position_embeddings, r->beta_fast,
                             r->beta_slow, r->attention_factor, c->head_dim,
                             q->fed + take, s->slot_inv + i * half,
                             &s->slot_scale[i]);
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

/* Store `count` K and V rows at positions pos0.. into the ring (what
 * kn_kv_store does row by row, as contiguous runs of slots). */
static mc_status kv_store(rt_cuda_session *s, kn_kv *kv, int64_t pos0,
                          size_t count, const float *k, const float *v,
                          mc_error *err)
{
    const size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    size_t t = 0;
    while (t < count) {
        uint64_t slot = (uint64_t)(pos0 + (int64_t)t) % kv->cap;
        size_t run = count - t;
        if (run > kv->cap - slot)
            run = (size_t)(kv->cap - slot);
        size_t bytes = run * w * sizeof(float);
        cudaError_t e = cudaMemcpyAsync((float *)kv->k + slot * w, k + t * w,
                                        bytes, cudaMemcpyDeviceToDevice,
                                        s->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync((float *)kv->v + slot * w, v + t * w, bytes,
                                cudaMemcpyDeviceToDevice, s->stream);
        if (e != cudaSuccess)
            return rt_cu_fail(err, "KV store", e);
        t += run;
    }
    return MC_OK;
}

/* x += y (T*n floats) with cuBLAS. */
static mc_status add_into(rt_cuda_session *s, float *x, const float *y,
                          size_t n, mc_error *err)
{
    const float one = 1.0f;
    cublasStatus_t b = cublasSaxpy(s->blas, (int)n, &one, y, 1, x, 1);
    if (b != CUBLAS_STATUS_SUCCESS)
        return mc_fail(err, MC_ERR_CUDA, NULL, "cublasSaxpy", -1,
                       "residual add failed: %s", cublasGetStatusString(b));
    return MC_OK;
}

/* A kernel entry's status, with the failure recorded under its name. */
static mc_status kn_ok(mc_status st, const char *name, mc_error *err)
{
    return st ? rt_cu_fail_kn(err, name, st) : MC_OK;
}

/* kn_block_forward on the device for layer l (same order of ops). */
static mc_status block_forward(rt_cuda_session *s, uint32_t l, size_t T,
                               size_t nseg, mc_error *err)
{
    const rt_layer *L = &s->layers[l];
    const kn_block_weights *w = &L->w;
    const kn_block_dims *d = &L->dims;
    const kn_block_scratch *sc = &s->sc;
    const size_t C = s->layout.limits.prefill_chunk;
    const uint32_t B = s->layout.limits.max_batch;
    const size_t hidden = d->hidden, ffn = d->ffn;
    const size_t q_dim = (size_t)d->heads * d->head_dim;
    const size_t kv_dim = (size_t)d->kv_heads * d->head_dim;
    const size_t half = d->head_dim / 2;
    mc_status st;

    /* ---- attention ---- */
    if ((st = kn_ok(kn_cuda_rmsnorm(sc->xb, s->d_x, w->attn_norm, T, hidden,
                                    d->eps, s->stream),
                    "kn_cuda_rmsnorm", err)))
        return st;
    if ((st = rt_cu_matmul(s, &w->wq, sc->xb, T, sc->q, w->bq, C, err)) ||
        (st = rt_cu_matmul(s, &w->wk, sc->xb, T, sc->k, w->bk, C, err)) ||
        (st = rt_cu_matmul(s, &w->wv, sc->xb, T, sc->v, w->bv, C, err)))
        return st;
    size_t row = 0;
    for (size_t i = 0; i < nseg; i++) {
        const kn_block_segment *g = &s->segs[i];
        size_t slot = s->seg_seq[i];
        const float *inv = s->dynamic_rope ? s->d_rope_slot + slot * half
                                           : s->d_rope;
        float scale = s->dynamic_rope ? s->slot_scale[slot] : s->rope_scale;
        float *q = sc->q + row * q_dim;
        float *k = sc->k + row * kv_dim;
        if ((st = kn_ok(kn_cuda_rope_apply(q, inv, scale, d->head_dim,
                                           g->count, d->heads, s->d_pos + row,
                                           s->stream),
                        "kn_cuda_rope_apply", err)) ||
            (st = kn_ok(kn_cuda_rope_apply(k, inv, scale, d->head_dim,
                                           g->count, d->kv_heads,
                                           s->d_pos + row, s->stream),
                        "kn_cuda_rope_apply", err)))
            return st;
        kn_kv *kv = &s->kv[(size_t)l * B + slot];
        if ((st = kv_store(s, kv, g->pos0, g->count, k, sc->v + row * kv_dim,
                           err)))
            return st;
        if ((st = kn_ok(kn_cuda_attention(kv, q, g->count, d->heads, g->pos0,
                                          d->window, sc->att + row * q_dim,
                                          s->stream),
                        "kn_cuda_attention", err)))
            return st;
        row += g->count;
    }
    if ((st = rt_cu_matmul(s, &w->wo, sc->att, T, sc->xb, w->bo, C, err)) ||
        (st = add_into(s, s->d_x, sc->xb, T * hidden, err)))
        return st;

    /* ---- MLP ---- */
    if ((st = kn_ok(kn_cuda_rmsnorm(sc->xb, s->d_x, w->mlp_norm, T, hidden,
                                    d->eps, s->stream),
                    "kn_cuda_rmsnorm", err)))
        return st;
    if ((st = rt_cu_matmul(s, &w->w_gate, sc->xb, T, sc->hb, w->b_gate, C,
                           err)) ||
        (st = rt_cu_matmul(s, &w->w_up, sc->xb, T, sc->hb2, w->b_up, C, err)))
        return st;
    if ((st = kn_ok(kn_cuda_silu_mul(sc->hb, sc->hb2, T * ffn, s->stream),
                    "kn_cuda_silu_mul", err)))
        return st;
    if ((st = rt_cu_matmul(s, &w->w_down, sc->hb, T, sc->xb, w->b_down, C,
                           err)) ||
        (st = add_into(s, s->d_x, sc->xb, T * hidden, err)))
        return st;
    return MC_OK;
}

/* Sample / score / record row j of the head group (rt_session.c's
 * consume_row).  lg: host logits, or NULL with the greedy token in tok. */
static void consume_row(rt_cuda_session *s, size_t i, size_t p,
                        const float *lg, int32_t tok)
{
    const uint32_t V = s->m->cfg.vocab_size;
    rt_seq *q = &s->seq[i];
    if (s->mode == RT_CU_LOGITS) {
        memcpy(s->logits_out[i] + p * V, lg, (size_t)V * sizeof(float));
        return;
    }
    if (s->mode == RT_CU_SCORE) {
        rt_score_item *it = &s->items[i];
        if (p + 1 == q->na)
            for (size_t j = 0; j < s->n_labels; j++)
                it->label_logprobs[j] = rt_logprob(lg, V, s->labels[j]);
        if (p + 1 >= q->na && p + 1 < q->na + it->n_cont) {
            size_t c = p + 1 - q->na;
            it->cont_logprobs[c] = rt_logprob(lg, V, it->cont[c]);
        }
        return;
    }
    const rt_gen_params *gp = s->gp;
    rt_gen_result *res = &s->gres[i];
    int32_t t = lg ? rt_sample(&gp->sampler, lg, V, &q->rng, s->probs,
                               s->index)
                   : tok;
    if (gp->on_logits && lg)
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

/* Final norm + lm_head for rows r0 .. r0+g-1 of the rows table, then hand
 * each row's logits (or greedy token) to consume_row. */
static mc_status head_group(rt_cuda_session *s, size_t r0, size_t g,
                            mc_error *err)
{
    const fmt_model_config *c = &s->m->cfg;
    const size_t H = c->hidden_size, V = c->vocab_size;
    const size_t B = s->layout.limits.max_batch;
    mc_status st;
    /* normed rows into hx, one launch per run of consecutive rows */
    for (size_t j = 0; j < g;) {
        size_t row = (size_t)s->rows[2 * (r0 + j)], run = 1;
        while (j + run < g &&
               (size_t)s->rows[2 * (r0 + j + run)] == row + run)
            run++;
        if ((st = kn_ok(kn_cuda_rmsnorm(s->d_hx + j * H, s->d_x + row * H,
                                        s->final_norm, run, H,
                                        (float)c->rms_norm_eps, s->stream),
                        "kn_cuda_rmsnorm", err)))
            return st;
        j += run;
    }
    if ((st = rt_cu_matmul(s, &s->lm_head, s->d_hx, g, s->d_logits, NULL, B,
                           err)))
        return st;
    int greedy_dev = s->mode == RT_CU_GENERATE && s->d_tok &&
                     s->gp->sampler.temperature <= 0.0f && !s->gp->on_logits;
    cudaError_t e;
    if (greedy_dev) {
        for (size_t j = 0; j < g; j++)
            if ((st = kn_ok(kn_cuda_argmax(s->d_logits + j * V, V,
                                           s->d_tok + j, s->stream),
                            "kn_cuda_argmax", err)))
                return st;
        e = cudaMemcpyAsync(s->tok_host, s->d_tok, g * sizeof(uint32_t),
                            cudaMemcpyDeviceToHost, s->stream);
    } else {
        e = cudaMemcpyAsync(s->logits_host, s->d_logits, g * V * sizeof(float),
                            cudaMemcpyDeviceToHost, s->stream);
    }
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "logits download", e);
    for (size_t j = 0; j < g; j++) {
        size_t row = (size_t)s->rows[2 * (r0 + j)];
        size_t i = (size_t)s->rows[2 * (r0 + j) + 1];
        if (greedy_dev)
            consume_row(s, i, (size_t)s->pos[row], NULL,
                        (int32_t)s->tok_host[j]);
        else
            consume_row(s, i, (size_t)s->pos[row], s->logits_host + j * V, 0);
    }
    return MC_OK;
}

/* One step's input: embedding rows (host lookup), positions, dynamic RoPE
 * tables of the step's sequences. */
static mc_status upload_step(rt_cuda_session *s, size_t T, size_t nseg,
                             mc_error *err)
{
    const fmt_model_config *c = &s->m->cfg;
    const size_t H = c->hidden_size, half = c->head_dim / 2;
    for (size_t t = 0; t < T; t++)
        kn_matrix_row(&s->m->embed, (uint32_t)s->ids[t], s->x_host + t * H);
    cudaError_t e = cudaMemcpyAsync(s->d_x, s->x_host, T * H * sizeof(float),
                                    cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(s->d_pos, s->pos, T * sizeof(int64_t),
                            cudaMemcpyHostToDevice, s->stream);
    for (size_t g = 0; g < nseg && s->dynamic_rope && e == cudaSuccess; g++) {
        size_t i = s->seg_seq[g];
        e = cudaMemcpyAsync(s->d_rope_slot + i * half, s->slot_inv + i * half,
                            half * sizeof(float), cudaMemcpyHostToDevice,
                            s->stream);
    }
    return e == cudaSuccess ? MC_OK : rt_cu_fail(err, "step upload", e);
}

mc_status rt_cu_run_calls(rt_cuda_session *s, size_t n, mc_error *err)
{
    const fmt_model_config *c = &s->m->cfg;
    const uint32_t B = s->layout.limits.max_batch;
    mc_status st;
    for (;;) {
        double t0 = now_seconds();
        size_t nseg, nrows, ndec;
        size_t T = plan_step(s, n, &nseg, &nrows, &ndec);
        if (T == 0)
            break;
        if ((st = upload_step(s, T, nseg, err)))
            return st;
        for (uint32_t l = 0; l < c->num_layers; l++)
            if ((st = block_forward(s, l, T, nseg, err)))
                return st;
        for (size_t r0 = 0; r0 < nrows; r0 += B) {
            size_t g = nrows - r0 < B ? nrows - r0 : B;
            if ((st = head_group(s, r0, g, err)))
                return st;
        }
        cudaError_t e = cudaStreamSynchronize(s->stream);
        if (e != cudaSuccess)
            return rt_cu_fail(err, "step", e);
        for (size_t i = 0; i < n; i++) {
            rt_seq *q = &s->seq[i];
            if (!q->done && q->fed == q->na + q->nb &&
                (s->mode != RT_CU_GENERATE ||
                 q->nb >= s->gp->max_new_tokens))
                q->done = 1;
        }
        rt_request_count_step(&s->stats, T, ndec, nrows, now_seconds() - t0);
    }
    return MC_OK;
}

/* ---- request checks and entry points (rt_session.c's) -------------------- */

static mc_status check_usable(rt_cuda_session *s, mc_error *err)
{
    if (!s)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "NULL GPU session");
    if (s->broken)
        return mc_fail(err, MC_ERR_CUDA, NULL, "session", -1,
                       "the GPU session is unusable after an earlier CUDA "
                       "failure; free it and create a new one");
    return MC_OK;
}


/* Run the prepared call; a CUDA failure poisons the session. */
static mc_status run(rt_cuda_session *s, size_t n, mc_error *err)
{
    mc_status st = rt_cu_run_calls(s, n, err);
    if (st == MC_ERR_CUDA)
        s->broken = 1;
    return st;
}

mc_status rt_cuda_session_generate(rt_cuda_session *s,
                                   const rt_prompt *prompts, size_t n,
                                   const rt_gen_params *p,
                                   rt_gen_result *res, mc_error *err)
{
    mc_status st = check_usable(s, err);
    if (st || (st = rt_request_setup_generate(&s->layout.limits,
                                              s->m->cfg.vocab_size, s->seq,
                                              prompts, n, p, res, err)))
        return st;
    s->mode = RT_CU_GENERATE;
    s->gp = p;
    s->gres = res;
    st = run(s, n, err);
    s->gp = NULL;
    s->gres = NULL;
    return st;
}

mc_status rt_cuda_session_score(rt_cuda_session *s, rt_score_item *items,
                                size_t n, const int32_t *labels,
                                size_t n_labels, rt_truncate truncate,
                                mc_error *err)
{
    mc_status st = check_usable(s, err);
    if (st || (st = rt_request_setup_score(&s->layout.limits,
                                           s->m->cfg.vocab_size, s->seq, items,
                                           n, labels, n_labels, truncate,
                                           err)))
        return st;
    s->mode = RT_CU_SCORE;
    s->items = items;
    s->labels = labels;
    s->n_labels = n_labels;
    st = run(s, n, err);
    s->items = NULL;
    s->labels = NULL;
    return st;
}

mc_status rt_cuda_session_logits(rt_cuda_session *s,
                                 const rt_prompt *prompts, size_t n,
                                 float *const *out, mc_error *err)
{
    mc_status st = check_usable(s, err);
    if (st || (st = rt_request_setup_logits(&s->layout.limits,
                                            s->m->cfg.vocab_size, s->seq,
                                            prompts, n, out, err)))
        return st;
    s->mode = RT_CU_LOGITS;
    s->logits_out = out;
    st = run(s, n, err);
    s->logits_out = NULL;
    return st;
}

#endif /* MC_HAVE_CUDA */

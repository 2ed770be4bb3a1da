/* rt_cuda_step.c - the CUDA backend's forward pass (rt_backend.h): the
 * step upload, kn_block.c's order of ops per layer with the kn_cuda_*
 * kernels, the head with an optional device argmax.  The scheduling
 * (rows, logits, sampling, scoring, refusals) is rt_sched.c's, shared with
 * the CPU.  Nothing here allocates (host tables and device buffers come
 * from create). */
#include "rt_cuda.h"

#ifdef MC_CUDA_MODULE

#include <string.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "rt_cuda_internal.h"

/* Store `count` K and V rows at positions pos0.. into the ring (what
 * kn_kv_store does row by row, as contiguous runs of slots). */
static mc_status kv_store(rt_cu_backend *s, kn_kv *kv, int64_t pos0,
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
static mc_status add_into(rt_cu_backend *s, float *x, const float *y,
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
static mc_status cu_block_forward(void *ctx, const rt_step *sp, uint32_t l,
                                  mc_error *err)
{
    rt_cu_backend *s = ctx;
    const size_t T = sp->T, nseg = sp->nseg;
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
        const kn_block_segment *g = &s->tab.segs[i];
        size_t slot = sp->seg_slot[i];
        const float *inv = sp->dynamic_rope ? s->d_rope_slot + slot * half
                                            : s->d_rope;
        float scale = sp->dynamic_rope ? s->tab.slot_rope[slot].attn_scale
                                       : s->rope_scale;
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

/* Final norm + lm_head for rows r0 .. r0+g-1 of the rows table; the
 * logits (or, for an all-greedy group, the argmax tokens) come back to
 * the host. */
static mc_status cu_head(void *ctx, const rt_step *sp, size_t r0, size_t g,
                         int want_tokens, float **logits,
                         const int32_t **tokens, mc_error *err)
{
    (void)sp;
    rt_cu_backend *s = ctx;
    const fmt_model_config *c = &s->m->cfg;
    const size_t H = c->hidden_size, V = c->vocab_size;
    const size_t B = s->layout.limits.max_batch;
    mc_status st;
    /* normed rows into hx, one launch per run of consecutive rows */
    for (size_t j = 0; j < g;) {
        size_t row = (size_t)s->tab.rows[2 * (r0 + j)], run = 1;
        while (j + run < g &&
               (size_t)s->tab.rows[2 * (r0 + j + run)] == row + run)
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
    int greedy_dev = want_tokens && s->d_tok;
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
    *logits = greedy_dev ? NULL : s->logits_host;
    *tokens = greedy_dev ? s->tok_host : NULL;
    return MC_OK;
}

/* One step's input: embedding rows (host lookup), positions, dynamic RoPE
 * tables of the step's sequences. */
static mc_status cu_upload(void *ctx, const rt_step *sp, mc_error *err)
{
    rt_cu_backend *s = ctx;
    const size_t T = sp->T, nseg = sp->nseg;
    const fmt_model_config *c = &s->m->cfg;
    const size_t H = c->hidden_size, half = c->head_dim / 2;
    for (size_t t = 0; t < T; t++)
        kn_matrix_row(&s->m->embed, (uint32_t)s->tab.ids[t],
                      s->x_host + t * H);
    cudaError_t e = cudaMemcpyAsync(s->d_x, s->x_host, T * H * sizeof(float),
                                    cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(s->d_pos, s->tab.pos, T * sizeof(int64_t),
                            cudaMemcpyHostToDevice, s->stream);
    for (size_t g = 0; g < nseg && sp->dynamic_rope && e == cudaSuccess; g++) {
        size_t i = sp->seg_slot[g];
        e = cudaMemcpyAsync(s->d_rope_slot + i * half,
                            s->tab.slot_rope[i].inv_freq,
                            half * sizeof(float), cudaMemcpyHostToDevice,
                            s->stream);
    }
    return e == cudaSuccess ? MC_OK : rt_cu_fail(err, "step upload", e);
}

/* Wait for the step's kernels (a step without head rows has not synced). */
static mc_status cu_finish(void *ctx, mc_error *err)
{
    rt_cu_backend *s = ctx;
    cudaError_t e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? MC_OK : rt_cu_fail(err, "step", e);
}

const rt_backend_i rt_cu_backend_i = {
    .name = "cuda",
    .free = rt_cu_free,
    .upload = cu_upload,
    .block_forward = cu_block_forward,
    .head = cu_head,
    .finish = cu_finish,
};

#endif /* MC_CUDA_MODULE */

/* kn_block.c - one transformer block over a step of token rows (see
 * kn_block.h).  Reads top to bottom like the forward pass it is. */
#include "kn_block.h"

uint64_t kn_block_xb_floats(const kn_block_dims *d, uint64_t T)
{
    return T * d->hidden;
}

uint64_t kn_block_q_floats(const kn_block_dims *d, uint64_t T)
{
    return T * (uint64_t)d->heads * d->head_dim;
}

uint64_t kn_block_kv_floats(const kn_block_dims *d, uint64_t T)
{
    return T * (uint64_t)d->kv_heads * d->head_dim;
}

uint64_t kn_block_ffn_floats(const kn_block_dims *d, uint64_t T)
{
    return T * d->ffn;
}

uint64_t kn_block_attn_floats(const kn_block_dims *d, int nthreads,
                              uint64_t max_ctx)
{
    return kn_attention_scratch_floats(nthreads, max_ctx, d->head_dim);
}

void kn_block_forward(kn_pool *pool, const kn_block_weights *w,
                      const kn_block_dims *d, const kn_rope *rope, float *x,
                      size_t T, const int64_t *pos,
                      const kn_block_segment *seg, size_t nseg,
                      const kn_block_scratch *s, kn_tap_fn tap, void *tap_ctx)
{
    const size_t hidden = d->hidden;
    const size_t q_dim = (size_t)d->heads * d->head_dim;
    const size_t kv_dim = (size_t)d->kv_heads * d->head_dim;
    const size_t ffn = d->ffn;

    /* ---- attention ---- */
    kn_rmsnorm(s->xb, x, w->attn_norm, T, hidden, d->eps);
    if (tap)
        tap(tap_ctx, KN_TAP_QKV_IN, s->xb, T, hidden);
    kn_matmul(pool, &w->wq, s->xb, T, s->q, w->bq);
    kn_matmul(pool, &w->wk, s->xb, T, s->k, w->bk);
    kn_matmul(pool, &w->wv, s->xb, T, s->v, w->bv);

    size_t row = 0;
    for (size_t i = 0; i < nseg; i++) {
        const kn_block_segment *g = &seg[i];
        const kn_rope *r = g->rope ? g->rope : rope;
        float *q = s->q + row * q_dim;
        float *k = s->k + row * kv_dim;
        kn_rope_apply(r, q, g->count, d->heads, pos + row);
        kn_rope_apply(r, k, g->count, d->kv_heads, pos + row);
        /* Store the whole segment first: its later rows attend its
         * earlier ones through the cache. */
        for (size_t t = 0; t < g->count; t++)
            kn_kv_store(g->kv, g->pos0 + (int64_t)t, k + t * kv_dim,
                        s->v + (row + t) * kv_dim);
        kn_attention(pool, g->kv, q, g->count, d->heads, g->pos0, d->window,
                     s->att + row * q_dim, s->attn);
        row += g->count;
    }

    if (tap)
        tap(tap_ctx, KN_TAP_O_IN, s->att, T, q_dim);
    kn_matmul(pool, &w->wo, s->att, T, s->xb, w->bo);
    kn_add(x, s->xb, T * hidden);

    /* ---- MLP ---- */
    kn_rmsnorm(s->xb, x, w->mlp_norm, T, hidden, d->eps);
    if (tap)
        tap(tap_ctx, KN_TAP_GATE_UP_IN, s->xb, T, hidden);
    kn_matmul(pool, &w->w_gate, s->xb, T, s->hb, w->b_gate);
    kn_matmul(pool, &w->w_up, s->xb, T, s->hb2, w->b_up);
    kn_silu_mul(s->hb, s->hb2, T * ffn);
    if (tap)
        tap(tap_ctx, KN_TAP_DOWN_IN, s->hb, T, ffn);
    kn_matmul(pool, &w->w_down, s->hb, T, s->xb, w->b_down);
    kn_add(x, s->xb, T * hidden);
}

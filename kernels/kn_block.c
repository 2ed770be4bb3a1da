/* kn_block.c - one transformer block over a step of token rows (see
 * kn_block.h).  Reads top to bottom like the forward pass it is. */
#include "kn_block.h"

#include "kn_gemm_bf16.h"
#include "kn_qdot.h"

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

/* ---- the elementwise steps, split over the pool in a prefill ---------------
 * Each gives every value the bits of the one-thread call: rmsnorm and RoPE
 * work per row, and the flat steps (SiLU x up, the residual add) split at
 * multiples of EW_BLOCK values (a unit of kn_pool_rows: the claims are
 * n / (4 x threads) units), so the AVX2 loops' 8-value steps and scalar
 * tail fall where the whole call puts them. */
#define EW_BLOCK 64

typedef struct ew_job {
    float *out, *x2;
    const float *x, *w;
    size_t n, total; /* row length; flat: value count */
    float eps;
    const kn_rope *rope;
    uint32_t heads, kv_heads;
    const int64_t *pos;
} ew_job;

static void rmsnorm_rows(void *c, size_t t0, size_t t1)
{
    const ew_job *j = c;
    kn_rmsnorm(j->out + t0 * j->n, j->x + t0 * j->n, j->w, t1 - t0, j->n, j->eps);
}

static void rmsnorm_pool(kn_pool *pool, float *out, const float *x,
                         const float *w, size_t T, size_t n, float eps)
{
    ew_job j = {.out = out, .x = x, .w = w, .n = n, .eps = eps};
    kn_pool_rows(pool, T, kn_pool_min_values() / n + 1, rmsnorm_rows, &j);
}

/* out: q [T][heads][head_dim], x2: k [T][kv_heads][head_dim] */
static void rope_rows(void *c, size_t t0, size_t t1)
{
    const ew_job *j = c;
    size_t hd = j->rope->head_dim;
    kn_rope_apply(j->rope, j->out + t0 * j->heads * hd, t1 - t0, j->heads,
                  j->pos + t0);
    kn_rope_apply(j->rope, j->x2 + t0 * j->kv_heads * hd, t1 - t0, j->kv_heads,
                  j->pos + t0);
}

static void silu_blocks(void *c, size_t b0, size_t b1)
{
    const ew_job *j = c;
    size_t v0 = b0 * EW_BLOCK, v1 = b1 * EW_BLOCK < j->total ? b1 * EW_BLOCK : j->total;
    kn_silu_mul(j->out + v0, j->x + v0, v1 - v0);
}

static void add_blocks(void *c, size_t b0, size_t b1)
{
    const ew_job *j = c;
    size_t v0 = b0 * EW_BLOCK, v1 = b1 * EW_BLOCK < j->total ? b1 * EW_BLOCK : j->total;
    kn_add(j->out + v0, j->x + v0, v1 - v0);
}

static void flat_pool(kn_pool *pool, void (*fn)(void *, size_t, size_t),
                      float *y, const float *x, size_t total)
{
    ew_job j = {.out = y, .x = x, .total = total};
    kn_pool_rows(pool, (total + EW_BLOCK - 1) / EW_BLOCK,
                 kn_pool_min_values() / EW_BLOCK, fn, &j);
}

/* linears() with bf16_dot: the matrices kn_gemm_bf16 takes (when a row
 * of its packed input fits qbuf's qwidth floats) as one job on X rounded
 * once into qbuf, the rest as another on the float X. */
static void linears_bf16(kn_pool *pool, int floats_too, const float *X,
                         size_t T, size_t cols,
                         void *qbuf, size_t qwidth, int n,
                         const kn_matrix *const W[], float *const Y[],
                         const float *const B[])
{
    const kn_matrix *bw[KN_MATMUL_MULTI_MAX], *fw[KN_MATMUL_MULTI_MAX];
    float *by[KN_MATMUL_MULTI_MAX], *fy[KN_MATMUL_MULTI_MAX];
    const float *bb[KN_MATMUL_MULTI_MAX], *fb[KN_MATMUL_MULTI_MAX];
    int nb = 0, nf = 0;
    int fits = kn_bf16_act_bytes(1, (uint32_t)cols) <= (uint64_t)qwidth * sizeof(float);
    for (int i = 0; i < n; i++) {
        if (fits && kn_bf16_dot_supported(W[i]) &&
            (floats_too || W[i]->fmt != KN_W_F32))
            bw[nb] = W[i], by[nb] = Y[i], bb[nb++] = B[i];
        else
            fw[nf] = W[i], fy[nf] = Y[i], fb[nf++] = B[i];
    }
    if (nb) {
        kn_bf16_act_pack(X, T, (uint32_t)cols, qbuf);
        kn_matmul_bf16_multi(pool, nb, bw, qbuf, T, by, bb);
    }
    if (nf)
        kn_matmul_multi(pool, nf, fw, X, T, fy, fb);
}

/* Y[i] = X W[i]^T + B[i] for n <= KN_MATMUL_MULTI_MAX matrices sharing the
 * input X [T][cols].  On the integer path X is quantized into qbuf, an idle
 * scratch buffer of qwidth floats per row (for as many rows as X), once
 * for the kind the first integer matrix needs; the matrices of that kind
 * run as one job over the pool (kn_matmul_q_multi), the float ones as
 * another (kn_matmul_multi).  A matrix the integer path does not take
 * (f16, odd groups), or whose kind does not fit qbuf, gets the float X; one
 * of a second kind (no model mixes them in practice) is quantized after the
 * first group ran.  Which path a matrix takes depends on the model alone,
 * never on T. */
static void linears(kn_pool *pool, const kn_block_scratch *s, const float *X,
                    size_t T, size_t cols, void *qbuf, size_t qwidth, int n,
                    const kn_matrix *const W[], float *const Y[],
                    const float *const B[])
{
    if (s->bf16_dot && !s->int_dot) {
        linears_bf16(pool, s->bf16_dot > 1, X, T, cols, qbuf, qwidth, n, W, Y, B);
        return;
    }
    int on = s->int_dot && !kn_float_dot();
    const kn_matrix *qw[KN_MATMUL_MULTI_MAX], *fw[KN_MATMUL_MULTI_MAX];
    float *qy[KN_MATMUL_MULTI_MAX], *fy[KN_MATMUL_MULTI_MAX];
    const float *qb[KN_MATMUL_MULTI_MAX], *fb[KN_MATMUL_MULTI_MAX];
    int nq = 0, nf = 0, rest[KN_MATMUL_MULTI_MAX], nrest = 0;
    int kind = -1; /* the kind of the integer group */
    for (int i = 0; i < n; i++) {
        kn_qact_kind k = kn_qact_kind_of(W[i]);
        if (on && kn_qdot_supported(W[i]) &&
            kn_qact_bytes(k, 1, (uint32_t)cols) <= (uint64_t)qwidth * sizeof(float)) {
            if (kind < 0)
                kind = (int)k;
            if (kind != (int)k) {
                rest[nrest++] = i;
                continue;
            }
            qw[nq] = W[i], qy[nq] = Y[i], qb[nq++] = B[i];
        } else {
            fw[nf] = W[i], fy[nf] = Y[i], fb[nf++] = B[i];
        }
    }
    if (nq) {
        kn_qact_quantize_pool(pool, (kn_qact_kind)kind, X, T, (uint32_t)cols, qbuf);
        kn_matmul_q_multi(pool, nq, qw, qbuf, T, qy, qb);
    }
    if (nf)
        kn_matmul_multi(pool, nf, fw, X, T, fy, fb);
    for (int j = 0; j < nrest; j++) {
        int i = rest[j];
        kn_qact_quantize_pool(pool, kn_qact_kind_of(W[i]), X, T, (uint32_t)cols,
                              qbuf);
        kn_matmul_q(pool, W[i], qbuf, T, Y[i], B[i]);
    }
}

void kn_block_linear(kn_pool *pool, const kn_block_scratch *s,
                     const kn_matrix *W, const float *X, size_t T, float *Y,
                     const float *bias, void *qbuf, size_t qwidth)
{
    linears(pool, s, X, T, W->cols, qbuf, qwidth, 1,
            (const kn_matrix *const[]){W}, (float *const[]){Y},
            (const float *const[]){bias});
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

    const int start = s->tap_start;
    if (start <= 1 + KN_TAP_QKV_IN) {
        /* ---- attention ---- */
        rmsnorm_pool(pool, s->xb, x, w->attn_norm, T, hidden, d->eps);
        if (tap)
            tap(tap_ctx, KN_TAP_QKV_IN, s->xb, T, hidden);
        if (tap && s->tap_stop == 1 + KN_TAP_QKV_IN)
            return;
        linears(pool, s, s->xb, T, hidden, s->hb, ffn, 3,
                (const kn_matrix *const[]){&w->wq, &w->wk, &w->wv},
                (float *const[]){s->q, s->k, s->v},
                (const float *const[]){w->bq, w->bk, w->bv});

        size_t row = 0;
        for (size_t i = 0; i < nseg; i++) {
            const kn_block_segment *g = &seg[i];
            const kn_rope *r = g->rope ? g->rope : rope;
            float *q = s->q + row * q_dim;
            float *k = s->k + row * kv_dim;
            ew_job rj = {.out = q, .x2 = k, .rope = r, .heads = d->heads,
                         .kv_heads = d->kv_heads, .pos = pos + row};
            kn_pool_rows(pool, g->count,
                         kn_pool_min_values() / (q_dim + kv_dim) + 1, rope_rows,
                         &rj);
            /* Store the whole segment first: its later rows attend its
             * earlier ones through the cache. */
            for (size_t t = 0; t < g->count; t++)
                kn_kv_store(g->kv, g->pos0 + (int64_t)t, k + t * kv_dim,
                            s->v + (row + t) * kv_dim);
            kn_attention(pool, g->kv, q, g->count, d->heads, g->pos0, d->window,
                         s->att + row * q_dim, s->attn);
            row += g->count;
        }
    }

    if (start <= 1 + KN_TAP_O_IN) {
        if (tap)
            tap(tap_ctx, KN_TAP_O_IN, s->att, T, q_dim);
        if (tap && s->tap_stop == 1 + KN_TAP_O_IN)
            return;
        linears(pool, s, s->att, T, q_dim, s->hb, ffn, 1,
                (const kn_matrix *const[]){&w->wo}, (float *const[]){s->xb},
                (const float *const[]){w->bo});
        flat_pool(pool, add_blocks, x, s->xb, T * hidden);
    }

    /* ---- MLP ---- */
    rmsnorm_pool(pool, s->xb, x, w->mlp_norm, T, hidden, d->eps);
    if (tap)
        tap(tap_ctx, KN_TAP_GATE_UP_IN, s->xb, T, hidden);
    if (tap && s->tap_stop == 1 + KN_TAP_GATE_UP_IN)
        return;
    linears(pool, s, s->xb, T, hidden, s->q, q_dim, 2,
            (const kn_matrix *const[]){&w->w_gate, &w->w_up},
            (float *const[]){s->hb, s->hb2},
            (const float *const[]){w->b_gate, w->b_up});
    flat_pool(pool, silu_blocks, s->hb, s->hb2, T * ffn);
    if (tap)
        tap(tap_ctx, KN_TAP_DOWN_IN, s->hb, T, ffn);
    if (tap && s->tap_stop == 1 + KN_TAP_DOWN_IN)
        return;
    linears(pool, s, s->hb, T, ffn, s->hb2, ffn, 1,
            (const kn_matrix *const[]){&w->w_down}, (float *const[]){s->xb},
            (const float *const[]){w->b_down});
    if (tap && s->tap_down_out)
        tap(tap_ctx, KN_TAP_DOWN_OUT, s->xb, T, hidden);
    flat_pool(pool, add_blocks, x, s->xb, T * hidden);
}

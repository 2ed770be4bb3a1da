/* rt_cpu.c - the CPU backend of rt_backend.h: one posix_memalign'ed arena
 * laid out by rt_layout (KV cache, step tables, activations), the thread
 * pool, kn_block_forward per layer and the head on kn_matmul (kn_matmul_q
 * for an int8/int4 output layer).
 *
 * The step tables the scheduler writes live in the arena (RT_BUF_IDS ...),
 * so a CPU session holds nothing per token outside the plan.  Operations
 * never allocate. */
#include "rt_backend.h"

#include <stdlib.h>
#include <string.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "kn_qdot.h"
#include "mc_alloc.h"
#include "rt_plan.h"

typedef void (*cpu_tap_fn)(void *, uint32_t, kn_tap_point, const float *,
                           size_t, size_t);

typedef struct cpu_backend {
    const rt_model *m;
    rt_layout layout;          /* what the arena was laid out by */
    uint8_t *arena;            /* layout.arena_bytes, posix_memalign */
    kn_pool *pool;
    kn_kv *kv;                 /* [num_layers][max_batch] cache views */
    kn_rope rope;              /* default RoPE (inv_freq in the arena) */
    rt_step_tables tab;        /* arena views lent to the scheduler */
    float *x, *hx, *logits;    /* arena views */
    kn_block_scratch scratch;
    /* calibration tap */
    cpu_tap_fn tap;
    void *tap_ctx;
    uint32_t tap_layer;
} cpu_backend;

static void *buf_at(cpu_backend *b, rt_buf_id id)
{
    return b->arena + b->layout.buf[id].offset;
}

static size_t kv_elem_bytes(kn_kvtype t)
{
    return t == KN_KV_F32 ? 4 : t == KN_KV_F16 ? 2 : 1;
}

static void cpu_free(void *ctx)
{
    cpu_backend *b = ctx;
    if (!b)
        return;
    kn_pool_free(b->pool);
    free(b->arena); /* posix_memalign'ed */
    mc_free(b->kv);
    mc_free(b->tab.slot_rope);
    mc_free(b);
}

/* KV views: layer l, slot b -> [cap][K], [cap][V], scales (I8). */
static void set_kv_views(cpu_backend *b)
{
    const fmt_model_config *c = &b->m->cfg;
    const rt_layout *L = &b->layout;
    const uint32_t B = L->limits.max_batch;
    const uint64_t kvd = (uint64_t)c->num_kv_heads * c->head_dim;
    const size_t esz = kv_elem_bytes(L->limits.kv_type);
    for (uint32_t l = 0; l < c->num_layers; l++) {
        uint64_t cap = rt_layout_kv_cap(c, &L->limits, l);
        for (uint32_t s = 0; s < B; s++) {
            kn_kv *kv = &b->kv[(size_t)l * B + s];
            uint8_t *base = b->arena + rt_layout_kv_offset(L, c, l, s);
            kv->type = L->limits.kv_type;
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
}

static void set_views(cpu_backend *b)
{
    const fmt_model_config *c = &b->m->cfg;
    const uint32_t B = b->layout.limits.max_batch;
    b->tab.ids = buf_at(b, RT_BUF_IDS);
    b->tab.pos = buf_at(b, RT_BUF_POS);
    b->tab.segs = buf_at(b, RT_BUF_SEGS);
    b->tab.rows = buf_at(b, RT_BUF_ROWS);
    b->tab.index = buf_at(b, RT_BUF_INDEX);
    b->x = buf_at(b, RT_BUF_X);
    b->hx = buf_at(b, RT_BUF_HX);
    b->logits = buf_at(b, RT_BUF_LOGITS);
    b->scratch.xb = buf_at(b, RT_BUF_XB);
    b->scratch.q = buf_at(b, RT_BUF_Q);
    b->scratch.k = buf_at(b, RT_BUF_K);
    b->scratch.v = buf_at(b, RT_BUF_V);
    b->scratch.att = buf_at(b, RT_BUF_ATT);
    b->scratch.hb = buf_at(b, RT_BUF_HB);
    b->scratch.hb2 = buf_at(b, RT_BUF_HB2);
    b->scratch.attn = buf_at(b, RT_BUF_ATTN_SCRATCH);
    b->scratch.int_dot = 1; /* int8 activations for Q8/Q4 (kn_qdot.h) */

    /* RoPE: the default table, and per-slot tables for dynamic NTK. */
    const fmt_rope *r = &c->rope;
    int dynamic = r->type == FMT_ROPE_DYNAMIC;
    b->rope.head_dim = c->head_dim;
    b->rope.inv_freq = buf_at(b, RT_BUF_ROPE);
    uint64_t orig = r->original_max_pos ? r->original_max_pos
                                        : c->max_position_embeddings;
    if (dynamic)
        orig = c->max_position_embeddings; /* as transformers does */
    kn_rope_init((int)r->type, r->theta, r->factor, r->low_freq_factor,
                 r->high_freq_factor, orig, r->beta_fast, r->beta_slow,
                 r->attention_factor, c->head_dim, 0, b->rope.inv_freq,
                 &b->rope.attn_scale);
    float *slot_inv = buf_at(b, RT_BUF_ROPE_SLOT);
    for (uint32_t s = 0; s < B; s++) {
        b->tab.slot_rope[s].head_dim = c->head_dim;
        b->tab.slot_rope[s].inv_freq = slot_inv + (size_t)s * (c->head_dim / 2);
        b->tab.slot_rope[s].attn_scale = 1.0f;
    }
}

static mc_status cpu_upload(void *ctx, const rt_step *st, mc_error *err)
{
    (void)err;
    cpu_backend *b = ctx;
    const size_t H = b->m->cfg.hidden_size;
    for (size_t t = 0; t < st->T; t++)
        kn_matrix_row(&b->m->embed, (uint32_t)b->tab.ids[t], b->x + t * H);
    return MC_OK;
}

static void tap_adapter(void *ctx, kn_tap_point where, const float *x,
                        size_t T, size_t width)
{
    cpu_backend *b = ctx;
    b->tap(b->tap_ctx, b->tap_layer, where, x, T, width);
}

static mc_status cpu_block_forward(void *ctx, const rt_step *st, uint32_t l,
                                   mc_error *err)
{
    (void)err;
    cpu_backend *b = ctx;
    const rt_model *m = b->m;
    const uint32_t B = b->layout.limits.max_batch;
    for (size_t g = 0; g < st->nseg; g++)
        b->tab.segs[g].kv = &b->kv[(size_t)l * B + st->seg_slot[g]];
    b->tap_layer = l;
    kn_block_forward(b->pool, &m->layers[l].w, &m->layers[l].dims, &b->rope,
                     b->x, st->T, b->tab.pos, b->tab.segs, st->nseg,
                     &b->scratch, b->tap ? tap_adapter : NULL, b);
    return MC_OK;
}

static mc_status cpu_head(void *ctx, const rt_step *st, size_t r0, size_t g,
                          int want_tokens, float **logits,
                          const int32_t **tokens, mc_error *err)
{
    (void)st;
    (void)want_tokens; /* no device argmax: the scheduler samples */
    (void)err;
    cpu_backend *b = ctx;
    const rt_model *m = b->m;
    const size_t H = m->cfg.hidden_size;
    /* An int8/int4 output layer multiplies int8-quantized rows, as the
     * linears do (kn_qdot.h): the normed rows go to the logits buffer
     * first, which the product overwrites after, and are quantized into
     * hx, so the arena needs nothing more; rows the buffers cannot hold
     * that way (vocab < hidden) keep the float path.  Which path runs
     * depends on the model alone, never on g. */
    const kn_matrix *W = &m->lm_head;
    kn_qact_kind k = kn_qact_kind_of(W);
    int q = b->scratch.int_dot && !kn_float_dot() && kn_qdot_supported(W) &&
            (uint64_t)b->layout.limits.max_batch * H * sizeof(float) <=
                b->layout.buf[RT_BUF_LOGITS].bytes &&
            kn_qact_bytes(k, b->layout.limits.max_batch, (uint32_t)H) <=
                b->layout.buf[RT_BUF_HX].bytes;
    float *normed = q ? b->logits : b->hx;
    for (size_t j = 0; j < g; j++)
        kn_rmsnorm(normed + j * H,
                   b->x + (size_t)b->tab.rows[2 * (r0 + j)] * H,
                   m->final_norm, 1, H, (float)m->cfg.rms_norm_eps);
    if (q) {
        kn_qact_quantize(k, normed, g, (uint32_t)H, b->hx);
        kn_matmul_q(b->pool, W, b->hx, g, b->logits, NULL);
    } else {
        kn_matmul(b->pool, W, b->hx, g, b->logits, NULL);
    }
    *logits = b->logits;
    *tokens = NULL;
    return MC_OK;
}

const rt_backend_i rt_cpu_backend_i = {
    .name = "cpu",
    .free = cpu_free,
    .upload = cpu_upload,
    .block_forward = cpu_block_forward,
    .head = cpu_head,
    .finish = NULL,
};

void rt_cpu_backend_set_tap(void *ctx, cpu_tap_fn fn, void *tap_ctx)
{
    cpu_backend *b = ctx;
    b->tap = fn;
    b->tap_ctx = tap_ctx;
}

mc_status rt_cpu_backend_create(const rt_model *model, const rt_limits *lim,
                                const rt_layout *layout, rt_backend *out,
                                mc_error *err)
{
    memset(out, 0, sizeof *out);
    const fmt_model_config *c = &model->cfg;
    rt_layout built;
    /* The stored plan must be the one these limits give; its thread count
     * sized the attention scratch, so run with at most that many. */
    mc_status st = rt_plan_session_layout(c, lim, layout, model->path, &built,
                                          err);
    if (st)
        return st;
    cpu_backend *b = mc_calloc(1, sizeof *b);
    if (!b)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "session");
    out->i = &rt_cpu_backend_i;
    out->ctx = b;
    out->layout = built;
    b->m = model;
    b->layout = built;
    const uint32_t B = built.limits.max_batch;
    if (built.arena_bytes > SIZE_MAX ||
        posix_memalign((void **)&b->arena, RT_LAYOUT_ALIGN,
                       (size_t)built.arena_bytes) != 0) {
        b->arena = NULL;
        cpu_free(b);
        memset(out, 0, sizeof *out);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "arena", -1,
                       "cannot allocate the %llu-byte arena (KV %llu bytes "
                       "for batch %u x max_seq %llu)",
                       (unsigned long long)built.arena_bytes,
                       (unsigned long long)built.kv_bytes, B,
                       (unsigned long long)built.limits.max_seq);
    }
    memset(b->arena, RT_CANARY, (size_t)built.arena_bytes);
    b->kv = mc_calloc((size_t)c->num_layers * B, sizeof *b->kv);
    b->tab.slot_rope = mc_calloc(B, sizeof *b->tab.slot_rope);
    b->pool = kn_pool_create(built.limits.threads);
    if (!b->kv || !b->tab.slot_rope || !b->pool) {
        cpu_free(b);
        memset(out, 0, sizeof *out);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "session tables or thread pool");
    }
    set_kv_views(b);
    set_views(b);
    out->tab = b->tab;
    out->host_arena = b->arena;
    return MC_OK;
}

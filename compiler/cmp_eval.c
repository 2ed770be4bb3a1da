/* cmp_eval.c - sequence forward pass for calibration/evaluation, and the
 * KLD / top-1 / perplexity metrics (see cmp_eval.h). */
#include "cmp_eval.h"

#include "fmt_ids.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"

struct cmp_fwd {
    const rt_model *m;
    kn_pool *pool;
    size_t max_T;
    kn_rope rope;
    float *inv_freq;         /* [head_dim/2] */
    kn_kv kv;                /* one layer's F32 cache, cap max_T */
    kn_block_scratch s;
    int64_t *pos;            /* [max_T] 0..max_T-1 */
    float *mem;              /* every float buffer above, one block */
};

/* The parts of a forward context's one buffer, in floats (each rounded
 * up to 16 floats); returns their sum. */
static uint64_t fwd_sizes(const kn_block_dims *d, size_t max_T, int nth,
                          uint64_t sizes[10])
{
    uint64_t kvd = (uint64_t)d->kv_heads * d->head_dim;
    uint64_t s[10] = {
        d->head_dim / 2,
        max_T * kvd, max_T * kvd,             /* kv k, v */
        kn_block_xb_floats(d, max_T), kn_block_q_floats(d, max_T),
        kn_block_kv_floats(d, max_T), kn_block_kv_floats(d, max_T),
        kn_block_q_floats(d, max_T),          /* att */
        2 * kn_block_ffn_floats(d, max_T),    /* hb, hb2 */
        kn_block_attn_floats(d, nth, max_T),
    };
    uint64_t total = 0;
    for (int i = 0; i < 10; i++) {
        sizes[i] = s[i];
        total += (s[i] + 15) & ~(uint64_t)15;
    }
    return total;
}

uint64_t cmp_fwd_bytes(const fmt_model_config *c, size_t max_T, int threads)
{
    kn_block_dims d;
    rt_model_layer_dims(c, 0, &d);
    uint64_t sizes[10];
    return sizeof(cmp_fwd) + fwd_sizes(&d, max_T, threads > 0 ? threads : 1, sizes) *
                                 sizeof(float) +
           (uint64_t)max_T * sizeof(int64_t);
}

uint64_t cmp_eval_scores_bytes(const fmt_model_config *c, size_t max_T,
                               size_t positions)
{
    /* two logits buffers, the KLD list (doubling from 4096: at most twice
     * the positions, and old + new while it grows) and the percentile's
     * sorted copy */
    uint64_t cap = 4096;
    while (cap < positions)
        cap *= 2;
    uint64_t klds = positions ? cap * sizeof(double) : 0;
    uint64_t grow = klds + klds / 2;
    uint64_t report = klds + (uint64_t)positions * sizeof(double);
    return 2 * (uint64_t)max_T * c->vocab_size * sizeof(float) +
           (grow > report ? grow : report);
}

mc_status cmp_fwd_create(const rt_model *m, size_t max_T, kn_pool *pool,
                         cmp_fwd **out, mc_error *err)
{
    *out = NULL;
    const fmt_model_config *c = &m->cfg;
    kn_block_dims d;
    rt_model_layer_dims(c, 0, &d);
    if (max_T == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "max_T", -1,
                       "forward context for 0 tokens");
    cmp_fwd *f = mc_calloc(1, sizeof *f);
    if (!f)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "forward context");
    f->m = m;
    f->pool = pool;
    f->max_T = max_T;
    int nth = pool ? kn_pool_threads(pool) : 1;
    uint64_t sizes[10];
    uint64_t total = fwd_sizes(&d, max_T, nth, sizes);
    f->mem = mc_malloc_array((size_t)total, sizeof(float));
    f->pos = mc_malloc_array(max_T, sizeof(int64_t));
    if (!f->mem || !f->pos) {
        cmp_fwd_free(f);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "forward buffers (%llu floats)", (unsigned long long)total);
    }
    float *p = f->mem;
    float *parts[10];
    for (int i = 0; i < 10; i++) {
        parts[i] = p;
        p += (sizes[i] + 15) & ~(uint64_t)15;
    }
    f->inv_freq = parts[0];
    f->kv.type = KN_KV_F32;
    f->kv.n_kv_heads = d.kv_heads;
    f->kv.head_dim = d.head_dim;
    f->kv.cap = max_T;
    f->kv.k = parts[1];
    f->kv.v = parts[2];
    f->s.xb = parts[3];
    f->s.q = parts[4];
    f->s.k = parts[5];
    f->s.v = parts[6];
    f->s.att = parts[7];
    f->s.hb = parts[8];
    f->s.hb2 = parts[8] + kn_block_ffn_floats(&d, max_T);
    f->s.attn = parts[9];
    for (size_t t = 0; t < max_T; t++)
        f->pos[t] = (int64_t)t;
    const fmt_rope *r = &c->rope;
    uint64_t orig = r->original_max_pos ? r->original_max_pos : c->max_position_embeddings;
    if (r->type == FMT_ROPE_DYNAMIC)
        orig = c->max_position_embeddings;
    f->rope.head_dim = c->head_dim;
    f->rope.inv_freq = f->inv_freq;
    kn_rope_init((int)r->type, r->theta, r->factor, r->low_freq_factor,
                 r->high_freq_factor, orig, r->beta_fast, r->beta_slow,
                 r->attention_factor, c->head_dim, max_T, f->inv_freq,
                 &f->rope.attn_scale);
    *out = f;
    return MC_OK;
}

void cmp_fwd_free(cmp_fwd *f)
{
    if (!f)
        return;
    mc_free(f->mem);
    mc_free(f->pos);
    mc_free(f);
}

mc_status cmp_fwd_embed(cmp_fwd *f, const int32_t *tok, size_t T, float *x,
                        mc_error *err)
{
    uint32_t H = f->m->cfg.hidden_size, V = f->m->cfg.vocab_size;
    for (size_t t = 0; t < T; t++) {
        if (tok[t] < 0 || (uint32_t)tok[t] >= V) {
            char where[48];
            snprintf(where, sizeof where, "position %zu", t);
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, where, -1,
                           "token id %d is outside the vocabulary (0..%u)",
                           (int)tok[t], V - 1);
        }
        kn_matrix_row(&f->m->embed, (uint32_t)tok[t], x + t * H);
    }
    return MC_OK;
}

void cmp_fwd_block(cmp_fwd *f, const kn_block_weights *w,
                   const kn_block_dims *d, float *x, size_t T, kn_tap_fn tap,
                   void *tap_ctx)
{
    cmp_fwd_block_until(f, w, d, x, T, tap, tap_ctx, 0);
}

void cmp_fwd_block_until(cmp_fwd *f, const kn_block_weights *w,
                         const kn_block_dims *d, float *x, size_t T,
                         kn_tap_fn tap, void *tap_ctx, int stop)
{
    cmp_fwd_block_span(f, w, d, x, T, tap, tap_ctx, 0, stop, NULL);
}

void cmp_fwd_set_down_out(cmp_fwd *f, int on)
{
    f->s.tap_down_out = on;
}

void cmp_fwd_set_bf16_dot(cmp_fwd *f, int level)
{
    f->s.bf16_dot = level;
}

void cmp_fwd_linear(cmp_fwd *f, const kn_matrix *W, const float *X, size_t T,
                    float *Y, const float *bias)
{
    /* hb2 is idle outside a block pass and ffn floats wide */
    kn_block_linear(f->pool, &f->s, W, X, T, Y, bias, f->s.hb2,
                    f->m->cfg.intermediate_size);
}

void cmp_fwd_block_span(cmp_fwd *f, const kn_block_weights *w,
                        const kn_block_dims *d, float *x, size_t T,
                        kn_tap_fn tap, void *tap_ctx, int start, int stop,
                        float *att)
{
    kn_block_segment seg = {&f->kv, 0, T, NULL};
    kn_block_scratch s = f->s;
    s.tap_stop = stop;
    s.tap_start = start;
    if (att)
        s.att = att;
    kn_block_forward(f->pool, w, d, &f->rope, x, T, f->pos, &seg, 1, &s, tap,
                     tap_ctx);
}

void cmp_fwd_head(cmp_fwd *f, float *x, size_t T, float *logits)
{
    cmp_model_head(f->m, f->pool, x, T, logits);
}

void cmp_model_head(const rt_model *m, kn_pool *pool, float *x, size_t T,
                    float *logits)
{
    const fmt_model_config *c = &m->cfg;
    kn_rmsnorm(x, x, m->final_norm, T, c->hidden_size, (float)c->rms_norm_eps);
    kn_matmul(pool, &m->lm_head, x, T, logits, NULL);
}

mc_status cmp_fwd_logits(cmp_fwd *f, const int32_t *tok, size_t T,
                         float *logits, mc_error *err)
{
    if (T > f->max_T)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "tokens", -1,
                       "sequence of %zu tokens exceeds the context %zu", T,
                       f->max_T);
    size_t H = f->m->cfg.hidden_size;
    float *x = mc_malloc_array(T * H, sizeof(float));
    if (!x)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "hidden states");
    mc_status st = cmp_fwd_embed(f, tok, T, x, err);
    if (st == MC_OK) {
        for (uint32_t l = 0; l < f->m->cfg.num_layers; l++)
            cmp_fwd_block(f, &f->m->layers[l].w, &f->m->layers[l].dims, x, T,
                          NULL, NULL);
        cmp_fwd_head(f, x, T, logits);
    }
    mc_free(x);
    return st;
}

/* ---- metrics ------------------------------------------------------------- */

void cmp_eval_acc_init(cmp_eval_acc *a)
{
    memset(a, 0, sizeof *a);
}

void cmp_eval_acc_free(cmp_eval_acc *a)
{
    if (a)
        mc_free(a->klds);
    if (a)
        memset(a, 0, sizeof *a);
}

static double log_sum_exp(const float *x, uint32_t n, double *mx_out)
{
    double mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    double s = 0.0;
    for (uint32_t i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    *mx_out = mx;
    return mx + log(s);
}

mc_status cmp_eval_acc_add(cmp_eval_acc *a, const float *ref,
                           const float *quant, uint32_t vocab, int32_t next)
{
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 4096;
        double *k = mc_realloc(a->klds, nc * sizeof(double));
        if (!k)
            return MC_ERR_NOMEM;
        a->klds = k;
        a->cap = nc;
    }
    double m1, m2;
    double lp = log_sum_exp(ref, vocab, &m1);
    double lq = log_sum_exp(quant, vocab, &m2);
    double kld = 0.0;
    for (uint32_t i = 0; i < vocab; i++) {
        double lpi = (double)ref[i] - lp;
        double lqi = (double)quant[i] - lq;
        kld += exp(lpi) * (lpi - lqi);
    }
    if (kld < 0.0)
        kld = 0.0; /* rounding: KL is never negative */
    a->klds[a->n] = kld;
    a->kld_sum += kld;
    if (kn_argmax(ref, vocab) == kn_argmax(quant, vocab))
        a->top1++;
    if (next >= 0 && (uint32_t)next < vocab) {
        a->nll_ref_sum += lp - ref[next];
        a->nll_sum += lq - quant[next];
        a->n_nll++;
    }
    a->n++;
    return MC_OK;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

mc_status cmp_eval_acc_report(const cmp_eval_acc *a, cmp_eval_report *out)
{
    memset(out, 0, sizeof *out);
    if (a->n == 0)
        return MC_OK;
    double *s = mc_malloc_array(a->n, sizeof(double));
    if (!s)
        return MC_ERR_NOMEM;
    memcpy(s, a->klds, a->n * sizeof(double));
    qsort(s, a->n, sizeof(double), cmp_double);
    size_t rank = (size_t)ceil(0.99 * (double)a->n);
    if (rank < 1)
        rank = 1;
    out->kld_p99 = s[rank - 1];
    mc_free(s);
    out->tokens = a->n;
    out->kld_mean = a->kld_sum / (double)a->n;
    out->top1 = (double)a->top1 / (double)a->n;
    if (a->n_nll) {
        out->ppl_ref = exp(a->nll_ref_sum / (double)a->n_nll);
        out->ppl = exp(a->nll_sum / (double)a->n_nll);
    }
    return MC_OK;
}

mc_status cmp_eval_acc_seq(cmp_eval_acc *a, const float *ref,
                           const float *quant, uint32_t vocab,
                           const int32_t *tok, size_t T, mc_error *err)
{
    for (size_t t = 0; t + 1 < T; t++)
        if (cmp_eval_acc_add(a, ref + t * vocab, quant + t * vocab, vocab,
                             tok[t + 1]) != MC_OK)
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "KLD list");
    return MC_OK;
}

mc_status cmp_eval_longest(const fmt_model_config *c, const size_t *off,
                           size_t nseq, size_t *maxT, mc_error *err)
{
    *maxT = 0;
    for (size_t i = 0; i < nseq; i++)
        if (off[i + 1] - off[i] > *maxT)
            *maxT = off[i + 1] - off[i];
    uint64_t ctx = c->max_position_embeddings;
    if (ctx && *maxT > ctx)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "tokens", -1,
                       "a sequence has %zu tokens; the model's context is %llu",
                       *maxT, (unsigned long long)ctx);
    return MC_OK;
}

mc_status cmp_eval_models(const rt_model *ref, const rt_model *quant,
                          const int32_t *tok, const size_t *off, size_t nseq,
                          kn_pool *pool,
                          void (*progress)(void *ctx, size_t done, size_t total),
                          void *progress_ctx, cmp_eval_report *out,
                          mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (ref->cfg.vocab_size != quant->cfg.vocab_size ||
        ref->cfg.hidden_size != quant->cfg.hidden_size)
        return mc_fail(err, MC_ERR_SHAPE, quant->path, "config", -1,
                       "the models differ in shape (vocab %u vs %u)",
                       ref->cfg.vocab_size, quant->cfg.vocab_size);
    size_t maxT = 0;
    mc_status st = cmp_eval_longest(&ref->cfg, off, nseq, &maxT, err);
    if (st != MC_OK || maxT == 0)
        return st;
    uint32_t V = ref->cfg.vocab_size;
    cmp_fwd *fr = NULL, *fq = NULL;
    float *lr = mc_malloc_array(maxT * V, sizeof(float));
    float *lq = mc_malloc_array(maxT * V, sizeof(float));
    cmp_eval_acc a;
    cmp_eval_acc_init(&a);
    if (!lr || !lq) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "logits buffers");
        goto done;
    }
    if ((st = cmp_fwd_create(ref, maxT, pool, &fr, err)) != MC_OK ||
        (st = cmp_fwd_create(quant, maxT, pool, &fq, err)) != MC_OK)
        goto done;
    for (size_t i = 0; i < nseq; i++) {
        size_t T = off[i + 1] - off[i];
        const int32_t *s = tok + off[i];
        if (T < 2)
            continue;
        if ((st = cmp_fwd_logits(fr, s, T, lr, err)) != MC_OK ||
            (st = cmp_fwd_logits(fq, s, T, lq, err)) != MC_OK)
            goto done;
        if ((st = cmp_eval_acc_seq(&a, lr, lq, V, s, T, err)) != MC_OK)
            goto done;
        if (progress)
            progress(progress_ctx, i + 1, nseq);
    }
    if (cmp_eval_acc_report(&a, out) != MC_OK)
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "percentile");
done:
    cmp_eval_acc_free(&a);
    cmp_fwd_free(fr);
    cmp_fwd_free(fq);
    mc_free(lr);
    mc_free(lq);
    return st;
}

mc_status cmp_ids_load(const char *path, int32_t **tok, size_t **off,
                       size_t *nseq, mc_error *err)
{
    /* One parser for id files (formats/fmt_ids.h); this keeps the flat
     * arrays the calibration and eval code index. */
    *tok = NULL;
    *off = NULL;
    *nseq = 0;
    fmt_ids *f = NULL;
    mc_status st = fmt_ids_load(path, 0, &f, err);
    if (st != MC_OK)
        return st;
    *tok = f->ids;
    *off = f->offsets;
    *nseq = f->n_seqs;
    f->ids = NULL;
    f->offsets = NULL;
    fmt_ids_free(f);
    return MC_OK;
}

/* cmp_calib.c - layer-by-layer calibration driver (see cmp_calib.h). */
#include "cmp_calib.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cmp_awq.h"
#include "cmp_calib_internal.h"
#include "cmp_gptq.h"
#include "cmp_par.h"
#include "cmp_spill.h"
#include "mc_alloc.h"

static const char *const LIN_NAMES[CMP_LIN_COUNT] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
static const char *const LIN_PARENT[CMP_LIN_COUNT] = {
    "self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp"};

const char *cmp_lin_name(int slot)
{
    return slot >= 0 && slot < CMP_LIN_COUNT ? LIN_NAMES[slot] : "?";
}

const char *cmp_qmethod_name(cmp_qmethod m)
{
    switch (m) {
    case CMP_QM_RTN: return "rtn";
    case CMP_QM_AWQ: return "awq";
    case CMP_QM_GPTQ: return "gptq";
    case CMP_QM_BEST: return "best";
    case CMP_QM_AWQ_GPTQ: return "awq+gptq";
    case CMP_QM_GPTAQ: return "gptaq";
    case CMP_QM_AWQ_GPTAQ: return "awq+gptaq";
    case CMP_QM_BEST_ALL: return "best-all";
    }
    return "?";
}

int cmp_calib_is_best(cmp_qmethod m)
{
    return m == CMP_QM_BEST || m == CMP_QM_BEST_ALL;
}

int cmp_qmethod_parse(const char *s, cmp_qmethod *out)
{
    for (int m = 0; m <= CMP_QM_BEST_ALL; m++)
        if (strcmp(s, cmp_qmethod_name((cmp_qmethod)m)) == 0) {
            *out = (cmp_qmethod)m;
            return 0;
        }
    return -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- owned quantized buffers -------------------------------------------- */

mc_status cmp_calib_qbuf_alloc(cmp_qbuf *b, kn_wformat f, uint32_t rows,
                            uint32_t cols, uint32_t group)
{
    memset(b, 0, sizeof *b);
    b->fmt = f;
    b->rows = rows;
    b->cols = cols;
    b->group = f == KN_W_Q8 ? 0 : group;
    b->data = mc_calloc(1, (size_t)kn_wformat_data_bytes(f, rows, cols));
    b->scales = mc_calloc(1, (size_t)kn_wformat_scale_bytes(f, rows, cols, group));
    uint64_t zb = kn_wformat_zero_bytes(f, rows, cols, group);
    b->zeros = zb ? mc_calloc(1, (size_t)zb) : NULL;
    if (!b->data || !b->scales || (zb && !b->zeros))
        return MC_ERR_NOMEM;
    return MC_OK;
}

void cmp_calib_qbuf_release(cmp_qbuf *b)
{
    mc_free(b->data);
    mc_free(b->scales);
    mc_free(b->zeros);
    b->data = b->scales = NULL;
    b->zeros = NULL;
}

/* ---- taps ---------------------------------------------------------------- */

/* Sums of one sequence's input at tap point `where` (pass 0: x_f, pass 1:
 * x_q), on the GPU when the point has a device accumulator: the counts and
 * sum |x_q| stay here either way. */
static void gpu_add(tap_acc *a, int where, const float *x, size_t T)
{
    mc_status st = cmp_gpu_stats_add(a->gpu[where], a->pass, x, T);
    if (st != MC_OK && a->gpu_st == MC_OK)
        a->gpu_st = st;
    if (a->pass == 0)
        a->hf[where].n += T;
    else
        a->h[where].n += T;
}

static void tap_sums(tap_acc *a, kn_tap_point where, const float *x,
                     size_t T, size_t width);

static void tap_collect(void *ctx, kn_tap_point where, const float *x,
                        size_t T, size_t width)
{
    tap_acc *a = ctx;
    if (!(a->mask & (1u << where)))
        return;
    double t0 = cmp_par_now();
    tap_sums(a, where, x, T, width);
    a->seconds += cmp_par_now() - t0;
}

static void tap_sums(tap_acc *a, kn_tap_point where, const float *x,
                     size_t T, size_t width)
{
    int full = (a->full >> where) & 1u;
    cmp_gpu_stats *gpu = a->gpu[where];
    if (a->pass == 0) {
        if (!full)
            return;
        if (gpu) {
            gpu_add(a, where, x, T);
        } else {
            cmp_hessian_add_par(a->pool, &a->hf[where], x, T);
            memcpy(a->xf[where], x, T * width * sizeof(float));
        }
        return;
    }
    if (gpu)
        gpu_add(a, where, x, T);
    else
        cmp_hessian_add_par(a->pool, &a->h[where], x, T);
    double *s = a->abs_sum[where];
    for (size_t t = 0; t < T; t++)
        for (size_t j = 0; j < width; j++)
            s[j] += fabs(x[t * width + j]);
    if (!full || gpu)
        return;
    /* C += x_f x_q^T; hf's transposed-chunk scratch is free in this pass */
    cmp_cross_add(a->pool, a->c[where], a->xf[where], x, T, (uint32_t)width,
                  a->hf[where].xt);
}

/* ---- one layer ------------------------------------------------------------ */

static kn_wformat slot_fmt(const cmp_calib_opts *o, uint32_t l, int slot)
{
    if (o->tensor_fmt)
        return o->tensor_fmt[(size_t)l * CMP_LIN_COUNT + slot];
    return o->fmt;
}

static const kn_matrix *src_matrix(const kn_block_weights *w, int slot)
{
    switch (slot) {
    case CMP_LIN_Q: return &w->wq;
    case CMP_LIN_K: return &w->wk;
    case CMP_LIN_V: return &w->wv;
    case CMP_LIN_O: return &w->wo;
    case CMP_LIN_GATE: return &w->w_gate;
    case CMP_LIN_UP: return &w->w_up;
    default: return &w->w_down;
    }
}

static const float *src_bias(const kn_block_weights *w, int slot)
{
    switch (slot) {
    case CMP_LIN_Q: return w->bq;
    case CMP_LIN_K: return w->bk;
    case CMP_LIN_V: return w->bv;
    case CMP_LIN_O: return w->bo;
    case CMP_LIN_GATE: return w->b_gate;
    case CMP_LIN_UP: return w->b_up;
    default: return w->b_down;
    }
}

/* The block weights of layer l of the result (views into r). */
static void result_block(const cmp_calib_result *r, uint32_t l,
                         kn_block_weights *w)
{
    memset(w, 0, sizeof *w);
    w->attn_norm = r->attn_norm[l];
    w->mlp_norm = r->mlp_norm[l];
    kn_matrix *mats[CMP_LIN_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                      &w->w_gate, &w->w_up, &w->w_down};
    const float **bs[CMP_LIN_COUNT] = {&w->bq, &w->bk, &w->bv, &w->bo,
                                       &w->b_gate, &w->b_up, &w->b_down};
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        const cmp_calib_tensor *t = &r->t[(size_t)l * CMP_LIN_COUNT + s];
        if (cmp_quant_is_quantized(t->fmt)) {
            *mats[s] = cmp_qbuf_matrix(&t->q);
        } else {
            kn_matrix m = {KN_W_F32, t->q.rows, t->q.cols, t->f32, NULL, NULL, 0};
            *mats[s] = m;
        }
        *bs[s] = r->bias[(size_t)l * CMP_LIN_COUNT + s];
    }
}

/* The block as it stands: quantized slots from the result, the others from
 * the float copies; norms and biases (folded) from the result. */
static void mixed_block(const layer_ctx *c, const int *done,
                        kn_block_weights *w)
{
    result_block(c->r, c->l, w);
    kn_matrix *mats[CMP_LIN_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                      &w->w_gate, &w->w_up, &w->w_down};
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        if (!done[s] || !cmp_quant_is_quantized(c->fmt[s])) {
            kn_matrix m = {KN_W_F32, c->rows[s], c->cols[s], c->w[s], NULL, NULL, 0};
            *mats[s] = m;
        }
}

typedef struct seqs {
    float *states, *states_f;   /* [tokens][hidden] quantized / f.p. model */
    const size_t *len;
    size_t n, maxT;
    float *xtmp, *xtmp_f;       /* [maxT][hidden] */
} seqs;

/* Reset and collect the statistics of the tap points in mask: the
 * full-precision block on the full-precision states gives x_f, the block
 * as it stands (qw) on the partly quantized states gives x_q. */
static void stats_free(layer_ctx *c, int p)
{
    cmp_gpu_stats_free(c->acc.gpu[p]);
    c->acc.gpu[p] = NULL;
    cmp_hessian_free(&c->acc.h[p]);
    cmp_hessian_free(&c->acc.hf[p]);
    mc_free(c->acc.abs_sum[p]);
    mc_free(c->acc.c[p]);
    mc_free(c->acc.xf[p]);
    mc_free(c->xabs[p]);
    c->acc.abs_sum[p] = c->acc.c[p] = NULL;
    c->acc.xf[p] = NULL;
    c->xabs[p] = NULL;
}

/* Statistics of tap point p: Hq, sum |x| and the mean |x| always; with
 * full, also Hf, C and the sequence's x_f (cmp_calib.h). */
static mc_status stats_alloc(layer_ctx *c, int p, int full, size_t maxT,
                             mc_error *err)
{
    uint32_t w = c->width[p];
    mc_status st = cmp_hessian_init(&c->acc.h[p], w, err);
    if (st != MC_OK)
        return st;
    if (full && (st = cmp_hessian_init(&c->acc.hf[p], w, err)) != MC_OK)
        return st;
    c->acc.abs_sum[p] = mc_calloc(w, sizeof(double));
    c->xabs[p] = mc_malloc_array(w, sizeof(float));
    int gpu = c->o->stats_on_gpu;
    if (full) {
        c->acc.c[p] = mc_calloc((size_t)w * w, sizeof(double));
        c->acc.xf[p] = gpu ? NULL : mc_malloc_array(maxT * w, sizeof(float));
    }
    if (gpu && (st = cmp_gpu_stats_create(w, maxT, full, &c->acc.gpu[p], err)) != MC_OK)
        return st;
    if (!c->acc.abs_sum[p] || !c->xabs[p] ||
        (full && (!c->acc.c[p] || (!gpu && !c->acc.xf[p]))))
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "statistics of a %u-wide input", w);
    return MC_OK;
}

static mc_status collect(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                         const seqs *S, unsigned mask, unsigned full,
                         const kn_block_weights *qw, mc_error *err)
{
    const rt_layer *L = &m->layers[c->l];
    /* The full-precision block with the AWQ folds made so far (the same
     * function as the original; x_f then lives in the same scaled space as
     * x_q and the float copies). */
    static const int none[CMP_LIN_COUNT] = {0};
    kn_block_weights fw;
    mixed_block(c, none, &fw);
    uint32_t H = m->cfg.hidden_size;
    full &= mask;
    for (int p = 0; p < 4; p++) {
        mc_status st;
        if ((mask & (1u << p)) &&
            (st = stats_alloc(c, p, (full >> p) & 1u, S->maxT, err)) != MC_OK)
            return st;
    }
    c->acc.mask = mask;
    c->acc.full = full;
    double t0 = cmp_par_now(), s0 = c->acc.seconds;
    size_t at = 0;
    for (size_t i = 0; i < S->n; i++) {
        size_t T = S->len[i];
        /* x_f is needed only for Hf and C */
        if (full) {
            c->acc.pass = 0;
            memcpy(S->xtmp_f, S->states_f + at * H, T * H * sizeof(float));
            cmp_fwd_block(f, &fw, &L->dims, S->xtmp_f, T, tap_collect, &c->acc);
        }
        c->acc.pass = 1;
        memcpy(S->xtmp, S->states + at * H, T * H * sizeof(float));
        cmp_fwd_block(f, qw, &L->dims, S->xtmp, T, tap_collect, &c->acc);
        at += T;
    }
    c->times->stats += c->acc.seconds - s0;
    c->times->forward += cmp_par_now() - t0 - (c->acc.seconds - s0);
    if (c->acc.gpu_st != MC_OK)
        return mc_fail(err, c->acc.gpu_st, NULL, "--calib-device", -1,
                       "accumulating statistics on the GPU failed");
    for (int p = 0; p < 4; p++) {
        mc_status st;
        if (c->acc.gpu[p] &&
            (st = cmp_gpu_stats_read(c->acc.gpu[p], &c->acc.h[p], &c->acc.hf[p],
                                     c->acc.c[p], err)) != MC_OK)
            return st;
    }
    for (int p = 0; p < 4; p++)
        if (mask & (1u << p))
            for (uint32_t j = 0; j < c->acc.h[p].cols; j++)
                c->xabs[p][j] = c->acc.h[p].n
                    ? (float)(c->acc.abs_sum[p][j] / (double)c->acc.h[p].n) : 0.0f;
    return MC_OK;
}

/* AWQ scales of down (folded into up rows) or o (into v rows), searched on
 * the first pass's statistics before anything of the block is quantized:
 * the producers are quantized before these groups in the sequential order. */
static mc_status prescale(layer_ctx *c, int slot, int producer,
                          float *producer_bias, mc_error *err)
{
    double t0 = cmp_par_now();
    int tp = LIN_TAP[slot];
    uint32_t K = c->cols[slot];
    if (!cmp_quant_is_quantized(c->fmt[slot]))
        return MC_OK;
    float *s = mc_malloc_array(K, sizeof(float));
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "AWQ scales");
    cmp_awq_linear lin = {c->w[slot], c->rows[slot]};
    double alpha = 0.0;
    mc_status st = cmp_awq_search(&c->acc.h[tp], c->xabs[tp], &lin, 1,
                                  c->fmt[slot], c->o->group, s, &alpha, NULL,
                                  NULL, err);
    if (st == MC_OK && alpha > 0.0) {
        cmp_awq_scale_cols(c->w[slot], c->rows[slot], K, s);
        cmp_awq_div_rows(c->w[producer], c->rows[producer], c->cols[producer], s);
        if (producer_bias)
            cmp_awq_div_vec(producer_bias, s, K);
        c->r->t[(size_t)c->l * CMP_LIN_COUNT + slot].alpha = alpha;
    }
    mc_free(s);
    c->times->search += cmp_par_now() - t0;
    return st;
}

/* Rotate the float copies of block c->l (cmp_rotate.h): the original
 * norm weights (src) fold into the linears that read them (the result's
 * norms are already 1), o/down and their biases rotate on the output side,
 * v/o by the head rotation. */
static mc_status rotate_layer(layer_ctx *c, const kn_block_weights *src,
                              mc_error *err)
{
    const cmp_rotation *rot = c->rot;
    float **bias = c->r->bias + (size_t)c->l * CMP_LIN_COUNT;
    uint32_t wide = 0;
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        wide = c->rows[s] > wide ? c->rows[s] : wide;
    float *tmp = mc_malloc_array(wide, sizeof(float));
    if (!tmp)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "rotation");
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        if (s == CMP_LIN_O || s == CMP_LIN_DOWN)
            cmp_rotate_output_cols(rot, c->w[s], c->cols[s], bias[s], tmp);
        else
            cmp_rotate_input_rows(rot, c->w[s], c->rows[s],
                                  s <= CMP_LIN_V ? src->attn_norm : src->mlp_norm);
    }
    cmp_rotate_v_rows(rot, c->w[CMP_LIN_V], c->rows[CMP_LIN_V],
                      c->cols[CMP_LIN_V], bias[CMP_LIN_V], tmp);
    cmp_rotate_o_cols(rot, c->w[CMP_LIN_O], c->rows[CMP_LIN_O],
                      c->cols[CMP_LIN_O]);
    mc_free(tmp);
    return MC_OK;
}

static mc_status calib_layer(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                             const seqs *S, mc_error *err)
{
    const rt_layer *L = &m->layers[c->l];
    cmp_calib_result *r = c->r;
    cmp_calib_tensor *T = r->t + (size_t)c->l * CMP_LIN_COUNT;
    uint32_t H = m->cfg.hidden_size;
    mc_status st = MC_OK;
    uint32_t widths[4] = {H, m->cfg.num_heads * m->cfg.head_dim, H,
                          m->cfg.intermediate_size};
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        const kn_matrix *src = src_matrix(&L->w, s);
        c->rows[s] = src->rows;
        c->cols[s] = src->cols;
        c->fmt[s] = slot_fmt(c->o, c->l, s);
        c->w[s] = mc_malloc_array((size_t)src->rows * src->cols, sizeof(float));
        if (!c->w[s])
            return mc_fail(err, MC_ERR_NOMEM, NULL, T[s].name, -1,
                           "float32 copy of %ux%u", src->rows, src->cols);
        for (uint32_t i = 0; i < src->rows; i++)
            kn_matrix_row(src, i, c->w[s] + (size_t)i * src->cols);
        T[s].q.rows = src->rows;
        T[s].q.cols = src->cols;
    }
    if (c->rot && (st = rotate_layer(c, &L->w, err)) != MC_OK)
        return st;
    for (int p = 0; p < 4; p++)
        c->width[p] = widths[p];
    float *an = r->attn_norm[c->l], *mn = r->mlp_norm[c->l];
    float **bias = r->bias + (size_t)c->l * CMP_LIN_COUNT;
    int mha = m->cfg.num_kv_heads == m->cfg.num_heads;
    int done[CMP_LIN_COUNT] = {0};
    kn_block_weights qw;
    static const int g_down[1] = {CMP_LIN_DOWN}, g_o[1] = {CMP_LIN_O};
    static const int g_qkv[3] = {CMP_LIN_Q, CMP_LIN_K, CMP_LIN_V};
    static const int g_gu[2] = {CMP_LIN_GATE, CMP_LIN_UP};

    /* Sequential within the block too (qkv, o, gate/up, down): each group's
     * statistics come from the block with the groups before it quantized. */
    /* Only one input group's statistics are live at a time, except in the
     * first pass, where the AWQ pre-scaling of down and o also needs their
     * Hq (cmp_calib_memory counts exactly this). */
    unsigned full = 0xFu & ~c->lean;
    int pre = cmp_calib_is_awq(c->o->method) || cmp_calib_is_best(c->o->method);
    unsigned first = (1u << KN_TAP_QKV_IN) |
                     (pre ? (1u << KN_TAP_DOWN_IN) | (mha ? 1u << KN_TAP_O_IN : 0) : 0);
    mixed_block(c, done, &qw);
    if ((st = collect(c, m, f, S, first, full & (1u << KN_TAP_QKV_IN), &qw, err)) != MC_OK)
        return st;
    if (pre) {
        if ((st = prescale(c, CMP_LIN_DOWN, CMP_LIN_UP, bias[CMP_LIN_UP], err)) != MC_OK)
            return st;
        if (mha && (st = prescale(c, CMP_LIN_O, CMP_LIN_V, bias[CMP_LIN_V], err)) != MC_OK)
            return st;
        stats_free(c, KN_TAP_DOWN_IN);
        stats_free(c, KN_TAP_O_IN);
    }
    if ((st = cmp_calib_quant_group(c, g_qkv, 3, 1, an, -1, NULL, err)) != MC_OK)
        return st;
    stats_free(c, KN_TAP_QKV_IN);
    done[CMP_LIN_Q] = done[CMP_LIN_K] = done[CMP_LIN_V] = 1;
    mixed_block(c, done, &qw);
    if ((st = collect(c, m, f, S, 1u << KN_TAP_O_IN, full, &qw, err)) != MC_OK ||
        (st = cmp_calib_quant_group(c, g_o, 1, 0, NULL, -1, NULL, err)) != MC_OK)
        return st;
    stats_free(c, KN_TAP_O_IN);
    done[CMP_LIN_O] = 1;
    mixed_block(c, done, &qw);
    if ((st = collect(c, m, f, S, 1u << KN_TAP_GATE_UP_IN, full, &qw, err)) != MC_OK ||
        (st = cmp_calib_quant_group(c, g_gu, 2, 1, mn, -1, NULL, err)) != MC_OK)
        return st;
    stats_free(c, KN_TAP_GATE_UP_IN);
    done[CMP_LIN_GATE] = done[CMP_LIN_UP] = 1;
    mixed_block(c, done, &qw);
    if ((st = collect(c, m, f, S, 1u << KN_TAP_DOWN_IN, full, &qw, err)) != MC_OK ||
        (st = cmp_calib_quant_group(c, g_down, 1, 0, NULL, -1, NULL, err)) != MC_OK)
        return st;
    stats_free(c, KN_TAP_DOWN_IN);
    /* Both state sets move to the next block boundary: the full-precision
     * ones through the block as the model had it (rotated: its float
     * copies with the folds, the same function in the rotated basis). */
    kn_block_weights fw;
    static const int none[CMP_LIN_COUNT] = {0};
    mixed_block(c, none, &fw);
    double t0 = cmp_par_now();
    size_t at = 0;
    for (size_t i = 0; i < S->n; i++) {
        cmp_fwd_block(f, c->rot ? &fw : &L->w, &L->dims, S->states_f + at * H,
                      S->len[i], NULL, NULL);
        at += S->len[i];
    }
    /* Float-kept linears keep their (folded) float copy. */
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        if (!cmp_quant_is_quantized(T[s].fmt)) {
            T[s].f32 = c->w[s];
            c->w[s] = NULL;
        }
    result_block(r, c->l, &qw);
    at = 0;
    for (size_t i = 0; i < S->n; i++) {
        cmp_fwd_block(f, &qw, &L->dims, S->states + at * H, S->len[i], NULL, NULL);
        at += S->len[i];
    }
    c->times->forward += cmp_par_now() - t0;
    return MC_OK;
}

static void layer_ctx_free(layer_ctx *c)
{
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        mc_free(c->w[s]);
        c->w[s] = NULL;
    }
    for (int p = 0; p < 4; p++)
        stats_free(c, p);
}

/* ---- the driver ----------------------------------------------------------- */

static mc_status result_create(const rt_model *m, cmp_calib_result **out,
                               mc_error *err)
{
    const fmt_model_config *cfg = &m->cfg;
    uint32_t NL = cfg->num_layers, H = cfg->hidden_size;
    cmp_calib_result *r = mc_calloc(1, sizeof *r);
    if (!r)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "calibration result");
    *out = r;
    r->layers = NL;
    uint64_t per = 0;
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        per += src_matrix(&m->layers[0].w, s)->rows;
    per += 2ull * H;
    r->t = mc_calloc((size_t)NL * CMP_LIN_COUNT, sizeof *r->t);
    r->vecs = mc_calloc((size_t)(per * NL), sizeof(float));
    r->attn_norm = mc_calloc(NL, sizeof(float *));
    r->mlp_norm = mc_calloc(NL, sizeof(float *));
    r->bias = mc_calloc((size_t)NL * CMP_LIN_COUNT, sizeof(float *));
    r->layer_seconds = mc_calloc(NL, sizeof(double));
    if (!r->t || !r->vecs || !r->attn_norm || !r->mlp_norm || !r->bias ||
        !r->layer_seconds)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "calibration result");
    float *v = r->vecs;
    for (uint32_t l = 0; l < NL; l++) {
        const kn_block_weights *w = &m->layers[l].w;
        r->attn_norm[l] = v;
        memcpy(v, w->attn_norm, H * sizeof(float));
        v += H;
        r->mlp_norm[l] = v;
        memcpy(v, w->mlp_norm, H * sizeof(float));
        v += H;
        for (int s = 0; s < CMP_LIN_COUNT; s++) {
            uint32_t rows = src_matrix(w, s)->rows;
            const float *b = src_bias(w, s);
            if (b) {
                memcpy(v, b, rows * sizeof(float));
                r->bias[(size_t)l * CMP_LIN_COUNT + s] = v;
            }
            v += rows;
            cmp_calib_tensor *t = &r->t[(size_t)l * CMP_LIN_COUNT + s];
            snprintf(t->name, sizeof t->name, "model.layers.%u.%s.%s.weight", l,
                     LIN_PARENT[s], LIN_NAMES[s]);
            t->layer = l;
            t->slot = s;
        }
    }
    return MC_OK;
}

/* Free a result buffer unless it lives in the spill file's mapping. */
static void result_buf_free(const cmp_calib_result *r, void *p)
{
    if (!cmp_spill_owns(r->spill, p))
        mc_free(p);
}

static void result_qbuf_free(const cmp_calib_result *r, cmp_qbuf *b)
{
    result_buf_free(r, b->data);
    result_buf_free(r, b->scales);
    result_buf_free(r, b->zeros);
    b->data = b->scales = NULL;
    b->zeros = NULL;
}

void cmp_calib_result_free(cmp_calib_result *r)
{
    if (!r)
        return;
    if (r->t)
        for (size_t i = 0; i < (size_t)r->layers * CMP_LIN_COUNT; i++) {
            result_qbuf_free(r, &r->t[i].q);
            result_buf_free(r, r->t[i].f32);
        }
    result_qbuf_free(r, &r->lm_head);
    result_buf_free(r, r->embed);
    mc_free(r->final_norm);
    result_buf_free(r, r->lm_head_f32);
    cmp_spill_free(r->spill);
    mc_free(r->t);
    mc_free(r->vecs);
    mc_free(r->attn_norm);
    mc_free(r->mlp_norm);
    mc_free(r->bias);
    mc_free(r->layer_seconds);
    mc_free(r);
}

/* Move a finished quantized buffer set into the spill file (no-op
 * without one). */
static mc_status spill_qbuf(cmp_calib_result *r, cmp_qbuf *b, const char *what,
                            mc_error *err)
{
    if (!r->spill || !b->data)
        return MC_OK;
    mc_status st = cmp_spill_put(r->spill, (void **)&b->data,
                                 (size_t)kn_wformat_data_bytes(b->fmt, b->rows, b->cols),
                                 what, err);
    if (st == MC_OK)
        st = cmp_spill_put(r->spill, (void **)&b->scales,
                           (size_t)kn_wformat_scale_bytes(b->fmt, b->rows, b->cols,
                                                          b->group), what, err);
    if (st == MC_OK && b->zeros)
        st = cmp_spill_put(r->spill, (void **)&b->zeros,
                           (size_t)kn_wformat_zero_bytes(b->fmt, b->rows, b->cols,
                                                         b->group), what, err);
    return st;
}

/* Layer l is finished: its buffers leave memory. */
static mc_status spill_layer(cmp_calib_result *r, uint32_t l, mc_error *err)
{
    if (!r->spill)
        return MC_OK;
    for (int sl = 0; sl < CMP_LIN_COUNT; sl++) {
        cmp_calib_tensor *t = &r->t[(size_t)l * CMP_LIN_COUNT + sl];
        mc_status st = cmp_quant_is_quantized(t->fmt)
            ? spill_qbuf(r, &t->q, t->name, err)
            : cmp_spill_put(r->spill, (void **)&t->f32,
                            (size_t)t->q.rows * t->q.cols * sizeof(float),
                            t->name, err);
        if (st != MC_OK)
            return st;
    }
    return MC_OK;
}

mc_status cmp_calib_view(const rt_model *base, const cmp_calib_result *r,
                         rt_model *view, mc_error *err)
{
    *view = *base;
    view->layers = mc_malloc_array(r->layers, sizeof(rt_layer));
    if (!view->layers)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "model view");
    for (uint32_t l = 0; l < r->layers; l++) {
        view->layers[l].dims = base->layers[l].dims;
        result_block(r, l, &view->layers[l].w);
    }
    if (r->rotated) {
        uint32_t V = base->embed.rows, H = base->embed.cols;
        kn_matrix e = {KN_W_F32, V, H, r->embed, NULL, NULL, 0};
        kn_matrix lm = {KN_W_F32, V, H, r->lm_head_f32, NULL, NULL, 0};
        view->embed = e;
        view->lm_head = lm;
        view->final_norm = r->final_norm;
        view->cfg.tie_word_embeddings = 0;
    }
    if (r->lm_head.data)
        view->lm_head = cmp_qbuf_matrix(&r->lm_head);
    view->owner = NULL;
    view->owner_free = NULL;
    view->owned = NULL;
    return MC_OK;
}

void cmp_calib_view_free(rt_model *view)
{
    if (view) {
        mc_free(view->layers);
        view->layers = NULL;
    }
}

/* Default sign seed of the rotations (any fixed value: builds are
 * reproducible). */
#define ROTATE_SEED_DEFAULT 0x6d636f6d70696c65ull /* "mcompile" */

/* Set up the rotation when the model's width allows it (r->rotated, the
 * norms in r set to 1); a width that does not allow it leaves the model
 * unrotated (r->rotated 0).  Returns MC_ERR_NOMEM only. */
static mc_status rotation_setup(const rt_model *m, const cmp_calib_opts *o,
                                cmp_calib_result *r, cmp_rotation *rot)
{
    uint64_t seed = o->rotate_seed ? o->rotate_seed : ROTATE_SEED_DEFAULT;
    mc_error e;
    mc_status st = cmp_rotation_init(rot, m->cfg.hidden_size, m->cfg.head_dim,
                                     seed, &e);
    if (st == MC_ERR_INVALID_ARG)
        return MC_OK; /* too narrow a power-of-two block: not rotated */
    if (st != MC_OK)
        return st;
    r->rotated = 1;
    r->rot_block = rot->block;
    r->rot_head_block = rot->head_block;
    r->rot_seed = seed;
    uint32_t H = m->cfg.hidden_size;
    for (uint32_t l = 0; l < r->layers; l++)
        for (uint32_t j = 0; j < H; j++)
            r->attn_norm[l][j] = r->mlp_norm[l][j] = 1.0f;
    return MC_OK;
}

/* The rotated embeddings, final norm (1) and output layer (final norm
 * folded in; from the embeddings when tied) into r. */
static mc_status rotate_ends(const rt_model *m, const cmp_rotation *rot,
                             cmp_calib_result *r, mc_error *err)
{
    uint32_t V = m->embed.rows, H = m->cfg.hidden_size;
    r->final_norm = mc_malloc_array(H, sizeof(float));
    r->embed = mc_malloc_array((size_t)V * H, sizeof(float));
    if (!r->embed || !r->final_norm)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "rotated embeddings (%u x %u)", V, H);
    for (uint32_t j = 0; j < H; j++)
        r->final_norm[j] = 1.0f;
    for (uint32_t i = 0; i < V; i++) {
        kn_matrix_row(&m->embed, i, r->embed + (size_t)i * H);
        cmp_rotate_hidden(rot, r->embed + (size_t)i * H);
    }
    /* one V x H float32 matrix in memory at a time when spilling */
    mc_status st = r->spill ? cmp_spill_put(r->spill, (void **)&r->embed,
                                            (size_t)V * H * sizeof(float),
                                            "model.embed_tokens.weight", err)
                            : MC_OK;
    if (st != MC_OK)
        return st;
    r->lm_head_f32 = mc_malloc_array((size_t)V * H, sizeof(float));
    if (!r->lm_head_f32)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "rotated output layer (%u x %u)", V, H);
    for (uint32_t i = 0; i < V; i++)
        kn_matrix_row(&m->lm_head, i, r->lm_head_f32 + (size_t)i * H);
    cmp_rotate_input_rows(rot, r->lm_head_f32, V, m->final_norm);
    return MC_OK;
}

/* The run's buffers that live only while the layers are calibrated. */
typedef struct run_bufs {
    float *states, *states_f;   /* [tokens][hidden] */
    float *xtmp, *xtmp_f;       /* [maxT][hidden] */
    size_t *len;                /* calibration sequence lengths */
    cmp_fwd *f;
} run_bufs;

static void run_bufs_free(run_bufs *b)
{
    mc_free(b->states);
    mc_free(b->states_f);
    mc_free(b->xtmp);
    mc_free(b->xtmp_f);
    mc_free(b->len);
    cmp_fwd_free(b->f);
    memset(b, 0, sizeof *b);
}

mc_status cmp_calib_run(const rt_model *m, const int32_t *tok,
                        const size_t *off, size_t nseq,
                        const cmp_calib_opts *o, cmp_calib_result **out,
                        mc_error *err)
{
    *out = NULL;
    if (!cmp_quant_is_quantized(o->fmt) && !o->tensor_fmt)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "quant", -1,
                       "calibration needs a quantized format");
    if (o->fmt != KN_W_Q8 && cmp_quant_is_quantized(o->fmt) &&
        o->group != 32 && o->group != 64 && o->group != 128)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "group", -1,
                       "int4 group must be 32, 64 or 128, not %u", o->group);
    if (o->tensor_fmt)
        for (size_t i = 0; i < (size_t)m->cfg.num_layers * CMP_LIN_COUNT; i++)
            if ((o->tensor_fmt[i] == KN_W_Q4 || o->tensor_fmt[i] == KN_W_Q4S) &&
                o->group != 32 && o->group != 64 && o->group != 128)
                return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "group", -1,
                               "int4 group must be 32, 64 or 128, not %u", o->group);
    if (nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                       "%zu sequences, %zu held out: nothing left to calibrate on",
                       nseq, o->heldout);
    size_t ncal = nseq - o->heldout, ntok = 0, maxT = 0;
    uint32_t H = m->cfg.hidden_size;
    for (size_t i = 0; i < ncal; i++) {
        size_t T = off[i + 1] - off[i];
        ntok += T;
        if (T > maxT)
            maxT = T;
        if (m->cfg.max_position_embeddings && T > m->cfg.max_position_embeddings)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                           "sequence %zu has %zu tokens; the context is %llu", i,
                           T, (unsigned long long)m->cfg.max_position_embeddings);
    }
    if (ntok == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                       "no calibration tokens");
    if (o->stats_on_gpu && !cmp_gpu_stats_available())
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                       "calibration statistics on the GPU asked for, but "
                       "there is no CUDA device (or this build has no CUDA)");
    cmp_calib_mem mem;
    mc_status st = cmp_calib_plan_memory(&m->cfg, off, nseq, o, &mem, err);
    if (st != MC_OK)
        return st;
    if (o->stats_on_gpu) {
        /* the device holds the statistics of up to three inputs at once */
        uint64_t dfree = 0;
        if ((st = cmp_gpu_stats_device_free(&dfree, err)) != MC_OK)
            return st;
        if (mem.device + CMP_GPU_STATS_MARGIN > dfree)
            return mc_fail(err, MC_ERR_NOMEM, NULL, "--calib-device", -1,
                           "the statistics need %.2f GiB of device memory (at %s) "
                           "and %.2f GiB is free, keeping %.2f GiB for CUDA: use "
                           "shorter calibration sequences or --calib-device cpu",
                           mem.device / 1073741824.0,
                           mem.device_phase ? mem.device_phase : "-",
                           dfree / 1073741824.0,
                           CMP_GPU_STATS_MARGIN / 1073741824.0);
    }
    cmp_calib_result *r = NULL;
    st = result_create(m, &r, err);
    run_bufs rb;
    memset(&rb, 0, sizeof rb);
    cmp_rotation rot;
    memset(&rot, 0, sizeof rot);
    layer_ctx c;
    memset(&c, 0, sizeof c);
    if (st != MC_OK)
        goto fail;
    r->calib_tokens = ntok;
    r->mem = mem;
    if (o->spill_dir && (st = cmp_spill_create(o->spill_dir, &r->spill, err)) != MC_OK)
        goto fail;
    if (o->rotate && (st = rotation_setup(m, o, r, &rot)) != MC_OK) {
        (void)mc_fail(err, st, NULL, NULL, -1, "rotation (out of memory)");
        goto fail;
    }
    rb.states = mc_malloc_array(ntok * H, sizeof(float));
    rb.states_f = mc_malloc_array(ntok * H, sizeof(float));
    rb.xtmp = mc_malloc_array(maxT * H, sizeof(float));
    rb.xtmp_f = mc_malloc_array(maxT * H, sizeof(float));
    rb.len = mc_malloc_array(ncal, sizeof(size_t));
    if (!rb.states || !rb.states_f || !rb.xtmp || !rb.xtmp_f || !rb.len) {
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                     "calibration states (%zu tokens x %u)", ntok, H);
        goto fail;
    }
    if ((st = cmp_fwd_create(m, maxT, o->pool, &rb.f, err)) != MC_OK)
        goto fail;
    size_t at = 0;
    for (size_t i = 0; i < ncal; i++) {
        rb.len[i] = off[i + 1] - off[i];
        if ((st = cmp_fwd_embed(rb.f, tok + off[i], rb.len[i], rb.states + at * H, err)) != MC_OK)
            goto fail;
        at += rb.len[i];
    }
    if (r->rotated)
        for (size_t t = 0; t < ntok; t++)
            cmp_rotate_hidden(&rot, rb.states + t * H);
    memcpy(rb.states_f, rb.states, ntok * H * sizeof(float));
    double t0 = now_s();
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        double tl = now_s();
        memset(&c, 0, sizeof c);
        c.o = o;
        c.rot = r->rotated ? &rot : NULL;
        c.r = r;
        c.l = l;
        c.lean = mem.lean;
        c.acc.pool = o->pool;
        c.times = &r->times;
        seqs S = {rb.states, rb.states_f, rb.len, ncal, maxT, rb.xtmp, rb.xtmp_f};
        st = calib_layer(&c, m, rb.f, &S, err);
        layer_ctx_free(&c);
        if (st == MC_OK)
            st = spill_layer(r, l, err);
        if (st != MC_OK)
            goto fail;
        r->layer_seconds[l] = now_s() - tl;
        if (o->progress) {
            cmp_calib_progress p;
            p.layer = l + 1;
            p.layers = m->cfg.num_layers;
            p.elapsed_s = now_s() - t0;
            p.eta_s = p.elapsed_s / (l + 1) * (m->cfg.num_layers - l - 1);
            o->progress(o->progress_ctx, &p);
        }
    }
    /* The states and the forward context are done with: free them before
     * the ends and the held-out evaluation allocate theirs. */
    run_bufs_free(&rb);
    double t_ends = now_s();
    if (r->rotated && (st = rotate_ends(m, &rot, r, err)) != MC_OK)
        goto fail;
    if (o->lm_head_q8) {
        const kn_matrix *lm = &m->lm_head;
        float *w = r->rotated ? r->lm_head_f32
                              : mc_malloc_array((size_t)lm->rows * lm->cols,
                                                sizeof(float));
        if (!w || cmp_calib_qbuf_alloc(&r->lm_head, KN_W_Q8, lm->rows, lm->cols, 0) != MC_OK) {
            if (!r->rotated)
                mc_free(w);
            st = mc_fail(err, MC_ERR_NOMEM, NULL, "lm_head", -1, "output layer");
            goto fail;
        }
        if (!r->rotated)
            for (uint32_t i = 0; i < lm->rows; i++)
                kn_matrix_row(lm, i, w + (size_t)i * lm->cols);
        st = cmp_quant_matrix(w, NULL, &r->lm_head, err);
        if (!r->rotated)
            mc_free(w);
        if (st == MC_OK)
            st = spill_qbuf(r, &r->lm_head, "lm_head.weight", err);
        if (st != MC_OK)
            goto fail;
    }
    if (r->spill && r->lm_head_f32 &&
        (st = cmp_spill_put(r->spill, (void **)&r->lm_head_f32,
                            (size_t)m->lm_head.rows * m->lm_head.cols * sizeof(float),
                            "lm_head.weight", err)) != MC_OK)
        goto fail;
    if (r->spill && (st = cmp_spill_map(r->spill, err)) != MC_OK)
        goto fail;
    if (o->heldout > 0) {
        rt_model view;
        if ((st = cmp_calib_view(m, r, &view, err)) != MC_OK)
            goto fail;
        st = cmp_eval_models(m, &view, tok, off + ncal, o->heldout, o->pool,
                             NULL, NULL, &r->heldout, err);
        cmp_calib_view_free(&view);
        if (st != MC_OK)
            goto fail;
        r->has_heldout = 1;
    }
    r->times.ends = now_s() - t_ends;
    cmp_rotation_free(&rot);
    *out = r;
    return MC_OK;
fail:
    cmp_rotation_free(&rot);
    layer_ctx_free(&c);
    run_bufs_free(&rb);
    cmp_calib_result_free(r);
    return st;
}

const char *cmp_calib_table_header(void)
{
    return "layer  linear     format  method      error     rtn error  awq";
}

const char *cmp_calib_table_row(const cmp_calib_tensor *t, uint32_t group,
                                char *buf, size_t n)
{
    char f[16];
    switch (t->fmt) {
    case KN_W_Q8: snprintf(f, sizeof f, "q8"); break;
    case KN_W_Q4: snprintf(f, sizeof f, "q4g%u", group); break;
    case KN_W_Q4S: snprintf(f, sizeof f, "q4sg%u", group); break;
    default: snprintf(f, sizeof f, "float"); break;
    }
    snprintf(buf, n, "%5u  %-9s  %-6s  %-9s  %9.5f  %9.5f  a=%.2f%s", t->layer,
             cmp_lin_name(t->slot), f, cmp_qmethod_name(t->method), t->err,
             t->err_rtn, t->alpha,
             t->err_own_inputs ? "  (lean: own inputs)" : "");
    return buf;
}

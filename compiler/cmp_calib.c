/* cmp_calib.c - the calibration result: names, owned buffers, the result
 * tables and their views, the spill of finished layers, the per-layer
 * table (see cmp_calib.h; cmp_calib_layer.c calibrates one block,
 * cmp_calib_run.c drives the run). */
#include "cmp_calib.h"

#include <stdio.h>
#include <string.h>

#include "cmp_calib_internal.h"
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

uint32_t cmp_calib_baseline_stride(const cmp_calib_opts *o, uint32_t rows)
{
    if (cmp_calib_is_best(o->method) || o->method == CMP_QM_RTN)
        return 1;
    uint32_t n = o->baseline_rows ? o->baseline_rows : CMP_CALIB_BASELINE_ROWS;
    uint32_t s = rows / n;
    return s ? s : 1;
}

int cmp_calib_method_asymmetric(cmp_qmethod m)
{
    return cmp_calib_is_best(m) || m == CMP_QM_GPTAQ || m == CMP_QM_AWQ_GPTAQ;
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

const kn_matrix *cmp_calib_src_matrix(const kn_block_weights *w, int slot)
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
void cmp_calib_result_block(const cmp_calib_result *r, uint32_t l,
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
            kn_matrix m = {KN_W_F32, t->q.rows, t->q.cols, t->f32, NULL, NULL, 0, KN_LAYOUT_ROWS};
            *mats[s] = m;
        }
        *bs[s] = r->bias[(size_t)l * CMP_LIN_COUNT + s];
    }
}

mc_status cmp_calib_result_create(const rt_model *m, cmp_calib_result **out,
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
        per += cmp_calib_src_matrix(&m->layers[0].w, s)->rows;
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
            uint32_t rows = cmp_calib_src_matrix(w, s)->rows;
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
mc_status cmp_calib_spill_qbuf(cmp_calib_result *r, cmp_qbuf *b, const char *what,
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
mc_status cmp_calib_spill_layer(cmp_calib_result *r, uint32_t l, mc_error *err)
{
    if (!r->spill)
        return MC_OK;
    for (int sl = 0; sl < CMP_LIN_COUNT; sl++) {
        cmp_calib_tensor *t = &r->t[(size_t)l * CMP_LIN_COUNT + sl];
        mc_status st = cmp_quant_is_quantized(t->fmt)
            ? cmp_calib_spill_qbuf(r, &t->q, t->name, err)
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
        cmp_calib_result_block(r, l, &view->layers[l].w);
    }
    if (r->rotated) {
        uint32_t V = base->embed.rows, H = base->embed.cols;
        kn_matrix e = {KN_W_F32, V, H, r->embed, NULL, NULL, 0, KN_LAYOUT_ROWS};
        kn_matrix lm = {KN_W_F32, V, H, r->lm_head_f32, NULL, NULL, 0, KN_LAYOUT_ROWS};
        view->embed = e;
        view->lm_head = lm;
        view->final_norm = r->final_norm;
        view->cfg.tie_word_embeddings = 0;
    }
    if (r->lm_head.data)
        view->lm_head = cmp_qbuf_matrix(&r->lm_head);
    if (r->lm_head.data && view->cfg.tie_word_embeddings)
        view->embed = view->lm_head; /* the artifact's one int8 matrix */
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
    /* a sampled RTN baseline is marked ~ (cmp_calib_baseline_stride) */
    int sampled = t->err_rtn_rows && t->err_rtn_rows < t->q.rows;
    snprintf(buf, n, "%5u  %-9s  %-6s  %-9s  %9.5f %c%9.5f  a=%.2f%s", t->layer,
             cmp_lin_name(t->slot), f, cmp_qmethod_name(t->method), t->err,
             sampled ? '~' : ' ', t->err_rtn, t->alpha,
             t->err_own_inputs ? "  (lean: own inputs)" : "");
    return buf;
}

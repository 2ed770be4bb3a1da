/* cmp_calib_layer.c - calibrate one block: the statistics taps, the
 * forward passes that collect them, the AWQ pre-scaling, the rotation of
 * the float copies, and the groups in order (see cmp_calib.h). */
#include <math.h>
#include <string.h>

#include "cmp_awq.h"
#include "cmp_calib_internal.h"
#include "cmp_par.h"
#include "kn_gram.h"
#include "mc_alloc.h"

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
    if (where == KN_TAP_DOWN_OUT) {
        /* down's output in its stage's full-precision pass: y_f */
        if (a->pass != 0 || !a->yf)
            return;
        cmp_clock t0 = cmp_par_clock();
        memcpy(a->yf, x, T * width * sizeof(float));
        double e = 0.0;
        for (size_t k = 0; k < T * width; k++)
            e += (double)x[k] * x[k];
        a->y_energy += e;
        for (size_t t = 0; t < T; t++)
            for (size_t r = 0; r < width; r++) {
                double v = x[t * width + r];
                a->y_energy_row[r] += v * v;
            }
        cmp_par_clock_add(a->stats, t0);
        return;
    }
    if (a->pass == 1 && where == KN_TAP_DOWN_IN && a->down_dst)
        memcpy(a->down_dst, x, T * width * sizeof(float));
    if (!(a->mask & (1u << where)))
        return;
    cmp_clock t0 = cmp_par_clock();
    tap_sums(a, where, x, T, width);
    cmp_par_clock_add(a->stats, t0);
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
        } else if (where == KN_TAP_DOWN_IN && a->wc) {
            return; /* y_f is taken at down's output */
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
    if (where == KN_TAP_DOWN_IN && a->wc) {
        /* W C += y_f x_q^T; Hq's scratch is free again (rows <= width) */
        kn_gram_cross_rect(a->pool, a->wc, a->yf, a->down_rows, x, (uint32_t)width,
                           T, a->h[where].bf16, a->h[where].xt);
        return;
    }
    /* C += x_f x_q^T; hf's transposed-chunk scratch is free in this pass */
    cmp_cross_add(a->pool, a->c[where], a->xf[where], x, T, (uint32_t)width,
                  a->hf[where].xt, a->h[where].bf16);
}

/* ---- one layer ------------------------------------------------------------ */

static kn_wformat slot_fmt(const cmp_calib_opts *o, uint32_t l, int slot)
{
    if (o->tensor_fmt)
        return o->tensor_fmt[(size_t)l * CMP_LIN_COUNT + slot];
    return o->fmt;
}
/* The block as it stands: quantized slots from the result, the others from
 * the float copies; norms and biases (folded) from the result. */
static void mixed_block(const layer_ctx *c, const int *done,
                        kn_block_weights *w)
{
    cmp_calib_result_block(c->r, c->l, w);
    kn_matrix *mats[CMP_LIN_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                      &w->w_gate, &w->w_up, &w->w_down};
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        if (!done[s] || !cmp_quant_is_quantized(c->fmt[s])) {
            kn_matrix m = {KN_W_F32, c->rows[s], c->cols[s], c->w[s], NULL, NULL, 0, KN_LAYOUT_ROWS};
            *mats[s] = m;
        }
}

/* Release tap point p's statistics (NULL-safe, repeatable). */
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
    if (p == KN_TAP_DOWN_IN) {
        mc_free(c->acc.yf);
        mc_free(c->acc.wc);
        mc_free(c->acc.y_energy_row);
        c->acc.yf = NULL;
        c->acc.wc = NULL;
        c->acc.y_energy_row = NULL;
        c->acc.y_energy = 0.0;
    }
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
    c->acc.h[p].bf16 = !c->o->stats_f32;
    if (full && p == KN_TAP_DOWN_IN && c->acc.down_out) {
        /* from down's outputs: W C and sum ||y_f||^2, no Hf, C or x_f */
        uint32_t R = c->acc.down_rows;
        c->acc.abs_sum[p] = mc_calloc(w, sizeof(double));
        c->xabs[p] = mc_malloc_array(w, sizeof(float));
        c->acc.wc = mc_zeroed((size_t)R * w, sizeof(double));
        c->acc.yf = mc_malloc_array(maxT * R, sizeof(float));
        c->acc.y_energy_row = mc_calloc(R, sizeof(double));
        c->acc.y_energy = 0.0;
        if (!c->acc.abs_sum[p] || !c->xabs[p] || !c->acc.wc || !c->acc.yf ||
            !c->acc.y_energy_row)
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                           "statistics of a %u-wide input", w);
        return MC_OK;
    }
    if (full && (st = cmp_hessian_init(&c->acc.hf[p], w, err)) != MC_OK)
        return st;
    c->acc.hf[p].bf16 = !c->o->stats_f32;
    c->acc.abs_sum[p] = mc_calloc(w, sizeof(double));
    c->xabs[p] = mc_malloc_array(w, sizeof(float));
    int gpu = c->o->stats_on_gpu;
    if (full) {
        c->acc.c[p] = mc_zeroed((size_t)w * w, sizeof(double));
        c->acc.xf[p] = gpu ? NULL : mc_malloc_array(maxT * w, sizeof(float));
    }
    if (gpu && (st = cmp_gpu_stats_create(w, maxT, full, !c->o->stats_f32,
                                          &c->acc.gpu[p], err)) != MC_OK)
        return st;
    if (!c->acc.abs_sum[p] || !c->xabs[p] ||
        (full && (!c->acc.c[p] || (!gpu && !c->acc.xf[p]))))
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "statistics of a %u-wide input", w);
    return MC_OK;
}

/* Collect the statistics of the tap points in mask (full: those that also
 * take Hf, C): the full-precision block (with the folds so far) over the
 * full-precision states gives x_f, qw over the partly quantized states
 * x_q.  move_f: the full-precision pass runs on the states themselves,
 * through the whole block, moving them to the next block boundary (when
 * no fold follows: the block is then the one the states move through),
 * instead of on a copy.  store_down (mask: down's point alone, qw: all
 * but down quantized): each sequence's down input goes to S->down_in and
 * its residual at that point (the state plus the attention) replaces its
 * quantized state, for the final move (cmp_calib_layer).  sampled (points
 * of mask, none of full): collected on every stride-th sequence only
 * (cmp_calib_prescale_stride); the other sequences' passes stop at the
 * last of the rest. */
static mc_status collect(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                         const seqs *S, unsigned mask, unsigned full,
                         unsigned sampled, size_t stride,
                         int move_f, int store_down, const kn_block_weights *qw,
                         const cmp_stage_span *sp, mc_error *err)
{
    const rt_layer *L = &m->layers[c->l];
    /* The reuse buffer's halves (cmp_calib_stage_span): both models'
     * attention outputs, [tokens][q_dim] each, in down_in's buffer. */
    size_t Q = (size_t)L->dims.heads * L->dims.head_dim, ntok = 0;
    for (size_t i = 0; i < S->n; i++)
        ntok += S->len[i];
    int att_f = sp->keep_att || sp->start_f == 1 + KN_TAP_O_IN;
    int att_q = sp->keep_att || sp->start_q == 1 + KN_TAP_O_IN;
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
    c->acc.full = full;
    /* Each pass stops after the last tap point it serves (the rest of the
     * block would be thrown away with the copy): the collection of q/k/v
     * costs a norm, not a block. */
    unsigned rest = mask & ~sampled;
    int stop_f = 0, stop_q = 0, stop_rest = 0;
    for (int p = 0; p < 4; p++) {
        if ((full >> p) & 1u)
            stop_f = 1 + p;
        if ((mask >> p) & 1u)
            stop_q = 1 + p;
        if ((rest >> p) & 1u)
            stop_rest = 1 + p;
    }
    c->acc.stats = &c->times->stats;
    /* down from its outputs: this stage's full-precision pass must run
     * through down (cmp_calib_down_from_outputs chose so) */
    if (c->acc.wc && !move_f)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "down_proj's outputs are not computed in its stage");
    cmp_fwd_set_down_out(f, c->acc.wc != NULL);
    cmp_clock t0 = cmp_par_clock(), s0 = c->times->stats;
    size_t at = 0;
    for (size_t i = 0; i < S->n; i++) {
        size_t T = S->len[i];
        int in_sample = stride <= 1 || i % stride == 0;
        c->acc.mask = in_sample ? mask : rest;
        /* x_f is needed only for Hf and C */
        if (full || move_f) {
            int in_place = move_f || sp->inplace_f;
            float *x = in_place ? S->states_f + at * H : S->xtmp_f;
            c->acc.pass = 0;
            if (!in_place)
                memcpy(x, S->states_f + at * H, T * H * sizeof(float));
            cmp_fwd_block_span(f, &fw, &L->dims, x, T, tap_collect, &c->acc,
                               sp->start_f, move_f ? 0 : stop_f,
                               att_f ? S->down_in + at * Q : NULL);
        }
        c->acc.pass = 1;
        c->acc.down_dst = store_down ? S->down_in + at * L->dims.ffn : NULL;
        float *xq = sp->inplace_q ? S->states + at * H : S->xtmp;
        if (!sp->inplace_q)
            memcpy(xq, S->states + at * H, T * H * sizeof(float));
        cmp_fwd_block_span(f, qw, &L->dims, xq, T, tap_collect, &c->acc,
                           sp->start_q, in_sample ? stop_q : stop_rest,
                           att_q ? S->down_in + (ntok + at) * Q : NULL);
        if (store_down && !sp->inplace_q)
            memcpy(S->states + at * H, xq, T * H * sizeof(float));
        at += T;
    }
    c->acc.down_dst = NULL;
    cmp_fwd_set_down_out(f, 0);
    cmp_par_clock_add_outer(&c->times->forward, t0, &c->times->stats, s0);
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

/* The fold of AWQ scales s into tap point p's producer divides its input
 * by s: the statistics collected before it follow (x -> x / s: H and Hf
 * -> D H D, C -> D C D, sum |x| -> sum |x| / s, D = diag(1 / s)). */
static void rescale_stats(layer_ctx *c, int p, const float *s)
{
    uint32_t w = c->width[p];
    cmp_awq_scale_hessian(&c->acc.h[p], s, &c->acc.h[p]);
    if (c->acc.hf[p].h)
        cmp_awq_scale_hessian(&c->acc.hf[p], s, &c->acc.hf[p]);
    if (c->acc.c[p])
        for (uint32_t i = 0; i < w; i++)
            for (uint32_t j = 0; j < w; j++)
                c->acc.c[p][(size_t)i * w + j] /= (double)s[i] * s[j];
    /* W C -> (W S)(D C D) = W C D; sum ||y_f||^2 does not change */
    if (p == KN_TAP_DOWN_IN && c->acc.wc)
        for (uint32_t r = 0; r < c->acc.down_rows; r++)
            for (uint32_t j = 0; j < w; j++)
                c->acc.wc[(size_t)r * w + j] /= s[j];
    for (uint32_t j = 0; j < w; j++) {
        c->acc.abs_sum[p][j] /= s[j];
        c->xabs[p][j] /= s[j];
    }
}

/* AWQ scales of down (folded into up rows) or o (into v rows), searched on
 * the first pass's statistics before anything of the block is quantized:
 * the producers are quantized before these groups in the sequential order.
 * keep: the slot's statistics stay for its quantization (one pass) and
 * are rescaled with the fold. */
static mc_status prescale(layer_ctx *c, int slot, int producer,
                          float *producer_bias, int keep, mc_error *err)
{
    cmp_clock t0 = cmp_par_clock();
    int tp = LIN_TAP[slot];
    uint32_t K = c->cols[slot];
    if (!cmp_quant_is_quantized(c->fmt[slot]))
        return MC_OK;
    float *s = mc_malloc_array(K, sizeof(float));
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "AWQ scales");
    cmp_awq_linear lin = {c->w[slot], c->rows[slot]};
    double alpha = 0.0;
    cmp_awq_search_opts so = {c->o->pool, c->o->awq_coarse, CMP_AWQ_SAMPLE_ROWS};
    mc_status st = cmp_awq_search(&c->acc.h[tp], c->xabs[tp], &lin, 1,
                                  c->fmt[slot], c->o->group, &so, s, &alpha,
                                  NULL, NULL, err);
    if (st == MC_OK && alpha > 0.0) {
        if (keep)
            rescale_stats(c, tp, s);
        cmp_awq_scale_cols(c->w[slot], c->rows[slot], K, s);
        cmp_awq_div_rows(c->w[producer], c->rows[producer], c->cols[producer], s);
        if (producer_bias)
            cmp_awq_div_vec(producer_bias, s, K);
        c->r->t[(size_t)c->l * CMP_LIN_COUNT + slot].alpha = alpha;
    }
    mc_free(s);
    cmp_par_clock_add(&c->times->search, t0);
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

/* Block c->l's float32 copies (rotated when the model is). */
static mc_status layer_copies(layer_ctx *c, const rt_model *m, mc_error *err)
{
    const rt_layer *L = &m->layers[c->l];
    cmp_calib_tensor *T = c->r->t + (size_t)c->l * CMP_LIN_COUNT;
    uint32_t H = m->cfg.hidden_size;
    uint32_t widths[4] = {H, m->cfg.num_heads * m->cfg.head_dim, H,
                          m->cfg.intermediate_size};
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        const kn_matrix *src = cmp_calib_src_matrix(&L->w, s);
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
    for (int p = 0; p < 4; p++)
        c->width[p] = widths[p];
    return c->rot ? rotate_layer(c, &L->w, err) : MC_OK;
}

static const int g_qkv[3] = {CMP_LIN_Q, CMP_LIN_K, CMP_LIN_V};
static const int g_o[1] = {CMP_LIN_O}, g_gu[2] = {CMP_LIN_GATE, CMP_LIN_UP};
static const int g_down[1] = {CMP_LIN_DOWN};

/* 1 when the method searches AWQ scales (down's and o's are folded into
 * their producers before anything of the block is quantized). */
static int prescales(const layer_ctx *c)
{
    return cmp_calib_is_awq(c->o->method) || cmp_calib_is_best(c->o->method);
}

int cmp_calib_down_from_outputs(const cmp_calib_opts *o, unsigned lean, int rot,
                                uint32_t hidden, uint32_t ffn)
{
    uint32_t stages = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    return !o->down_full_c && !o->stats_on_gpu &&
           !((lean >> KN_TAP_DOWN_IN) & 1u) && hidden <= ffn &&
           (stages < 4 || rot);
}

size_t cmp_calib_prescale_stride(size_t tokens)
{
    size_t stride = tokens / CMP_CALIB_PRESCALE_TOKENS;
    return stride ? stride : 1;
}

unsigned cmp_calib_stage_points(uint32_t stages, unsigned k)
{
    static const unsigned one[1] = {0xFu}, two[2] = {0x3u, 0xCu};
    static const unsigned four[4] = {0x1u, 0x2u, 0x4u, 0x8u};
    if (stages == 1)
        return k < 1 ? one[k] : 0;
    if (stages == 2)
        return k < 2 ? two[k] : 0;
    return k < 4 ? four[k] : 0;
}

int cmp_calib_reuses(uint32_t stages, int store_down, uint64_t q_dim,
                     uint64_t ffn)
{
    return stages == 4 && store_down && 2 * q_dim <= ffn;
}

void cmp_calib_stage_span(uint32_t stages, unsigned k, unsigned lean, int rot,
                          int reuse, cmp_stage_span *sp)
{
    memset(sp, 0, sizeof *sp);
    if (!reuse || stages != 4)
        return;
    unsigned full = 0xFu & ~lean;
    int f_att = (full >> KN_TAP_O_IN) & 1u;            /* stage 1 ran f */
    int f_moves = (lean & 0xFu) != 0xFu && rot;        /* stage 3 moves f */
    int f_mlp = f_moves && ((full >> KN_TAP_GATE_UP_IN) & 1u);
    switch (k) {
    case 1:
        sp->keep_att = 1;
        break;
    case 2:
        sp->start_f = f_att ? 1 + KN_TAP_O_IN : 0;
        sp->inplace_f = f_moves;
        sp->start_q = 1 + KN_TAP_O_IN;
        sp->inplace_q = 1;
        break;
    case 3:
        sp->start_f = f_mlp ? 1 + KN_TAP_GATE_UP_IN : 0;
        sp->start_q = 1 + KN_TAP_GATE_UP_IN;
        sp->inplace_q = 1;
        break;
    default:
        break;
    }
}

/* The groups in the order qkv, o, gate/up, down, their statistics
 * collected in c->o->stages stages (cmp_calib.h): before the first group
 * of a stage, one pair of passes collects every point of the stage from
 * the block as it stands (the groups of earlier stages quantized).  The
 * first stage also collects down's and o's Hq for the AWQ pre-scaling
 * when they are not in it, from a sample of the sequences
 * (cmp_calib_prescale_stride); a pre-scaled point whose statistics stay for
 * its quantization (in the first stage) is rescaled with the fold.  With
 * fewer than four stages the last stage's full-precision pass moves the
 * full-precision states on.  A group's statistics are freed once it is
 * quantized (cmp_calib_memory counts exactly this). */
static mc_status groups_staged(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                               const seqs *S, int *moved_f, int *stored_down,
                               mc_error *err)
{
    static const int *const groups[4] = {g_qkv, g_o, g_gu, g_down};
    static const int gn[4] = {3, 1, 2, 1}, scale[4] = {1, 0, 1, 0};
    float *fold[4] = {c->r->attn_norm[c->l], NULL, c->r->mlp_norm[c->l], NULL};
    float **bias = c->r->bias + (size_t)c->l * CMP_LIN_COUNT;
    uint32_t stages = c->o->stages ? c->o->stages : CMP_CALIB_STAGES_DEFAULT;
    int mha = m->cfg.num_kv_heads == m->cfg.num_heads;
    int done[CMP_LIN_COUNT] = {0};
    unsigned full = 0xFu & ~c->lean;
    int pre = prescales(c);
    int reuse = cmp_calib_reuses(stages, S->down_in != NULL,
                                 (uint64_t)m->cfg.num_heads * m->cfg.head_dim,
                                 m->cfg.intermediate_size);
    size_t ntok = 0;
    for (size_t i = 0; i < S->n; i++)
        ntok += S->len[i];
    size_t stride = cmp_calib_prescale_stride(ntok);
    c->acc.down_rows = c->rows[CMP_LIN_DOWN];
    c->acc.down_out = cmp_calib_down_from_outputs(c->o, c->lean, c->rot != NULL,
                                                  c->rows[CMP_LIN_DOWN],
                                                  c->cols[CMP_LIN_DOWN]);
    mc_status st = MC_OK;
    for (unsigned k = 0; k < stages && st == MC_OK; k++) {
        unsigned pts = cmp_calib_stage_points(stages, k), mask = pts;
        if (k == 0 && pre)
            mask |= (1u << KN_TAP_DOWN_IN) | (mha ? 1u << KN_TAP_O_IN : 0);
        /* The last stage's full-precision pass moves the full-precision
         * states on (no fold follows it: down is never scaled) unless the
         * model is not rotated and every group has its own stage: those
         * states then move through the model's own weights, as before
         * issue 17 (same bits). */
        int move_f = k == stages - 1 && (c->lean & 0xFu) != 0xFu &&
                     (stages < 4 || c->rot);
        *moved_f |= move_f;
        /* down's own stage (4 stages): its q-pass is the final move's
         * block up to down's input (down's group folds nothing) */
        int store = S->down_in && stages == 4 && k == 3;
        *stored_down |= store;
        kn_block_weights qw;
        mixed_block(c, done, &qw);
        cmp_stage_span sp;
        cmp_calib_stage_span(stages, k, c->lean, c->rot != NULL, reuse, &sp);
        if ((st = collect(c, m, f, S, mask, full & pts, mask & ~pts, stride,
                          move_f, store, &qw, &sp, err)) != MC_OK)
            return st;
        if (k == 0 && pre) {
            int keep_down = (pts >> KN_TAP_DOWN_IN) & 1u;
            c->r->prescale_tokens = c->acc.h[KN_TAP_DOWN_IN].n;
            if ((st = prescale(c, CMP_LIN_DOWN, CMP_LIN_UP, bias[CMP_LIN_UP],
                               keep_down, err)) != MC_OK)
                return st;
            if (mha && (st = prescale(c, CMP_LIN_O, CMP_LIN_V, bias[CMP_LIN_V],
                                      (pts >> KN_TAP_O_IN) & 1u, err)) != MC_OK)
                return st;
            for (int p = 0; p < 4; p++)
                if (!((pts >> p) & 1u))
                    stats_free(c, p);
        }
        for (int g = 0; g < 4; g++) {
            if (!((pts >> g) & 1u)) /* group g reads tap point g */
                continue;
            if ((st = cmp_calib_quant_group(c, groups[g], gn[g], scale[g], fold[g],
                                            -1, NULL, err)) != MC_OK)
                return st;
            stats_free(c, g);
            for (int i = 0; i < gn[g]; i++)
                done[groups[g][i]] = 1;
        }
    }
    return st;
}

mc_status cmp_calib_layer(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                          const seqs *S, mc_error *err)
{
    const rt_layer *L = &m->layers[c->l];
    cmp_calib_tensor *T = c->r->t + (size_t)c->l * CMP_LIN_COUNT;
    uint32_t H = m->cfg.hidden_size;
    mc_status st = layer_copies(c, m, err);
    if (st != MC_OK)
        return st;
    int moved_f = 0, stored_down = 0;
    if ((st = groups_staged(c, m, f, S, &moved_f, &stored_down, err)) != MC_OK)
        return st;
    /* Both state sets move to the next block boundary: the full-precision
     * ones through the block as the model had it (rotated: its float
     * copies with the folds, the same function in the rotated basis),
     * unless the last statistics pass moved them already or no layer
     * reads them (every point lean). */
    cmp_clock t0 = cmp_par_clock();
    size_t at = 0;
    if (!moved_f && (c->lean & 0xFu) != 0xFu) {
        kn_block_weights fw;
        static const int none[CMP_LIN_COUNT] = {0};
        mixed_block(c, none, &fw);
        for (size_t i = 0; i < S->n; i++) {
            cmp_fwd_block(f, c->rot ? &fw : &L->w, &L->dims, S->states_f + at * H,
                          S->len[i], NULL, NULL);
            at += S->len[i];
        }
    }
    /* Float-kept linears keep their (folded) float copy. */
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        if (!cmp_quant_is_quantized(T[s].fmt)) {
            T[s].f32 = c->w[s];
            c->w[s] = NULL;
        }
    kn_block_weights qw;
    cmp_calib_result_block(c->r, c->l, &qw);
    at = 0;
    for (size_t i = 0; i < S->n; i++) {
        size_t T = S->len[i];
        if (stored_down) {
            /* the rest of the block as kn_block_forward runs it
             * (cmp_fwd_linear: its bfloat16 products included) */
            cmp_fwd_linear(f, &qw.w_down, S->down_in + at * L->dims.ffn, T,
                           S->xtmp, qw.b_down);
            kn_add(S->states + at * H, S->xtmp, T * H);
        } else {
            cmp_fwd_block(f, &qw, &L->dims, S->states + at * H, T, NULL, NULL);
        }
        at += T;
    }
    cmp_par_clock_add(&c->times->forward, t0);
    return MC_OK;
}

void cmp_calib_layer_free(layer_ctx *c)
{
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        mc_free(c->w[s]);
        c->w[s] = NULL;
    }
    for (int p = 0; p < 4; p++)
        stats_free(c, p);
}

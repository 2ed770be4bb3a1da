/* cmp_calib_group.c - quantize one group of linears that share an input
 * with the calibration method: candidates (rtn, gptq, gptaq, awq,
 * awq+gptaq...), their errors against the full-precision model, the choice,
 * and the AWQ folds (see cmp_calib.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_awq.h"
#include "cmp_calib_internal.h"
#include "cmp_descend.h"
#include "cmp_gptq.h"
#include "cmp_par.h"
#include "cmp_qform.h"
#include "mc_alloc.h"

int cmp_calib_is_awq(cmp_qmethod m)
{
    return m == CMP_QM_AWQ || m == CMP_QM_AWQ_GPTQ || m == CMP_QM_AWQ_GPTAQ;
}
static int is_gptq(cmp_qmethod m)
{
    return m == CMP_QM_GPTQ || m == CMP_QM_AWQ_GPTQ || m == CMP_QM_GPTAQ ||
           m == CMP_QM_AWQ_GPTAQ;
}
static int is_retarget(cmp_qmethod m)
{
    return m == CMP_QM_GPTAQ || m == CMP_QM_AWQ_GPTAQ;
}

/* Alternate once more: GPTQ again with the refit scales kept (only the
 * codes chosen anew, the error compensation now seeing the better grid),
 * then refit again.  Kept only if the output error on h drops; q and deq
 * (the dequantized q) are updated in place then.  Work: one more set of
 * quantized buffers and one more R x K float matrix.  hwc: the refits' H w
 * (NULL: none).  Where it runs: cmp_calib_second_pass. */
static mc_status regptq(const float *w, const cmp_hessian *h,
                        const cmp_gptq_opts *go, cmp_qbuf *q, float *deq,
                        uint32_t R, cmp_refit_hw *hwc, mc_error *err)
{
    uint32_t K = q->cols;
    cmp_qbuf t;
    float *d = mc_malloc_array((size_t)R * K, sizeof(float));
    mc_status st = cmp_calib_qbuf_alloc(&t, q->fmt, q->rows, K, q->group);
    if (st != MC_OK || !d) {
        cmp_calib_qbuf_release(&t);
        mc_free(d);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "GPTQ second pass");
    }
    memcpy(t.scales, q->scales, (size_t)kn_wformat_scale_bytes(q->fmt, q->rows, K, q->group));
    if (q->zeros)
        memcpy(t.zeros, q->zeros, (size_t)kn_wformat_zero_bytes(q->fmt, q->rows, K, q->group));
    cmp_gptq_opts o = *go;
    o.keep_params = 1;
    st = cmp_gptq_quantize(w, h, &o, &t, d, NULL, err);
    if (st == MC_OK)
        st = cmp_gptq_refit_scales_cached(w, h, &t, d, hwc, go->pool, err);
    double e_new = st == MC_OK ? cmp_hessian_output_error_par(go->pool, h, w, d, R) : 0.0;
    double e_old = st == MC_OK ? cmp_hessian_output_error_par(go->pool, h, w, deq, R) : 0.0;
    if (isnan(e_new) || isnan(e_old))
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "output error work space");
    if (st == MC_OK && e_new < e_old) {
        cmp_qbuf x = *q;
        *q = t;
        t = x;
        memcpy(deq, d, (size_t)R * K * sizeof(float));
    }
    cmp_calib_qbuf_release(&t);
    mc_free(d);
    return st;
}

/* The candidate-independent energies of each linear of the group, the
 * denominators of its relative errors: ef = tr(W Hf W^T) (full-precision
 * outputs; 0 without C) and, only without C (where the own-input error is
 * the error: lean statistics), dl = tr(W Hq W^T).  Each costs rows x
 * cols^2: computed once per group, not once per candidate. */
typedef struct group_energy {
    double ef[3], dl[3];
} group_energy;

static mc_status group_energies(const layer_ctx *c, const int *slots, int n,
                                 group_energy *g, mc_error *err)
{
    int tp = LIN_TAP[slots[0]];
    for (int i = 0; i < n; i++) {
        int sl = slots[i];
        g->ef[i] = g->dl[i] = 0.0;
        if (!cmp_quant_is_quantized(c->fmt[sl]))
            continue;
        if (tp == KN_TAP_DOWN_IN && c->acc.wc)
            g->ef[i] = c->acc.y_energy; /* sum ||W x_f||^2 */
        else if (c->acc.c[tp])
            g->ef[i] = cmp_hessian_output_error_par(c->o->pool, &c->acc.hf[tp],
                                                    c->w[sl], NULL, c->rows[sl]);
        else
            g->dl[i] = cmp_hessian_output_error_par(c->o->pool, &c->acc.h[tp],
                                                    c->w[sl], NULL, c->rows[sl]);
        if (isnan(g->dl[i]) || isnan(g->ef[i]))
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                           "output error work space");
    }
    return MC_OK;
}

/* sum_t (W x_f,t) . (Q x_q,t) = sum of W C times Q, element by element,
 * in order: rows rows of K, W C's rows pitch apart (wc: [..][pitch]),
 * Q's packed ([rows][K]); one chain over them all. */
static double wc_cross(const double *wc, size_t pitch, const float *q,
                       uint32_t rows, uint32_t K)
{
    double s = 0.0;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t k = 0; k < K; k++)
            s += wc[r * pitch + k] * q[(size_t)r * K + k];
    return s;
}

/* The relative output error of wq [rows][K] standing for w [rows][K] in
 * tap point tp's linear, with energy the rows' own (ef: tr(W Hf W^T) or
 * sum ||W x_f||^2 where the point has C or W C; dl: tr(W Hq W^T) where it
 * is lean): against the full-precision outputs (a cross term, one output
 * error), or on the linear's own inputs (one output error; then also
 * *loc, else -1).  WC: down's W C rows, wc_pitch apart (NULL: C, or
 * lean).  MC_ERR_NOMEM where a measure's work space could not be had. */
static mc_status output_rel(const layer_ctx *c, int tp, const float *w,
                            const float *wq, uint32_t rows, uint32_t K,
                            const double *WC, size_t wc_pitch, double energy,
                            double *rel, double *loc, mc_error *err)
{
    kn_pool *p = c->o->pool;
    const cmp_hessian *h = &c->acc.h[tp];
    const double *C = c->acc.c[tp];
    double e = 0.0, cross = 0.0, eq = 0.0;
    *loc = -1.0;
    if (C || WC) {
        cross = WC ? wc_cross(WC, wc_pitch, wq, rows, K)
                   : cmp_qform_cross_par(p, C, K, w, wq, rows);
        eq = cmp_hessian_output_error_par(p, h, wq, NULL, rows);
        e = energy - 2.0 * cross + eq;
        *rel = energy > 0.0 ? fmax(e, 0.0) / energy : 0.0;
    } else {
        e = cmp_hessian_output_error_par(p, h, w, wq, rows);
        *loc = energy > 0.0 ? e / energy : 0.0;
        *rel = *loc;
    }
    if (isnan(e) || isnan(cross) || isnan(eq))
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "output error work space");
    return MC_OK;
}

/* A named method's RTN baseline for linear sl on every stride-th row
 * (cmp_calib_baseline_stride > 1): the sample's error over the sample's
 * energy, the measures run_candidate makes for the whole matrix.  *rel,
 * *loc as there; nothing else is written (RTN's buffers are never the
 * result under a named method). */
static mc_status rtn_baseline(const layer_ctx *c, int sl, uint32_t stride,
                              double *rel, double *loc, mc_error *err)
{
    uint32_t R = c->rows[sl], K = c->cols[sl], rs = (R + stride - 1) / stride;
    int tp = LIN_TAP[sl];
    const double *WC = tp == KN_TAP_DOWN_IN ? c->acc.wc : NULL;
    float *ws = mc_malloc_array((size_t)rs * K, sizeof(float));
    float *wq = mc_malloc_array((size_t)rs * K, sizeof(float));
    if (!ws || !wq) {
        mc_free(ws);
        mc_free(wq);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "RTN baseline rows");
    }
    for (uint32_t j = 0; j < rs; j++)
        memcpy(ws + (size_t)j * K, c->w[sl] + (size_t)j * stride * K,
               (size_t)K * sizeof(float));
    cmp_quant_fake(c->fmt[sl], c->o->group, ws, NULL, rs, K, wq);
    /* the sample's energy, as group_energies has the whole matrix's */
    double energy = 0.0;
    if (WC)
        for (uint32_t j = 0; j < rs; j++)
            energy += c->acc.y_energy_row[(size_t)j * stride];
    else
        energy = cmp_hessian_output_error_par(c->o->pool,
                                              c->acc.c[tp] ? &c->acc.hf[tp] : &c->acc.h[tp],
                                              ws, NULL, rs);
    mc_status st = isnan(energy)
                       ? mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "output error work space")
                       : output_rel(c, tp, ws, wq, rs, K, WC, (size_t)stride * K, energy,
                                    rel, loc, err);
    mc_free(ws);
    mc_free(wq);
    return st;
}

/* Quantize n linears of one input group with one candidate method.  s:
 * AWQ scales (NULL = none); hs: the Hessian of x_q / s (NULL when s is).
 * q[i] receive the results, rel[i] the relative output errors against the
 * full-precision model; loc[i] the error on own inputs where the
 * statistics are lean (then rel[i] too), -1 where they are not (nothing
 * reads it there, and it would cost a pass over H per candidate);
 * g: group_energies. */
static mc_status run_candidate(layer_ctx *c, const int *slots, int n,
                               cmp_qmethod m, int act_order, const float *s,
                               const cmp_hessian *hs, const group_energy *g,
                               cmp_gptq_factor *fac, cmp_qbuf *q, double *rel,
                               double *loc, mc_error *err)
{
    int nq = 0; /* quantized linears: they share the group's GPTQ factor */
    for (int i = 0; i < n; i++)
        nq += cmp_quant_is_quantized(c->fmt[slots[i]]);
    int tp = LIN_TAP[slots[0]];
    const cmp_hessian *h = &c->acc.h[tp];
    const double *C = c->acc.c[tp];
    /* down from its outputs: W C instead of C (cmp_calib_down_from_outputs) */
    const double *WC = tp == KN_TAP_DOWN_IN ? c->acc.wc : NULL;
    const cmp_hessian *hq = s ? hs : h;
    mc_status st = MC_OK;
    for (int i = 0; i < n; i++) {
        int sl = slots[i];
        uint32_t R = c->rows[sl], K = c->cols[sl];
        rel[i] = 0.0;
        if (!cmp_quant_is_quantized(c->fmt[sl]))
            continue;
        uint32_t stride = cmp_calib_baseline_stride(c->o, R);
        if (m == CMP_QM_RTN && stride > 1) {
            if ((st = rtn_baseline(c, sl, stride, &rel[i], &loc[i], err)) != MC_OK) {
                if (err)
                    snprintf(err->field, sizeof err->field, "%s",
                             c->r->t[c->l * CMP_LIN_COUNT + sl].name);
                return st;
            }
            continue;
        }
        size_t nel = (size_t)R * K;
        cmp_refit_hw hwc = {NULL, 0};
        float *ws = mc_malloc_array(nel, sizeof(float));
        float *wc = mc_malloc_array(nel, sizeof(float));
        if (!ws || !wc) {
            mc_free(ws);
            mc_free(wc);
            return mc_fail(err, MC_ERR_NOMEM, NULL, c->r->t[c->l * CMP_LIN_COUNT + sl].name,
                           -1, "quantization work space");
        }
        if (is_retarget(m)) {
            cmp_clock t0 = cmp_par_clock();
            st = WC ? cmp_gptq_retarget_wc(h, WC, R, 1e-4, ws, c->o->pool, err)
                    : cmp_gptq_retarget(h, C, c->w[sl], R, 1e-4, ws, c->o->pool, err);
            cmp_par_clock_add(&c->times->factor, t0);
        } else
            memcpy(ws, c->w[sl], nel * sizeof(float));
        if (st == MC_OK) {
            if (s)
                cmp_awq_scale_cols(ws, R, K, s);
            memcpy(wc, ws, nel * sizeof(float));
            if (m == CMP_QM_AWQ && sl != CMP_LIN_Q && sl != CMP_LIN_K)
                st = cmp_awq_clip(hq, wc, R, c->fmt[sl], c->o->group, err);
        }
        if (st == MC_OK) {
            if (is_gptq(m)) {
                /* best: the imatrix choice of group parameters too */
                /* one factor per Hessian and order, made on first use
                 * (fac: [scaled][act_order]) */
                int key = (s ? 2 : 0) + (act_order ? 1 : 0);
                cmp_gptq_factor *fk = &fac[key];
                for (int k = 0; k < 4 && !fk->U; k++)
                    cmp_gptq_factor_free(&fac[k]); /* one live at a time */
                if (!fk->U)
                    st = cmp_gptq_factor_make(hq, c->o->damp, act_order, c->o->pool,
                                              &c->times->factor, fk, err);
                cmp_gptq_opts go = {c->o->damp, act_order, 128,
                                    cmp_calib_is_best(c->o->method), 0, 0, c->o->pool,
                                    &c->times->factor, fk};
                if (st == MC_OK)
                    st = cmp_gptq_quantize(wc, hq, &go, &q[i], wc, NULL, err);
                /* unrefined (--calib-refine off): GPTQ's codes and
                 * group parameters are the candidate */
                int refine = !c->o->no_refine;
                /* the refits below share H ws (unless the plan gave the
                 * cache up: CMP_CALIB_LEAN_REFIT_HW) */
                if (st == MC_OK && refine && !(c->lean & CMP_CALIB_LEAN_REFIT_HW)) {
                    hwc.hw = mc_malloc(cmp_gptq_refit_hw_bytes(R, K));
                    if (!hwc.hw)
                        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                                     "scale refit H w");
                }
                cmp_refit_hw *hp = hwc.hw ? &hwc : NULL;
                /* the group parameters were fixed at each group start;
                 * refitting the scales to the whole row never loses */
                if (st == MC_OK && refine)
                    st = cmp_gptq_refit_scales_cached(ws, hq, &q[i], wc, hp, c->o->pool, err);
                if (st == MC_OK && refine &&
                    cmp_calib_second_pass(c->fmt[sl], c->o->method))
                    st = regptq(ws, hq, &go, &q[i], wc, R, hp, err);
                /* alone in its group: the factor is not needed again, and
                 * the descent's copy of H takes its place */
                if (nq == 1)
                    cmp_gptq_factor_free(fk);
                /* GPTQ never revisits a rounding: descend the codes to a
                 * local minimum, then refit the scales to them */
                if (st == MC_OK && refine)
                    st = cmp_descend_codes(ws, hq, &q[i], wc, 0, NULL, c->o->pool, err);
                if (st == MC_OK && refine)
                    st = cmp_gptq_refit_scales_cached(ws, hq, &q[i], wc, hp, c->o->pool, err);
                mc_free(hwc.hw);
                hwc.hw = NULL;
            } else {
                st = cmp_quant_matrix(wc, NULL, &q[i], err);
                if (st == MC_OK)
                    cmp_dequant_matrix(&q[i], wc);
            }
        }
        if (st == MC_OK) {
            /* wc: the effective weight applied to x_q. */
            if (s)
                for (uint32_t r = 0; r < R; r++)
                    for (uint32_t k = 0; k < K; k++)
                        wc[(size_t)r * K + k] /= s[k];
            st = output_rel(c, tp, c->w[sl], wc, R, K, WC, K,
                            C || WC ? g->ef[i] : g->dl[i], &rel[i], &loc[i], err);
        }
        mc_free(ws);
        mc_free(wc);
        mc_free(hwc.hw);
        if (st != MC_OK) {
            if (err)
                snprintf(err->field, sizeof err->field, "%s",
                         c->r->t[c->l * CMP_LIN_COUNT + sl].name);
            return st;
        }
    }
    return MC_OK;
}

/* max / mean of diag(H) over the live inputs: large when a few input
 * channels dominate, where GPTQ's act-order pays (1 for an empty H). */
static double diag_spread(const cmp_hessian *h)
{
    double mx = 0.0, sum = 0.0;
    uint32_t live = 0;
    for (uint32_t j = 0; j < h->cols; j++) {
        double d = cmp_hessian_get(h, j, j);
        if (d > 0.0) {
            sum += d;
            mx = d > mx ? d : mx;
            live++;
        }
    }
    return live && sum > 0.0 ? mx / (sum / live) : 1.0;
}

/* The group's AWQ scales into a new *s [cols] (cmp_awq_search over the
 * group's quantized linears), *alpha; *e_awq and *e_rtn (optional) the
 * search's output error at that alpha and at alpha 0 (RTN). */
static mc_status awq_scales(layer_ctx *c, const int *slots, int n, int first_q,
                            float **s, double *alpha, double *e_awq,
                            double *e_rtn, mc_error *err)
{
    int tp = LIN_TAP[slots[0]];
    uint32_t C = c->cols[slots[0]];
    cmp_awq_linear lin[3];
    int nl = 0;
    for (int i = 0; i < n; i++)
        if (cmp_quant_is_quantized(c->fmt[slots[i]]))
            lin[nl++] = (cmp_awq_linear){c->w[slots[i]], c->rows[slots[i]]};
    *s = mc_malloc_array(C, sizeof(float));
    if (!*s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "AWQ scales");
    cmp_awq_search_opts so = {c->o->pool, c->o->awq_coarse, CMP_AWQ_SAMPLE_ROWS};
    return cmp_awq_search(&c->acc.h[tp], c->xabs[tp], lin, (size_t)nl,
                          c->fmt[slots[first_q]], c->o->group, &so, *s, alpha,
                          e_awq, e_rtn, err);
}

static mc_status quant_group(layer_ctx *c, const int *slots, int n,
                             int allow_scale, float *fold_vec,
                             int fold_rows_slot, float *fold_bias,
                             mc_error *err);

/* Quantize one input group (tap point tp, n slots), choose the method,
 * record the results and apply the chosen AWQ scales to the float copies
 * and to the producer of the input (fold); the time goes to the phase
 * times (factorizations apart). */
mc_status cmp_calib_quant_group(layer_ctx *c, const int *slots, int n,
                             int allow_scale, float *fold_vec, int fold_rows_slot,
                             float *fold_bias, mc_error *err)
{
    cmp_clock t0 = cmp_par_clock(), f0 = c->times->factor;
    mc_status st = quant_group(c, slots, n, allow_scale, fold_vec,
                               fold_rows_slot, fold_bias, err);
    cmp_par_clock_add_outer(&c->times->search, t0, &c->times->factor, f0);
    return st;
}

static mc_status quant_group(layer_ctx *c, const int *slots, int n,
                             int allow_scale, float *fold_vec,
                             int fold_rows_slot, float *fold_bias,
                             mc_error *err)
{
    const cmp_calib_opts *o = c->o;
    int tp = LIN_TAP[slots[0]];
    const cmp_hessian *h = &c->acc.h[tp];
    uint32_t C = c->cols[slots[0]];
    int first_q = -1;
    for (int i = 0; i < n; i++)
        if (cmp_quant_is_quantized(c->fmt[slots[i]]) && first_q < 0)
            first_q = i;
    cmp_calib_tensor *T = c->r->t + (size_t)c->l * CMP_LIN_COUNT;
    for (int i = 0; i < n; i++)
        if (!cmp_quant_is_quantized(c->fmt[slots[i]])) {
            T[slots[i]].fmt = KN_W_F32;
            T[slots[i]].method = CMP_QM_RTN;
        }
    if (first_q < 0)
        return MC_OK; /* every linear of the group stays float */
    /* everything `done` releases, before the first jump there */
    cmp_qbuf best[3], cur[3];
    double best_rel[3] = {0}, cur_rel[3] = {0}, rtn_rel[3] = {0};
    double best_loc[3] = {0}, cur_loc[3] = {0}, rtn_loc[3] = {0};
    memset(best, 0, sizeof best);
    memset(cur, 0, sizeof cur);
    cmp_hessian hs;
    memset(&hs, 0, sizeof hs);
    cmp_gptq_factor fac[4]; /* [AWQ-scaled][act-order] */
    memset(fac, 0, sizeof fac);

    cmp_qmethod cands[8];
    int cao[8];
    int nc = 0;
    cao[nc] = 0;
    cands[nc++] = CMP_QM_RTN; /* always: the table's baseline */
    /* Lean statistics (no C): GPTAQ cannot run; GPTQ stands in for it. */
    int lean = (c->lean >> tp) & 1u;
    mc_status st = MC_OK;
    float *s = NULL;
    double alpha = 0.0;
    if (o->method == CMP_QM_BEST_ALL) {
        /* GPTQ-family candidates with and without act-order. */
        static const cmp_qmethod bm[6] = {CMP_QM_GPTQ, CMP_QM_GPTAQ, CMP_QM_GPTAQ,
                                          CMP_QM_AWQ, CMP_QM_AWQ_GPTAQ,
                                          CMP_QM_AWQ_GPTAQ};
        static const cmp_qmethod lm[6] = {CMP_QM_GPTQ, CMP_QM_GPTQ, CMP_QM_GPTQ,
                                          CMP_QM_AWQ, CMP_QM_AWQ_GPTQ,
                                          CMP_QM_AWQ_GPTQ};
        static const int ba[6] = {0, 0, 1, 0, 0, 1};
        for (int k = 0; k < 6; k++) {
            if (lean && k == 1)
                continue; /* the same as candidate 0 */
            cao[nc] = ba[k];
            cands[nc++] = lean ? lm[k] : bm[k];
        }
    } else if (o->method == CMP_QM_BEST) {
        /* One GPTQ pipeline costs what RTN costs a hundred times over:
         * run the others only where a cheap proxy says they can win. */
        cmp_qmethod g = lean ? CMP_QM_GPTQ : CMP_QM_GPTAQ;
        cao[nc] = 0;
        cands[nc++] = g;
        if (diag_spread(h) > CMP_BEST_ACT_ORDER_SPREAD) {
            cao[nc] = 1;
            cands[nc++] = g;
        }
        if (allow_scale) {
            double e_awq = 0.0, e_rtn = 0.0;
            if ((st = awq_scales(c, slots, n, first_q, &s, &alpha, &e_awq,
                                 &e_rtn, err)) != MC_OK)
                goto done;
            if (alpha > 0.0 && e_awq < (1.0 - CMP_BEST_AWQ_GAIN) * e_rtn) {
                cao[nc] = 0;
                cands[nc++] = lean ? CMP_QM_AWQ_GPTQ : CMP_QM_AWQ_GPTAQ;
            }
        }
    } else if (o->method != CMP_QM_RTN) {
        cao[nc] = o->act_order;
        cands[nc++] = !lean ? o->method
                    : o->method == CMP_QM_GPTAQ ? CMP_QM_GPTQ
                    : o->method == CMP_QM_AWQ_GPTAQ ? CMP_QM_AWQ_GPTQ
                    : o->method;
    }

    cmp_qmethod chosen = CMP_QM_RTN;
    double best_sum = INFINITY;
    group_energy energy;
    if ((st = group_energies(c, slots, n, &energy, err)) != MC_OK)
        goto done;
    for (int i = 0; i < n; i++) {
        int sl = slots[i];
        if (!cmp_quant_is_quantized(c->fmt[sl]))
            continue;
        if (cmp_calib_qbuf_alloc(&best[i], c->fmt[sl], c->rows[sl], C, o->group) != MC_OK ||
            cmp_calib_qbuf_alloc(&cur[i], c->fmt[sl], c->rows[sl], C, o->group) != MC_OK) {
            st = mc_fail(err, MC_ERR_NOMEM, NULL, T[sl].name, -1, "quantized buffers");
            goto done;
        }
    }
    for (int k = 0; k < nc; k++) {
        cmp_qmethod m = cands[k];
        int awq = cmp_calib_is_awq(m);
        if (awq && allow_scale && !s &&
            (st = awq_scales(c, slots, n, first_q, &s, &alpha, NULL, NULL,
                             err)) != MC_OK)
            goto done;
        if (awq && allow_scale && !hs.h) {
            if ((st = cmp_hessian_init(&hs, C, err)) != MC_OK)
                goto done;
            cmp_awq_scale_hessian(h, s, &hs);
        }
        const float *sk = awq && allow_scale ? s : NULL;
        if ((st = run_candidate(c, slots, n, m, cao[k], sk, sk ? &hs : NULL, &energy,
                                fac, cur, cur_rel, cur_loc, err)) != MC_OK)
            goto done;
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += cur_rel[i];
        if (m == CMP_QM_RTN) {
            memcpy(rtn_rel, cur_rel, sizeof rtn_rel);
            memcpy(rtn_loc, cur_loc, sizeof rtn_loc);
        }
        /* Ties keep the earlier (simpler) method; RTN is first.  A plain
         * method asked alone is the result even when RTN measured lower
         * (the table shows both). */
        int take = sum < best_sum ||
                   (!cmp_calib_is_best(o->method) && k == nc - 1 && m != CMP_QM_RTN);
        if (take) {
            best_sum = sum;
            chosen = m;
            for (int i = 0; i < n; i++) {
                cmp_qbuf t = best[i];
                best[i] = cur[i];
                cur[i] = t;
                best_rel[i] = cur_rel[i];
                best_loc[i] = cur_loc[i];
            }
        }
    }
    int scaled = cmp_calib_is_awq(chosen) && allow_scale && s;
    for (int i = 0; i < n; i++) {
        int sl = slots[i];
        cmp_calib_tensor *t = &T[sl];
        if (scaled)
            cmp_awq_scale_cols(c->w[sl], c->rows[sl], C, s);
        if (!cmp_quant_is_quantized(c->fmt[sl]))
            continue;
        uint32_t stride = cmp_calib_baseline_stride(o, c->rows[sl]);
        t->fmt = c->fmt[sl];
        t->q = best[i];
        memset(&best[i], 0, sizeof best[i]);
        t->method = chosen;
        t->err = best_rel[i];
        t->err_rtn = rtn_rel[i];
        t->err_rtn_rows = (c->rows[sl] + stride - 1) / stride;
        t->err_local = best_loc[i];
        t->err_local_rtn = rtn_loc[i];
        t->err_own_inputs = lean;
        if (scaled)
            t->alpha = alpha;
    }
    if (scaled) {
        if (fold_vec)
            cmp_awq_div_vec(fold_vec, s, C);
        if (fold_rows_slot >= 0)
            cmp_awq_div_rows(c->w[fold_rows_slot], c->rows[fold_rows_slot],
                             c->cols[fold_rows_slot], s);
        if (fold_bias)
            cmp_awq_div_vec(fold_bias, s, C);
    }
done:
    for (int i = 0; i < 3; i++) {
        cmp_calib_qbuf_release(&best[i]);
        cmp_calib_qbuf_release(&cur[i]);
    }
    mc_free(s);
    cmp_hessian_free(&hs);
    for (int k = 0; k < 4; k++)
        cmp_gptq_factor_free(&fac[k]);
    return st;
}


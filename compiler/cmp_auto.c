/* cmp_auto.c - automatic per-linear precision for a budget (cmp_auto.h). */
#include "cmp_auto.h"

#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"

static const kn_wformat AUTO_FMT[CMP_AUTO_NFMT] = {KN_W_Q4, KN_W_Q8, KN_W_F16};

void cmp_auto_free(cmp_auto_plan *a)
{
    if (!a)
        return;
    mc_free(a->t);
    mc_free(a->tensor_fmt);
    a->t = NULL;
    a->tensor_fmt = NULL;
}

static uint64_t fmt_bytes(kn_wformat f, uint32_t rows, uint32_t cols,
                          uint32_t group)
{
    return kn_wformat_data_bytes(f, rows, cols) +
           kn_wformat_scale_bytes(f, rows, cols, group) +
           kn_wformat_zero_bytes(f, rows, cols, group);
}

mc_status cmp_auto_measure(const rt_model *m, const int32_t *tok,
                           const size_t *off, size_t nseq, uint32_t group,
                           const cmp_calib_opts *base, cmp_auto_plan *out,
                           mc_error *err)
{
    memset(out, 0, sizeof *out);
    size_t n = (size_t)m->cfg.num_layers * CMP_LIN_COUNT;
    out->group = group;
    out->n = n;
    out->t = mc_calloc(n, sizeof *out->t);
    out->tensor_fmt = mc_calloc(n, sizeof *out->tensor_fmt);
    if (!out->t || !out->tensor_fmt) {
        cmp_auto_free(out);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "auto plan");
    }
    for (int k = 0; k < 2; k++) {
        cmp_calib_opts o;
        memset(&o, 0, sizeof o);
        if (base) {
            o.rotate = base->rotate; /* measured as the calibration will see it */
            o.pool = base->pool;
            o.mem_budget = base->mem_budget;
            o.spill_dir = base->spill_dir;
            o.stats_on_gpu = base->stats_on_gpu;
            o.stats_f32 = base->stats_f32;
            o.fwd_f32 = base->fwd_f32;
        }
        o.fmt = AUTO_FMT[k];
        o.group = group;
        o.method = CMP_QM_RTN;
        o.force_lean = 0xFu; /* err_local_rtn reads Hq only */
        cmp_calib_result *r = NULL;
        mc_status st = cmp_calib_run(m, tok, off, nseq, &o, &r, err);
        if (st != MC_OK) {
            cmp_auto_free(out);
            return st;
        }
        for (size_t i = 0; i < n; i++) {
            cmp_auto_tensor *t = &out->t[i];
            const cmp_calib_tensor *c = &r->t[i];
            memcpy(t->name, c->name, sizeof t->name);
            t->layer = c->layer;
            t->slot = c->slot;
            t->err[k] = c->err_local_rtn;
            for (int f = 0; f < CMP_AUTO_NFMT; f++)
                t->bytes[f] = fmt_bytes(AUTO_FMT[f], c->q.rows, c->q.cols, group);
        }
        cmp_calib_result_free(r);
    }
    for (size_t i = 0; i < n; i++) {
        out->t[i].err[CMP_AUTO_F16] = 0.0;
        out->t[i].choice = CMP_AUTO_Q4;
        out->tensor_fmt[i] = KN_W_Q4;
    }
    return MC_OK;
}

typedef struct order_item {
    double key;
    size_t i;
} order_item;

static int by_key_desc(const void *a, const void *b)
{
    const order_item *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i; /* deterministic ties */
}

static uint64_t plan_total(const fmt_model_config *cfg,
                           const cmp_plan_request *req, uint64_t weights,
                           uint64_t reserve)
{
    return cmp_plan_total_for(cfg, req, weights, reserve, req->max_batch,
                              req->max_seq);
}

mc_status cmp_auto_choose(cmp_auto_plan *a, const fmt_model_config *cfg,
                          const cmp_plan_request *req, uint64_t other_bytes,
                          mc_error *err)
{
    if (!req->max_batch || !req->max_seq || !req->target_bytes)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "auto", -1,
                       "--quant auto needs --target, --max-batch and --max-seq");
    /* The planner's reserve for this request (the same as a plan would
     * use); built with int4 linears, which is what must fit at least. */
    cmp_plan_request r = *req;
    if (cmp_wpolicy_parse("int4", a->group, &r.policy, err) != MC_OK)
        return MC_ERR_INVALID_ARG;
    cmp_plan p;
    mc_status st = cmp_plan_build(cfg, &r, &p, NULL);
    uint64_t reserve = p.reserve_bytes;
    (void)st; /* fits is judged below with our own weight bytes */
    uint64_t w = other_bytes;
    for (size_t i = 0; i < a->n; i++) {
        a->t[i].choice = CMP_AUTO_Q4;
        w += a->t[i].bytes[CMP_AUTO_Q4];
    }
    a->other_bytes = other_bytes;
    a->weights_bytes = w;
    a->total_bytes = plan_total(cfg, req, w, reserve);
    if (a->total_bytes == 0 || a->total_bytes > req->target_bytes)
        return mc_fail(err, MC_ERR_PLAN, NULL, "target", -1,
                       "even int4 everywhere needs %llu bytes; target is %llu",
                       (unsigned long long)a->total_bytes,
                       (unsigned long long)req->target_bytes);
    order_item *ord = mc_malloc_array(a->n, sizeof *ord);
    if (!ord)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "auto order");
    /* Upgrade step k -> k+1, most sensitive first (by error at k). */
    for (int k = CMP_AUTO_Q4; k < CMP_AUTO_F16; k++) {
        size_t m = 0;
        for (size_t i = 0; i < a->n; i++)
            if (a->t[i].choice == k)
                ord[m++] = (order_item){a->t[i].err[k], i};
        qsort(ord, m, sizeof *ord, by_key_desc);
        for (size_t j = 0; j < m; j++) {
            cmp_auto_tensor *t = &a->t[ord[j].i];
            uint64_t nw = w - t->bytes[k] + t->bytes[k + 1];
            uint64_t tot = plan_total(cfg, req, nw, reserve);
            if (tot == 0 || tot > req->target_bytes)
                continue; /* a smaller, less sensitive one may still fit */
            t->choice = k + 1;
            w = nw;
        }
    }
    mc_free(ord);
    a->err_sum = 0.0;
    for (size_t i = 0; i < a->n; i++) {
        a->tensor_fmt[i] = AUTO_FMT[a->t[i].choice];
        a->err_sum += a->t[i].err[a->t[i].choice];
    }
    a->weights_bytes = w;
    a->total_bytes = plan_total(cfg, req, w, reserve);
    return MC_OK;
}

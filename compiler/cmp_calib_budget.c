/* cmp_calib_budget.c - the calibration's effort for a time budget (see
 * cmp_calib_budget.h). */
#include "cmp_calib_budget.h"

#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"

mc_status cmp_calib_subset(const int32_t *tok, const size_t *off, size_t nseq,
                           size_t ncal, size_t n, int32_t **tok_out,
                           size_t **off_out, mc_error *err)
{
    *off_out = NULL;
    if (tok_out)
        *tok_out = NULL;
    if (n == 0 || n > ncal || ncal > nseq)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-seqs", -1,
                       "%zu calibration sequences asked, %zu there", n, ncal);
    size_t held = nseq - ncal, m = n + held;
    size_t *o2 = mc_malloc_array(m + 1, sizeof(size_t));
    if (!o2)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "sequence offsets");
    o2[0] = 0;
    for (size_t i = 0; i < m; i++) {
        size_t src = i < n ? i : ncal + (i - n);
        o2[i + 1] = o2[i] + (off[src + 1] - off[src]);
    }
    if (tok_out) {
        int32_t *t2 = mc_malloc_array(o2[m] ? o2[m] : 1, sizeof(int32_t));
        if (!t2) {
            mc_free(o2);
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "sequence copy");
        }
        for (size_t i = 0; i < m; i++) {
            size_t src = i < n ? i : ncal + (i - n);
            memcpy(t2 + o2[i], tok + off[src],
                   (off[src + 1] - off[src]) * sizeof(int32_t));
        }
        *tok_out = t2;
    }
    *off_out = o2;
    return MC_OK;
}

/* The plan's total for effort e (e->estimate_s). */
static mc_status estimate(const rt_model *m, const size_t *off, size_t nseq,
                          const cmp_calib_opts *o, double rate,
                          cmp_calib_effort *e, mc_error *err)
{
    size_t ncal = nseq - o->heldout, *o2 = NULL;
    mc_status st = cmp_calib_subset(NULL, off, nseq, ncal, e->seqs, NULL, &o2, err);
    if (st != MC_OK)
        return st;
    cmp_calib_opts oe = *o;
    oe.stages = e->stages;
    oe.method = e->method;
    cmp_calib_mem mem;
    size_t nn = e->seqs + o->heldout;
    st = cmp_calib_plan_memory(&m->cfg, o2, nn, &oe, &mem, err);
    if (st == MC_OK) {
        size_t maxT = 0;
        for (size_t i = 0; i < e->seqs; i++)
            if (o2[i + 1] - o2[i] > maxT)
                maxT = o2[i + 1] - o2[i];
        cmp_calib_plan p;
        cmp_calib_plan_make(m, o2[e->seqs], maxT, o2 + e->seqs,
                            nn - e->seqs, &oe, &mem, rate, &p);
        e->estimate_s = p.total_s;
    }
    mc_free(o2);
    return st;
}

/* Effort k of the ladder (cmp_calib_budget.h) into *e; 0 past its end. */
static int ladder(const cmp_calib_opts *o, int method_fixed, size_t ncal,
                  unsigned k, cmp_calib_effort *e)
{
    uint32_t s0 = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    static const uint32_t down[3] = {4, 2, 1};
    memset(e, 0, sizeof *e);
    e->stages = s0;
    e->method = o->method;
    e->seqs = ncal;
    if (k == 0)
        return 1;
    unsigned i = 1;
    for (int d = 0; d < 3; d++)
        if (down[d] < s0) {
            e->stages = down[d];
            if (i++ == k)
                return 1;
        }
    if (!method_fixed && cmp_calib_is_best(o->method)) {
        e->method = CMP_QM_GPTAQ;
        if (i++ == k)
            return 1;
    }
    for (size_t n = ncal / 2; n >= 1; n /= 2) {
        e->seqs = n;
        if (i++ == k)
            return 1;
    }
    return 0;
}

mc_status cmp_calib_effort_choose(const rt_model *m, const size_t *off,
                                  size_t nseq, const cmp_calib_opts *o,
                                  int method_fixed, double budget_s,
                                  double rate, cmp_calib_effort *out,
                                  cmp_calib_effort *most, mc_error *err)
{
    if (!(rate > 0.0) || !(budget_s > 0.0) || nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-time", -1,
                       "a budget needs a positive rate and budget and a "
                       "calibration sequence");
    size_t ncal = nseq - o->heldout;
    cmp_calib_effort e, last, first;
    memset(&last, 0, sizeof last);
    memset(&first, 0, sizeof first);
    for (unsigned k = 0; ladder(o, method_fixed, ncal, k, &e); k++) {
        mc_status st = estimate(m, off, nseq, o, rate, &e, err);
        if (st != MC_OK)
            return st;
        if (k == 0) {
            first = e;
            if (most)
                *most = e;
        } else if (!(e.estimate_s < last.estimate_s)) {
            continue; /* less effort for no less time: never chosen */
        }
        if (e.estimate_s <= budget_s) {
            *out = e;
            return MC_OK;
        }
        last = e;
    }
    char opts[128];
    return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-time", -1,
                   "%.3g s is below the cheapest calibration's estimate, "
                   "%.3g s (%s, at %.1f G multiply-adds/s measured now); "
                   "the options as given are estimated at %.3g s",
                   budget_s, last.estimate_s,
                   cmp_calib_effort_options(&last, opts, sizeof opts),
                   rate / 1e9, first.estimate_s);
}

const char *cmp_calib_effort_options(const cmp_calib_effort *e, char *buf,
                                     size_t n)
{
    snprintf(buf, n, "--method %s --calib-stages %u --calib-seqs %zu",
             cmp_qmethod_name(e->method), e->stages, e->seqs);
    return buf;
}

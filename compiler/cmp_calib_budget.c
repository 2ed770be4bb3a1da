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
    oe.full_layers = e->full_layers;
    oe.no_refine = e->no_refine;
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
        e->forward_once_s = p.forward_once_s;
    }
    mc_free(o2);
    return st;
}

/* The moves that change how each block is calibrated (method,
 * refinement, the full-precision cut, gptq), not the statistics' stages
 * or tokens: the default cap's (cmp_calib_effort_within_passes). */
#define LADDER_METHOD_MOVES 6u

/* Move k of the ladder (cmp_calib_budget.h) applied to *e, which is the
 * effort accepted so far; 0 past the ladder's end.  A move that does not
 * apply (a stage count not below the options', a method the user named)
 * leaves *e as it is. */
static int ladder_move(const cmp_calib_opts *o, unsigned fixed,
                       uint32_t layers, unsigned k, cmp_calib_effort *e)
{
    uint32_t s0 = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    int best = !(fixed & CMP_EFFORT_FIXED_METHOD) && cmp_calib_is_best(o->method);
    switch (k) {
    case 0:
        if (best)
            e->method = CMP_QM_GPTAQ;
        return 1;
    case 1:
        /* a method without GPTQ has nothing to refine: the estimate
         * does not drop and the move is not taken */
        if (!(fixed & CMP_EFFORT_FIXED_REFINE))
            e->no_refine = 1;
        return 1;
    case 2: case 3: case 4: {
        /* the full-precision statistics on the first 3/4, 1/2, 1/4 of
         * the blocks (at least one, below what is taken already) */
        uint32_t f = (uint32_t)((uint64_t)layers * (5 - k) / 4);
        uint32_t now = e->full_layers ? e->full_layers : layers;
        if (best && f >= 1 && f < now)
            e->full_layers = f;
        return 1;
    }
    case 5:
        if (best) {
            e->method = CMP_QM_GPTQ; /* no full-precision pass */
            e->full_layers = 0;
        }
        return 1;
    case 6:
        if (2 < s0)
            e->stages = 2;
        return 1;
    case 7:
        if (1 < s0)
            e->stages = 1;
        return 1;
    default:
        if (e->seqs < 2)
            return 0;
        e->seqs /= 2; /* the first half, a quarter, ... one */
        return 1;
    }
}

/* The ladder's walk from the options' effort (*first) down to the first
 * effort within the budget or, past move moves_end, the cheapest taken
 * (*cur).  The budget: budget_s, or with passes > 0 that many forward
 * passes over the options' tokens, at least budget_s; into *budget_out. */
static mc_status walk(const rt_model *m, const size_t *off, size_t nseq,
                      const cmp_calib_opts *o, unsigned fixed, double budget_s,
                      double passes, double rate, unsigned moves_end,
                      cmp_calib_effort *cur, cmp_calib_effort *first,
                      double *budget_out, mc_error *err)
{
    memset(cur, 0, sizeof *cur);
    cur->stages = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    cur->method = o->method;
    cur->seqs = nseq - o->heldout;
    cur->full_layers = o->full_layers < m->cfg.num_layers ? o->full_layers : 0;
    cur->no_refine = o->no_refine;
    mc_status st = estimate(m, off, nseq, o, rate, cur, err);
    if (st != MC_OK)
        return st;
    *first = *cur;
    if (passes > 0.0 && passes * first->forward_once_s > budget_s)
        budget_s = passes * first->forward_once_s;
    *budget_out = budget_s;
    cmp_calib_effort e = *cur;
    for (unsigned k = 0; k < moves_end && cur->estimate_s > budget_s &&
                         ladder_move(o, fixed, m->cfg.num_layers, k, &e);
         k++) {
        if (memcmp(&e, cur, sizeof e) == 0)
            continue; /* the move did not apply */
        if ((st = estimate(m, off, nseq, o, rate, &e, err)) != MC_OK)
            return st;
        if (e.estimate_s < cur->estimate_s)
            *cur = e;  /* accepted: later moves start from it */
        else
            e = *cur;  /* less effort for no less time: never taken */
    }
    return MC_OK;
}

mc_status cmp_calib_effort_choose(const rt_model *m, const size_t *off,
                                  size_t nseq, const cmp_calib_opts *o,
                                  unsigned fixed, double budget_s,
                                  double rate, cmp_calib_effort *out,
                                  cmp_calib_effort *most, mc_error *err)
{
    if (!(rate > 0.0) || !(budget_s > 0.0) || nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-time", -1,
                       "a budget needs a positive rate and budget and a "
                       "calibration sequence");
    cmp_calib_effort cur, first;
    mc_status st = walk(m, off, nseq, o, fixed, budget_s, 0.0, rate, ~0u, &cur,
                        &first, &budget_s, err);
    if (st != MC_OK)
        return st;
    if (most)
        *most = first;
    if (cur.estimate_s <= budget_s) {
        *out = cur;
        return MC_OK;
    }
    char opts[128];
    return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-time", -1,
                   "%.3g s is below the cheapest calibration's estimate, "
                   "%.3g s (%s, at %.1f G multiply-adds/s measured now); "
                   "the options as given are estimated at %.3g s",
                   budget_s, cur.estimate_s,
                   cmp_calib_effort_options(&cur, opts, sizeof opts),
                   rate / 1e9, first.estimate_s);
}

mc_status cmp_calib_effort_within_passes(const rt_model *m, const size_t *off,
                                         size_t nseq, const cmp_calib_opts *o,
                                         unsigned fixed, double passes,
                                         double floor_s, cmp_calib_effort *out,
                                         cmp_calib_effort *most,
                                         double *budget_s, mc_error *err)
{
    if (!(passes > 0.0) || !(floor_s >= 0.0) || nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-passes", -1,
                       "a cap needs a positive count of passes and a "
                       "calibration sequence");
    /* the estimate as on a CPU with AVX512_BF16 at a fixed rate: a ratio
     * of multiply-add counts, the same on every machine */
    cmp_calib_opts on = *o;
    on.plan_nominal = 1;
    cmp_calib_effort first;
    mc_status st = walk(m, off, nseq, &on, fixed, floor_s, passes,
                        CMP_CALIB_NOMINAL_RATE, LADDER_METHOD_MOVES, out,
                        &first, budget_s, err);
    if (st == MC_OK && most)
        *most = first;
    return st;
}

uint32_t cmp_calib_default_full_layers(kn_wformat fmt, int mixed,
                                       uint32_t layers)
{
    if (mixed || fmt != KN_W_Q8 || layers < 2)
        return 0;
    return (layers + 1) / 2;
}

int cmp_calib_default_full_bf16(kn_wformat fmt, int mixed)
{
    return !mixed && (fmt == KN_W_Q4 || fmt == KN_W_Q4S);
}

const char *cmp_calib_effort_options(const cmp_calib_effort *e, char *buf,
                                     size_t n)
{
    int w = snprintf(buf, n, "--method %s --calib-stages %u --calib-seqs %zu",
                     cmp_qmethod_name(e->method), e->stages, e->seqs);
    if (e->full_layers && w >= 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " --calib-full-layers %u",
                      e->full_layers);
    if (e->no_refine && w >= 0 && (size_t)w < n)
        snprintf(buf + w, n - (size_t)w, " --calib-refine off");
    return buf;
}

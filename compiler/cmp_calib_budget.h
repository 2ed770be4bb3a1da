/*
 * cmp_calib_budget.h - the calibration's effort chosen to fit a time
 * budget (mcompile --calib-time), from the plan's estimate
 * (cmp_calib_plan_make).
 *
 * The efforts, most first (each a step down from the one before):
 *   1. the options as given (stages S0, default 4; the method; every
 *      calibration sequence);
 *   2. the method best (or best-all) becomes gptaq; then GPTQ's codes
 *      are kept unrefined (cmp_calib_opts.no_refine: no scale refits or
 *      code descent; unless the user asked for them); then gptaq keeps the
 *      full-precision statistics on the first 3/4, 1/2 and 1/4 of the
 *      blocks only (cmp_calib_opts.full_layers: the full-precision pass
 *      stops there); then gptq -- all unless the user named the method
 *      (gptq needs no full-precision pass and no Hf or C:
 *      cmp_calib_method_asymmetric, about half the time at SmolLM2-135M's
 *      shape);
 *   3. fewer statistics stages: 2, then 1 (each below S0 only);
 *   4. the first half of the calibration sequences, then a quarter, ...
 *      down to one sequence.
 * A step whose estimate is not below the effort before it is skipped:
 * with 4 stages reusing their passes (cmp_calib_stage_span) fewer stages
 * run no fewer multiply-adds, only worse statistics.  Why this order
 * (docs/benchmarks.md): on stories260k gptaq for best costs +1-2 % KLD,
 * unrefined codes +3-6 % (and most of the search at a 7B shape), a
 * quarter of the blocks without the full-precision pass +4-5 %,
 * gptq +17-22 %, for about half the time at SmolLM2's shape; 2 stages
 * cost +9-14 % and save time only where the passes are not reused; half
 * the sequences costs +4-5 % there but +36 % at SmolLM2's widths.
 * The first effort whose estimate fits the budget is chosen.  The choice
 * depends only on the estimate (so on the rate measured at start: on
 * machine load), never on a clock read during the run; its effort is
 * reproduced exactly, budget or not, by the options
 * `--method M --calib-stages S --calib-seqs N [--calib-full-layers F]
 * [--calib-refine off]`
 * (cmp_calib_effort_options),
 * which is what an artifact's options must say (the budget itself is not
 * recorded: it would not reproduce the bytes on another machine).
 */
#ifndef CMP_CALIB_BUDGET_H
#define CMP_CALIB_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_calib.h"
#include "mc_error.h"
#include "rt_model.h"

typedef struct cmp_calib_effort {
    uint32_t stages;     /* statistics stages: 1, 2 or 4 */
    cmp_qmethod method;
    size_t seqs;         /* calibration sequences used: the first seqs */
    uint32_t full_layers; /* blocks with the full-precision statistics
                            (cmp_calib_opts.full_layers); 0: all */
    int no_refine;       /* 1: GPTQ's codes unrefined
                            (cmp_calib_opts.no_refine) */
    double estimate_s;   /* the plan's total at this effort */
    double forward_once_s; /* the plan's one forward pass over its tokens */
} cmp_calib_effort;

/* The default cap on the calibration's effort (mcompile --calib-passes):
 * the estimate within this many forward passes over the calibration
 * tokens (cmp_calib_plan.forward_once_s), or within
 * CMP_CALIB_PASSES_FLOOR_S at CMP_CALIB_NOMINAL_RATE multiply-adds per
 * second, whichever is more: a compile that is short anyway keeps its
 * effort.  Measured (docs/benchmarks.md, session 23): stories260k's
 * default is ~3 passes, SmolLM2-135M's with 32K tokens 2.1-2.5, a
 * Mistral-7B-shape int4 g128 compile with 8K tokens 32.9 with best, 6.1
 * with gptq unrefined and 8.0 / 9.9 with gptaq unrefined on a quarter /
 * half of the blocks: 7 keeps the 7B-shape default off either edge. */
#define CMP_CALIB_PASSES_DEFAULT 7.0
#define CMP_CALIB_PASSES_FLOOR_S 600.0
#define CMP_CALIB_NOMINAL_RATE 1e11

/* Sequences subset: the first n of the ncal calibration sequences of
 * off (nseq of them, the last nseq - ncal held out), then the held-out
 * ones, as offsets into a packed copy: *off_out gets n + (nseq - ncal) + 1
 * offsets and, when tok is not NULL, *tok_out the packed tokens (both
 * mc_malloc'ed; the caller frees).  MC_ERR_NOMEM or MC_ERR_INVALID_ARG
 * (n == 0 or n > ncal). */
mc_status cmp_calib_subset(const int32_t *tok, const size_t *off, size_t nseq,
                           size_t ncal, size_t n, int32_t **tok_out,
                           size_t **off_out, mc_error *err);

/* What the user named, which a budget keeps (cmp_calib_effort_choose). */
#define CMP_EFFORT_FIXED_METHOD 1u /* --method */
#define CMP_EFFORT_FIXED_REFINE 2u /* --calib-refine on */

/* Choose the effort for model m, sequences off (nseq, the last o->heldout
 * held out), options o (its stages and method are the most effort asked),
 * fixed (CMP_EFFORT_FIXED_* bits: what the user named is kept), a budget of
 * budget_s seconds and the float GEMM rate (> 0; cmp_calib_measure_rate).
 * *out: the first effort that fits; *most (optional): the first effort
 * (the estimate without a budget).  MC_ERR_INVALID_ARG naming the
 * cheapest effort's estimate when none fits; what cmp_calib_plan_memory
 * returns otherwise. */
mc_status cmp_calib_effort_choose(const rt_model *m, const size_t *off,
                                  size_t nseq, const cmp_calib_opts *o,
                                  unsigned fixed, double budget_s,
                                  double rate, cmp_calib_effort *out,
                                  cmp_calib_effort *most, mc_error *err);

/* The default cap: the first effort of the ladder's method moves
 * (best -> gptaq, unrefined codes, the full-precision cut, gptq; never
 * fewer stages or tokens) whose estimate is within `passes` forward
 * passes or floor_s nominal seconds, whichever is more (see
 * CMP_CALIB_PASSES_DEFAULT; the CLI's floor is CMP_CALIB_PASSES_FLOOR_S),
 * or the cheapest of them when none is: a cap, never a refusal.  The estimates are made as on a CPU
 * with AVX512_BF16 at CMP_CALIB_NOMINAL_RATE (cmp_calib_opts.
 * plan_nominal): the choice is a function of the shapes, tokens and
 * options, the same on every machine, and so are the bytes.  *out and
 * *most (optional: the options' effort) carry nominal estimates;
 * *budget_s the cap in those seconds.  MC_ERR_INVALID_ARG when passes
 * <= 0 or nothing is left to calibrate on; what cmp_calib_plan_memory
 * returns otherwise. */
mc_status cmp_calib_effort_within_passes(const rt_model *m, const size_t *off,
                                         size_t nseq, const cmp_calib_opts *o,
                                         unsigned fixed, double passes,
                                         double floor_s, cmp_calib_effort *out,
                                         cmp_calib_effort *most,
                                         double *budget_s, mc_error *err);

/* "--method gptaq --calib-stages 1 --calib-seqs 12" into buf, with
 * " --calib-full-layers F" when e->full_layers is set (always
 * NUL-terminated); returns buf. */
const char *cmp_calib_effort_options(const cmp_calib_effort *e, char *buf,
                                     size_t n);

/* The float GEMM rate cmp_calib_plan_make measures (multiply-adds per
 * second through pool, in the forward's shape for cfg; ~0.2 s). */
double cmp_calib_measure_rate(kn_pool *pool, const fmt_model_config *cfg,
                              size_t maxT);

#endif /* CMP_CALIB_BUDGET_H */

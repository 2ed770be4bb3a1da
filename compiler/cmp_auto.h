/*
 * cmp_auto.h - automatic per-linear precision for a memory budget
 * (`--quant auto --target SIZE --max-batch B --max-seq T`).
 *
 * 1. Measure: calibrate the model with RTN at int4 (group g) and at int8
 *    (cmp_calib_run, two runs); each linear's sensitivity is its own
 *    relative output error on its calibration inputs (err_local) at each
 *    format; f16 counts as 0.
 * 2. Choose: start from int4 everywhere (if even that does not fit the
 *    plan, MC_ERR_PLAN); upgrade linears to int8, most sensitive first
 *    (largest int4 error), while the plan still fits; then to f16 in order
 *    of int8 error.  "Fits" is the planner's total (cmp_plan_total_for:
 *    weights + KV + activations + reserve at the requested batch and
 *    sequence limits) <= target.
 * The result lists each linear's format, bytes and measured error, for the
 * manifest, and a [layers][CMP_LIN_COUNT] format table to hand to
 * cmp_calib_run (opts.tensor_fmt) for the final quantization.
 */
#ifndef CMP_AUTO_H
#define CMP_AUTO_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_calib.h"
#include "cmp_plan.h"
#include "mc_error.h"
#include "rt_model.h"

enum { CMP_AUTO_Q4 = 0, CMP_AUTO_Q8 = 1, CMP_AUTO_F16 = 2, CMP_AUTO_NFMT = 3 };

typedef struct cmp_auto_tensor {
    char name[96];                  /* HF name */
    uint32_t layer;
    int slot;                       /* CMP_LIN_* */
    double err[CMP_AUTO_NFMT];      /* measured relative error per format */
    uint64_t bytes[CMP_AUTO_NFMT];  /* weight bytes per format */
    int choice;                     /* CMP_AUTO_* chosen */
} cmp_auto_tensor;

typedef struct cmp_auto_plan {
    uint32_t group;                 /* int4 group */
    size_t n;                       /* layers * CMP_LIN_COUNT */
    cmp_auto_tensor *t;             /* [n], owned */
    kn_wformat *tensor_fmt;         /* [n] for cmp_calib_opts, owned */
    uint64_t other_bytes;           /* embeddings, norms, lm_head, biases */
    uint64_t weights_bytes;         /* other + chosen linears */
    uint64_t total_bytes;           /* planner total with those weights */
    double err_sum;                 /* sum of the chosen errors */
} cmp_auto_plan;

/* Step 1 on nseq calibration sequences.  base (NULL: defaults) gives what
 * the measuring runs share with the calibration that follows: rotate (as
 * that calibration will be rotated), pool, mem_budget, spill_dir and
 * stats_on_gpu; its format, method and held-out count are not used.  The
 * runs collect lean statistics everywhere (err_local needs only Hq), so
 * they need less memory than the final calibration.  *out filled (free
 * with cmp_auto_free); choices all int4 until cmp_auto_choose. */
mc_status cmp_auto_measure(const rt_model *m, const int32_t *tok,
                           const size_t *off, size_t nseq, uint32_t group,
                           const cmp_calib_opts *base, cmp_auto_plan *out,
                           mc_error *err);

/* Step 2 for req (target_bytes, max_batch, max_seq, kv type... as the
 * planner reads them; policy ignored).  other_bytes: bytes of every
 * non-linear tensor as the compile will store them.  Returns MC_OK (a
 * fits), MC_ERR_PLAN (not even int4 everywhere fits; a->total_bytes then
 * says what int4 needs) or MC_ERR_INVALID_ARG. */
mc_status cmp_auto_choose(cmp_auto_plan *a, const fmt_model_config *cfg,
                          const cmp_plan_request *req, uint64_t other_bytes,
                          mc_error *err);

void cmp_auto_free(cmp_auto_plan *a); /* NULL and zeroed are fine */

#endif /* CMP_AUTO_H */

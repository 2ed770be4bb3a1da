/*
 * merge_ref.h - the merge tests' reference: an independent double-precision
 * computation of every merged tensor, written from the adapter files and
 * PEFT's formulas (not from cmp_merge), rounded once to the output dtype,
 * and a driver that merges through the library, re-opens the output and
 * demands bit equality (0 ulp) for every float tensor.
 *
 * Reference semantics, per base tensor, adapters in order: a replacement
 * (<name>, <module>.modules_to_save.default.<part>, <module>.base_layer.
 * <part>) sets W and W0; a delta adds coef * (B @ A) (transposed for
 * embeddings and [in, out] bases); DoRA makes W = m/||V|| (W + coef *
 * delta) with V = W0 + coef * delta (PEFT 0.21's forward and merge);
 * lora_B.bias adds coef * bias.
 */
#ifndef MERGE_REF_H
#define MERGE_REF_H

#include <stddef.h>

#include "cmp_merge.h"
#include "fmt_dtype.h"

typedef struct run {
    char *tmp, *out;         /* temp dir (owned) and the output in it */
    cmp_merge_report rep;
    size_t touched;          /* tensors whose expected values differ from the base */
    double max_ulp;          /* over all elements: 0 when exact */
} run;

/* MC_FIXTURE_DIR/rel, new string. */
char *fx(const char *rel);
/* Merge adapters dirs[n] (weights: NULL = all 1) into base_dir, write
 * with dtype (FMT_DT_INVALID: keep), re-open and compare every tensor;
 * fails the test on any difference.  Free r with run_free. */
void merge_and_check(const char *base_dir, const char *const *dirs,
                     const double *weights, size_t n, fmt_dtype dtype, run *r);
void run_free(run *r);
/* One fixture adapter on one fixture model; at least min_touched tensors
 * must change and the report must count the same. */
void check_one(const char *model, const char *adapter, fmt_dtype dt,
               size_t min_touched, run *r);

#endif /* MERGE_REF_H */

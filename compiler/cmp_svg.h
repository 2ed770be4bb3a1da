/*
 * cmp_svg.h - a picture of a memory plan, as a standalone SVG document.
 *
 * Left: one stacked bar per weight format (f32, f16, int8, int4 at the
 * plan's own batch x context limits) split into weights, KV cache,
 * activations, reserve and headroom against the target (a bar that does
 * not fit rises above the dashed target line).  Right: the feasible
 * (batch, max context) frontier of the plan's own format, with the chosen
 * limits marked.  Elements carry ids and classes (budget-bars, seg-weights,
 * seg-kv, seg-activations, seg-reserve, seg-headroom,
 * frontier, frontier-point, chosen-point, target-line) so tests and style
 * sheets can find them.  Plain SVG 1.1, no scripts, no external resources.
 */
#ifndef CMP_SVG_H
#define CMP_SVG_H

#include "cmp_plan.h"
#include "fmt_config.h"
#include "mc_error.h"

/* Render plan (built from cfg) to *out, an mc_malloc'ed NUL-terminated
 * string the caller frees with mc_free. */
/* The picture's title, in its first lines: what `plan --svg` looks for
 * before it replaces an existing file (fmt_output_check_ours). */
#define CMP_SVG_MARK "<title>mcompile memory plan</title>"

mc_status cmp_plan_svg(const fmt_model_config *cfg, const cmp_plan *plan,
                       char **out, mc_error *err);

#endif /* CMP_SVG_H */

/*
 * mrun_print.h - what mrun prints: its results (generated sequences,
 * scores), the --json object, the timing and -v lines on stderr and the
 * --metrics file.  Part of the mrun program, not of the runtime library.
 *
 * --json prints ONE object on stdout, also when a run is refused after the
 * model opened (then with "error", exit 1).  Results come first, then
 * "prefill_tok_s" and the other figures.  Keys:
 *   "sequences": [{"ids": [int], "text": str|null, "prompt_tokens": int,
 *     "stop_reason": "length"|"stop_token"|"none"}]      (generation), or
 *   "scores": [{"labels": [{"id": int, "logprob": num}]}
 *              | {"logprobs": [num], "sum": num}]        (scoring)
 *   "error": str                                         (only on failure)
 *   "prefill_tok_s", "decode_tok_s", "prefill_seconds", "decode_seconds":
 *     num; "prefill_tokens", "decode_tokens": int
 *   "requests": int (sequences submitted), "refused": int, "refused_by":
 *     {"plan": int, "input": int, "other": int}
 *   bytes, int: "planned_bytes" (the plan: weights + arena + reserve; an
 *     artifact's manifest total, for a HF model weights + the arena built
 *     at load), "reserve_bytes", "weights_mapped_bytes" (every weight byte
 *     held), "arena_bytes" (allocated), "arena_high_water_bytes" (measured
 *     arena peak, canary scan), "arena_touched_bytes" (arena bytes really
 *     written), "kv_bytes", "peak_rss_bytes" (process peak
 *     RSS: VmHWM, else ru_maxrss * 1024), "weight_bytes" (read per token)
 *   "params": int, "plan": "stored"|"overridden"|"runtime",
 *   "threads", "max_batch", "max_seq", "prefill_chunk": int
 * Always arena_touched_bytes <= arena_high_water_bytes <= arena_bytes <=
 * planned_bytes; figures are 0 when the model did not open.  --metrics
 * FILE writes the same figures as Prometheus text (rt_metrics.h).
 *
 * The object is printed in pieces as the run goes: "{" before the run,
 * the results ("sequences": [...], or "scores": [...], each followed by
 * ", "), then mrun_print_figures closes it.
 */
#ifndef MRUN_PRINT_H
#define MRUN_PRINT_H

#include <stdint.h>
#include <stdio.h>

#include "mcrt.h"
#include "mrun_opts.h"
#include "rt_metrics.h"

/* What a run did, for --json, -v and --metrics. */
typedef struct mrun_report {
    rt_metrics m;              /* Prometheus figures */
    mcrt_info info;            /* zero when the model did not open */
    mcrt_stats st;
    uint64_t requests;         /* sequences submitted */
    uint64_t refused;          /* of those, refused (any reason) */
} mrun_report;

/* "stored", "overridden" or "runtime" (mcrt_info.plan_source). */
const char *mrun_plan_name(int source);

/* Fill r after a run.  h may be NULL (the model did not open:
 * open_status says why and all n_req requests count as refused). */
void mrun_report_fill(mrun_report *r, const mcrt *h, size_t n_req,
                      int open_status);

/* The figures of the --json object (after the results); closes it.
 * error: the refusal, or NULL. */
void mrun_print_figures(const mrun_report *r, const char *error);

/* Timing on stderr (after a run that went well, unless -q), the -v memory
 * summary and --metrics.  Returns 0, or 1 when the metrics file could not
 * be written (said on stderr). */
int mrun_report_finish(const mrun_cli *c, const mrun_report *r, int ok);

/* One generated sequence: in --json an element of "sequences" (i > 0
 * puts the comma), else a line of ids, then a tab and the text with \n
 * and \t escaped.  text (tl bytes) may be NULL (no tokenizer). */
void mrun_print_sequence(const mrun_cli *c, size_t i, const mcrt_result *res,
                         const char *text, size_t tl);

/* The scores of n prompts: labels lab[i * n_labels + j], or continuation
 * log-probs per[i][j] and their sums sum[i].  In --json "scores": [...]. */
void mrun_print_scores(const mrun_cli *c, size_t n, const float *lab,
                       float *const *per, const double *sum);

/* s (n bytes) as a JSON string: quotes and escapes. */
void mrun_print_json_str(FILE *f, const char *s, size_t n);

#endif /* MRUN_PRINT_H */

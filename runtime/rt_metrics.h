/*
 * rt_metrics.h - the runtime's figures, written as Prometheus metrics.
 *
 * mrun (--metrics FILE) and embedders collect what a run did into an
 * rt_metrics and write it in the Prometheus text exposition format
 * (version 0.0.4), which node_exporter's textfile collector and Prometheus
 * itself read.  Every family has "# HELP" and "# TYPE" lines, the prefix
 * "mcompile_" and its unit in the name (_bytes, _seconds_total,
 * _tokens_per_second; counters end in _total):
 *
 *   # HELP mcompile_planned_bytes Bytes the memory plan reserves ...
 *   # TYPE mcompile_planned_bytes gauge
 *   mcompile_planned_bytes 71303168
 *   ...
 *   mcompile_requests_refused_total{reason="plan"} 0
 *
 * The file is written whole or not at all (formats/fmt_atomic.h), so a
 * collector never reads half of it.  Nothing here prints; the struct is
 * plain data that the caller fills (rt_metrics_from_mcrt does the part the
 * public API can tell).
 */
#ifndef RT_METRICS_H
#define RT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "mcrt.h"

/* Why a request was refused (label reason="..." of
 * mcompile_requests_refused_total). */
typedef enum rt_refuse_reason {
    RT_REFUSE_PLAN = 0,    /* beyond the memory plan: batch or context */
    RT_REFUSE_INPUT = 1,   /* malformed request: bad ids, empty prompt */
    RT_REFUSE_OTHER = 2,   /* any other failure (I/O, internal) */
    RT_REFUSE_COUNT_
} rt_refuse_reason;

typedef struct rt_metrics {
    uint64_t planned_bytes;          /* weights + arena the plan reserves */
    uint64_t arena_bytes;            /* the one arena allocated at load */
    uint64_t arena_high_water_bytes; /* highest arena byte touched + 1; 0 = unknown */
    uint64_t arena_touched_bytes;    /* arena bytes written; 0 = unknown */
    uint64_t peak_rss_bytes;         /* process peak resident set; 0 = unknown */
    uint64_t prefill_tokens;         /* prompt tokens run */
    double prefill_seconds;          /* wall time of prefill */
    uint64_t decode_tokens;          /* generated tokens */
    double decode_seconds;           /* wall time of decode */
    uint64_t requests_served;        /* requests that completed */
    uint64_t requests_refused[RT_REFUSE_COUNT_]; /* by rt_refuse_reason */
} rt_metrics;

/* Zero every field. */
void rt_metrics_init(rt_metrics *m);

/* The label value of a reason ("plan", "input", "other"); never NULL. */
const char *rt_metrics_reason_name(rt_refuse_reason r);

/* The refusal reason of a failed call's status (an mc_status value as the
 * mcrt_* functions return): 10 (MC_ERR_PLAN) -> plan, 7 (invalid
 * argument) -> input, anything else -> other. */
rt_refuse_reason rt_metrics_reason_of_status(int status);

/* Count n requests that ended with status (an mc_status value, as the
 * mcrt_* functions return): 0 -> served, else refused by
 * rt_metrics_reason_of_status.  m may be NULL (no-op). */
void rt_metrics_count(rt_metrics *m, int status, uint64_t n);

/* Peak resident set of this program image in bytes (VmHWM of
 * /proc/self/status, else getrusage), 0 if unknown. */
uint64_t rt_metrics_peak_rss_bytes(void);

/* Fill every field from an open handle (borrowed): planned and arena
 * bytes (mcrt_info), the arena high water, token counts, seconds and the
 * request counters since open (mcrt_stats: a request is one sequence), and
 * peak_rss_bytes from this process. */
void rt_metrics_from_mcrt(rt_metrics *m, const mcrt *h);

/* Format m in the text exposition format into a new buffer (*out, freed
 * with mc_free; *len its length without the NUL).  MC_ERR_NOMEM on failure. */
mc_status rt_metrics_format_prometheus(const rt_metrics *m, char **out,
                                       size_t *len, mc_error *err);

/* Write m to path atomically (temp file, fsync, rename).  On failure path
 * is untouched and err says why (MC_ERR_IO with the path, MC_ERR_NOMEM;
 * MC_ERR_INVALID_ARG from rt_metrics_check_path). */
mc_status rt_metrics_write_prometheus(const rt_metrics *m, const char *path,
                                      mc_error *err);

/* The output guard for a metrics path (fmt_input.h): not an input, a
 * link or a special file, and an existing file only if it is metrics
 * this program wrote (it starts "# HELP mcompile_").  Programs call it
 * before they run, so a refusal costs no work. */
mc_status rt_metrics_check_path(const char *path, mc_error *err);

#endif /* RT_METRICS_H */

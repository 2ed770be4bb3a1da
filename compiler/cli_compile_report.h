/*
 * cli_compile_report.h - what `mcompile MODEL --target ...` prints: the
 * calibration's progress (on a terminal only, a few times a second), its
 * per-layer table and summary, and the result: one line, -v the whole
 * plan, or with --json one object on stdout.  Part of the mcompile
 * program (cli_compile.c parses and runs; this file prints).
 */
#ifndef CLI_COMPILE_REPORT_H
#define CLI_COMPILE_REPORT_H

#include "cmp_compile.h"

/* State of the calibration progress line. */
typedef struct cmp_cli_calib_prog {
    int on;          /* stderr is a terminal and not -q */
    int plan_on;     /* not -q: the calibration's plan on stderr before it
                        starts (also with --json, whose object has it) */
    double last;     /* last print, seconds (cmp_cli_mono_s) */
} cmp_cli_calib_prog;

/* Monotonic seconds. */
double cmp_cli_mono_s(void);

/* cmp_compile_opts.progress: ctx is a cmp_cli_calib_prog. */
void cmp_cli_calib_progress(void *ctx, const cmp_calib_progress *p);

/* cmp_compile_opts.capped: the effort line on stderr at the start
 * (unless -q); ctx is a cmp_cli_calib_prog. */
void cmp_cli_calib_capped(void *ctx, const cmp_calib_effort *chosen,
                          const cmp_calib_effort *given, double passes);

/* The result of cmp_compile (status s, rep filled by it, seconds of
 * wall time) on stdout: the --json object (also on failure), or unless
 * quiet on success the "wrote ..." line, after the plan (verbose) and the
 * calibration table. */
void cmp_cli_compile_print(const cmp_compile_opts *o,
                           const cmp_compile_report *rep, mc_status s,
                           double seconds, int json, int quiet, int verbose);

#endif /* CLI_COMPILE_REPORT_H */

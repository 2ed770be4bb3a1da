/*
 * cmp_compile.h - `mcompile MODEL --target SIZE`: merge (optional LoRA
 * adapters, in memory through cmp_merge.h's tensor source, never written to
 * disk), convert every tensor to the format cmp_plan_tensors() assigns,
 * plan the memory, and emit one artifact (formats/fmt_artifact.h).
 *
 * Pipeline, one tensor at a time (peak memory ~ one float32 tensor plus its
 * converted section):
 *   open base (fmt_model) -> [cmp_merge_open] -> config -> cmp_plan_build
 *   (refused with the breakdown when the limits do not fit) ->
 *   cmp_plan_tensors -> for each: float32 values -> fmt_from_f32 (f32, f16,
 *   bf16) or cmp_quant_matrix (q8, q4) -> artifact section
 *   (+ tokenizer.json beside the model as section "tokenizer").
 * The manifest holds the config, the plan (limits and every arena buffer's
 * offset and size), the tensors' formats and parts, and the provenance
 * (XXH3-64 of every input file, adapters and their weights, compiler
 * version).  No paths, times or host facts enter the artifact, so identical
 * inputs give byte-identical output.
 */
#ifndef CMP_COMPILE_H
#define CMP_COMPILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cmp_merge.h"
#include "cmp_plan.h"
#include "fmt_config.h"
#include "mc_error.h"

typedef struct cmp_compile_opts {
    const char *model;                 /* HF directory or file */
    const char *out;                   /* artifact path */
    const cmp_adapter_spec *adapters;  /* borrowed, n_adapters of them */
    size_t n_adapters;
    cmp_plan_request req;              /* target, quant, limits, kv, ... */
    int compress;                      /* 1: zstd every section */
    int zstd_level;                    /* 0: 3 */
} cmp_compile_opts;

typedef struct cmp_compile_report {
    cmp_plan plan;                     /* the plan written */
    fmt_model_config cfg;              /* config compiled (untied if merged) */
    size_t tensors;                    /* tensors written */
    uint64_t weights_bytes;            /* sum of their parts */
    uint64_t file_bytes;               /* artifact size */
    int tokenizer;                     /* 1 if tokenizer.json was embedded */
    size_t adapters;                   /* adapters merged */
} cmp_compile_report;

/* Compile o->model into o->out.  On MC_ERR_PLAN, rep->plan holds the
 * breakdown (fits = 0) and nothing is written.  rep may be NULL. */
mc_status cmp_compile(const cmp_compile_opts *o, cmp_compile_report *rep,
                      mc_error *err);

/* ---- helpers shared by the CLI files (cli_plan.c defines them) ---------- */
/* Load the config.json of a model dir / .json / file beside one; prints the
 * error and returns 1 on failure, 0 on success (path gets its location). */
int cmp_cli_load_config(const char *arg, fmt_model_config *cfg, char *path,
                        size_t n);
/* The human plan report (breakdown, frontier, what dominates). */
void cmp_cli_print_plan(FILE *o, const fmt_model_config *cfg,
                        const cmp_plan *p);

#endif /* CMP_COMPILE_H */

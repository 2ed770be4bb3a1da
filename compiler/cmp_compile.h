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
 * With --calib (cmp_compile_calib.c): before planning, the float model
 * (rt_model_open_hf; adapters merged in memory into float32 copies of the
 * tensors they change) is calibrated with cmp_calib_run; the linears'
 * sections are then its quantized buffers (or, kept float, its float32
 * values as f16), and the layer norms and v/up biases its AWQ-folded
 * vectors.  With --quant auto, cmp_auto_measure/cmp_auto_choose pick each
 * linear's format first and the planner lists those formats
 * (cmp_wpolicy.linear_fmt), so plan and artifact agree byte for byte.
 * The manifest then also records, per linear, "method", "err", "err_rtn"
 * and "alpha" ("err_rtn_rows" too where a named method's RTN baseline was
 * measured on a sample of the rows, cmp_calib_baseline_stride), and a
 * "calibration" object (method, id file checksum,
 * sequences, the held-out summary; "awq_grid": "coarse" unless the full
 * grid was asked, which writes what compilers before the option wrote;
 * "stages" when not 4 and "full_layers" when the full-precision
 * statistics were cut, --calib-full-layers).  Memory on this path: what
 * cmp_calib_memory counts (the quantized result goes block by block into a
 * spill file beside the output and comes back mapped, so it is not held),
 * planned to fit calib_memory, plus a float32 copy of every tensor an
 * adapter changes.
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

#include "cmp_calib.h"
#include "cmp_calib_budget.h"
#include "cmp_merge.h"
#include "cmp_plan.h"
#include "fmt_config.h"
#include "mc_error.h"

/* --calib-full-pass: the products of the full-precision weights in the
 * calibration (cmp_calib_opts.full_bf16); the default is
 * cmp_calib_default_full_bf16's. */
typedef enum cmp_full_pass {
    CMP_FULL_PASS_DEFAULT = 0,
    CMP_FULL_PASS_BF16,
    CMP_FULL_PASS_F32
} cmp_full_pass;

typedef struct cmp_compile_opts {
    const char *model;                 /* HF directory or file */
    const char *out;                   /* artifact path */
    const cmp_adapter_spec *adapters;  /* borrowed, n_adapters of them */
    size_t n_adapters;
    cmp_plan_request req;              /* target, quant, limits, kv, ... */
    int compress;                      /* 1: zstd every section */
    int zstd_level;                    /* 0: 3 */
    /* Calibrated quantization (cmp_calib.h).  With calib set, the linear
     * layers are quantized by cmp_calib_run on the float model (the merged
     * one when adapters are given) instead of plain RTN. */
    const char *calib;                 /* token-id file (fmt_ids.h) or NULL */
    cmp_qmethod method;                /* with calib (the CLI's default: best) */
    int awq_full_grid;                 /* with calib: 1 = AWQ's alpha search
                                          tries all 20 grid points (the walk
                                          before issue 17); 0 = the coarse
                                          walk (cmp_awq.h: 11 points) */
    long heldout;                      /* with calib: last sequences kept out
                                          of calibration for the quality
                                          summary: 0 a tenth (at least one
                                          when there are two), N > 0 that
                                          many, < 0 none (calibrate on all) */
    int rotate;                        /* with calib: rotate the model first
                                          (cmp_rotate.h; the CLI's default,
                                          --no-rotate).  A tied model gets
                                          an untied float lm_head: the plan
                                          counts it */
    int quant_auto;                    /* 1: --quant auto: per-linear int4 /
                                          int8 / f16 chosen for the target
                                          (needs calib, req.max_batch and
                                          req.max_seq; req.policy.group is
                                          the int4 group) */
    int threads;                       /* calibration threads: 0 every CPU
                                          this process may use (kn_cpus.h),
                                          1 the calling thread only (the
                                          result does not depend on it) */
    int calib_stats_f32;               /* with calib: float products in the
                                          statistics (0: bfloat16) */
    int calib_fwd_f32;                 /* with calib: float activations in
                                          the quantized pass's linears
                                          (0: bfloat16) */
    int calib_full_pass;               /* with calib: the products of the
                                          full-precision weights
                                          (cmp_full_pass) */
    int calib_gpu;                     /* with calib: statistics on a CUDA
                                          GPU (cmp_gpu_stats.h) */
    uint64_t calib_memory;             /* with calib: the calibration's
                                          memory budget in bytes
                                          (cmp_calib_plan_memory); 0: 75 %
                                          of physical memory */
    int method_fixed;                  /* with calib: the user named the
                                          method (a budget keeps it) */
    uint32_t calib_stages;             /* with calib: statistics stages (1,
                                          2 or 4; 0: the default, 4) */
    size_t calib_seqs;                 /* with calib: calibrate on the first
                                          N sequences not held out (0: all) */
    uint32_t calib_full_layers;        /* with calib: the full-precision
                                          statistics on the first N blocks
                                          only (cmp_calib_opts.full_layers;
                                          0: all) */
    int calib_no_refine;               /* with calib: GPTQ's codes and
                                          group parameters unrefined
                                          (cmp_calib_opts.no_refine) */
    uint32_t calib_baseline_rows;      /* with calib: a named method's RTN
                                          baseline on about this many rows
                                          of each linear
                                          (cmp_calib_opts.baseline_rows;
                                          0: the default) */
    int calib_refine_fixed;            /* with calib: the user asked for
                                          the refinement (a budget keeps
                                          it) */
    double calib_passes;               /* with calib and no calib_time_s:
                                          the effort capped at this many
                                          forward passes over the
                                          calibration tokens
                                          (cmp_calib_effort_within_passes;
                                          the CLI's default
                                          CMP_CALIB_PASSES_DEFAULT); 0:
                                          the options as given */
    double calib_time_s;               /* with calib: a time budget in
                                          seconds (0: none): the effort is
                                          chosen from the plan's estimate
                                          (cmp_calib_budget.h); the result
                                          is the one the chosen effort's
                                          options give without it */
    void (*progress)(void *ctx, const cmp_calib_progress *p); /* or NULL */
    void *progress_ctx;
    /* or NULL: called with progress_ctx before the calibration starts
     * when the default cap (calib_passes) cut the effort: the effort
     * chosen and the options' (a long compile says so at its start) */
    void (*capped)(void *ctx, const cmp_calib_effort *chosen,
                   const cmp_calib_effort *given, double passes);
} cmp_compile_opts;

/* The parts of the weights the report sizes (cmp_compile_report). */
enum { CMP_PART_EMBED, CMP_PART_LM_HEAD, CMP_PART_LINEARS, CMP_PART_OTHER,
       CMP_PART_COUNT };

typedef struct cmp_compile_report {
    cmp_plan plan;                     /* the plan written */
    fmt_model_config cfg;              /* config compiled (untied if merged) */
    size_t tensors;                    /* tensors written */
    uint64_t weights_bytes;            /* sum of their parts */
    uint64_t part_bytes[CMP_PART_COUNT]; /* weights_bytes by part: the
                                          embeddings, the output layer (0
                                          when tied), the linears, the rest
                                          (norms, biases) */
    kn_wformat lm_head_fmt;            /* the output layer's format (the
                                          embeddings' when tied) */
    int lm_head_tied;                  /* 1: no output layer of its own */
    uint64_t file_bytes;               /* artifact size */
    int tokenizer;                     /* 1 if tokenizer.json was embedded */
    char tokenizer_note[1280];         /* "" or why the tokenizer is left
                                          out / why mrun cannot read it */
    size_t adapters;                   /* adapters merged */
    /* Calibrated path only (else NULL / 0): */
    cmp_calib_result *calib;           /* per-linear method and errors and
                                          the held-out summary; owned: call
                                          cmp_compile_report_release */
    uint32_t calib_group;              /* int4 group of the result */
    size_t calib_seqs;                 /* sequences in the id file */
    size_t heldout_seqs;               /* of them held out for the summary */
    uint64_t auto_total_bytes;         /* --quant auto: planned total */
    cmp_calib_effort calib_effort;     /* the effort calibrated with (the
                                          options' or a budget's choice) */
    cmp_calib_effort calib_effort_most; /* with a budget: the options'
                                          effort and its estimate */
    double calib_budget_s;             /* the budget (0: none) */
    double calib_passes;               /* the default cap applied (0: none,
                                          or a budget instead) */
    double calib_cap_s;                /* its nominal seconds */
    int calib_capped;                  /* 1: the cap cut the effort */
    double calib_seconds;              /* wall time of the calibration stage
                                          (reading the ids, auto precision,
                                          cmp_calib_run); 0 without one */
    double write_seconds;              /* wall time of writing the artifact */
} cmp_compile_report;

/* Release what a report owns (the calibration result); NULL is a no-op. */
void cmp_compile_report_release(cmp_compile_report *rep);

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

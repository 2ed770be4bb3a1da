/*
 * cmp_plan.h - the memory planner: from config.json and the chosen weight
 * formats alone (no weights), every byte a session will need.
 *
 *   total = weights + arena + reserve   (+ the dataset job's default
 *            buffers, cmp_plan_job_bytes, which must fit the target too)
 *   weights  sum over the tensors cmp_plan_tensors lists of data + scales +
 *            zeros bytes (kn_wformat_*_bytes of kn_quant.h, exactly)
 *   arena    rt_layout_build (runtime/rt_layout.h, the single source of
 *            truth): KV cache (capped per layer by a sliding window) plus
 *            the step buffers laid out by lifetime (activations of a
 *            prefill chunk, logits, sampler, attention workspace)
 *   reserve  what the process takes outside these allocations: CPU
 *            cmp_plan_cpu_reserve (calibrated, below); CUDA
 *            CMP_CUDA_CONTEXT_BYTES + CMP_CUBLAS_WORKSPACE_BYTES; or the
 *            user's --reserve
 *
 * Which tensor gets which format is decided in ONE place,
 * cmp_plan_tensors(), used by plan and compile alike, so the planned weight
 * bytes are the compiled weight bytes:
 *   linear weights (q k v o gate up down)  the requested format, or
 *                      policy.linear_fmt[layer][slot] when given (auto)
 *   embed_tokens       f32 for --quant f32, bf16 for bf16, else f16;
 *                      tied (it is the output layer too): q8 for
 *                      int8/int4, or the --lm-head format
 *   lm_head (untied)   q8 for int8/int4, else as embed_tokens
 *   norms and biases   f32 (small; the runtime reads them as float)
 *
 * Nothing here prints; cmp_cli_plan formats the reports.
 */
#ifndef CMP_PLAN_H
#define CMP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fmt_config.h"
#include "kn_quant.h"
#include "mc_error.h"
#include "rt_layout.h"

#define CMP_CUDA_CONTEXT_BYTES (1024ull << 20)  /* docs/plan.md: 0.3-0.7 GiB,
                                                  rounded up for safety */
#define CMP_CUBLAS_WORKSPACE_BYTES (32ull << 20) /* Hopper */
/* The CPU runtime process outside its weights and arena, calibrated on
 * mrun's measured peak RSS minus weights minus arena at the plan's corner
 * (docs/plan.md "Reserve" has the measurements; bench_arena repeats them):
 *   base     program image, libc, jansson, zstd, the main stack: the
 *            largest f32 measurement (stories260k, 47 tensors, 2 threads:
 *            3.43 MiB after the tensor and thread terms), varying +-0.15
 *            MiB from run to run, with the request mode and the weight
 *            format (an int4 prefill reached 3.52), plus a margin of 256
 *            KiB, so that peak RSS stays within the plan (3.68 MiB);
 *            4.04 MiB since the AVX-512 kernels (+103 KB of text; a
 *            Zen 4 host measured up to 0.28 MiB over the old base);
 *            4.51 MiB since the AVX-512 decode kernels (Release text
 *            1.42 -> 2.02 MB; the same host measured up to 0.19 MiB
 *            over; CI's RelWithDebInfo build, 0.7 MB of text, runs
 *            ~0.9 MB lower, so the base sits between the two)
 *   threads  per worker thread the plan allows (its stack and TLS pages):
 *            20 KiB (stories260k at 1, 2, 8 and 16 threads)
 *   tensors  per tensor of the artifact: its manifest entries (parsed
 *            JSON, held once since rt_api.c stopped reopening the file)
 *            and views, 3 KiB (fixtures of 30-67 tensors, stories260k,
 *            SmolLM-135M's 272)
 *   floats   the norm and bias vectors the loader copies to float32
 *            (exact: 4 bytes each)
 *   tokenizer  the embedded tokenizer.json's tables: 8 x its size
 *            (TinyLlama shape with the Mistral tokenizer, 1.8 MB: 12.96
 *            MiB measured beyond the other terms, 13.7 MiB reserved)
 * cmp_plan_cpu_reserve adds them up; the plan adds the artifact's page
 * tails on top (cmp_plan_map_tail_bytes, exact: no calibration). */
#define CMP_CPU_BASE_BYTES (4620ull << 10) /* 3768 KiB until the AVX-512
                                                kernels, 4140 until the
                                                AVX-512 decode kernels:
                                                see docs/plan.md */
#define CMP_CPU_THREAD_BYTES (20ull << 10)
#define CMP_CPU_TENSOR_BYTES 3072ull
#define CMP_CPU_TOKENIZER_PER_BYTE_X2 16ull  /* 8 x, in halves */
#define CMP_PLAN_DEFAULT_CHUNK 256u   /* capped at max_batch x max_seq */
#define CMP_PLAN_DEFAULT_THREADS 4   /* fixed so artifacts do not depend on
                                        the compiling machine's CPU count */
#define CMP_PLAN_MAX_FRONTIER 24

/* Weight formats chosen by --quant. */
typedef struct cmp_wpolicy {
    char quant[16];          /* "f32", "f16", "bf16", "int8", "int4",
                                "int4-sym", "auto" */
    kn_wformat linear;       /* format of the linear layers */
    uint32_t group;          /* int4 group size (32, 64, 128; --group,
                                default 128) of int4 linears and of an
                                int4 output layer, whatever the linears
                                (cmp_wpolicy_linear_group: the linears') */
    const kn_wformat *linear_fmt; /* optional, borrowed: per-linear format
                                     [layers][7] in q k v o gate up down
                                     order (--quant auto); NULL: `linear`
                                     for every linear layer */
    int lm_head_float;       /* 1: an untied lm_head keeps the embeddings'
                                float format even when the linears are
                                quantized (set when the compiler unties a
                                tied model itself, for the rotation) */
    int lm_head_set;         /* 1: lm_head_fmt overrides the rule for an
                                untied lm_head, or for a tied model's
                                embedding, which is its output layer
                                (--lm-head) */
    kn_wformat lm_head_fmt;  /* F32, F16, BF16, Q8, Q4 or Q4S (at group) */
} cmp_wpolicy;

/* What the calibration's rotation (cmp_rotate.h) does to the compiled
 * tensors, for the plan: when hidden_size allows a rotation, a tied model
 * gets its own output layer (cfg untied): int8 when the linears are
 * quantized (int8, int4, int4-sym, auto; the untied rule), else kept float
 * (p->lm_head_float), float32 when float32_source; --lm-head overrides
 * both.  Returns 1 if cfg was tied and is now untied. */
int cmp_plan_untie_for_rotation(fmt_model_config *cfg, cmp_wpolicy *p,
                                int float32_source);

/* Parse --quant (and the int4 group, 0 = 128). */
mc_status cmp_wpolicy_parse(const char *quant, uint32_t group,
                            cmp_wpolicy *out, mc_error *err);

/* The linears' int4 group: p->group when they are int4 (or int4-sym, or
 * --quant auto's), else 0 (what the plan and the manifest record). */
uint32_t cmp_wpolicy_linear_group(const cmp_wpolicy *p);

typedef enum cmp_role {
    CMP_ROLE_EMBED = 0,
    CMP_ROLE_LINEAR = 1,
    CMP_ROLE_LM_HEAD = 2,
    CMP_ROLE_NORM = 3,
    CMP_ROLE_BIAS = 4,
} cmp_role;

/* The format policy p gives a tensor of role (EMBED, LINEAR without
 * --quant auto's table, LM_HEAD) of a model tied or not: what
 * cmp_plan_tensors lists. */
kn_wformat cmp_plan_role_format(const cmp_wpolicy *p, cmp_role role,
                                int tied);

/* One tensor of the compiled model and where its parts sit in its artifact
 * section (each part 64-byte aligned). */
typedef struct cmp_tensor_plan {
    char name[96];           /* Hugging Face name */
    cmp_role role;
    int ndim;                /* 1 (norm, bias) or 2 */
    uint32_t rows, cols;     /* 1-D: rows 1, cols n */
    kn_wformat fmt;
    uint32_t group;          /* Q4/Q4S only, else 0 */
    uint64_t data_bytes, scale_bytes, zero_bytes;  /* exact */
    uint64_t data_off, scale_off, zero_off;        /* inside the section */
    uint64_t section_bytes;  /* raw section size */
} cmp_tensor_plan;

/* List every tensor for cfg under policy p, in a fixed order (embed, layers
 * 0..L-1, final norm, lm_head).  *out is mc_malloc'ed (caller mc_free). */
mc_status cmp_plan_tensors(const fmt_model_config *cfg, const cmp_wpolicy *p,
                           cmp_tensor_plan **out, size_t *n, mc_error *err);
/* Sum of data + scale + zero bytes over the list. */
uint64_t cmp_plan_weight_bytes(const cmp_tensor_plan *t, size_t n);

/* The bytes a mapped artifact makes resident beyond the weights: every
 * section starts on an FMT_ART_ALIGN (page) boundary, so reading a
 * section brings in its whole last page.  Sum over the tensors of
 * section_bytes rounded up to FMT_ART_ALIGN, less section_bytes.  Exact
 * for 4 KiB pages (a larger page size maps more). */
uint64_t cmp_plan_map_tail_bytes(const cmp_tensor_plan *t, size_t n);
/* Number of parameters the config implies (matrix elements + norms + biases). */
uint64_t cmp_plan_param_count(const fmt_model_config *cfg);

typedef enum cmp_device {
    CMP_DEV_CPU = 0,
    CMP_DEV_CUDA = 1,
} cmp_device;

typedef struct cmp_plan_request {
    cmp_wpolicy policy;
    uint64_t target_bytes;   /* memory available */
    uint32_t max_batch;      /* 0: choose */
    uint64_t max_seq;        /* 0: choose */
    uint32_t prefill_chunk;  /* 0: CMP_PLAN_DEFAULT_CHUNK (raised to batch) */
    kn_kvtype kv_type;
    int threads;             /* 0: CMP_PLAN_DEFAULT_THREADS */
    cmp_device device;
    int64_t reserve_bytes;   /* -1: the device default */
    uint64_t tokenizer_bytes;/* tokenizer.json the artifact embeds (0:
                                none): part of the CPU reserve */
} cmp_plan_request;

/* Defaults: f16 linear, f16 KV, CPU, chunk 256, 4 threads, no limits. */
void cmp_plan_request_default(cmp_plan_request *r);

typedef struct cmp_frontier_point {
    uint32_t batch;
    uint64_t max_seq;        /* longest context that fits at this batch */
} cmp_frontier_point;

typedef struct cmp_plan {
    cmp_plan_request req;    /* as given (policy echoed) */
    rt_limits limits;        /* chosen (or requested) limits */
    rt_layout layout;        /* rt_layout_build(cfg, limits) */
    uint64_t params;
    uint64_t weights_bytes;
    uint64_t kv_bytes_per_token;   /* all layers, uncapped */
    uint64_t kv_bytes;             /* session KV (window-capped) */
    uint64_t activation_bytes;     /* arena - KV */
    uint64_t arena_bytes;
    uint64_t logits_bytes;         /* logits + hx buffers (inside arena) */
    uint64_t sampler_bytes;        /* probs + index (inside arena) */
    uint64_t workspace_bytes;      /* attention scratch (inside arena) */
    uint64_t reserve_bytes;
    const char *reserve_source;    /* "cpu default", "cuda default", "--reserve" */
    uint64_t total_bytes;          /* weights + arena + reserve */
    uint64_t job_bytes;            /* the dataset job's default buffers
                                      (rt_plan.h rt_job_budget; CPU; 0 for
                                      CUDA), planned beside total_bytes */
    uint64_t target_bytes;
    int fits;                      /* total + job <= target */
    int chosen;                    /* 1: limits chosen by the planner */
    cmp_frontier_point frontier[CMP_PLAN_MAX_FRONTIER];
    size_t nfrontier;
} cmp_plan;

/* Build the plan.  With both max_batch and max_seq given, they are checked:
 * MC_ERR_PLAN when they do not fit (out is still filled, fits = 0, so the
 * caller can print the breakdown).  Otherwise the missing one(s) are chosen
 * from the frontier: max_seq defaults to min(max_position_embeddings, 4096)
 * and batch to the largest (<= 64) that fits; MC_ERR_PLAN if not even batch
 * 1 with 1 token fits. */
mc_status cmp_plan_build(const fmt_model_config *cfg,
                         const cmp_plan_request *req, cmp_plan *out,
                         mc_error *err);

/* The CPU process reserve (CMP_CPU_* above) of cfg compiled into
 * n_tensors tensors with a tokenizer.json of tokenizer_bytes (0: none),
 * run on at most threads workers (the plan's resolved thread count);
 * UINT64_MAX on overflow. */
uint64_t cmp_plan_cpu_reserve(const fmt_model_config *cfg, size_t n_tensors,
                              uint32_t threads, uint64_t tokenizer_bytes);

/* Size of the tokenizer.json in dir (the file an artifact compiled from
 * dir embeds): 0 when there is none or it is not a regular file. */
uint64_t cmp_plan_tokenizer_bytes(const char *dir);

/* The dataset job's default budget (mrun --input, rt_plan.h
 * rt_job_budget) at max_seq: host buffers beside the session on a CPU
 * plan with the calibrated reserve; 0 on CUDA and with --reserve (which
 * then states all the host holds); UINT64_MAX on overflow. */
uint64_t cmp_plan_job_bytes(const cmp_plan_request *req, uint64_t max_seq);

/* Total bytes of (batch, max_seq) under req, the dataset job's default
 * budget included (0 on overflow/invalid). */
uint64_t cmp_plan_total_for(const fmt_model_config *cfg,
                            const cmp_plan_request *req, uint64_t weights,
                            uint64_t reserve, uint32_t batch,
                            uint64_t max_seq);

/* "needs 26.31 GiB: weights 13.49, KV 10.00, activations 1.80, reserve
 * 1.02; target 24.00" into buf. */
const char *cmp_plan_breakdown(const cmp_plan *p, char *buf, size_t n);
/* One sentence on what dominates the total. */
const char *cmp_plan_dominant(const cmp_plan *p, char *buf, size_t n);

/* The plan as JSON (new reference): the keys of the --json report and of
 * the artifact manifest's "plan": the stored keys a session depends on
 * (rt_plan_to_json, runtime/rt_plan.h: limits, every arena buffer's offset
 * and size, totals) and the planner's report (frontier, target, fits...). */
json_t *cmp_plan_to_json(const cmp_plan *p);

/* "24GiB", "24G", "1.5GiB", "512MiB", "512M", "4096" (bytes), "2KB"...
 * Binary units (K/M/G/T, with or without "iB"/"B").  Returns 0 on success,
 * -1 on a malformed or overflowing size. */
int cmp_parse_size(const char *s, uint64_t *out);

/* The command-line options of plan and compile are parsed by their
 * option tables (compiler/cli_opts.c, cmp_cli.h). */

#endif /* CMP_PLAN_H */

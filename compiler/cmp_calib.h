/*
 * cmp_calib.h - layer-by-layer calibration and quantization of a model's
 * linear layers (RTN, AWQ, GPTQ, or the best of them per layer).
 *
 * Order (GPTQ; docs/quantization.md, "Calibration"): the hidden states of every
 * calibration token at the current block boundary are kept ([tokens]
 * [hidden] floats, the only model-sized activation buffer).  For block L:
 *   1. copy block L's matrices to float32 (the only full-precision weights
 *      live at a time) and run it over every calibration sequence with a
 *      kn_block tap that accumulates, per linear input group (qkv, o,
 *      gate/up, down), the Hessian sum x x^T (cmp_hessian) and sum |x_j|;
 *   2. quantize its groups in the order down, o, qkv, gate/up (a group's
 *      AWQ scales fold into the producer of its input: up_proj rows for
 *      down, v_proj rows for o when kv_heads == heads, the two RMSNorm
 *      weights for qkv and gate/up; under GQA o_proj is not scaled, see
 *      cmp_awq.h), each with the method asked:
 *        rtn       plain round to nearest (cmp_quant_matrix)
 *        gptq      cmp_gptq_quantize with the group's Hessian
 *        awq       AWQ scales + clipping (not for q/k), then RTN
 *        gptaq     GPTQ after least-squares retargeting (cmp_gptq.h)
 *        best      rtn and gptaq (gptq where lean); awq-scales-then-gptaq
 *                  only where the AWQ search on the group's Hessian (the
 *                  cheap proxy) cuts RTN's error by CMP_BEST_AWQ_GAIN,
 *                  and the act-order variants only where diag(H) has
 *                  outliers (max > CMP_BEST_ACT_ORDER_SPREAD x mean);
 *                  keeps the candidate with the smallest summed output
 *                  error
 *        best-all  every candidate everywhere: rtn, gptq, gptaq, awq and
 *                  awq+gptaq, with and without act-order
 *   3. run the QUANTIZED block over the stored states to produce block
 *      L+1's inputs, so each block sees the outputs of the already
 *      quantized ones.
 *   4. with opts.heldout, move the held-out sequences' states of both
 *      models through the float block and the quantized one
 *      (cmp_calib_heldout.c); their heads and the summary come at the
 *      end, bit for bit what cmp_eval_models gives on the result.
 * With opts.rotate the model is first rotated (cmp_rotate.h: residual
 * stream and value heads, norms folded into the linears), one block at a
 * time as its float32 copy is made; the embeddings and the output layer
 * are rotated into the result.  The function is unchanged; the weights
 * quantize with less error.
 * Two sets of states are kept: the full-precision model's and the
 * partly quantized model's.  Each linear's error is its relative output
 * error on the calibration tokens against the FULL-PRECISION model:
 *   sum_t ||W x_f - Q x_q||^2 / sum_t ||W x_f||^2
 * (x_f: the input in the full-precision model, x_q: in the model whose
 * earlier blocks are quantized; computed from Hf = sum x_f x_f^T,
 * Hq = sum x_q x_q^T and C = sum x_f x_q^T).  The RTN error is measured
 * too, for the per-layer table.
 *
 * Memory (cmp_calib_memory plans it, phase by phase): two sets of stored
 * states (2 x tokens x hidden x 4 bytes), one block's float32 weights, the
 * statistics of one input group at a time (Hq packed; Hf and C only where
 * the point is not lean), that group's quantization work space and the
 * held-out states (2 x held-out tokens x hidden x 4 bytes).  With
 * opts.spill_dir each finished block's buffers go to a spill file and come
 * back mapped at the end, so the quantized model is not held.  The model
 * itself is read through its views (mmap).
 *
 * The result owns every quantized buffer and the folded norms/biases;
 * cmp_calib_view() builds an rt_model over it (for evaluation, or for the
 * artifact writer to read matrices from).  Progress is reported through a
 * callback; the library never prints.
 */
#ifndef CMP_CALIB_H
#define CMP_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_eval.h"
#include "cmp_par.h"
#include "cmp_quant.h"
#include "kn_ops.h"
#include "mc_error.h"
#include "rt_model.h"

typedef enum cmp_qmethod {
    CMP_QM_RTN = 0,
    CMP_QM_AWQ = 1,
    CMP_QM_GPTQ = 2,
    CMP_QM_BEST = 3,
    CMP_QM_AWQ_GPTQ = 4,  /* AWQ scales, then GPTQ (a "best" candidate) */
    CMP_QM_GPTAQ = 5,     /* GPTQ on the least-squares retargeted weight
                             (cmp_gptq_retarget): fits the full-precision
                             model's outputs from the quantized inputs */
    CMP_QM_AWQ_GPTAQ = 6, /* AWQ scales, then GPTAQ */
    CMP_QM_BEST_ALL = 7,  /* every candidate on every group (the "best"
                             before issue 17: 5 GPTQ runs a group) */
} cmp_qmethod;

/* "rtn", "awq", "gptq", "best", "awq+gptq", "gptaq", "awq+gptaq",
 * "best-all". */
const char *cmp_qmethod_name(cmp_qmethod m);
/* Parse a --method value; returns 0 on success, -1 if unknown. */
int cmp_qmethod_parse(const char *s, cmp_qmethod *out);
/* 1 for best and best-all (the methods that choose per group). */
int cmp_calib_is_best(cmp_qmethod m);
/* 1 for the methods that fit the full-precision model's outputs: gptaq,
 * awq+gptaq, and best and best-all, which try them.  Only these need the
 * full-precision forward pass and its statistics (Hf, C); the others
 * collect every point lean (cmp_calib_plan_memory): Hq alone, their
 * errors measured on their own inputs, and no full-precision pass (at
 * SmolLM2-135M's shape with 32K tokens about half the compile). */
int cmp_calib_method_asymmetric(cmp_qmethod m);

/* Linear slots of a block, in the order of the per-layer table. */
enum { CMP_LIN_Q, CMP_LIN_K, CMP_LIN_V, CMP_LIN_O, CMP_LIN_GATE, CMP_LIN_UP,
       CMP_LIN_DOWN, CMP_LIN_COUNT };
/* "q_proj".."down_proj". */
const char *cmp_lin_name(int slot);

struct cmp_calib_plan;

typedef struct cmp_calib_progress {
    const struct cmp_calib_plan *plan; /* set on the one call made before
                                          the first layer starts (layer
                                          0): the plan to print; NULL on
                                          the per-layer calls */
    uint32_t layer;       /* layers finished */
    uint32_t layers;      /* total */
    double elapsed_s;     /* since the start */
    double eta_s;         /* estimate of the time left */
} cmp_calib_progress;

/* Stages of a block's statistics by default (cmp_calib_opts.stages). */
#define CMP_CALIB_STAGES_DEFAULT 4u

/* The blocks that keep the full-precision statistics when the user does
 * not say (cmp_calib_opts.full_layers, 0: all): the first half, rounded
 * up, when every linear is int8; all of them otherwise.  Measured
 * (docs/benchmarks.md, session 19): with int8 linears the cut changes
 * stories260k's KLD by -1.3 % and the SmolLM2-135M shape's by -4.8 %
 * (32K tokens) for 35 % less time; with int4 it costs stories260k
 * +7-9 %, so int4 keeps every block.  Only the methods that run the
 * full-precision pass (cmp_calib_method_asymmetric) take it. */
uint32_t cmp_calib_default_full_layers(kn_wformat fmt, int mixed,
                                       uint32_t layers);

/* Whether the full-precision weights multiply in bfloat16 when the user
 * does not say (cmp_calib_opts.full_bf16): with int4 linears, not with
 * int8 or a per-linear mix.  Measured (docs/benchmarks.md, session 22):
 * int4's KLD moves by -1.9 % (SmolLM2-135M shape, 32K tokens, g128) and
 * -0.5 / +0.9 / +0.6 % (stories260k g32 / g128 / int4-sym g32) for ~18 %
 * less forward time; int8's rises by 4-6 %: its error is near the
 * rounding of the weights to bfloat16. */
int cmp_calib_default_full_bf16(kn_wformat fmt, int mixed);

/* AWQ's pre-scaling of down (and, under MHA, o) needs the statistics of
 * their inputs before anything of the block is quantized: a pass through
 * the block as far as down's input, in stage 0, where no group reads them
 * (stages 2 and 4; with 1 stage they are the group's own and every
 * sequence runs).  That pass was 28 % of the forward at SmolLM2-135M's
 * widths (32K tokens), and its Hq of the FFN width 15 % of the
 * statistics, for one alpha per linear: so it runs on every stride-th
 * calibration sequence, stride = tokens / CMP_CALIB_PRESCALE_TOKENS
 * (at least 1): about that many tokens, spread over the set. */
#define CMP_CALIB_PRESCALE_TOKENS 8192u
size_t cmp_calib_prescale_stride(size_t tokens);

/* A bit of cmp_calib_opts.force_lean and cmp_calib_mem.lean beside the
 * tap points: no store of down's inputs.  With 4 stages, down's
 * quantized statistics pass runs the block as its final move will, up to
 * down's input; by default that input (tokens x FFN floats, for the
 * whole calibration set) and the residual are kept, so the final move is
 * down's product alone (the same bits: the same kernels on the same
 * values) instead of the whole block: 3.54 M -> 0.88 M multiply-adds per
 * token at SmolLM2-135M's widths, 17 % of the forward passes.  Set, or
 * when a budget does not fit it (the first thing the plan gives up), the
 * final move runs the whole block. */
#define CMP_CALIB_LEAN_DOWN_STORE (1u << 4)

/* Lean bit: no H w kept between a GPTQ candidate's scale refits
 * (cmp_refit_hw: rows x cols doubles of the linear being quantized, for
 * the refits after the first, which then cost a third).  The same bits
 * either way; the first thing a plan over its budget gives up. */
#define CMP_CALIB_LEAN_REFIT_HW (1u << 5)

typedef struct cmp_calib_opts {
    kn_wformat fmt;          /* format of every linear (Q8, Q4, Q4S) */
    uint32_t group;          /* Q4/Q4S group: 32, 64 or 128 */
    cmp_qmethod method;
    const kn_wformat *tensor_fmt; /* optional [layers][CMP_LIN_COUNT]
                                     per-linear format (auto precision);
                                     F32/F16/BF16 keep the linear float */
    int act_order;           /* GPTQ act-order (static groups) */
    double damp;             /* GPTQ dampening; 0 -> 0.01 */
    size_t heldout;          /* last sequences kept out of calibration and
                                used for the summary (0 = none) */
    kn_wformat lm_head_fmt;  /* the output layer as the artifact stores
                                it: Q8 (per row), Q4 or Q4S (at .group)
                                quantize it, RTN, for the held-out view;
                                F32 (0), F16, BF16: left float */
    kn_wformat embed_fmt;    /* the embedding as the artifact stores it,
                                for the held-out view's lookups: F16 / BF16
                                round its rows; F32 (0): the source's.  An
                                unrotated tied model's quantized output
                                layer (lm_head_fmt) is its embedding */
    int rotate;              /* 1: rotate the residual stream and value
                                heads first (cmp_rotate.h); ignored (the
                                result says so) when the width does not
                                allow it */
    uint64_t rotate_seed;    /* sign diagonal seed; 0 -> a fixed default */
    const char *spill_dir;   /* directory for the spill file (cmp_spill.h):
                                each finished block's buffers leave memory
                                and come back as a read-only mapping.
                                NULL keeps the whole result in memory. */
    uint64_t mem_budget;     /* bytes; 0 = no limit.  When cmp_calib_memory's
                                estimate exceeds it, the widest inputs'
                                statistics go lean until it fits (see
                                cmp_calib_plan_memory); MC_ERR_NOMEM if
                                even all-lean does not fit */
    uint32_t stages;         /* passes for a block's statistics: 4 = each
                                group's from its own pair of passes over
                                the block with the groups before it
                                quantized (10 block passes; the order
                                before issue 17); 2 = attention (qkv, o)
                                then MLP (gate/up, down) (5 passes); 1 =
                                all four from the float block (3 passes);
                                0 -> CMP_CALIB_STAGES_DEFAULT */
    uint32_t full_layers;    /* the asymmetric methods' full-precision pass
                                and its statistics (Hf, C: GPTAQ's
                                retarget) on the first full_layers blocks
                                only; the blocks after them collect every
                                point lean (GPTQ on their own inputs,
                                their errors marked so), and the
                                full-precision states stop there.  A
                                cheaper effort than gptaq on every block
                                and a better one than gptq
                                (cmp_calib_budget.h); 0 -> every block */
    int stats_f32;           /* 1: the statistics' products in float
                                (kn_gram_tri); 0 (the default): the inputs
                                rounded to bfloat16 (kn_gram_tri_bf16:
                                twice the rate where the CPU has
                                AVX512_BF16, the same bits on every CPU) */
    int fwd_f32;             /* 1: the quantized pass's linears multiply
                                float activations (kn_gemm, the
                                artifacts of before); 0 (the default):
                                their quantized matrices multiply
                                activations rounded to bfloat16
                                (kn_gemm_bf16.h: codes exact, scales
                                after; twice the rate where the CPU has
                                AVX512_BF16, the same bits on every CPU). */
    int full_bf16;           /* 1 (with fwd_f32 0): the full-precision
                                weights multiply bfloat16 activations too,
                                rounded to bfloat16 themselves (kn_gemm_
                                bf16.h's float weights): the full-precision
                                pass and the moves, and the linears a
                                stage's quantized pass reaches before they
                                are quantized; 0 (the default): float */
    int down_full_c;         /* 1: down_proj's statistics as every other
                                point's, Hf and C (width^2 each); 0 (the
                                default): where its stage's full-precision
                                pass runs through down, W C = sum y_f x_q^T
                                and tr(W Hf W^T) = sum ||y_f||^2 from its
                                outputs y_f = W x_f (rows x width and
                                rows per token instead of 1.5 width^2: at
                                SmolLM2's widths half the statistics'
                                multiply-adds), and the retarget and the
                                cross term from W C
                                (cmp_calib_down_from_outputs) */
    int stats_on_gpu;        /* 1: accumulate Hq, Hf and C on a CUDA GPU
                                (cmp_gpu_stats.h); MC_ERR_UNSUPPORTED when
                                there is none.  Same sums up to summation
                                order; everything else stays on the CPU */
    unsigned force_lean;     /* tap points (bit KN_TAP_*) collected lean
                                whatever the budget: for a caller that
                                reads only err_local (auto precision);
                                CMP_CALIB_LEAN_DOWN_STORE: no store of
                                down's inputs; CMP_CALIB_LEAN_REFIT_HW: no
                                H w kept between refits */
    int no_refine;           /* 1: a GPTQ candidate keeps GPTQ's codes and
                                group parameters as they come: no scale
                                refit, second pass or code descent (the
                                GPTQ of the papers; --calib-refine off).
                                At a 7B shape the refinement is ~85 % of
                                a GPTQ candidate's search (cmp_calib_plan.c,
                                SEARCH_W_*); 0 (the default): refined */
    uint32_t baseline_rows;  /* a named method's RTN baseline (err_rtn,
                                never a candidate there) is measured on
                                about this many of each linear's rows,
                                every (rows / baseline_rows)-th
                                (cmp_calib_baseline_stride); 0:
                                CMP_CALIB_BASELINE_ROWS; UINT32_MAX: all */
    int awq_coarse;          /* 1: AWQ's alpha search walks its grid
                                coarse to fine (cmp_awq.h): 11 of the 20
                                points, the same pick where the error is
                                unimodal in alpha */
    int plan_nominal;        /* 1: the plan's estimate as on a CPU with
                                AVX512_BF16 whatever this one has, so that
                                a choice made from it in units of a
                                forward pass (--calib-passes) is the same
                                on every machine */
    double plan_rate;        /* float GEMM multiply-adds per second for the
                                plan's estimate (the rate a budget's choice
                                used, cmp_calib_budget.h); 0: measured */
    kn_pool *pool;           /* threads for the forward passes and the
                                row-parallel work (the result does not
                                depend on their number), or NULL */
    void (*progress)(void *ctx, const cmp_calib_progress *p);
    void *progress_ctx;
} cmp_calib_opts;

/* A named method's RTN baseline: RTN is never its candidate (the method
 * asked is the result), so RTN's error is measured for the table only,
 * and on a sample of rows: about CMP_CALIB_BASELINE_ROWS of each linear's,
 * every stride-th from row 0 (a ratio of the sample's error to the
 * sample's energy).  Measured whole it is about a quarter of the search
 * of gptq unrefined on lean statistics (one output error of the four
 * passes over H a linear gets, by the plan's weights), 1/8 of that at
 * the 7B shape sampled.  Returns 1 where every row is measured: best, best-all and rtn
 * (RTN is a candidate there), and linears of fewer than twice the
 * sample's rows. */
#define CMP_CALIB_BASELINE_ROWS 512u
uint32_t cmp_calib_baseline_stride(const cmp_calib_opts *o, uint32_t rows);

/* One linear's result. */
typedef struct cmp_calib_tensor {
    char name[96];           /* HF name: model.layers.L.self_attn.q_proj.weight */
    uint32_t layer;
    int slot;                /* CMP_LIN_* */
    kn_wformat fmt;          /* as stored (F32 when kept float) */
    cmp_qbuf q;              /* quantized buffers (owned) when quantized */
    float *f32;              /* [rows][cols] when kept float (owned) */
    cmp_qmethod method;      /* what was chosen */
    double err;              /* relative output error of the result */
    double err_rtn;          /* relative output error of plain RTN; for a
                                named method an estimate from
                                err_rtn_rows of its rows */
    uint32_t err_rtn_rows;   /* rows err_rtn was measured on: all of them
                                except as a named method's baseline
                                (cmp_calib_opts.baseline_rows) */
    double err_local;        /* own error: tr(D Hq D^T) / tr(W Hq W^T) on
                                this linear's actual inputs (no upstream
                                error): the sensitivity auto precision uses;
                                measured where the statistics are lean
                                (err_own_inputs 1, as auto's runs force),
                                -1 elsewhere */
    double err_local_rtn;    /* the same for plain RTN */
    double alpha;            /* AWQ alpha (0 when not scaled) */
    int err_own_inputs;      /* 1: lean statistics (no Hf, C): err and
                                err_rtn are measured on the linear's own
                                inputs, like err_local */
} cmp_calib_tensor;

/* What calibration holds in memory, in bytes (cmp_calib_memory).  Each
 * field is its part at the phase of the peak; peak is the largest sum
 * over the phases (a block's statistics, quantization of one input group,
 * the rotated ends, the held-out evaluation), an upper bound on what
 * cmp_calib_run allocates through mc_alloc (up to allocator rounding). */
typedef struct cmp_calib_mem {
    uint64_t states;   /* both sets of hidden states, per-sequence copies;
                          both held-out sets (kept to the summary) */
    uint64_t forward;  /* the forward contexts (cmp_fwd_bytes: the
                          calibration's, the held-out sequences') */
    uint64_t result;   /* result tables, folded vectors, and the quantized
                          layers held: all finished ones without a spill
                          file, the current block's with one */
    uint64_t block;    /* one block's float32 copies */
    uint64_t stats;    /* statistics (Hq, Hf, C, x_f, |x|) */
    uint64_t work;     /* quantization work space (candidates, GPTQ, AWQ) */
    uint64_t ends;     /* rotated ends / output layer / held-out summary
                          (logits, KLD list) */
    uint64_t peak;     /* the largest phase total */
    uint64_t ends_peak; /* the largest total of the phases after the layers
                           ("ends", "held-out"): what mc_alloc holds while
                           the spill file is mapped (<= peak) */
    const char *phase; /* where the peak is: "statistics", "qkv", "o",
                          "gate/up", "down", "ends", "held-out" */
    unsigned lean;     /* tap points (bit KN_TAP_*) with lean statistics,
                          CMP_CALIB_LEAN_DOWN_STORE when down's inputs
                          are not stored, CMP_CALIB_LEAN_REFIT_HW when
                          the refits keep no H w */
    uint64_t spill;    /* bytes the spill file will hold (0 without one) */
    uint64_t device;   /* with stats_on_gpu: the most device memory the
                          statistics hold at once (kn_stats_bytes.h; the
                          CUDA context and cuBLAS's workspace not
                          included); 0 otherwise.  Not part of peak. */
    const char *device_phase; /* where that is (as phase) */
} cmp_calib_mem;

/* The memory cmp_calib_run will use for model config cfg, sequences off
 * (nseq of them, as cmp_calib_run takes them), options o (o->spill_dir,
 * o->heldout, o->pool's threads and formats count) and the lean points in
 * `lean`.  Fills *out; MC_ERR_INVALID_ARG as cmp_calib_run for bad
 * sequences. */
mc_status cmp_calib_memory(const fmt_model_config *cfg, const size_t *off,
                           size_t nseq, const cmp_calib_opts *o,
                           unsigned lean, cmp_calib_mem *out, mc_error *err);

/* The plan cmp_calib_run follows: lean = o->force_lean (every point too
 * for a method that is not cmp_calib_method_asymmetric) when o->mem_budget
 * is 0 or the estimate fits; else the refits' H w goes
 * (CMP_CALIB_LEAN_REFIT_HW; kept after all when what went after it made
 * room), then the store of down's inputs
 * (CMP_CALIB_LEAN_DOWN_STORE), then more tap points go lean, widest input
 * first (down, then o, qkv, gate/up), until it fits.  MC_ERR_NOMEM with the breakdown when
 * nothing fits the budget. */
mc_status cmp_calib_plan_memory(const fmt_model_config *cfg, const size_t *off,
                                size_t nseq, const cmp_calib_opts *o,
                                cmp_calib_mem *out, mc_error *err);

/* Phases of the time estimate (cmp_calib_plan), those of cmp_calib_times
 * (the ends: the held-out evaluation). */
enum { CMP_PH_FORWARD, CMP_PH_STATS, CMP_PH_FACTOR, CMP_PH_SEARCH,
       CMP_PH_ENDS, CMP_PH_COUNT };

/* The plan printed before calibration starts (cmp_calib_plan_make): the
 * whole process's peak resident memory by part and a time estimate.
 * rss = mem.peak (what mc_alloc holds: states, block, statistics, work,
 * results) + the source model's weight bytes resident (rt_model maps
 * them; each finished block's pages are dropped, fmt_mapguard_drop) +
 * the spill file's mapping (read back by the writer) + program (code,
 * libraries, thread stacks, the token file: a fixed allowance), the
 * larger of two phases: the layers (source: the embeddings, one block,
 * and any source that is not a file mapping, e.g. merged tensors) and the
 * ends (source: embeddings and output layer, plus the spill mapping; the
 * held-out sequences cross each block while it is resident, so the
 * source is never read again).  An upper
 * bound: the parts do not all peak at once.
 * The estimate: multiply-adds per phase, counted pass by pass and
 * candidate by candidate as the calibration runs them (partial block
 * passes as far as they go; GPTQ, the retarget, the descent, the AWQ
 * grid and the error measures), each over the phase's share of a float
 * GEMM rate measured at start in the forward's shape (warm-up, best of
 * five short reps).  The shares are fitted on finished runs; per phase
 * the estimate was within ~1.5x of the measured CPU time divided by the
 * threads on them (docs/quantization.md, docs/benchmarks.md).  The
 * search counts awq+gptaq where the method may try it (the cheap proxy's
 * pick is not known before), so it leans high. */
typedef struct cmp_calib_plan {
    cmp_calib_mem mem;
    uint64_t source;         /* the source's weight bytes, all of them */
    uint64_t source_layers;  /* of them resident during the layers */
    uint64_t source_ends;    /* of them resident at the ends */
    uint64_t spill, program, rss;
    size_t heldout_tokens;         /* tokens of the held-out sequences */
    double madds[CMP_PH_COUNT];    /* multiply-adds per phase (CMP_PH_*) */
    double rate;                   /* float GEMM multiply-adds per second
                                      measured at start */
    double seconds[CMP_PH_COUNT];  /* per phase */
    double total_s;                /* their sum */
    double forward_once_s;         /* one plain forward pass of the model
                                      over the ntok calibration tokens
                                      (blocks and output layer, float, at
                                      the forward phase's efficiency): the
                                      unit total_s is stated in, and
                                      --calib-passes' */
} cmp_calib_plan;

/* The plan for model m (its config and weight formats), the ntok
 * calibration tokens in sequences of at most maxT, the nheld held-out
 * sequences (held_off [nheld + 1]: their offsets; NULL when nheld is 0),
 * options o (method, stages, format, AWQ grid, rotation) and the
 * memory plan mem (cmp_calib_plan_memory).  rate > 0: use it; 0: measure
 * it (~0.2 s through o->pool); < 0: no estimate (the seconds stay 0;
 * cmp_calib_run passes -1 when no one is told: no o->progress). */
void cmp_calib_plan_make(const rt_model *m, size_t ntok, size_t maxT,
                         const size_t *held_off, size_t nheld,
                         const cmp_calib_opts *o,
                         const cmp_calib_mem *mem, double rate,
                         cmp_calib_plan *out);

/* The forward's multiply-adds per calibration token for one block, pass
 * by pass as cmp_calib_layer runs them: stages (0: default), lean tap
 * points, pre (the method pre-scales down and o, awq or best: the share
 * of the sequences whose stage-0 pass collects for it, 1 /
 * cmp_calib_prescale_stride; 0: no pre-scaling), rot (the
 * model is rotated), store_down (down's inputs are stored).  Exposed for
 * the tests. */
double cmp_calib_plan_block_madds(const fmt_model_config *c, size_t maxT,
                                  uint32_t stages, unsigned lean, double pre,
                                  int rot, int store_down);
/* Of those, the linears' that the quantized passes run on quantized
 * weights (the groups of the stages before, every group in the final
 * move): what cmp_calib_opts.fwd_f32 = 0 multiplies with bfloat16
 * products.  Exposed for the tests. */
double cmp_calib_plan_qlin_madds(const fmt_model_config *c, uint32_t stages,
                                 unsigned lean, double pre, int rot,
                                 int store_down);

/* Where the calibration's time went, in wall and CPU seconds (cmp_clock,
 * cmp_par.h; the phases do not overlap; their sum is the run's time up to
 * bookkeeping). */
typedef struct cmp_calib_times {
    cmp_clock forward; /* block forward passes: collecting each group's
                          inputs, moving both state sets on */
    cmp_clock stats;   /* the statistics sums inside those passes (Hq, Hf,
                          C, sum |x|) */
    cmp_clock factor;  /* factorizations: GPTQ's inverse factor, the
                          retarget's solve (Cholesky and substitutions) */
    cmp_clock search;  /* the rest of quantizing: candidates, AWQ search,
                          refits, descent, error measures */
    cmp_clock ends;    /* embeddings, output layer, held-out evaluation
                          (its block passes, run with the layers, too) */
} cmp_calib_times;

typedef struct cmp_calib_result {
    uint32_t layers;
    cmp_calib_tensor *t;     /* [layers][CMP_LIN_COUNT] */
    float *vecs;             /* folded norms and biases, one block (owned) */
    float **attn_norm;       /* [layers] -> [hidden] into vecs */
    float **mlp_norm;        /* [layers] -> [hidden] */
    float **bias;            /* [layers][CMP_LIN_COUNT] -> bias or NULL */
    cmp_qbuf lm_head;        /* lm_head_fmt quantized: owned buffers;
                                else data NULL */
    int full_bf16;           /* 1: the full-precision weights multiplied
                                in bfloat16 (cmp_calib_opts.full_bf16) */
    int rotated;             /* 1: the model below is the rotated one: its
                                norm weights are 1 and embed, final_norm
                                and lm_head come from here (untied) */
    uint32_t rot_block;      /* residual Hadamard block (when rotated) */
    uint32_t rot_head_block; /* value-head Hadamard block, 0 = none */
    uint64_t rot_seed;       /* sign seed used */
    float *embed;            /* [vocab][hidden] rotated embeddings (owned) */
    float *final_norm;       /* [hidden] ones (owned) */
    float *lm_head_f32;      /* [vocab][hidden] rotated output layer with the
                                final norm folded in (owned) */
    double *layer_seconds;   /* [layers] calibration time per layer */
    cmp_calib_times times;   /* the run's time by phase */
    size_t calib_tokens;     /* tokens calibrated on */
    size_t prescale_tokens;  /* tokens AWQ's pre-scaling of down (and o)
                                was searched on: a sample of every
                                cmp_calib_prescale_stride-th sequence; 0:
                                the method does not pre-scale */
    cmp_calib_mem mem;       /* the memory plan followed */
    cmp_calib_plan plan;     /* the plan given to progress at the start */
    struct cmp_spill *spill; /* the spill file holding the buffers, or NULL */
    uint64_t source_dropped; /* bytes of finished blocks' source pages
                                dropped from the resident set
                                (fmt_mapguard_drop) */
    int has_heldout;         /* 1: heldout holds the summary */
    cmp_eval_report heldout; /* quantized vs reference on held-out seqs */
} cmp_calib_result;

/* Calibrate and quantize model m (borrowed; float weights) on nseq token
 * sequences (seq i = tok[off[i] .. off[i+1])).  *out is owned by the caller
 * (cmp_calib_result_free).  Returns MC_ERR_INVALID_ARG for bad options or
 * too few sequences, MC_ERR_NOMEM, or what the parts return. */
mc_status cmp_calib_run(const rt_model *m, const int32_t *tok,
                        const size_t *off, size_t nseq,
                        const cmp_calib_opts *o, cmp_calib_result **out,
                        mc_error *err);
void cmp_calib_result_free(cmp_calib_result *r); /* NULL is a no-op */

/* One line of the per-layer error table into buf (always NUL-terminated):
 *   "  3  down_proj  q4g32  gptaq      0.01234   0.02345  a=0.25"
 * (layer, linear, format, method, error vs full precision, RTN's error,
 * preceded by ~ where estimated on a sample of rows, AWQ alpha).  cmp_calib_table_header gives the matching header.  The CLI
 * prints them; the library does not. */
const char *cmp_calib_table_header(void);
const char *cmp_calib_table_row(const cmp_calib_tensor *t, uint32_t group,
                                char *buf, size_t n);

/* Fill *view with a copy of base whose layers (and lm_head when quantized)
 * point into r.  view->layers is mc_malloc'ed: release it with
 * cmp_calib_view_free (never rt_model_free: the view owns nothing else). */
mc_status cmp_calib_view(const rt_model *base, const cmp_calib_result *r,
                         rt_model *view, mc_error *err);
void cmp_calib_view_free(rt_model *view);

#endif /* CMP_CALIB_H */

/*
 * cmp_calib_internal.h - pieces shared by the calibration's files:
 * cmp_calib.c (the result and its views), cmp_calib_layer.c (one block),
 * cmp_calib_run.c (the driver), cmp_calib_group.c (quantizing one group
 * of linears with the chosen method) and cmp_calib_mem.c (the memory
 * plan).  Not a public API.
 */
#ifndef CMP_CALIB_INTERNAL_H
#define CMP_CALIB_INTERNAL_H

#include "cmp_calib.h"
#include "cmp_gpu_stats.h"
#include "cmp_gptq.h"
#include "cmp_rotate.h"

/* The proxies of method best (cmp_calib.h): the AWQ-scaled candidate is
 * tried where the AWQ search's error is below (1 - CMP_BEST_AWQ_GAIN) x
 * RTN's on the same Hessian, the act-order one where max diag(H) >
 * CMP_BEST_ACT_ORDER_SPREAD x its mean. */
#define CMP_BEST_AWQ_GAIN 0.10
#define CMP_BEST_ACT_ORDER_SPREAD 20.0

/* 1 when a GPTQ candidate of format fmt under method m runs the second
 * pass (cmp_calib_group.c regptq: GPTQ again on the refit grid, kept when
 * its error is lower): int4 under every method but best, the default.
 * Measured (session 20, docs/benchmarks.md): at SmolLM2-135M's shape the
 * pass is a quarter of best's int4 search (~14 s of a 32K-token compile)
 * for -1.8 % KLD there, and on stories260k leaving it out moves best's
 * KLD by -0.8 % to +1.2 %, inside that model's spread between calibration
 * subsets; so the default, which runs under a time goal, leaves it out.
 * A method asked by name (and best-all, which spends anything) keeps it
 * and its bytes: leaving it out there measured -0.5 % to +2.9 %. */
static inline int cmp_calib_second_pass(kn_wformat fmt, cmp_qmethod m)
{
    return fmt != KN_W_Q8 && m != CMP_QM_BEST;
}

/* Tap point (input group) of each linear slot. */
static const int LIN_TAP[CMP_LIN_COUNT] = {0, 0, 0, 1, 2, 2, 3};

/* Statistics of one block's four linear inputs. */
typedef struct tap_acc {
    int pass;               /* 0: full-precision states, 1: quantized */
    unsigned mask;          /* 1 << tap point: the points collected */
    unsigned full;          /* the points that also collect Hf, C, x_f */
    cmp_hessian h[4];       /* Hq: inputs in the partly quantized model */
    cmp_hessian hf[4];      /* Hf: inputs in the full-precision model
                               (full points only; else h == NULL) */
    double *c[4];           /* [width][width] sum x_f x_q^T, or NULL */
    double *abs_sum[4];     /* [width] sum |x_q,j| */
    float *xf[4];           /* [maxT][width] this sequence's x_f (CPU) */
    cmp_gpu_stats *gpu[4];  /* with stats_on_gpu: the sums on the device
                               (xf stays NULL; x_f is kept there) */
    mc_status gpu_st;       /* the first failure of a device add */
    kn_pool *pool;          /* threads for the sums (the taps run between
                               the forward's kernels, outside pool jobs) */
    cmp_clock *stats;       /* time spent in the taps (the sums) is
                               added here */
    float *down_dst;        /* pass 1: where down's input goes, or NULL */
    /* down's point from its outputs (cmp_calib_down_from_outputs): no Hf,
     * C or x_f there; instead */
    int down_out;           /* 1: this mode */
    uint32_t down_rows;     /* rows of down (the hidden width) */
    float *yf;              /* [maxT][down_rows] this sequence's y_f =
                               W x_f, down's output in the full-precision
                               pass */
    double *wc;             /* [down_rows][width] sum y_f x_q^T = W C */
    double y_energy;        /* sum ||y_f||^2 = tr(W Hf W^T) */
    double *y_energy_row;   /* [down_rows] sum_t y_f,t[r]^2: row r's share
                               of y_energy (a sampled baseline's energy,
                               cmp_calib_baseline_stride) */
} tap_acc;

/* One layer being calibrated. */
typedef struct layer_ctx {
    const cmp_calib_opts *o;
    const cmp_rotation *rot;     /* NULL: the model is not rotated */
    cmp_calib_result *r;
    uint32_t l;
    uint32_t rows[CMP_LIN_COUNT], cols[CMP_LIN_COUNT];
    uint32_t width[4];           /* input width of each tap point */
    unsigned lean;               /* tap points collected without Hf and C
                                    (cmp_calib_memory): no GPTAQ there,
                                    errors measured on own inputs */
    float *w[CMP_LIN_COUNT];     /* float32 working copies (folds applied) */
    kn_wformat fmt[CMP_LIN_COUNT];
    tap_acc acc;
    float *xabs[4];              /* mean |x_j| per tap point */
    cmp_calib_times *times;      /* the run's phase times (added to) */
} layer_ctx;

/* Allocate / release owned quantized buffers (kn_quant.h sizes). */
mc_status cmp_calib_qbuf_alloc(cmp_qbuf *b, kn_wformat f, uint32_t rows,
                               uint32_t cols, uint32_t group);
void cmp_calib_qbuf_release(cmp_qbuf *b);

/* 1 for the AWQ-scaled methods. */
int cmp_calib_is_awq(cmp_qmethod m);

/* Quantize the n linears in slots (one input group) with c's method: try
 * the candidates, keep the best, record it in c->r, and apply the chosen
 * AWQ scales to the float copies and to the producer of the input
 * (fold_vec: a norm weight; fold_rows_slot: a linear whose rows divide;
 * fold_bias: its bias) when allow_scale. */
mc_status cmp_calib_quant_group(layer_ctx *c, const int *slots, int n,
                                int allow_scale, float *fold_vec,
                                int fold_rows_slot, float *fold_bias,
                                mc_error *err);

/* The calibration sequences' states, both models. */
typedef struct seqs {
    float *states, *states_f;   /* [tokens][hidden] quantized / f.p. model */
    const size_t *len;          /* [n] tokens of each sequence */
    size_t n, maxT;             /* sequences; the longest */
    float *xtmp, *xtmp_f;       /* [maxT][hidden] scratch */
    float *down_in;             /* [tokens][ffn]: down's inputs in the
                                   partly quantized model, or NULL (no
                                   store: cmp_calib_stores_down) */
} seqs;

/* 1 when down's statistics take W C = sum y_f x_q^T and sum ||y_f||^2
 * from its outputs y_f = W x_f instead of C and Hf (cmp_calib.h,
 * cmp_calib_opts.down_full_c): down full (not lean), the sums on the CPU,
 * no wider than its input (rows <= ffn: the scratch), and its stage's
 * full-precision pass running through down (it moves the states: fewer
 * than 4 stages, or rotated). */
int cmp_calib_down_from_outputs(const cmp_calib_opts *o, unsigned lean, int rot,
                                uint32_t hidden, uint32_t ffn);

/* 1 when the run stores down's inputs (CMP_CALIB_LEAN_DOWN_STORE): 4
 * stages and the bit not in lean. */
int cmp_calib_stores_down(const cmp_calib_opts *o, unsigned lean);

/* Linear slot s of block weights w (the model's, borrowed). */
const kn_matrix *cmp_calib_src_matrix(const kn_block_weights *w, int slot);
/* The block weights of layer l of the result (views into r). */
void cmp_calib_result_block(const cmp_calib_result *r, uint32_t l,
                            kn_block_weights *w);
/* A new result for model m: the tables, names and the model's norms and
 * biases copied (the folds change them).  *out is set even on failure
 * (free it with cmp_calib_result_free). */
mc_status cmp_calib_result_create(const rt_model *m, cmp_calib_result **out,
                                  mc_error *err);
/* Move a finished quantized buffer set / layer l's buffers into the
 * spill file (no-ops without one). */
mc_status cmp_calib_spill_qbuf(cmp_calib_result *r, cmp_qbuf *b,
                               const char *what, mc_error *err);
mc_status cmp_calib_spill_layer(cmp_calib_result *r, uint32_t l, mc_error *err);

/* Calibrate block c->l (c set up by the driver: o, rot, r, l, lean, pool,
 * times): copy its weights to float32, collect the statistics, quantize
 * its groups into c->r and move both state sets of S on to the next block
 * boundary.  The float copies and statistics stay in c until
 * cmp_calib_layer_free (also on failure). */
mc_status cmp_calib_layer(layer_ctx *c, const rt_model *m, cmp_fwd *f,
                          const seqs *S, mc_error *err);
void cmp_calib_layer_free(layer_ctx *c);
/* The tap points (bit KN_TAP_*) collected in stage k of `stages` (1, 2 or
 * 4; cmp_calib_opts.stages), 0 past the last. */
unsigned cmp_calib_stage_points(uint32_t stages, unsigned k);

/* Where stage k's two passes begin, and where they run.  With 4 stages
 * the later passes repeat work that has not changed since an earlier
 * one: stage 2's passes would recompute the attention of stage 1's
 * (q/k/v are quantized and folded by then, o is the only group between),
 * and stage 3's the attention and o of stage 2's (only gate/up changed).
 * So when reuse is set (down's inputs are stored, whose buffer
 * [tokens][ffn] holds both models' attention outputs, 2 * q_dim <= ffn,
 * from stage 1 until stage 3 writes it), stage 1's passes write their
 * attention outputs there, stage 2's begin at o from them and run on the
 * states themselves, leaving the residual after the attention in them,
 * and stage 3's begin at the MLP from that residual.  The full-precision
 * side runs in place only when stage 3's pass moves its states on
 * (rotated); it begins at o only when stage 1 ran it (o's point not
 * lean).  Same bits as the passes from the block's input. */
typedef struct cmp_stage_span {
    int start_f, start_q;     /* 1 + kn_tap_point the full-precision /
                                 quantized pass begins at; 0: the input */
    int keep_att;             /* stage 1: the passes write their attention
                                 outputs to the reuse buffer */
    int inplace_f, inplace_q; /* the pass runs on the states themselves */
} cmp_stage_span;
void cmp_calib_stage_span(uint32_t stages, unsigned k, unsigned lean, int rot,
                          int reuse, cmp_stage_span *sp);
/* 1 when stage spans reuse passes for a block of q_dim and ffn whose
 * run stores down's inputs (store_down) in `stages` stages. */
int cmp_calib_reuses(uint32_t stages, int store_down, uint64_t q_dim,
                     uint64_t ffn);

/* The held-out evaluation streamed with the layers (cmp_calib_heldout.c):
 * both models' states of the held-out sequences, moved through each block
 * while the calibration has it (the source block resident, the quantized
 * one made), then the heads and the summary at the ends.  Every figure has
 * the bits cmp_eval_models gives on the same sequences and models; the
 * source is not read again.  Sequences shorter than 2 tokens are skipped
 * (nothing to score). */
typedef struct cmp_heldout cmp_heldout;

/* States for the n sequences seq i = tok[off[i] .. off[i+1]) of source
 * model m (borrowed, as tok and off: they must outlive it): the
 * reference's embeddings, and the quantized model's as its view will look
 * them up: rotated by rot (NULL: not rotated), then in embed_fmt, the
 * artifact's: F16 / BF16 rounded, or through Q8 / Q4 / Q4S (at group) for
 * an unrotated tied model whose output layer, its embedding, is quantized
 * (F32: as they are).  *out is set even on failure (free it with
 * cmp_heldout_free).  MC_ERR_INVALID_ARG for a sequence past the context or a token outside
 * the vocabulary, MC_ERR_NOMEM. */
mc_status cmp_heldout_create(const rt_model *m, const int32_t *tok,
                             const size_t *off, size_t n,
                             const cmp_rotation *rot, kn_wformat embed_fmt,
                             uint32_t group, kn_pool *pool, cmp_heldout **out,
                             mc_error *err);
/* Move both state sets through one block: ref (the source's) and quant
 * (the calibrated one), of dims d.  A no-op after cmp_heldout_blocks_done. */
void cmp_heldout_block(cmp_heldout *h, const kn_block_weights *ref,
                       const kn_block_weights *quant, const kn_block_dims *d);
/* The last block is done: the forward context is freed. */
void cmp_heldout_blocks_done(cmp_heldout *h);
/* The heads of ref and quant (cmp_model_head: their final norms and output
 * layers) over the states, scored as cmp_eval_models scores; the states
 * are used up. */
mc_status cmp_heldout_report(cmp_heldout *h, const rt_model *ref,
                             const rt_model *quant, kn_pool *pool,
                             cmp_eval_report *out, mc_error *err);
void cmp_heldout_free(cmp_heldout *h); /* NULL is a no-op */
/* Bytes of both state sets for sequences off[0..n] (the plan's term; the
 * forward context is cmp_fwd_bytes of the longest, the report's
 * cmp_eval_scores_bytes). */
uint64_t cmp_heldout_state_bytes(const fmt_model_config *c, const size_t *off,
                                 size_t n);

#endif /* CMP_CALIB_INTERNAL_H */

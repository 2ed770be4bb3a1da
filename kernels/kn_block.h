/*
 * kn_block.h - one transformer block (Llama / Mistral / Qwen2) for one step
 * of T token rows that may belong to several sequences.
 *
 *   x  (residual, [T][hidden], updated in place)
 *   xb = rmsnorm(x) * attn_norm                    -> tap QKV_IN
 *   q, k, v = xb Wq^T + bq, xb Wk^T + bk, xb Wv^T + bv
 *   rope(q), rope(k) at pos[t]
 *   per segment (one sequence's consecutive rows): store k, v of its rows
 *   into its KV cache at pos0 .. pos0+count-1, then causal (windowed)
 *   attention of its queries over the cache          -> att
 *   x += att Wo^T + bo                              (att: tap O_IN)
 *   xb = rmsnorm(x) * mlp_norm                      -> tap GATE_UP_IN
 *   hb = silu(xb Wg^T + bg) * (xb Wu^T + bu)        -> tap DOWN_IN
 *   x += hb Wd^T + bd
 *
 * Every row is computed independently of the other rows of the step except
 * through the KV cache of its own sequence, so a sequence gives the same
 * result alone or in a batch provided the kernels (kn_ops.h) compute each
 * output row independently of T and of the thread split.
 *
 * With int_dot, the input of each group of linears is quantized once into
 * a scratch buffer that is idle at that point (q/k/v in: hb; o in: hb;
 * gate/up in: q; down in: hb2), so the arena needs nothing more; a model
 * whose idle buffer is too narrow for that (never a Llama shape) keeps the
 * float path.
 *
 * No allocation: all buffers come in kn_block_scratch (the runtime's arena,
 * or the compiler's calibration buffers); sizes from kn_block_scratch_floats.
 * Used by the runtime (runtime/rt_cpu.c) and by the compiler's
 * calibration forward pass (through the tap).
 */
#ifndef KN_BLOCK_H
#define KN_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"

/* Weights of one block: read-only views.  Norm vectors and biases are
 * float32 (the loaders convert them once at load); any bias may be NULL. */
typedef struct kn_block_weights {
    const float *attn_norm;     /* [hidden] input_layernorm */
    kn_matrix wq;               /* [heads*head_dim][hidden] */
    kn_matrix wk;               /* [kv_heads*head_dim][hidden] */
    kn_matrix wv;               /* [kv_heads*head_dim][hidden] */
    kn_matrix wo;               /* [hidden][heads*head_dim] */
    const float *bq;            /* [heads*head_dim] or NULL */
    const float *bk;            /* [kv_heads*head_dim] or NULL */
    const float *bv;            /* [kv_heads*head_dim] or NULL */
    const float *bo;            /* [hidden] or NULL */
    const float *mlp_norm;      /* [hidden] post_attention_layernorm */
    kn_matrix w_gate;           /* [ffn][hidden] */
    kn_matrix w_up;             /* [ffn][hidden] */
    kn_matrix w_down;           /* [hidden][ffn] */
    const float *b_gate;        /* [ffn] or NULL */
    const float *b_up;          /* [ffn] or NULL */
    const float *b_down;        /* [hidden] or NULL */
} kn_block_weights;

/* Shape of one block. */
typedef struct kn_block_dims {
    uint32_t hidden;            /* d_model */
    uint32_t heads;             /* query heads */
    uint32_t kv_heads;          /* key/value heads (divides heads) */
    uint32_t head_dim;          /* per-head width (even) */
    uint32_t ffn;               /* intermediate size */
    float eps;                  /* rms_norm_eps */
    uint64_t window;            /* sliding window of this layer, 0 = none */
} kn_block_dims;

/* Consecutive rows of the step that belong to one sequence.  The segments
 * of a step cover rows 0..T-1 in order (sum of count == T).  Row r of the
 * segment is at position pos0 + r; kv must hold positions
 * max(0, pos0 - window + 1) .. pos0 - 1 already and have room for the
 * count new ones without overwriting any position a row still attends
 * (ring capacity >= window + count - 1 for windowed layers). */
typedef struct kn_block_segment {
    kn_kv *kv;                  /* this layer's cache of the sequence */
    int64_t pos0;               /* position of the segment's first row */
    size_t count;               /* rows */
    const kn_rope *rope;        /* RoPE for this sequence, NULL = the
                                   block's (differs only for dynamic NTK
                                   scaling, which depends on length) */
} kn_block_segment;

/* Caller-provided buffers for a step of up to T rows (floats). */
typedef struct kn_block_scratch {
    float *xb;                  /* [T][hidden] normed x, then o/down output */
    float *q;                   /* [T][heads*head_dim] */
    float *k;                   /* [T][kv_heads*head_dim] */
    float *v;                   /* [T][kv_heads*head_dim] */
    float *att;                 /* [T][heads*head_dim] attention output */
    float *hb;                  /* [T][ffn] gate, then silu(gate)*up */
    float *hb2;                 /* [T][ffn] up */
    float *attn;                /* kn_attention_scratch_floats(threads, max_ctx, head_dim) */
    int int_dot;                /* 1: Q8/Q4 matrices multiply int8-quantized
                                   activations (kn_qdot.h), the runtime's
                                   choice; 0: float activations (exact
                                   work: calibration, eval) */
    int bf16_dot;               /* 1 (int_dot 0): Q8/Q4/Q4S matrices
                                   multiply bfloat16-rounded activations
                                   (kn_gemm_bf16.h), quantized once per
                                   group into the idle buffer int_dot
                                   uses: the calibration's quantized
                                   pass; float matrices keep float.
                                   2: f32 matrices too, their weights
                                   rounded to bfloat16 (the calibration's
                                   full-precision pass, --calib-full-pass
                                   bf16) */
    int tap_stop;               /* 1 + a kn_tap_point: with a tap, return
                                   right after calling it there (x is then
                                   partly updated: a calibration pass that
                                   needs no later input); 0: the whole
                                   block */
    int tap_down_out;           /* 1: with a tap, also call it with
                                   down's output (KN_TAP_DOWN_OUT) */
    int tap_start;              /* where the block begins: 0 (or 1 +
                                   KN_TAP_QKV_IN): at its input;
                                   1 + KN_TAP_O_IN: att already holds the
                                   attention output of these rows (an
                                   earlier pass of the same q/k/v weights
                                   over the same x; the KV cache is not
                                   touched) and x is still the block's
                                   input; 1 + KN_TAP_GATE_UP_IN: x is the
                                   residual after the attention (x + o's
                                   output, as a pass stopped at that tap
                                   leaves it).  Taps before the start are
                                   not called.  The calibration resumes its
                                   later passes there instead of
                                   recomputing what did not change. */
} kn_block_scratch;

/* Where the tap is called: the input of each group of linears that share
 * it.  width is the row width in floats. */
typedef enum kn_tap_point {
    KN_TAP_QKV_IN = 0,          /* normed x, input of q/k/v, [T][hidden] */
    KN_TAP_O_IN = 1,            /* attention output, input of o, [T][q_dim] */
    KN_TAP_GATE_UP_IN = 2,      /* normed x, input of gate/up, [T][hidden] */
    KN_TAP_DOWN_IN = 3,         /* silu(gate)*up, input of down, [T][ffn] */
    KN_TAP_COUNT_,              /* the input points above */
    /* down's output before the residual add, [T][hidden]: called only
     * when the scratch's tap_down_out is set (the calibration's cross
     * term of down from its outputs) */
    KN_TAP_DOWN_OUT = KN_TAP_COUNT_
} kn_tap_point;

typedef void (*kn_tap_fn)(void *ctx, kn_tap_point where, const float *x,
                          size_t T, size_t width);

/* Y [T][W->rows] = X W^T + bias for T rows of X [T][W->cols], as
 * kn_block_forward runs a linear under s's int_dot / bf16_dot: with
 * qbuf, an idle buffer of qwidth floats per row, for the quantized input
 * (the calibration's moves that run a block's last linear on their own
 * give the block's bits). */
void kn_block_linear(kn_pool *pool, const kn_block_scratch *s,
                     const kn_matrix *W, const float *X, size_t T, float *Y,
                     const float *bias, void *qbuf, size_t qwidth);

/* Floats of each scratch buffer for T rows (the runtime's layout uses the
 * same numbers).  attn_floats is for nthreads and contexts up to max_ctx. */
uint64_t kn_block_xb_floats(const kn_block_dims *d, uint64_t T);
uint64_t kn_block_q_floats(const kn_block_dims *d, uint64_t T);
uint64_t kn_block_kv_floats(const kn_block_dims *d, uint64_t T);
uint64_t kn_block_ffn_floats(const kn_block_dims *d, uint64_t T);
uint64_t kn_block_attn_floats(const kn_block_dims *d, int nthreads,
                              uint64_t max_ctx);

/* Run the block on x [T][hidden] in place.  pos[t] is the position of row
 * t (consistent with the segments).  rope is the default RoPE.  tap may be
 * NULL; it is called synchronously and must not modify x.  Preconditions
 * (checked by the callers, not here): shapes of w agree with d; segments
 * cover T rows; the scratch is large enough for T. */
void kn_block_forward(kn_pool *pool, const kn_block_weights *w,
                      const kn_block_dims *d, const kn_rope *rope, float *x,
                      size_t T, const int64_t *pos,
                      const kn_block_segment *seg, size_t nseg,
                      const kn_block_scratch *s, kn_tap_fn tap,
                      void *tap_ctx);

#endif /* KN_BLOCK_H */

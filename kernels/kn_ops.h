/*
 * kn_ops.h - CPU kernels of the transformer forward pass.
 *
 * Each op has a plain scalar reference (kn_ref_*, in kn_ref.c: obvious
 * loops, double accumulation where it matters) and the optimized entry
 * point (kn_*), which uses AVX2/FMA/F16C when the CPU has them (detected at
 * run time, files *_avx2.c) and splits work over a thread pool.  Tests
 * compare the two by normalized error.  kn_set_force_scalar(1) makes every
 * entry point use its scalar path (for tests and for machines without AVX2).
 *
 * Conventions: activations are float32, row-major, one row per token;
 * weight matrices are [rows = out_features][cols = in_features] as in
 * nn.Linear.  No function allocates: callers pass all buffers (the runtime's
 * arena).  Pointers may not alias unless stated.
 */
#ifndef KN_OPS_H
#define KN_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kn_quant.h"

/* ---- CPU features and threads ------------------------------------------ */

int kn_cpu_has_avx2(void);           /* AVX2 + FMA + F16C all present */
/* kn_cpu_has_avx2() and AVX-512 F, BW, DQ, VL and VNNI, with the OS saving
 * the ZMM state (Ice Lake, Sapphire Rapids, Zen 4 and later).  The
 * *_avx512.c kernels give the same bits as the AVX2 ones (each says how),
 * so this changes speed only.  MC_NO_AVX512=1 in the environment, or
 * kn_set_no_avx512(1), makes it 0 (to compare the two paths). */
int kn_cpu_has_avx512(void);
void kn_set_no_avx512(int on);
/* kn_cpu_has_avx512() and AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4
 * and later): kn_gram's bfloat16 tile.  Its emulation gives the same bits,
 * so this too changes speed only.  MC_NO_BF16=1 or kn_set_no_bf16(1) makes
 * it 0. */
int kn_cpu_has_avx512bf16(void);
void kn_set_no_bf16(int on);
void kn_set_force_scalar(int on);    /* 1: optimized entry points use scalar */
int kn_force_scalar(void);

typedef struct kn_pool kn_pool;
/* A pool of nthreads workers (the calling thread is one of them; 0 =
 * kn_cpu_count(), the CPUs this process may use: kn_cpus.h says why not
 * the CPUs online).  Returns NULL on failure. */
kn_pool *kn_pool_create(int nthreads);
void kn_pool_free(kn_pool *p);       /* NULL is a no-op */
int kn_pool_threads(const kn_pool *p);
/* Run fn(ctx, tid, nthreads) on every thread and wait; p NULL = inline on
 * one thread.  Not reentrant. */
void kn_pool_run(kn_pool *p, void (*fn)(void *ctx, int tid, int nth),
                 void *ctx);
/* The same for a job whose threads claim its work as they go (kn_steal.h):
 * fn must leave nothing undone when only some threads, or only the caller
 * (tid 0), run it.  Returns when the caller's call has returned and every
 * worker that started the job has; a worker the scheduler parked until
 * then skips it, so a busy machine does not hold the job for a time
 * slice. */
void kn_pool_run_shared(kn_pool *p, void (*fn)(void *ctx, int tid, int nth),
                        void *ctx);
/* fn(ctx, u0, u1) over disjoint ranges covering units [0, n) (rows of an
 * elementwise step), claimed by p's threads as they go (a shared job);
 * inline as fn(ctx, 0, n) when p is NULL or has one thread, or when n <
 * min_units (too little work for a wake-up).  fn must give each unit
 * the same result whatever range it comes in. */
/* Values an elementwise step needs before kn_pool_rows splits it: below,
 * the wake-up (under a microsecond) and the shared cache lines cost more
 * than the second thread gains.  kn_set_pool_min_values(1) makes every
 * step split (tests: the split must not change a bit); 0 restores it. */
#define KN_POOL_MIN_VALUES 32768
size_t kn_pool_min_values(void);
void kn_set_pool_min_values(size_t v);
void kn_pool_rows(kn_pool *p, size_t n, size_t min_units,
                  void (*fn)(void *ctx, size_t u0, size_t u1), void *ctx);

/* ---- weights ------------------------------------------------------------- */

/* How a matrix's bytes are arranged (kn_quant.h).  Every file and every
 * API outside the CPU runtime sees KN_LAYOUT_ROWS; KN_LAYOUT_P16 is built
 * at load by the runtime (kn_pack16) for the AVX-512 kernels. */
typedef enum kn_layout {
    KN_LAYOUT_ROWS = 0,       /* row-major data, scales/zeros beside it */
    KN_LAYOUT_P16 = 1,        /* Q4S, Q8: 16-row panels, scales inside */
} kn_layout;

/* A read-only view of a weight matrix (layouts in kn_quant.h). */
typedef struct kn_matrix {
    kn_wformat fmt;
    uint32_t rows;            /* out_features */
    uint32_t cols;            /* in_features */
    const void *data;         /* see kn_quant.h for each format */
    const void *scales;       /* Q8: float[rows]; Q4/Q4S: u16 half [rows][ngroups];
                                 KN_LAYOUT_P16: NULL (inside data) */
    const uint8_t *zeros;     /* Q4: [rows][ngroups]; else NULL */
    uint32_t group;           /* Q4/Q4S group size; 0 otherwise */
    kn_layout layout;         /* KN_LAYOUT_ROWS but after kn_pack16 */
} kn_matrix;

/* Y[t][r] = sum_c W[r][c] * X[t][c] (+ bias[r] if bias) for t < T.
 * X: [T][cols], Y: [T][rows]; bias may be NULL. */
void kn_matmul(kn_pool *p, const kn_matrix *W, const float *X, size_t T,
               float *Y, const float *bias);
void kn_ref_matmul(const kn_matrix *W, const float *X, size_t T, float *Y,
                   const float *bias);

/* kn_matmul for n matrices sharing the input X (each W[i]->cols columns):
 * Y[i] = X W[i]^T + B[i] (B[i] may be NULL), KN_MATMUL_MULTI_MAX of them
 * per job over the pool, each thread computing its rows of every matrix
 * of the job.  The same bits as n kn_matmul calls (kn_matmul is the n = 1
 * case); what it saves is the wake-ups and waits between them, and small
 * matrices (a GQA model's k and v) no longer run on the calling thread
 * alone while the others wait. */
#define KN_MATMUL_MULTI_MAX 4
void kn_matmul_multi(kn_pool *p, int n, const kn_matrix *const W[],
                     const float *X, size_t T, float *const Y[],
                     const float *const B[]);

/* Row r of W as float32 (embedding lookup; any format). out: [cols]. */
void kn_matrix_row(const kn_matrix *W, uint32_t r, float *out);

/* ---- elementwise and norms ---------------------------------------------- */

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for T rows of n.  out may
 * equal x. */
void kn_rmsnorm(float *out, const float *x, const float *w, size_t T,
                size_t n, float eps);
void kn_ref_rmsnorm(float *out, const float *x, const float *w, size_t T,
                    size_t n, float eps);

/* gate[i] = silu(gate[i]) * up[i] for n elements (in place on gate). */
void kn_silu_mul(float *gate, const float *up, size_t n);
void kn_ref_silu_mul(float *gate, const float *up, size_t n);

/* y[i] += x[i] */
void kn_add(float *y, const float *x, size_t n);

/* In place softmax of n values; returns nothing. */
void kn_softmax(float *x, size_t n);
/* log(sum(exp(x))) computed stably. */
float kn_logsumexp(const float *x, size_t n);
/* Index of the largest value (first on ties). */
size_t kn_argmax(const float *x, size_t n);

/* ---- RoPE --------------------------------------------------------------- */

/* Precomputed rotary parameters for one model (see fmt_rope in
 * fmt_config.h; passed as plain numbers so kernels do not depend on the
 * formats layer).  inv_freq: [head_dim/2]. */
typedef struct kn_rope {
    uint32_t head_dim;
    float *inv_freq;          /* caller-owned [head_dim / 2] */
    float attn_scale;         /* multiplies cos and sin (yarn mscale), else 1 */
} kn_rope;

/* Fill inv_freq[head_dim/2] and *attn_scale for a rope type (values of
 * fmt_rope_type), for a sequence of length seq_len (used only by dynamic
 * scaling, which grows the base when seq_len > original_max_pos).
 * Follows transformers' _compute_*_parameters; values are computed in
 * double and rounded once.  The caller resolves original_max_pos (0 from the
 * config means max_position_embeddings): dynamic with 0 never grows the
 * base.  factor <= 0 means 1; yarn: beta_fast/beta_slow <= 0 mean 32/1,
 * attention_factor <= 0 means 0.1 * ln(factor) + 1 (1 if factor <= 1). */
void kn_rope_init(int rope_type, double theta, double factor,
                  double low_freq_factor, double high_freq_factor,
                  uint64_t original_max_pos, double beta_fast,
                  double beta_slow, double attention_factor,
                  uint32_t head_dim, uint64_t seq_len, float *inv_freq,
                  float *attn_scale);

/* Rotate x: [T][nheads][head_dim] in place, token t at position pos[t],
 * HF rotate_half layout (dimension i pairs with i + head_dim/2). */
void kn_rope_apply(const kn_rope *r, float *x, size_t T, uint32_t nheads,
                   const int64_t *pos);
void kn_ref_rope_apply(const kn_rope *r, float *x, size_t T, uint32_t nheads,
                       const int64_t *pos);

/* ---- KV cache and attention --------------------------------------------- */

/* One layer's cache for one sequence: a ring of cap slots; position p lives
 * in slot p % cap.  Each slot holds n_kv_heads*head_dim values (K and V
 * separately) in type; I8 adds one float scale per head per slot. */
typedef struct kn_kv {
    kn_kvtype type;
    uint32_t n_kv_heads, head_dim;
    uint64_t cap;             /* slots */
    void *k, *v;              /* [cap][n_kv_heads*head_dim] of type */
    float *k_scale, *v_scale; /* I8: [cap][n_kv_heads]; else NULL */
} kn_kv;

/* Bytes of one slot of K plus V (including I8 scales). */
uint64_t kn_kv_slot_bytes(kn_kvtype type, uint32_t n_kv_heads,
                          uint32_t head_dim);

/* Store K and V rows ([n_kv_heads*head_dim] each) of position pos. */
void kn_kv_store(kn_kv *kv, int64_t pos, const float *k, const float *v);

/* Causal grouped-query attention for T new tokens of one sequence whose
 * K/V are already stored.  q: [T][n_heads][head_dim], token t at position
 * pos0 + t; token t attends positions max(0, p - window + 1) .. p (window 0
 * = no limit); the caller guarantees those are still in the ring.
 * Query head h uses KV head h / (n_heads / n_kv_heads).  Scores are scaled
 * by 1/sqrt(head_dim).  out: [T][n_heads][head_dim].  scratch: at least
 * kn_attention_scratch_floats(...) floats (the scalar path's score rows;
 * the AVX2 path works in tiles on its stack, kn_attn_avx2.c).  A row's
 * result does not depend on T, pos0 of the call or the thread count: the
 * same query at the same position over the same cache gives the same bits
 * in a prefill and in a decode step. */
void kn_attention(kn_pool *p, const kn_kv *kv, const float *q, size_t T,
                  uint32_t n_heads, int64_t pos0, uint64_t window,
                  float *out, float *scratch);
void kn_ref_attention(const kn_kv *kv, const float *q, size_t T,
                      uint32_t n_heads, int64_t pos0, uint64_t window,
                      float *out, float *scratch);
/* Scratch the attention needs: per pool thread, one score row of max_ctx
 * floats plus two head_dim vectors, each rounded up to 16 floats.  nthreads
 * must be at least kn_pool_threads() of the pool passed to kn_attention (1
 * for a NULL pool); max_ctx at least the longest attended span of a call,
 * min(pos0 + T, window) (window 0: pos0 + T). */
uint64_t kn_attention_scratch_floats(int nthreads, uint64_t max_ctx,
                                     uint32_t head_dim);

#endif /* KN_OPS_H */

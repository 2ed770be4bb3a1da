/*
 * rt_backend.h - the seam between the one scheduler (rt_sched.c, behind
 * rt_session.h) and the hardware that runs the forward pass, in the manner
 * of ggml's ggml_backend_i: a small table of functions plus the host step
 * tables the backend lends the scheduler.
 *
 * Who does what:
 *   scheduler (rt_sched.c)   request checks, slots, continuous-batching
 *                            admission, step planning (which rows a step
 *                            takes, which need logits), sampling, scoring,
 *                            stop rules, statistics.  Backend-independent:
 *                            a request gets the same answer on every
 *                            backend up to the backend's float rounding.
 *   backend (rt_cpu.c,       the planned arena (KV cache and activations),
 *            rt_cuda*.c)     the weights it reads, and four operations on
 *                            one step: upload, block_forward(layer),
 *                            head(rows) and, optionally, argmax on the
 *                            device.
 *
 * One step, as the scheduler drives it (rt_sched.c step_once):
 *
 *   plan_step            fills tab.ids/pos/segs/rows (the step tables)
 *   i->upload(step)      embedding rows + positions (+ per-slot RoPE)
 *   for l in layers:     i->block_forward(step, l)   (KV of segment g is
 *                        the backend's KV region (l, step->seg_slot[g]))
 *   for each group of <= max_batch rows that need logits:
 *                        i->head(step, r0, g, want_tokens) -> host logits
 *                        [g][vocab] or, when want_tokens and the backend
 *                        can, the argmax token of each row
 *   i->finish(step)      (optional) wait for the device: the step's time
 *
 * How to add a backend (see also mcrt.h "Backends"):
 *   1. implement rt_backend_i over your device: create takes the model, the
 *      resolved layout (rt_layout.h: the same arena offsets on every
 *      backend) and allocates everything once; no operation may allocate;
 *   2. lend the scheduler host step tables of the sizes in rt_step_tables
 *      (in the arena on the CPU, host buffers on a GPU);
 *   3. add an rt_device value, its name in rt_device_parse and a case in
 *      rt_session_create_on (rt_sched.c), an MCRT_DEVICE_ value (mcrt.h,
 *      mapped in rt_api.c mcrt_open) and the name in mrun's --device;
 *      a backend that needs a heavy library is loaded on demand, as the
 *      CUDA one is (rt_cuda_module.h), so CPU runs never map it;
 *   4. run the scheduler's tests on it: MC_TEST_BACKEND=NAME ctest -R
 *      session (tests/helpers/testutil.h tu_session_create).
 */
#ifndef RT_BACKEND_H
#define RT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kn_block.h"
#include "mc_error.h"
#include "rt_layout.h"
#include "rt_model.h"

/* Host tables the scheduler writes a step into (lent by the backend for
 * its lifetime; chunk = layout.limits.prefill_chunk, B = max_batch). */
typedef struct rt_step_tables {
    int32_t *ids;              /* [chunk] token id of each row */
    int64_t *pos;              /* [chunk] position of each row */
    kn_block_segment *segs;    /* [B] one per sequence in the step; .kv is
                                  the backend's (set per layer) */
    int32_t *rows;             /* [chunk][2] (row, slot) needing logits */
    int32_t *index;            /* [vocab] sampler scratch (the
                                  probabilities go in the logits row) */
    kn_rope *slot_rope;        /* [B] per-slot RoPE (dynamic NTK only):
                                  inv_freq points at [head_dim/2] floats */
} rt_step_tables;

/* One planned step (views of the tables above). */
typedef struct rt_step {
    size_t T;                  /* token rows, 1..chunk */
    size_t nseg;               /* sequences (segments) in the step */
    const size_t *seg_slot;    /* [nseg] batch slot of each segment */
    size_t nrows;              /* rows that need logits */
    int dynamic_rope;          /* segs[g].rope = &slot_rope[seg_slot[g]] */
} rt_step;

typedef struct rt_backend_i {
    const char *name;          /* "cpu", "cuda" */
    void (*free)(void *ctx);   /* NULL ctx is a no-op */
    /* Embedding rows of tab.ids, positions, per-slot RoPE tables. */
    mc_status (*upload)(void *ctx, const rt_step *st, mc_error *err);
    /* Transformer block `layer` over the step's T rows, in place. */
    mc_status (*block_forward)(void *ctx, const rt_step *st, uint32_t layer,
                               mc_error *err);
    /* Final norm + lm_head of rows[r0 .. r0+g) (g <= max_batch).  Sets
     * *logits to host [g][vocab] floats, or, when want_tokens and the
     * backend has a device argmax, *logits = NULL and *tokens to [g]
     * greedy ids.  Both valid until the next call; the scheduler may
     * overwrite a logits row once it has used it (sampling in place). */
    mc_status (*head)(void *ctx, const rt_step *st, size_t r0, size_t g,
                      int want_tokens, float **logits,
                      const int32_t **tokens, mc_error *err);
    /* Optional (NULL: nothing to wait for): the step's work is done. */
    mc_status (*finish)(void *ctx, mc_error *err);
} rt_backend_i;

/* A created backend: its functions, its context, what it lends. */
typedef struct rt_backend {
    const rt_backend_i *i;
    void *ctx;
    rt_layout layout;          /* the layout it runs (threads clamped) */
    rt_step_tables tab;
    /* Host arena with its canary (rt_session_arena_*), NULL when the
     * arena lives on a device. */
    const uint8_t *host_arena;
} rt_backend;

/* The CPU backend (rt_cpu.c): posix_memalign'ed arena filled with the
 * canary, kn_block_forward on a thread pool.  layout: as
 * rt_session_create.  On success *out owns everything. */
mc_status rt_cpu_backend_create(const rt_model *model, const rt_limits *lim,
                                const rt_layout *layout, rt_backend *out,
                                mc_error *err);
/* The calibration tap of rt_session_set_tap (CPU backend only). */
void rt_cpu_backend_set_tap(void *ctx, void (*fn)(void *, uint32_t,
                                                  kn_tap_point,
                                                  const float *, size_t,
                                                  size_t),
                            void *tap_ctx);
extern const rt_backend_i rt_cpu_backend_i;

/* The canary byte of a host arena (bytes not written keep it). */
#define RT_CANARY 0xA5u

#endif /* RT_BACKEND_H */

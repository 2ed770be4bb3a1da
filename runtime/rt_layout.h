/*
 * rt_layout.h - the session arena: THE single source of truth for how many
 * bytes a session needs and where each buffer lives.
 *
 * The runtime (rt_session_create) allocates one arena of arena_bytes and
 * places every buffer at its offset; the compiler's memory planner calls
 * rt_layout_build with the same inputs and stores the result in the
 * artifact.  Nothing else is allocated per token.
 *
 * A step (one call of the model on up to prefill_chunk token rows) goes
 * through phases; every buffer lives over an interval of them:
 *
 *   phase  0 INPUT     ids, pos, segments, logit-row list written
 *          1 EMBED     x filled from the embedding rows
 *          2 L_QKV     a block (kn_block.h), in four parts: xb = norm(x),
 *                      q k v = xb W (int8 input quantized into hb)
 *          3 L_ATTN    k v stored, attention (attn-scratch) -> att
 *          4 L_O       xb = att Wo (int8 input in hb), x += xb
 *          5 L_MLP     xb = norm(x), hb hb2 = xb Wg, xb Wu (int8 input in
 *                      q), hb = silu(hb) * hb2, xb = hb Wd (int8 input in
 *                      hb2), x += xb
 *          6 NORM      rows that need logits: x -> normed hx
 *          7 HEAD      hx -> logits (groups of max_batch rows; an
 *                      int8/int4 output layer: normed rows staged in
 *                      logits, quantized into hx, then -> logits)
 *          8 SAMPLE    logits -> token / log-probs (sampling turns a row
 *                      into probabilities in place, index scratch)
 *   PERSIST  KV cache, RoPE inv_freq (global and per slot): all steps
 *
 * The block's parts repeat once per layer; no buffer lives from one
 * layer's L_MLP into the next layer's L_QKV except x, which lives across
 * all of them.  These are the real lifetimes of the worst step's tensors
 * (as ggml-alloc frees a tensor after its last use): hb2 lives in L_MLP
 * only, so it shares bytes with k, v, att and the attention scratch, which
 * are dead by then.  Sizing every layer buffer for the whole block at once
 * left that much of the arena unwritten at every corner.
 *
 * Rows: a step holds at most min(prefill_chunk, max_batch x max_seq) token
 * rows (every sequence fits max_seq), so rt_layout_build resolves the
 * chunk to that bound: a larger one would plan rows nothing can fill.
 *
 * Two buffers may share bytes only when their intervals are disjoint.
 * Offsets: PERSIST buffers first, then the others; each group by size
 * (descending, ties by id); each buffer placed at the lowest 64-byte-
 * aligned offset where it overlaps no already placed buffer whose lifetime
 * overlaps its own.  Deterministic for equal inputs.  Persistent buffers
 * low, transient ones on top: the measured high-water mark
 * (rt_session_arena_high_water) then tells how much step space a request
 * used, instead of always reaching a small persistent buffer at the top.
 *
 *   0                                                        arena_bytes
 *   +--------------------------------------+--------------------------+
 *   | KV cache (PERSIST)                   | step buffers, reused     |
 *   |  layer 0: slot 0 [cap0][K,V slot] .. |  blocks: q k v att hb .. |
 *   |  layer 1: slot 0 ..   slot B-1 ...   |  HEAD:   logits hx ...   |
 *   |                                      |  (same bytes, other      |
 *   |  + rope tables (PERSIST)             |   phases)  + ids, pos .. |
 *   +--------------------------------------+--------------------------+
 *   (the picture is typical: the greedy placement puts the largest,
 *    persistent KV region first; buf[] with rt_layout_buf_name gives the
 *    real one, and `mcompile plan` reports it)
 *
 * Inside the KV region layer l, batch slot b start at
 *   kv_offset + sum_{l' < l} B * cap_l' * slot_bytes + b * cap_l * slot_bytes
 * with cap_l = max_seq for full-attention layers and
 * min(max_seq, window_l + prefill_chunk) for sliding-window layers (a ring:
 * position p in slot p % cap_l), slot_bytes = kn_kv_slot_bytes(kv type).
 */
#ifndef RT_LAYOUT_H
#define RT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "fmt_config.h"
#include "kn_quant.h"
#include "mc_error.h"

#define RT_LAYOUT_ALIGN 64

/* What a session is planned for. */
typedef struct rt_limits {
    uint32_t max_batch;      /* sequences decoded together (>= 1) */
    uint64_t max_seq;        /* context per sequence, prompt + generated */
    uint32_t prefill_chunk;  /* token rows per step (>= max_batch; resolved
                                to <= max_batch x max_seq) */
    kn_kvtype kv_type;       /* KV cache element type */
    int threads;             /* worker threads (0 = kn_cpu_count()) */
} rt_limits;

/* Phases of a step (see the table above). */
typedef enum rt_phase {
    RT_PH_INPUT = 0,
    RT_PH_EMBED = 1,
    RT_PH_L_QKV = 2,         /* a block: norm, q/k/v projections */
    RT_PH_L_ATTN = 3,        /*          KV store, attention */
    RT_PH_L_O = 4,           /*          output projection, residual */
    RT_PH_L_MLP = 5,         /*          norm, gate/up, down, residual */
    RT_PH_NORM = 6,
    RT_PH_HEAD = 7,
    RT_PH_SAMPLE = 8,
    RT_PH_PERSIST = 9,       /* first = last = PERSIST: lives across steps */
} rt_phase;

/* Every buffer of the arena.  Values are pinned (artifacts store offsets
 * by id): add new ones before RT_BUF_COUNT_. */
typedef enum rt_buf_id {
    RT_BUF_KV = 0,           /* all layers x slots, PERSIST */
    RT_BUF_ROPE = 1,         /* float [head_dim/2] inv_freq, PERSIST */
    RT_BUF_ROPE_SLOT = 2,    /* float [max_batch][head_dim/2] dynamic NTK, PERSIST */
    RT_BUF_IDS = 3,          /* int32 [chunk] token ids of the step */
    RT_BUF_POS = 4,          /* int64 [chunk] positions */
    RT_BUF_SEGS = 5,         /* kn_block_segment [max_batch] */
    RT_BUF_ROWS = 6,         /* int32 [chunk][2] (row, sequence) needing logits */
    RT_BUF_X = 7,            /* float [chunk][hidden] residual */
    RT_BUF_XB = 8,           /* float [chunk][hidden] */
    RT_BUF_Q = 9,            /* float [chunk][q_dim] */
    RT_BUF_K = 10,           /* float [chunk][kv_dim] */
    RT_BUF_V = 11,           /* float [chunk][kv_dim] */
    RT_BUF_ATT = 12,         /* float [chunk][q_dim] */
    RT_BUF_HB = 13,          /* float [chunk][ffn] */
    RT_BUF_HB2 = 14,         /* float [chunk][ffn] */
    RT_BUF_ATTN_SCRATCH = 15,/* float kn_attention_scratch_floats(threads, max_seq) */
    RT_BUF_HX = 16,          /* float [max_batch][hidden] normed rows for the head */
    RT_BUF_LOGITS = 17,      /* float [max_batch][vocab] */
    RT_BUF_PROBS = 18,       /* unused, 0 bytes: the sampler's probabilities
                                overwrite the logits row (rt_sample.h); a
                                separate row was planned but never written
                                by scoring.  The id stays pinned. */
    RT_BUF_INDEX = 19,       /* int32 [vocab] sampler */
    RT_BUF_COUNT_
} rt_buf_id;

typedef struct rt_buffer {
    uint64_t offset;         /* bytes from the arena start, 64-aligned */
    uint64_t bytes;          /* size (0: unused, offset 0) */
    rt_phase first, last;    /* lifetime, inclusive */
} rt_buffer;

typedef struct rt_layout {
    rt_limits limits;        /* the limits it was built for (threads resolved) */
    rt_buffer buf[RT_BUF_COUNT_];
    uint64_t arena_bytes;    /* total, 64-aligned */
    uint64_t kv_bytes;       /* RT_BUF_KV */
    uint64_t activation_bytes; /* arena_bytes - kv_bytes */
    uint64_t kv_slot_bytes;  /* K+V bytes of one position of one layer */
} rt_layout;

/* Check limits against the config (batch >= 1, chunk >= batch, max_seq >= 1,
 * kv type known) and fill out.  Threads 0 is resolved to the online CPU
 * count here (the attention scratch depends on it), and the chunk to at most
 * max_batch x max_seq (out->limits holds the resolved limits).  Returns MC_ERR_PLAN
 * with a message naming the bad limit, MC_ERR_OVERFLOW when sizes do not
 * fit 64 bits. */
mc_status rt_layout_build(const fmt_model_config *cfg, const rt_limits *lim,
                          rt_layout *out, mc_error *err);

/* A stored layout is checked against requested limits by
 * rt_plan_session_layout (rt_plan.h), the plan's one owner. */

/* Ring capacity (positions) of layer's cache under lim. */
uint64_t rt_layout_kv_cap(const fmt_model_config *cfg, const rt_limits *lim,
                          uint32_t layer);
/* Byte offset (from the arena start) of layer's cache for batch slot. */
uint64_t rt_layout_kv_offset(const rt_layout *l, const fmt_model_config *cfg,
                             uint32_t layer, uint32_t slot);

/* KV bytes one token costs over all layers (for the planner), and the KV
 * bytes of a whole session: sum over layers of max_batch * cap * slot. */
uint64_t rt_layout_kv_bytes_per_token(const fmt_model_config *cfg,
                                      kn_kvtype kv_type);
uint64_t rt_layout_kv_bytes_total(const fmt_model_config *cfg,
                                  const rt_limits *lim);

/* Name of a buffer ("kv", "logits", ...), for reports. */
const char *rt_layout_buf_name(rt_buf_id id);
/* Default limits for a config when no plan is given: batch 8, max_seq
 * min(max_position_embeddings, 2048), chunk 256, f32 KV, threads 0. */
void rt_limits_default(const fmt_model_config *cfg, rt_limits *out);

#endif /* RT_LAYOUT_H */

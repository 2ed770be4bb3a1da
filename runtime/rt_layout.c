/* rt_layout.c - sizes, lifetimes and offsets of the session arena (see
 * rt_layout.h). */
#include "rt_layout.h"

#include <string.h>
#include <unistd.h>

#include "kn_block.h"
#include "kn_cpus.h"
#include "kn_ops.h"
#include "mc_checked.h"

static const char *const g_buf_names[RT_BUF_COUNT_] = {
    [RT_BUF_KV] = "kv",
    [RT_BUF_ROPE] = "rope",
    [RT_BUF_ROPE_SLOT] = "rope_slot",
    [RT_BUF_IDS] = "ids",
    [RT_BUF_POS] = "pos",
    [RT_BUF_SEGS] = "segments",
    [RT_BUF_ROWS] = "logit_rows",
    [RT_BUF_X] = "x",
    [RT_BUF_XB] = "xb",
    [RT_BUF_Q] = "q",
    [RT_BUF_K] = "k",
    [RT_BUF_V] = "v",
    [RT_BUF_ATT] = "att",
    [RT_BUF_HB] = "hb",
    [RT_BUF_HB2] = "hb2",
    [RT_BUF_ATTN_SCRATCH] = "attn_scratch",
    [RT_BUF_HX] = "hx",
    [RT_BUF_LOGITS] = "logits",
    [RT_BUF_PROBS] = "probs",
    [RT_BUF_INDEX] = "index",
};

const char *rt_layout_buf_name(rt_buf_id id)
{
    return (unsigned)id < RT_BUF_COUNT_ ? g_buf_names[id] : "?";
}

void rt_limits_default(const fmt_model_config *cfg, rt_limits *out)
{
    memset(out, 0, sizeof *out);
    out->max_batch = 8;
    out->max_seq = cfg->max_position_embeddings;
    if (out->max_seq == 0 || out->max_seq > 2048)
        out->max_seq = 2048;
    out->prefill_chunk = 256;
    out->kv_type = KN_KV_F32;
    out->threads = 0;
}

uint64_t rt_layout_kv_cap(const fmt_model_config *cfg, const rt_limits *lim,
                          uint32_t layer)
{
    uint64_t w = fmt_config_layer_window(cfg, layer);
    if (w == 0)
        return lim->max_seq;
    uint64_t ring = w + lim->prefill_chunk;
    return ring < lim->max_seq ? ring : lim->max_seq;
}

uint64_t rt_layout_kv_bytes_per_token(const fmt_model_config *cfg,
                                      kn_kvtype kv_type)
{
    return (uint64_t)cfg->num_layers *
           kn_kv_slot_bytes(kv_type, cfg->num_kv_heads, cfg->head_dim);
}

/* Sum over layers of B * cap_l * slot; 0 on overflow (callers check). */
static int kv_total(const fmt_model_config *cfg, const rt_limits *lim,
                    uint64_t slot, uint64_t *out)
{
    uint64_t total = 0, t;
    for (uint32_t l = 0; l < cfg->num_layers; l++) {
        if (!mc_mul_u64(rt_layout_kv_cap(cfg, lim, l), slot, &t) ||
            !mc_mul_u64(t, lim->max_batch, &t) || !mc_add_u64(total, t, &total))
            return 0;
    }
    *out = total;
    return 1;
}

uint64_t rt_layout_kv_bytes_total(const fmt_model_config *cfg,
                                  const rt_limits *lim)
{
    uint64_t slot = kn_kv_slot_bytes(lim->kv_type, cfg->num_kv_heads,
                                     cfg->head_dim);
    uint64_t total = 0;
    return kv_total(cfg, lim, slot, &total) ? total : UINT64_MAX;
}

uint64_t rt_layout_kv_offset(const rt_layout *l, const fmt_model_config *cfg,
                             uint32_t layer, uint32_t slot)
{
    uint64_t off = l->buf[RT_BUF_KV].offset;
    const uint64_t B = l->limits.max_batch;
    for (uint32_t i = 0; i < layer; i++)
        off += B * rt_layout_kv_cap(cfg, &l->limits, i) * l->kv_slot_bytes;
    return off + (uint64_t)slot * rt_layout_kv_cap(cfg, &l->limits, layer) *
                     l->kv_slot_bytes;
}

/* bytes = a * b * c with overflow check. */
static int size3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return mc_mul_u64(a, b, &t) && mc_mul_u64(t, c, out);
}

static void set_life(rt_buffer *b, rt_phase first, rt_phase last)
{
    b->first = first;
    b->last = last;
}

static int lifetimes_overlap(const rt_buffer *a, const rt_buffer *b)
{
    /* PERSIST overlaps everything. */
    if (a->first == RT_PH_PERSIST || b->first == RT_PH_PERSIST)
        return 1;
    return a->first <= b->last && b->first <= a->last;
}

/* Placement order: persistent before transient, then larger first, then by
 * id (so the layout is deterministic). */
static int goes_before(const rt_buffer *a, int ida, const rt_buffer *b, int idb)
{
    int pa = a->first == RT_PH_PERSIST, pb = b->first == RT_PH_PERSIST;
    if (pa != pb)
        return pa;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes;
    return ida < idb;
}

/* Check lim and cfg; fill *L with the resolved limits (threads, chunk). */
static mc_status resolve_limits(const fmt_model_config *cfg,
                                const rt_limits *lim, rt_limits *L,
                                mc_error *err)
{
    /* Field by field into zeroed bytes: the caller's padding is not
     * copied, so equal limits give byte-identical layouts. */
    memset(L, 0, sizeof *L);
    L->max_batch = lim->max_batch;
    L->max_seq = lim->max_seq;
    L->prefill_chunk = lim->prefill_chunk;
    L->kv_type = lim->kv_type;
    L->threads = lim->threads;
    if (L->threads <= 0)
        L->threads = kn_cpu_count();
    if (L->threads > 256)
        L->threads = 256;
    if (L->max_batch < 1)
        return mc_fail(err, MC_ERR_PLAN, NULL, "max_batch", -1,
                       "max_batch must be >= 1 (got %u)", L->max_batch);
    if (L->max_seq < 1)
        return mc_fail(err, MC_ERR_PLAN, NULL, "max_seq", -1,
                       "max_seq must be >= 1");
    if (L->prefill_chunk < L->max_batch)
        return mc_fail(err, MC_ERR_PLAN, NULL, "prefill_chunk", -1,
                       "prefill_chunk (%u) must be >= max_batch (%u): a "
                       "decode step feeds one row per sequence",
                       L->prefill_chunk, L->max_batch);
    /* Every sequence fits max_seq, so no step holds more rows than
     * max_batch x max_seq: rows beyond would never be written. */
    if ((uint64_t)L->prefill_chunk / L->max_batch >= L->max_seq)
        L->prefill_chunk = (uint32_t)((uint64_t)L->max_batch * L->max_seq);
    if (L->kv_type != KN_KV_F32 && L->kv_type != KN_KV_F16 &&
        L->kv_type != KN_KV_I8)
        return mc_fail(err, MC_ERR_PLAN, NULL, "kv_type", -1,
                       "unknown KV cache type %d", (int)L->kv_type);
    if (cfg->head_dim == 0 || cfg->head_dim % 2 || cfg->num_layers == 0 ||
        cfg->hidden_size == 0 || cfg->vocab_size == 0 ||
        cfg->num_kv_heads == 0 || cfg->num_heads % cfg->num_kv_heads)
        return mc_fail(err, MC_ERR_SHAPE, NULL, NULL, -1,
                       "config shape not runnable (head_dim %u, heads %u/%u)",
                       cfg->head_dim, cfg->num_heads, cfg->num_kv_heads);
    return MC_OK;
}

/* Bytes of every buffer (the shapes of rt_buf_id's comments). */
static mc_status size_buffers(const fmt_model_config *cfg, const rt_limits *L,
                              uint64_t kv_slot_bytes, rt_buffer *b,
                              mc_error *err)
{
    const uint64_t C = L->prefill_chunk, B = L->max_batch;
    const uint64_t H = cfg->hidden_size, V = cfg->vocab_size;
    const uint64_t QD = (uint64_t)cfg->num_heads * cfg->head_dim;
    const uint64_t KD = (uint64_t)cfg->num_kv_heads * cfg->head_dim;
    const uint64_t F = cfg->intermediate_size, HALF = cfg->head_dim / 2;
    int ok = kv_total(cfg, L, kv_slot_bytes, &b[RT_BUF_KV].bytes);
    ok = ok && size3(HALF, 1, 4, &b[RT_BUF_ROPE].bytes);
    ok = ok && size3(HALF, B, 4, &b[RT_BUF_ROPE_SLOT].bytes);
    ok = ok && size3(C, 1, 4, &b[RT_BUF_IDS].bytes);
    ok = ok && size3(C, 1, 8, &b[RT_BUF_POS].bytes);
    ok = ok && size3(B, 1, sizeof(kn_block_segment), &b[RT_BUF_SEGS].bytes);
    ok = ok && size3(C, 2, 4, &b[RT_BUF_ROWS].bytes);
    ok = ok && size3(C, H, 4, &b[RT_BUF_X].bytes);
    ok = ok && size3(C, H, 4, &b[RT_BUF_XB].bytes);
    ok = ok && size3(C, QD, 4, &b[RT_BUF_Q].bytes);
    ok = ok && size3(C, KD, 4, &b[RT_BUF_K].bytes);
    ok = ok && size3(C, KD, 4, &b[RT_BUF_V].bytes);
    ok = ok && size3(C, QD, 4, &b[RT_BUF_ATT].bytes);
    ok = ok && size3(C, F, 4, &b[RT_BUF_HB].bytes);
    ok = ok && size3(C, F, 4, &b[RT_BUF_HB2].bytes);
    ok = ok && size3(kn_attention_scratch_floats(L->threads, L->max_seq,
                                                 cfg->head_dim),
                     1, 4, &b[RT_BUF_ATTN_SCRATCH].bytes);
    ok = ok && size3(B, H, 4, &b[RT_BUF_HX].bytes);
    ok = ok && size3(B, V, 4, &b[RT_BUF_LOGITS].bytes);
    ok = ok && size3(V, 1, 4, &b[RT_BUF_INDEX].bytes);
    if (!ok)
        return mc_fail(err, MC_ERR_OVERFLOW, NULL, NULL, -1,
                       "arena sizes overflow 64 bits (max_seq %llu, "
                       "max_batch %u, prefill_chunk %u)",
                       (unsigned long long)L->max_seq, L->max_batch,
                       L->prefill_chunk);
    return MC_OK;
}

/* Lifetimes: from the phase a buffer is first written in to the phase it
 * is last read in (the table in rt_layout.h; kn_block.h says which buffer
 * each part of a block reads and writes). */
static void set_lifetimes(rt_buffer *b)
{
    for (int i = RT_BUF_KV; i <= RT_BUF_ROPE_SLOT; i++)
        set_life(&b[i], RT_PH_PERSIST, RT_PH_PERSIST);
    /* Inputs are written in INPUT; positions and the rows list are read
     * until SAMPLE (error messages name the position). */
    set_life(&b[RT_BUF_IDS], RT_PH_INPUT, RT_PH_EMBED);
    set_life(&b[RT_BUF_POS], RT_PH_INPUT, RT_PH_SAMPLE);
    set_life(&b[RT_BUF_SEGS], RT_PH_INPUT, RT_PH_SAMPLE);
    set_life(&b[RT_BUF_ROWS], RT_PH_INPUT, RT_PH_SAMPLE);
    /* xb, q and hb are read in every part of a block: xb as the normed
     * input and the projections' output, hb as the int8 input of q/k/v
     * and o, q as the int8 input of gate/up. */
    set_life(&b[RT_BUF_XB], RT_PH_L_QKV, RT_PH_L_MLP);
    set_life(&b[RT_BUF_Q], RT_PH_L_QKV, RT_PH_L_MLP);
    set_life(&b[RT_BUF_HB], RT_PH_L_QKV, RT_PH_L_MLP);
    set_life(&b[RT_BUF_K], RT_PH_L_QKV, RT_PH_L_ATTN);
    set_life(&b[RT_BUF_V], RT_PH_L_QKV, RT_PH_L_ATTN);
    set_life(&b[RT_BUF_ATTN_SCRATCH], RT_PH_L_ATTN, RT_PH_L_ATTN);
    set_life(&b[RT_BUF_ATT], RT_PH_L_ATTN, RT_PH_L_O);
    set_life(&b[RT_BUF_HB2], RT_PH_L_MLP, RT_PH_L_MLP);
    /* The head runs in groups: NORM and HEAD alternate, so hx lives over
     * both and logits from HEAD through SAMPLE; x must survive too (NORM
     * of the next group reads it). */
    set_life(&b[RT_BUF_X], RT_PH_EMBED, RT_PH_SAMPLE);
    set_life(&b[RT_BUF_HX], RT_PH_NORM, RT_PH_SAMPLE);
    set_life(&b[RT_BUF_LOGITS], RT_PH_NORM, RT_PH_SAMPLE);
    set_life(&b[RT_BUF_INDEX], RT_PH_SAMPLE, RT_PH_SAMPLE);
}

/* Bytes a buffer takes in the arena (its size rounded to the alignment). */
static int padded(const rt_buffer *b, uint64_t *out)
{
    return mc_align_up_u64(b->bytes, RT_LAYOUT_ALIGN, out);
}

/* The lowest offset where cur overlaps none of the n placed buffers whose
 * lifetime overlaps its own: 0 or the end of one of them.  sz is cur's
 * padded size.  0 on overflow. */
static int lowest_free_offset(const rt_buffer *b, const int *placed, int n,
                              const rt_buffer *cur, uint64_t sz,
                              uint64_t *out)
{
    uint64_t best = UINT64_MAX;
    for (int c = -1; c < n; c++) {
        uint64_t cand = 0, osz = 0;
        if (c >= 0) {
            const rt_buffer *o = &b[placed[c]];
            if (!lifetimes_overlap(o, cur))
                continue;
            if (!padded(o, &osz) || !mc_add_u64(o->offset, osz, &cand))
                return 0;
        }
        if (cand >= best)
            continue;
        int fits = 1;
        for (int d = 0; d < n && fits; d++) {
            const rt_buffer *o = &b[placed[d]];
            if (!lifetimes_overlap(o, cur))
                continue;
            if (!padded(o, &osz))
                return 0;
            /* o's end fits 64 bits (checked as a candidate above) */
            if (cand < o->offset + osz && o->offset < cand + sz)
                fits = 0;
        }
        if (fits)
            best = cand;
    }
    *out = best;
    return 1;
}

/* Offsets: buffers that live for the whole session first (KV cache, RoPE
 * tables: they take the lowest offsets), then size descending, ties by id
 * ascending (deterministic), each at the lowest free offset.  Keeping the
 * persistent ones low puts the transient step buffers at the top, so the
 * measured high-water mark shows how much of the step space a request
 * really used.  Returns the arena's end in *end. */
static mc_status place_buffers(rt_buffer *b, uint64_t *end, mc_error *err)
{
    int order[RT_BUF_COUNT_];
    for (int i = 0; i < RT_BUF_COUNT_; i++)
        order[i] = i;
    for (int i = 1; i < RT_BUF_COUNT_; i++) {
        int v = order[i], j = i;
        while (j > 0 && goes_before(&b[v], v, &b[order[j - 1]], order[j - 1])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    int placed[RT_BUF_COUNT_];
    int nplaced = 0;
    *end = 0;
    for (int oi = 0; oi < RT_BUF_COUNT_; oi++) {
        rt_buffer *cur = &b[order[oi]];
        uint64_t sz, at, top;
        if (!padded(cur, &sz))
            goto overflow;
        if (sz == 0) {
            cur->offset = 0;
            continue;
        }
        if (!lowest_free_offset(b, placed, nplaced, cur, sz, &at) ||
            !mc_add_u64(at, sz, &top))
            goto overflow;
        cur->offset = at;
        if (top > *end)
            *end = top;
        placed[nplaced++] = order[oi];
    }
    return MC_OK;
overflow:
    return mc_fail(err, MC_ERR_OVERFLOW, NULL, NULL, -1,
                   "arena size overflows");
}

mc_status rt_layout_build(const fmt_model_config *cfg, const rt_limits *lim,
                          rt_layout *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (!cfg || !lim)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_layout_build: NULL config or limits");
    rt_limits L;
    mc_status st = resolve_limits(cfg, lim, &L, err);
    if (st != MC_OK)
        return st;
    out->limits = L;
    out->kv_slot_bytes =
        kn_kv_slot_bytes(L.kv_type, cfg->num_kv_heads, cfg->head_dim);
    if ((st = size_buffers(cfg, &L, out->kv_slot_bytes, out->buf, err)))
        return st;
    set_lifetimes(out->buf);
    uint64_t end;
    if ((st = place_buffers(out->buf, &end, err)))
        return st;
    out->arena_bytes = end;
    out->kv_bytes = out->buf[RT_BUF_KV].bytes;
    out->activation_bytes = end - out->kv_bytes;
    return MC_OK;
}

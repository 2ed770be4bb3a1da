/* cmp_calib_heldout.c - the held-out evaluation carried through the
 * calibration block by block (see cmp_calib_internal.h).
 *
 * Why streamed: the calibration drops each finished block's source pages;
 * a whole-model evaluation at the end read the whole source again, and
 * the plan had to count all of it (a 7B's 14 GiB).  Here both models'
 * held-out states cross block l while its source is resident and its
 * quantized weights exist, with the evaluation's own forward
 * (cmp_fwd_block: one sequence at a time, fresh KV cache, a context of
 * the held-out sequences' longest length, the same pool), so every state
 * and every figure has the bits cmp_eval_models gives on the same
 * sequences (test_calib: "streamed held-out equals the whole-model
 * evaluation"). */
#include <string.h>

#include "cmp_calib_internal.h"
#include "fmt_dtype.h"
#include "mc_alloc.h"

struct cmp_heldout {
    const int32_t *tok;  /* borrowed: the sequences' tokens (indexed by off) */
    const size_t *off;   /* borrowed: [n + 1] offsets into tok */
    size_t n;            /* held-out sequences */
    size_t maxT;         /* the longest */
    uint32_t hidden;
    float *x_ref;        /* [tok of all n][hidden] the reference's states */
    float *x_q;          /* [same] the quantized model's (rotated basis
                            when the calibration rotates) */
    cmp_fwd *f;          /* on the source model, max_T = maxT; NULL once
                            the blocks are done (cmp_heldout_blocks_done) */
};

/* cmp_calib_memory counts this struct as a 64-byte block. */
_Static_assert(sizeof(struct cmp_heldout) <= 64,
               "cmp_calib_mem.c plans 64 bytes for struct cmp_heldout");

/* Sequence i's length and its states' first row. */
static size_t seq_len(const cmp_heldout *h, size_t i)
{
    return h->off[i + 1] - h->off[i];
}

static size_t seq_row(const cmp_heldout *h, size_t i)
{
    return h->off[i] - h->off[0];
}

uint64_t cmp_heldout_state_bytes(const fmt_model_config *c, const size_t *off,
                                 size_t n)
{
    return n ? 2 * (uint64_t)(off[n] - off[0]) * c->hidden_size * sizeof(float)
             : 0;
}

/* The quantized model's embedding of token `tok` into x [hidden] (the
 * source's row on entry), as the artifact stores it: rotated by rot when
 * given, then in fmt: F16 / BF16 rounded as the writer rounds (RNE), or,
 * quantized (an unrotated tied model, whose output layer is its
 * embedding), the row through fmt as lm_head_quant (cmp_calib_run.c)
 * quantizes it: per row (int8) or per group of a row (int4), so one row
 * alone gives the same codes and parameters.  F32: as it is. */
static mc_status embed_quant(const rt_model *m, const cmp_rotation *rot,
                             kn_wformat fmt, uint32_t group, int32_t tok,
                             float *x, mc_error *err)
{
    uint32_t H = m->cfg.hidden_size;
    if (rot)
        cmp_rotate_hidden(rot, x);
    if (fmt == KN_W_F16 || fmt == KN_W_BF16) {
        for (uint32_t c = 0; c < H; c++)
            x[c] = fmt == KN_W_F16 ? fmt_f16_to_f32(fmt_f32_to_f16(x[c]))
                                   : fmt_bf16_to_f32(fmt_f32_to_bf16(x[c]));
        return MC_OK;
    }
    if (rot || !cmp_quant_is_quantized(fmt))
        return MC_OK;
    cmp_qbuf b;
    mc_status st = cmp_calib_qbuf_alloc(&b, fmt, 1, H, group);
    if (st != MC_OK) {
        cmp_calib_qbuf_release(&b);
        return mc_fail(err, st, NULL, "lm_head", -1, "held-out embedding row");
    }
    if (fmt == KN_W_Q8)
        b.q8scale = CMP_Q8_EMBED;
    kn_matrix_row(&m->lm_head, (uint32_t)tok, x);
    st = cmp_quant_matrix(x, NULL, &b, err);
    if (st == MC_OK) {
        kn_matrix q = cmp_qbuf_matrix(&b);
        kn_matrix_row(&q, 0, x);
    }
    cmp_calib_qbuf_release(&b);
    return st;
}

mc_status cmp_heldout_create(const rt_model *m, const int32_t *tok,
                             const size_t *off, size_t n,
                             const cmp_rotation *rot, kn_wformat embed_fmt,
                             uint32_t group, kn_pool *pool, cmp_heldout **out,
                             mc_error *err)
{
    *out = NULL;
    cmp_heldout *h = mc_calloc(1, sizeof *h);
    if (!h)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "held-out states");
    h->tok = tok;
    h->off = off;
    h->n = n;
    h->hidden = m->cfg.hidden_size;
    *out = h;
    mc_status st = cmp_eval_longest(&m->cfg, off, n, &h->maxT, err);
    if (st != MC_OK || h->maxT == 0)
        return st; /* maxT 0: nothing to score, an empty summary */
    size_t rows = off[n] - off[0];
    h->x_ref = mc_malloc_array(rows * h->hidden, sizeof(float));
    h->x_q = mc_malloc_array(rows * h->hidden, sizeof(float));
    if (!h->x_ref || !h->x_q)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "held-out states (2 x %zu tokens x %u)", rows, h->hidden);
    st = cmp_fwd_create(m, h->maxT, pool, &h->f, err);
    for (size_t i = 0; i < n && st == MC_OK; i++) {
        size_t T = seq_len(h, i);
        if (T < 2)
            continue; /* not scored (no next token), as cmp_eval_models */
        float *xr = h->x_ref + seq_row(h, i) * h->hidden;
        float *xq = h->x_q + seq_row(h, i) * h->hidden;
        st = cmp_fwd_embed(h->f, tok + off[i], T, xr, err);
        if (st == MC_OK)
            memcpy(xq, xr, T * h->hidden * sizeof(float));
        for (size_t t = 0; t < T && st == MC_OK; t++)
            st = embed_quant(m, rot, embed_fmt, group, tok[off[i] + t],
                             xq + t * h->hidden, err);
    }
    return st;
}

void cmp_heldout_block(cmp_heldout *h, const kn_block_weights *ref,
                       const kn_block_weights *quant, const kn_block_dims *d)
{
    if (!h || !h->f)
        return;
    for (size_t i = 0; i < h->n; i++) {
        size_t T = seq_len(h, i);
        if (T < 2)
            continue;
        cmp_fwd_block(h->f, ref, d, h->x_ref + seq_row(h, i) * h->hidden, T,
                      NULL, NULL);
        cmp_fwd_block(h->f, quant, d, h->x_q + seq_row(h, i) * h->hidden, T,
                      NULL, NULL);
    }
}

void cmp_heldout_blocks_done(cmp_heldout *h)
{
    if (h) {
        cmp_fwd_free(h->f);
        h->f = NULL;
    }
}

mc_status cmp_heldout_report(cmp_heldout *h, const rt_model *ref,
                             const rt_model *quant, kn_pool *pool,
                             cmp_eval_report *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (h->maxT == 0)
        return MC_OK;
    uint32_t V = ref->cfg.vocab_size;
    float *lr = mc_malloc_array(h->maxT * V, sizeof(float));
    float *lq = mc_malloc_array(h->maxT * V, sizeof(float));
    cmp_eval_acc a;
    cmp_eval_acc_init(&a);
    mc_status st = lr && lq ? MC_OK
                            : mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                                      "logits buffers");
    for (size_t i = 0; i < h->n && st == MC_OK; i++) {
        size_t T = seq_len(h, i);
        if (T < 2)
            continue;
        /* the states are not needed after: the head normalizes in place */
        cmp_model_head(ref, pool, h->x_ref + seq_row(h, i) * h->hidden, T, lr);
        cmp_model_head(quant, pool, h->x_q + seq_row(h, i) * h->hidden, T, lq);
        st = cmp_eval_acc_seq(&a, lr, lq, V, h->tok + h->off[i], T, err);
    }
    if (st == MC_OK && cmp_eval_acc_report(&a, out) != MC_OK)
        st = mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "percentile");
    cmp_eval_acc_free(&a);
    mc_free(lr);
    mc_free(lq);
    return st;
}

void cmp_heldout_free(cmp_heldout *h)
{
    if (!h)
        return;
    cmp_fwd_free(h->f);
    mc_free(h->x_ref);
    mc_free(h->x_q);
    mc_free(h);
}

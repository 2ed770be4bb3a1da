/* cmp_calib_run.c - the calibration driver: the states, the rotation of
 * the ends, the layers in order (the held-out sequences carried through
 * each), the output layer and the held-out summary (see cmp_calib.h). */
#include <string.h>
#include <time.h>

#include "cmp_calib_internal.h"
#include "cmp_spill.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Default sign seed of the rotations (any fixed value: builds are
 * reproducible). */
#define ROTATE_SEED_DEFAULT 0x6d636f6d70696c65ull /* "mcompile" */

/* Set up the rotation when the model's width allows it (r->rotated, the
 * norms in r set to 1); a width that does not allow it leaves the model
 * unrotated (r->rotated 0).  Returns MC_ERR_NOMEM only. */
static mc_status rotation_setup(const rt_model *m, const cmp_calib_opts *o,
                                cmp_calib_result *r, cmp_rotation *rot)
{
    uint64_t seed = o->rotate_seed ? o->rotate_seed : ROTATE_SEED_DEFAULT;
    mc_error e;
    mc_status st = cmp_rotation_init(rot, m->cfg.hidden_size, m->cfg.head_dim,
                                     seed, &e);
    if (st == MC_ERR_INVALID_ARG)
        return MC_OK; /* too narrow a power-of-two block: not rotated */
    if (st != MC_OK)
        return st;
    r->rotated = 1;
    r->rot_block = rot->block;
    r->rot_head_block = rot->head_block;
    r->rot_seed = seed;
    uint32_t H = m->cfg.hidden_size;
    for (uint32_t l = 0; l < r->layers; l++)
        for (uint32_t j = 0; j < H; j++)
            r->attn_norm[l][j] = r->mlp_norm[l][j] = 1.0f;
    return MC_OK;
}

/* The rotated embeddings, final norm (1) and output layer (final norm
 * folded in; from the embeddings when tied) into r. */
static mc_status rotate_ends(const rt_model *m, const cmp_rotation *rot,
                             cmp_calib_result *r, mc_error *err)
{
    uint32_t V = m->embed.rows, H = m->cfg.hidden_size;
    r->final_norm = mc_malloc_array(H, sizeof(float));
    r->embed = mc_malloc_array((size_t)V * H, sizeof(float));
    if (!r->embed || !r->final_norm)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "rotated embeddings (%u x %u)", V, H);
    for (uint32_t j = 0; j < H; j++)
        r->final_norm[j] = 1.0f;
    for (uint32_t i = 0; i < V; i++) {
        kn_matrix_row(&m->embed, i, r->embed + (size_t)i * H);
        cmp_rotate_hidden(rot, r->embed + (size_t)i * H);
    }
    /* one V x H float32 matrix in memory at a time when spilling */
    mc_status st = r->spill ? cmp_spill_put(r->spill, (void **)&r->embed,
                                            (size_t)V * H * sizeof(float),
                                            "model.embed_tokens.weight", err)
                            : MC_OK;
    if (st != MC_OK)
        return st;
    r->lm_head_f32 = mc_malloc_array((size_t)V * H, sizeof(float));
    if (!r->lm_head_f32)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "rotated output layer (%u x %u)", V, H);
    for (uint32_t i = 0; i < V; i++)
        kn_matrix_row(&m->lm_head, i, r->lm_head_f32 + (size_t)i * H);
    cmp_rotate_input_rows(rot, r->lm_head_f32, V, m->final_norm);
    return MC_OK;
}

/* The run's buffers that live only while the layers are calibrated. */
typedef struct run_bufs {
    float *states, *states_f;   /* [tokens][hidden] */
    float *xtmp, *xtmp_f;       /* [maxT][hidden] */
    float *down_in;             /* [tokens][ffn] or NULL (seqs.down_in) */
    size_t *len;                /* calibration sequence lengths */
    cmp_fwd *f;
} run_bufs;

static void run_bufs_free(run_bufs *b)
{
    mc_free(b->states);
    mc_free(b->states_f);
    mc_free(b->xtmp);
    mc_free(b->xtmp_f);
    mc_free(b->down_in);
    mc_free(b->len);
    cmp_fwd_free(b->f);
    memset(b, 0, sizeof *b);
}

/* The options and sequences cmp_calib_run accepts: *ncal calibration
 * sequences of *ntok tokens, the longest *maxT. */
static mc_status check_opts(const rt_model *m, const size_t *off, size_t nseq,
                            const cmp_calib_opts *o, size_t *ncal, size_t *ntok,
                            size_t *maxT, mc_error *err)
{
    if (!cmp_quant_is_quantized(o->fmt) && !o->tensor_fmt)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "quant", -1,
                       "calibration needs a quantized format");
    /* every int4 matrix (linears, per-linear table, output layer) takes
     * o->group */
    int int4 = o->fmt == KN_W_Q4 || o->fmt == KN_W_Q4S ||
               o->lm_head_fmt == KN_W_Q4 || o->lm_head_fmt == KN_W_Q4S;
    for (size_t i = 0; o->tensor_fmt && i < (size_t)m->cfg.num_layers * CMP_LIN_COUNT; i++)
        int4 |= o->tensor_fmt[i] == KN_W_Q4 || o->tensor_fmt[i] == KN_W_Q4S;
    if (int4 && o->group != 32 && o->group != 64 && o->group != 128)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "group", -1,
                       "int4 group must be 32, 64 or 128, not %u", o->group);
    if (o->stages != 0 && o->stages != 1 && o->stages != 2 && o->stages != 4)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "stages", -1,
                       "statistics stages must be 1, 2 or 4, not %u", o->stages);
    if (nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                       "%zu sequences, %zu held out: nothing left to calibrate on",
                       nseq, o->heldout);
    *ncal = nseq - o->heldout;
    *ntok = *maxT = 0;
    for (size_t i = 0; i < *ncal; i++) {
        size_t T = off[i + 1] - off[i];
        *ntok += T;
        if (T > *maxT)
            *maxT = T;
        if (m->cfg.max_position_embeddings && T > m->cfg.max_position_embeddings)
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                           "sequence %zu has %zu tokens; the context is %llu", i,
                           T, (unsigned long long)m->cfg.max_position_embeddings);
    }
    if (*ntok == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                       "no calibration tokens");
    if (o->stats_on_gpu && !cmp_gpu_stats_available())
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                       "calibration statistics on the GPU asked for, but "
                       "there is no CUDA device (or this build has no CUDA)");
    return MC_OK;
}

/* With the statistics on the GPU: the device must hold the plan's most
 * (the statistics of up to three inputs at once) beside CUDA's own. */
static mc_status check_device(const cmp_calib_mem *mem, mc_error *err)
{
    uint64_t dfree = 0;
    mc_status st = cmp_gpu_stats_device_free(&dfree, err);
    if (st != MC_OK)
        return st;
    if (mem->device + CMP_GPU_STATS_MARGIN > dfree)
        return mc_fail(err, MC_ERR_NOMEM, NULL, "--calib-device", -1,
                       "the statistics need %.2f GiB of device memory (at %s) "
                       "and %.2f GiB is free, keeping %.2f GiB for CUDA: use "
                       "shorter calibration sequences or --calib-device cpu",
                       mem->device / 1073741824.0,
                       mem->device_phase ? mem->device_phase : "-",
                       dfree / 1073741824.0, CMP_GPU_STATS_MARGIN / 1073741824.0);
    return MC_OK;
}

/* Both state sets at the first block boundary: the embeddings of the
 * calibration sequences (rotated when the model is), into rb (allocated
 * here, with the forward context). */
static mc_status states_setup(const rt_model *m, const int32_t *tok,
                              const size_t *off, size_t ncal, size_t ntok,
                              size_t maxT, const cmp_calib_opts *o,
                              const cmp_rotation *rot, int store_down,
                              run_bufs *rb, mc_error *err)
{
    uint32_t H = m->cfg.hidden_size;
    if (store_down &&
        !(rb->down_in = mc_malloc_array(ntok * (size_t)m->cfg.intermediate_size,
                                        sizeof(float))))
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "down_proj's inputs (%zu tokens x %u)", ntok,
                       m->cfg.intermediate_size);
    rb->states = mc_malloc_array(ntok * H, sizeof(float));
    rb->states_f = mc_malloc_array(ntok * H, sizeof(float));
    rb->xtmp = mc_malloc_array(maxT * H, sizeof(float));
    rb->xtmp_f = mc_malloc_array(maxT * H, sizeof(float));
    rb->len = mc_malloc_array(ncal, sizeof(size_t));
    if (!rb->states || !rb->states_f || !rb->xtmp || !rb->xtmp_f || !rb->len)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "calibration states (%zu tokens x %u)", ntok, H);
    mc_status st = cmp_fwd_create(m, maxT, o->pool, &rb->f, err);
    if (st == MC_OK)
        cmp_fwd_set_bf16_dot(rb->f, o->fwd_f32 ? 0 : o->full_bf16 ? 2 : 1);
    size_t at = 0;
    for (size_t i = 0; i < ncal && st == MC_OK; i++) {
        rb->len[i] = off[i + 1] - off[i];
        st = cmp_fwd_embed(rb->f, tok + off[i], rb->len[i], rb->states + at * H, err);
        at += rb->len[i];
    }
    if (st != MC_OK)
        return st;
    if (rot)
        for (size_t t = 0; t < ntok; t++)
            cmp_rotate_hidden(rot, rb->states + t * H);
    memcpy(rb->states_f, rb->states, ntok * H * sizeof(float));
    return MC_OK;
}

/* Every block in order (cmp_calib_layer), the held-out states (held, or
 * NULL) moved through its source and its quantized weights, each
 * finished block spilled; progress after each. */
static mc_status layers_run(const rt_model *m, const cmp_calib_opts *o,
                            const cmp_rotation *rot, const run_bufs *rb,
                            size_t ncal, size_t maxT, cmp_heldout *held,
                            cmp_calib_result *r, mc_error *err)
{
    double t0 = now_s();
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        double tl = now_s();
        layer_ctx c;
        memset(&c, 0, sizeof c);
        c.o = o;
        c.rot = rot;
        c.r = r;
        c.l = l;
        /* past o->full_layers no later block reads the full-precision
         * states: every point lean, and they are not moved on */
        c.lean = r->mem.lean |
                 (o->full_layers && l >= o->full_layers ? 0xFu : 0u);
        c.acc.pool = o->pool;
        c.times = &r->times;
        seqs S = {rb->states, rb->states_f, rb->len, ncal, maxT, rb->xtmp,
                  rb->xtmp_f, rb->down_in};
        mc_status st = cmp_calib_layer(&c, m, rb->f, &S, err);
        cmp_calib_layer_free(&c);
        if (st == MC_OK && held) {
            /* now, while the source block is resident and the quantized
             * one in memory (before the spill) */
            cmp_clock th = cmp_par_clock();
            kn_block_weights qw;
            cmp_calib_result_block(r, l, &qw);
            cmp_heldout_block(held, &m->layers[l].w, &qw, &m->layers[l].dims);
            cmp_par_clock_add(&r->times.ends, th);
        }
        if (st == MC_OK)
            st = cmp_calib_spill_layer(r, l, err);
        if (st != MC_OK)
            return st;
        /* the block's source is done with (its float copies made, its
         * moves and the held-out states' run): out of the resident set,
         * so the plan counts one block of it, not the model */
        for (int s = 0; s < CMP_LIN_COUNT; s++) {
            const kn_matrix *w = cmp_calib_src_matrix(&m->layers[l].w, s);
            if (w->data)
                r->source_dropped += fmt_mapguard_drop(
                    w->data, (size_t)kn_wformat_data_bytes(w->fmt, w->rows, w->cols));
        }
        r->layer_seconds[l] = now_s() - tl;
        if (o->progress) {
            cmp_calib_progress p;
            p.plan = NULL;
            p.layer = l + 1;
            p.layers = m->cfg.num_layers;
            p.elapsed_s = now_s() - t0;
            p.eta_s = p.elapsed_s / (l + 1) * (m->cfg.num_layers - l - 1);
            o->progress(o->progress_ctx, &p);
        }
    }
    return MC_OK;
}

/* The output layer quantized as the artifact stores it (o->lm_head_fmt,
 * RTN, as the writer rounds it): the rotated one, or the model's. */
static mc_status lm_head_quant(const rt_model *m, const cmp_calib_opts *o,
                               cmp_calib_result *r, mc_error *err)
{
    const kn_matrix *lm = &m->lm_head;
    kn_wformat f = o->lm_head_fmt;
    float *w = r->rotated ? r->lm_head_f32
                          : mc_malloc_array((size_t)lm->rows * lm->cols, sizeof(float));
    if (!w || cmp_calib_qbuf_alloc(&r->lm_head, f, lm->rows, lm->cols,
                                   o->group) != MC_OK) {
        if (!r->rotated)
            mc_free(w);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "lm_head", -1, "output layer");
    }
    if (!r->rotated)
        for (uint32_t i = 0; i < lm->rows; i++)
            kn_matrix_row(lm, i, w + (size_t)i * lm->cols);
    /* unrotated, it is a tied model's embedding: f16-exact row scales, as
     * the writer quantizes it (cmp_compile_qbuf) */
    if (f == KN_W_Q8 && !r->rotated && m->cfg.tie_word_embeddings)
        r->lm_head.q8scale = CMP_Q8_EMBED;
    mc_status st = cmp_quant_matrix(w, NULL, &r->lm_head, err);
    if (!r->rotated)
        mc_free(w);
    if (st == MC_OK)
        st = cmp_calib_spill_qbuf(r, &r->lm_head, "lm_head.weight", err);
    return st;
}

/* After the layers: the rotated ends, the quantized output layer, the spill
 * mapped back, the held-out summary from the carried states (held, or
 * NULL for none). */
static mc_status ends_run(const rt_model *m, cmp_heldout *held,
                          const cmp_calib_opts *o, const cmp_rotation *rot,
                          cmp_calib_result *r, mc_error *err)
{
    mc_status st = MC_OK;
    if (r->rotated && (st = rotate_ends(m, rot, r, err)) != MC_OK)
        return st;
    if (cmp_quant_is_quantized(o->lm_head_fmt) &&
        (st = lm_head_quant(m, o, r, err)) != MC_OK)
        return st;
    if (r->spill && r->lm_head_f32 &&
        (st = cmp_spill_put(r->spill, (void **)&r->lm_head_f32,
                            (size_t)m->lm_head.rows * m->lm_head.cols * sizeof(float),
                            "lm_head.weight", err)) != MC_OK)
        return st;
    if (r->spill && (st = cmp_spill_map(r->spill, err)) != MC_OK)
        return st;
    if (held) {
        rt_model view;
        if ((st = cmp_calib_view(m, r, &view, err)) != MC_OK)
            return st;
        st = cmp_heldout_report(held, m, &view, o->pool, &r->heldout, err);
        cmp_calib_view_free(&view);
        if (st != MC_OK)
            return st;
        r->has_heldout = 1;
    }
    return MC_OK;
}

mc_status cmp_calib_run(const rt_model *m, const int32_t *tok,
                        const size_t *off, size_t nseq,
                        const cmp_calib_opts *o, cmp_calib_result **out,
                        mc_error *err)
{
    *out = NULL;
    size_t ncal = 0, ntok = 0, maxT = 0;
    mc_status st = check_opts(m, off, nseq, o, &ncal, &ntok, &maxT, err);
    cmp_calib_mem mem;
    if (st == MC_OK)
        st = cmp_calib_plan_memory(&m->cfg, off, nseq, o, &mem, err);
    if (st == MC_OK && o->stats_on_gpu)
        st = check_device(&mem, err);
    if (st != MC_OK)
        return st;
    cmp_calib_result *r = NULL;
    st = cmp_calib_result_create(m, &r, err);
    run_bufs rb;
    memset(&rb, 0, sizeof rb);
    cmp_rotation rot;
    memset(&rot, 0, sizeof rot);
    cmp_heldout *held = NULL;
    if (st != MC_OK)
        goto fail;
    r->calib_tokens = ntok;
    r->mem = mem;
    r->full_bf16 = !o->fwd_f32 && o->full_bf16;
    /* the plan, told before anything large is allocated */
    cmp_calib_plan_make(m, ntok, maxT, off + ncal, nseq - ncal, o, &mem,
                        o->progress ? 0.0 : -1.0, &r->plan);
    if (o->progress) {
        cmp_calib_progress p;
        memset(&p, 0, sizeof p);
        p.plan = &r->plan;
        p.layers = m->cfg.num_layers;
        p.eta_s = r->plan.total_s;
        o->progress(o->progress_ctx, &p);
    }
    if (o->spill_dir && (st = cmp_spill_create(o->spill_dir, &r->spill, err)) != MC_OK)
        goto fail;
    if (o->rotate && (st = rotation_setup(m, o, r, &rot)) != MC_OK) {
        (void)mc_fail(err, st, NULL, NULL, -1, "rotation (out of memory)");
        goto fail;
    }
    const cmp_rotation *rp = r->rotated ? &rot : NULL;
    /* the quantized model embeds as the artifact will: the rotated rows,
     * or an unrotated tied model's quantized output layer, in the stored
     * format */
    kn_wformat embed_fmt = !r->rotated && m->cfg.tie_word_embeddings &&
                                   cmp_quant_is_quantized(o->lm_head_fmt)
                               ? o->lm_head_fmt
                               : o->embed_fmt;
    if (o->heldout > 0) {
        cmp_clock th = cmp_par_clock();
        st = cmp_heldout_create(m, tok, off + ncal, o->heldout, rp,
                                embed_fmt, o->group,
                                o->pool, &held, err);
        cmp_par_clock_add(&r->times.ends, th);
        if (st != MC_OK)
            goto fail;
    }
    if ((st = states_setup(m, tok, off, ncal, ntok, maxT, o, rp,
                           cmp_calib_stores_down(o, mem.lean), &rb, err)) != MC_OK ||
        (st = layers_run(m, o, rp, &rb, ncal, maxT, held, r, err)) != MC_OK)
        goto fail;
    /* The states and the forward contexts are done with: free them before
     * the ends allocate theirs (the held-out states stay). */
    run_bufs_free(&rb);
    cmp_heldout_blocks_done(held);
    cmp_clock t_ends = cmp_par_clock();
    if ((st = ends_run(m, held, o, &rot, r, err)) != MC_OK)
        goto fail;
    cmp_par_clock_add(&r->times.ends, t_ends);
    cmp_heldout_free(held);
    cmp_rotation_free(&rot);
    *out = r;
    return MC_OK;
fail:
    cmp_heldout_free(held);
    cmp_rotation_free(&rot);
    run_bufs_free(&rb);
    cmp_calib_result_free(r);
    return st;
}

/* cmp_compile_calib.c - the calibrated path of cmp_compile (--calib,
 * --quant auto): the float model the calibration sees (the LoRA merge
 * applied in memory when adapters are given), the automatic per-linear
 * precision, and cmp_calib_run.  See cmp_compile.h. */
#include "cmp_compile_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_calib_budget.h"
#include "mc_parse.h"
#include "cmp_calib_data.h"
#include "cmp_rotate.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"

static const char *const LIN_SUFFIX[CMP_LIN_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
    "mlp.down_proj"};

int cmp_compile_tensor_kind(const char *name, uint32_t *layer, int *slot)
{
    static const char pre[] = "model.layers.";
    *slot = -1;
    if (strncmp(name, pre, sizeof pre - 1) != 0)
        return CMP_TK_OTHER;
    const char *p = name + sizeof pre - 1;
    uint32_t l = 0;
    if (*p < '0' || *p > '9')
        return CMP_TK_OTHER;
    while (*p >= '0' && *p <= '9' && l < 100000000u)
        l = l * 10 + (uint32_t)(*p++ - '0');
    if (*p++ != '.')
        return CMP_TK_OTHER;
    *layer = l;
    if (strcmp(p, "input_layernorm.weight") == 0)
        return CMP_TK_ATTN_NORM;
    if (strcmp(p, "post_attention_layernorm.weight") == 0)
        return CMP_TK_MLP_NORM;
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        size_t n = strlen(LIN_SUFFIX[s]);
        if (strncmp(p, LIN_SUFFIX[s], n) != 0)
            continue;
        *slot = s;
        if (strcmp(p + n, ".weight") == 0)
            return CMP_TK_WEIGHT;
        if (strcmp(p + n, ".bias") == 0)
            return CMP_TK_BIAS;
    }
    *slot = -1;
    return CMP_TK_OTHER;
}

void cmp_calib_stage_free(cmp_calib_stage *s)
{
    if (!s)
        return;
    cmp_calib_result_free(s->r);
    rt_model_free(s->m); /* before the merged buffers it points into */
    for (size_t i = 0; i < s->n_merged; i++)
        mc_free(s->merged[i]);
    mc_free(s->merged);
    fmt_ids_free(s->ids);
    mc_free(s->sub_tok);
    mc_free(s->sub_off);
    cmp_auto_free(&s->autoplan);
    kn_pool_free(s->pool);
    memset(s, 0, sizeof *s);
}

static kn_matrix *block_matrix(kn_block_weights *w, int slot)
{
    kn_matrix *m[CMP_LIN_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                   &w->w_gate, &w->w_up, &w->w_down};
    return m[slot];
}

static const float **block_bias(kn_block_weights *w, int slot)
{
    const float **b[CMP_LIN_COUNT] = {&w->bq, &w->bk, &w->bv, &w->bo,
                                      &w->b_gate, &w->b_up, &w->b_down};
    return b[slot];
}

/* Point every tensor of m that an adapter changes at its merged float32
 * values (kept in s->merged), so the calibration sees the merged model.
 * The merge's config (an untied lm_head) is applied too. */
static mc_status apply_merge(cmp_calib_stage *s, cmp_merge *merge,
                             const fmt_model_config *cfg, mc_error *err)
{
    rt_model *m = s->m;
    size_t n = cmp_merge_tensor_count(merge);
    s->merged = mc_calloc(n ? n : 1, sizeof *s->merged);
    if (!s->merged)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "merged model");
    if (cmp_merge_unties_lm_head(merge))
        m->cfg.tie_word_embeddings = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = cmp_merge_tensor_name(merge, i);
        fmt_dtype dt;
        int ndim, touched = 0;
        uint64_t shape[FMT_ST_MAX_DIMS];
        if (!cmp_merge_tensor_info(merge, name, &dt, &ndim, shape, &touched))
            continue;
        int untie = strcmp(name, "lm_head.weight") == 0 &&
                    cmp_merge_unties_lm_head(merge);
        if (!touched && !untie)
            continue;
        uint64_t ne = 1;
        for (int d = 0; d < ndim; d++)
            ne *= shape[d];
        kn_matrix *mat = NULL;
        const float **vec = NULL;
        uint32_t layer = 0;
        int slot, kind = cmp_compile_tensor_kind(name, &layer, &slot);
        if (kind != CMP_TK_OTHER && layer >= cfg->num_layers)
            continue; /* not part of the compiled model */
        kn_block_weights *w = kind != CMP_TK_OTHER ? &m->layers[layer].w : NULL;
        if (strcmp(name, "model.embed_tokens.weight") == 0)
            mat = &m->embed;
        else if (strcmp(name, "lm_head.weight") == 0)
            mat = &m->lm_head;
        else if (strcmp(name, "model.norm.weight") == 0)
            vec = &m->final_norm;
        else if (kind == CMP_TK_WEIGHT)
            mat = block_matrix(w, slot);
        else if (kind == CMP_TK_BIAS)
            vec = block_bias(w, slot);
        else if (kind == CMP_TK_ATTN_NORM)
            vec = &w->attn_norm;
        else if (kind == CMP_TK_MLP_NORM)
            vec = &w->mlp_norm;
        if ((!mat && !vec) || (vec && !*vec))
            continue; /* a tensor the compiled model does not use (e.g. a
                         bias its config has not) */
        if (mat && (ndim != 2 || shape[0] != mat->rows || shape[1] != mat->cols))
            return mc_fail(err, MC_ERR_SHAPE, NULL, name, -1,
                           "merged tensor '%s' does not match the model's "
                           "shape [%u, %u]", name, mat->rows, mat->cols);
        float *buf = mc_malloc_array((size_t)ne, sizeof(float));
        if (!buf)
            return mc_fail(err, MC_ERR_NOMEM, NULL, name, -1,
                           "merged float32 copy of '%s'", name);
        s->merged[s->n_merged++] = buf;
        mc_status st = cmp_merge_tensor_f32(merge, name, buf, err);
        if (st != MC_OK)
            return st;
        if (mat) {
            kn_matrix f = {KN_W_F32, mat->rows, mat->cols, buf, NULL, NULL, 0, KN_LAYOUT_ROWS};
            *mat = f;
        } else {
            *vec = buf;
        }
    }
    if (m->cfg.tie_word_embeddings)
        m->lm_head = m->embed; /* a merged embedding is the output layer too */
    return MC_OK;
}

/* Bytes of every tensor that is not a linear layer, as compiled. */
static mc_status other_bytes(const fmt_model_config *cfg, const cmp_wpolicy *p,
                             uint64_t *out, mc_error *err)
{
    cmp_tensor_plan *t = NULL;
    size_t n = 0;
    mc_status st = cmp_plan_tensors(cfg, p, &t, &n, err);
    if (st != MC_OK)
        return st;
    *out = 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].role != CMP_ROLE_LINEAR)
            *out += t[i].data_bytes + t[i].scale_bytes + t[i].zero_bytes;
    mc_free(t);
    return MC_OK;
}

/* The calibration's budget: --calib-memory, else 75 % of physical memory
 * (the rest for the model's mapped pages, the artifact writer and the
 * system); 0 when unknown (no limit). */
static uint64_t calib_budget(const cmp_compile_opts *o)
{
    if (o->calib_memory)
        return o->calib_memory;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return 0;
    return (uint64_t)pages / 4 * 3 * (uint64_t)page;
}

/* The directory of path ("." for a bare name) into buf. */
static const char *dir_of(const char *path, char *buf, size_t n)
{
    snprintf(buf, n, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else if (slash == buf)
        buf[1] = '\0';
    else
        *slash = '\0';
    return buf;
}

/* The efforts the user named, which neither a budget nor the cap cuts. */
static unsigned fixed_effort(const cmp_compile_opts *o)
{
    return (o->method_fixed ? CMP_EFFORT_FIXED_METHOD : 0u) |
           (o->calib_refine_fixed ? CMP_EFFORT_FIXED_REFINE : 0u);
}

/* The default cap (--calib-passes): the first effort of the method
 * moves within o->calib_passes forward passes, from nominal estimates
 * (the same choice on every machine; cmp_calib_budget.h).  The run's
 * plan measures its own rate. */
static mc_status cap_effort(const cmp_compile_opts *o, cmp_calib_stage *s,
                            const cmp_calib_opts *co, const size_t *off,
                            size_t nseq, size_t ncal, mc_error *err)
{
    size_t *o2 = NULL;
    mc_status st = cmp_calib_subset(NULL, off, nseq, ncal, s->effort.seqs,
                                    NULL, &o2, err);
    if (st != MC_OK)
        return st;
    st = cmp_calib_effort_within_passes(s->m, o2, s->effort.seqs + s->heldout,
                                        co, fixed_effort(o), o->calib_passes,
                                        CMP_CALIB_PASSES_FLOOR_S, &s->effort,
                                        &s->most, &s->cap_s, err);
    mc_free(o2);
    s->capped = st == MC_OK &&
                memcmp(&s->effort, &s->most, sizeof s->effort) != 0;
    if (s->capped && o->capped)
        o->capped(o->progress_ctx, &s->effort, &s->most, o->calib_passes);
    return st;
}

/* --calib-time: the effort whose estimate fits (cmp_calib_budget.h),
 * from s->effort (the options' effort) down, at a rate measured once
 * (the run's plan then uses the same rate: co->plan_rate). */
static mc_status choose_effort(const cmp_compile_opts *o, cmp_calib_stage *s,
                               cmp_calib_opts *co, const size_t *off,
                               size_t nseq, size_t ncal, mc_error *err)
{
    if (s->is_auto)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib-time", -1,
                       "a time budget does not cover --quant auto's "
                       "measuring pass; use --quant int8, int4 or "
                       "int4-sym");
    size_t *o2 = NULL, maxT = 0;
    mc_status st = cmp_calib_subset(NULL, off, nseq, ncal, s->effort.seqs,
                                    NULL, &o2, err);
    if (st != MC_OK)
        return st;
    for (size_t i = 0; i < s->effort.seqs; i++)
        if (o2[i + 1] - o2[i] > maxT)
            maxT = o2[i + 1] - o2[i];
    /* MC_CALIB_RATE (multiply-adds per second) replaces the measurement:
     * the same budget then makes the same choice on any machine and
     * load (reproducible budgets; the tests' fixed point). */
    const char *fixed = getenv("MC_CALIB_RATE");
    if (fixed && *fixed) {
        char why[160];
        if (mc_parse_f64("MC_CALIB_RATE", fixed, 0.0, 1e15, MC_PARSE_LO_OPEN,
                         &co->plan_rate, why, sizeof why) != 0) {
            mc_free(o2);
            return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "MC_CALIB_RATE", -1,
                           "%s", why);
        }
    } else {
        co->plan_rate = cmp_calib_measure_rate(co->pool, &s->m->cfg, maxT);
    }
    st = cmp_calib_effort_choose(s->m, o2, s->effort.seqs + s->heldout, co,
                                 fixed_effort(o), o->calib_time_s,
                                 co->plan_rate, &s->effort, &s->most, err);
    mc_free(o2);
    return st;
}

mc_status cmp_calib_stage_run(const cmp_compile_opts *o,
                              fmt_model_config *cfg, cmp_merge *merge,
                              cmp_plan_request *req, cmp_calib_stage *s,
                              mc_error *err)
{
    memset(s, 0, sizeof *s);
    if (!o->calib)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib", -1,
                       "--quant auto needs calibration data: --calib FILE");
    kn_wformat lin = req->policy.linear;
    if (!o->quant_auto && !cmp_quant_is_quantized(lin))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--calib", -1,
                       "--calib quantizes the linear layers: use it with "
                       "--quant int8, int4, int4-sym or auto (not %s)",
                       req->policy.quant);
    if (o->quant_auto && (!req->max_batch || !req->max_seq))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--quant", -1,
                       "--quant auto needs --max-batch and --max-seq (the "
                       "budget is the weights plus their KV cache)");
    /* text is cut into sequences of at most 512 tokens or the context */
    uint32_t text_seq = cfg->max_position_embeddings &&
                                cfg->max_position_embeddings <
                                    CMP_CALIB_DATA_DEFAULT_SEQ
                            ? (uint32_t)cfg->max_position_embeddings
                            : 0;
    cmp_calib_source src = {0, 0};
    mc_status st = cmp_calib_data_load(o->calib, o->model, cfg->vocab_size,
                                       text_seq, &s->ids, NULL, &src, err);
    s->calib_xxh3 = src.xxh3;
    s->calib_bytes = src.bytes;
    if (st == MC_OK)
        st = rt_model_open_hf(o->model, &s->m, err);
    if (st == MC_OK && merge)
        st = apply_merge(s, merge, cfg, err);
    if (st != MC_OK)
        return st;
    if (o->threads != 1 && !(s->pool = kn_pool_create(o->threads)))
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "thread pool");
    size_t nseq = s->ids->n_seqs;
    if (o->heldout == 0)
        s->heldout = nseq >= 2 ? (nseq / 10 ? nseq / 10 : 1) : 0;
    else if (o->heldout < 0)
        s->heldout = 0;
    else if ((size_t)o->heldout < nseq)
        s->heldout = (size_t)o->heldout;
    else
        return mc_fail(err, MC_ERR_INVALID_ARG, o->calib, "--heldout", -1,
                       "%ld sequences held out of %zu: none left to "
                       "calibrate on", o->heldout, nseq);
    size_t ncal = nseq - s->heldout;
    const int32_t *tok = s->ids->ids;
    const size_t *off = s->ids->offsets;
    int rotate = o->rotate && cmp_rotation_applies(cfg->hidden_size);
    /* the rotated output layer differs from the embeddings */
    if (rotate)
        cmp_plan_untie_for_rotation(cfg, &req->policy,
                                    s->m->embed.fmt == KN_W_F32);
    /* What both calibration runs share: threads, rotation, the memory
     * budget, the spill directory, the device for the statistics. */
    cmp_calib_opts co;
    memset(&co, 0, sizeof co);
    co.rotate = rotate;
    co.pool = s->pool;
    co.mem_budget = calib_budget(o);
    co.stats_on_gpu = o->calib_gpu;
    co.stats_f32 = o->calib_stats_f32;
    co.fwd_f32 = o->calib_fwd_f32;
    char dir[4096];
    co.spill_dir = o->out ? dir_of(o->out, dir, sizeof dir) : NULL;
    if (o->quant_auto) {
        uint32_t group = req->policy.group ? req->policy.group : 128;
        cmp_wpolicy keep = req->policy; /* the lm_head choices survive */
        if ((st = cmp_wpolicy_parse("int4", group, &req->policy, err)) != MC_OK)
            return st;
        req->policy.lm_head_float = keep.lm_head_float;
        req->policy.lm_head_set = keep.lm_head_set;
        req->policy.lm_head_fmt = keep.lm_head_fmt;
        uint64_t other;
        if ((st = other_bytes(cfg, &req->policy, &other, err)) != MC_OK ||
            (st = cmp_auto_measure(s->m, tok, off, ncal, group, &co,
                                   &s->autoplan, err)) != MC_OK)
            return st;
        s->is_auto = 1;
        if ((st = cmp_auto_choose(&s->autoplan, cfg, req, other, err)) != MC_OK)
            return st;
        snprintf(req->policy.quant, sizeof req->policy.quant, "auto");
        req->policy.linear_fmt = s->autoplan.tensor_fmt;
    }
    co.fmt = req->policy.linear;
    co.group = req->policy.group;
    co.full_bf16 = !o->calib_fwd_f32 &&
                   (o->calib_full_pass == CMP_FULL_PASS_DEFAULT
                        ? cmp_calib_default_full_bf16(co.fmt, s->is_auto)
                        : o->calib_full_pass == CMP_FULL_PASS_BF16);
    co.method = o->method;
    co.awq_coarse = !o->awq_full_grid;
    co.baseline_rows = o->calib_baseline_rows;
    co.tensor_fmt = req->policy.linear_fmt;
    co.heldout = s->heldout;
    /* the held-out summary sees the output layer the artifact stores, in
     * the plan's format, rounded as the writer rounds it (RTN): the
     * rotated one, the model's own, or a tied model's embedding
     * (cmp_calib_view looks tokens up in it) */
    co.embed_fmt = cmp_plan_role_format(&req->policy, CMP_ROLE_EMBED,
                                        cfg->tie_word_embeddings);
    co.lm_head_fmt = cfg->tie_word_embeddings
                         ? cmp_plan_role_format(&req->policy, CMP_ROLE_EMBED, 1)
                         : cmp_plan_role_format(&req->policy, CMP_ROLE_LM_HEAD, 0);
    co.progress = o->progress;
    co.progress_ctx = o->progress_ctx;
    co.stages = o->calib_stages;
    if (o->calib_seqs > ncal)
        return mc_fail(err, MC_ERR_INVALID_ARG, o->calib, "--calib-seqs", -1,
                       "%zu calibration sequences asked; the file has %zu "
                       "besides the %zu held out", o->calib_seqs, ncal,
                       s->heldout);
    s->effort.stages = o->calib_stages ? o->calib_stages : CMP_CALIB_STAGES_DEFAULT;
    s->effort.method = o->method;
    s->effort.seqs = o->calib_seqs ? o->calib_seqs : ncal;
    /* every block (or more): no cut, and no option to reproduce it; a
     * method without the full-precision pass has nothing to cut */
    uint32_t full = !cmp_calib_method_asymmetric(o->method) ? 0
                    : o->calib_full_layers
                        ? o->calib_full_layers
                        : cmp_calib_default_full_layers(co.fmt, s->is_auto,
                                                        s->m->cfg.num_layers);
    s->effort.full_layers = full < s->m->cfg.num_layers ? full : 0;
    co.full_layers = s->effort.full_layers;
    s->effort.no_refine = o->calib_no_refine;
    co.no_refine = s->effort.no_refine;
    if (o->calib_time_s > 0.0) {
        if ((st = choose_effort(o, s, &co, off, nseq, ncal, err)) != MC_OK)
            return st;
    } else if (o->calib_passes > 0.0 && !s->is_auto) {
        if ((st = cap_effort(o, s, &co, off, nseq, ncal, err)) != MC_OK)
            return st;
    }
    co.stages = s->effort.stages;
    co.method = s->effort.method;
    co.full_layers = s->effort.full_layers;
    co.no_refine = s->effort.no_refine;
    if (s->effort.seqs < ncal) {
        if ((st = cmp_calib_subset(tok, off, nseq, ncal, s->effort.seqs,
                                   &s->sub_tok, &s->sub_off, err)) != MC_OK)
            return st;
        tok = s->sub_tok;
        off = s->sub_off;
        nseq = s->effort.seqs + s->heldout;
    }
    return cmp_calib_run(s->m, tok, off, nseq, &co, &s->r, err);
}

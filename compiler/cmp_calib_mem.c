/* cmp_calib_mem.c - what cmp_calib_run holds in memory, phase by phase,
 * and the lean-statistics plan that fits a budget (see cmp_calib.h).
 *
 * Every term below names the allocation in cmp_calib.c,
 * cmp_calib_group.c, cmp_gptq.c, cmp_awq.c or cmp_eval.c that it counts;
 * a change to one of those must change its term here
 * (test_calib_memory checks the estimate against mc_alloc's measured
 * peak). */
#include <stdio.h>
#include <string.h>

#include "cmp_awq.h"
#include "cmp_calib_internal.h"
#include "cmp_descend.h"
#include "cmp_gpu_stats.h"
#include "cmp_gptq.h"
#include "kn_stats_bytes.h"
#include "mc_alloc.h"

/* One allocation of b bytes as the heap holds it (malloc_usable_size, what
 * mc_alloc's tracking counts): glibc rounds a small block up by at most 24
 * bytes and a mapped one (from 128 KiB, or more as its threshold adapts)
 * to whole pages. */
static uint64_t blk(uint64_t b)
{
    return b + (b >= 65536 ? 4096 : 32);
}

/* A call's work space given as its exact request total (the cmp_*_bytes
 * functions), spread over at most a dozen blocks. */
static uint64_t work(uint64_t b)
{
    return b + 12 * 32 + (b >= 65536 ? 2 * 4096 : 0);
}

typedef struct mem_ctx {
    const fmt_model_config *cfg;
    const cmp_calib_opts *o;
    uint32_t rows[CMP_LIN_COUNT], cols[CMP_LIN_COUNT];
    uint32_t width[4];
    size_t maxT;
    int threads; /* the pool's: the row-parallel work space per thread */
    int down_out; /* cmp_calib_down_from_outputs for this lean */
    int refit_hw; /* the refits keep H w (no CMP_CALIB_LEAN_REFIT_HW) */
} mem_ctx;

static uint64_t qbytes(kn_wformat f, uint32_t rows, uint32_t cols,
                       uint32_t group)
{
    if (!cmp_quant_is_quantized(f))
        return 0;
    uint32_t g = f == KN_W_Q8 ? 0 : group;
    uint64_t z = kn_wformat_zero_bytes(f, rows, cols, g);
    return blk(kn_wformat_data_bytes(f, rows, cols)) +
           blk(kn_wformat_scale_bytes(f, rows, cols, g)) + (z ? blk(z) : 0);
}

static kn_wformat fmt_of(const mem_ctx *m, uint32_t l, int slot)
{
    return m->o->tensor_fmt ? m->o->tensor_fmt[(size_t)l * CMP_LIN_COUNT + slot]
                            : m->o->fmt;
}

static uint64_t u64max(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

/* Device bytes of tap point p's statistics on the GPU (cmp_gpu_stats). */
static uint64_t stats_device(const mem_ctx *m, int p, int full)
{
    return m->o->stats_on_gpu ? kn_stats_device_bytes(m->width[p], m->maxT, full) : 0;
}

/* stats_alloc in cmp_calib.c. */
static uint64_t stats_bytes(const mem_ctx *m, int p, int full)
{
    uint64_t w = m->width[p];
    uint64_t b = work(cmp_hessian_bytes((uint32_t)w)) + blk(w * 8) + blk(w * 4);
    if (full && p == KN_TAP_DOWN_IN && m->down_out) {
        /* W C, this sequence's y_f and the rows' energies instead of
         * Hf, C and x_f */
        uint64_t R = m->rows[CMP_LIN_DOWN];
        return b + blk(R * w * 8) + blk(m->maxT * R * 4) + blk(R * 8);
    }
    if (full)
        b += work(cmp_hessian_bytes((uint32_t)w)) + blk(w * w * 8);
    if (m->o->stats_on_gpu) /* x_f lives on the device; a read buffer here */
        b += blk(64) + blk(cmp_gpu_stats_read_bytes((uint32_t)w));
    else if (full)
        b += blk(m->maxT * w * 4);
    return b;
}

/* The statistics of the tap points in `points` (bit KN_TAP_*), host
 * bytes or (device) device bytes. */
static uint64_t live_stats(const mem_ctx *m, unsigned lean, unsigned points,
                           int device)
{
    uint64_t b = 0;
    for (int p = 0; p < 4; p++) {
        int full = !((lean >> p) & 1u);
        if ((points >> p) & 1u)
            b += device ? stats_device(m, p, full) : stats_bytes(m, p, full);
    }
    return b;
}

/* The points of the stage that collects tap point p. */
static unsigned stage_of(uint32_t stages, int p)
{
    for (unsigned k = 0; cmp_calib_stage_points(stages, k); k++)
        if ((cmp_calib_stage_points(stages, k) >> p) & 1u)
            return cmp_calib_stage_points(stages, k);
    return 1u << p;
}

/* run_candidate's work for one linear, over every candidate method the
 * group may try (cmp_calib_group.c): ws and wc, then the largest of
 * retarget, AWQ clipping, GPTQ, the scale refit, the code descent and the
 * error measures. */
static uint64_t candidate_bytes(const mem_ctx *m, int slot, kn_wformat f,
                                int lean, int multi, int refit_hw)
{
    uint32_t R = m->rows[slot], K = m->cols[slot];
    cmp_qmethod meth = m->o->method;
    int best = cmp_calib_is_best(meth);
    int gptq = best || meth == CMP_QM_GPTQ || meth == CMP_QM_GPTAQ ||
               meth == CMP_QM_AWQ_GPTQ || meth == CMP_QM_AWQ_GPTAQ;
    int retarget = !lean && (best || meth == CMP_QM_GPTAQ || meth == CMP_QM_AWQ_GPTAQ);
    int awq = best || cmp_calib_is_awq(meth);
    uint32_t group = f == KN_W_Q8 ? 0 : m->o->group;
    uint32_t ngroups = f == KN_W_Q8 ? 1 : (K + m->o->group - 1) / m->o->group;
    int T = m->threads;
    /* the error measures: output errors and the cross term (the same
     * tiled passes, cmp_qform.h) */
    uint64_t measure = work(cmp_hessian_output_error_par_work_bytes(K, R, T));
    uint64_t inner = measure;
    if (retarget)
        inner = u64max(inner, work(cmp_gptq_retarget_work_bytes(K, T)));
    if (awq)
        inner = u64max(inner, work(cmp_awq_clip_work_bytes(K, f, group)));
    if (gptq) {
        /* the group's GPTQ factor (cmp_gptq_factor) is held through the
         * refit and the second pass, and, when the group has more than one
         * quantized linear, through the descent and the measures too; the
         * quantize term counts its own U, which stands for the factor's
         * (quantize then allocates none) */
        uint64_t fb = blk((uint64_t)K * K * sizeof(double)) + blk((uint64_t)K * 4);
        uint64_t fm = multi ? fb : 0;
        /* from the first refit to the last, the refits' H w
         * (CMP_CALIB_LEAN_REFIT_HW): through the second pass too */
        int refine = !m->o->no_refine; /* no refits, second pass, descent */
        int second = refine && cmp_calib_second_pass(f, meth);
        uint64_t hw = refine && refit_hw ? blk(cmp_gptq_refit_hw_bytes(R, K)) : 0;
        uint64_t quant = work(cmp_gptq_work_bytes(R, K, 128, T));
        uint64_t g = refine ? work(cmp_gptq_refit_work_bytes(K, ngroups, T)) + fb : 0;
        if (refine)
            g = u64max(g, work(cmp_descend_work_bytes(K, T)) + fm);
        /* the second pass (cmp_calib_second_pass) measures its two errors
         * with the factor still held, whatever the group */
        g = u64max(g, measure + (second ? fb : fm));
        if (second)
            g = u64max(g, quant);
        g = u64max(g + hw, quant);
        /* the second pass's second set of buffers and dequantized copy */
        if (second)
            g += qbytes(f, R, K, m->o->group) + blk((uint64_t)R * K * sizeof(float));
        inner = u64max(inner, g);
    }
    return 2 * blk((uint64_t)R * K * sizeof(float)) + inner;
}

/* cmp_calib_quant_group's work for the group of slots[0..n): the best and
 * current buffers of every quantized linear, AWQ's scales and scaled
 * Hessian where the group may be scaled, and the largest candidate. */
static uint64_t group_bytes(const mem_ctx *m, uint32_t l, const int *slots,
                            int n, int allow_scale, int lean)
{
    uint64_t bufs = 0, cand = 0;
    uint32_t C = m->cols[slots[0]], maxrows = 0;
    int nq = 0;
    for (int i = 0; i < n; i++)
        nq += cmp_quant_is_quantized(fmt_of(m, l, slots[i]));
    for (int i = 0; i < n; i++) {
        kn_wformat f = fmt_of(m, l, slots[i]);
        if (!cmp_quant_is_quantized(f))
            continue;
        bufs += 2 * qbytes(f, m->rows[slots[i]], C, m->o->group);
        cand = u64max(cand, candidate_bytes(m, slots[i], f, lean, nq > 1, m->refit_hw));
        if (m->rows[slots[i]] > maxrows)
            maxrows = m->rows[slots[i]];
    }
    if (bufs == 0)
        return 0;
    cmp_qmethod meth = m->o->method;
    if (allow_scale && (cmp_calib_is_best(meth) || cmp_calib_is_awq(meth))) {
        uint64_t s = blk((uint64_t)C * sizeof(float));
        uint64_t search = s + work(cmp_awq_search_work_bytes(maxrows, C, m->threads,
                                                             CMP_AWQ_SAMPLE_ROWS));
        uint64_t scaled = s + work(cmp_hessian_bytes(C)) + cand;
        return bufs + u64max(u64max(search, scaled), cand);
    }
    return bufs + cand;
}

static void take(cmp_calib_mem *best, const cmp_calib_mem *cur)
{
    uint64_t total = cur->states + cur->forward + cur->result + cur->block +
                     cur->stats + cur->work + cur->ends;
    uint64_t device = best->device;
    const char *device_phase = best->device_phase;
    if (cur->device > device) {
        device = cur->device;
        device_phase = cur->phase;
    }
    uint64_t ends_peak = best->ends_peak;
    if (cur->phase && (!strcmp(cur->phase, "ends") || !strcmp(cur->phase, "held-out")) &&
        total > ends_peak)
        ends_peak = total;
    if (total > best->peak) {
        *best = *cur;
        best->peak = total;
    }
    best->ends_peak = ends_peak;
    best->device = device;
    best->device_phase = device_phase;
}

static const int G_QKV[3] = {CMP_LIN_Q, CMP_LIN_K, CMP_LIN_V};
static const int G_O[1] = {CMP_LIN_O}, G_GU[2] = {CMP_LIN_GATE, CMP_LIN_UP};
static const int G_DOWN[1] = {CMP_LIN_DOWN};

/* Block l's phases into *out (cur: the states and forward context set;
 * result: what the result holds before the block): the copies, the first
 * stage's pass with AWQ's pre-scaling, then each group's quantization
 * with the statistics still live.  Returns the bytes the block leaves in
 * the result (its quantized linears and float-kept copies). */
static uint64_t layer_phases(const mem_ctx *m, unsigned lean, uint32_t l,
                             int rotate, uint64_t result, cmp_calib_mem *cur,
                             cmp_calib_mem *out)
{
    const cmp_calib_opts *o = m->o;
    uint64_t H = m->width[0], qd = m->width[1], F = m->width[3];
    int pre = cmp_calib_is_awq(o->method) || cmp_calib_is_best(o->method);
    uint32_t stages = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    int mha = m->cfg->num_kv_heads == m->cfg->num_heads;
    static const int *const groups[4] = {G_QKV, G_O, G_GU, G_DOWN};
    static const int gn[4] = {3, 1, 2, 1}, scale[4] = {1, 0, 1, 0};
    static const char *const gname[4] = {"qkv", "o", "gate/up", "down"};
    uint64_t layer_q = 0, block = 0, wide = 0;
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        block += blk((uint64_t)m->rows[s] * m->cols[s] * sizeof(float));
        wide = m->rows[s] > wide ? m->rows[s] : wide;
    }
    cur->block = block;
    cur->result = result;
    /* the rotation's row buffer while the copies are made */
    cur->work = rotate ? blk(wide * sizeof(float)) : 0;
    cur->phase = "statistics";
    take(out, cur);
    /* first stage's pass: its points' statistics, down's and o's Hq for
     * AWQ's pre-scaling when they are not among them; the pre-scaling's
     * search */
    unsigned pts0 = cmp_calib_stage_points(stages, 0);
    cur->stats = live_stats(m, lean, pts0, 0);
    cur->device = live_stats(m, lean, pts0, 1);
    cur->work = 0;
    if (pre) {
        for (int p = 1; p < 4; p += 2) /* o (without GQA), down */
            if (!((pts0 >> p) & 1u) && (p == 3 || mha)) {
                cur->stats += stats_bytes(m, p, 0);
                cur->device += stats_device(m, p, 0);
            }
        uint64_t ps = 0;
        if (cmp_quant_is_quantized(fmt_of(m, l, CMP_LIN_DOWN)))
            ps = blk(F * sizeof(float)) +
                 work(cmp_awq_search_work_bytes((uint32_t)H, (uint32_t)F, m->threads,
                                                CMP_AWQ_SAMPLE_ROWS));
        if (mha && cmp_quant_is_quantized(fmt_of(m, l, CMP_LIN_O)))
            ps = u64max(ps, blk(qd * sizeof(float)) +
                                work(cmp_awq_search_work_bytes((uint32_t)H, (uint32_t)qd, m->threads,
                                                          CMP_AWQ_SAMPLE_ROWS)));
        cur->work = ps;
    }
    take(out, cur);
    for (int g = 0; g < 4; g++) { /* group g reads tap point g */
        int lp = (lean >> g) & 1u;
        /* the points of g's stage not yet quantized (g's own included) */
        unsigned live = stage_of(stages, g) & ~((1u << g) - 1u);
        cur->stats = live_stats(m, lean, live, 0);
        cur->device = live_stats(m, lean, live, 1);
        cur->work = group_bytes(m, l, groups[g], gn[g], scale[g], lp);
        cur->result = result + layer_q;
        cur->phase = gname[g];
        take(out, cur);
        for (int i = 0; i < gn[g]; i++) {
            int sl = groups[g][i];
            layer_q += qbytes(fmt_of(m, l, sl), m->rows[sl], m->cols[sl], o->group);
        }
    }
    /* float-kept linears move their copy into the result */
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        if (!cmp_quant_is_quantized(fmt_of(m, l, s)))
            layer_q += blk((uint64_t)m->rows[s] * m->cols[s] * sizeof(float));
    return layer_q;
}

int cmp_calib_stores_down(const cmp_calib_opts *o, unsigned lean)
{
    uint32_t stages = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    return stages == 4 && !(lean & CMP_CALIB_LEAN_DOWN_STORE);
}

mc_status cmp_calib_memory(const fmt_model_config *cfg, const size_t *off,
                           size_t nseq, const cmp_calib_opts *o,
                           unsigned lean, cmp_calib_mem *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    uint64_t spill = 0; /* bytes the spill file receives */
    if (nseq <= o->heldout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "calib", -1,
                       "%zu sequences, %zu held out: nothing left to calibrate on",
                       nseq, o->heldout);
    size_t ncal = nseq - o->heldout, ntok = 0, maxT = 0, hmaxT = 0, hpos = 0;
    for (size_t i = 0; i < nseq; i++) {
        size_t T = off[i + 1] - off[i];
        if (i < ncal) {
            ntok += T;
            maxT = T > maxT ? T : maxT;
        } else {
            hmaxT = T > hmaxT ? T : hmaxT;
            hpos += T > 1 ? T - 1 : 0;
        }
    }
    uint64_t H = cfg->hidden_size, V = cfg->vocab_size, NL = cfg->num_layers;
    uint64_t qd = (uint64_t)cfg->num_heads * cfg->head_dim;
    uint64_t kvd = (uint64_t)cfg->num_kv_heads * cfg->head_dim;
    uint64_t F = cfg->intermediate_size;
    mem_ctx m;
    memset(&m, 0, sizeof m);
    m.cfg = cfg;
    m.o = o;
    m.maxT = maxT;
    uint32_t rows[CMP_LIN_COUNT] = {(uint32_t)qd, (uint32_t)kvd, (uint32_t)kvd,
                                    (uint32_t)H, (uint32_t)F, (uint32_t)F,
                                    (uint32_t)H};
    uint32_t cols[CMP_LIN_COUNT] = {(uint32_t)H, (uint32_t)H, (uint32_t)H,
                                    (uint32_t)qd, (uint32_t)H, (uint32_t)H,
                                    (uint32_t)F};
    memcpy(m.rows, rows, sizeof rows);
    memcpy(m.cols, cols, sizeof cols);
    m.width[0] = (uint32_t)H;
    m.width[1] = (uint32_t)qd;
    m.width[2] = (uint32_t)H;
    m.width[3] = (uint32_t)F;
    int threads = o->pool ? kn_pool_threads(o->pool) : 1;
    m.threads = threads;
    int rotate = o->rotate && cmp_rotation_applies(cfg->hidden_size);
    m.down_out = cmp_calib_down_from_outputs(o, lean, rotate, (uint32_t)H, (uint32_t)F);
    m.refit_hw = !(lean & CMP_CALIB_LEAN_REFIT_HW);

    /* result_create: tables, the folded vectors; the rotation's signs */
    uint64_t per = qd + 2 * kvd + H + 2 * F + H + 2 * H;
    uint64_t tables = sizeof(cmp_calib_result) + NL * CMP_LIN_COUNT * sizeof(cmp_calib_tensor) +
                      per * NL * sizeof(float) + 2 * NL * sizeof(float *) +
                      NL * CMP_LIN_COUNT * sizeof(float *) + NL * sizeof(double) +
                      (rotate ? blk(H * sizeof(float)) + blk(cfg->head_dim * sizeof(float)) : 0) +
                      8 * 32 + 4096;
    uint64_t nbuf = (NL * CMP_LIN_COUNT + 3) * 3 + 2;
    uint64_t spill_list = 0;
    if (o->spill_dir) {
        uint64_t cap = 64;
        while (cap < nbuf)
            cap *= 2;
        spill_list = blk(cap * 16) + blk(cap * 8) + 2 * blk(64); /* realloc: old + new */
    }
    uint64_t states = 2 * blk(ntok * H * sizeof(float)) +
                      2 * blk(maxT * H * sizeof(float)) + blk(ncal * sizeof(size_t));
    if (cmp_calib_stores_down(o, lean))
        states += blk(ntok * (uint64_t)cfg->intermediate_size * sizeof(float));
    uint64_t fwd = work(cmp_fwd_bytes(cfg, maxT, threads));
    /* the held-out states of both models, carried through the layers
     * (cmp_calib_heldout.c), and their own forward context (the longest
     * held-out sequence's); the states stay to the held-out summary */
    uint64_t held = 0, held_fwd = 0;
    if (o->heldout > 0 && hmaxT > 0) {
        uint64_t hs = cmp_heldout_state_bytes(cfg, off + ncal, o->heldout);
        held = blk(64) /* the struct (asserted there) */ + 2 * blk(hs / 2);
        held_fwd = work(cmp_fwd_bytes(cfg, hmaxT, threads));
    }

    uint64_t kept = 0; /* finished layers kept in memory (no spill file) */
    for (uint64_t l = 0; l < NL; l++) {
        cmp_calib_mem cur;
        memset(&cur, 0, sizeof cur);
        cur.states = states + held;
        cur.forward = fwd + held_fwd;
        uint64_t layer = layer_phases(&m, lean, (uint32_t)l, rotate,
                                      tables + spill_list + kept, &cur, out);
        if (o->spill_dir)
            spill += layer;
        else
            kept += layer;
    }
    /* after the layers: the calibration states and the forward contexts
     * freed; the held-out states stay */
    cmp_calib_mem end;
    memset(&end, 0, sizeof end);
    end.states = held;
    end.result = tables + spill_list + kept;
    uint64_t vh = blk(V * H * sizeof(float));
    /* the output layer quantized for the held-out view (0: kept float) */
    uint64_t lmq = qbytes(o->lm_head_fmt, (uint32_t)V, (uint32_t)H, o->group);
    end.phase = "ends";
    if (rotate) {
        /* embed (spilled before the output layer is made), output layer,
         * its quantized copy */
        end.ends = (o->spill_dir ? vh : 2 * vh) + blk(H * sizeof(float)) + lmq;
        if (o->spill_dir)
            spill += 2 * vh + lmq;
        else
            end.result += 2 * vh + blk(H * sizeof(float)) + lmq;
    } else if (lmq) {
        end.ends = vh + lmq;
        if (o->spill_dir)
            spill += lmq;
        else
            end.result += lmq;
    }
    take(out, &end);
    end.ends = 0; /* the ends are in the spill file or in end.result now */
    if (o->heldout > 0) {
        /* the view's layer table, both logits buffers, the KLD list */
        end.ends = work(cmp_eval_scores_bytes(cfg, hmaxT, hpos)) +
                   blk(NL * sizeof(rt_layer));
        end.phase = "held-out";
        take(out, &end);
    }
    out->lean = lean;
    out->spill = o->spill_dir ? spill : 0;
    return MC_OK;
}

mc_status cmp_calib_plan_memory(const fmt_model_config *cfg, const size_t *off,
                                size_t nseq, const cmp_calib_opts *o,
                                cmp_calib_mem *out, mc_error *err)
{
    /* widest input first: down, o, qkv, gate/up */
    static const unsigned order[4] = {1u << KN_TAP_DOWN_IN, 1u << KN_TAP_O_IN,
                                      1u << KN_TAP_QKV_IN, 1u << KN_TAP_GATE_UP_IN};
    unsigned lean = o->force_lean &
                    (0xFu | CMP_CALIB_LEAN_DOWN_STORE | CMP_CALIB_LEAN_REFIT_HW);
    if (!cmp_calib_method_asymmetric(o->method))
        lean |= 0xFu; /* Hf and C would serve only the errors' report */
    mc_status st = cmp_calib_memory(cfg, off, nseq, o, lean, out, err);
    /* what costs no quality first: the refits' H w, down's input store */
    static const unsigned free_first[2] = {CMP_CALIB_LEAN_REFIT_HW,
                                           CMP_CALIB_LEAN_DOWN_STORE};
    for (int k = 0; k < 2; k++)
        if (st == MC_OK && o->mem_budget && out->peak > o->mem_budget &&
            !(lean & free_first[k])) {
            lean |= free_first[k];
            st = cmp_calib_memory(cfg, off, nseq, o, lean, out, err);
        }
    for (int k = 0; st == MC_OK && o->mem_budget && out->peak > o->mem_budget && k < 4; k++) {
        lean |= order[k];
        st = cmp_calib_memory(cfg, off, nseq, o, lean, out, err);
    }
    /* the refits' H w back if what went after it made room (it is
     * work space, the peak may be elsewhere) */
    if (st == MC_OK && o->mem_budget && out->peak <= o->mem_budget &&
        (lean & CMP_CALIB_LEAN_REFIT_HW) && !(o->force_lean & CMP_CALIB_LEAN_REFIT_HW)) {
        cmp_calib_mem with;
        if (cmp_calib_memory(cfg, off, nseq, o, lean & ~CMP_CALIB_LEAN_REFIT_HW,
                             &with, NULL) == MC_OK &&
            with.peak <= o->mem_budget)
            *out = with;
    }
    if (st != MC_OK || !o->mem_budget || out->peak <= o->mem_budget)
        return st;
    const double G = 1073741824.0;
    return mc_fail(err, MC_ERR_NOMEM, NULL, "calibration memory", -1,
                   "calibration needs %.2f GiB at its peak (%s: states %.2f, "
                   "forward %.2f, result %.2f, block %.2f, statistics %.2f, "
                   "work %.2f, ends %.2f GiB) even with lean statistics; the "
                   "budget is %.2f GiB: use fewer or shorter calibration "
                   "sequences, or a larger --calib-memory",
                   out->peak / G, out->phase, out->states / G, out->forward / G,
                   out->result / G, out->block / G, out->stats / G,
                   out->work / G, out->ends / G, o->mem_budget / G);
}

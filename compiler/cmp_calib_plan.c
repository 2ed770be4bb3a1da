/* cmp_calib_plan.c - the plan printed before calibration starts: the
 * whole process's peak resident memory by part and a time estimate from
 * multiply-add counts and a measured GEMM rate (see cmp_calib.h). */
#include <math.h>
#include <string.h>

#include "cmp_calib_budget.h"
#include "cmp_calib_internal.h"
#include "cmp_rotate.h"
#include "fmt_mapguard.h"
#include "kn_quant.h"
#include "mc_alloc.h"

/* Code, libraries, the pool's stacks as touched, jansson, the token file
 * (8K tokens are 32 KiB): what mc_alloc does not see.  Measured ~20 MiB
 * for mcompile on the stories260k fixture; twice that as the allowance. */
#define PLAN_PROGRAM_BYTES (48ull << 20)


/* Multiply-adds per second of a float32 GEMM through the pool on cores
 * of its own, in the forward's shape: weights min(F, 1024) x H (the
 * model's widths, at most 16 MiB of them) by min(maxT, 256) tokens.  One
 * warm-up product (the pool's threads wake, the pages are touched), then
 * the best of PLAN_RATE_REPS reps of at least PLAN_RATE_REP_S each, each
 * rep's rate its multiply-adds over the process's CPU seconds times the
 * pool's threads: what the threads do while they run, so another
 * process's load changes it little (the time a shared core takes away
 * is the user's to add).  0 when the buffers cannot be had.  Freed
 * before the states are allocated, so they stay under the memory plan's
 * peak (test_calib_memory). */
#define PLAN_RATE_REPS 5
#define PLAN_RATE_REP_S 0.03
static double measure_rate(kn_pool *pool, uint32_t H, uint32_t F, size_t maxT)
{
    uint32_t K = H ? H : 64, R = F < 1024 ? (F ? F : 64) : 1024;
    if ((uint64_t)R * K > (4u << 20))
        R = (uint32_t)((4u << 20) / K);
    size_t T = maxT < 256 ? (maxT ? maxT : 1) : 256;
    float *w = mc_malloc_array((size_t)R * K, sizeof(float));
    float *x = mc_malloc_array(T * K, sizeof(float));
    float *y = mc_malloc_array(T * R, sizeof(float));
    double best = 0.0;
    if (w && x && y) {
        for (size_t i = 0; i < (size_t)R * K; i++)
            w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < T * K; i++)
            x[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
        kn_matrix W = {KN_W_F32, R, K, w, NULL, NULL, 0, KN_LAYOUT_ROWS};
        kn_matmul(pool, &W, x, T, y, NULL); /* warm-up */
        double threads = cmp_par_threads(pool);
        for (int rep = 0; rep < PLAN_RATE_REPS; rep++) {
            cmp_clock t0 = cmp_par_clock(), t = t0;
            int n = 0;
            while (n < 1 || t.wall - t0.wall < PLAN_RATE_REP_S) {
                kn_matmul(pool, &W, x, T, y, NULL);
                n++;
                t = cmp_par_clock();
            }
            double cpu = t.cpu - t0.cpu;
            double r = cpu > 0.0 ? threads * n * R * K * (double)T / cpu : 0.0;
            best = r > best ? r : best;
        }
    }
    mc_free(w);
    mc_free(x);
    mc_free(y);
    return best;
}

double cmp_calib_measure_rate(kn_pool *pool, const fmt_model_config *cfg,
                              size_t maxT)
{
    return measure_rate(pool, cfg->hidden_size, cfg->intermediate_size, maxT);
}

/* Bytes of a matrix as the source holds it (a mapped float format). */
static uint64_t src_bytes(const kn_matrix *w)
{
    return w->data ? kn_wformat_data_bytes(w->fmt, w->rows, w->cols) : 0;
}

/* Efficiencies of the phases against the float GEMM rate measured at
 * start: what fraction of it each phase's kernels reach, fitted on the
 * finished runs in docs/benchmarks.md ("The calibration's estimate
 * against finished runs").  The statistics and factorizations are
 * double-precision kernels; the search is mostly matrix-vector work
 * against a double Hessian.  The statistics' bfloat16 products (the
 * default) run at about 1.25x the float ones' efficiency where the CPU
 * has AVX512_BF16 (SmolLM2 shape, 8K tokens: estimate 23.4 s at 0.81
 * against 18.4 CPU-s per thread; docs/benchmarks.md); elsewhere their
 * emulation runs the float tiles. */
#define EFF_FORWARD 0.75
#define EFF_STATS 0.81
#define EFF_STATS_BF16 1.0
#define EFF_FACTOR 0.42
/* GPTQ's inverse factor alone (the Cholesky and the triangular inverse,
 * kn_ddot's 3 x 4 double tiles): the Mistral-7B-shape layer's
 * factorization phase (gptq, one inverse factor per input group: 1.05e12
 * multiply-adds) took 35.0 CPU-s a thread on a Zen 4 host whose float
 * GEMM ran at 104 G/s, 30 G/s: 0.29 of the GEMM rate, where EFF_FACTOR
 * said 0.42 (the phase ran 0.48x of its estimate before the packed rows
 * of cmp_chol.c, 0.56x in the 32-layer run; session 24).  EFF_FACTOR
 * stays for the retargets, whose row solves it was fitted on. */
#define EFF_FACTOR_INV 0.29
#define EFF_SEARCH 0.16
#define FWD_BF16_SPEEDUP 1.9
/* The full-precision weights' bfloat16 products (--calib-full-pass bf16):
 * their tile runs 1.63-1.77x the float GEMM (bench_gemm_bf16, SmolLM2
 * shapes), but the compile's forward fell by 12-23 % of its CPU where
 * this count predicted ~28 % at 1.9x; 1.4 on those multiply-adds matches
 * the runs (docs/benchmarks.md, session 22). */
#define FWD_BF16_FULL_SPEEDUP 1.4

/* Multiply-adds per token of a block run up to tap point p (0: q/k/v's
 * input, a norm; 1: o's; 2: gate/up's; 3: down's; 4: the whole block),
 * attention with maxT / 2 keys on average (scores and values). */
static void block_prefix(const fmt_model_config *c, size_t maxT, double cum[5])
{
    double H = c->hidden_size, F = c->intermediate_size;
    double Q = (double)fmt_config_q_dim(c), KV = (double)fmt_config_kv_dim(c);
    cum[0] = 0.0;
    cum[1] = (Q + 2.0 * KV) * H + (double)maxT * Q;
    cum[2] = cum[1] + H * Q;
    cum[3] = cum[2] + 2.0 * F * H;
    cum[4] = cum[3] + H * F;
}

/* Stage k's points (*pts) and the points its passes collect (*mask: with
 * pre, stage 0 also collects down's and, under MHA, o's for the AWQ
 * pre-scaling), as groups_staged (cmp_calib_layer.c) runs them; 0 past
 * the last stage. */
static int stage_mask(const fmt_model_config *c, uint32_t stages, unsigned k,
                      int pre, unsigned *pts, unsigned *mask)
{
    *pts = *mask = k < stages ? cmp_calib_stage_points(stages, k) : 0;
    if (k == 0 && pre)
        *mask |= (1u << KN_TAP_DOWN_IN) |
                 (c->num_kv_heads == c->num_heads ? 1u << KN_TAP_O_IN : 0);
    return *pts != 0;
}

/* The forward's multiply-adds per token and block, pass by pass as
 * cmp_calib_layer runs them (groups_staged, then the final moves): each
 * stage's full-precision pass up to the last full point it serves (the
 * whole block when it moves the states), its quantized pass up to the
 * last point in its mask (the pre-scaling's points on the sampled share
 * pre of the sequences, cmp_calib_prescale_stride), each from where
 * cmp_calib_stage_span begins it; then the moves that are left. */
double cmp_calib_plan_block_madds(const fmt_model_config *c, size_t maxT,
                                  uint32_t stages, unsigned lean, double pre,
                                  int rot, int store_down)
{
    double cum[5];
    block_prefix(c, maxT, cum);
    if (!stages)
        stages = CMP_CALIB_STAGES_DEFAULT;
    unsigned fullpts = 0xFu & ~lean, pts, mask;
    int moved_f = 0, stored = 0;
    int reuse = cmp_calib_reuses(stages, store_down, fmt_config_q_dim(c),
                                 c->intermediate_size);
    double total = 0.0;
    for (unsigned k = 0; stage_mask(c, stages, k, pre > 0.0, &pts, &mask); k++) {
        cmp_stage_span sp;
        cmp_calib_stage_span(stages, k, lean, rot, reuse, &sp);
        /* a pass that begins at point p skips cum[p] (p: o's 1, gate/up's 2) */
        double skip_f = sp.start_f ? cum[sp.start_f - 1] : 0.0;
        double skip_q = sp.start_q ? cum[sp.start_q - 1] : 0.0;
        unsigned full = fullpts & pts;
        int move_f = k == stages - 1 && (lean & 0xFu) != 0xFu &&
                     (stages < 4 || rot);
        moved_f |= move_f;
        stored |= store_down && stages == 4 && k == 3;
        int stop_f = 0, stop_q = 0, stop_pts = 0;
        for (int p = 0; p < 4; p++) {
            if ((full >> p) & 1u)
                stop_f = p;
            if ((mask >> p) & 1u)
                stop_q = p;
            if ((pts >> p) & 1u)
                stop_pts = p;
        }
        if (move_f)
            total += cum[4] - skip_f;
        else if (full)
            total += cum[stop_f] - skip_f;
        /* the pre-scaling's points: the sampled sequences' passes only */
        double share = mask == pts ? 1.0 : pre;
        total += share * (cum[stop_q] - skip_q) +
                 (1.0 - share) * (cum[stop_pts] - skip_q);
    }
    if (!moved_f && (lean & 0xFu) != 0xFu)
        total += cum[4];
    total += stored ? cum[4] - cum[3] : cum[4];
    return total;
}

/* The same walk over the stages as cmp_calib_plan_block_madds. */
double cmp_calib_plan_qlin_madds(const fmt_model_config *c, uint32_t stages,
                                 unsigned lean, double pre, int rot,
                                 int store_down)
{
    double H = c->hidden_size, F = c->intermediate_size;
    double Q = (double)fmt_config_q_dim(c), KV = (double)fmt_config_kv_dim(c);
    const double lin[4] = {(Q + 2.0 * KV) * H, H * Q, 2.0 * F * H, H * F};
    if (!stages)
        stages = CMP_CALIB_STAGES_DEFAULT;
    int reuse = cmp_calib_reuses(stages, store_down, fmt_config_q_dim(c),
                                 c->intermediate_size);
    unsigned pts, mask, done = 0;
    int stored = 0;
    double total = 0.0;
    for (unsigned k = 0; stage_mask(c, stages, k, pre > 0.0, &pts, &mask); k++) {
        cmp_stage_span sp;
        cmp_calib_stage_span(stages, k, lean, rot, reuse, &sp);
        int g0 = sp.start_q ? sp.start_q - 1 : 0, stop_q = 0, stop_pts = 0;
        for (int p = 0; p < 4; p++) {
            if ((mask >> p) & 1u)
                stop_q = p;
            if ((pts >> p) & 1u)
                stop_pts = p;
        }
        double share = mask == pts ? 1.0 : pre;
        for (int g = g0; g < 4; g++)
            if ((done >> g) & 1u)
                total += lin[g] * ((g < stop_q ? share : 0.0) +
                                   (g < stop_pts ? 1.0 - share : 0.0));
        stored |= store_down && stages == 4 && k == 3;
        done |= pts;
    }
    for (int g = stored ? 3 : 0; g < 4; g++)
        total += lin[g];
    return total;
}

/* Multiply-adds per token and block of the statistics: per stage and
 * point of its mask, Hq (symmetric: width^2 / 2); where the point is
 * full, Hf (width^2 / 2) and C (width^2) too, or, down from its outputs
 * (down_out), W C (hidden x width) and ||y_f||^2 (hidden). */
static double stats_madds(const fmt_model_config *c, uint32_t stages,
                          unsigned lean, double pre, int down_out)
{
    double width[4] = {c->hidden_size, (double)fmt_config_q_dim(c),
                       c->hidden_size, c->intermediate_size};
    if (!stages)
        stages = CMP_CALIB_STAGES_DEFAULT;
    unsigned pts, mask;
    double total = 0.0;
    for (unsigned k = 0; stage_mask(c, stages, k, pre > 0.0, &pts, &mask); k++) {
        for (int p = 0; p < 4; p++) {
            double w2 = width[p] * width[p];
            if ((pts >> p) & 1u)
                total += 0.5 * w2;
            else if ((mask >> p) & 1u)
                total += pre * 0.5 * w2; /* the pre-scaling's sample */
            if ((pts >> p) & 1u && !((lean >> p) & 1u))
                total += p == KN_TAP_DOWN_IN && down_out
                             /* W C from down's outputs, ||y_f||^2 */
                             ? (double)c->hidden_size * (width[p] + 1.0)
                             : 1.5 * w2;
        }
    }
    return total;
}

/* Factorization and search multiply-adds of one block (cmp_calib_group.c):
 * per group, the candidates the method runs (best: rtn, gptaq, and
 * awq+gptaq where the group may scale: the proxy's pick is not known
 * before, so the estimate counts it; act-order is not counted), each
 * GPTQ candidate's factor (K^3 / 3: the Cholesky and the triangular
 * inverse, K^3 / 6 each) and, for GPTAQ, each linear's retarget (K^3 / 6
 * + 2 R K^2); the search, in units of R K^2 at the
 * scale refit's speed (the SEARCH_W_* weights: each kind of pass's cost
 * against the refit's, measured with bench_calib_search at K = 4096 and
 * 14336, the same within 1.3x at both): the energies and each
 * candidate's error measures, GPTQ's column loop, the refits (after the
 * first, a third of the work with H w kept: CMP_CALIB_LEAN_REFIT_HW), the
 * second pass (cmp_calib_second_pass), the descent, the AWQ grid (a point
 * costs the group's R K^2).  Re-measured in session 15 at K = 4096, int4 g128, against the
 * paired refit (9.7 CPU-s per 4096 rows; kept H w 4.2, an output error
 * 3.0, the descent 9.9, GPTQ's loop 7.7).  GPTQ's loop since its trailing
 * update became one double chain per value over a panel (session 24):
 * bench_factor's loop 1.9x faster at K = 4096 and 2.6x at 14336, so
 * 0.40 -> 0.18. */
#define SEARCH_W_OERR 0.23     /* an output error (d^T H d, tiled) */
#define SEARCH_W_CROSS 0.38    /* the cross term a^T C b (tiled) */
#define SEARCH_W_GPTQ 0.18     /* GPTQ's column loop */
#define SEARCH_W_REFIT 1.0     /* a scale refit forming H w */
#define SEARCH_W_REFIT_KEPT 0.43 /* one with H w kept from the first */
#define SEARCH_W_DESCENT 1.0   /* the descent: H d and the moves */
#define SEARCH_W_AWQ 0.17      /* a point of AWQ's grid */
static void quant_madds(const fmt_model_config *c, const cmp_calib_opts *o,
                        unsigned lean, double *factor, double *inverse,
                        double *search)
{
    double H = c->hidden_size, F = c->intermediate_size;
    double Q = (double)fmt_config_q_dim(c), KV = (double)fmt_config_kv_dim(c);
    static const int gn[4] = {3, 1, 2, 1}, scale[4] = {1, 0, 1, 0};
    double rows[4][3] = {{Q, KV, KV}, {H, 0, 0}, {F, F, 0}, {H, 0, 0}};
    double K[4] = {H, Q, H, F};
    int best = cmp_calib_is_best(o->method), all = o->method == CMP_QM_BEST_ALL;
    int awq_m = o->method == CMP_QM_AWQ || o->method == CMP_QM_AWQ_GPTQ ||
                o->method == CMP_QM_AWQ_GPTAQ;
    int second = cmp_calib_second_pass(o->fmt, o->method);
    double grid = o->awq_coarse ? 11.0 : 20.0;
    *factor = *inverse = *search = 0.0;
    for (int g = 0; g < 4; g++) {
        int full = !((lean >> g) & 1u);
        /* rbkk: the rows RTN's measures run on (a named method's
         * baseline is a sample, cmp_calib_baseline_stride) */
        double k = K[g], rkk = 0.0, rbkk = 0.0;
        for (int i = 0; i < gn[g]; i++) {
            uint32_t st = cmp_calib_baseline_stride(o, (uint32_t)rows[g][i]);
            rkk += rows[g][i] * k * k;
            rbkk += ceil(rows[g][i] / st) * k * k;
        }
        int sampled = rbkk < rkk;
        /* GPTQ candidates, retargeted ones, AWQ searches */
        double ng = 0.0, nr = 0.0, nkeys = 0.0, awq = 0.0, ncand = 1.0;
        if (all) {
            ng = 5.0, nr = full ? 4.0 : 0.0, nkeys = scale[g] ? 4.0 : 2.0;
            awq = scale[g] ? 1.0 : 0.0, ncand = 7.0;
        } else if (best) {
            ng = scale[g] ? 2.0 : 1.0, nr = full ? ng : 0.0, nkeys = ng;
            awq = scale[g] ? 1.0 : 0.0, ncand = 1.0 + ng;
        } else if (o->method != CMP_QM_RTN) {
            int gp = o->method != CMP_QM_AWQ;
            ng = gp, nkeys = gp;
            nr = full && (o->method == CMP_QM_GPTAQ ||
                          o->method == CMP_QM_AWQ_GPTAQ);
            awq = awq_m && scale[g] ? 1.0 : 0.0, ncand = 2.0;
        }
        double inv = nkeys * (1.0 / 3.0) * k * k * k;
        *factor += inv;
        *inverse += inv;
        for (int i = 0; i < gn[g]; i++)
            *factor += nr * (k * k * k / 6.0 + 2.0 * rows[g][i] * k * k);
        /* per candidate: with C the error against the full-precision
         * outputs (one output error, one cross term), without it the
         * own-input error (cmp_calib_group.c, run_candidate) */
        double measures = full ? SEARCH_W_OERR + SEARCH_W_CROSS : SEARCH_W_OERR;
        double later = lean & CMP_CALIB_LEAN_REFIT_HW ? SEARCH_W_REFIT
                                                      : SEARCH_W_REFIT_KEPT;
        /* unrefined (o->no_refine): GPTQ's loop alone */
        double per_gptq = o->no_refine ? SEARCH_W_GPTQ
                          : SEARCH_W_GPTQ + SEARCH_W_REFIT +
                                (second ? SEARCH_W_GPTQ + later + 2.0 * SEARCH_W_OERR : 0.0) +
                                SEARCH_W_DESCENT + later;
        double awq_points = awq * grid + (o->method == CMP_QM_AWQ ? grid : 0.0);
        /* one energy per linear: tr(W Hf W^T) with C, tr(W Hq W^T) without
         * (and the sample's, for a sampled baseline); RTN's measures are
         * one of the ncand */
        *search += rkk * (SEARCH_W_OERR + (ncand - 1.0) * measures +
                          ng * per_gptq + awq_points * SEARCH_W_AWQ) +
                   rbkk * (measures + (sampled ? SEARCH_W_OERR : 0.0));
    }
}

void cmp_calib_plan_make(const rt_model *m, size_t ntok, size_t maxT,
                         const size_t *held_off, size_t nheld,
                         const cmp_calib_opts *o,
                         const cmp_calib_mem *mem, double rate,
                         cmp_calib_plan *out)
{
    memset(out, 0, sizeof *out);
    out->mem = *mem;
    out->heldout_tokens = nheld ? held_off[nheld] - held_off[0] : 0;
    const fmt_model_config *c = &m->cfg;
    /* memory: what mc_alloc holds, the source as resident, the spill
     * mapping.  During the layers: the embeddings (read for the states)
     * and the block being calibrated: each finished block's source pages
     * are dropped (fmt_mapguard_drop), where they are a file's mapping;
     * a heap copy (an adapter's merged tensor) stays, and counts whole.
     * The held-out sequences cross each block with the calibration's
     * (cmp_calib_heldout.c): no block is read again.  At the ends: the
     * embeddings and output layer.  The spill file is mapped at the ends
     * only. */
    uint64_t ends_src = src_bytes(&m->embed);
    if (m->lm_head.data != m->embed.data)
        ends_src += src_bytes(&m->lm_head);
    uint64_t block_max = 0, kept = 0;
    out->source = ends_src;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        uint64_t blk = 0;
        for (int s = 0; s < CMP_LIN_COUNT; s++) {
            const kn_matrix *w = cmp_calib_src_matrix(&m->layers[l].w, s);
            uint64_t b = src_bytes(w);
            out->source += b;
            if (b && fmt_mapguard_covers(w->data, (size_t)b))
                blk += b;
            else
                kept += b;
        }
        block_max = blk > block_max ? blk : block_max;
    }
    out->source_layers = src_bytes(&m->embed) + block_max + kept;
    out->source_ends = ends_src + kept;
    out->spill = mem->spill;
    out->program = PLAN_PROGRAM_BYTES;
    uint64_t layers = mem->peak + out->source_layers + out->program;
    /* the spill file is mapped after the layers only, when mc_alloc holds
     * what the ends phases do, not the layers' peak */
    uint64_t ends = mem->ends_peak + out->source_ends + out->spill + out->program;
    out->rss = layers > ends ? layers : ends;

    /* time: multiply-adds per phase over all layers */
    double T = (double)ntok, L = c->num_layers;
    /* the share of the tokens whose stage-0 pass serves the pre-scaling */
    double pre = cmp_calib_is_awq(o->method) || cmp_calib_is_best(o->method)
                     ? 1.0 / (double)cmp_calib_prescale_stride(ntok) : 0.0;
    int rot = o->rotate && cmp_rotation_applies(c->hidden_size);
    /* the layers past o->full_layers collect every point lean
     * (cmp_calib_run.c, layers_run) */
    double Lf = o->full_layers && o->full_layers < c->num_layers
                    ? (double)o->full_layers : L;
    const double nl[2] = {Lf, L - Lf};
    const unsigned ln[2] = {mem->lean, mem->lean | 0xFu};
    int store = cmp_calib_stores_down(o, mem->lean);
    double qlin = 0.0, lin = 0.0, factor_time = 0.0;
    for (int i = 0; i < CMP_PH_COUNT; i++)
        out->madds[i] = 0.0;
    for (int i = 0; i < 2; i++) {
        if (nl[i] <= 0.0)
            continue;
        double fac = 0.0, inv = 0.0, sea = 0.0;
        out->madds[CMP_PH_FORWARD] +=
            nl[i] * T * cmp_calib_plan_block_madds(c, maxT, o->stages, ln[i],
                                                   pre, rot, store);
        out->madds[CMP_PH_STATS] +=
            nl[i] * T * stats_madds(c, o->stages, ln[i], pre,
                                    cmp_calib_down_from_outputs(o, ln[i], rot,
                                                                c->hidden_size,
                                                                c->intermediate_size));
        quant_madds(c, o, ln[i], &fac, &inv, &sea);
        out->madds[CMP_PH_FACTOR] += nl[i] * fac;
        /* the inverse factors at their own efficiency, in units of
         * EFF_FACTOR's multiply-adds */
        factor_time += nl[i] * (fac - inv + inv * (EFF_FACTOR / EFF_FACTOR_INV));
        out->madds[CMP_PH_SEARCH] += nl[i] * sea;
        qlin += nl[i] * T * cmp_calib_plan_qlin_madds(c, o->stages, ln[i], pre,
                                                      rot, store);
        /* every pass's linears: the block's walk without attention */
        lin += nl[i] * T * cmp_calib_plan_block_madds(c, 0, o->stages, ln[i],
                                                      pre, rot, store);
    }
    /* the held-out evaluation as cmp_calib_heldout.c runs it: both models
     * over each sequence that has a next token, block by block with the
     * layers (attention over that sequence's own length), then both
     * output layers at the ends (the phase's measured time,
     * cmp_calib_times.ends, holds both parts) */
    out->madds[CMP_PH_ENDS] = 0.0;
    for (size_t i = 0; i < nheld; i++) {
        size_t Th = held_off[i + 1] - held_off[i];
        double cum[5];
        block_prefix(c, Th, cum);
        if (Th >= 2)
            out->madds[CMP_PH_ENDS] +=
                2.0 * (double)Th *
                (L * cum[4] + (double)m->lm_head.rows * c->hidden_size);
    }
    out->rate = rate > 0.0 ? rate
                : rate == 0.0 ? (o->plan_rate > 0.0
                                     ? o->plan_rate
                                     : measure_rate(o->pool, c->hidden_size,
                                                    c->intermediate_size, maxT))
                              : 0.0;
    /* the quantized pass's bfloat16 products (--calib-forward bf16) run
     * at ~1.9x the float GEMM's rate where the CPU has AVX512_BF16
     * (perf, SmolLM2 shape: kn_avx512bf16_gemm_tile against
     * kn_gemm_rows_avx512 per multiply-add); elsewhere the emulation
     * runs at the float rate.  With full_bf16 the other linears gain
     * too. */
    int bf16_cpu = o->plan_nominal || kn_cpu_has_avx512bf16();
    double fwd_time = out->madds[CMP_PH_FORWARD];
    if (!o->fwd_f32 && bf16_cpu) {
        fwd_time -= (1.0 - 1.0 / FWD_BF16_SPEEDUP) * qlin;
        if (o->full_bf16)
            fwd_time -= (1.0 - 1.0 / FWD_BF16_FULL_SPEEDUP) * (lin - qlin);
    }
    double eff_stats = !o->stats_f32 && !o->stats_on_gpu && bf16_cpu
                       ? EFF_STATS_BF16 : EFF_STATS;
    const double eff[CMP_PH_COUNT] = {EFF_FORWARD, eff_stats, EFF_FACTOR,
                                      EFF_SEARCH, EFF_FORWARD};
    for (int p = 0; p < CMP_PH_COUNT; p++) {
        double madds = p == CMP_PH_FORWARD ? fwd_time
                       : p == CMP_PH_FACTOR ? factor_time : out->madds[p];
        out->seconds[p] = out->rate > 0.0 ? madds / (out->rate * eff[p]) : 0.0;
        out->total_s += out->seconds[p];
    }
    /* one forward pass over the calibration tokens, attention over each
     * sequence's own length as the blocks' count has it (maxT) */
    double cum[5];
    block_prefix(c, maxT, cum);
    double once = T * (L * cum[4] + (double)m->lm_head.rows * c->hidden_size);
    out->forward_once_s = out->rate > 0.0 ? once / (out->rate * EFF_FORWARD) : 0.0;
}

/* cmp_calib_plan.c - the plan printed before calibration starts: the
 * whole process's peak resident memory by part and a time estimate from
 * multiply-add counts and a measured GEMM rate (see cmp_calib.h). */
#include <string.h>
#include <time.h>

#include "cmp_calib_internal.h"
#include "kn_quant.h"
#include "mc_alloc.h"

/* Code, libraries, the pool's stacks as touched, jansson, the token file
 * (8K tokens are 32 KiB): what mc_alloc does not see.  Measured ~20 MiB
 * for mcompile on the stories260k fixture; twice that as the allowance. */
#define PLAN_PROGRAM_BYTES (48ull << 20)

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Multiply-adds per second of a float32 GEMM (the forward passes' kernel)
 * through the pool: 256 x 512 weights by 128 tokens, repeated for about
 * 0.1 s.  0 when the buffers cannot be had.  Its 0.9 MB are freed before
 * the states are allocated, so they stay under the memory plan's peak
 * (which test_calib_memory checks against mc_alloc's). */
static double measure_rate(kn_pool *pool)
{
    const uint32_t R = 256, K = 512;
    const size_t T = 128;
    float *w = mc_malloc((size_t)R * K * sizeof(float));
    float *x = mc_malloc(T * K * sizeof(float));
    float *y = mc_malloc(T * R * sizeof(float));
    double rate = 0.0;
    if (w && x && y) {
        for (size_t i = 0; i < (size_t)R * K; i++)
            w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < T * K; i++)
            x[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
        kn_matrix W = {KN_W_F32, R, K, w, NULL, NULL, 0};
        double t0 = mono_s(), t = t0;
        int n = 0;
        while (n < 2 || t - t0 < 0.1) {
            kn_matmul(pool, &W, x, T, y, NULL);
            n++;
            t = mono_s();
        }
        rate = (double)n * R * K * (double)T / (t - t0);
    }
    mc_free(w);
    mc_free(x);
    mc_free(y);
    return rate;
}

/* Bytes of a matrix as the source holds it (a mapped float format). */
static uint64_t src_bytes(const kn_matrix *w)
{
    return w->data ? kn_wformat_data_bytes(w->fmt, w->rows, w->cols) : 0;
}

void cmp_calib_plan_make(const rt_model *m, size_t ntok, size_t maxT,
                         const cmp_calib_opts *o, const cmp_calib_mem *mem,
                         double rate, cmp_calib_plan *out)
{
    memset(out, 0, sizeof *out);
    out->mem = *mem;
    const fmt_model_config *c = &m->cfg;
    /* memory: what mc_alloc holds, the mapped source, the spill mapping */
    out->source = src_bytes(&m->embed);
    if (m->lm_head.data != m->embed.data)
        out->source += src_bytes(&m->lm_head);
    for (uint32_t l = 0; l < c->num_layers; l++)
        for (int s = 0; s < CMP_LIN_COUNT; s++)
            out->source += src_bytes(cmp_calib_src_matrix(&m->layers[l].w, s));
    out->spill = mem->spill;
    out->program = PLAN_PROGRAM_BYTES;
    out->rss = mem->peak + out->source + out->spill + out->program;

    /* time: multiply-adds per phase over all layers */
    double T = (double)ntok, H = c->hidden_size, F = c->intermediate_size;
    double Q = (double)fmt_config_q_dim(c), KV = (double)fmt_config_kv_dim(c);
    double L = c->num_layers;
    double lin[CMP_LIN_COUNT][2] = {{Q, H}, {KV, H}, {KV, H}, {H, Q},
                                    {F, H}, {F, H}, {H, F}}; /* rows, cols */
    double per_tok = 0.0;
    for (int s = 0; s < CMP_LIN_COUNT; s++)
        per_tok += lin[s][0] * lin[s][1];
    per_tok += (double)maxT * Q; /* attention: ~maxT/2 keys, scores + values */
    /* block passes of both state sets (cmp_calib_opts.stages) */
    uint32_t st = o->stages ? o->stages : CMP_CALIB_STAGES_DEFAULT;
    double passes = st == 1 ? 3.0 : st == 2 ? 5.0 : 10.0;
    out->madds[0] = L * T * per_tok * passes;
    double width[4] = {H, Q, H, F};
    int best = cmp_calib_is_best(o->method);
    int gptq = best || o->method == CMP_QM_GPTQ || o->method == CMP_QM_GPTAQ ||
               o->method == CMP_QM_AWQ_GPTQ || o->method == CMP_QM_AWQ_GPTAQ;
    int retarget = best || o->method == CMP_QM_GPTAQ ||
                   o->method == CMP_QM_AWQ_GPTAQ;
    for (int p = 0; p < 4; p++) {
        double w = width[p];
        int full = !((mem->lean >> p) & 1u);
        /* Hq; with full statistics Hf and C too */
        out->madds[1] += L * T * w * w * (full ? 3.0 : 1.0);
        /* GPTQ's factor (Cholesky and inverse, ~K^3), the retarget's
         * solve (another ~K^3) */
        out->madds[2] += L * w * w * w * ((gptq ? 1.0 : 0.0) +
                                          (retarget && full ? 1.0 : 0.0));
    }
    /* GPTQ's updates (rows x cols^2 per linear) for each candidate that
     * runs it (best: up to 3), else RTN-like work (rows x cols x tokens
     * once, for the error measures) */
    for (int s = 0; s < CMP_LIN_COUNT; s++) {
        double R = lin[s][0], K = lin[s][1];
        out->madds[3] += L * (R * K * K * (gptq ? (best ? 3.0 : 1.0) : 0.0) +
                              R * K * 2.0 * (double)maxT);
    }
    out->rate = rate > 0.0 ? rate : rate == 0.0 ? measure_rate(o->pool) : 0.0;
    for (int p = 0; p < 4; p++) {
        out->seconds[p] = out->rate > 0.0 ? out->madds[p] / out->rate : 0.0;
        out->total_s += out->seconds[p];
    }
}

/* bench_calib.c - the calibration's memory plan against what it really
 * holds, on a generated Llama wide enough for the big terms (statistics,
 * GPTQ work, states) to dominate, where the test fixtures are small enough
 * for per-allocation slack to matter.
 *
 * Default shape: hidden 512, 16 heads / 4 KV heads, FFN 1408, 2 layers,
 * vocab 4096, f32; 16 random sequences of 256 tokens (4,096 tokens, 2 held
 * out); int4 g128, best, rotated, result spilled.  Runs it twice: without a
 * budget, and with a budget halfway between that plan and the plan with
 * down_proj lean.  Prints, per run: planned peak, mc_alloc's measured peak
 * (usable sizes of every library allocation), their ratio (must be <= 1),
 * the process's peak RSS growth for reference (includes the mapped model),
 * seconds per layer and the summed per-linear error.
 * Usage: bench_calib [--quick]   (--quick: hidden 256, FFN 704, 8 x 128
 * tokens) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cmp_calib.h"
#include "kn_block.h"
#include "mc_alloc.h"
#include "rt_model.h"

static long rss_hwm_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static int run(const rt_model *m, const int32_t *tok, const size_t *off,
               size_t nseq, const char *spill, int lean_budget, kn_pool *pool)
{
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q4;
    o.group = 128;
    o.method = CMP_QM_BEST;
    o.rotate = 1;
    o.heldout = 2;
    o.spill_dir = spill;
    o.pool = pool;
    mc_error e;
    char buf[2048];
    if (lean_budget) {
        cmp_calib_mem full, lean;
        if (cmp_calib_memory(&m->cfg, off, nseq, &o, 0, &full, &e) ||
            cmp_calib_memory(&m->cfg, off, nseq, &o, 1u << KN_TAP_DOWN_IN, &lean, &e))
            return 1;
        o.mem_budget = (full.peak + lean.peak) / 2;
    }
    cmp_calib_mem plan;
    if (cmp_calib_plan_memory(&m->cfg, off, nseq, &o, &plan, &e)) {
        printf("plan failed: %s\n", mc_error_format(&e, buf, sizeof buf));
        return 1;
    }
    long rss0 = rss_hwm_kib();
    mc_alloc_track(1);
    mc_alloc_reset_peak();
    int64_t base = mc_alloc_live_bytes();
    double t0 = bench_now();
    cmp_calib_result *r = NULL;
    mc_status st = cmp_calib_run(m, tok, off, nseq, &o, &r, &e);
    double dt = bench_now() - t0;
    int64_t measured = mc_alloc_peak_bytes() - base;
    mc_alloc_track(0);
    if (st != MC_OK) {
        printf("calibration failed: %s\n", mc_error_format(&e, buf, sizeof buf));
        return 1;
    }
    double err = 0.0;
    for (size_t i = 0; i < (size_t)r->layers * CMP_LIN_COUNT; i++)
        err += r->t[i].err;
    const double MB = 1048576.0;
    printf("%-22s planned %8.1f MiB (at %-7s) measured %8.1f MiB  ratio %.3f  "
           "RSS +%6.1f MiB  %6.1f s/layer  error sum %.5f  spilled %.1f MiB\n",
           lean_budget ? "budget, down_proj lean" : "no budget",
           plan.peak / MB, plan.phase, measured / MB,
           (double)measured / (double)plan.peak,
           (rss_hwm_kib() - rss0) / 1024.0, dt / r->layers, err,
           plan.spill / MB);
    fflush(stdout);
    int bad = (uint64_t)measured > plan.peak;
    cmp_calib_result_free(r);
    return bad;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    bench_llama_config c = {.hidden = quick ? 256 : 512,
                            .ffn = quick ? 704 : 1408,
                            .layers = 2, .heads = 16, .kv_heads = 4,
                            .vocab = 4096, .max_pos = 1024, .tied = 0,
                            .torch_dtype = "float32"};
    char dir[] = "/tmp/mc_bench_calib.XXXXXX"; /* mkdtemp template */
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    int rc = 1;
    rt_model *m = NULL;
    mc_error e;
    char buf[2048];
    size_t nseq = quick ? 8 : 16, T = quick ? 128 : 256;
    int32_t *tok = malloc(nseq * T * sizeof *tok);
    size_t *off = malloc((nseq + 1) * sizeof *off);
    kn_pool *pool = kn_pool_create(0);
    if (!tok || !off || bench_gen_llama(dir, &c, FMT_DT_F32, 42)) {
        printf("cannot generate the model in %s\n", dir);
        goto out;
    }
    if (rt_model_open_hf(dir, &m, &e) != MC_OK) {
        printf("open: %s\n", mc_error_format(&e, buf, sizeof buf));
        goto out;
    }
    uint64_t s = 7;
    for (size_t i = 0; i < nseq * T; i++)
        tok[i] = (int32_t)(bench_rnd(&s, 0.5f, 0.5f) * (float)(c.vocab - 1));
    for (size_t i = 0; i <= nseq; i++)
        off[i] = i * T;
    printf("bench_calib: generated Llama hidden %u, FFN %u, %u/%u heads, %u "
           "layers, vocab %u (f32); %zu x %zu tokens, int4 g128 best, rotated, "
           "spilled; %d threads\n", c.hidden, c.ffn, c.heads, c.kv_heads,
           c.layers, c.vocab, nseq, T, pool ? kn_pool_threads(pool) : 1);
    rc = run(m, tok, off, nseq, dir, 0, pool) | run(m, tok, off, nseq, dir, 1, pool);
    printf("measured <= planned in every run: %s\n", rc ? "NO" : "yes");
out:
    rt_model_free(m);
    free(tok);
    free(off);
    kn_pool_free(pool);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}

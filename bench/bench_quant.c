/* bench_quant.c - quantization benchmarks (not a test; run by hand or by
 * scripts/bench):
 *   1. RTN int8 / int4-g32 throughput in MB/s of float32 input weights over
 *      a generated safetensors model of >= 1 GiB in a temp dir;
 *   2. decode (one token through every matrix of a generated ~1 GiB-in-f16
 *      set of linears) tokens/s for f16, int8, int4, and the fraction of
 *      the bandwidth bound (measured read bandwidth / bytes per token);
 *   3. with ../shared present: calibration seconds per layer and the
 *      stories260k quality table (RTN/GPTQ/AWQ/GPTAQ/best x int8/int4-g32,
 *      without and with the rotation: mean KLD and its ratio to plain RTN's,
 *      p99, top-1, perplexity) on eval_64x256 after calibrating on
 *      calib_64x256.
 *   --rtn-rows [ROUNDS]: only the compile's RTN fast path
 *      (cmp_quant_rtn_rows: f16 bytes -> widen -> parameters -> codes) on
 *      one thread over f16 matrices of the SmolLM-135M and TinyLlama-1.1B
 *      linear shapes, int8 / int4 g32 / int4-sym g32 (and g128),
 *      interleaved rounds (default 7), median CPU seconds (user + sys of
 *      the process) and MB/s of f16 input per CPU second; with
 *      MC_NO_AVX512 / MC_NO_AVX2 as the kernels read them.
 * Usage: bench_quant [--quick] [--skip-big] [--rtn-rows [ROUNDS]] [SHARED_DIR] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cmp_calib.h"
#include "cmp_eval.h"
#include "cmp_quant.h"
#include "fmt_dtype.h"
#include "fmt_safetensors.h"
#include "kn_ops.h"
#include "kn_rtn.h"
#include "mc_alloc.h"
#include "rt_model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((float)(rng >> 40) / 16777216.0f - 0.5f) * 0.1f;
}

/* 1. RTN throughput over a generated >= 1 GiB safetensors file. */
static int bench_rtn(int quick)
{
    uint32_t R = 4096, C = 4096;
    int ntens = quick ? 2 : 17; /* 17 x 64 MiB = 1.06 GiB */
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/mc-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mc_error e;
    char buf[2048];
    fmt_st_writer *w = NULL;
    float *row = malloc((size_t)C * sizeof(float) * 256);
    if (fmt_st_writer_create(path, &w, &e) != MC_OK)
        goto fail;
    for (int t = 0; t < ntens; t++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", t);
        uint64_t shape[2] = {R, C};
        if (fmt_st_writer_add(w, name, FMT_DT_F32, 2, shape, &e) != MC_OK)
            goto fail;
    }
    if (fmt_st_writer_begin_data(w, &e) != MC_OK)
        goto fail;
    for (int t = 0; t < ntens; t++)
        for (uint32_t r = 0; r < R; r += 256) {
            for (size_t i = 0; i < (size_t)C * 256; i++)
                row[i] = frand();
            if (fmt_st_writer_write(w, row, (size_t)C * 256 * sizeof(float), &e) != MC_OK)
                goto fail;
        }
    if (fmt_st_writer_finish(w, &e) != MC_OK) {
        w = NULL;
        goto fail;
    }
    w = NULL;
    fmt_st_file *f = NULL;
    if (fmt_st_open(path, &f, &e) != MC_OK)
        goto fail;
    double gib = (double)ntens * R * C * 4 / (1 << 30);
    printf("RTN throughput on %.2f GiB of float32 weights (%d x %ux%u):\n", gib, ntens, R, C);
    kn_wformat fs[3] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    const char *nm[3] = {"int8 per channel", "int4 g32 asym", "int4 g32 sym"};
    for (int k = 0; k < 3; k++) {
        cmp_qbuf b = {fs[k], R, C, fs[k] == KN_W_Q8 ? 0 : 32, NULL, NULL, NULL};
        b.data = malloc(kn_wformat_data_bytes(fs[k], R, C));
        b.scales = malloc(kn_wformat_scale_bytes(fs[k], R, C, 32));
        size_t zb = kn_wformat_zero_bytes(fs[k], R, C, 32);
        b.zeros = zb ? malloc(zb) : NULL;
        double t0 = now_s();
        for (size_t i = 0; i < fmt_st_count(f); i++)
            if (cmp_quant_matrix(fmt_st_get(f, i)->data, NULL, &b, &e) != MC_OK) {
                free(b.data);
                free(b.scales);
                free(b.zeros);
                fmt_st_close(f);
                goto fail;
            }
        double dt = now_s() - t0;
        printf("  %-18s %8.1f MB/s  (%.2f s, one thread)\n", nm[k],
               (double)ntens * R * C * 4 / 1e6 / dt, dt);
        free(b.data);
        free(b.scales);
        free(b.zeros);
    }
    fmt_st_close(f);
    unlink(path);
    rmdir(dir);
    free(row);
    return 0;
fail:
    fmt_st_writer_abort(w);
    fprintf(stderr, "bench_quant: %s\n", mc_error_format(&e, buf, sizeof buf));
    unlink(path);
    rmdir(dir);
    free(row);
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* 1b. The compile's RTN fast path alone, one thread, CPU time. */
static int bench_rtn_rows(int rounds)
{
    /* SmolLM-135M: 576 x 1536 (up), 1536 x 576 (down); TinyLlama-1.1B:
     * 5632 x 2048 (up), 2048 x 5632 (down) */
    const uint32_t shapes[4][2] = {{1536, 576}, {576, 1536}, {5632, 2048}, {2048, 5632}};
    const char *sn[2] = {"SmolLM-135M mlp", "TinyLlama-1.1B mlp"};
    enum { NCASE = 4 };
    const kn_wformat fs[NCASE] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S, KN_W_Q4S};
    const uint32_t gs[NCASE] = {0, 32, 32, 128};
    const char *nm[NCASE] = {"int8", "int4 g32", "int4-sym g32", "int4-sym g128"};
    if (rounds > 64)
        rounds = 64;
    printf("RTN rows (cmp_quant_rtn_rows from f16, 1 thread, median of %d "
           "interleaved rounds, CPU s)%s:\n", rounds,
           !kn_cpu_has_avx2() ? " [no AVX2]" : !kn_cpu_has_avx512() ? " [no AVX-512]" : "");
    for (int sh = 0; sh < 2; sh++) {
        uint32_t R0 = shapes[2 * sh][0], C0 = shapes[2 * sh][1];
        size_t n = (size_t)R0 * C0; /* both shapes hold n */
        /* enough copies to run ~0.1 s+ per case and leave the caches */
        int reps = sh == 0 ? 96 : 12;
        uint16_t *h = malloc(n * sizeof *h);
        float *row = malloc(8192 * sizeof(float));
        uint8_t *d = malloc(n), *sc = malloc(n / 8), *z = malloc(n / 32 + 8);
        if (!h || !row || !d || !sc || !z)
            return 1;
        for (size_t i = 0; i < n; i++)
            h[i] = fmt_f32_to_f16(frand() * 0.4f);
        double t[NCASE][64];
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < NCASE; k++) {
                double t0 = bench_cpu_now();
                for (int rep = 0; rep < reps; rep++)
                    for (int m = 0; m < 2; m++) {
                        uint32_t R = shapes[2 * sh + m][0], C = shapes[2 * sh + m][1];
                        cmp_qbuf b = {fs[k], R, C, gs[k], d, sc,
                                      fs[k] == KN_W_Q4 ? z : NULL, CMP_Q8_PLAIN};
                        cmp_quant_rtn_rows(h, KN_RTN_F16, &b, 0, R, row);
                    }
                t[k][r] = bench_cpu_now() - t0;
            }
        double mb = (double)n * 2 * 2 * reps / 1e6;
        printf("  %s (%ux%u + %ux%u) x %d, %.0f MB f16:\n", sn[sh], R0, C0, C0,
               R0, reps, mb);
        for (int k = 0; k < NCASE; k++) {
            qsort(t[k], (size_t)rounds, sizeof(double), cmp_double);
            double med = t[k][rounds / 2];
            printf("    %-14s %7.4f s  %8.1f MB/cpu-s  (min %.4f max %.4f)\n", nm[k],
                   med, mb / med, t[k][0], t[k][rounds - 1]);
        }
        free(h);
        free(row);
        free(d);
        free(sc);
        free(z);
    }
    double la[3];
    if (getloadavg(la, 3) == 3)
        printf("  load average %.2f %.2f %.2f\n", la[0], la[1], la[2]);
    return 0;
}

typedef struct bw_ctx {
    uint64_t *p;
    size_t n;
    uint64_t sink[64];
} bw_ctx;

static void bw_sum(void *ctx, int tid, int nth)
{
    bw_ctx *c = ctx;
    size_t a = c->n * (size_t)tid / (size_t)nth, b = c->n * (size_t)(tid + 1) / (size_t)nth;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = a; i + 4 <= b; i += 4) {
        s0 += c->p[i];
        s1 += c->p[i + 1];
        s2 += c->p[i + 2];
        s3 += c->p[i + 3];
    }
    c->sink[tid & 63] = s0 + s1 + s2 + s3;
}

/* 2. Decode throughput: one token through n matrices of R x C. */
static void bench_decode(int quick, kn_pool *pool)
{
    uint32_t R = 8192, C = 8192;
    int n = quick ? 1 : 8; /* 8 x 128 MiB f16 = 1 GiB */
    /* Read bandwidth: every pool thread sums its slice of a 1 GiB buffer
     * (best of three passes). */
    size_t bw_bytes = quick ? (256u << 20) : (1u << 30);
    bw_ctx bc = {malloc(bw_bytes), bw_bytes / 8, {0}};
    for (size_t i = 0; i < bc.n; i++)
        bc.p[i] = i;
    double best_bw = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        kn_pool_run(pool, bw_sum, &bc);
        double bw = (double)bw_bytes / (now_s() - t0);
        if (bw > best_bw)
            best_bw = bw;
    }
    free(bc.p);
    printf("\ndecode, %d linears of %ux%u (%d threads); read bandwidth %.1f GB/s "
           "(summing 1 GiB):\n", n, R, C, pool ? kn_pool_threads(pool) : 1,
           best_bw / 1e9);
    kn_wformat fs[3] = {KN_W_F16, KN_W_Q8, KN_W_Q4};
    const char *nm[3] = {"f16", "int8", "int4 g32"};
    float *w = malloc((size_t)R * C * sizeof(float));
    for (size_t i = 0; i < (size_t)R * C; i++)
        w[i] = frand();
    float *x = malloc(C * sizeof(float)), *y = malloc(R * sizeof(float));
    for (uint32_t i = 0; i < C; i++)
        x[i] = frand();
    for (int k = 0; k < 3; k++) {
        kn_matrix m = {fs[k], R, C, NULL, NULL, NULL, fs[k] == KN_W_Q4 ? 32 : 0, KN_LAYOUT_ROWS};
        void *data = malloc(kn_wformat_data_bytes(fs[k], R, C));
        void *sc = NULL, *z = NULL;
        if (fs[k] == KN_W_F16) {
            fmt_from_f32(FMT_DT_F16, w, data, (size_t)R * C);
        } else {
            sc = malloc(kn_wformat_scale_bytes(fs[k], R, C, 32));
            size_t zb = kn_wformat_zero_bytes(fs[k], R, C, 32);
            z = zb ? malloc(zb) : NULL;
            cmp_qbuf b = {fs[k], R, C, m.group, data, sc, z};
            cmp_quant_matrix(w, NULL, &b, NULL);
        }
        m.data = data;
        m.scales = sc;
        m.zeros = z;
        uint64_t bytes = kn_wformat_data_bytes(fs[k], R, C) +
                         kn_wformat_scale_bytes(fs[k], R, C, 32) +
                         kn_wformat_zero_bytes(fs[k], R, C, 32);
        int steps = quick ? 3 : 10;
        double t0 = now_s();
        for (int s = 0; s < steps; s++)
            for (int i = 0; i < n; i++) /* the same matrix n times: */
                kn_matmul(pool, &m, x, 1, y, NULL); /* memory-bound at this size */
        double per_tok = (now_s() - t0) / steps;
        double bound = best_bw / ((double)bytes * n);
        printf("  %-9s %7.2f tokens/s  (%.0f MiB/token, bound %.2f tokens/s, %.0f %%)\n",
               nm[k], 1.0 / per_tok, (double)bytes * n / (1 << 20), bound,
               100.0 / per_tok / bound);
        free(data);
        free(sc);
        free(z);
    }
    free(w);
    free(x);
    free(y);
}

/* 3. stories260k quality table and calibration time per layer. */
static void bench_stories(const char *shared, kn_pool *pool)
{
    char dir[1200], cp[1300], ep[1300];
    snprintf(dir, sizeof dir, "%.1024s/models/stories260k", shared);
    snprintf(cp, sizeof cp, "%s/reference/calib_64x256.ids", dir);
    snprintf(ep, sizeof ep, "%s/reference/eval_64x256.ids", dir);
    rt_model *m = NULL;
    int32_t *ct = NULL, *et = NULL;
    size_t *co = NULL, *eo = NULL, nc = 0, ne = 0;
    mc_error e;
    char buf[2048];
    if (rt_model_open_hf(dir, &m, &e) != MC_OK ||
        cmp_ids_load(cp, &ct, &co, &nc, &e) != MC_OK ||
        cmp_ids_load(ep, &et, &eo, &ne, &e) != MC_OK) {
        printf("\nstories260k: skipped (%s)\n", mc_error_format(&e, buf, sizeof buf));
        goto out;
    }
    printf("\nstories260k: calibrate on calib_64x256 (%zu seqs), evaluate on "
           "eval_64x256 (%zu seqs)\n", nc, ne);
    printf("  %-9s %-13s %9s %7s %9s %8s %9s %9s %10s\n", "format", "method",
           "KLD", "x RTN", "KLD p99", "top-1", "ppl", "ppl ref", "s/layer");
    kn_wformat fs[2] = {KN_W_Q8, KN_W_Q4};
    cmp_qmethod ms[5] = {CMP_QM_RTN, CMP_QM_GPTQ, CMP_QM_AWQ, CMP_QM_GPTAQ, CMP_QM_BEST};
    for (int f = 0; f < 2; f++) {
        double rtn_kld = 0.0; /* the baseline: plain RTN, not rotated */
        for (int k = 0; k < 10; k++) {
            int rot = k >= 5;
            cmp_calib_opts o;
            memset(&o, 0, sizeof o);
            o.fmt = fs[f];
            o.group = 32;
            o.method = ms[k % 5];
            o.rotate = rot;
            o.pool = pool;
            cmp_calib_result *r = NULL;
            if (cmp_calib_run(m, ct, co, nc, &o, &r, &e) != MC_OK) {
                printf("  calibration failed: %s\n", mc_error_format(&e, buf, sizeof buf));
                continue;
            }
            double sec = 0.0;
            for (uint32_t l = 0; l < r->layers; l++)
                sec += r->layer_seconds[l];
            rt_model v;
            cmp_eval_report rep;
            memset(&rep, 0, sizeof rep);
            if (cmp_calib_view(m, r, &v, &e) == MC_OK) {
                cmp_eval_models(m, &v, et, eo, ne, pool, NULL, NULL, &rep, &e);
                cmp_calib_view_free(&v);
            }
            if (k == 0)
                rtn_kld = rep.kld_mean;
            char name[32];
            snprintf(name, sizeof name, "%s%s", cmp_qmethod_name(ms[k % 5]),
                     rot ? "+rot" : "");
            printf("  %-9s %-13s %9.4f %7.3f %9.4f %7.2f%% %9.3f %9.3f %10.3f\n",
                   f ? "int4 g32" : "int8", name, rep.kld_mean,
                   rtn_kld > 0.0 ? rep.kld_mean / rtn_kld : 0.0, rep.kld_p99,
                   100.0 * rep.top1, rep.ppl, rep.ppl_ref, sec / r->layers);
            fflush(stdout);
            cmp_calib_result_free(r);
        }
    }
out:
    rt_model_free(m);
    mc_free(ct);
    mc_free(co);
    mc_free(et);
    mc_free(eo);
}

int main(int argc, char **argv)
{
    int quick = 0, skip_big = 0;
    if (argc >= 2 && !strcmp(argv[1], "--rtn-rows"))
        return bench_rtn_rows(argc >= 3 ? (int)bench_arg_u64("--rtn-rows", argv[2], 1, 64) : 7);
    /* Default: ../shared beside the checkout (this file is
     * <checkout>/bench/bench_quant.c), or $MC_SHARED_DIR. */
    char def[1024];
    snprintf(def, sizeof def, "%s", __FILE__);
    char *slash = strrchr(def, '/');
    if (slash)
        *slash = 0;
    size_t dl = strlen(def);
    snprintf(def + dl, sizeof def - dl, "/../../shared");
    const char *shared = getenv("MC_SHARED_DIR") ? getenv("MC_SHARED_DIR") : def;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--skip-big"))
            skip_big = 1;
        else
            shared = argv[i];
    }
    kn_pool *pool = kn_pool_create(0);
    int rc = 0;
    if (!skip_big) {
        rc = bench_rtn(quick);
        bench_decode(quick, pool);
    }
    bench_stories(shared, pool);
    kn_pool_free(pool);
    return rc;
}

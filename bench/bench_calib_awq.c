/* bench_calib_awq.c - AWQ's alpha search per layer of the SmolLM2-135M
 * shape (issue 17): the three searches `best` runs per block (q/k/v: 960
 * x 576, gate/up: 3072 x 576, down: 576 x 1536; o is not scaled under
 * GQA), on random weights and a Hessian of random tokens with salient
 * channels.  Each is timed three ways: the full 20-point grid on one
 * thread with the scalar output error (the search before this change),
 * the full grid on the pool with the AVX2 output error where the CPU has
 * it (must give the same bits: checked, exit 1 if not), and the coarse
 * walk on the pool (the default since).  Prints wall and CPU seconds per search and
 * per layer, the ratios to the baseline, and the load average.
 * usage: bench_calib_awq [--threads N] [--tokens T]   (defaults: every
 * CPU, 2048 tokens; the search's cost does not depend on the tokens) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cmp_awq.h"
#include "cmp_gptq.h"
#include "kn_ops.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct timed {
    double wall, cpu, alpha, e;
    float *s;
} timed;

static int run(const cmp_hessian *h, const float *xa, const cmp_awq_linear *l,
               size_t n, kn_pool *pool, int coarse, timed *t)
{
    cmp_awq_search_opts so = {pool, coarse, 0};
    double w0 = bench_now(), c0 = cpu_now();
    mc_status st = cmp_awq_search(h, xa, l, n, KN_W_Q8, 0, &so, t->s,
                                  &t->alpha, &t->e, NULL, NULL);
    t->wall = bench_now() - w0;
    t->cpu = cpu_now() - c0;
    return st == MC_OK ? 0 : -1;
}

int main(int argc, char **argv)
{
    int threads = 0;
    size_t T = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens"))
            T = strtoul(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_calib_awq [--threads N] [--tokens T]\n");
            return 2;
        }
    }
    static const struct {
        const char *name;
        uint32_t cols, rows[3];
        size_t n;
    } G[3] = {{"q/k/v", 576, {576, 192, 192}, 3},
              {"gate/up", 576, {1536, 1536, 0}, 2},
              {"down", 1536, {576, 0, 0}, 1}};
    kn_pool *pool = kn_pool_create(threads);
    int nth = pool ? kn_pool_threads(pool) : 1;
    printf("bench_calib_awq: SmolLM2-135M shape, int8, %zu tokens, %d threads\n",
           T, nth);
    uint64_t rs = 17;
    double sum[3][2] = {{0}};
    int rc = 0;
    for (int g = 0; g < 3; g++) {
        uint32_t C = G[g].cols;
        float *X = malloc(T * C * sizeof(float)), *xa = calloc(C, sizeof(float));
        cmp_awq_linear l[3];
        cmp_hessian h;
        if (!X || !xa || cmp_hessian_init(&h, C, NULL) != MC_OK)
            return 1;
        for (size_t i = 0; i < T * C; i++) {
            float v = bench_rnd(&rs, 0.0f, 1.0f);
            X[i] = (i % C) % 37 == 0 ? 15.0f * v : v; /* salient channels */
            xa[i % C] += fabsf(X[i]) / (float)T;
        }
        cmp_hessian_add_par(pool, &h, X, T);
        for (size_t k = 0; k < G[g].n; k++) {
            size_t nw = (size_t)G[g].rows[k] * C;
            float *w = malloc(nw * sizeof(float));
            if (!w)
                return 1;
            for (size_t i = 0; i < nw; i++)
                w[i] = bench_rnd(&rs, 0.0f, 0.05f);
            l[k] = (cmp_awq_linear){w, G[g].rows[k]};
        }
        timed t[3];
        for (int k = 0; k < 3; k++)
            t[k].s = malloc(C * sizeof(float));
        kn_set_force_scalar(1); /* the output error before its AVX2 path */
        int bad = run(&h, xa, l, G[g].n, NULL, 0, &t[0]);
        kn_set_force_scalar(0);
        if (bad ||
            run(&h, xa, l, G[g].n, pool, 0, &t[1]) ||
            run(&h, xa, l, G[g].n, pool, 1, &t[2]))
            return 1;
        int same = t[0].e == t[1].e && t[0].alpha == t[1].alpha &&
                   memcmp(t[0].s, t[1].s, C * sizeof(float)) == 0;
        rc |= !same;
        printf("  %-8s %4u cols: full 1 thread scalar %6.2f s wall %6.2f s cpu | "
               "full pool %6.2f s wall %6.2f s cpu (same bits: %s) | coarse pool %6.2f s "
               "wall %6.2f s cpu, alpha %.2f vs %.2f, error x %.5f\n",
               G[g].name, C, t[0].wall, t[0].cpu, t[1].wall, t[1].cpu,
               same ? "yes" : "NO",
               t[2].wall, t[2].cpu, t[2].alpha, t[0].alpha, t[2].e / t[0].e);
        for (int k = 0; k < 3; k++) {
            sum[k][0] += t[k].wall;
            sum[k][1] += t[k].cpu;
            free(t[k].s);
        }
        for (size_t k = 0; k < G[g].n; k++)
            free((void *)l[k].w);
        cmp_hessian_free(&h);
        free(X);
        free(xa);
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    printf("  per layer: full 1 thread scalar %.2f s wall %.2f s cpu; full pool %.2f s "
           "wall %.2f s cpu (x %.2f wall); coarse pool %.2f s wall %.2f s cpu (x %.2f wall, "
           "x %.2f cpu) | load %.2f %.2f %.2f\n",
           sum[0][0], sum[0][1], sum[1][0], sum[1][1], sum[0][0] / sum[1][0],
           sum[2][0],
           sum[2][1], sum[0][0] / sum[2][0], sum[0][1] / sum[2][1], load[0],
           load[1], load[2]);
    kn_pool_free(pool);
    return rc;
}

/* bench_factor.c - CPU seconds of the calibration's factorization phase at
 * real widths: GPTQ's inverse factor (Cholesky, then the inverse and the
 * index reversal), the GPTQ column loop on a few rows, and GPTAQ's
 * retarget solve on a few rows.
 *
 * The matrix is a synthetic Hessian as the tests build them: H = X^T X of
 * `tokens` random rows (LCG, uniform +-1, each input scaled by 1 + j % 7)
 * plus 1 % of its mean diagonal (GPTQ's dampening).  Values do not change
 * the factorization's cost.  The column loop and the retarget cost
 * rows x n^2 (per-row), so they run `rows` rows and print seconds per
 * row as well; scale by the real row count.
 *
 * Usage: bench_factor [--n N] [--rows R] [--tokens T] [--threads T]
 *                     [--skip-hinv] [--skip-gptq] [--skip-retarget]
 *                     [--act-order]
 * Defaults: n 4096, rows 256, tokens 256, threads 2.  Prints one line per
 * step: CPU seconds (all threads), wall seconds, and the 1-minute load.
 * --act-order: the inverse factor reads H through a shuffled column order,
 * as GPTQ's act-order does (the columns sorted by H's diagonal, which
 * for real activations is close to a random order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cmp_gptq.h"
#include "cmp_gptq_internal.h"
#include "kn_quant.h"
#include "mc_alloc.h"

typedef struct tick {
    double cpu, wall;
} tick;

static tick tick_now(void)
{
    tick t = {bench_cpu_now(), bench_now()};
    return t;
}

static void report(const char *what, size_t n, tick t0, double per)
{
    tick t1 = tick_now();
    double cpu = t1.cpu - t0.cpu, wall = t1.wall - t0.wall;
    printf("%-10s n %6zu  cpu %9.3f s  wall %9.3f s", what, n, cpu, wall);
    if (per > 0)
        printf("  (cpu %.4g s per row)", cpu / per);
    printf("  load %.2f\n", bench_loadavg());
    fflush(stdout);
}

int main(int argc, char **argv)
{
    uint64_t n = 4096, rows = 256, tokens = 256, threads = 2;
    int skip_gptq = 0, skip_rt = 0, skip_hinv = 0, act_order = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = bench_arg_u64("--n", argv[++i], 1, 65536);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = bench_arg_u64("--rows", argv[++i], 1, 1u << 20);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = bench_arg_u64("--tokens", argv[++i], 1, 1u << 20);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--skip-gptq"))
            skip_gptq = 1;
        else if (!strcmp(argv[i], "--skip-hinv"))
            skip_hinv = 1;
        else if (!strcmp(argv[i], "--skip-retarget"))
            skip_rt = 1;
        else if (!strcmp(argv[i], "--act-order"))
            act_order = 1;
        else {
            fprintf(stderr, "usage: bench_factor [--n N] [--rows R] [--tokens T] "
                            "[--threads T] [--skip-hinv] [--skip-gptq] "
                            "[--skip-retarget] [--act-order]\n");
            return 2;
        }
    }
    kn_pool *pool = threads > 1 ? kn_pool_create((int)threads) : NULL;
    mc_error e;
    cmp_hessian h;
    if (cmp_hessian_init(&h, (uint32_t)n, &e) != MC_OK) {
        fprintf(stderr, "%s\n", e.message);
        return 1;
    }
    float *X = malloc(tokens * n * sizeof(float));
    double *A = malloc(n * n * sizeof(double)), *row = malloc(n * sizeof(double));
    uint32_t *perm = malloc(n * sizeof(uint32_t));
    if (!X || !A || !row || !perm)
        return 1;
    uint64_t s = 12345;
    for (size_t t = 0; t < tokens; t++)
        for (size_t j = 0; j < n; j++)
            X[t * n + j] = bench_rnd(&s, 0.0f, 1.0f) * (float)(1 + j % 7);
    cmp_hessian_add_par(pool, &h, X, tokens);
    double mean = 0.0;
    for (uint32_t j = 0; j < n; j++)
        mean += cmp_hessian_get(&h, j, j);
    double lambda = 0.01 * mean / (double)n;
    for (uint32_t j = 0; j < n; j++)
        perm[j] = j;
    for (size_t j = n; act_order && j > 1; j--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = (size_t)((s >> 33) % j);
        uint32_t t = perm[j - 1];
        perm[j - 1] = perm[k];
        perm[k] = t;
    }
    printf("bench_factor: n %llu, threads %llu, tokens %llu, rows %llu\n",
           (unsigned long long)n, (unsigned long long)threads,
           (unsigned long long)tokens, (unsigned long long)rows);

    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++)
            A[i * n + j] = cmp_hessian_get(&h, (uint32_t)i, (uint32_t)j) +
                           (i == j ? lambda : 0.0);
    tick t0 = tick_now();
    if (cmp_gptq_cholesky_lower(A, n, pool) != 0)
        return 1;
    report("cholesky", n, t0, 0);
    t0 = tick_now();
    if (!skip_hinv) {
        if (cmp_gptq_hinv_factor(&h, perm, lambda, A, row, pool, &e) != MC_OK)
            return 1;
        report("hinv", n, t0, 0);
    }

    float *w = malloc(rows * n * sizeof(float));
    if (!w)
        return 1;
    for (size_t i = 0; i < rows * n; i++)
        w[i] = bench_rnd(&s, 0.0f, 0.05f);
    if (!skip_gptq) {
        cmp_gptq_factor f;
        if (cmp_gptq_factor_make(&h, 0.01, 0, pool, NULL, &f, &e) != MC_OK)
            return 1;
        uint32_t g = 128, R = (uint32_t)rows, C = (uint32_t)n;
        void *data = malloc(kn_wformat_data_bytes(KN_W_Q4, R, C));
        void *sc = malloc(kn_wformat_scale_bytes(KN_W_Q4, R, C, g));
        uint8_t *z = malloc(kn_wformat_zero_bytes(KN_W_Q4, R, C, g));
        cmp_qbuf q = {KN_W_Q4, R, C, g, data, sc, z};
        cmp_gptq_opts o = {0};
        o.pool = pool;
        o.factor = &f;
        t0 = tick_now();
        if (cmp_gptq_quantize(w, &h, &o, &q, NULL, NULL, &e) != MC_OK) {
            fprintf(stderr, "%s\n", e.message);
            return 1;
        }
        report("gptq_loop", n, t0, (double)rows);
        free(data);
        free(sc);
        free(z);
        cmp_gptq_factor_free(&f);
    }
    if (!skip_rt) {
        double *c = malloc(n * n * sizeof(double));
        float *out = malloc(rows * n * sizeof(float));
        if (!c || !out)
            return 1;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < n; j++)
                c[i * n + j] = cmp_hessian_get(&h, (uint32_t)i, (uint32_t)j);
        t0 = tick_now();
        if (cmp_gptq_retarget(&h, c, w, (uint32_t)rows, 0.01, out, pool, &e) != MC_OK)
            return 1;
        report("retarget", n, t0, (double)rows);
        free(c);
        free(out);
    }
    free(w);
    free(X);
    free(A);
    free(row);
    free(perm);
    cmp_hessian_free(&h);
    kn_pool_free(pool);
    return 0;
}

/* bench_stats.c - the calibration's statistics sums alone: Hq (packed
 * upper triangle, cmp_hessian_add_par) and the cross term C = sum x_f x_q^T
 * (cmp_cross_add) at the input widths of the SmolLM2-135M shape (576: q/k/v,
 * o, gate/up; 1536: down), 16 sequences of 512 random tokens each, on 1 and
 * on N threads.  Prints seconds per call set, GFLOP/s (one multiply-add = 2
 * flops; the triangle counts n(n+1)/2 elements) and the time the full
 * SmolLM2 calibration would spend in these sums per 1K tokens and input
 * (Hq + Hf + C), the CPU seconds of both sums (the machine may be shared:
 * GFLOP per CPU-second is the steadier figure), and the
 * largest relative difference of the sums against a double reference on
 * the first sequence.  Each configuration runs with float products (f32,
 * the baseline) and with bfloat16 products (bf16, the calibration's
 * default: kn_gram_tri_bf16), and prints bf16's speed-up in CPU seconds.
 * Usage: bench_stats [--threads N] [--quick]   (N default 2; --quick: 4
 * sequences) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cmp_gptq.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Inputs with a few large channels, as trained models have. */
static float *inputs(size_t T, uint32_t n, uint64_t seed)
{
    float *x = malloc(T * n * sizeof(float));
    for (size_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < n; j++)
            x[t * n + j] = frand(&seed) * (j % 97 == 0 ? 20.0f : 1.0f);
    return x;
}

/* max over elements |got - ref| / max|ref| for the packed triangle */
static double tri_err(const cmp_hessian *h, const float *x, size_t T)
{
    uint32_t n = h->cols;
    double emax = 0.0, rmax = 0.0;
    for (uint32_t i = 0; i < n; i += 7)
        for (uint32_t j = i; j < n; j++) {
            double s = 0.0;
            for (size_t t = 0; t < T; t++)
                s += (double)x[t * n + i] * x[t * n + j];
            emax = fmax(emax, fabs(cmp_hessian_get(h, i, j) - s));
            rmax = fmax(rmax, fabs(s));
        }
    return emax / rmax;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One configuration; its CPU seconds in *cpu_out. */
static int run(uint32_t n, size_t nseq, size_t T, kn_pool *pool, int bf16,
               double *cpu_out)
{
    float *xf = inputs(nseq * T, n, 1), *xq = inputs(nseq * T, n, 2);
    cmp_hessian h;
    if (cmp_hessian_init(&h, n, NULL) != MC_OK)
        return 1;
    h.bf16 = bf16;
    double *c = calloc((size_t)n * n, sizeof(double));
    /* accuracy on one sequence */
    cmp_hessian_add_par(pool, &h, xq, T);
    double e = tri_err(&h, xq, T);
    cmp_hessian_reset(&h);
    double c0 = cpu_now(), t0 = bench_now();
    for (size_t s = 0; s < nseq; s++)
        cmp_hessian_add_par(pool, &h, xq + s * T * n, T);
    double th = bench_now() - t0;
    t0 = bench_now();
    for (size_t s = 0; s < nseq; s++)
        cmp_cross_add(pool, c, xf + s * T * n, xq + s * T * n, T, n, h.xt, bf16);
    double tc = bench_now() - t0, cpu = cpu_now() - c0;
    double tok = (double)(nseq * T);
    double fh = (double)n * (n + 1) / 2 * 2 * tok, fc = (double)n * n * 2 * tok;
    printf("%-4s width %4u threads %d: Hq %.3f s (%.1f GFLOP/s)  C %.3f s (%.1f GFLOP/s)"
           "  per 1K tokens %.2f ms (Hq+Hf+C)  CPU %.3f s (%.1f GFLOP/CPU-s)"
           "  rel.err %.1e\n",
           bf16 ? "bf16" : "f32", n, kn_pool_threads(pool), th, fh / th * 1e-9,
           tc, fc / tc * 1e-9, (2 * th + tc) / tok * 1e6, cpu,
           (fh + fc) / cpu * 1e-9, e);
    *cpu_out = cpu;
    cmp_hessian_free(&h);
    free(c);
    free(xf);
    free(xq);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = 2;
    size_t nseq = 16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--quick"))
            nseq = 4;
        else {
            fprintf(stderr, "usage: bench_stats [--threads N] [--quick]\n");
            return 2;
        }
    }
    kn_pool *p1 = kn_pool_create(1), *pn = kn_pool_create(threads);
    if (!p1 || !pn)
        return 1;
    static const uint32_t widths[2] = {576, 1536};
    int rc = 0;
    if (!kn_cpu_has_avx512bf16())
        printf("no AVX512_BF16 here (or MC_NO_BF16): bf16 runs the float "
               "tiles' emulation\n");
    for (int k = 0; k < 2; k++)
        for (int pk = 0; pk < 2; pk++) {
            double c32 = 0.0, c16 = 0.0;
            rc |= run(widths[k], nseq, 512, pk ? pn : p1, 0, &c32);
            rc |= run(widths[k], nseq, 512, pk ? pn : p1, 1, &c16);
            printf("     width %4u threads %d: bf16 / f32 speed-up %.2fx (CPU s)\n",
                   widths[k], kn_pool_threads(pk ? pn : p1), c16 > 0 ? c32 / c16 : 0.0);
        }
    kn_pool_free(p1);
    kn_pool_free(pn);
    return rc;
}

/* bench_gemm.c - prefill matrix products (kn_matmul / kn_matmul_q with T
 * tokens) on the TinyLlama-1.1B shapes, per weight format, against the
 * same product done 8 tokens at a time (the decode kernels: what prefill
 * cost before it was a GEMM).  Prints, per format, shape and T: GMAC/s of
 * the prefill call, GMAC/s of the 8-token slices, and their ratio.  The
 * integer formats include quantizing the activations (as kn_block does).
 *
 * usage: bench_gemm [--threads N] [--reps N] [--T a,b,...] [--cpu]
 *                   [--fmt f16|f32|int8|int4g32|int4ag32] [--shapes tiny|smol] [--no-slices]
 * --no-slices: skip the 8-token slices (their columns print 0).
 * --shapes smol: the SmolLM-135M shapes (hidden 576, FFN 1536) instead of
 * TinyLlama's.  f32 runs only when asked for (--fmt f32).
 * MC_NO_AVX512=1 in the environment: the AVX2 kernels (A/B of one binary).
 * --cpu: GMAC per CPU-second of the process instead of per wall second
 * (with --threads 1, a busy machine's figure close to a quiet one's).
 * The load average is printed first: figures are noisy on a busy machine.
 * Then the core's float FMA peak, measured the same way (12 independent
 * 8-lane FMA chains in registers, no memory; per thread), and each figure
 * as a fraction of it: that is the ceiling of the float GEMM, and the
 * integer one runs on the same two FMA pipes (kn_gemm_avx2.c, qmicro). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#include "bench_util.h"
#include "fmt_dtype.h"
#include "kn_ops.h"
#include "kn_qdot.h"

typedef struct bmat {
    kn_matrix m;
    void *data, *scales;
    uint8_t *zeros; /* Q4 only */
} bmat;

static bmat bmat_make(kn_wformat f, uint32_t rows, uint32_t cols, uint64_t *st)
{
    bmat b;
    memset(&b, 0, sizeof b);
    b.m.fmt = f;
    b.m.rows = rows;
    b.m.cols = cols;
    b.m.group = f == KN_W_Q4S || f == KN_W_Q4 ? 32 : 0;
    size_t db = (size_t)kn_wformat_data_bytes(f, rows, cols);
    size_t sb = (size_t)kn_wformat_scale_bytes(f, rows, cols, 32);
    b.data = malloc(db);
    b.scales = sb ? malloc(sb) : NULL;
    size_t zb = (size_t)kn_wformat_zero_bytes(f, rows, cols, 32);
    b.zeros = zb ? malloc(zb) : NULL;
    if (!b.data || (sb && !b.scales) || (zb && !b.zeros)) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    uint8_t *d = b.data;
    if (f == KN_W_F32)
        for (size_t i = 0; i < db / 4; i++)
            ((float *)d)[i] = bench_rnd(st, 0.0f, 0.05f);
    else if (f == KN_W_F16)
        for (size_t i = 0; i < db / 2; i++)
            ((uint16_t *)d)[i] = fmt_f32_to_f16(bench_rnd(st, 0.0f, 0.05f));
    else
        for (size_t i = 0; i < db; i++)
            d[i] = (uint8_t)(bench_rnd(st, 128.0f, 100.0f));
    if (f == KN_W_Q8)
        for (uint32_t r = 0; r < rows; r++)
            ((float *)b.scales)[r] = 0.001f;
    else if (f == KN_W_Q4S || f == KN_W_Q4)
        for (size_t i = 0; i < sb / 2; i++)
            ((uint16_t *)b.scales)[i] = fmt_f32_to_f16(0.01f);
    for (size_t i = 0; i < zb; i++)
        b.zeros[i] = (uint8_t)(4 + i % 8);
    b.m.data = b.data;
    b.m.scales = b.scales;
    b.m.zeros = b.zeros;
    return b;
}


static int g_cpu; /* 1: time in CPU seconds (--cpu) */

typedef struct bshape {
    const char *name;
    uint32_t rows, cols;
} bshape;

/* Seconds of one product of T tokens, in slices of `slice` tokens. */
static double run_once(kn_pool *p, const kn_matrix *W, const float *X,
                       size_t T, float *Y, void *xq, size_t slice)
{
    double t0 = g_cpu ? bench_cpu_now() : bench_now();
    int q = W->fmt == KN_W_Q8 || W->fmt == KN_W_Q4S || W->fmt == KN_W_Q4;
    for (size_t t = 0; t < T; t += slice) {
        size_t n = T - t < slice ? T - t : slice;
        if (q) {
            kn_qact_quantize(kn_qact_kind_of(W), X + t * W->cols, n, W->cols, xq);
            kn_matmul_q(p, W, xq, n, Y + t * W->rows, NULL);
        } else {
            kn_matmul(p, W, X + t * W->cols, n, Y + t * W->rows, NULL);
        }
    }
    return (g_cpu ? bench_cpu_now() : bench_now()) - t0;
}

/* GMAC/s of 12 independent FMA chains (the float GEMM's register tile,
 * without its loads), one thread, best of 3; 0 without AVX2/FMA. */
__attribute__((target("avx2,fma"))) static double fma_peak_avx2(float seed)
{
    __m256 a[12], x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
    double best = 1e30;
    const long n = 20000000;
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_set1_ps(seed + (float)i);
        double t0 = g_cpu ? bench_cpu_now() : bench_now();
        for (long k = 0; k < n; k++)
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++)
                a[i] = _mm256_fmadd_ps(a[i], x, y);
        double t = (g_cpu ? bench_cpu_now() : bench_now()) - t0;
        best = t < best ? t : best;
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    if (out[0] == 12345.0f) /* keeps the chains live */
        printf("#");
    return (double)n * 12 * 8 / best * 1e-9;
}

static double best_of(int reps, kn_pool *p, const kn_matrix *W,
                      const float *X, size_t T, float *Y, void *xq,
                      size_t slice)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double s = run_once(p, W, X, T, Y, xq, slice);
        best = s < best ? s : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 3;
    const char *only = NULL; /* --fmt: one format */
    int smol = 0;            /* --shapes smol */
    int no_slices = 0;       /* --no-slices: skip the 8-token slices */
    size_t Ts[8] = {128, 512};
    size_t nT = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        } else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "smol"))
                smol = 1;
            else if (strcmp(argv[i], "tiny"))
                argc = 0; /* usage below */
        } else if (!strcmp(argv[i], "--no-slices")) {
            no_slices = 1;
        } else if (!strcmp(argv[i], "--cpu")) {
            g_cpu = 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = (int)bench_arg_u64("--reps", argv[++i], 1, 1000000);
        } else if (!strcmp(argv[i], "--T") && i + 1 < argc) {
            nT = 0;
            for (char *s = strtok(argv[++i], ","); s && nT < 8; s = strtok(NULL, ","))
                Ts[nT++] = (size_t)atol(s);
        } else {
            fprintf(stderr, "usage: bench_gemm [--threads N] [--reps N] [--T a,b,...] [--cpu] [--fmt f16|f32|int8|int4g32|int4ag32] [--shapes tiny|smol] [--no-slices]\n");
            return 2;
        }
    }
    if (reps < 1 || nT == 0 || argc == 0) {
        fprintf(stderr, "usage: bench_gemm [--threads N] [--reps N] [--T a,b,...] [--cpu] [--fmt f16|f32|int8|int4g32|int4ag32] [--shapes tiny|smol] [--no-slices]\n");
        return 2;
    }
    size_t Tmax = 0;
    for (size_t i = 0; i < nT; i++)
        Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    static const bshape tiny[] = {
        {"q/o 2048x2048", 2048, 2048},
        {"gate/up 5632x2048", 5632, 2048},
        {"down 2048x5632", 2048, 5632},
    }, smolsh[] = {
        {"q/o 576x576", 576, 576},
        {"gate/up 1536x576", 1536, 576},
        {"down 576x1536", 576, 1536},
    };
    const bshape *shapes = smol ? smolsh : tiny;
    /* int4g32 is the symmetric int4 (KN_W_Q4S, GGUF Q4_0's kind: mcompile
     * --quant int4-sym); int4ag32 the asymmetric one (KN_W_Q4, mcompile
     * --quant int4), run only when asked for */
    static const kn_wformat fmts[] = {KN_W_F16, KN_W_Q8, KN_W_Q4S, KN_W_F32, KN_W_Q4};
    static const char *fnames[] = {"f16", "int8", "int4g32", "f32", "int4ag32"};
    kn_pool *p = kn_pool_create(threads);
    /* 64-byte aligned, as the runtime's arena (RT_LAYOUT_ALIGN) places
     * activations: malloc's 16-byte alignment splits every other 32-byte
     * load of X across two cache lines */
    float *X = aligned_alloc(64, Tmax * 5632 * sizeof(float));
    float *Y = aligned_alloc(64, Tmax * 5632 * sizeof(float));
    void *xq = malloc((size_t)kn_qact_bytes(KN_QACT_I16, Tmax, 5632));
    if (!p || !X || !Y || !xq) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        return 1;
    }
    uint64_t st = 42;
    for (size_t i = 0; i < Tmax * 5632; i++)
        X[i] = bench_rnd(&st, 0.0f, 1.0f);
    printf("bench_gemm: threads %d, best of %d, %s, %s, load average %.2f\n",
           threads, reps, g_cpu ? "per CPU-second" : "per wall second",
           kn_cpu_has_avx512() ? "AVX-512" : "AVX2", bench_loadavg());
    double peak = kn_cpu_has_avx2() ? fma_peak_avx2((float)threads) : 0.0;
    printf("float FMA peak, 1 thread: %.2f GMAC/s\n", peak);
    printf("%-8s %-18s %5s %10s %10s %7s %7s\n", "format", "shape", "T",
           "GMAC/s", "8-slices", "ratio", "%peak");
    for (size_t f = 0; f < 5; f++)
        for (size_t s = 0; s < 3 && (only ? !strcmp(only, fnames[f]) : f < 3); s++) {
            bmat b = bmat_make(fmts[f], shapes[s].rows, shapes[s].cols, &st);
            for (size_t i = 0; i < nT; i++) {
                size_t T = Ts[i];
                double macs = (double)T * b.m.rows * b.m.cols;
                double g = best_of(reps, p, &b.m, X, T, Y, xq, T);
                double g8 = no_slices ? 0.0 : best_of(reps, p, &b.m, X, T, Y, xq, 8);
                double pct = peak > 0 ? 100.0 * macs / g * 1e-9 / (peak * threads) : 0.0;
                printf("%-8s %-18s %5zu %10.2f %10.2f %7.2f %6.0f%%\n", fnames[f],
                       shapes[s].name, T, macs / g * 1e-9,
                       no_slices ? 0.0 : macs / g8 * 1e-9, g8 / g, pct);
                fflush(stdout);
            }
            free(b.data);
            free(b.scales);
            free(b.zeros);
        }
    printf("load average after: %.2f\n", bench_loadavg());
    kn_pool_free(p);
    free(X);
    free(Y);
    free(xq);
    return 0;
}

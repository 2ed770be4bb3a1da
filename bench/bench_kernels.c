/* bench_kernels.c - CPU kernel throughput: prefill matmul GFLOP/s and decode
 * matvec GB/s (weight bytes streamed per second) for every weight format,
 * next to this machine's measured read and memcpy bandwidth.  Q8/Q4/Q4S
 * get a second line, "int": the runtime's integer path (kn_qdot.h), the
 * activation quantization included in the time.
 *
 * usage: bench_kernels [threads] [--quick | --compute]   (threads 0 = all
 * CPUs; --compute: only the cache-resident decode figures, the kernels'
 * instruction cost without the memory system, which is what a busy
 * machine disturbs least) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "fmt_dtype.h"
#include "kn_ops.h"
#include "kn_qdot.h"

/* Process CPU seconds (all threads): on a shared machine wall time
 * includes time the scheduler gave to others; work / (cpu / threads) is
 * what the kernels reach while they actually run. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *g_names[] = { "F32", "F16", "BF16", "Q8", "Q4", "Q4S" };

typedef struct bmat {
    kn_matrix m;
    void *d, *s, *z;
    double bytes; /* all parts */
} bmat;

static int bmat_make(bmat *b, kn_wformat f, uint32_t rows, uint32_t cols,
                     uint32_t g)
{
    memset(b, 0, sizeof *b);
    size_t db = (size_t)kn_wformat_data_bytes(f, rows, cols);
    size_t sb = (size_t)kn_wformat_scale_bytes(f, rows, cols, g);
    size_t zb = (size_t)kn_wformat_zero_bytes(f, rows, cols, g);
    b->d = malloc(db);
    b->s = sb ? malloc(sb) : NULL;
    b->z = zb ? malloc(zb) : NULL;
    if (!b->d || (sb && !b->s) || (zb && !b->z))
        return -1;
    /* 0x3c bytes are normal numbers in every float format */
    memset(b->d, 0x3c, db);
    if (f == KN_W_Q8)
        for (uint32_t r = 0; r < rows; r++)
            ((float *)b->s)[r] = 0.01f;
    else if (sb)
        for (size_t i = 0; i < sb / 2; i++)
            ((uint16_t *)b->s)[i] = fmt_f32_to_f16(0.01f);
    if (zb)
        memset(b->z, 8, zb);
    kn_matrix m = { f, rows, cols, b->d, b->s, (const uint8_t *)b->z,
                    (f == KN_W_Q4 || f == KN_W_Q4S) ? g : 0, KN_LAYOUT_ROWS };
    b->m = m;
    b->bytes = (double)(db + sb + zb);
    return 0;
}

static void bmat_free(bmat *b)
{
    free(b->d);
    free(b->s);
    free(b->z);
}

/* Best wall and CPU-time (per thread) seconds of `its` products Y = X W^T
 * of T tokens, on the float path or (integer = 1) quantizing X into xq
 * and taking the integer path; one warm-up first. */
static void time_mm(kn_pool *p, const kn_matrix *W, const float *X, size_t T,
                    float *Y, int integer, void *xq, int its, double *best,
                    double *bestc)
{
    int nth = kn_pool_threads(p);
    *best = *bestc = 1e30;
    for (int it = -1; it < its; it++) {
        double t0 = bench_now(), c0 = cpu_now();
        if (integer) {
            kn_qact_quantize(kn_qact_kind_of(W), X, T, W->cols, xq);
            kn_matmul_q(p, W, xq, T, Y, NULL);
        } else {
            kn_matmul(p, W, X, T, Y, NULL);
        }
        double dt = bench_now() - t0, dc = (cpu_now() - c0) / nth;
        if (it < 0)
            continue;
        *best = dt < *best ? dt : *best;
        *bestc = dc < *bestc ? dc : *bestc;
    }
}

int main(int argc, char **argv)
{
    int nth = argc > 1 ? (int)bench_arg_u64("threads", argv[1], 0, 64) : 0;
    int quick = argc > 2 && strcmp(argv[2], "--quick") == 0;
    int compute = argc > 2 && strcmp(argv[2], "--compute") == 0;
    quick |= compute;
    kn_pool *p = kn_pool_create(nth);
    if (!p) {
        fprintf(stderr, "bench_kernels: cannot create thread pool\n");
        return 1;
    }
    nth = kn_pool_threads(p);
    size_t bwbytes = (size_t)1 << (quick ? 27 : 30);
    double rd = kn_measure_copy_bandwidth(p, bwbytes);
    double cp = bench_bandwidth(p, bwbytes, 1);
    printf("threads %d, avx2 %s\n", nth, kn_cpu_has_avx2() ? "yes" : "no");
    printf("memory: read %.1f GB/s, memcpy %.1f GB/s (%zu MiB buffer)\n", rd,
           cp, bwbytes >> 20);

    /* Prefill: T x 4096 x 4096 (scaled down with --quick). */
    size_t T = quick ? 128 : 512;
    uint32_t dim = quick ? 1024 : 4096;
    float *X = malloc(T * dim * sizeof(float));
    float *Y = malloc(T * dim * sizeof(float));
    if (!X || !Y)
        return 1;
    for (size_t i = 0; i < T * dim; i++)
        X[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    printf("\nprefill matmul  T=%zu, %ux%u (GFLOP/s)\n", T, dim, dim);
    void *xq = malloc((size_t)kn_qact_bytes(KN_QACT_I16, T, dim));
    if (!xq)
        return 1;
    for (int f = 0; f < KN_W_COUNT_ && !compute; f++) {
        bmat b;
        if (bmat_make(&b, (kn_wformat)f, dim, dim, 128) != 0)
            return 1;
        for (int integer = 0; integer <= kn_qdot_supported(&b.m); integer++) {
            double best, bestc;
            time_mm(p, &b.m, X, T, Y, integer, xq, 3, &best, &bestc);
            double fl = 2.0 * (double)T * dim * dim;
            printf("  %-4s%-4s %8.1f GFLOP/s  (%.1f ms; %.1f GFLOP/s per CPU-time)\n",
                   g_names[f], integer ? " int" : "", fl / best / 1e9,
                   best * 1e3, fl / bestc / 1e9);
        }
        bmat_free(&b);
    }

    /* Decode: T=1 over a matrix of ~768 MiB (well past the last-level
     * cache, so the figure is DRAM streaming), cols 4096. */
    uint32_t cols = 4096;
    double target = quick ? 64.0 * (1 << 20) : 768.0 * (1 << 20);
    printf("\ndecode matvec   T=1, cols %u, ~%.0f MiB of weights (GB/s of "
           "weight bytes; ratio to read bandwidth)\n", cols, target / (1 << 20));
    for (int f = 0; f < KN_W_COUNT_ && !compute; f++) {
        double rb = (double)kn_wformat_data_bytes((kn_wformat)f, 1, cols) +
                    (double)kn_wformat_scale_bytes((kn_wformat)f, 1, cols, 128) +
                    (double)kn_wformat_zero_bytes((kn_wformat)f, 1, cols, 128);
        uint32_t rows = (uint32_t)(target / rb);
        bmat b;
        if (bmat_make(&b, (kn_wformat)f, rows, cols, 128) != 0)
            return 1;
        float *y = malloc((size_t)rows * sizeof(float));
        if (!y)
            return 1;
        for (int integer = 0; integer <= kn_qdot_supported(&b.m); integer++) {
            double best, bestc;
            time_mm(p, &b.m, X, 1, y, integer, xq, 5, &best, &bestc);
            double gbs = b.bytes / best / 1e9;
            printf("  %-4s%-4s %8.1f GB/s  %5.2f x read bw  (%.2f ms, %.1f "
                   "Gweights/s; %.1f GB/s per CPU-time)\n", g_names[f],
                   integer ? " int" : "", gbs, gbs / rd, best * 1e3,
                   (double)rows * cols / best / 1e9, b.bytes / bestc / 1e9);
        }
        free(y);
        bmat_free(&b);
    }

    /* Decode compute: 1M weights (512 KiB of int4: L2; 2 MiB of f16: L3)
     * with int4 group 32 as the runtime's int4 g32 artifacts, so memory
     * is not the limit and the figure is what the kernel's instructions
     * allow; T = 1 and 8 (batch-8 decode reads each weight once for 8). */
    printf("\ndecode compute  cache-resident, 256x4096, int4 group 32 "
           "(Gweights/s per CPU-second; T=8 counts each weight once)\n");
    for (int f = 0; f < KN_W_COUNT_; f++) {
        bmat b;
        if (bmat_make(&b, (kn_wformat)f, 256, cols, 32) != 0)
            return 1;
        for (int integer = 0; integer <= kn_qdot_supported(&b.m); integer++) {
            printf("  %-4s%-4s", g_names[f], integer ? " int" : "");
            for (size_t t = 1; t <= 8; t += 7) {
                double best, bestc;
                time_mm(p, &b.m, X, t, Y, integer, xq, quick ? 50 : 200,
                        &best, &bestc);
                printf("  T=%zu %6.2f", t, 256.0 * cols / bestc / 1e9);
            }
            printf("\n");
        }
        bmat_free(&b);
    }
    free(X);
    free(Y);
    free(xq);
    kn_pool_free(p);
    return 0;
}

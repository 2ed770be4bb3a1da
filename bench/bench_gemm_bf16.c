/* bench_gemm_bf16.c - the calibration's bfloat16 products: an int8, int4
 * or float32 linear over T tokens as the float GEMM computes it
 * (kn_matmul, the codes dequantized to float: `--calib-forward f32`,
 * `--calib-full-pass f32`) against the bfloat16 products
 * (kn_bf16_act_pack + kn_matmul_bf16_multi), at the
 * SmolLM2-135M and Mistral-7B linear shapes.  Prints GMAC/s of each, best
 * of --reps, and bf16 / float.  MC_NO_BF16=1 in the environment: the AVX2
 * emulation instead of vdpbf16ps (MC_NO_AVX512=1 as well: the AVX2 float
 * GEMM against it, what an AVX2-only CPU runs).  The load average is
 * printed first: figures are noisy on a shared machine.
 *
 * usage: bench_gemm_bf16 [--threads N] [--reps N] [--T N] [--shapes smol|7b]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "fmt_dtype.h"
#include "kn_gemm_bf16.h"
#include "kn_ops.h"

typedef struct bshape {
    const char *name;
    uint32_t rows, cols;
} bshape;

/* A matrix of format f (group 128 for int4) with random codes. */
static kn_matrix make(kn_wformat f, uint32_t rows, uint32_t cols, uint64_t *st,
                      void **own)
{
    kn_matrix m = {f, rows, cols, NULL, NULL, NULL, f == KN_W_Q4 ? 128 : 0,
                   KN_LAYOUT_ROWS};
    size_t db = (size_t)kn_wformat_data_bytes(f, rows, cols);
    size_t sb = (size_t)kn_wformat_scale_bytes(f, rows, cols, m.group);
    size_t zb = (size_t)kn_wformat_zero_bytes(f, rows, cols, m.group);
    uint8_t *p = malloc(db + sb + zb + 16);
    if (!p) {
        fprintf(stderr, "bench_gemm_bf16: out of memory\n");
        exit(1);
    }
    if (f == KN_W_F32)
        for (size_t i = 0; i < db / 4; i++)
            ((float *)(void *)p)[i] = bench_rnd(st, 0.0f, 0.05f);
    else
        for (size_t i = 0; i < db; i++)
            p[i] = (uint8_t)bench_rnd(st, 128.0f, 100.0f);
    uint8_t *s = p + db;
    if (f == KN_W_Q8)
        for (uint32_t r = 0; r < rows; r++)
            ((float *)(void *)s)[r] = 0.001f;
    else
        for (size_t i = 0; i < sb / 2; i++)
            ((uint16_t *)(void *)s)[i] = fmt_f32_to_f16(0.01f);
    for (size_t i = 0; i < zb; i++)
        s[sb + i] = (uint8_t)(4 + i % 8);
    m.data = p;
    m.scales = s;
    m.zeros = zb ? s + sb : NULL;
    *own = p;
    return m;
}

static double best_of(int reps, int bf, kn_pool *pool, const kn_matrix *W,
                      const float *X, size_t T, float *Y, void *xb)
{
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now();
        if (bf) {
            kn_bf16_act_pack(X, T, W->cols, xb);
            kn_matmul_bf16_multi(pool, 1, &W, xb, T, &Y, (const float *const[]){NULL});
        } else {
            kn_matmul(pool, W, X, T, Y, NULL);
        }
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = 2, reps = 5;
    size_t T = 512;
    const char *shapes = "smol";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 256);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = (int)bench_arg_u64("--reps", argv[++i], 1, 1000);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            T = (size_t)bench_arg_u64("--T", argv[++i], 1, 1u << 16);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
            shapes = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gemm_bf16 [--threads N] [--reps N] "
                            "[--T N] [--shapes smol|7b]\n");
            return 2;
        }
    }
    static const bshape smol[] = {{"qkv 960x576", 960, 576},
                                  {"gate 1536x576", 1536, 576},
                                  {"down 576x1536", 576, 1536}};
    static const bshape b7[] = {{"q 4096x4096", 4096, 4096},
                                {"gate 14336x4096", 14336, 4096},
                                {"down 4096x14336", 4096, 14336}};
    const bshape *sh = strcmp(shapes, "7b") ? smol : b7;
    printf("bench_gemm_bf16: T %zu, %d threads, best of %d, load average %.2f; "
           "paths: avx512bf16 %d, avx512 %d, avx2 %d\n", T, threads, reps,
           bench_loadavg(), kn_cpu_has_avx512bf16(), kn_cpu_has_avx512(),
           kn_cpu_has_avx2());
    kn_pool *pool = kn_pool_create(threads);
    uint64_t st = 0x853c49e6748fea9bull;
    static const kn_wformat fs[] = {KN_W_Q8, KN_W_Q4, KN_W_F32};
    static const char *const fname[] = {"int8", "int4", "f32"};
    for (int fi = 0; fi < 3; fi++)
        for (int s = 0; s < 3; s++) {
            void *own = NULL;
            kn_matrix W = make(fs[fi], sh[s].rows, sh[s].cols, &st, &own);
            float *X = malloc(T * W.cols * sizeof(float));
            float *Y = malloc(T * W.rows * sizeof(float));
            void *xb = malloc(kn_bf16_act_bytes(T, W.cols));
            if (!X || !Y || !xb) {
                fprintf(stderr, "bench_gemm_bf16: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < T * W.cols; i++)
                X[i] = bench_rnd(&st, 0.0f, 1.0f);
            double madds = (double)T * W.rows * W.cols;
            double tf = best_of(reps, 0, pool, &W, X, T, Y, xb);
            double tb = best_of(reps, 1, pool, &W, X, T, Y, xb);
            printf("%-5s %-16s float %6.1f GMAC/s  bf16 %6.1f GMAC/s  bf16 / float %.2fx\n",
                   fname[fi], sh[s].name, madds / tf * 1e-9,
                   madds / tb * 1e-9, tf / tb);
            free(X);
            free(Y);
            free(xb);
            free(own);
        }
    kn_pool_free(pool);
    return 0;
}

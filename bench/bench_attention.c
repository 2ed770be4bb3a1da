/* bench_attention.c - kn_attention on one thread, in GMAC per CPU-second
 * (q.k and p.v multiply-adds), for the SmolLM-135M (9/3 heads) and
 * TinyLlama-1.1B (32/4 heads) shapes, head_dim 64, KV f16: a 128-token
 * prompt from position 0, the last 512 tokens of a 2048-token prompt, and
 * one decode step at position 2047.  CPU time, so that a busy machine's
 * figures stay close to a quiet one's; the load average is printed.  No
 * baseline inside: build it against an older kernels/ tree to compare.
 *
 * usage: bench_attention [--reps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kn_ops.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best GMAC per CPU-second of reps calls. */
static double run(uint32_t nh, uint32_t nkv, size_t T, int64_t pos0, int reps)
{
    const uint32_t hd = 64;
    uint64_t cap = (uint64_t)pos0 + T;
    size_t w = (size_t)nkv * hd;
    kn_kv kv = {KN_KV_F16, nkv, hd, cap, malloc(cap * w * 2), malloc(cap * w * 2),
                NULL, NULL};
    float *row = malloc(2 * w * sizeof(float));
    float *q = malloc(T * nh * hd * sizeof(float));
    float *o = malloc(T * nh * hd * sizeof(float));
    float *scr = malloc(kn_attention_scratch_floats(1, cap, hd) * sizeof(float));
    if (!kv.k || !kv.v || !row || !q || !o || !scr) {
        fprintf(stderr, "bench_attention: out of memory\n");
        exit(1);
    }
    uint64_t st = 7;
    for (uint64_t p = 0; p < cap; p++) {
        for (size_t i = 0; i < 2 * w; i++)
            row[i] = bench_rnd(&st, 0.0f, 1.0f);
        kn_kv_store(&kv, (int64_t)p, row, row + w);
    }
    for (size_t i = 0; i < T * nh * hd; i++)
        q[i] = bench_rnd(&st, 0.0f, 1.0f);
    double macs = 0.0, best = 1e30;
    for (size_t t = 0; t < T; t++)
        macs += 2.0 * (double)(pos0 + (int64_t)t + 1) * hd * nh;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_now();
        kn_attention(NULL, &kv, q, T, nh, pos0, 0, o, scr);
        double dt = cpu_now() - t0;
        best = dt < best ? dt : best;
    }
    free(kv.k), free(kv.v), free(row), free(q), free(o), free(scr);
    return macs / best * 1e-9;
}

int main(int argc, char **argv)
{
    int reps = 3;
    if (argc == 3 && !strcmp(argv[1], "--reps"))
        reps = (int)bench_arg_u64("--reps", argv[2], 1, 1000000);
    else if (argc != 1)
        reps = 0;
    if (reps < 1) {
        fprintf(stderr, "usage: bench_attention [--reps N]\n");
        return 2;
    }
    static const struct { const char *name; uint32_t nh, nkv; } sh[] = {
        {"smollm 9/3", 9, 3}, {"tinyllama 32/4", 32, 4}};
    static const struct { const char *name; size_t T; int64_t pos0; } cs[] = {
        {"prompt 128", 128, 0}, {"tokens 1536..2047", 512, 1536},
        {"decode at 2047", 1, 2047}};
    printf("bench_attention: 1 thread, best of %d, GMAC per CPU-second, "
           "load average %.2f\n", reps, bench_loadavg());
    for (size_t s = 0; s < 2; s++)
        for (size_t c = 0; c < 3; c++)
            printf("%-16s %-18s %8.2f\n", sh[s].name, cs[c].name,
                   run(sh[s].nh, sh[s].nkv, cs[c].T, cs[c].pos0, reps));
    return 0;
}

/* bench_attention.c - kn_attention on one thread, in GMAC per CPU-second
 * (q.k and p.v multiply-adds), for the SmolLM-135M (9/3 heads) and
 * TinyLlama-1.1B (32/4 heads) shapes, head_dim 64, KV f16: 128-, 512- and
 * 2048-token prompts from position 0, the last 512 tokens of a 2048-token
 * prompt, and one decode step at position 2047.  CPU time, so that a busy
 * machine's figures stay close to a quiet one's; the load average is
 * printed.  No baseline inside: build it against an older kernels/ tree
 * (or set MC_NO_AVX512=1) to compare.
 *
 * --dump FILE writes the outputs of a fixed set of calls (every KV type,
 * head_dim 13/64/128, windows, ring wrap, 1..70 tokens, 1 thread) to FILE
 * as raw floats instead of timing: two builds (or two paths) give the
 * same bits iff their files are equal (cmp).
 *
 * usage: bench_attention [--reps N] [--dump FILE] */
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

typedef struct bcase {
    kn_kvtype type;
    uint32_t nh, nkv, hd;
    uint64_t cap, window; /* ring slots (0: pos0 + T), window (0: none) */
    int64_t pos0;
    size_t T;
} bcase;

/* Best GMAC per CPU-second of reps calls of case c; with out, one call
 * whose output is appended to out instead. */
static double run(const bcase *c, int reps, FILE *out)
{
    const uint32_t hd = c->hd;
    uint64_t npos = (uint64_t)c->pos0 + c->T;
    uint64_t cap = c->cap ? c->cap : npos;
    size_t w = (size_t)c->nkv * hd, T = c->T, nh = c->nh;
    size_t es = c->type == KN_KV_F32 ? 4 : c->type == KN_KV_F16 ? 2 : 1;
    kn_kv kv = {c->type, c->nkv, hd, cap, malloc(cap * w * es), malloc(cap * w * es),
                NULL, NULL};
    if (c->type == KN_KV_I8) {
        kv.k_scale = malloc(cap * c->nkv * sizeof(float));
        kv.v_scale = malloc(cap * c->nkv * sizeof(float));
    }
    float *row = malloc(2 * w * sizeof(float));
    float *q = malloc(T * nh * hd * sizeof(float));
    float *o = malloc(T * nh * hd * sizeof(float));
    float *scr = malloc(kn_attention_scratch_floats(1, npos, hd) * sizeof(float));
    if (!kv.k || !kv.v || !row || !q || !o || !scr ||
        (c->type == KN_KV_I8 && (!kv.k_scale || !kv.v_scale))) {
        fprintf(stderr, "bench_attention: out of memory\n");
        exit(1);
    }
    uint64_t st = 7;
    for (uint64_t p = 0; p < npos; p++) {
        for (size_t i = 0; i < 2 * w; i++)
            row[i] = bench_rnd(&st, 0.0f, 1.0f);
        kn_kv_store(&kv, (int64_t)p, row, row + w);
    }
    for (size_t i = 0; i < T * nh * hd; i++)
        q[i] = bench_rnd(&st, 0.0f, 1.0f);
    double macs = 0.0, best = 1e30;
    for (size_t t = 0; t < T; t++) {
        uint64_t n = (uint64_t)c->pos0 + t + 1;
        n = c->window && n > c->window ? c->window : n;
        macs += 2.0 * (double)n * hd * nh;
    }
    for (int r = 0; r < (out ? 1 : reps); r++) {
        double t0 = cpu_now();
        kn_attention(NULL, &kv, q, T, c->nh, c->pos0, c->window, o, scr);
        double dt = cpu_now() - t0;
        best = dt < best ? dt : best;
    }
    if (out && fwrite(o, sizeof(float), T * nh * hd, out) != T * nh * hd) {
        fprintf(stderr, "bench_attention: cannot write the dump\n");
        exit(1);
    }
    free(kv.k), free(kv.v), free(kv.k_scale), free(kv.v_scale);
    free(row), free(q), free(o), free(scr);
    return macs / best * 1e-9;
}

static int dump(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "bench_attention: cannot open %s\n", path);
        return 1;
    }
    static const uint32_t hds[] = {13, 64, 128};
    static const struct { uint32_t nh, nkv; } hs[] = {{9, 3}, {32, 4}, {4, 4}, {7, 1}};
    static const size_t Ts[] = {1, 2, 5, 21, 22, 33, 70};
    for (int ty = 0; ty < 3; ty++)
        for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++)
            for (size_t s = 0; s < sizeof hs / sizeof hs[0]; s++)
                for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                    kn_kvtype type = ty == 0 ? KN_KV_F32 : ty == 1 ? KN_KV_F16 : KN_KV_I8;
                    bcase a = {type, hs[s].nh, hs[s].nkv, hds[h], 0, 0, 0, Ts[k]};
                    bcase b = {type, hs[s].nh, hs[s].nkv, hds[h], 0, 0, 45, Ts[k]};
                    bcase r = {type, hs[s].nh, hs[s].nkv, hds[h], 37 + Ts[k], 37,
                               60, Ts[k]};
                    run(&a, 1, f), run(&b, 1, f), run(&r, 1, f);
                }
    if (fclose(f)) {
        fprintf(stderr, "bench_attention: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 3;
    const char *dpath = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = (int)bench_arg_u64("--reps", argv[++i], 1, 1000000);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dpath = argv[++i];
        else
            reps = 0;
    }
    if (reps < 1) {
        fprintf(stderr, "usage: bench_attention [--reps N] [--dump FILE]\n");
        return 2;
    }
    if (dpath)
        return dump(dpath);
    static const struct { const char *name; uint32_t nh, nkv; } sh[] = {
        {"smollm 9/3", 9, 3}, {"tinyllama 32/4", 32, 4}};
    static const struct { const char *name; size_t T; int64_t pos0; } cs[] = {
        {"prompt 128", 128, 0}, {"prompt 512", 512, 0}, {"prompt 2048", 2048, 0},
        {"tokens 1536..2047", 512, 1536}, {"decode at 2047", 1, 2047}};
    printf("bench_attention: 1 thread, best of %d, GMAC per CPU-second, "
           "load average %.2f, AVX-512 %s\n", reps, bench_loadavg(),
           kn_cpu_has_avx512() ? "on" : "off");
    for (size_t s = 0; s < 2; s++)
        for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
            bcase b = {KN_KV_F16, sh[s].nh, sh[s].nkv, 64, 0, 0, cs[c].pos0, cs[c].T};
            printf("%-16s %-18s %8.2f\n", sh[s].name, cs[c].name, run(&b, reps, NULL));
        }
    return 0;
}

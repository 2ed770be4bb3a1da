/* bench_gram.c - A/B of the Gram sums' register tiles (kn_gram.h): the
 * AVX-512 path against the AVX2 path (kn_set_no_avx512) in one process,
 * interleaved A B A B, at the SmolLM2-135M input widths (576, 1536),
 * kn_gram_tri and kn_gram_cross, CPU seconds (user + sys of the process)
 * per call set, medians over the rounds.  Also checks that both paths
 * give the same bits.  Single-threaded unless --threads says otherwise
 * (then CPU time still counts every thread).  The hash of the AVX2 sums
 * lets two builds be compared bit for bit.
 * Usage: bench_gram [--tokens T] [--rounds R] [--threads N] [--width W] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kn_gram.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *inputs(size_t T, uint32_t n, uint64_t seed)
{
    float *x = malloc(T * n * sizeof(float));
    if (!x)
        return NULL;
    for (size_t k = 0; k < T * n; k++)
        x[k] = frand(&seed) * (k % n % 97 == 0 ? 20.0f : 1.0f);
    return x;
}

/* FNV-1a of the sums' bytes: equal hashes from two builds say they give
 * the same bits. */
static uint64_t hash_sums(const double *s, size_t k)
{
    const unsigned char *p = (const unsigned char *)s;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < k * sizeof(double); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One call set: the sums of T tokens in 512-token calls (as the
 * calibration's sequences); returns CPU seconds. */
static double one(kn_pool *p, int tri, double *out, size_t outn,
                  const float *a, const float *b, size_t T, uint32_t n,
                  float *scr)
{
    memset(out, 0, outn * sizeof(double));
    double c0 = bench_cpu_now();
    for (size_t t0 = 0; t0 < T; t0 += 512) {
        size_t m = T - t0 < 512 ? T - t0 : 512;
        if (tri)
            kn_gram_tri(p, out, a + t0 * n, m, n, scr);
        else
            kn_gram_cross(p, out, a + t0 * n, b + t0 * n, m, n, scr);
    }
    return bench_cpu_now() - c0;
}

int main(int argc, char **argv)
{
    size_t T = 8192;
    int rounds = 5, threads = 1;
    uint32_t only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            T = (size_t)bench_arg_u64("--tokens", argv[++i], 1, 1u << 20);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = (int)bench_arg_u64("--rounds", argv[++i], 1, 99);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc)
            only = (uint32_t)bench_arg_u64("--width", argv[++i], 1, 1u << 16);
        else {
            fprintf(stderr, "usage: bench_gram [--tokens T] [--rounds R]"
                            " [--threads N] [--width W]\n");
            return 2;
        }
    }
    int has512 = kn_cpu_has_avx512();
    kn_pool *p = threads > 1 ? kn_pool_create(threads) : NULL;
    if (threads > 1 && !p)
        return 1;
    static const uint32_t widths[2] = {576, 1536};
    int rc = 0;
    for (int w = 0; w < 2; w++) {
        uint32_t n = only ? only : widths[w];
        if (only && w)
            break;
        float *a = inputs(T, n, 1), *b = inputs(T, n, 2);
        float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
        size_t outn = (size_t)n * n;
        double *o2 = malloc(outn * sizeof(double));
        double *o5 = malloc(outn * sizeof(double));

        double *t2 = malloc((size_t)rounds * sizeof(double));
        double *t5 = malloc((size_t)rounds * sizeof(double));
        if (!a || !b || !scr || !o2 || !o5 || !t2 || !t5)
            return 1;
        for (int tri = 1; tri >= 0; tri--) {
            size_t on = tri ? (size_t)n * (n + 1) / 2 : outn;
            for (int r = 0; r < rounds; r++) {
                kn_set_no_avx512(1);
                t2[r] = one(p, tri, o2, on, a, b, T, n, scr);
                kn_set_no_avx512(0);
                t5[r] = one(p, tri, o5, on, a, b, T, n, scr);
            }
            int same = memcmp(o2, o5, on * sizeof(double)) == 0;
            rc |= !same;
            qsort(t2, (size_t)rounds, sizeof(double), cmp_double);
            qsort(t5, (size_t)rounds, sizeof(double), cmp_double);
            double mac = (tri ? (double)n * (n + 1) / 2 : (double)n * n) * (double)T;
            double m2 = t2[rounds / 2], m5 = t5[rounds / 2];
            printf("width %4u %-5s T %zu threads %d: AVX2 %.4f CPU-s (%.1f GMAC/CPU-s)"
                   "  AVX-512%s %.4f CPU-s (%.1f GMAC/CPU-s)  x%.2f  bits %s  hash %016llx\n",
                   n, tri ? "tri" : "cross", T, threads, m2, mac / m2 * 1e-9,
                   has512 ? "" : " (absent: AVX2 again)", m5, mac / m5 * 1e-9,
                   m2 / m5, same ? "same" : "DIFFER",
                   (unsigned long long)hash_sums(o2, on));
            fflush(stdout);
        }
        free(a);
        free(b);
        free(scr);
        free(o2);
        free(o5);
        free(t2);
        free(t5);
    }
    kn_pool_free(p);
    return rc;
}

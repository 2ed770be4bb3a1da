/* test_gram.c - the blocked Gram sums of kn_gram.h (the calibration's
 * statistics) against their double references: AVX2 and scalar tiles,
 * widths that are not multiples of the tile, chunks that are not full,
 * sums accumulated over many calls; the thread count not changing a
 * bit; and the AVX-512 tile giving the AVX2 tile's bits (skipped, and
 * said so, on a machine without AVX-512).  The bfloat16 sums: the
 * rounding, every path (vdpbf16ps where the CPU has it, the float tiles'
 * emulation, the scalar tile) giving the same bits, subnormal operands and
 * results included, and the sums against the double reference of the
 * rounded inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_gram.h"
#include "kn_ops.h"
#include "testutil.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

/* T x n inputs in [-1, 1) with every 13th channel 30x larger (trained
 * activations have such outliers) and some exact zeros. */
static float *inputs(size_t T, uint32_t n)
{
    float *x = malloc(T * n * sizeof(float));
    assert_non_null(x);
    for (size_t k = 0; k < T * n; k++) {
        float v = tu_rng_f(&g_rng);
        x[k] = k % 29 == 0 ? 0.0f : (k % n) % 13 == 0 ? 30.0f * v : v;
    }
    return x;
}

static size_t tri_count(uint32_t n)
{
    return (size_t)n * (n + 1) / 2;
}

/* max |got - ref| / max |ref| */
static double norm_err(const double *got, const double *ref, size_t k)
{
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < k; i++) {
        e = fmax(e, fabs(got[i] - ref[i]));
        r = fmax(r, fabs(ref[i]));
    }
    return r > 0.0 ? e / r : e;
}

/* Run body once with AVX2 (when present) and once forced scalar. */
#define FOR_BOTH_PATHS(s) for (int s = kn_cpu_has_avx2() ? 0 : 1; s < 2; s++)

static void test_gram_tri_matches_double_reference(void **state)
{
    (void)state;
    static const uint32_t widths[] = {1, 5, 17, 64, 100, 203};
    FOR_BOTH_PATHS(sc) {
        kn_set_force_scalar(sc);
        for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
            uint32_t n = widths[w];
            size_t T = 3 * KN_GRAM_KC + 37; /* a partial last chunk */
            float *x = inputs(T, n);
            float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
            double *h = calloc(tri_count(n), sizeof(double));
            double *ref = calloc(tri_count(n), sizeof(double));
            /* two calls: the sums accumulate */
            kn_gram_tri(NULL, h, x, 150, n, scr);
            kn_gram_tri(NULL, h, x + 150 * (size_t)n, T - 150, n, scr);
            kn_ref_gram_tri(ref, x, T, n);
            double e = norm_err(h, ref, tri_count(n));
            assert_true(e < 1e-6);
            /* the diagonal is a sum of squares: never negative */
            for (uint32_t i = 0; i < n; i++)
                assert_true(h[(size_t)i * (2 * n + 1 - i) / 2] >= 0.0);
            free(x);
            free(scr);
            free(h);
            free(ref);
        }
    }
    kn_set_force_scalar(0);
}

static void test_gram_cross_matches_double_reference(void **state)
{
    (void)state;
    static const uint32_t widths[] = {3, 16, 23, 130};
    FOR_BOTH_PATHS(sc) {
        kn_set_force_scalar(sc);
        for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
            uint32_t n = widths[w];
            size_t T = 2 * KN_GRAM_KC + 5;
            float *a = inputs(T, n), *b = inputs(T, n);
            float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
            double *c = calloc((size_t)n * n, sizeof(double));
            double *ref = calloc((size_t)n * n, sizeof(double));
            kn_gram_cross(NULL, c, a, b, T, n, scr);
            kn_ref_gram_cross(ref, a, b, T, n);
            assert_true(norm_err(c, ref, (size_t)n * n) < 1e-6);
            /* not symmetric: a and b are different, (i, j) is a_i b_j */
            assert_true(c[1] != c[n]);
            free(a);
            free(b);
            free(scr);
            free(c);
            free(ref);
        }
    }
    kn_set_force_scalar(0);
}

/* Wide enough (and enough tokens) that the pool is used. */
static void test_gram_threads_give_identical_sums(void **state)
{
    (void)state;
    kn_pool *p3 = kn_pool_create(3), *p2 = kn_pool_create(2);
    assert_non_null(p3);
    assert_non_null(p2);
    uint32_t n = 301;
    size_t T = 2 * KN_GRAM_KC + 11;
    float *a = inputs(T, n), *b = inputs(T, n);
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    double *h1 = calloc(tri_count(n), sizeof(double));
    double *h3 = calloc(tri_count(n), sizeof(double));
    double *c1 = calloc((size_t)n * n, sizeof(double));
    double *c2 = calloc((size_t)n * n, sizeof(double));
    kn_gram_tri(NULL, h1, a, T, n, scr);
    kn_gram_tri(p3, h3, a, T, n, scr);
    assert_memory_equal(h1, h3, tri_count(n) * sizeof(double));
    kn_gram_cross(NULL, c1, a, b, T, n, scr);
    kn_gram_cross(p2, c2, a, b, T, n, scr);
    assert_memory_equal(c1, c2, (size_t)n * n * sizeof(double));
    /* and the symmetric sum agrees with the cross sum of x with itself
     * on the upper triangle (same tiles, same order) */
    memset(c1, 0, (size_t)n * n * sizeof(double));
    kn_gram_cross(p3, c1, a, a, T, n, scr);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i; j < n; j++)
            assert_true(h1[(size_t)i * (2 * n + 1 - i) / 2 + (j - i)] ==
                        c1[(size_t)i * n + j]);
    free(a);
    free(b);
    free(scr);
    free(h1);
    free(h3);
    free(c1);
    free(c2);
    kn_pool_free(p3);
    kn_pool_free(p2);
}

/* The float chunk sums keep their accuracy over many tokens: the error
 * does not grow with the token count (double sums across chunks). */
static void test_gram_error_does_not_grow_with_tokens(void **state)
{
    (void)state;
    uint32_t n = 24;
    size_t T = 64 * KN_GRAM_KC;
    float *x = inputs(T, n);
    for (size_t k = 0; k < T * n; k++)
        x[k] = fabsf(x[k]) + 0.5f; /* all positive: sums grow with T */
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    double *h = calloc(tri_count(n), sizeof(double));
    double *ref = calloc(tri_count(n), sizeof(double));
    kn_gram_tri(NULL, h, x, T, n, scr);
    kn_ref_gram_tri(ref, x, T, n);
    /* one float sum of 8192 positive terms would be off by ~1e-4 */
    assert_true(norm_err(h, ref, tri_count(n)) < 2e-7);
    free(x);
    free(scr);
    free(h);
    free(ref);
}

/* h (tri) or c (cross) sums of T tokens from start, in two calls (the
 * second starts a new chunk), with the AVX-512 path on or off. */
static void sums_path(kn_pool *p, int tri, int no512, double *out,
                      const float *a, const float *b, size_t T, uint32_t n,
                      float *scr)
{
    kn_set_no_avx512(no512);
    size_t t1 = T / 3;
    if (tri) {
        kn_gram_tri(p, out, a, t1, n, scr);
        kn_gram_tri(p, out, a + t1 * n, T - t1, n, scr);
    } else {
        kn_gram_cross(p, out, a, b, t1, n, scr);
        kn_gram_cross(p, out, a + t1 * n, b + t1 * n, T - t1, n, scr);
    }
    kn_set_no_avx512(0);
}

/* Widths around the AVX-512 tile (12 x 32: two 6-row and two 16-column
 * panels) and the column groups (8 panels), token counts around the float
 * chunk and the packed chunk, 1 and 2 threads, sums added to non-zero
 * values: the AVX-512 path gives the AVX2 path's bits. */
static void test_gram_avx512_matches_avx2_bit_for_bit(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx2() || !kn_cpu_has_avx512()) {
        print_message("AVX-512 against AVX2 comparison skipped: this CPU "
                      "(or MC_NO_AVX512) does not run the AVX-512 path\n");
        return;
    }
    static const uint32_t widths[] = {1, 6, 7, 12, 13, 31, 33, 47, 100,
                                      129, 203, 301};
    static const size_t tokens[] = {1, 37, KN_GRAM_FC + 1, KN_GRAM_KC,
                                    2 * KN_GRAM_KC + 37};
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        uint32_t n = widths[w];
        float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
        assert_non_null(scr);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            size_t T = tokens[k];
            float *a = inputs(T, n), *b = inputs(T, n);
            for (int tri = 0; tri < 2; tri++) {
                size_t cnt = tri ? tri_count(n) : (size_t)n * n;
                double *s2 = malloc(cnt * sizeof(double));
                double *s5 = malloc(cnt * sizeof(double));
                assert_non_null(s2);
                assert_non_null(s5);
                for (int th = 1; th <= 2; th++) {
                    kn_pool *p = th == 2 ? p2 : NULL;
                    for (size_t e = 0; e < cnt; e++)
                        s2[e] = s5[e] = (double)tu_rng_f(&g_rng);
                    sums_path(p, tri, 1, s2, a, b, T, n, scr);
                    sums_path(p, tri, 0, s5, a, b, T, n, scr);
                    if (memcmp(s2, s5, cnt * sizeof(double)) != 0)
                        fail_msg("%s n %u T %zu threads %d: AVX-512 sums "
                                 "differ from AVX2", tri ? "tri" : "cross",
                                 n, T, th);
                }
                free(s2);
                free(s5);
            }
            free(a);
            free(b);
        }
        free(scr);
    }
    kn_pool_free(p2);
}

/* ---- bfloat16 sums ------------------------------------------------------ */

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void test_bf16_round_cases(void **state)
{
    (void)state;
    assert_true(kn_bf16_round(1.0f) == 1.0f);
    /* halfway: to even (down from 1 + 2^-8, up from 1 + 3 * 2^-8) */
    assert_true(kn_bf16_round(1.0f + 0x1p-8f) == 1.0f);
    assert_true(kn_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    assert_true(kn_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    assert_true(kn_bf16_round(-3.0f) == -3.0f);
    /* subnormal float and bfloat16: signed zero */
    assert_int_equal(bits_of(kn_bf16_round(1e-39f)), 0u);
    assert_int_equal(bits_of(kn_bf16_round(-1e-39f)), 0x80000000u);
    assert_int_equal(bits_of(kn_bf16_round(from_bits(0x007fffffu))), 0u);
    assert_true(kn_bf16_round(0x1p-126f) == 0x1p-126f);
    assert_true(isinf(kn_bf16_round(3.4e38f)));
    assert_true(isnan(kn_bf16_round(from_bits(0x7f800001u))));
    assert_true(isnan(kn_bf16_round(from_bits(0xffffffffu))));
    assert_true(isinf(kn_bf16_round(INFINITY)));
}

/* The vector conversions (the AVX2 packing of the emulation, the AVX-512
 * pairs of the native path) round every special value as kn_bf16_round:
 * ties both ways, the largest values, infinities, NaNs (quiet and
 * signalling, both signs), subnormals and zeros, over widths with and
 * without a tail. */
static void test_bf16_vector_rounding_matches_scalar(void **state)
{
    (void)state;
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu,
        0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
        0xffffffffu, 0x7fffffffu, 0x00000001u, 0x807fffffu, 0x00800000u,
        0x80800000u, 0x00000000u, 0x80000000u, 0x3f800000u, 0xc0490fdbu};
    size_t ns = sizeof special / sizeof *special;
    for (uint32_t n = 1; n <= 37; n += 6) {
        size_t m = 7; /* odd: a padded last pair */
        float *x = malloc(m * n * sizeof(float));
        float *d = malloc((m + 1) * 16 * sizeof(float));
        uint32_t *pr = malloc(((m + 1) / 2) * n * sizeof(uint32_t));
        assert_non_null(x);
        assert_non_null(d);
        assert_non_null(pr);
        for (size_t k = 0; k < m * n; k++)
            x[k] = from_bits(special[(k * 7) % ns]);
        if (kn_cpu_has_avx2())
            for (size_t c0 = 0; c0 < n; c0 += 16) {
                kn_avx2_gram_pack_swapped(x, n, m, c0, 16, d);
                for (size_t t = 0; t < m + 1; t++)
                    for (size_t c = 0; c < 16; c++) {
                        size_t src = t ^ 1u;
                        uint32_t want = src < m && c0 + c < n
                                            ? bits_of(kn_bf16_round(x[src * n + c0 + c]))
                                            : 0u;
                        if (bits_of(d[t * 16 + c]) != want)
                            fail_msg("AVX2 packing: n %u row %zu column %zu: %08x, "
                                     "want %08x", n, t, c0 + c,
                                     bits_of(d[t * 16 + c]), want);
                    }
            }
        if (kn_cpu_has_avx512()) {
            for (size_t p = 0; 2 * p < m; p++)
                kn_avx512_bf16_pairs(x + 2 * p * n,
                                     2 * p + 1 < m ? x + (2 * p + 1) * n : NULL, n,
                                     pr + p * n);
            for (size_t p = 0; 2 * p < m; p++)
                for (size_t c = 0; c < n; c++) {
                    uint32_t lo = bits_of(kn_bf16_round(x[2 * p * n + c])) >> 16;
                    uint32_t hi = 2 * p + 1 < m
                                      ? bits_of(kn_bf16_round(x[(2 * p + 1) * n + c])) >> 16
                                      : 0u;
                    assert_int_equal(pr[p * n + c], hi << 16 | lo);
                }
        }
        free(x);
        free(d);
        free(pr);
    }
}

enum { BF_NATIVE, BF_EMU512, BF_EMU2, BF_SCALAR, BF_PATHS };

static int bf16_path_runs(int path)
{
    switch (path) {
    case BF_NATIVE: return kn_cpu_has_avx512bf16();
    case BF_EMU512: return kn_cpu_has_avx512();
    case BF_EMU2: return kn_cpu_has_avx2();
    default: return 1;
    }
}

/* The bfloat16 sums of T tokens in two calls on one path. */
static void bf16_sums(kn_pool *p, int path, int tri, double *out,
                      const float *a, const float *b, size_t T, uint32_t n,
                      float *scr)
{
    kn_set_no_bf16(path != BF_NATIVE);
    kn_set_no_avx512(path > BF_EMU512);
    kn_set_force_scalar(path == BF_SCALAR);
    size_t t1 = T / 3;
    if (tri) {
        kn_gram_tri_bf16(p, out, a, t1, n, scr);
        kn_gram_tri_bf16(p, out, a + t1 * n, T - t1, n, scr);
    } else {
        kn_gram_cross_bf16(p, out, a, b, t1, n, scr);
        kn_gram_cross_bf16(p, out, a + t1 * n, b + t1 * n, T - t1, n, scr);
    }
    kn_set_no_bf16(0);
    kn_set_no_avx512(0);
    kn_set_force_scalar(0);
}

/* Every path on the same inputs, sums starting from the same values: the
 * same bits.  tiny: the sums start at zero (a tiny sum added to a start
 * value would vanish in it) and the scalar tile is not compared. */
static void bf16_paths_agree(kn_pool *p, int tri, const float *a, const float *b,
                             size_t T, uint32_t n, float *scr, int tiny,
                             const char *what)
{
    size_t cnt = tri ? tri_count(n) : (size_t)n * n;
    double *s[BF_PATHS];
    for (int k = 0; k < BF_PATHS; k++) {
        s[k] = malloc(cnt * sizeof(double));
        assert_non_null(s[k]);
    }
    for (size_t e = 0; e < cnt; e++)
        s[0][e] = tiny ? 0.0 : (double)tu_rng_f(&g_rng);
    int nonzero = 0;
    for (int k = 1; k < BF_PATHS; k++)
        memcpy(s[k], s[0], cnt * sizeof(double));
    int ref = -1;
    for (int k = 0; k < BF_PATHS; k++) {
        if (!bf16_path_runs(k) || (k == BF_SCALAR && tiny))
            continue;
        bf16_sums(p, k, tri, s[k], a, b, T, n, scr);
        for (size_t e = 0; e < cnt; e++)
            nonzero += s[k][e] != 0.0;
        if (ref < 0)
            ref = k;
        else if (memcmp(s[ref], s[k], cnt * sizeof(double)) != 0)
            fail_msg("%s %s n %u T %zu: bfloat16 path %d differs from path %d",
                     what, tri ? "tri" : "cross", n, T, k, ref);
    }
    assert_true(nonzero > 0);
    for (int k = 0; k < BF_PATHS; k++)
        free(s[k]);
}

static void test_gram_bf16_paths_give_the_same_bits(void **state)
{
    (void)state;
    if (!kn_cpu_has_avx512bf16())
        print_message("vdpbf16ps not run: this CPU (or MC_NO_BF16) has no "
                      "AVX512_BF16; the emulations are compared with each "
                      "other\n");
    static const uint32_t widths[] = {1, 6, 13, 33, 47, 129, 203};
    static const size_t tokens[] = {1, 2, 37, KN_GRAM_FC + 1, KN_GRAM_KC + 1,
                                    2 * KN_GRAM_KC + 38};
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
        uint32_t n = widths[w];
        float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
        assert_non_null(scr);
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            size_t T = tokens[k];
            float *a = inputs(T, n), *b = inputs(T, n);
            for (int tri = 0; tri < 2; tri++)
                for (int th = 1; th <= 2; th++)
                    bf16_paths_agree(th == 2 ? p2 : NULL, tri, a, b, T, n, scr,
                                     0, "normal");
            free(a);
            free(b);
        }
        free(scr);
    }
    kn_pool_free(p2);
}

/* The sum of inputs of two widths gives, bit for bit, the rows of the
 * square sum whose narrower input is padded with zero columns (float and
 * bfloat16 products, 1-2 threads, each kernel path), and so the double
 * reference within the square sum's tolerance. */
static void test_gram_cross_rect_is_the_padded_square(void **state)
{
    (void)state;
    static const uint32_t shapes[][2] = {{37, 70}, {70, 37}, {6, 16}, {1, 203}};
    static const size_t tokens[] = {1, 131, 2 * KN_GRAM_KC + 38};
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        uint32_t na = shapes[sh][0], nb = shapes[sh][1];
        uint32_t n = na > nb ? na : nb;
        float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
        assert_non_null(scr);
        assert_true(kn_gram_rect_scratch_floats(na, nb) <= kn_gram_scratch_floats(n));
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens; k++) {
            size_t T = tokens[k];
            float *a = inputs(T, na), *b = inputs(T, nb);
            float *pa = calloc(T * n, sizeof(float)), *pb = calloc(T * n, sizeof(float));
            assert_non_null(pa);
            assert_non_null(pb);
            for (size_t t = 0; t < T; t++) {
                memcpy(pa + t * n, a + t * na, na * sizeof(float));
                memcpy(pb + t * n, b + t * nb, nb * sizeof(float));
            }
            double *got = calloc((size_t)na * nb, sizeof(double));
            double *sq = calloc((size_t)n * n, sizeof(double));
            assert_non_null(got);
            assert_non_null(sq);
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int th = 1; th <= 2; th++)
                    FOR_BOTH_PATHS(sc) {
                        kn_set_force_scalar(sc);
                        memset(got, 0, (size_t)na * nb * sizeof(double));
                        memset(sq, 0, (size_t)n * n * sizeof(double));
                        kn_pool *p = th == 2 ? p2 : NULL;
                        kn_gram_cross_rect(p, got, a, na, b, nb, T, bf16, scr);
                        if (bf16)
                            kn_gram_cross_bf16(p, sq, pa, pb, T, n, scr);
                        else
                            kn_gram_cross(p, sq, pa, pb, T, n, scr);
                        for (uint32_t i = 0; i < na; i++)
                            assert_memory_equal(got + (size_t)i * nb, sq + (size_t)i * n,
                                                nb * sizeof(double));
                    }
            kn_set_force_scalar(0);
            free(a);
            free(b);
            free(pa);
            free(pb);
            free(got);
            free(sq);
        }
        free(scr);
    }
    kn_pool_free(p2);
}

/* Operands and results near and below FLT_MIN: the flushes (DAZ on the
 * inputs, FTZ on every add) agree between vdpbf16ps and the emulation. */
static void test_gram_bf16_subnormals_agree(void **state)
{
    (void)state;
    uint32_t n = 40;
    size_t T = 301;
    float *a = inputs(T, n), *b = inputs(T, n);
    for (size_t k = 0; k < T * n; k++) {
        /* magnitudes 2^-69 to 2^-61: the products, and most float
         * chains, stay below FLT_MIN (2^-126), where the flushes decide
         * (a larger term would keep a chain normal) */
        a[k] = ldexpf(a[k], -61 - (int)(k % 9));
        b[k] = ldexpf(b[k], -61 - (int)((k / 7) % 9));
        if (k % 11 == 0)
            a[k] = from_bits(0x00400000u | (uint32_t)(k & 0xffff)); /* subnormal */
    }
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    assert_non_null(scr);
    for (int tri = 0; tri < 2; tri++)
        bf16_paths_agree(NULL, tri, a, b, T, n, scr, 1, "tiny");
    free(scr);
    free(a);
    free(b);
}

/* The sums against the double reference of the rounded inputs: the
 * float-chunk accuracy of the float sums. */
static void test_gram_bf16_matches_rounded_reference(void **state)
{
    (void)state;
    uint32_t n = 100;
    size_t T = 3 * KN_GRAM_KC + 77;
    float *a = inputs(T, n), *b = inputs(T, n);
    float *ar = malloc(T * n * sizeof(float)), *br = malloc(T * n * sizeof(float));
    assert_non_null(ar);
    assert_non_null(br);
    for (size_t k = 0; k < T * n; k++) {
        ar[k] = kn_bf16_round(a[k]);
        br[k] = kn_bf16_round(b[k]);
    }
    float *scr = malloc(kn_gram_scratch_floats(n) * sizeof(float));
    double *h = calloc(tri_count(n), sizeof(double));
    double *hr = calloc(tri_count(n), sizeof(double));
    double *hf = calloc(tri_count(n), sizeof(double));
    double *c = calloc((size_t)n * n, sizeof(double));
    double *cr = calloc((size_t)n * n, sizeof(double));
    assert_non_null(scr);
    assert_non_null(h);
    assert_non_null(hr);
    assert_non_null(hf);
    assert_non_null(c);
    assert_non_null(cr);
    kn_gram_tri_bf16(NULL, h, a, T, n, scr);
    kn_ref_gram_tri(hr, ar, T, n);
    kn_ref_gram_tri(hf, a, T, n);
    assert_true(norm_err(h, hr, tri_count(n)) < 2e-7);
    /* and against the unrounded inputs: bfloat16's 8 bits */
    double e = norm_err(h, hf, tri_count(n));
    assert_true(e > 1e-6 && e < 1e-2);
    kn_gram_cross_bf16(NULL, c, a, b, T, n, scr);
    kn_ref_gram_cross(cr, ar, br, T, n);
    assert_true(norm_err(c, cr, (size_t)n * n) < 2e-7);
    free(a);
    free(b);
    free(ar);
    free(br);
    free(scr);
    free(h);
    free(hr);
    free(hf);
    free(c);
    free(cr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gram_tri_matches_double_reference),
        cmocka_unit_test(test_gram_cross_matches_double_reference),
        cmocka_unit_test(test_gram_threads_give_identical_sums),
        cmocka_unit_test(test_gram_error_does_not_grow_with_tokens),
        cmocka_unit_test(test_gram_avx512_matches_avx2_bit_for_bit),
        cmocka_unit_test(test_bf16_round_cases),
        cmocka_unit_test(test_bf16_vector_rounding_matches_scalar),
        cmocka_unit_test(test_gram_bf16_paths_give_the_same_bits),
        cmocka_unit_test(test_gram_bf16_subnormals_agree),
        cmocka_unit_test(test_gram_cross_rect_is_the_padded_square),
        cmocka_unit_test(test_gram_bf16_matches_rounded_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

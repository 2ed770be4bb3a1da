/* test_sampling.c - rt_sample: greedy, temperature, top-k, top-p, the
 * per-sequence RNG, stop tokens and log-probabilities; the in-place
 * sampler against a plain reference with a separate probabilities row
 * (the sampler before it worked in place). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_sample.h"

#define V 6

static void test_sample_greedy_is_argmax_first_on_ties(void **st)
{
    (void)st;
    const float lg[V] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    rt_sampler sp = {0};
    rt_rng r;
    rt_rng_seed(&r, 1, 0);
    float row[V];
    memcpy(row, lg, sizeof row);
    assert_int_equal(rt_sample(&sp, row, V, &r, NULL), 1);
    sp.temperature = -1.0f; /* <= 0 is greedy too */
    assert_int_equal(rt_sample(&sp, row, V, &r, NULL), 1);
    /* greedy leaves the row as it was */
    assert_memory_equal(row, lg, sizeof row);
}

static void test_rng_streams_depend_on_seed_and_sequence_index(void **st)
{
    (void)st;
    rt_rng a, b, c, d;
    rt_rng_seed(&a, 42, 3);
    rt_rng_seed(&b, 42, 3);
    rt_rng_seed(&c, 42, 4);
    rt_rng_seed(&d, 43, 3);
    int same_ab = 1, same_ac = 1, same_ad = 1;
    for (int i = 0; i < 16; i++) {
        uint64_t x = rt_rng_next(&a);
        same_ab &= x == rt_rng_next(&b);
        same_ac &= x == rt_rng_next(&c);
        same_ad &= x == rt_rng_next(&d);
    }
    assert_true(same_ab);
    assert_false(same_ac);
    assert_false(same_ad);
    for (int i = 0; i < 1000; i++) {
        double u = rt_rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
    }
}

/* Empirical frequencies of n draws. */
static void draw(const rt_sampler *sp, const float *lg, int n, double *freq)
{
    float row[V];
    int32_t idx[V];
    rt_rng r;
    rt_rng_seed(&r, 7, 0);
    memset(freq, 0, V * sizeof *freq);
    for (int i = 0; i < n; i++) {
        memcpy(row, lg, sizeof row); /* the sampler overwrites it */
        int32_t t = rt_sample(sp, row, V, &r, idx);
        assert_true(t >= 0 && t < V);
        freq[t] += 1.0 / n;
    }
}

static void test_sample_temperature_follows_softmax(void **st)
{
    (void)st;
    const double p[V] = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
    float lg[V];
    for (int i = 0; i < V; i++)
        lg[i] = (float)log(p[i]) + 3.0f;
    rt_sampler sp = {.temperature = 1.0f};
    double f[V];
    draw(&sp, lg, 40000, f);
    for (int i = 0; i < V; i++)
        assert_true(fabs(f[i] - p[i]) < 0.012);
    /* temperature 0.5 squares the odds */
    sp.temperature = 0.5f;
    draw(&sp, lg, 40000, f);
    double z = 0;
    for (int i = 0; i < V; i++)
        z += p[i] * p[i];
    for (int i = 0; i < V; i++)
        assert_true(fabs(f[i] - p[i] * p[i] / z) < 0.012);
}

static void test_sample_top_k_and_top_p_restrict_candidates(void **st)
{
    (void)st;
    const double p[V] = {0.04, 0.4, 0.1, 0.25, 0.15, 0.06};
    float lg[V];
    for (int i = 0; i < V; i++)
        lg[i] = (float)log(p[i]);
    double f[V];
    rt_sampler sp = {.temperature = 1.0f, .top_k = 2};
    draw(&sp, lg, 20000, f);
    assert_true(f[0] == 0 && f[2] == 0 && f[4] == 0 && f[5] == 0);
    assert_true(fabs(f[1] - 0.4 / 0.65) < 0.015);
    /* top_p 0.7: 0.4 + 0.25 = 0.65 < 0.7, + 0.15 = 0.8 >= 0.7 */
    sp = (rt_sampler){.temperature = 1.0f, .top_p = 0.7f};
    draw(&sp, lg, 20000, f);
    assert_true(f[0] == 0 && f[2] == 0 && f[5] == 0);
    assert_true(fabs(f[4] - 0.15 / 0.8) < 0.015);
    /* both: top-k 3 keeps {1, 3, 4} (mass 0.8); top-p 0.5 of that is 0.4:
     * 0.4 / 0.8 = 0.5 >= 0.5 keeps only token 1 */
    sp = (rt_sampler){.temperature = 1.0f, .top_k = 3, .top_p = 0.5f};
    draw(&sp, lg, 2000, f);
    assert_true(f[1] > 0.999999); /* sums of 1/n */
    /* top_k 1 is greedy at any temperature; tiny top_p too */
    sp = (rt_sampler){.temperature = 5.0f, .top_k = 1};
    draw(&sp, lg, 500, f);
    assert_true(f[1] > 0.999999); /* sums of 1/n */
    sp = (rt_sampler){.temperature = 5.0f, .top_p = 0.01f};
    draw(&sp, lg, 500, f);
    assert_true(f[1] > 0.999999); /* sums of 1/n */
}

static void test_sample_is_reproducible_and_allocation_free(void **st)
{
    (void)st;
    const float lg[V] = {0.3f, 0.1f, 0.2f, 0.25f, 0.0f, 0.15f};
    float row[V];
    int32_t idx[V];
    rt_sampler sp = {.temperature = 1.3f, .top_k = 4, .top_p = 0.9f};
    int32_t a[64], b[64];
    rt_rng r;
    mc_alloc_reset_count();
    mc_alloc_fail_after(0);
    rt_rng_seed(&r, 5, 2);
    for (int i = 0; i < 64; i++) {
        memcpy(row, lg, sizeof row);
        a[i] = rt_sample(&sp, row, V, &r, idx);
    }
    rt_rng_seed(&r, 5, 2);
    for (int i = 0; i < 64; i++) {
        memcpy(row, lg, sizeof row);
        b[i] = rt_sample(&sp, row, V, &r, idx);
    }
    uint64_t n = mc_alloc_count();
    mc_alloc_fail_after(-1);
    assert_int_equal(n, 0);
    assert_memory_equal(a, b, sizeof a);
}

static void test_logprob_and_stop_tokens(void **st)
{
    (void)st;
    const float lg[3] = {1000.0f, 999.0f, 990.0f}; /* large: needs stability */
    double z = 1.0 + exp(-1.0) + exp(-10.0);
    assert_true(fabs(rt_logprob(lg, 3, 0) - (-log(z))) < 1e-5);
    assert_true(fabs(rt_logprob(lg, 3, 2) - (-10.0 - log(z))) < 1e-5);
    const int32_t stop[2] = {2, 7};
    assert_true(rt_is_stop(7, stop, 2));
    assert_false(rt_is_stop(3, stop, 2));
    assert_false(rt_is_stop(2, NULL, 0));
}

/* ---- the in-place sampler against a plain reference ------------------ */

/* The documented rule (rt_sample.h) written plainly, with the
 * probabilities in a row of their own and the candidates sorted by qsort:
 * (probability desc, index asc) is a total order, so any correct sort
 * gives the order the sampler's heap gives. */
static const float *g_ref_p;
static int ref_rank(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_ref_p[x] != g_ref_p[y])
        return g_ref_p[x] > g_ref_p[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int32_t ref_sample(const rt_sampler *sp, const float *lg, uint32_t n,
                          rt_rng *rng, float *p, int32_t *idx)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (lg[i] > lg[best])
            best = i;
    if (sp->temperature <= 0.0f || n == 1)
        return (int32_t)best;
    const float mx = lg[best];
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        p[i] = (float)exp(((double)lg[i] - mx) * (1.0 / (double)sp->temperature));
        total += p[i];
    }
    int use_k = sp->top_k > 0 && sp->top_k < n;
    int use_p = sp->top_p > 0.0f && sp->top_p < 1.0f;
    double u = rt_rng_uniform(rng);
    size_t m = 0;
    /* candidates: all, or those that can be in the nucleus (and the
     * maxima), then best first, cut to top_k */
    double cutoff = use_p && !use_k
                        ? (1.0 - sp->top_p) / (double)(n - 1) * total
                        : -1.0;
    for (uint32_t i = 0; i < n; i++)
        if ((double)p[i] >= cutoff || lg[i] == mx)
            idx[m++] = (int32_t)i;
    if (!use_k && !use_p) {
        double target = u * total, cum = 0.0;
        for (uint32_t i = 0; i < n; i++)
            if ((cum += p[i]) > target)
                return (int32_t)i;
        return (int32_t)(n - 1);
    }
    g_ref_p = p;
    qsort(idx, m, sizeof *idx, ref_rank);
    if (use_k && m > sp->top_k)
        m = sp->top_k;
    double base = 0.0;
    for (size_t i = 0; i < m; i++)
        base += p[idx[i]];
    if (!use_k)
        base = total;
    if (use_p) {
        double need = (double)sp->top_p * base, cum = 0.0;
        for (size_t i = 0; i < m; i++)
            if ((cum += p[idx[i]]) >= need) {
                m = i + 1;
                break;
            }
    }
    double kept = 0.0, cum = 0.0;
    for (size_t i = 0; i < m; i++)
        kept += p[idx[i]];
    for (size_t i = 0; i < m; i++)
        if ((cum += p[idx[i]]) > u * kept)
            return idx[i];
    return idx[m - 1];
}

/* Over rows with ties at the maximum, near-ties and a wide range, every
 * sampler (temperatures from 0.05 to 1e7, where most probabilities round
 * to 1; top-k 0, 1, 7, n-1, n; top-p 0, 0.002, 0.5, 0.95, 1) draws the
 * reference's token from the same RNG state, 2000 rows each. */
static void test_sample_in_place_matches_plain_reference(void **st)
{
    (void)st;
    enum { N = 257 };
    static const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 1e7f};
    static const uint32_t ks[] = {0, 1, 7, N - 1, N};
    static const float ps[] = {0.0f, 0.002f, 0.5f, 0.95f, 1.0f};
    float lg[N], row[N], p[N];
    int32_t idx[N], ridx[N];
    rt_rng gen, a, b;
    rt_rng_seed(&gen, 11, 0);
    size_t draws = 0, differ_from_argmax = 0;
    for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
            for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
                rt_sampler sp = {temps[ti], ks[ki], ps[pi]};
                rt_rng_seed(&a, 3 + ti, ki * 8 + pi);
                b = a;
                for (int r = 0; r < 80; r++) {
                    for (int i = 0; i < N; i++)
                        lg[i] = (float)(rt_rng_uniform(&gen) * 8.0 - 4.0);
                    if (r % 3 == 0) { /* ties at the maximum */
                        lg[5] = lg[77] = lg[200] = 6.0f;
                        lg[6] = nextafterf(6.0f, 0.0f); /* and a near-tie */
                    }
                    if (r % 5 == 1) /* a flat row */
                        for (int i = 0; i < N; i++)
                            lg[i] = (float)(i % 4);
                    memcpy(row, lg, sizeof row);
                    int32_t t = rt_sample(&sp, row, N, &a, idx);
                    int32_t want = ref_sample(&sp, lg, N, &b, p, ridx);
                    if (t != want)
                        print_error("T %g k %u p %g row %d: %d, reference "
                                    "%d\n", (double)sp.temperature, sp.top_k,
                                    (double)sp.top_p, r, t, want);
                    assert_int_equal(t, want);
                    assert_true(a.s == b.s);
                    draws++;
                    uint32_t best = 0;
                    for (uint32_t i = 1; i < N; i++)
                        if (lg[i] > lg[best])
                            best = i;
                    differ_from_argmax += t != (int32_t)best;
                }
            }
    /* the comparison is not between two argmaxes */
    assert_true(differ_from_argmax > draws / 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_greedy_is_argmax_first_on_ties),
        cmocka_unit_test(test_rng_streams_depend_on_seed_and_sequence_index),
        cmocka_unit_test(test_sample_temperature_follows_softmax),
        cmocka_unit_test(test_sample_top_k_and_top_p_restrict_candidates),
        cmocka_unit_test(test_sample_is_reproducible_and_allocation_free),
        cmocka_unit_test(test_logprob_and_stop_tokens),
        cmocka_unit_test(test_sample_in_place_matches_plain_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_sampling.c - rt_sample: greedy, temperature, top-k, top-p, the
 * per-sequence RNG, stop tokens and log-probabilities. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
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
    assert_int_equal(rt_sample(&sp, lg, V, &r, NULL, NULL), 1);
    sp.temperature = -1.0f; /* <= 0 is greedy too */
    assert_int_equal(rt_sample(&sp, lg, V, &r, NULL, NULL), 1);
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
    float probs[V];
    int32_t idx[V];
    rt_rng r;
    rt_rng_seed(&r, 7, 0);
    memset(freq, 0, V * sizeof *freq);
    for (int i = 0; i < n; i++) {
        int32_t t = rt_sample(sp, lg, V, &r, probs, idx);
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
    float lg[V] = {0.3f, 0.1f, 0.2f, 0.25f, 0.0f, 0.15f};
    float probs[V];
    int32_t idx[V];
    rt_sampler sp = {.temperature = 1.3f, .top_k = 4, .top_p = 0.9f};
    int32_t a[64], b[64];
    rt_rng r;
    mc_alloc_reset_count();
    mc_alloc_fail_after(0);
    rt_rng_seed(&r, 5, 2);
    for (int i = 0; i < 64; i++)
        a[i] = rt_sample(&sp, lg, V, &r, probs, idx);
    rt_rng_seed(&r, 5, 2);
    for (int i = 0; i < 64; i++)
        b[i] = rt_sample(&sp, lg, V, &r, probs, idx);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_greedy_is_argmax_first_on_ties),
        cmocka_unit_test(test_rng_streams_depend_on_seed_and_sequence_index),
        cmocka_unit_test(test_sample_temperature_follows_softmax),
        cmocka_unit_test(test_sample_top_k_and_top_p_restrict_candidates),
        cmocka_unit_test(test_sample_is_reproducible_and_allocation_free),
        cmocka_unit_test(test_logprob_and_stop_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_runtime_api.c - the embedding API (mcrt.h): open/close, waves over
 * max_batch with per-request sequence seeding, scoring and logits entry
 * points agreeing with each other, errors as strings, and no allocation
 * after mcrt_open. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_ops.h"
#include "mc_alloc.h"
#include "mcrt.h"
#include "testutil.h"

static mcrt *open_fixture(const char *name, uint32_t batch)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    mcrt_options o;
    mcrt_options_default(&o);
    o.max_batch = batch;
    o.max_seq = 64;
    o.prefill_chunk = 16;
    o.threads = 2;
    /* the harness's backend (tu_backend) */
    mcrt *h = tu_mcrt_open(dir, &o);
    free(dir);
    return h;
}

static void test_mcrt_open_failure_sets_last_error(void **st)
{
    (void)st;
    mcrt *h = (mcrt *)1;
    assert_int_not_equal(mcrt_open("/nonexistent/dir", NULL, &h), 0);
    assert_null(h);
    assert_true(strlen(mcrt_last_error(NULL)) > 0);
    mcrt_close(NULL);
}

static void test_mcrt_waves_give_the_same_results_as_one_batch(void **st)
{
    (void)st;
    enum { N = 5, NEW = 8 };
    int32_t p[N][6];
    const int32_t *pp[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 6; j++)
            p[i][j] = (int32_t)((i * 31 + j * 7 + 1) % 256);
        pp[i] = p[i];
        lens[i] = (size_t)(2 + i);
    }
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.max_new_tokens = NEW;
    gp.temperature = 0.9f;
    gp.top_p = 0.9f;
    gp.seed = 11;
    gp.use_model_eos = 0;
    int32_t a[N][NEW], b[N][NEW];
    mcrt_result ra[N], rb[N];
    for (int i = 0; i < N; i++) {
        ra[i] = (mcrt_result){.ids = a[i]};
        rb[i] = (mcrt_result){.ids = b[i]};
    }
    mcrt *h5 = open_fixture("qwen2", 5), *h2 = open_fixture("qwen2", 2);
    /* scalar kernels: row-invariant, so wave shapes cannot change a bit
     * (see test_runtime_fixtures for the optimized kernels) */
    kn_set_force_scalar(1);
    assert_int_equal(mcrt_generate(h5, pp, lens, N, &gp, ra), 0);
    /* max_batch 2: three waves, sequence i still seeded with (seed, i) */
    assert_int_equal(mcrt_generate(h2, pp, lens, N, &gp, rb), 0);
    kn_set_force_scalar(0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ra[i].n_ids, NEW);
        assert_int_equal(rb[i].n_ids, NEW);
        assert_int_equal(ra[i].stop_reason, 1);
        assert_int_equal(ra[i].prompt_used, lens[i]);
    }
    mcrt_stats stt;
    mcrt_get_stats(h2, &stt);
    assert_int_equal(stt.prefill_tokens, 2 + 3 + 4 + 5 + 6);
    assert_true(stt.decode_tokens > 0);
    mcrt_info info;
    assert_int_equal(mcrt_get_info(h2, &info), 0);
    assert_int_equal(info.max_batch, 2);
    assert_int_equal(info.vocab_size, 256);
    mcrt_close(h5);
    mcrt_close(h2);
    for (int i = 0; i < N; i++)
        assert_memory_equal(a[i], b[i], sizeof a[i]);
}

static void test_mcrt_scores_agree_with_logits(void **st)
{
    (void)st;
    mcrt *h = open_fixture("mistral", 3);
    const int32_t prompt[5] = {1, 50, 60, 70, 80}, cont[3] = {9, 10, 11};
    const int32_t *pp[1] = {prompt};
    size_t len = 5, clen = 3;
    const int32_t *cp[1] = {cont};
    float lab[2], per[3];
    float *perp[1] = {per};
    double sum;
    const int32_t labels[2] = {9, 100};
    assert_int_equal(mcrt_score_labels(h, pp, &len, 1, labels, 2, lab, 0), 0);
    assert_int_equal(
        mcrt_score_continuations(h, pp, &len, 1, cp, &clen, perp, &sum, 0), 0);
    assert_true(fabs(lab[0] - per[0]) < 1e-5);
    assert_true(fabs(sum - (per[0] + per[1] + per[2])) < 1e-5);
    /* logits of the full sequence give the same log-probs */
    int32_t all[8] = {1, 50, 60, 70, 80, 9, 10, 11};
    const int32_t *ap[1] = {all};
    size_t alen = 8;
    float *lg = calloc(8 * 256, sizeof(float));
    float *lgp[1] = {lg};
    assert_int_equal(mcrt_logits(h, ap, &alen, 1, lgp), 0);
    for (int j = 0; j < 3; j++) {
        const float *row = lg + (4 + j) * 256;
        double mx = row[0], z = 0;
        for (int v = 0; v < 256; v++)
            mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < 256; v++)
            z += exp(row[v] - mx);
        assert_true(fabs(per[j] - (row[cont[j]] - mx - log(z))) < 1e-4);
    }
    free(lg);
    /* refusals come back as strings naming the plan */
    int32_t longp[70];
    for (int i = 0; i < 70; i++)
        longp[i] = 1;
    const int32_t *lp[1] = {longp};
    size_t ll = 70;
    assert_int_equal(mcrt_score_labels(h, lp, &ll, 1, labels, 2, lab, 0), 10);
    assert_non_null(strstr(mcrt_last_error(h), "max_seq 64"));
    assert_int_equal(mcrt_score_labels(h, lp, &ll, 1, labels, 2, lab, 1), 0);
    mcrt_close(h);
}

/* mcrt_submit_generate / mcrt_step: 7 requests of different lengths
 * through 2 slots, each submitted as soon as a slot is free, give the ids
 * mcrt_generate gives the same requests (sampled, so the per-request RNG
 * is checked too); a request over the plan is refused at submit with
 * status 10 and the others go on; whole calls refuse while requests run. */
static void test_mcrt_continuous_batching_matches_whole_calls(void **st)
{
    (void)st;
    enum { N = 7, NEW = 9 };
    int32_t p[N][12];
    const int32_t *pp[N];
    size_t lens[N];
    uint32_t news[N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 12; j++)
            p[i][j] = (int32_t)((i * 37 + j * 11 + 3) % 256);
        pp[i] = p[i];
        lens[i] = (size_t)(1 + (i * 5) % 12);
        news[i] = (uint32_t)(1 + (i * 3) % NEW);
    }
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.temperature = 0.8f;
    gp.top_k = 20;
    gp.seed = 5;
    gp.use_model_eos = 0;
    int32_t a[N][NEW], b[N][NEW];
    mcrt_result ra[N], rb[N];
    mcrt *h = open_fixture("llama", 2);
    kn_set_force_scalar(1); /* row-invariant kernels, as above */
    for (int i = 0; i < N; i++) {
        ra[i] = (mcrt_result){.ids = a[i]};
        gp.max_new_tokens = news[i];
        /* one call per request: its RNG is (seed, 0), as the submitted
         * requests' with seq_index 0 */
        mcrt_gen_params g1 = gp;
        assert_int_equal(mcrt_generate(h, &pp[i], &lens[i], 1, &g1, &ra[i]),
                         0);
    }
    size_t next = 0, finished = 0;
    uint32_t done[2];
    mcrt_gen_params gq[N];
    while (finished < N) {
        while (next < N && mcrt_free_slots(h) > 0) {
            gq[next] = gp;
            gq[next].max_new_tokens = news[next];
            rb[next] = (mcrt_result){.ids = b[next]};
            assert_int_equal(mcrt_submit_generate(h, pp[next], lens[next],
                                                  &gq[next], 0, &rb[next],
                                                  NULL),
                             0);
            next++;
        }
        if (next < N) {
            /* both slots busy: no third one, and no whole call */
            mcrt_result rx = {.ids = b[0]};
            assert_int_equal(mcrt_submit_generate(h, pp[0], 1, &gp, 0, &rx,
                                                  NULL),
                             MC_ERR_INVALID_ARG);
            assert_int_not_equal(mcrt_generate(h, pp, lens, 1, &gp, &rx), 0);
        }
        size_t nd = 9;
        assert_int_equal(mcrt_step(h, done, &nd), 0);
        finished += nd;
    }
    kn_set_force_scalar(0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rb[i].n_ids, news[i]);
        assert_int_equal(rb[i].n_ids, ra[i].n_ids);
        assert_memory_equal(a[i], b[i], ra[i].n_ids * sizeof(int32_t));
    }
    /* over the plan (max_seq 64): refused at submit, nothing runs */
    int32_t big[70] = {0};
    mcrt_result rz = {.ids = b[0]};
    gp.max_new_tokens = 1;
    assert_int_equal(mcrt_submit_generate(h, big, 70, &gp, 0, &rz, NULL),
                     MC_ERR_PLAN);
    assert_int_equal(mcrt_free_slots(h), 2);
    size_t nd = 9;
    assert_int_equal(mcrt_step(h, done, &nd), 0);
    assert_int_equal(nd, 0);
    mcrt_close(h);
}

static void test_mcrt_calls_do_not_allocate_after_open(void **st)
{
    (void)st;
    mcrt *h = open_fixture("llama", 2);
    int32_t p[3][4] = {{1, 2, 3, 4}, {1, 9, 9, 9}, {1, 100, 3, 4}};
    const int32_t *pp[3] = {p[0], p[1], p[2]};
    size_t lens[3] = {4, 2, 3};
    int32_t out[3][6];
    mcrt_result r[3] = {{.ids = out[0]}, {.ids = out[1]}, {.ids = out[2]}};
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.max_new_tokens = 6;
    gp.temperature = 0.7f;
    gp.top_k = 10;
    float lab[3];
    const int32_t labels[1] = {5};
    mc_alloc_reset_count();
    mc_alloc_fail_after(0);
    int rc1 = mcrt_generate(h, pp, lens, 3, &gp, r);
    int rc2 = mcrt_score_labels(h, pp, lens, 3, labels, 1, lab, 0);
    uint64_t n = mc_alloc_count();
    mc_alloc_fail_after(-1);
    assert_int_equal(rc1, 0);
    assert_int_equal(rc2, 0);
    assert_int_equal(n, 0);
    mcrt_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mcrt_open_failure_sets_last_error),
        cmocka_unit_test(test_mcrt_waves_give_the_same_results_as_one_batch),
        cmocka_unit_test(test_mcrt_scores_agree_with_logits),
        cmocka_unit_test(test_mcrt_calls_do_not_allocate_after_open),
        cmocka_unit_test(test_mcrt_continuous_batching_matches_whole_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

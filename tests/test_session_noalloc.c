/* test_session_noalloc.c - after rt_session_create nothing allocates:
 * generation, scoring and logits all run with every mc_malloc failing, and
 * session creation itself survives each allocation failing in turn. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"

static rt_model *open_fixture(const char *name)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, &m, &e), MC_OK);
    free(dir);
    return m;
}

static void run_everything(rt_session *s)
{
    int32_t p0[30], p1[5] = {1, 7, 9, 11, 13};
    for (int i = 0; i < 30; i++)
        p0[i] = (i * 37 + 1) % 256;
    rt_prompt pr[2] = {{p0, 30}, {p1, 5}};
    int32_t o0[20], o1[20];
    rt_gen_result res[2] = {{.ids = o0}, {.ids = o1}};
    const int32_t stop[1] = {2};
    rt_gen_params gp = {.max_new_tokens = 20,
                        .sampler = {.temperature = 0.8f, .top_k = 50,
                                    .top_p = 0.9f},
                        .seed = 3, .stop = stop, .n_stop = 1};
    mc_error e;
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, res, &e), MC_OK);
    gp.sampler = (rt_sampler){0};
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, res, &e), MC_OK);
    gp.sampler = (rt_sampler){.temperature = 1.0f, .top_p = 0.5f};
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, res, &e), MC_OK);
    float cl[4], ll[3], cl1[4], ll1[3];
    const int32_t labels[3] = {3, 4, 5};
    rt_score_item it[2] = {
        {.prompt = {p0, 30}, .cont = p1, .n_cont = 4, .cont_logprobs = cl,
         .label_logprobs = ll},
        {.prompt = {p1, 5}, .cont = p0, .n_cont = 4, .cont_logprobs = cl1,
         .label_logprobs = ll1},
    };
    assert_int_equal(rt_session_score(s, it, 2, labels, 3, RT_TRUNC_NONE, &e),
                     MC_OK);
    float *lg0 = calloc(30 * 256, sizeof(float)),
          *lg1 = calloc(5 * 256, sizeof(float));
    float *outs[2] = {lg0, lg1};
    assert_int_equal(rt_session_logits(s, pr, 2, outs, &e), MC_OK);
    free(lg0);
    free(lg1);
}

static void test_session_generate_and_score_run_with_allocation_failing(
    void **st)
{
    (void)st;
    const char *names[] = {"llama", "qwen2", "llama-dynamic", "llama-bf16"};
    const kn_kvtype kvs[] = {KN_KV_F32, KN_KV_F16, KN_KV_I8, KN_KV_F32};
    for (int i = 0; i < 4; i++) {
        rt_model *m = open_fixture(names[i]);
        rt_limits L = {.max_batch = 2, .max_seq = 64, .prefill_chunk = 8,
                       .kv_type = kvs[i], .threads = 2};
        rt_session *s;
        mc_error e;
        assert_int_equal(tu_session_create(m, &L, NULL, &s, &e), MC_OK);
        mc_alloc_reset_count();
        mc_alloc_fail_after(0);
        run_everything(s);
        int injected = mc_alloc_failure_injected();
        uint64_t attempts = mc_alloc_count();
        mc_alloc_fail_after(-1);
        assert_int_equal(attempts, 0);
        assert_false(injected);
        rt_session_free(s);
        rt_model_free(m);
    }
}

static void test_session_create_survives_each_allocation_failure(void **st)
{
    (void)st;
    rt_model *m = open_fixture("mistral");
    rt_limits L = {.max_batch = 2, .max_seq = 50, .prefill_chunk = 8,
                   .threads = 2};
    for (long k = 0;; k++) {
        rt_session *s = NULL;
        mc_error e;
        mc_alloc_fail_after(k);
        mc_status stt = rt_session_create(m, &L, NULL, &s, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        if (stt == MC_OK) {
            assert_false(injected);
            run_everything(s);
            rt_session_free(s);
            break;
        }
        assert_int_equal(stt, MC_ERR_NOMEM);
        assert_null(s);
        assert_true(k < 100);
    }
    rt_model_free(m);
}

static void test_model_open_survives_each_allocation_failure(void **st)
{
    (void)st;
    char *dir = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    for (long k = 0;; k++) {
        rt_model *m = NULL;
        mc_error e;
        mc_alloc_fail_after(k);
        mc_status stt = rt_model_open_hf(dir, &m, &e);
        mc_alloc_fail_after(-1);
        if (stt == MC_OK) {
            rt_model_free(m);
            break;
        }
        assert_null(m);
        assert_true(k < 100000);
    }
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_session_generate_and_score_run_with_allocation_failing),
        cmocka_unit_test(test_session_create_survives_each_allocation_failure),
        cmocka_unit_test(test_model_open_survives_each_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

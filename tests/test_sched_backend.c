/* test_sched_backend.c - the scheduler (rt_sched.c) against a backend of
 * the test's own (rt_backend.h): the CPU backend wrapped so that head()
 * answers argmax tokens instead of logits whenever the scheduler allows
 * it, as the CUDA backend does.  That path of the scheduler otherwise runs
 * only on a GPU.  Checks: greedy generation through the token path gives
 * the ids of a plain CPU session; the scheduler asks for tokens only for
 * head groups whose every row is a greedy generation nobody watches
 * (sampling, on_logits and scoring get logits); a backend failure frees
 * every slot and is returned. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "rt_backend.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"

/* The wrapper: the CPU backend inside, plus counters. */
typedef struct wrap {
    rt_backend cpu;
    int32_t tok[64];           /* argmax per head row */
    uint32_t vocab;
    size_t heads_tokens, heads_logits;
    int fail_at_head;          /* 1: the next head fails (MC_ERR_CUDA) */
} wrap;

static void w_free(void *ctx)
{
    wrap *w = ctx;
    w->cpu.i->free(w->cpu.ctx);
    free(w);
}

static mc_status w_upload(void *ctx, const rt_step *st, mc_error *err)
{
    wrap *w = ctx;
    return w->cpu.i->upload(w->cpu.ctx, st, err);
}

static mc_status w_block(void *ctx, const rt_step *st, uint32_t l,
                         mc_error *err)
{
    wrap *w = ctx;
    return w->cpu.i->block_forward(w->cpu.ctx, st, l, err);
}

static mc_status w_head(void *ctx, const rt_step *st, size_t r0, size_t g,
                        int want_tokens, float **logits,
                        const int32_t **tokens, mc_error *err)
{
    wrap *w = ctx;
    if (w->fail_at_head)
        return mc_fail(err, MC_ERR_CUDA, NULL, "head", -1, "injected");
    mc_status s = w->cpu.i->head(w->cpu.ctx, st, r0, g, 0, logits, tokens,
                                 err);
    if (s || !want_tokens) {
        w->heads_logits++;
        return s;
    }
    assert_true(g <= 64);
    for (size_t j = 0; j < g; j++) {
        const float *lg = *logits + j * w->vocab;
        int32_t best = 0;
        for (uint32_t v = 1; v < w->vocab; v++)
            if (lg[v] > lg[best])
                best = (int32_t)v;
        w->tok[j] = best;
    }
    *logits = NULL;
    *tokens = w->tok;
    w->heads_tokens++;
    return MC_OK;
}

static const rt_backend_i wrap_i = {
    .name = "test-argmax",
    .free = w_free,
    .upload = w_upload,
    .block_forward = w_block,
    .head = w_head,
    .finish = NULL,
};

static rt_session *open_wrapped(rt_model *m, wrap **out)
{
    rt_limits L = {.max_batch = 3, .max_seq = 64, .prefill_chunk = 16,
                   .threads = 2};
    wrap *w = calloc(1, sizeof *w);
    assert_non_null(w);
    mc_error e;
    assert_int_equal(rt_cpu_backend_create(m, &L, NULL, &w->cpu, &e), MC_OK);
    w->vocab = m->cfg.vocab_size;
    rt_backend be = {.i = &wrap_i, .ctx = w, .layout = w->cpu.layout,
                     .tab = w->cpu.tab, .host_arena = NULL};
    rt_session *s;
    assert_int_equal(rt_session_create_backend(m, &be, &s, &e), MC_OK);
    assert_null(be.i); /* taken over */
    *out = w;
    return s;
}

static void no_watch(void *ctx, size_t seq, size_t step, const float *lg,
                     uint32_t vocab)
{
    (void)seq;
    (void)step;
    (void)lg;
    (void)vocab;
    ++*(size_t *)ctx;
}

static void test_sched_token_head_matches_cpu_and_only_for_greedy(void **st)
{
    (void)st;
    char *dir = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    rt_model *m;
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, &m, &e), MC_OK);
    free(dir);
    rt_limits L = {.max_batch = 3, .max_seq = 64, .prefill_chunk = 16,
                   .threads = 2};
    rt_session *ref;
    assert_int_equal(rt_session_create(m, &L, NULL, &ref, &e), MC_OK);
    wrap *w;
    rt_session *s = open_wrapped(m, &w);

    int32_t p0[9] = {1, 5, 9, 14, 3, 8, 20, 7, 11}, p1[3] = {4, 2, 6};
    rt_prompt pr[2] = {{p0, 9}, {p1, 3}};
    int32_t a[2][10], b[2][10];
    rt_gen_result ra[2] = {{.ids = a[0]}, {.ids = a[1]}};
    rt_gen_result rb[2] = {{.ids = b[0]}, {.ids = b[1]}};
    rt_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new_tokens = 10;
    assert_int_equal(rt_session_generate(ref, pr, 2, &gp, ra, &e), MC_OK);
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, rb, &e), MC_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ra[i].n, 10);
        assert_int_equal(rb[i].n, 10);
        assert_memory_equal(a[i], b[i], 10 * sizeof(int32_t));
    }
    assert_true(w->heads_tokens > 0);
    assert_int_equal(w->heads_logits, 0);

    /* sampling, a watcher, scoring: logits every time */
    w->heads_tokens = 0;
    gp.sampler.temperature = 0.7f;
    gp.seed = 3;
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, rb, &e), MC_OK);
    gp.sampler.temperature = 0.0f;
    size_t watched = 0;
    gp.on_logits = no_watch;
    gp.on_logits_ctx = &watched;
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, rb, &e), MC_OK);
    assert_int_equal(watched, 20);
    float lab[2];
    const int32_t labels[2] = {3, 7};
    rt_score_item it = {.prompt = {p0, 9}, .label_logprobs = lab};
    assert_int_equal(rt_session_score(s, &it, 1, labels, 2, RT_TRUNC_NONE,
                                      &e),
                     MC_OK);
    assert_int_equal(w->heads_tokens, 0);
    assert_true(w->heads_logits > 0);

    /* a failing backend: the step fails, every slot is freed, the session
     * refuses further work (a device failure) */
    gp.on_logits = NULL;
    w->fail_at_head = 1;
    assert_int_equal(rt_session_admit_generate(s, 0, &pr[0], &gp, &rb[0], &e),
                     MC_OK);
    assert_int_equal(rt_session_admit_generate(s, 2, &pr[1], &gp, &rb[1], &e),
                     MC_OK);
    uint32_t done[3];
    size_t nd = 7;
    assert_int_equal(rt_session_step(s, done, &nd, &e), MC_ERR_CUDA);
    assert_int_equal(rt_session_busy(s), 0);
    w->fail_at_head = 0;
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, rb, &e), MC_ERR_CUDA);
    assert_non_null(strstr(e.message, "unusable"));

    rt_session_free(s);
    rt_session_free(ref);
    rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sched_token_head_matches_cpu_and_only_for_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

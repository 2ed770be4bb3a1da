/* test_session_batch.c - continuous batching in the session
 * (rt_session_admit_* / rt_session_step): a mix of generation (greedy and
 * seeded sampling) and scoring (labels, continuations) of mixed lengths,
 * admitted as slots free up, gives bit-identical results to the same
 * requests run one by one; no step allocates; requests beyond the plan and
 * busy slots are refused.  The same for a tied int8 artifact, whose output
 * layer is its int8 embedding on the integer path, on 1 or 2 threads. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_compile.h"
#include "kn_qdot.h"
#include "mc_alloc.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"

#define NREQ 13
#define MAXNEW 12
#define NLAB 3

typedef struct req {
    int score;                 /* 0 generate, 1 score */
    int32_t prompt[40];
    size_t n;
    rt_gen_params gp;
    int32_t ids[MAXNEW];
    rt_gen_result res;
    int32_t cont[5];
    rt_score_item item;
    float cont_lp[5], lab_lp[NLAB];
} req;

static const int32_t g_labels[NLAB] = {3, 40, 77};
static const int32_t g_stop[1] = {2};

/* Request k: lengths, kinds and samplers drawn from a fixed generator. */
static void make_req(req *r, size_t k, tu_rng *g)
{
    memset(r, 0, sizeof *r);
    r->n = 1 + tu_rng_u32(g) % 40;
    for (size_t i = 0; i < r->n; i++)
        r->prompt[i] = (int32_t)(tu_rng_u32(g) % 256);
    r->score = k % 3 == 2;
    r->gp.max_new_tokens = 1 + tu_rng_u32(g) % MAXNEW;
    if (k % 2)
        r->gp.sampler = (rt_sampler){.temperature = 0.9f, .top_k = 40,
                                     .top_p = 0.95f};
    r->gp.seed = 1000 + k;
    r->gp.stop = g_stop;
    r->gp.n_stop = 1;
    r->res.ids = r->ids;
    r->item.prompt = (rt_prompt){r->prompt, r->n};
    if (k % 2) {
        r->item.n_cont = 1 + k % 5;
        for (size_t i = 0; i < r->item.n_cont; i++)
            r->cont[i] = (int32_t)((k * 31 + i * 7) % 256);
        r->item.cont = r->cont;
        r->item.cont_logprobs = r->cont_lp;
    }
    r->item.label_logprobs = r->lab_lp;
}

static mc_status admit(rt_session *s, uint32_t slot, req *r, mc_error *e)
{
    if (r->score)
        return rt_session_admit_score(s, slot, &r->item, g_labels, NLAB,
                                      RT_TRUNC_NONE, e);
    rt_prompt p = {r->prompt, r->n};
    return rt_session_admit_generate(s, slot, &p, &r->gp, &r->res, e);
}

/* Admit requests in order as slots free up, until all are done.  Returns
 * the number of steps. */
static size_t run_continuous(rt_session *s, req *rq, size_t n, uint32_t B)
{
    size_t next = 0, left = n, steps = 0;
    uint32_t done[8];
    mc_error e;
    while (left > 0) {
        for (uint32_t slot = 0; slot < B && next < n; slot++)
            if (!rt_session_slot_is_busy(s, slot))
                assert_int_equal(admit(s, slot, &rq[next++], &e), MC_OK);
        size_t nd = 0;
        assert_int_equal(rt_session_step(s, done, &nd, &e), MC_OK);
        left -= nd;
        steps++;
    }
    assert_int_equal(rt_session_busy(s), 0);
    return steps;
}

static void run_one_by_one(rt_session *s, req *rq, size_t n)
{
    mc_error e;
    for (size_t k = 0; k < n; k++) {
        req *r = &rq[k];
        if (r->score) {
            assert_int_equal(rt_session_score(s, &r->item, 1, g_labels, NLAB,
                                              RT_TRUNC_NONE, &e),
                             MC_OK);
        } else {
            rt_prompt p = {r->prompt, r->n};
            assert_int_equal(rt_session_generate(s, &p, 1, &r->gp, &r->res,
                                                 &e),
                             MC_OK);
        }
    }
}

static void assert_same(const req *a, const req *b, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (a[k].score) {
            assert_memory_equal(a[k].lab_lp, b[k].lab_lp, sizeof a[k].lab_lp);
            assert_memory_equal(a[k].cont_lp, b[k].cont_lp,
                                sizeof a[k].cont_lp);
            continue;
        }
        assert_int_equal(a[k].res.n, b[k].res.n);
        assert_int_equal(a[k].res.stop, b[k].res.stop);
        assert_int_equal(a[k].res.stop_token, b[k].res.stop_token);
        assert_memory_equal(a[k].ids, b[k].ids, a[k].res.n * sizeof(int32_t));
    }
}

static rt_session *open_session(const char *name, uint32_t B, rt_model **m)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, m, &e), MC_OK);
    free(dir);
    rt_limits L = {.max_batch = B, .max_seq = 64, .prefill_chunk = 16,
                   .threads = 2};
    rt_session *s;
    assert_int_equal(tu_session_create(*m, &L, NULL, &s, &e), MC_OK);
    return s;
}

static void test_continuous_mix_equals_one_by_one(void **st)
{
    (void)st;
    const char *names[] = {"llama", "qwen2", "llama-dynamic"};
    for (int f = 0; f < 3; f++) {
        rt_model *m;
        rt_session *s = open_session(names[f], 3, &m);
        static req one[NREQ], cont[NREQ];
        tu_rng g = {0x9E3779B97F4A7C15ull + (uint64_t)f};
        for (size_t k = 0; k < NREQ; k++) {
            make_req(&one[k], k, &g);
            cont[k] = one[k];
            cont[k].res.ids = cont[k].ids;
            cont[k].item.cont = cont[k].cont;
            cont[k].item.prompt.ids = cont[k].prompt;
            if (cont[k].item.cont_logprobs)
                cont[k].item.cont_logprobs = cont[k].cont_lp;
            cont[k].item.label_logprobs = cont[k].lab_lp;
        }
        run_one_by_one(s, one, NREQ);
        /* The whole batch, without allocating. */
        mc_alloc_reset_count();
        mc_alloc_fail_after(0);
        size_t steps = run_continuous(s, cont, NREQ, 3);
        uint64_t attempts = mc_alloc_count();
        mc_alloc_fail_after(-1);
        assert_int_equal(attempts, 0);
        assert_same(one, cont, NREQ);
        /* Fewer steps than the requests one by one would need: prompt
         * rows shared steps with decode rows. */
        assert_true(steps < NREQ * (MAXNEW + 3));
        rt_session_free(s);
        rt_model_free(m);
    }
}

/* A quantized output layer: a tied artifact's embedding (int8 per row, or
 * --lm-head int4 / int4-sym per group) is looked up per token and is the
 * output layer; an untied one's lm_head in int4-sym; both multiplied on
 * the integer path (rt_cpu.c's head).  Requests run one by one, mixed in
 * continuous batches, and on one thread instead of two give the same
 * bits; the log-probabilities stay within the integer path's rounding of
 * the float path's: int16 activations against int8 rows (1e-2), int8
 * activations per block of 32 against int4 (0.1: the fixtures' random
 * weights at vocab 256; int4-sym linears with an int8 head move 0.036). */
static void check_quantized_head(const char *fixture, const char *quant,
                                 kn_wformat head, double bound)
{
    char *dir = tu_mkdtemp("sbq8");
    char *art = tu_fmt("%s/q.mca", dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse(quant, 32, &o.req.policy, NULL), MC_OK);
    if (head != KN_W_Q8) { /* --lm-head */
        o.req.policy.lm_head_set = 1;
        o.req.policy.lm_head_fmt = head;
    }
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 3;
    o.req.max_seq = 64;
    char *model = tu_fmt("%s/%s", MC_FIXTURE_DIR, fixture);
    o.model = model;
    o.out = art;
    mc_error e;
    assert_int_equal(cmp_compile(&o, NULL, &e), MC_OK);
    rt_model *m;
    assert_int_equal(rt_model_open(art, &m, &e), MC_OK);
    assert_int_equal(m->lm_head.fmt, head);
    if (m->cfg.tie_word_embeddings)
        assert_ptr_equal(m->lm_head.data, m->embed.data);
    static req one[NREQ], cont[NREQ], th1[NREQ], fl[NREQ];
    req *sets[4] = {one, cont, th1, fl};
    for (int v = 0; v < 4; v++) {
        tu_rng g = {0xA5A5u};
        for (size_t k = 0; k < NREQ; k++)
            make_req(&sets[v][k], k, &g);
    }
    rt_session *s[2];
    for (int t = 0; t < 2; t++) {
        rt_limits L = {.max_batch = 3, .max_seq = 64, .prefill_chunk = 16,
                       .threads = 2 - t};
        assert_int_equal(tu_session_create(m, &L, NULL, &s[t], &e), MC_OK);
    }
    run_one_by_one(s[0], one, NREQ);
    run_continuous(s[0], cont, NREQ, 3);
    run_one_by_one(s[1], th1, NREQ);
    assert_same(one, cont, NREQ);
    assert_same(one, th1, NREQ);
    kn_set_float_dot(1);
    run_one_by_one(s[0], fl, NREQ);
    kn_set_float_dot(0);
    double worst = 0;
    for (size_t k = 0; k < NREQ; k++)
        for (size_t i = 0; one[k].score && i < NLAB; i++) {
            double d = fabs((double)one[k].lab_lp[i] - fl[k].lab_lp[i]);
            worst = d > worst ? d : worst;
        }
    print_message("%s %s, %s head: largest label log-prob change against "
                  "the float path %.3g\n", fixture, quant,
                  kn_wformat_name(head), worst);
    assert_true(worst > 0 && worst < bound);
    for (int t = 0; t < 2; t++)
        rt_session_free(s[t]);
    rt_model_free(m);
    tu_rmtree(dir);
    free(model);
    free(art);
    free(dir);
}

static void test_quantized_head_same_bits_batched_and_any_threads(void **st)
{
    (void)st;
    check_quantized_head("qwen2", "int8", KN_W_Q8, 1e-2);
    check_quantized_head("qwen2", "int4-sym", KN_W_Q4S, 0.1);
    check_quantized_head("qwen2", "int8", KN_W_Q4, 0.1);
    check_quantized_head("llama", "int4-sym", KN_W_Q4S, 0.1);
}

/* The elementwise steps split over the pool (every step split: pool
 * minimum 1 value) give the one-thread bits, float path (HF model) and
 * integer path (int8 artifact, whose activation quantization splits too),
 * one by one and batched. */
static void test_split_elementwise_steps_same_bits(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("split");
    char *art = tu_fmt("%s/a.mca", dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse("int8", 0, &o.req.policy, NULL), MC_OK);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 3;
    o.req.max_seq = 64;
    char *model = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    o.model = model;
    o.out = art;
    mc_error e;
    assert_int_equal(cmp_compile(&o, NULL, &e), MC_OK);
    for (int which = 0; which < 2; which++) {
        rt_model *m;
        char *hf = tu_fmt("%s/llama", MC_FIXTURE_DIR);
        assert_int_equal(which ? rt_model_open(art, &m, &e)
                               : rt_model_open_hf(hf, &m, &e), MC_OK);
        free(hf);
        static req one[NREQ], split[NREQ], cont[NREQ];
        req *sets[3] = {one, split, cont};
        for (int v = 0; v < 3; v++) {
            tu_rng g = {0x5EEDu};
            for (size_t k = 0; k < NREQ; k++)
                make_req(&sets[v][k], k, &g);
        }
        rt_session *s1, *s3;
        rt_limits L1 = {.max_batch = 3, .max_seq = 64, .prefill_chunk = 16,
                        .threads = 1};
        rt_limits L3 = L1;
        L3.threads = 3;
        assert_int_equal(tu_session_create(m, &L1, NULL, &s1, &e), MC_OK);
        assert_int_equal(tu_session_create(m, &L3, NULL, &s3, &e), MC_OK);
        run_one_by_one(s1, one, NREQ);
        kn_set_pool_min_values(1);
        run_one_by_one(s3, split, NREQ);
        run_continuous(s3, cont, NREQ, 3);
        kn_set_pool_min_values(0);
        assert_same(one, split, NREQ);
        assert_same(one, cont, NREQ);
        rt_session_free(s1);
        rt_session_free(s3);
        rt_model_free(m);
    }
    tu_rmtree(dir);
    free(model);
    free(art);
    free(dir);
}

static void test_admit_refuses_beyond_plan_and_busy_slots(void **st)
{
    (void)st;
    rt_model *m;
    rt_session *s = open_session("llama", 2, &m);
    int32_t p[70] = {1};
    int32_t out[16];
    rt_gen_result res = {.ids = out};
    rt_gen_params gp = {.max_new_tokens = 16};
    rt_prompt pr = {p, 60};
    mc_error e;
    /* 60 + 16 > max_seq 64 */
    assert_int_equal(rt_session_admit_generate(s, 0, &pr, &gp, &res, &e),
                     MC_ERR_PLAN);
    assert_non_null(strstr(e.message, "max_seq 64"));
    assert_int_equal(rt_session_busy(s), 0);
    gp.truncate = RT_TRUNC_LEFT;
    assert_int_equal(rt_session_admit_generate(s, 0, &pr, &gp, &res, &e),
                     MC_OK);
    assert_int_equal(res.prompt_used, 48);
    assert_int_equal(rt_session_admit_generate(s, 0, &pr, &gp, &res, &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(rt_session_admit_generate(s, 2, &pr, &gp, &res, &e),
                     MC_ERR_PLAN);
    assert_int_equal(rt_session_generate(s, &pr, 1, &gp, &res, &e),
                     MC_ERR_INVALID_ARG);
    uint32_t done[2];
    size_t nd = 0, total = 0;
    while (rt_session_busy(s)) {
        assert_int_equal(rt_session_step(s, done, &nd, &e), MC_OK);
        total += nd;
    }
    assert_int_equal(total, 1);
    assert_int_equal(done[0], 0);
    assert_int_equal(res.n, 16);
    assert_int_equal(rt_session_generate(s, &pr, 1, &gp, &res, &e), MC_OK);
    rt_session_free(s);
    rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_continuous_mix_equals_one_by_one),
        cmocka_unit_test(test_quantized_head_same_bits_batched_and_any_threads),
        cmocka_unit_test_teardown(test_split_elementwise_steps_same_bits,
                                  tu_reset_kernel_switches),
        cmocka_unit_test(test_admit_refuses_beyond_plan_and_busy_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

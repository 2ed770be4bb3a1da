/* test_plan_random.c - randomized plan-versus-run check: for >= 200 random
 * (fixture family, weight format, KV type, batch, context, chunk) cases,
 * compile an artifact with that plan, load it, open a session on the
 * stored plan and run requests the plan admits (including its corner: every
 * slot filled to max_seq).  Each must run without allocating, the arena's
 * measured high-water mark must stay within the planned size, and requests
 * beyond the plan must be refused with a message naming its limits (or
 * truncated when asked).  Prints planned-minus-used slack statistics. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_compile.h"
#include "mc_alloc.h"
#include "rt_artifact.h"
#include "rt_session.h"
#include "testutil.h"

#define NCASES 200

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t pick(uint64_t *s, uint64_t lo, uint64_t hi) /* [lo, hi] */
{
    return lo + rng(s) % (hi - lo + 1);
}

typedef struct stats {
    size_t cases, requests, refused, truncated;
    double slack_sum, slack_max, slack_min;
    double pack_sum, pack_max;      /* (arena - live lower bound) / arena */
    uint64_t planned_sum, used_sum;
    double touched_slack_sum, touched_slack_max; /* (planned - written) / planned */
} stats;

/* Generate for n prompts of lengths len[] with max_new tokens each. */
static mc_status run(rt_session *s, uint32_t vocab, size_t n,
                     const size_t *len, uint32_t max_new, rt_truncate tr,
                     uint64_t *seed, rt_gen_result *res, mc_error *err)
{
    rt_prompt pr[16];
    int32_t *ids[16], *out[16];
    for (size_t i = 0; i < n; i++) {
        ids[i] = malloc(len[i] * sizeof(int32_t));
        out[i] = malloc((max_new + 1) * sizeof(int32_t));
        for (size_t j = 0; j < len[i]; j++)
            ids[i][j] = (int32_t)(j == 0 ? 1 : pick(seed, 3, vocab - 1));
        pr[i] = (rt_prompt){ids[i], len[i]};
        memset(&res[i], 0, sizeof res[i]);
        res[i].ids = out[i];
    }
    rt_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new_tokens = max_new;
    gp.truncate = tr;
    mc_alloc_reset_count();
    mc_status st = rt_session_generate(s, pr, n, &gp, res, err);
    if (st == MC_OK)
        assert_int_equal(mc_alloc_count(), 0); /* never allocates after load */
    for (size_t i = 0; i < n; i++) {
        free(ids[i]);
        free(out[i]);
    }
    return st;
}

/* (planned - used) / planned, the unused fraction of the plan: added to
 * *sum and raising *max; returned. */
static double add_slack(uint64_t planned, uint64_t used, double *sum,
                        double *max)
{
    double slack = (double)(planned - used) / (double)planned;
    *sum += slack;
    if (slack > *max)
        *max = slack;
    return slack;
}

static void one_case(uint64_t *seed, const char *dir, stats *S)
{
    static const char *const fam[] = {"llama", "mistral", "qwen2",
                                      "llama-bias", "llama3-rope",
                                      "llama-f16", "llama-bf16"};
    static const char *const q[] = {"f32", "f16", "bf16", "int8", "int4"};
    static const kn_kvtype kv[] = {KN_KV_F16, KN_KV_I8, KN_KV_F32};
    const char *f = fam[pick(seed, 0, 6)];
    const char *quant = q[pick(seed, 0, 4)];
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse(quant, (uint32_t)(32u << pick(seed, 0, 2)),
                                       &o.req.policy, NULL), MC_OK);
    o.req.kv_type = kv[pick(seed, 0, 2)];
    o.req.target_bytes = 1ull << 32;
    o.req.max_batch = (uint32_t)pick(seed, 1, 4);
    o.req.max_seq = pick(seed, 2, 80);
    o.req.prefill_chunk = (uint32_t)pick(seed, o.req.max_batch, 40);
    o.req.threads = (int)pick(seed, 1, 1);
    char *model = tu_fmt("%s/%s", MC_FIXTURE_DIR, f);
    char *out = tu_fmt("%s/case.mca", dir);
    o.model = model;
    o.out = out;
    o.compress = (int)pick(seed, 0, 1);
    mc_error err;
    cmp_compile_report rep;
    assert_int_equal(cmp_compile(&o, &rep, &err), MC_OK);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_artifact(out, &m, &err), MC_OK);
    assert_true(m->has_plan);
    rt_session *s = NULL;
    if (rt_session_create(m, &m->plan.layout.limits, &m->plan.layout, &s, &err)) {
        char b[1600];
        fail_msg("session on the plan: %s", mc_error_format(&err, b, sizeof b));
    }
    const rt_layout *lay = rt_session_layout(s);
    const uint64_t planned = rep.plan.arena_bytes;
    assert_int_equal(lay->arena_bytes, planned);
    for (int i = 0; i < RT_BUF_COUNT_; i++) {
        assert_int_equal(lay->buf[i].offset, rep.plan.layout.buf[i].offset);
        assert_int_equal(lay->buf[i].bytes, rep.plan.layout.buf[i].bytes);
    }
    const uint32_t B = o.req.max_batch;
    const uint64_t T = o.req.max_seq;
    const uint32_t V = m->cfg.vocab_size;
    rt_gen_result res[16];
    size_t len[16] = {0};

    /* 1. the corner: every slot, prompt + generated = max_seq */
    for (uint32_t i = 0; i < B; i++)
        len[i] = (size_t)pick(seed, 1, T - 1);
    uint32_t max_new = (uint32_t)(T - len[0]);
    for (uint32_t i = 0; i < B; i++)
        len[i] = (size_t)(T - max_new);
    assert_int_equal(run(s, V, B, len, max_new, RT_TRUNC_NONE, seed, res, &err),
                     MC_OK);
    S->requests++;
    uint64_t hw = rt_session_arena_high_water(s);
    assert_true(hw <= planned);
    double slack = add_slack(planned, hw, &S->slack_sum, &S->slack_max);
    if (slack < S->slack_min)
        S->slack_min = slack;
    S->planned_sum += planned;
    S->used_sum += hw;
    /* Bytes really written at the corner: how full the plan was. */
    uint64_t touched = rt_session_arena_touched_bytes(s);
    assert_true(touched <= hw);
    add_slack(planned, touched, &S->touched_slack_sum, &S->touched_slack_max);
    /* Tightness of the lifetime packing: no layout can be smaller than the
     * bytes live in the busiest phase. */
    uint64_t lb = 0;
    for (int ph = RT_PH_INPUT; ph <= RT_PH_SAMPLE; ph++) {
        uint64_t live = 0;
        for (int i = 0; i < RT_BUF_COUNT_; i++) {
            const rt_buffer *b = &lay->buf[i];
            if (b->first == RT_PH_PERSIST ||
                (b->first <= (rt_phase)ph && (rt_phase)ph <= b->last))
                live += (b->bytes + 63) / 64 * 64;
        }
        lb = live > lb ? live : lb;
    }
    assert_true(lb <= planned);
    double pack = (double)(planned - lb) / (double)planned;
    S->pack_sum += pack;
    if (pack > S->pack_max)
        S->pack_max = pack;

    /* 2. a random admitted request */
    size_t n = (size_t)pick(seed, 1, B);
    uint32_t mn = (uint32_t)pick(seed, 0, T - 1);
    for (size_t i = 0; i < n; i++)
        len[i] = (size_t)pick(seed, 1, T - mn);
    assert_int_equal(run(s, V, n, len, mn, RT_TRUNC_NONE, seed, res, &err),
                     MC_OK);
    S->requests++;
    assert_true(rt_session_arena_high_water(s) <= planned);

    /* 3. over the plan: one sequence too many, one token too long */
    for (size_t i = 0; i <= B; i++)
        len[i] = 1;
    assert_int_equal(run(s, V, B + 1, len, 1, RT_TRUNC_NONE, seed, res, &err),
                     MC_ERR_PLAN);
    assert_non_null(strstr(err.message, "max_batch"));
    len[0] = (size_t)T;
    assert_int_equal(run(s, V, 1, len, 1, RT_TRUNC_NONE, seed, res, &err),
                     MC_ERR_PLAN);
    char want[64];
    snprintf(want, sizeof want, "max_seq %llu", (unsigned long long)T);
    assert_non_null(strstr(err.message, want));
    S->refused += 2;
    /* ...unless truncation is asked for */
    assert_int_equal(run(s, V, 1, len, 1, RT_TRUNC_LEFT, seed, res, &err),
                     MC_OK);
    assert_int_equal(res[0].prompt_used, T - 1);
    S->truncated++;
    assert_true(rt_session_arena_high_water(s) <= planned);

    rt_session_free(s);
    rt_model_free(m);
    S->cases++;
    free(model);
    free(out);
}

static void test_plan_random_requests_within_plan(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("planrand");
    stats S = {0};
    S.slack_min = 1.0;
    uint64_t seed = 20261130;
    for (int i = 0; i < NCASES; i++)
        one_case(&seed, dir, &S);
    printf("random plan cases: %zu (requests run %zu, refused %zu, "
           "truncated %zu)\n", S.cases, S.requests, S.refused, S.truncated);
    printf("corner slack (planned - high water) / planned: mean %.3f%%, "
           "min %.3f%%, max %.3f%%; planned %llu bytes, high water %llu "
           "bytes in total\n", 100 * S.slack_sum / (double)S.cases,
           100 * S.slack_min, 100 * S.slack_max,
           (unsigned long long)S.planned_sum, (unsigned long long)S.used_sum);
    printf("corner slack (planned - bytes written) / planned: mean %.2f%%, "
           "max %.2f%%\n", 100 * S.touched_slack_sum / (double)S.cases,
           100 * S.touched_slack_max);
    printf("lifetime packing: arena over the busiest phase's live bytes: "
           "mean %.3f%%, max %.3f%%\n", 100 * S.pack_sum / (double)S.cases,
           100 * S.pack_max);
    assert_true(S.cases >= 200);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_random_requests_within_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

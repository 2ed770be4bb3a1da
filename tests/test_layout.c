/* test_layout.c - the session arena plan (rt_layout.h): buffers whose
 * lifetimes overlap never share bytes, offsets are aligned, the plan is
 * deterministic, refusals name the limit, and the measured high-water mark
 * of a real session never passes arena_bytes over many random requests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_layout.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"

static fmt_model_config small_config(void)
{
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = FMT_ARCH_MISTRAL;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_layers = 3;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.vocab_size = 300;
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-5;
    c.rope.theta = 10000;
    c.rope.factor = 1;
    c.sliding_window = 32;
    return c;
}

static int overlap(const rt_buffer *a, const rt_buffer *b)
{
    int life = a->first == RT_PH_PERSIST || b->first == RT_PH_PERSIST ||
               (a->first <= b->last && b->first <= a->last);
    int bytes = a->offset < b->offset + b->bytes &&
                b->offset < a->offset + a->bytes;
    return life && bytes;
}

static void check_layout(const rt_layout *l)
{
    for (int i = 0; i < RT_BUF_COUNT_; i++) {
        const rt_buffer *a = &l->buf[i];
        assert_int_equal(a->offset % RT_LAYOUT_ALIGN, 0);
        assert_true(a->offset + a->bytes <= l->arena_bytes);
        assert_true(a->first <= a->last);
        for (int j = i + 1; j < RT_BUF_COUNT_; j++)
            if (a->bytes && l->buf[j].bytes && overlap(a, &l->buf[j]))
                fail_msg("buffers %s and %s overlap in bytes and lifetime",
                         rt_layout_buf_name((rt_buf_id)i),
                         rt_layout_buf_name((rt_buf_id)j));
    }
    assert_int_equal(l->arena_bytes % RT_LAYOUT_ALIGN, 0);
    assert_int_equal(l->kv_bytes, l->buf[RT_BUF_KV].bytes);
    assert_int_equal(l->activation_bytes, l->arena_bytes - l->kv_bytes);
}

static void test_layout_offsets_disjoint_for_overlapping_lifetimes(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    const uint32_t batches[] = {1, 3, 8};
    const uint64_t seqs[] = {1, 17, 100, 4096};
    for (size_t b = 0; b < 3; b++)
        for (size_t q = 0; q < 4; q++)
            for (int kv = 0; kv < 3; kv++) {
                rt_limits L = {.max_batch = batches[b], .max_seq = seqs[q],
                               .prefill_chunk = batches[b] * 5,
                               .kv_type = (kn_kvtype)kv, .threads = 2};
                rt_layout l;
                mc_error e;
                assert_int_equal(rt_layout_build(&c, &L, &l, &e), MC_OK);
                check_layout(&l);
                /* KV: every layer x slot region fits inside RT_BUF_KV */
                for (uint32_t layer = 0; layer < c.num_layers; layer++) {
                    uint64_t cap = rt_layout_kv_cap(&c, &L, layer);
                    uint64_t end = rt_layout_kv_offset(&l, &c, layer,
                                                       L.max_batch - 1) +
                                   cap * l.kv_slot_bytes;
                    assert_true(end <= l.buf[RT_BUF_KV].offset + l.kv_bytes);
                }
            }
}

static void test_layout_reuses_step_buffers_across_phases(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_limits L = {.max_batch = 4, .max_seq = 256, .prefill_chunk = 64,
                   .threads = 2};
    rt_layout l;
    assert_int_equal(rt_layout_build(&c, &L, &l, NULL), MC_OK);
    uint64_t sum = 0;
    for (int i = 0; i < RT_BUF_COUNT_; i++)
        sum += (l.buf[i].bytes + 63) & ~63ull;
    /* the head's buffers sit on the layers' scratch: smaller than a sum */
    assert_true(l.arena_bytes < sum);
}

static void test_layout_is_deterministic(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_limits L = {.max_batch = 5, .max_seq = 333, .prefill_chunk = 40,
                   .kv_type = KN_KV_F16, .threads = 2};
    rt_layout a, b;
    assert_int_equal(rt_layout_build(&c, &L, &a, NULL), MC_OK);
    assert_int_equal(rt_layout_build(&c, &L, &b, NULL), MC_OK);
    assert_memory_equal(&a, &b, sizeof a);
}

static void test_layout_sliding_window_rings_are_bounded(void **st)
{
    (void)st;
    fmt_model_config c = small_config(); /* window 32, every layer */
    rt_limits L = {.max_batch = 1, .max_seq = 4096, .prefill_chunk = 16,
                   .threads = 1};
    assert_int_equal(rt_layout_kv_cap(&c, &L, 0), 48);
    L.max_seq = 20;
    assert_int_equal(rt_layout_kv_cap(&c, &L, 0), 20);
    c.sliding_window = 0;
    L.max_seq = 4096;
    assert_int_equal(rt_layout_kv_cap(&c, &L, 2), 4096);
    assert_int_equal(rt_layout_kv_bytes_per_token(&c, KN_KV_F32),
                     3ull * 2 * 2 * 8 * 4);
    assert_int_equal(rt_layout_kv_bytes_total(&c, &L),
                     3ull * 4096 * 2 * 2 * 8 * 4);
}

static void test_layout_refuses_bad_limits_naming_them(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_layout l;
    mc_error e;
    rt_limits L = {.max_batch = 8, .max_seq = 64, .prefill_chunk = 4};
    assert_int_equal(rt_layout_build(&c, &L, &l, &e), MC_ERR_PLAN);
    assert_string_equal(e.field, "prefill_chunk");
    L = (rt_limits){.max_batch = 0, .max_seq = 64, .prefill_chunk = 4};
    assert_int_equal(rt_layout_build(&c, &L, &l, &e), MC_ERR_PLAN);
    assert_string_equal(e.field, "max_batch");
    c.sliding_window = 0; /* a ring would bound the cache */
    L = (rt_limits){.max_batch = 1, .max_seq = UINT64_MAX / 2,
                    .prefill_chunk = 4};
    assert_int_equal(rt_layout_build(&c, &L, &l, &e), MC_ERR_OVERFLOW);
}

/* hb2 lives only in the block's MLP part: it shares bytes with k, v, att
 * and the attention scratch, which are dead by then, so the block's
 * buffers take less than their sum. */
static void test_layout_mlp_buffer_shares_bytes_with_attention(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    c.sliding_window = 0;
    rt_limits L = {.max_batch = 4, .max_seq = 256, .prefill_chunk = 64,
                   .threads = 2};
    rt_layout l;
    assert_int_equal(rt_layout_build(&c, &L, &l, NULL), MC_OK);
    check_layout(&l);
    const rt_buffer *h2 = &l.buf[RT_BUF_HB2];
    assert_int_equal(h2->first, RT_PH_L_MLP);
    assert_int_equal(h2->last, RT_PH_L_MLP);
    int shares = 0;
    const rt_buf_id dead[] = {RT_BUF_K, RT_BUF_V, RT_BUF_ATT,
                              RT_BUF_ATTN_SCRATCH};
    for (size_t i = 0; i < 4; i++) {
        const rt_buffer *o = &l.buf[dead[i]];
        assert_true(o->last < RT_PH_L_MLP);
        shares |= o->offset < h2->offset + h2->bytes &&
                  h2->offset < o->offset + o->bytes;
    }
    assert_true(shares);
    /* the transient part is the busiest phase's live bytes, no more */
    uint64_t busiest = 0;
    for (int ph = RT_PH_INPUT; ph <= RT_PH_SAMPLE; ph++) {
        uint64_t live = 0;
        for (int i = 0; i < RT_BUF_COUNT_; i++)
            if (l.buf[i].first != RT_PH_PERSIST &&
                l.buf[i].first <= (rt_phase)ph && (rt_phase)ph <= l.buf[i].last)
                live += (l.buf[i].bytes + 63) & ~63ull;
        busiest = live > busiest ? live : busiest;
    }
    uint64_t persist = 0;
    for (int i = 0; i < RT_BUF_COUNT_; i++)
        if (l.buf[i].first == RT_PH_PERSIST)
            persist += (l.buf[i].bytes + 63) & ~63ull;
    assert_int_equal(l.arena_bytes, persist + busiest);
}

/* A chunk larger than max_batch x max_seq rows would plan rows no step can
 * fill: it is resolved to that bound, and the plan says so. */
static void test_layout_chunk_never_exceeds_batch_times_context(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_limits L = {.max_batch = 2, .max_seq = 16, .prefill_chunk = 256,
                   .threads = 1};
    rt_layout big, fit;
    assert_int_equal(rt_layout_build(&c, &L, &big, NULL), MC_OK);
    assert_int_equal(big.limits.prefill_chunk, 32);
    L.prefill_chunk = 32;
    assert_int_equal(rt_layout_build(&c, &L, &fit, NULL), MC_OK);
    assert_memory_equal(&big, &fit, sizeof big);
    L.prefill_chunk = 31; /* below the bound: kept */
    assert_int_equal(rt_layout_build(&c, &L, &fit, NULL), MC_OK);
    assert_int_equal(fit.limits.prefill_chunk, 31);
    assert_int_equal(fit.buf[RT_BUF_X].bytes, 31ull * 64 * 4);
}

/* A real session: random requests never write past arena_bytes, and a
 * request that fills the plan reaches close to it. */
static void test_layout_high_water_never_exceeds_arena(void **st)
{
    (void)st;
    char *dir = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, &m, &e), MC_OK);
    free(dir);
    rt_limits L = {.max_batch = 3, .max_seq = 48, .prefill_chunk = 7,
                   .threads = 2};
    rt_session *s;
    assert_int_equal(rt_session_create(m, &L, NULL, &s, &e), MC_OK);
    const rt_layout *l = rt_session_layout(s);
    /* create writes only the RoPE table */
    assert_true(rt_session_arena_high_water(s) <=
                l->buf[RT_BUF_ROPE].offset + l->buf[RT_BUF_ROPE].bytes);
    uint64_t x = 99;
    int32_t ids[3][48], out[3][48];
    for (int iter = 0; iter < 40; iter++) {
        size_t n = 1 + (size_t)(x % 3);
        rt_prompt pr[3];
        rt_gen_result res[3];
        uint32_t new_tok = (uint32_t)(x % 9);
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t len = 1 + (size_t)((x >> 33) % (48 - new_tok));
            for (size_t j = 0; j < len; j++)
                ids[i][j] = (int32_t)((x >> (j % 40)) % 256);
            pr[i] = (rt_prompt){ids[i], len};
            res[i] = (rt_gen_result){.ids = out[i]};
        }
        rt_gen_params gp = {.max_new_tokens = new_tok,
                            .sampler = {.temperature = 0.7f}, .seed = x};
        assert_int_equal(rt_session_generate(s, pr, n, &gp, res, &e), MC_OK);
        assert_true(rt_session_arena_high_water(s) <= l->arena_bytes);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    }
    uint64_t hw = rt_session_arena_high_water(s);
    printf("arena %llu bytes, measured high water %llu\n",
           (unsigned long long)l->arena_bytes, (unsigned long long)hw);
    assert_true(hw > 0 && hw <= l->arena_bytes);
    rt_session_free(s);
    rt_model_free(m);
}

static void test_session_refuses_requests_beyond_the_plan(void **st)
{
    (void)st;
    char *dir = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, &m, &e), MC_OK);
    free(dir);
    rt_limits L = {.max_batch = 2, .max_seq = 16, .prefill_chunk = 4,
                   .threads = 1};
    rt_session *s;
    assert_int_equal(rt_session_create(m, &L, NULL, &s, &e), MC_OK);
    int32_t ids[20] = {1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                       19, 20, 21, 22, 23};
    int32_t out[3][8];
    rt_prompt pr[3] = {{ids, 4}, {ids, 4}, {ids, 4}};
    rt_gen_result res[3] = {{.ids = out[0]}, {.ids = out[1]}, {.ids = out[2]}};
    rt_gen_params gp = {.max_new_tokens = 4};
    assert_int_equal(rt_session_generate(s, pr, 3, &gp, res, &e), MC_ERR_PLAN);
    assert_non_null(strstr(e.message, "max_batch 2"));
    pr[0].n = 14; /* 14 + 4 > 16 */
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, res, &e), MC_ERR_PLAN);
    assert_non_null(strstr(e.message, "max_seq 16"));
    gp.truncate = RT_TRUNC_LEFT;
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, res, &e), MC_OK);
    assert_int_equal(res[0].prompt_used, 12);
    pr[0] = (rt_prompt){ids, 0};
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, res, &e),
                     MC_ERR_INVALID_ARG);
    int32_t bad = 256;
    pr[0] = (rt_prompt){&bad, 1};
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, res, &e),
                     MC_ERR_INVALID_ARG);
    /* a stored plan for these limits is used; one for others refused */
    rt_layout same;
    assert_int_equal(rt_layout_build(&m->cfg, &L, &same, NULL), MC_OK);
    rt_session *s1 = NULL;
    assert_int_equal(rt_session_create(m, &L, &same, &s1, &e), MC_OK);
    assert_int_equal(rt_session_layout(s1)->arena_bytes, same.arena_bytes);
    rt_session_free(s1);
    same.buf[RT_BUF_LOGITS].offset += 64; /* tampered */
    assert_int_equal(rt_session_create(m, &L, &same, &s1, &e), MC_ERR_PLAN);
    rt_layout other;
    rt_limits L2 = L;
    L2.max_seq = 32;
    assert_int_equal(rt_layout_build(&m->cfg, &L2, &other, NULL), MC_OK);
    rt_session *s2 = NULL;
    assert_int_equal(rt_session_create(m, &L, &other, &s2, &e), MC_ERR_PLAN);
    assert_null(s2);
    rt_session_free(s);
    rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_offsets_disjoint_for_overlapping_lifetimes),
        cmocka_unit_test(test_layout_reuses_step_buffers_across_phases),
        cmocka_unit_test(test_layout_is_deterministic),
        cmocka_unit_test(test_layout_mlp_buffer_shares_bytes_with_attention),
        cmocka_unit_test(test_layout_chunk_never_exceeds_batch_times_context),
        cmocka_unit_test(test_layout_sliding_window_rings_are_bounded),
        cmocka_unit_test(test_layout_refuses_bad_limits_naming_them),
        cmocka_unit_test(test_layout_high_water_never_exceeds_arena),
        cmocka_unit_test(test_session_refuses_requests_beyond_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_stopstr.c - stop strings matched token by token (rt_stopstr.h):
 * on random token sequences (letters, spaces, byte-fallback bytes, special
 * tokens) the matcher reports a stop string exactly at the first token
 * whose whole decoded text (rt_tokenizer_decode) contains it, including
 * matches across tokens and inside a UTF-8 character split over byte
 * tokens; the first token's dropped space; rt_stop_find's earliest match;
 * mcrt_gen_params.on_token (the hook stop strings use) ends the sequence
 * it names, with the request's index, in waves and in submitted
 * requests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "mcrt.h"
#include "rt_stopstr.h"
#include "testutil.h"
#include "tok_fixture.h"

static rt_tokenizer *g_tok;
static rt_stop_pieces *g_pieces;

static int setup(void **st)
{
    (void)st;
    char *json = tu_spm_tokenizer_json(1);
    assert_int_equal(rt_tokenizer_load_memory(json, strlen(json), "t", &g_tok,
                                              NULL),
                     MC_OK);
    free(json);
    assert_int_equal(rt_stop_pieces_build(g_tok, &g_pieces, NULL), MC_OK);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    rt_stop_pieces_free(g_pieces);
    rt_tokenizer_free(g_tok);
    return 0;
}

/* The text ids[0..n) decode to with tok (specials skipped), in buf[cap]. */
static size_t decode_with(const rt_tokenizer *tok, const int32_t *ids,
                          size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    assert_int_equal(rt_tokenizer_decode(tok, ids, n, 1, buf, cap, &len),
                     MC_OK);
    return len;
}

/* Push ids[0..n) into a matcher (over pieces p) of the one stop string s;
 * returns the index of the token that reported a match, or n. */
static size_t first_hit_with(const rt_stop_pieces *p, const int32_t *ids,
                             size_t n, const char *s, size_t slen)
{
    const char *strs[1] = {s};
    size_t lens[1] = {slen};
    char *win = malloc(rt_stop_match_bytes(p, lens, 1));
    rt_stop_match m;
    rt_stop_match_init(&m, p, strs, lens, 1, win);
    size_t k = 0;
    while (k < n && !rt_stop_match_push(&m, ids[k]))
        k++;
    free(win);
    return k;
}

static size_t first_hit(const int32_t *ids, size_t n, const char *s,
                        size_t slen)
{
    return first_hit_with(g_pieces, ids, n, s, slen);
}

/* For random sequences ids[0..n) from pick(): a stop string cut from the
 * whole decode is reported at the first token whose prefix decode holds
 * it.  Returns how many sequences were checked. */
static size_t check_agreement(const rt_tokenizer *tok,
                              const rt_stop_pieces *p, tu_rng *g,
                              int32_t (*pick)(tu_rng *g), int rounds)
{
    char full[4096], pre[4096];
    size_t found = 0;
    for (int round = 0; round < rounds; round++) {
        int32_t ids[40];
        size_t n = 2 + tu_rng_u32(g) % 38;
        for (size_t i = 0; i < n; i++)
            ids[i] = pick(g);
        size_t len = decode_with(tok, ids, n, full, sizeof full);
        if (len < 2)
            continue;
        /* A stop string: a piece of the text, 1..6 bytes, anywhere. */
        size_t at = tu_rng_u32(g) % len;
        size_t sl = 1 + tu_rng_u32(g) % 6;
        if (sl > len - at)
            sl = len - at;
        char s[8];
        memcpy(s, full + at, sl);
        /* The first k whose decode(ids[0..k]) holds s. */
        size_t want = n;
        for (size_t k = 1; k <= n && want == n; k++) {
            size_t pl = decode_with(tok, ids, k, pre, sizeof pre);
            for (size_t q = 0; q + sl <= pl; q++)
                if (!memcmp(pre + q, s, sl)) {
                    want = k - 1;
                    break;
                }
        }
        assert_true(want < n); /* it is in the whole text */
        size_t got = first_hit_with(p, ids, n, s, sl);
        if (got != want)
            fail_msg("round %d: stop \"%.*s\" hit at token %zu, the decode "
                     "at %zu", round, (int)sl, s, got, want);
        found++;
    }
    return found;
}

/* Letters, spaces, "é" as two byte tokens (C3 A9), <s> and </s>. */
static int32_t pick_fixture(tu_rng *g)
{
    static int pending; /* the A9 after a C3 */
    if (pending) {
        pending = 0;
        return 3 + 0xA9;
    }
    uint32_t r = tu_rng_u32(g) % 10;
    if (r == 7 || r == 8)
        pending = 1;
    return r < 5   ? (int32_t)(TU_SPM_A + tu_rng_u32(g) % 4)
           : r < 7 ? TU_SPM_SPACE
           : r < 9 ? (int32_t)(3 + 0xC3)
                   : (int32_t)(1 + tu_rng_u32(g) % 2);
}

/* Any token of the Mistral vocabulary, often a byte token (<0x00>.. are
 * ids 3..258) or a special one. */
static int32_t pick_mistral(tu_rng *g)
{
    uint32_t r = tu_rng_u32(g) % 8;
    return r == 0   ? (int32_t)(3 + tu_rng_u32(g) % 256)
           : r == 1 ? (int32_t)(tu_rng_u32(g) % 3)
                    : (int32_t)(tu_rng_u32(g) % 32000);
}

static void test_stop_match_agrees_with_the_whole_decode(void **st)
{
    (void)st;
    tu_rng g = {0x570Bull};
    assert_true(check_agreement(g_tok, g_pieces, &g, pick_fixture, 300) >
                200);
}

/* The same on the real Mistral tokenizer (SentencePiece BPE, byte
 * fallback, a Sequence decoder): skipped without ../shared. */
static void test_stop_match_agrees_with_the_mistral_decode(void **st)
{
    (void)st;
    char *path = tu_fmt("%s/tokenizers/mistral-7b-instruct-v0.1/"
                        "tokenizer.json", MC_SHARED_DIR);
    if (!tu_exists(path)) {
        free(path);
        TU_SKIP_IF(1, "../shared/tokenizers/mistral-7b-instruct-v0.1 absent");
    }
    rt_tokenizer *tok = NULL;
    assert_int_equal(rt_tokenizer_load(path, &tok, NULL), MC_OK);
    free(path);
    rt_stop_pieces *p = NULL;
    assert_int_equal(rt_stop_pieces_build(tok, &p, NULL), MC_OK);
    tu_rng g = {0x3157ull};
    assert_true(check_agreement(tok, p, &g, pick_mistral, 300) > 200);
    rt_stop_pieces_free(p);
    rt_tokenizer_free(tok);
}

static void test_stop_match_spans_tokens_and_drops_the_first_space(
    void **st)
{
    (void)st;
    /* <s> "▁ab" "▁c": "ab c" (the first space dropped, as decode does). */
    const int32_t ids[] = {1, TU_SPM_SPACE, TU_SPM_A, TU_SPM_A + 1,
                           TU_SPM_SPACE, TU_SPM_A + 2};
    assert_int_equal(first_hit(ids, 6, "b c", 3), 5);
    assert_int_equal(first_hit(ids, 6, " a", 2), 6); /* never: dropped */
    assert_int_equal(first_hit(ids, 6, "ab", 2), 3);
    /* Stop strings longer than any token, across four tokens. */
    const int32_t more[] = {TU_SPM_A, TU_SPM_A + 1, TU_SPM_A + 2,
                            TU_SPM_A + 3, TU_SPM_A + 4};
    assert_int_equal(first_hit(more, 5, "bcde", 4), 4);
    assert_int_equal(first_hit(more, 5, "abcdef", 6), 5);
}

static void test_stop_find_gives_the_earliest_match(void **st)
{
    (void)st;
    const char *s[3] = {"cd", "b", "zz"};
    const size_t l[3] = {2, 1, 2};
    assert_int_equal(rt_stop_find("abcdb", 5, s, l, 3), 1);
    assert_int_equal(rt_stop_find("xcdb", 4, s, l, 3), 1);
    assert_int_equal(rt_stop_find("xyz", 3, s, l, 3), 3);
    assert_int_equal(rt_stop_find("", 0, s, l, 3), 0);
    mc_error e;
    mc_error_clear(&e);
    rt_stop_pieces *p = NULL;
    assert_int_equal(rt_stop_pieces_build(NULL, &p, &e), MC_ERR_INVALID_ARG);
    assert_null(p);
    assert_non_null(strstr(e.message, "need a tokenizer"));
}

/* Stops sequence `seq` once it has (seq % 100) + 1 tokens. */
static int stop_after_index(void *ctx, uint64_t seq, const int32_t *ids,
                            size_t n)
{
    (void)ids;
    unsigned *calls = ctx;
    (*calls)++;
    return n >= (size_t)(seq % 100) + 1;
}

static void test_mcrt_on_token_ends_the_sequence_it_names(void **st)
{
    (void)st;
    char *dir = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    mcrt_options o;
    mcrt_options_default(&o);
    o.max_batch = 2;
    o.max_seq = 32;
    o.threads = 2;
    mcrt *h = NULL;
    assert_int_equal(mcrt_open(dir, &o, &h), 0);
    free(dir);
    enum { N = 5, M = 8 };
    int32_t pr[N][3], ref[N][M], got[N][M];
    const int32_t *pp[N];
    size_t lens[N];
    mcrt_result r0[N], r1[N];
    for (size_t i = 0; i < N; i++) {
        for (size_t k = 0; k < 3; k++)
            pr[i][k] = (int32_t)(1 + 17 * i + 5 * k);
        pp[i] = pr[i];
        lens[i] = 3;
        r0[i] = (mcrt_result){.ids = ref[i]};
        r1[i] = (mcrt_result){.ids = got[i]};
    }
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.max_new_tokens = M;
    gp.use_model_eos = 0;
    assert_int_equal(mcrt_generate(h, pp, lens, N, &gp, r0), 0);
    unsigned calls = 0;
    gp.on_token = stop_after_index;
    gp.on_token_ctx = &calls;
    /* Three waves of max_batch 2: the hook sees indices 0..4. */
    assert_int_equal(mcrt_generate(h, pp, lens, N, &gp, r1), 0);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(r1[i].n_ids, i + 1);
        assert_int_equal(r1[i].stop_reason, 3);
        assert_memory_equal(got[i], ref[i], (i + 1) * sizeof(int32_t));
    }
    assert_int_equal(calls, 1 + 2 + 3 + 4 + 5);
    /* Submitted requests: the hook gets their seq_index (101: 2 tokens). */
    r1[0] = (mcrt_result){.ids = got[0]};
    assert_int_equal(mcrt_submit_generate(h, pp[1], 3, &gp, 101, &r1[0],
                                          NULL),
                     0);
    uint32_t done[2];
    size_t nd = 0, steps = 0;
    while (nd == 0 && steps++ < 20)
        assert_int_equal(mcrt_step(h, done, &nd), 0);
    assert_int_equal(nd, 1);
    assert_int_equal(r1[0].n_ids, 2);
    assert_int_equal(r1[0].stop_reason, 3);
    mcrt_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_match_agrees_with_the_whole_decode),
        cmocka_unit_test(test_stop_match_agrees_with_the_mistral_decode),
        cmocka_unit_test(
            test_stop_match_spans_tokens_and_drops_the_first_space),
        cmocka_unit_test(test_stop_find_gives_the_earliest_match),
        cmocka_unit_test(test_mcrt_on_token_ends_the_sequence_it_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_calib_heldout.c - the held-out summary carried through the
 * calibration block by block (cmp_calib_heldout.c) is, bit for bit, the
 * whole-model evaluation (cmp_eval_models) of the calibrated result on the
 * same sequences (rotated or not, int8 and int4, the int8 embedding of an
 * unrotated tied model, with and without a pool and a spill file, held-out
 * sequences of ragged lengths, one of 1 token, which scores nothing), and
 * the plan's held-out estimate counts what ran; the
 * held-out work changes no weight; --heldout 0 gives no summary; a
 * held-out sequence past the context is refused before calibrating; a
 * failed allocation anywhere is reported and leaks nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_calib.h"
#include "cmp_eval.h"
#include "mc_alloc.h"
#include "rt_model.h"
#include "testutil.h"

/* Calibration sequences: 5 of 24 tokens; held out: these lengths (64
 * scored positions). */
#define NCAL 5
#define CAL_T 24
static const size_t HELD_LEN[] = {1, 17, 2, 40, 9};
#define NHELD (sizeof HELD_LEN / sizeof HELD_LEN[0])
#define NSEQ (NCAL + NHELD)

typedef struct held_case {
    const char *fixture;
    kn_wformat fmt;
    uint32_t group;
    int rotate;
    kn_wformat lm_head; /* cmp_calib_opts.lm_head_fmt */
    int threads; /* > 1: a pool */
    int spill;
} held_case;

/* off [NSEQ + 1] over one token stream: NCAL x CAL_T, then HELD_LEN. */
static void ragged_offsets(size_t off[NSEQ + 1])
{
    off[0] = 0;
    for (size_t i = 0; i < NSEQ; i++)
        off[i + 1] = off[i] + (i < NCAL ? CAL_T : HELD_LEN[i - NCAL]);
}

static cmp_calib_result *calibrate(const rt_model *m, const int32_t *tok,
                                   const size_t *off, size_t nseq,
                                   const cmp_calib_opts *o)
{
    cmp_calib_result *r = NULL;
    mc_error e;
    if (cmp_calib_run(m, tok, off, nseq, o, &r, &e) != MC_OK) {
        char buf[2048];
        fail_msg("calib: %s", mc_error_format(&e, buf, sizeof buf));
    }
    return r;
}

/* Every linear of a and b holds the same codes and parameters. */
static void assert_same_weights(const cmp_calib_result *a,
                                const cmp_calib_result *b)
{
    for (size_t i = 0; i < (size_t)a->layers * CMP_LIN_COUNT; i++) {
        const cmp_qbuf *x = &a->t[i].q, *y = &b->t[i].q;
        assert_int_equal(a->t[i].fmt, b->t[i].fmt);
        assert_memory_equal(x->data, y->data,
                            kn_wformat_data_bytes(x->fmt, x->rows, x->cols));
        assert_memory_equal(x->scales, y->scales,
                            kn_wformat_scale_bytes(x->fmt, x->rows, x->cols, x->group));
    }
}

static void check_case(const held_case *hc)
{
    char *path;
    int32_t *tok;
    size_t *off0;
    size_t off[NSEQ + 1];
    ragged_offsets(off);
    rt_model *m = tu_fixture_open(hc->fixture, 1, off[NSEQ], &path, &tok, &off0);
    char *dir = hc->spill ? tu_mkdtemp("heldout") : NULL;
    kn_pool *pool = hc->threads > 1 ? tu_pool_warm(hc->threads) : NULL;
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = hc->fmt;
    o.group = hc->group;
    o.method = CMP_QM_GPTQ;
    o.rotate = hc->rotate;
    o.lm_head_fmt = hc->lm_head;
    o.pool = pool;
    o.spill_dir = dir;
    o.heldout = NHELD;
    cmp_calib_result *r = calibrate(m, tok, off, NSEQ, &o);
    assert_true(r->has_heldout);
    assert_int_equal(r->rotated, hc->rotate);

    /* the independent evaluation: the whole result's view, every layer of
     * both models sequence by sequence */
    rt_model view;
    cmp_eval_report want;
    mc_error e;
    assert_int_equal(cmp_calib_view(m, r, &view, &e), MC_OK);
    assert_int_equal(cmp_eval_models(m, &view, tok, off + NCAL, NHELD, pool,
                                     NULL, NULL, &want, &e), MC_OK);
    cmp_calib_view_free(&view);
    const cmp_eval_report *got = &r->heldout;
    print_message("%s %s g%u rot %d lm %s threads %d spill %d: KLD %.9g "
                  "(whole model %.9g) p99 %.6g top-1 %.4f ppl %.5f/%.5f, %llu "
                  "positions\n", hc->fixture, hc->fmt == KN_W_Q8 ? "q8" : "q4",
                  hc->group, hc->rotate, kn_wformat_name(hc->lm_head), hc->threads, hc->spill,
                  got->kld_mean, want.kld_mean, got->kld_p99, got->top1,
                  got->ppl_ref, got->ppl, (unsigned long long)got->tokens);
    assert_int_equal(got->tokens, 16 + 1 + 39 + 8);
    assert_true(got->kld_mean > 0.0);
    assert_true(got->kld_mean == want.kld_mean);
    assert_true(got->kld_p99 == want.kld_p99);
    assert_true(got->top1 == want.top1);
    assert_true(got->ppl_ref == want.ppl_ref);
    assert_true(got->ppl == want.ppl);
    assert_int_equal(got->tokens, want.tokens);

    /* the plan's held-out estimate counts what ran: both models over each
     * scored sequence (attention over its own length) and both heads */
    const fmt_model_config *c = &m->cfg;
    double H = c->hidden_size, F = c->intermediate_size;
    double Q = (double)c->num_heads * c->head_dim;
    double KV = (double)c->num_kv_heads * c->head_dim, madds = 0.0;
    for (size_t i = 0; i < NHELD; i++) {
        double T = (double)HELD_LEN[i];
        double block = (Q + 2 * KV) * H + T * Q + H * Q + 3 * F * H;
        if (HELD_LEN[i] >= 2)
            madds += 2 * T * (c->num_layers * block + (double)c->vocab_size * H);
    }
    assert_true(fabs(r->plan.madds[CMP_PH_ENDS] - madds) <= 1e-9 * madds);
    assert_int_equal(r->plan.heldout_tokens, 69);

    /* no summary, the same weights: calibrating on the same NCAL
     * sequences without held-out ones */
    o.heldout = 0;
    cmp_calib_result *r0 = calibrate(m, tok, off, NCAL, &o);
    assert_false(r0->has_heldout);
    assert_int_equal(r0->heldout.tokens, 0);
    assert_same_weights(r, r0);
    cmp_calib_result_free(r0);
    cmp_calib_result_free(r);
    kn_pool_free(pool);
    if (dir) {
        tu_rmtree(dir);
        free(dir);
    }
    tu_fixture_close(m, path, tok, off0);
}

static void test_heldout_streamed_equals_whole_model_unrotated(void **state)
{
    (void)state;
    static const held_case cases[] = {
        {"llama", KN_W_Q8, 0, 0, KN_W_F32, 1, 0},
        {"mistral", KN_W_Q4, 64, 0, KN_W_F32, 2, 0}, /* sliding window */
        /* untied: the output layer quantized, the embedding float */
        {"llama", KN_W_Q4, 32, 0, KN_W_Q8, 2, 0},
        {"mistral", KN_W_Q4S, 64, 0, KN_W_Q4S, 1, 1},
        /* tied, the output layer quantized: the embedding rows through
         * its format (int4: per group of the row) */
        {"qwen2", KN_W_Q8, 0, 0, KN_W_Q8, 2, 1},
        {"qwen2", KN_W_Q4, 32, 0, KN_W_Q8, 1, 0},
        {"qwen2", KN_W_Q4S, 32, 0, KN_W_Q4S, 2, 0},
        {"qwen2", KN_W_Q4, 64, 0, KN_W_Q4, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

static void test_heldout_streamed_equals_whole_model_rotated(void **state)
{
    (void)state;
    static const held_case cases[] = {
        {"llama", KN_W_Q4, 32, 1, KN_W_Q8, 3, 1},
        {"llama", KN_W_Q8, 0, 1, KN_W_F32, 1, 0},
        /* tied, untied by the rotation */
        {"qwen2", KN_W_Q8, 0, 1, KN_W_Q8, 2, 0},
        {"qwen2", KN_W_Q4S, 32, 1, KN_W_Q4S, 1, 1},
        {"llama-bias", KN_W_Q4, 32, 1, KN_W_Q8, 1, 0},
        {"llama-bias", KN_W_Q4, 64, 1, KN_W_Q4, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
}

/* A held-out sequence longer than the context is refused before any
 * layer is calibrated (the whole-model evaluation refused it after). */
static void test_heldout_past_context_refused_first(void **state)
{
    (void)state;
    char *path;
    int32_t *tok;
    size_t *off0;
    rt_model *m = tu_fixture_open("llama", 1, 400, &path, &tok, &off0);
    size_t off[4] = {0, 8, 16, 400}; /* the held-out one: 384 tokens */
    assert_true(m->cfg.max_position_embeddings < 384);
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q8;
    o.method = CMP_QM_RTN;
    o.heldout = 1;
    cmp_calib_result *r = NULL;
    mc_error e;
    assert_int_equal(cmp_calib_run(m, tok, off, 3, &o, &r, &e), MC_ERR_INVALID_ARG);
    assert_null(r);
    assert_string_equal(e.field, "tokens");
    assert_non_null(strstr(e.message, "384 tokens"));
    tu_fixture_close(m, path, tok, off0);
}

/* Every allocation of a small calibration with held-out sequences fails
 * in turn (the held-out states, their forward context, the int8
 * embedding row, the logits, the KLD list among them): the run reports
 * the failure and leaves nothing behind (ASan's leak check). */
static void test_heldout_survives_every_failed_allocation(void **state)
{
    (void)state;
    static const char *const fixtures[2] = {"qwen2", "llama"};
    for (int k = 0; k < 2; k++) {
        char *path;
        int32_t *tok;
        size_t *off0;
        rt_model *m = tu_fixture_open(fixtures[k], 1, 40, &path, &tok, &off0);
        size_t off[6] = {0, 8, 16, 24, 25, 31}; /* held out: 1 and 6 tokens */
        cmp_calib_opts o;
        memset(&o, 0, sizeof o);
        o.fmt = KN_W_Q8;
        o.method = CMP_QM_RTN;
        o.heldout = 2;
        o.lm_head_fmt = KN_W_Q8;
        o.rotate = k; /* qwen2 unrotated: the int8 embedding rows */
        cmp_calib_result *r = NULL;
        mc_alloc_fail_after(-1);
        mc_alloc_reset_count();
        assert_int_equal(cmp_calib_run(m, tok, off, 5, &o, &r, NULL), MC_OK);
        uint64_t count = mc_alloc_count();
        assert_true(r->has_heldout && r->heldout.tokens == 5);
        cmp_calib_result_free(r);
        for (uint64_t i = 0; i < count; i++) {
            mc_alloc_fail_after((long)i);
            r = NULL;
            mc_status st = cmp_calib_run(m, tok, off, 5, &o, &r, NULL);
            int injected = mc_alloc_failure_injected();
            mc_alloc_fail_after(-1);
            if (injected && st == MC_OK)
                fail_msg("%s: allocation %llu of %llu failed but the run "
                         "returned OK", fixtures[k], (unsigned long long)i,
                         (unsigned long long)count);
            cmp_calib_result_free(r);
        }
        print_message("%s: %llu allocations, each failed once\n", fixtures[k],
                      (unsigned long long)count);
        tu_fixture_close(m, path, tok, off0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heldout_streamed_equals_whole_model_unrotated),
        cmocka_unit_test(test_heldout_streamed_equals_whole_model_rotated),
        cmocka_unit_test(test_heldout_past_context_refused_first),
        cmocka_unit_test(test_heldout_survives_every_failed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

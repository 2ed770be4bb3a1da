/* test_calib_budget.c - the calibration's time estimate and budget
 * (cmp_calib_plan_block_madds, cmp_calib_budget.h, mcompile --calib-time):
 * the forward is counted pass by pass as the calibration runs it; the
 * sequence subset keeps the held-out ones; the effort choice walks its
 * ladder deterministically at fixed rates and refuses a budget below the
 * cheapest effort, naming the estimate; the default cap in forward passes
 * (--calib-passes) cuts only the method moves, from nominal estimates,
 * and never refuses; end to end, a tight budget picks
 * a cheaper effort whose printed options reproduce the artifact's bytes
 * without the budget. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_calib.h"
#include "cmp_calib_budget.h"
#include "cmp_calib_internal.h"
#include "fmt_mapguard.h"
#include "kn_quant.h"
#include "mc_alloc.h"
#include "rt_model.h"
#include "testutil.h"

/* H 64, 4 heads of 16 (2 kv heads: not MHA), FFN 128, maxT 8:
 * prefix madds per token: q/k/v's input 0, o's (64 + 2 * 32) * 64 + 8 * 64
 * = 8704, gate/up's + 64 * 64 = 12800, down's + 2 * 128 * 64 = 29184,
 * the whole block + 64 * 128 = 37376. */
static fmt_model_config small_cfg(void)
{
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.num_layers = 1;
    return c;
}

static void test_block_madds_follow_the_passes(void **state)
{
    (void)state;
    fmt_model_config c = small_cfg();
    const double c1 = 8704, c2 = 12800, c3 = 29184, c4 = 37376;
    /* 1 stage, rotated: the full-precision pass moves the states (whole
     * block), the quantized one stops at down's input, then the
     * quantized final move (whole block) */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 1, 0, 0, 1, 0) == c4 + c3 + c4);
    /* 4 stages, best (pre-scales: stage 0's q-pass goes to down's input),
     * rotated, down's inputs stored (2 * q_dim <= ffn: the passes reuse,
     * cmp_calib_stage_span): stage 1's passes to o's input, stage 2's
     * from o to gate/up's, stage 3's from there (the f-pass moving the
     * states on), the final move down alone: one block each way */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 4, 0, 1, 1, 1) ==
                c3 + 2 * c1 + 2 * (c2 - c1) + (c4 - c2) + (c3 - c2) + (c4 - c3));
    assert_true(cmp_calib_plan_block_madds(&c, 8, 4, 0, 1, 1, 1) == c3 + 2 * c4);
    /* the pre-scaling's statistics from a quarter of the sequences: the
     * others' stage-0 q-pass stops at q/k/v's input (a norm) */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 4, 0, 0.25, 1, 1) ==
                0.25 * c3 + 2 * c4);
    /* the same not rotated: stage 2's f-pass runs on a copy, so stage 3's
     * begins at the input and the final move is a whole block */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 4, 0, 1, 0, 1) ==
                c3 + 2 * c1 + 2 * (c2 - c1) + c3 + (c3 - c2) + c4 + (c4 - c3));
    /* an FFN narrower than two attention outputs: no reuse, every pass
     * from the block's input */
    fmt_model_config n = c;
    n.intermediate_size = 100;
    const double n3 = c2 + 2.0 * 100 * 64, n4 = n3 + 64.0 * 100;
    assert_true(cmp_calib_plan_block_madds(&n, 8, 4, 0, 1, 1, 1) ==
                n3 + 2 * c1 + 2 * c2 + n4 + n3 + (n4 - n3));
    /* 4 stages, not rotated, nothing pre-scaled or stored: no pass moves
     * the states, both final moves are whole blocks */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 4, 0, 0, 0, 0) ==
                2 * c1 + 2 * c2 + 2 * c3 + 2 * c4);
    /* 2 stages: attention (to o's input both ways), then the MLP (the
     * f-pass moves the states, the q-pass to down's input) */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 2, 0, 0, 1, 0) ==
                2 * c1 + c4 + c3 + c4);
    /* every point lean: no full-precision pass at all */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 1, 0xFu, 0, 1, 0) == c3 + c4);
    /* fewer stages are cheaper (the budget's first steps rest on it) */
    assert_true(cmp_calib_plan_block_madds(&c, 8, 1, 0, 1, 1, 0) <
                cmp_calib_plan_block_madds(&c, 8, 2, 0, 1, 1, 0));
}

/* The quantized passes' linears on quantized weights (the bfloat16
 * products' share): each linear once under the default 4 stages (stage
 * k's q-pass runs the groups before it, the final move down), the whole
 * block's linears in the final move under 1 stage; the pre-scaling's
 * stage-0 pass runs none (nothing is quantized yet). */
static void test_qlin_madds(void **state)
{
    (void)state;
    fmt_model_config c = small_cfg();
    const double lin = 8192 + 4096 + 16384 + 8192; /* q/k/v, o, gate/up, down */
    assert_true(cmp_calib_plan_qlin_madds(&c, 4, 0, 1, 1, 1) == lin);
    assert_true(cmp_calib_plan_qlin_madds(&c, 4, 0, 0.25, 1, 1) == lin);
    assert_true(cmp_calib_plan_qlin_madds(&c, 1, 0, 0, 1, 0) == lin);
    /* never more than the forward's own multiply-adds */
    assert_true(cmp_calib_plan_qlin_madds(&c, 4, 0, 0, 0, 0) <
                cmp_calib_plan_block_madds(&c, 8, 4, 0, 0, 0, 0));
    assert_true(cmp_calib_plan_qlin_madds(&c, 2, 0, 0, 1, 0) <
                cmp_calib_plan_block_madds(&c, 8, 2, 0, 0, 1, 0));
}

static void test_prescale_stride(void **state)
{
    (void)state;
    /* about CMP_CALIB_PRESCALE_TOKENS tokens for the pre-scaling: every
     * sequence up to twice that, then every stride-th */
    assert_int_equal(cmp_calib_prescale_stride(0), 1);
    assert_int_equal(cmp_calib_prescale_stride(2 * CMP_CALIB_PRESCALE_TOKENS - 1), 1);
    assert_int_equal(cmp_calib_prescale_stride(2 * CMP_CALIB_PRESCALE_TOKENS), 2);
    assert_int_equal(cmp_calib_prescale_stride(32768), 4);
}

static void test_subset_keeps_the_heldout(void **state)
{
    (void)state;
    /* 4 sequences of lengths 2, 3, 1, 2; the last one held out */
    const int32_t tok[8] = {10, 11, 20, 21, 22, 30, 40, 41};
    const size_t off[5] = {0, 2, 5, 6, 8};
    int32_t *t2 = NULL;
    size_t *o2 = NULL;
    mc_error e;
    assert_int_equal(cmp_calib_subset(tok, off, 4, 3, 2, &t2, &o2, &e), MC_OK);
    const size_t want_off[4] = {0, 2, 5, 7};
    const int32_t want_tok[7] = {10, 11, 20, 21, 22, 40, 41};
    assert_memory_equal(o2, want_off, sizeof want_off);
    assert_memory_equal(t2, want_tok, sizeof want_tok);
    mc_free(t2);
    mc_free(o2);
    assert_int_equal(cmp_calib_subset(tok, off, 4, 3, 0, &t2, &o2, &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(cmp_calib_subset(tok, off, 4, 3, 4, NULL, &o2, &e),
                     MC_ERR_INVALID_ARG);
    assert_null(o2);
}

typedef struct ladder_case {
    rt_model *m;
    char *path;
    int32_t *tok;
    size_t *off;
    cmp_calib_opts o;
} ladder_case;

static void ladder_open(ladder_case *lc)
{
    memset(lc, 0, sizeof *lc);
    lc->m = tu_fixture_open("llama", 18, 40, &lc->path, &lc->tok, &lc->off);
    lc->o.fmt = KN_W_Q4;
    lc->o.group = 32;
    lc->o.method = CMP_QM_BEST;
    lc->o.rotate = 1;
    lc->o.heldout = 2;
    lc->o.awq_coarse = 1;
}

static void test_choice_walks_the_ladder(void **state)
{
    (void)state;
    ladder_case lc;
    ladder_open(&lc);
    const double rate = 1e6; /* slow: estimates of seconds to minutes */
    mc_error e;
    cmp_calib_effort most, got, prev;
    /* a budget above everything: the options as given */
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 0, 1e12,
                                             rate, &got, &most, &e), MC_OK);
    assert_int_equal(got.stages, 4);
    assert_int_equal(got.method, CMP_QM_BEST);
    assert_int_equal(got.seqs, 16);
    assert_true(got.estimate_s == most.estimate_s && most.estimate_s > 0.0);
    /* each budget just under the effort chosen steps down the ladder:
     * gptaq, gptaq with GPTQ's codes unrefined, with the full-precision
     * statistics on the first 3, 2, 1 of the 4 blocks, gptq (no
     * full-precision pass), then 8, 4, 2, 1 sequences.
     * The stage steps are not taken: with the 4 stages' passes reused
     * (cmp_calib_stage_span) 2 or 1 stages run more multiply-adds than 4
     * (stage 0's passes cannot be reused), and a move that saves no time
     * is never taken nor kept for the moves after it */
    cmp_calib_opts o2 = lc.o;
    o2.stages = 2;
    cmp_calib_effort two;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &o2, 1, 1e12,
                                             rate, &two, NULL, &e), MC_OK);
    assert_true(two.estimate_s > most.estimate_s);
    assert_int_equal(lc.m->cfg.num_layers, 4);
    static const uint32_t st[10] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4};
    static const cmp_qmethod me[10] = {CMP_QM_GPTAQ, CMP_QM_GPTAQ, CMP_QM_GPTAQ,
                                       CMP_QM_GPTAQ, CMP_QM_GPTAQ, CMP_QM_GPTQ,
                                       CMP_QM_GPTQ, CMP_QM_GPTQ, CMP_QM_GPTQ,
                                       CMP_QM_GPTQ};
    static const int nr[10] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint32_t fl[10] = {0, 0, 3, 2, 1, 0, 0, 0, 0, 0};
    static const size_t sq[10] = {16, 16, 16, 16, 16, 16, 8, 4, 2, 1};
    for (int k = 0; k < 10; k++) {
        prev = got;
        assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 0,
                                                 prev.estimate_s * 0.999, rate,
                                                 &got, NULL, &e), MC_OK);
        assert_int_equal(got.stages, st[k]);
        assert_int_equal(got.method, me[k]);
        assert_int_equal(got.seqs, sq[k]);
        assert_int_equal(got.full_layers, fl[k]);
        assert_int_equal(got.no_refine, nr[k]);
        assert_true(got.estimate_s < prev.estimate_s);
        /* the options name the blocks only where they are cut, the
         * refinement only where it is off */
        char opts[160];
        cmp_calib_effort_options(&got, opts, sizeof opts);
        assert_true((strstr(opts, "--calib-full-layers") != NULL) == (fl[k] != 0));
        assert_true((strstr(opts, " --calib-refine off") != NULL) == (nr[k] != 0));
        /* deterministic: the same inputs, the same choice */
        cmp_calib_effort again;
        assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 0,
                                                 prev.estimate_s * 0.999, rate,
                                                 &again, NULL, &e), MC_OK);
        assert_memory_equal(&again, &got, sizeof got);
    }
    /* below the cheapest: refused, naming its estimate */
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 0,
                                             got.estimate_s * 0.5, rate, &prev,
                                             NULL, &e), MC_ERR_INVALID_ARG);
    char want[64], buf[1024];
    snprintf(want, sizeof want, "%.3g s", got.estimate_s);
    const char *msg = mc_error_format(&e, buf, sizeof buf);
    assert_non_null(strstr(msg, "cheapest"));
    assert_non_null(strstr(msg, want));
    /* a named method is kept: the steps to gptaq and gptq are skipped */
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 1,
                                             1e12, rate, &most, NULL, &e), MC_OK);
    cmp_calib_effort s1;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 0,
                                             1e12, rate, &s1, NULL, &e), MC_OK);
    /* best kept: the refinement is the first move taken */
    cmp_calib_effort kept;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o,
                                             CMP_EFFORT_FIXED_METHOD,
                                             most.estimate_s * 0.999, rate, &kept,
                                             NULL, &e), MC_OK);
    assert_int_equal(kept.method, CMP_QM_BEST);
    assert_int_equal(kept.no_refine, 1);
    assert_int_equal(kept.stages, 4);
    /* the refinement asked for too: a stage move is taken where it
     * saves time (1 stage is estimated below 4 for best on this
     * fixture) */
    const unsigned both = CMP_EFFORT_FIXED_METHOD | CMP_EFFORT_FIXED_REFINE;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, both,
                                             most.estimate_s * 0.999, rate, &kept,
                                             NULL, &e), MC_OK);
    assert_int_equal(kept.method, CMP_QM_BEST);
    assert_int_equal(kept.no_refine, 0);
    assert_int_equal(kept.stages, 1);
    assert_int_equal(kept.seqs, 16);
    lc.o.stages = 1;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, both, 1e12,
                                             rate, &s1, NULL, &e), MC_OK);
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, both,
                                             s1.estimate_s * 0.999, rate, &got,
                                             NULL, &e), MC_OK);
    assert_int_equal(got.method, CMP_QM_BEST);
    assert_int_equal(got.seqs, 8);
    /* twice the rate, half the estimate: a budget then buys more */
    cmp_calib_effort fast;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 1, 1e12,
                                             2 * rate, &fast, NULL, &e), MC_OK);
    assert_true(fast.estimate_s > 0.49 * s1.estimate_s &&
                fast.estimate_s < 0.51 * s1.estimate_s);
    tu_fixture_close(lc.m, lc.path, lc.tok, lc.off);
}

/* The default cap (cmp_calib_effort_within_passes, --calib-passes): in
 * forward passes over the calibration tokens from nominal estimates.
 * Above the options' count it keeps them; just under it takes the
 * first method move that fits, the one a budget of those seconds takes
 * at the nominal rate; far under it stops at the cheapest method move
 * (gptq unrefined), every stage and token kept, without refusing; the
 * floor keeps a short compile's effort; named efforts are kept. */
static void test_cap_in_forward_passes(void **state)
{
    (void)state;
    ladder_case lc;
    ladder_open(&lc);
    mc_error e;
    double cap;
    cmp_calib_effort most, got, again;
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0, 1e6,
                                                    0.0, &got, &most, &cap, &e),
                     MC_OK);
    assert_memory_equal(&got, &most, sizeof got);
    assert_int_equal(got.method, CMP_QM_BEST);
    assert_true(most.forward_once_s > 0.0);
    double r0 = most.estimate_s / most.forward_once_s;
    print_message("options as given: %.2f forward passes\n", r0);
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0,
                                                    r0 * 1.001, 0.0, &got, NULL,
                                                    &cap, &e), MC_OK);
    assert_memory_equal(&got, &most, sizeof got);
    /* just under: cut, within the cap, as a budget of its seconds */
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0,
                                                    r0 * 0.999, 0.0, &got, NULL,
                                                    &cap, &e), MC_OK);
    assert_true(got.estimate_s <= cap && cap < most.estimate_s);
    assert_int_not_equal(got.method, CMP_QM_BEST);
    cmp_calib_opts nominal = lc.o;
    nominal.plan_nominal = 1;
    assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &nominal, 0, cap,
                                             CMP_CALIB_NOMINAL_RATE, &again, NULL,
                                             &e), MC_OK);
    assert_memory_equal(&again, &got, sizeof got);
    /* far under: the cheapest method move, no refusal, no fewer tokens */
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0,
                                                    1e-6, 0.0, &got, NULL, &cap, &e),
                     MC_OK);
    assert_true(got.estimate_s > cap);
    assert_int_equal(got.method, CMP_QM_GPTQ);
    assert_int_equal(got.no_refine, 1);
    assert_int_equal(got.stages, 4);
    assert_int_equal(got.seqs, 16);
    char opts[160];
    assert_non_null(strstr(cmp_calib_effort_options(&got, opts, sizeof opts),
                           "--method gptq --calib-stages 4 --calib-seqs 16 "
                           "--calib-refine off"));
    /* the floor: a compile shorter than it keeps its options */
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0,
                                                    1e-6, 1e9, &got, NULL, &cap, &e),
                     MC_OK);
    assert_memory_equal(&got, &most, sizeof got);
    /* the method and the refinement named: nothing is cut */
    assert_int_equal(cmp_calib_effort_within_passes(
                         lc.m, lc.off, 18, &lc.o,
                         CMP_EFFORT_FIXED_METHOD | CMP_EFFORT_FIXED_REFINE, 1e-6,
                         0.0, &got, NULL, &cap, &e), MC_OK);
    assert_memory_equal(&got, &most, sizeof got);
    /* refused: no passes */
    assert_int_equal(cmp_calib_effort_within_passes(lc.m, lc.off, 18, &lc.o, 0, 0.0,
                                                    0.0, &got, NULL, &cap, &e),
                     MC_ERR_INVALID_ARG);
    tu_fixture_close(lc.m, lc.path, lc.tok, lc.off);
}

/* The full-precision statistics on the first F blocks only
 * (cmp_calib_opts.full_layers): F >= the block count is the default's
 * result bit for bit; F = 1 collects blocks 1.. lean (their tensors say
 * so), changes their bytes, and the plan's estimate drops with F. */
static int same_tensor(const cmp_calib_tensor *a, const cmp_calib_tensor *b)
{
    const cmp_qbuf *x = &a->q, *y = &b->q;
    if (a->fmt != b->fmt || x->fmt != y->fmt)
        return 0;
    size_t db = (size_t)kn_wformat_data_bytes(x->fmt, x->rows, x->cols);
    size_t sb = (size_t)kn_wformat_scale_bytes(x->fmt, x->rows, x->cols, x->group);
    return memcmp(x->data, y->data, db) == 0 && memcmp(x->scales, y->scales, sb) == 0;
}

static void test_full_layers(void **state)
{
    (void)state;
    ladder_case lc;
    ladder_open(&lc);
    lc.o.method = CMP_QM_GPTAQ;
    mc_error e;
    cmp_calib_result *r[3] = {NULL, NULL, NULL};
    static const uint32_t F[3] = {0, 4, 1};
    for (int i = 0; i < 3; i++) {
        lc.o.full_layers = F[i];
        assert_int_equal(cmp_calib_run(lc.m, lc.tok, lc.off, 18, &lc.o, &r[i], &e),
                         MC_OK);
    }
    uint32_t L = lc.m->cfg.num_layers;
    int differ = 0;
    for (uint32_t l = 0; l < L; l++)
        for (int s = 0; s < CMP_LIN_COUNT; s++) {
            size_t k = (size_t)l * CMP_LIN_COUNT + s;
            assert_true(same_tensor(&r[0]->t[k], &r[1]->t[k]));
            assert_int_equal(r[1]->t[k].err_own_inputs, 0);
            assert_int_equal(r[2]->t[k].err_own_inputs, l >= 1);
            if (l == 0)
                assert_true(same_tensor(&r[0]->t[k], &r[2]->t[k]));
            else
                differ += !same_tensor(&r[0]->t[k], &r[2]->t[k]);
        }
    assert_true(differ > 0);
    for (int i = 0; i < 3; i++)
        cmp_calib_result_free(r[i]);
    /* the estimate: fewer full blocks, less time; F >= L is every block */
    double prev = 0.0;
    for (uint32_t f = L + 1; f >= 1; f--) {
        cmp_calib_effort most;
        lc.o.full_layers = f;
        assert_int_equal(cmp_calib_effort_choose(lc.m, lc.off, 18, &lc.o, 1, 1e12,
                                                 1e6, &most, NULL, &e), MC_OK);
        if (f >= L) {
            assert_int_equal(most.full_layers, 0);
            if (f == L)
                assert_true(most.estimate_s == prev);
        } else {
            assert_int_equal(most.full_layers, f);
            assert_true(most.estimate_s < prev);
        }
        prev = most.estimate_s;
    }
    tu_fixture_close(lc.m, lc.path, lc.tok, lc.off);
}

/* A finished block's source pages leave the resident set and read back
 * the same (fmt_mapguard_drop on the read-only file mapping); a heap
 * buffer is not a mapping and is left alone; a calibration drops every
 * block's source. */
static void test_source_pages_dropped(void **state)
{
    (void)state;
    ladder_case lc;
    ladder_open(&lc);
    const kn_matrix *w = &lc.m->layers[0].w.w_up;
    size_t n = (size_t)kn_wformat_data_bytes(w->fmt, w->rows, w->cols);
    assert_true(fmt_mapguard_covers(w->data, n));
    unsigned char *copy = malloc(n);
    assert_non_null(copy);
    memcpy(copy, w->data, n);
    assert_true(fmt_mapguard_drop(w->data, n) >= n);
    assert_memory_equal(copy, w->data, n); /* read back from the file */
    assert_false(fmt_mapguard_covers(copy, n));
    assert_int_equal(fmt_mapguard_drop(copy, n), 0);
    free(copy);
    mc_error e;
    cmp_calib_result *r = NULL;
    lc.o.method = CMP_QM_GPTQ;
    assert_int_equal(cmp_calib_run(lc.m, lc.tok, lc.off, 18, &lc.o, &r, &e), MC_OK);
    uint64_t all = 0;
    for (uint32_t l = 0; l < lc.m->cfg.num_layers; l++)
        for (int s = 0; s < CMP_LIN_COUNT; s++) {
            const kn_matrix *x = cmp_calib_src_matrix(&lc.m->layers[l].w, s);
            all += kn_wformat_data_bytes(x->fmt, x->rows, x->cols);
        }
    print_message("source %llu bytes, dropped %llu\n", (unsigned long long)all,
                  (unsigned long long)r->source_dropped);
    assert_true(r->source_dropped >= all);
    cmp_calib_result_free(r);
    tu_fixture_close(lc.m, lc.path, lc.tok, lc.off);
}

/* AWQ's pre-scaling statistics come from every stride-th sequence where
 * no group of stage 0 reads them (4 stages), from every sequence where
 * they are the group's own (1 stage), and not at all without
 * pre-scaling. */
static void test_prescale_sample(void **state)
{
    (void)state;
    const size_t nseq = 66, T = 250; /* 16,500 tokens: stride 2 */
    char *path;
    int32_t *tok;
    size_t *off;
    rt_model *m = tu_fixture_open("llama", nseq, T, &path, &tok, &off);
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q8;
    o.method = CMP_QM_BEST;
    o.rotate = 1;
    o.awq_coarse = 1;
    assert_int_equal(cmp_calib_prescale_stride(nseq * T), 2);
    static const uint32_t stages[3] = {4, 1, 4};
    static const cmp_qmethod method[3] = {CMP_QM_BEST, CMP_QM_BEST, CMP_QM_GPTAQ};
    const size_t want[3] = {(nseq + 1) / 2 * T, nseq * T, 0};
    for (int k = 0; k < 3; k++) {
        o.stages = stages[k];
        o.method = method[k];
        cmp_calib_result *r = NULL;
        mc_error e;
        assert_int_equal(cmp_calib_run(m, tok, off, nseq, &o, &r, &e), MC_OK);
        assert_int_equal(r->calib_tokens, nseq * T);
        assert_int_equal(r->prescale_tokens, want[k]);
        cmp_calib_result_free(r);
    }
    tu_fixture_close(m, path, tok, off);
}

/* mcompile ARGS --json: its calibration.effort object (new ref). */
static json_t *compile_effort(const char *args)
{
    char *out = NULL, *err = NULL;
    char *cmd = tu_fmt("%s/mcompile %s --json", MC_BIN_DIR, args);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("mcompile %s failed (%d): %s", args, rc, err);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *eff = json_incref(
        json_object_get(json_object_get(j, "calibration"), "effort"));
    assert_non_null(eff);
    json_decref(j);
    free(out);
    free(err);
    free(cmd);
    return eff;
}

static void test_budget_end_to_end_reproduces(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("budget");
    char *ids = tu_fmt("%s/ids.txt", dir);
    char text[8192];
    size_t n = 0;
    uint32_t x = 777;
    for (int s = 0; s < 20; s++) {
        for (int i = 0; i < 32; i++) {
            x = x * 1103515245u + 12345u;
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%u",
                                  i ? " " : "", (x >> 16) % 256u);
        }
        text[n++] = '\n';
    }
    assert_int_equal(tu_write_file(ids, text, n), 0);
    char *model = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    char *base = tu_fmt("%s --target 1GiB --quant int4 --group 32 --calib %s",
                        model, ids);
    /* A fixed rate (MC_CALIB_RATE, inherited by the children): measured,
     * the rate of a model this small swings ~20x with the machine's load,
     * and so would the budget's choice.  A bad value is refused. */
    setenv("MC_CALIB_RATE", "x", 1);
    char *bad = tu_fmt("%s/mcompile %s --calib-time 10 -o %s/bad.mca",
                       MC_BIN_DIR, base, dir);
    char *bout = NULL, *berr = NULL;
    assert_int_equal(tu_run(bad, &bout, &berr), 1);
    assert_non_null(strstr(berr, "MC_CALIB_RATE"));
    free(bout);
    free(berr);
    free(bad);
    setenv("MC_CALIB_RATE", "1e9", 1);
    /* the options' estimate, from a budget nothing reaches */
    char *a1 = tu_fmt("%s --calib-time 1e8 -o %s/big.mca", base, dir);
    json_t *big = compile_effort(a1);
    double est = json_number_value(json_object_get(big, "estimate_seconds"));
    assert_int_equal(json_integer_value(json_object_get(big, "stages")), 4);
    assert_string_equal(json_string_value(json_object_get(big, "method")), "best");
    assert_true(est > 0.0);
    /* A budget between the cheapest effort's estimate and the options':
     * each run measures the rate again (on a model this small, through a
     * pool's wake-ups, it swings by 20x on a loaded machine), so the
     * budget follows what the last run said: a refusal names the
     * cheapest estimate (lo), a run that kept the options names theirs
     * (hi); the next budget is between.  A run whose own estimate of the
     * options exceeds its budget had to cut: that is the one checked. */
    int hits = 0;
    double lo = 0.0, hi = est;
    for (int k = 0; k < 16 && !hits; k++) {
        double budget = lo > 0.0 && lo < hi ? sqrt(lo * hi) : lo > 0.0 ? 1.5 * lo
                                                                  : 0.5 * hi;
        char *a2 = tu_fmt("%s --calib-time %.9g -o %s/tight.mca", base, budget,
                          dir);
        char *cmd = tu_fmt("%s/mcompile %s --json", MC_BIN_DIR, a2);
        char *out = NULL, *err = NULL;
        int rc = tu_run(cmd, &out, &err);
        json_t *j = rc == 0 ? json_loads(out, 0, NULL) : NULL;
        json_t *tight = json_object_get(json_object_get(j, "calibration"), "effort");
        if (rc == 1) {
            const char *at = strstr(err, "below the cheapest calibration's estimate, ");
            assert_non_null(at);
            lo = strtod(at + strlen("below the cheapest calibration's estimate, "),
                        NULL);
            assert_true(lo > 0.0);
        } else {
            assert_non_null(tight);
            hi = json_number_value(
                json_object_get(tight, "options_given_estimate_seconds"));
        }
        if (tight &&
            json_number_value(json_object_get(tight, "options_given_estimate_seconds")) >
                budget) {
            hits = 1;
            assert_true(json_number_value(json_object_get(tight, "estimate_seconds")) <=
                        budget);
            int cheaper = json_integer_value(json_object_get(tight, "stages")) < 4 ||
                          strcmp(json_string_value(json_object_get(tight, "method")),
                                 "best") != 0 ||
                          json_integer_value(json_object_get(tight, "sequences")) < 18;
            assert_true(cheaper);
            /* its options, without the budget: the same bytes */
            const char *opts = json_string_value(json_object_get(tight, "options"));
            print_message("budget %.3g s chose: %s\n", budget, opts);
            char *c3 = tu_fmt("%s/mcompile %s %s -o %s/again.mca -q", MC_BIN_DIR,
                              base, opts, dir);
            assert_int_equal(tu_run(c3, NULL, NULL), 0);
            char *p1 = tu_fmt("%s/tight.mca", dir), *p2 = tu_fmt("%s/again.mca", dir);
            size_t l1 = 0, l2 = 0;
            char *b1 = tu_read_file(p1, &l1), *b2 = tu_read_file(p2, &l2);
            assert_non_null(b1);
            assert_non_null(b2);
            assert_int_equal(l1, l2);
            assert_memory_equal(b1, b2, l1);
            free(b1);
            free(b2);
            free(p1);
            free(p2);
            free(c3);
        }
        json_decref(j);
        free(out);
        free(err);
        free(cmd);
        free(a2);
    }
    assert_true(hits);
    unsetenv("MC_CALIB_RATE");
    /* the default cut (cmp_calib_default_full_layers): the first half of
     * the 4 blocks with int8 linears, none with int4 or for gptq (which
     * has nothing to cut, asked or not); a number at or above the block
     * count asks for all of them */
    static const struct {
        const char *opts;
        json_int_t full; /* 0: none named */
    } cut[6] = {{"--quant int8", 2}, {"--quant int8 --calib-full-layers 9", 0},
                {"--quant int8 --calib-full-layers 1", 1},
                {"--quant int8 --method gptq", 0},
                {"--quant int8 --method gptq --calib-full-layers 1", 0},
                {"--quant int4", 0}};
    for (int i = 0; i < 6; i++) {
        char *a = tu_fmt("%s --target 1GiB %s --calib %s --calib-seqs 4 -o %s/c.mca",
                         model, cut[i].opts, ids, dir);
        json_t *eff = compile_effort(a);
        json_t *fl = json_object_get(eff, "full_layers");
        const char *o = json_string_value(json_object_get(eff, "options"));
        assert_int_equal(fl ? json_integer_value(fl) : 0, cut[i].full);
        assert_true((strstr(o, "--calib-full-layers") != NULL) == (cut[i].full != 0));
        json_decref(eff);
        free(a);
    }
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q8, 0, 30), 15);
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q8, 0, 5), 3);
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q8, 0, 1), 0);
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q8, 1, 30), 0);
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q4, 0, 30), 0);
    assert_int_equal(cmp_calib_default_full_layers(KN_W_Q4S, 0, 30), 0);
    /* --calib-seqs beyond the file, and the options without --calib */
    char *c5 = tu_fmt("%s/mcompile %s --calib-seqs 19 -o %s/x.mca", MC_BIN_DIR,
                      base, dir);
    char *err5 = NULL;
    assert_int_equal(tu_run(c5, NULL, &err5), 1);
    assert_non_null(strstr(err5, "19 calibration sequences asked"));
    free(err5);
    free(c5);
    c5 = tu_fmt("%s/mcompile %s --target 1GiB --quant int4 --calib-time 5",
                MC_BIN_DIR, model);
    assert_int_equal(tu_run(c5, NULL, &err5), 2);
    assert_non_null(strstr(err5, "need --calib FILE"));
    free(err5);
    free(c5);
    /* the manifest names fewer stages, and the default's does not */
    char *c6 = tu_fmt("%s/mcompile %s --calib-stages 2 --calib-seqs 4 -o %s/s2.mca "
                      "-q && %s/mcompile inspect %s/s2.mca --json", MC_BIN_DIR,
                      base, dir, MC_BIN_DIR, dir);
    char *out6 = NULL;
    assert_int_equal(tu_run(c6, &out6, NULL), 0);
    json_t *j6 = json_loads(out6, 0, NULL);
    json_t *cal = json_object_get(json_object_get(j6, "manifest"), "calibration");
    assert_int_equal(json_integer_value(json_object_get(cal, "stages")), 2);
    assert_int_equal(json_integer_value(json_object_get(cal, "tokens")), 4 * 32);
    json_decref(j6);
    free(out6);
    free(c6);
    c6 = tu_fmt("%s/mcompile inspect %s/big.mca --json", MC_BIN_DIR, dir);
    assert_int_equal(tu_run(c6, &out6, NULL), 0);
    j6 = json_loads(out6, 0, NULL);
    cal = json_object_get(json_object_get(j6, "manifest"), "calibration");
    assert_non_null(cal);
    assert_null(json_object_get(cal, "stages"));
    json_decref(j6);
    free(out6);
    free(c6);
    /* the default cap: stated in the effort (a compile this short is
     * under its floor and keeps its options); --calib-passes needs
     * --calib and no --calib-time; 0 removes it */
    char *a7 = tu_fmt("%s --calib-seqs 4 -o %s/cap.mca", base, dir);
    json_t *cap = compile_effort(a7);
    assert_true(json_number_value(json_object_get(cap, "cap_forward_passes")) ==
                CMP_CALIB_PASSES_DEFAULT);
    assert_true(json_number_value(json_object_get(cap, "forward_passes")) > 0.0);
    assert_string_equal(json_string_value(json_object_get(cap, "method")), "best");
    json_decref(cap);
    free(a7);
    a7 = tu_fmt("%s --calib-seqs 4 --calib-passes 0 -o %s/cap.mca", base, dir);
    cap = compile_effort(a7);
    assert_null(json_object_get(cap, "cap_forward_passes"));
    json_decref(cap);
    free(a7);
    static const char *const capbad[3] = {"--calib-time 5 --calib-passes 4",
                                          "--calib-passes -1",
                                          "--quant auto --max-batch 1 --max-seq 64 "
                                          "--calib-passes 4"};
    for (int i = 0; i < 3; i++) {
        c5 = tu_fmt("%s/mcompile %s %s -o %s/x.mca", MC_BIN_DIR, base, capbad[i], dir);
        assert_int_equal(tu_run(c5, NULL, &err5), 2);
        assert_non_null(strstr(err5, "--calib-passes"));
        free(err5);
        free(c5);
    }
    c5 = tu_fmt("%s/mcompile %s --target 1GiB --quant int4 --calib-passes 4",
                MC_BIN_DIR, model);
    assert_int_equal(tu_run(c5, NULL, &err5), 2);
    assert_non_null(strstr(err5, "--calib-passes needs --calib FILE"));
    free(err5);
    free(c5);
    /* far below anything: refused with the estimate named */
    char *a4 = tu_fmt("%s --calib-time 1e-9 -o %s/none.mca", base, dir);
    char *c4 = tu_fmt("%s/mcompile %s", MC_BIN_DIR, a4);
    char *err4 = NULL;
    assert_int_equal(tu_run(c4, NULL, &err4), 1);
    assert_non_null(strstr(err4, "below the cheapest calibration's estimate"));
    assert_non_null(strstr(err4, "--calib-seqs 1"));
    free(err4);
    free(a4);
    free(c4);
    json_decref(big);
    free(a1);
    free(base);
    free(model);
    free(ids);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_madds_follow_the_passes),
        cmocka_unit_test(test_qlin_madds),
        cmocka_unit_test(test_prescale_stride),
        cmocka_unit_test(test_prescale_sample),
        cmocka_unit_test(test_subset_keeps_the_heldout),
        cmocka_unit_test(test_choice_walks_the_ladder),
        cmocka_unit_test(test_cap_in_forward_passes),
        cmocka_unit_test(test_full_layers),
        cmocka_unit_test(test_source_pages_dropped),
        cmocka_unit_test(test_budget_end_to_end_reproduces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_calib_memory.c - the calibration's memory plan (cmp_calib_memory,
 * cmp_calib_plan_memory): the estimate bounds what cmp_calib_run really
 * allocates (mc_alloc's tracked peak) on generated models under several
 * option sets, lean statistics fit a budget and still quantize well, the
 * spill file takes the result out of memory, and a Llama-2-70B-shaped
 * config plans within 24 GiB. */
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
#include "kn_stats_bytes.h"
#include "kn_block.h"
#include "mc_alloc.h"
#include "rt_model.h"
#include "testutil.h"

static const double GIB = 1073741824.0;

typedef struct run_case {
    const char *fixture;
    kn_wformat fmt;
    uint32_t group;
    cmp_qmethod method;
    int rotate;
    size_t heldout;
    int spill;
    kn_wformat lm_head; /* cmp_calib_opts.lm_head_fmt (F32: none) */
    int force_lean;   /* budget between the full and the down-lean plan */
    int threads;      /* > 1: a pool of this many (forward passes and the
                         row-parallel quantization, each thread its own
                         work space) */
    int down_full_c;  /* cmp_calib_opts.down_full_c */
    int no_refine;    /* cmp_calib_opts.no_refine */
} run_case;

/* Calibrate one case with tracking on; check measured <= planned and that
 * the plan is not far above it.  Returns the result's summed error. */
static double run_tracked(const run_case *rc, cmp_calib_mem *plan_out,
                          int64_t *measured_out)
{
    char *path;
    int32_t *tok;
    size_t *off;
    size_t nseq = 12;
    rt_model *m = tu_fixture_open(rc->fixture, nseq, 40, &path, &tok, &off);
    char *dir = rc->spill ? tu_mkdtemp("calibmem") : NULL;
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = rc->fmt;
    o.group = rc->group;
    o.method = rc->method;
    o.rotate = rc->rotate;
    o.heldout = rc->heldout;
    o.lm_head_fmt = rc->lm_head;
    o.down_full_c = rc->down_full_c;
    o.no_refine = rc->no_refine;
    o.spill_dir = dir;
    kn_pool *pool = NULL;
    if (rc->threads > 1) {
        pool = tu_pool_warm(rc->threads);
        o.pool = pool;
    }
    mc_error e;
    if (rc->force_lean) {
        cmp_calib_mem full, lean;
        assert_int_equal(cmp_calib_memory(&m->cfg, off, nseq, &o, 0, &full, &e), MC_OK);
        assert_int_equal(cmp_calib_memory(&m->cfg, off, nseq, &o,
                                          1u << KN_TAP_DOWN_IN, &lean, &e), MC_OK);
        assert_true(lean.peak < full.peak);
        o.mem_budget = (full.peak + lean.peak) / 2;
    }
    cmp_calib_mem plan;
    assert_int_equal(cmp_calib_plan_memory(&m->cfg, off, nseq, &o, &plan, &e), MC_OK);
    mc_alloc_track(1);
    mc_alloc_reset_peak();
    int64_t base = mc_alloc_live_bytes();
    cmp_calib_result *r = NULL;
    mc_status st = cmp_calib_run(m, tok, off, nseq, &o, &r, &e);
    int64_t measured = mc_alloc_peak_bytes() - base;
    mc_alloc_track(0);
    if (st != MC_OK) {
        char buf[2048];
        fail_msg("%s: %s", rc->fixture, mc_error_format(&e, buf, sizeof buf));
    }
    printf("# %-8s %s g%u %-5s rot %d held %zu spill %d lean %#x threads %d%s: "
           "planned %lld (at %s), measured %lld (%.2f)\n", rc->fixture,
           rc->fmt == KN_W_Q8 ? "q8" : "q4", rc->group,
           cmp_qmethod_name(rc->method), rc->rotate, rc->heldout, rc->spill,
           plan.lean, rc->threads > 1 ? rc->threads : 1,
           rc->no_refine ? " unrefined" : "", (long long)plan.peak, plan.phase, (long long)measured,
           (double)measured / (double)plan.peak);
    assert_true((uint64_t)measured <= plan.peak);
    /* not a blanket over-estimate: within a tenth of the real peak */
    assert_true((double)plan.peak <= 1.10 * (double)measured);
    assert_int_equal(r->mem.lean, plan.lean);
    if (rc->force_lean) {
        assert_true(plan.lean & (1u << KN_TAP_DOWN_IN));
        assert_true((uint64_t)measured <= o.mem_budget);
        for (uint32_t l = 0; l < r->layers; l++) {
            const cmp_calib_tensor *t = &r->t[l * CMP_LIN_COUNT + CMP_LIN_DOWN];
            assert_int_equal(t->err_own_inputs, 1);
            assert_true(t->method != CMP_QM_GPTAQ && t->method != CMP_QM_AWQ_GPTAQ);
        }
    }
    if (rc->spill) {
        /* every quantized buffer lives in the spill file's mapping */
        assert_non_null(r->spill);
        assert_true(plan.spill > 0);
    }
    double sum = 0.0;
    for (size_t i = 0; i < (size_t)r->layers * CMP_LIN_COUNT; i++)
        sum += r->t[i].err;
    /* the result still runs: evaluate it against the float model */
    rt_model view;
    assert_int_equal(cmp_calib_view(m, r, &view, &e), MC_OK);
    cmp_eval_report rep;
    assert_int_equal(cmp_eval_models(m, &view, tok, off, 2, NULL, NULL, NULL,
                                     &rep, &e), MC_OK);
    assert_true(rep.kld_mean < (rc->fmt == KN_W_Q8 ? 0.05 : 1.0));
    cmp_calib_view_free(&view);
    cmp_calib_result_free(r);
    if (dir) {
        tu_rmtree(dir);
        free(dir);
    }
    *plan_out = plan;
    *measured_out = measured;
    kn_pool_free(pool);
    tu_fixture_close(m, path, tok, off);
    return sum;
}

static void test_calib_memory_bounds_measured_peak(void **state)
{
    (void)state;
    static const run_case cases[] = {
        {"llama", KN_W_Q8, 0, CMP_QM_BEST, 1, 2, 1, KN_W_F32, 0},
        {"llama", KN_W_Q4, 32, CMP_QM_GPTQ, 0, 0, 0, KN_W_F32, 0},
        {"qwen2", KN_W_Q4, 32, CMP_QM_BEST, 1, 3, 0, KN_W_Q8, 0, 3},
        {"qwen2", KN_W_Q4S, 32, CMP_QM_RTN, 1, 2, 1, KN_W_Q4S, 0, 2},
        {"llama", KN_W_Q4, 64, CMP_QM_GPTQ, 0, 2, 0, KN_W_Q4, 0, 1},
        {"mistral", KN_W_Q8, 0, CMP_QM_AWQ, 0, 2, 1, KN_W_Q8, 0, 2},
        {"llama-bias", KN_W_Q4S, 64, CMP_QM_GPTAQ, 1, 0, 1, KN_W_F32, 0, 3},
        /* the held-out states carried with the layers, the int8
         * embedding rows of an unrotated tied model */
        {"qwen2", KN_W_Q8, 0, CMP_QM_RTN, 0, 4, 0, KN_W_Q8, 0, 2},
        {"llama", KN_W_Q4, 64, CMP_QM_GPTQ, 0, 6, 1, KN_W_F32, 0, 1},
        /* GPTQ's codes unrefined: no refits' H w, no descent's H */
        {"llama", KN_W_Q4, 32, CMP_QM_BEST, 1, 2, 0, KN_W_F32, 0, 2, 0, 1},
        {"mistral", KN_W_Q8, 0, CMP_QM_GPTQ, 0, 0, 0, KN_W_F32, 0, 1, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cmp_calib_mem plan;
        int64_t measured;
        run_tracked(&cases[i], &plan, &measured);
    }
}

/* A budget between the full plan and the lean-down plan: down_proj's
 * inputs go lean, the run stays under the budget, GPTAQ is not used
 * there, and the quality stays close to the full run's.  With down's
 * full Hf and C (down_full_c): from its outputs, down's sums are small
 * beside the first stage's. */
static void test_calib_memory_lean_fits_budget(void **state)
{
    (void)state;
    run_case full = {"llama", KN_W_Q4, 32, CMP_QM_BEST, 1, 0, 1, KN_W_F32, 0, 0, 1};
    run_case lean = full;
    lean.force_lean = 1;
    cmp_calib_mem pf, pl;
    int64_t mf, ml;
    double ef = run_tracked(&full, &pf, &mf);
    double el = run_tracked(&lean, &pl, &ml);
    printf("# full: error sum %.5f, peak %lld; lean down: %.5f, peak %lld\n",
           ef, (long long)mf, el, (long long)ml);
    assert_true(ml < mf);
    assert_true(el < 1.5 * ef);
}

/* Nothing fits: the error names the peak and the budget. */
static void test_calib_memory_refuses_impossible_budget(void **state)
{
    (void)state;
    char *path;
    int32_t *tok;
    size_t *off;
    rt_model *m = tu_fixture_open("llama", 4, 40, &path, &tok, &off);
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q8;
    o.method = CMP_QM_BEST;
    o.mem_budget = 4096;
    mc_error e;
    cmp_calib_result *r = NULL;
    assert_int_equal(cmp_calib_run(m, tok, off, 4, &o, &r, &e), MC_ERR_NOMEM);
    assert_null(r);
    assert_non_null(strstr(e.message, "budget is"));
    assert_non_null(strstr(e.message, "--calib-memory"));
    tu_fixture_close(m, path, tok, off);
}

/* Llama-2-70B (hidden 8192, 64 heads, 8 KV heads, FFN 28672, 80 layers,
 * vocab 32000) on 64 sequences of 1,024 tokens (65,536 tokens, 6 held out
 * as the CLI does), int4 g128, best, rotated, with the spill file: the
 * plan fits 24 GiB.  Without the spill file it cannot (the quantized
 * model alone is ~35 GiB). */
static void test_calib_memory_70b_fits_24gib(void **state)
{
    (void)state;
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 8192;
    c.num_heads = 64;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate_size = 28672;
    c.num_layers = 80;
    c.vocab_size = 32000;
    c.max_position_embeddings = 4096;
    c.rope.theta = 10000.0;
    size_t nseq = 64, T = 1024;
    size_t *off = malloc((nseq + 1) * sizeof(size_t));
    assert_non_null(off);
    for (size_t i = 0; i <= nseq; i++)
        off[i] = i * T;
    cmp_calib_opts o = tu_calib_opts_best_q4(128, 6);
    o.spill_dir = ".";
    o.mem_budget = 24ull << 30;
    cmp_calib_mem p;
    mc_error e;
    mc_status st = cmp_calib_plan_memory(&c, off, nseq, &o, &p, &e);
    printf("# 70B, 65,536 tokens, int4 g128 best, rotated, spill: peak %.2f GiB "
           "at %s (states %.2f, forward %.2f, result %.2f, block %.2f, "
           "statistics %.2f, work %.2f, ends %.2f), lean %#x, spilled %.2f GiB\n",
           p.peak / GIB, p.phase, p.states / GIB, p.forward / GIB,
           p.result / GIB, p.block / GIB, p.stats / GIB, p.work / GIB,
           p.ends / GIB, p.lean, p.spill / GIB);
    assert_int_equal(st, MC_OK);
    assert_true(p.peak <= o.mem_budget);
    assert_true(p.spill > 30ull << 30); /* the quantized model went to disk */
    /* no budget: the full statistics' plan, for the record */
    o.mem_budget = 0;
    assert_int_equal(cmp_calib_plan_memory(&c, off, nseq, &o, &p, &e), MC_OK);
    printf("# 70B with full statistics everywhere: peak %.2f GiB at %s\n",
           p.peak / GIB, p.phase);
    assert_true(p.device == 0); /* statistics on the CPU */
    /* on a GPU: the device holds down_proj's three sums at the most */
    o.stats_on_gpu = 1;
    assert_int_equal(cmp_calib_plan_memory(&c, off, nseq, &o, &p, &e), MC_OK);
    printf("# 70B statistics on a GPU: device %.2f GiB at %s\n", p.device / GIB,
           p.device_phase);
    assert_true(p.device == kn_stats_device_bytes(28672, 1024, 1));
    assert_string_equal(p.device_phase, "down");
    /* down_proj lean: Hq only there; q/k/v's full sums with down's Hq in
     * the first pass are then the most */
    o.force_lean = 1u << KN_TAP_DOWN_IN;
    assert_int_equal(cmp_calib_plan_memory(&c, off, nseq, &o, &p, &e), MC_OK);
    assert_true(p.device == kn_stats_device_bytes(8192, 1024, 1) +
                                kn_stats_device_bytes(28672, 1024, 0));
    assert_string_equal(p.device_phase, "statistics");
    o.force_lean = 0;
    o.stats_on_gpu = 0;
    /* without the spill file the result alone is over the budget */
    o.spill_dir = NULL;
    o.mem_budget = 24ull << 30;
    assert_int_equal(cmp_calib_plan_memory(&c, off, nseq, &o, &p, &e), MC_ERR_NOMEM);
    free(off);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calib_memory_bounds_measured_peak),
        cmocka_unit_test(test_calib_memory_lean_fits_budget),
        cmocka_unit_test(test_calib_memory_refuses_impossible_budget),
        cmocka_unit_test(test_calib_memory_70b_fits_24gib),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

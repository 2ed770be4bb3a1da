/* test_eval.c - quality metrics: known answers on hand-made distributions,
 * identical models give KLD 0 and top-1 1, the token-id parser, and the
 * eval CLI's JSON report. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_eval.h"
#include "mc_alloc.h"
#include "rt_model.h"
#include "testutil.h"

/* p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2):
 * KL = 1/4 ln(1/2) + 3/4 ln(3/2). */
static void test_eval_kld_known_answer(void **state)
{
    (void)state;
    float ref[2] = {0.0f, logf(3.0f)}, q[2] = {5.0f, 5.0f};
    cmp_eval_acc a;
    cmp_eval_acc_init(&a);
    assert_int_equal(cmp_eval_acc_add(&a, ref, q, 2, 0), MC_OK);
    cmp_eval_report r;
    assert_int_equal(cmp_eval_acc_report(&a, &r), MC_OK);
    double want = 0.25 * log(0.5) + 0.75 * log(1.5);
    assert_float_equal(r.kld_mean, want, 1e-7);
    /* argmax: ref says 1, q ties -> first (0): disagree. */
    assert_float_equal(r.top1, 0.0, 0);
    /* NLL of token 0: ref -ln(1/4), quant -ln(1/2). */
    assert_float_equal(r.ppl_ref, 4.0, 1e-6);
    assert_float_equal(r.ppl, 2.0, 1e-6);
    assert_int_equal(r.tokens, 1);
    cmp_eval_acc_free(&a);
}

/* Logit shifts do not change distributions: KLD 0, top-1 1; the 99th
 * percentile is the nearest-rank value. */
static void test_eval_identical_distributions_give_zero(void **state)
{
    (void)state;
    cmp_eval_acc a;
    cmp_eval_acc_init(&a);
    float l[5] = {1.0f, -2.0f, 3.5f, 0.0f, 0.25f}, m[5];
    for (int i = 0; i < 5; i++)
        m[i] = l[i] + 100.0f;
    for (int k = 0; k < 10; k++)
        assert_int_equal(cmp_eval_acc_add(&a, l, m, 5, k % 5), MC_OK);
    cmp_eval_report r;
    assert_int_equal(cmp_eval_acc_report(&a, &r), MC_OK);
    assert_true(r.kld_mean < 1e-12);
    assert_float_equal(r.top1, 1.0, 0);
    assert_float_equal(r.ppl, r.ppl_ref, 1e-9);
    cmp_eval_acc_free(&a);

    /* 100 positions with KLD growing: p99 = the 99th smallest. */
    cmp_eval_acc_init(&a);
    for (int k = 1; k <= 100; k++) {
        float p[2] = {0.0f, 0.0f}, q[2] = {0.0f, 0.02f * (float)k};
        assert_int_equal(cmp_eval_acc_add(&a, p, q, 2, -1), MC_OK);
    }
    assert_int_equal(cmp_eval_acc_report(&a, &r), MC_OK);
    float p[2] = {0.0f, 0.0f}, q99[2] = {0.0f, 0.02f * 99.0f};
    cmp_eval_acc b;
    cmp_eval_acc_init(&b);
    cmp_eval_acc_add(&b, p, q99, 2, -1);
    cmp_eval_report rb;
    cmp_eval_acc_report(&b, &rb);
    assert_float_equal(r.kld_p99, rb.kld_mean, 1e-12);
    assert_float_equal(r.ppl, 0.0, 0); /* no next tokens: no perplexity */
    cmp_eval_acc_free(&a);
    cmp_eval_acc_free(&b);
}

static void test_eval_same_model_twice_is_exact(void **state)
{
    (void)state;
    char *path = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_hf(path, &m, NULL), MC_OK);
    int32_t tok[40];
    for (int i = 0; i < 40; i++)
        tok[i] = (i * 37 + 11) % (int)m->cfg.vocab_size;
    size_t off[3] = {0, 25, 40};
    cmp_eval_report r;
    assert_int_equal(cmp_eval_models(m, m, tok, off, 2, NULL, NULL, NULL, &r, NULL), MC_OK);
    assert_int_equal(r.tokens, 24 + 14);
    assert_true(r.kld_mean == 0.0);
    assert_true(r.top1 == 1.0);
    assert_true(r.ppl > 1.0 && r.ppl == r.ppl_ref);
    rt_model_free(m);
    free(path);
}

static void test_eval_ids_parser_reads_lines_and_rejects_junk(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("ids");
    char *p = tu_fmt("%s/a.ids", dir);
    const char *txt = "1 2 3\n\n4 5\r\n  6\n";
    assert_int_equal(tu_write_file(p, txt, strlen(txt)), 0);
    int32_t *tok;
    size_t *off, n;
    assert_int_equal(cmp_ids_load(p, &tok, &off, &n, NULL), MC_OK);
    assert_int_equal(n, 3);
    assert_int_equal(off[0], 0);
    assert_int_equal(off[1], 3);
    assert_int_equal(off[2], 5);
    assert_int_equal(off[3], 6);
    assert_int_equal(tok[4], 5);
    mc_free(tok);
    mc_free(off);
    const char *bad = "1 2\n3 x 4\n";
    assert_int_equal(tu_write_file(p, bad, strlen(bad)), 0);
    mc_error e;
    assert_int_equal(cmp_ids_load(p, &tok, &off, &n, &e), MC_ERR_FORMAT);
    /* fmt_ids names the place in the message: line, column, byte offset */
    assert_non_null(strstr(e.message, "line 2"));
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* The CLI: usage errors exit 2; the model against itself reports KLD 0 in
 * JSON with every key. */
static void test_eval_cli_json_reports_all_keys(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("evalcli");
    char *ids = tu_fmt("%s/t.ids", dir);
    const char *txt = "1 5 9 13 17 21\n2 4 6 8\n";
    assert_int_equal(tu_write_file(ids, txt, strlen(txt)), 0);
    char *cmd = tu_fmt("%s/mcompile eval %s/llama --ref %s/llama --tokens %s --json",
                       MC_BIN_DIR, MC_FIXTURE_DIR, MC_FIXTURE_DIR, ids);
    char *out = NULL;
    int rc = tu_run(cmd, &out, NULL);
    assert_int_equal(rc, 0);
    const char *keys[6] = {"\"kld_mean\": 0,", "\"kld_p99\"", "\"top1\": 1,",
                           "\"ppl_ref\"", "\"ppl\"", "\"tokens\": 8"};
    for (int i = 0; i < 6; i++)
        assert_non_null(strstr(out, keys[i]));
    free(out);
    free(cmd);
    cmd = tu_fmt("%s/mcompile eval %s/llama --tokens %s", MC_BIN_DIR,
                 MC_FIXTURE_DIR, ids);
    assert_int_equal(tu_run(cmd, NULL, NULL), 2);
    free(cmd);
    tu_rmtree(dir);
    free(ids);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_kld_known_answer),
        cmocka_unit_test(test_eval_identical_distributions_give_zero),
        cmocka_unit_test(test_eval_same_model_twice_is_exact),
        cmocka_unit_test(test_eval_ids_parser_reads_lines_and_rejects_junk),
        cmocka_unit_test(test_eval_cli_json_reports_all_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

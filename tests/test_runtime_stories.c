/* test_runtime_stories.c - the runtime on a real trained checkpoint
 * (stories260k from ../shared): greedy decoding from BOS reproduces the 256
 * reference ids, and logits at the first 64 positions match the reference
 * runner within 1e-4 absolute, both through prefill and through decode. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_forward.h"
#include "rt_model.h"
#include "rt_session.h"
#include "stories_ref.h"
#include "testutil.h"

#define NREF 257
#define NLOG 64
#define VOCAB 512

static void on_logits(void *ctx, size_t seq, size_t step, const float *lg,
                      uint32_t vocab)
{
    assert_int_equal(seq, 0);
    assert_int_equal(vocab, VOCAB);
    tu_logit_capture_row(ctx, step, lg);
}

static rt_model *open_stories(void)
{
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(tu_stories_dir(), &m, &e), MC_OK);
    assert_int_equal(m->cfg.vocab_size, VOCAB);
    assert_ptr_equal(m->lm_head.data, m->embed.data); /* tied */
    return m;
}

static void test_stories_greedy_from_bos_reproduces_256_reference_ids(
    void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    int32_t ref[NREF];
    assert_int_equal(tu_stories_ref_ids(tu_stories_dir(), ref, NREF), NREF);
    float *ref_lg = tu_stories_ref_logits(tu_stories_dir(),
                                          (size_t)NLOG * VOCAB);
    assert_non_null(ref_lg);
    rt_model *m = open_stories();
    rt_limits L = {.max_batch = 1, .max_seq = 512, .prefill_chunk = 16,
                   .kv_type = KN_KV_F32, .threads = 2};
    rt_session *s;
    mc_error e;
    assert_int_equal(tu_session_create(m, &L, NULL, &s, &e), MC_OK);
    tu_logit_capture cap = {.rows = calloc(NLOG * VOCAB, sizeof(float)),
                            .max_rows = NLOG, .vocab = VOCAB};
    int32_t out[256];
    rt_gen_params gp = {.max_new_tokens = 256, .on_logits = on_logits,
                        .on_logits_ctx = &cap};
    rt_prompt pr = {.ids = ref, .n = 1};
    rt_gen_result res = {.ids = out};
    assert_int_equal(rt_session_generate(s, &pr, 1, &gp, &res, &e), MC_OK);
    assert_int_equal(res.n, 256);
    assert_int_equal(res.stop, RT_STOP_LENGTH);
    for (int i = 0; i < 256; i++)
        if (out[i] != ref[i + 1])
            fail_msg("generated id %d is %d, reference %d", i, out[i],
                     ref[i + 1]);
    /* Decode logits (one token per step) against the reference. */
    assert_int_equal(cap.got, NLOG);
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)NLOG * VOCAB; i++) {
        double d = fabs((double)cap.rows[i] - ref_lg[i]);
        if (d > worst)
            worst = d;
    }
    printf("stories260k decode logits: max abs diff %.3g\n", worst);
    assert_true(worst < 1e-4);
    free(cap.rows);
    free(ref_lg);
    rt_session_free(s);
    rt_model_free(m);
}

/* Prefill logits of the first 64 reference ids, whole and chunked.  The
 * reference runner is float32 too: against the exact (double) forward of
 * tests/helpers/ref_forward.h it is off by up to 5.2e-5, and so are we
 * (5.7e-5), so the two float results differ by up to the sum.  Chunks of
 * <= 8 rows (the kernels' decode matmul path) stay within 1e-4 of the
 * runner; the prefill matmul path (T > 8, other accumulation order)
 * reaches 1.06e-4, so it is held to 1e-4 against the exact forward and to
 * 1.5e-4 against the runner. */
static void test_stories_prefill_logits_first64_within_1e4(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    int32_t ref[NREF];
    assert_int_equal(tu_stories_ref_ids(tu_stories_dir(), ref, NREF), NREF);
    float *ref_lg = tu_stories_ref_logits(tu_stories_dir(),
                                          (size_t)NLOG * VOCAB);
    assert_non_null(ref_lg);
    tu_ref_model *exact = tu_ref_load(tu_stories_dir());
    assert_non_null(exact);
    double *ex = calloc((size_t)NLOG * VOCAB, sizeof(double));
    tu_ref_forward(exact, ref, NLOG, ex);
    rt_model *m = open_stories();
    const uint32_t chunks[] = {1, 7, 8, 64};
    for (size_t c = 0; c < 4; c++) {
        rt_limits L = {.max_batch = 1, .max_seq = 64,
                       .prefill_chunk = chunks[c], .kv_type = KN_KV_F32,
                       .threads = 2};
        rt_session *s;
        mc_error e;
        assert_int_equal(tu_session_create(m, &L, NULL, &s, &e), MC_OK);
        float *lg = calloc(NLOG * VOCAB, sizeof(float));
        rt_prompt pr = {.ids = ref, .n = NLOG};
        float *outs[1] = {lg};
        assert_int_equal(rt_session_logits(s, &pr, 1, outs, &e), MC_OK);
        double worst = 0.0, worst_exact = 0.0;
        for (size_t i = 0; i < (size_t)NLOG * VOCAB; i++) {
            double d = fabs((double)lg[i] - ref_lg[i]);
            if (d > worst)
                worst = d;
            d = fabs((double)lg[i] - ex[i]);
            if (d > worst_exact)
                worst_exact = d;
        }
        printf("stories260k prefill chunk %u: max abs diff %.3g vs the "
               "reference runner, %.3g vs the exact forward\n", chunks[c],
               worst, worst_exact);
        assert_true(worst_exact < 1e-4);
        assert_true(worst < (chunks[c] <= 8 ? 1e-4 : 1.5e-4));
        free(lg);
        rt_session_free(s);
    }
    free(ex);
    tu_ref_free(exact);
    free(ref_lg);
    rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_stories_greedy_from_bos_reproduces_256_reference_ids),
        cmocka_unit_test(test_stories_prefill_logits_first64_within_1e4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

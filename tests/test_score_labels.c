/* test_score_labels.c - labels of several tokens (mcrt_score_label_seqs,
 * rt_session.h rt_labels): each label's score equals, bit for bit, the
 * continuation sum of the same tokens scored alone after the same prompt,
 * in batches larger than max_batch and with prompts split into chunks;
 * the plan check counts the longest label (refused beyond max_seq,
 * truncation makes room); a label of no tokens is refused by status, and
 * the handle stays usable. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "mcrt.h"
#include "testutil.h"

#define MAX_SEQ 48

static mcrt *open_fixture(void)
{
    char *dir = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    mcrt_options o;
    mcrt_options_default(&o);
    o.max_batch = 3;
    o.max_seq = MAX_SEQ;
    o.prefill_chunk = 8; /* prompts and label rows split across steps */
    o.threads = 2;
    /* the harness's backend (tu_backend) */
    mcrt *h = tu_mcrt_open(dir, &o);
    free(dir);
    return h;
}

/* Labels of 1, 3, 2, 5 and 1 tokens (vocab 256). */
static const int32_t L0[] = {17}, L1[] = {3, 200, 45}, L2[] = {99, 12},
                     L3[] = {5, 6, 7, 8, 9}, L4[] = {200};
static const int32_t *const LABELS[] = {L0, L1, L2, L3, L4};
static const size_t LABEL_LENS[] = {1, 3, 2, 5, 1};
#define NL 5

/* The continuation sum of label j after prompt p alone, as a float. */
static float alone(mcrt *h, const int32_t *p, size_t n, size_t j)
{
    float per[8];
    float *pp[1] = {per};
    double sum = 0;
    assert_int_equal(mcrt_score_continuations(h, &p, &n, 1, &LABELS[j],
                                              &LABEL_LENS[j], pp, &sum, 0),
                     0);
    return (float)sum;
}

static void test_multi_token_labels_equal_continuations_scored_alone(
    void **st)
{
    (void)st;
    mcrt *h = open_fixture();
    tu_rng g = {0x5EEDull};
    enum { N = 7 };            /* three waves of max_batch 3 */
    int32_t ids[N][40];
    const int32_t *prompts[N];
    size_t lens[N];
    for (size_t i = 0; i < N; i++) {
        lens[i] = 1 + tu_rng_u32(&g) % 40;
        for (size_t k = 0; k < lens[i]; k++)
            ids[i][k] = (int32_t)(tu_rng_u32(&g) % 256);
        prompts[i] = ids[i];
    }
    float out[N * NL], single[N * 2];
    assert_int_equal(mcrt_score_label_seqs(h, prompts, lens, N, LABELS,
                                           LABEL_LENS, NL, out, 0),
                     0);
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < NL; j++) {
            float want = alone(h, prompts[i], lens[i], j);
            if (memcmp(&want, &out[i * NL + j], sizeof want))
                fail_msg("prompt %zu label %zu: %.9g, alone %.9g", i, j,
                         out[i * NL + j], want);
        }
    /* One-token labels: the same as the single-token entry point. */
    const int32_t one[2] = {17, 200};
    assert_int_equal(mcrt_score_labels(h, prompts, lens, N, one, 2, single,
                                       0),
                     0);
    for (size_t i = 0; i < N; i++) {
        assert_memory_equal(&single[2 * i], &out[i * NL], sizeof(float));
        assert_memory_equal(&single[2 * i + 1], &out[i * NL + 4],
                            sizeof(float));
    }
    mcrt_close(h);
}

static void test_label_plan_check_counts_the_longest_label(void **st)
{
    (void)st;
    mcrt *h = open_fixture();
    int32_t p[MAX_SEQ];
    for (size_t k = 0; k < MAX_SEQ; k++)
        p[k] = (int32_t)(1 + 7 * k % 250);
    const int32_t *pp = p;
    float out[NL];
    /* The 5-token label needs prompt + 5 <= 48. */
    size_t n = MAX_SEQ - 5;
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, LABELS, LABEL_LENS,
                                           NL, out, 0),
                     0);
    n = MAX_SEQ - 4;
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, LABELS, LABEL_LENS,
                                           NL, out, 0),
                     MC_ERR_PLAN);
    assert_non_null(strstr(mcrt_last_error(h), "max_seq 48"));
    /* Truncating left drops the oldest token: the scores of the prompt
     * without it. */
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, LABELS, LABEL_LENS,
                                           NL, out, 1),
                     0);
    const int32_t *p1 = p + 1;
    size_t n1 = n - 1;
    float want[NL];
    assert_int_equal(mcrt_score_label_seqs(h, &p1, &n1, 1, LABELS,
                                           LABEL_LENS, NL, want, 0),
                     0);
    assert_memory_equal(out, want, sizeof want);
    mcrt_close(h);
}

static void test_label_of_no_tokens_is_refused_not_a_crash(void **st)
{
    (void)st;
    mcrt *h = open_fixture();
    const int32_t p[3] = {1, 2, 3};
    const int32_t *pp = p;
    size_t n = 3;
    const int32_t *labels[2] = {L1, L0};
    size_t lens[2] = {3, 0};
    float out[2];
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, labels, lens, 2,
                                           out, 0),
                     MC_ERR_INVALID_ARG);
    assert_non_null(strstr(mcrt_last_error(h), "label 1 has no tokens"));
    const int32_t bad[2] = {3, 256}; /* outside the vocabulary */
    labels[1] = bad;
    lens[1] = 2;
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, labels, lens, 2,
                                           out, 0),
                     MC_ERR_INVALID_ARG);
    /* The handle goes on. */
    lens[1] = 1;
    labels[1] = L0;
    assert_int_equal(mcrt_score_label_seqs(h, &pp, &n, 1, labels, lens, 2,
                                           out, 0),
                     0);
    mcrt_stats s;
    mcrt_get_stats(h, &s);
    assert_int_equal(s.refused_input, 2);
    mcrt_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(
            test_multi_token_labels_equal_continuations_scored_alone),
        cmocka_unit_test(test_label_plan_check_counts_the_longest_label),
        cmocka_unit_test(test_label_of_no_tokens_is_refused_not_a_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

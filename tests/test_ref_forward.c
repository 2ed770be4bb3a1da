/*
 * test_ref_forward.c - the double-precision reference forward pass
 * (tests/helpers/ref_forward.h) checked against an outside implementation:
 * the stories260k reference outputs produced by llama2.c's runner.  Every
 * other numeric test trusts the reference, so it must earn that here.
 */
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
#include "testutil.h"

#define STORIES_STEPS 256   /* greedy_from_bos.ids: BOS + 256 steps */
#define STORIES_LOGIT_ROWS 64

/* Parse whitespace-separated ids from a file into out (up to cap); returns
 * the count, or -1 if the file cannot be read. */
static long read_ids(const char *path, int32_t *out, size_t cap)
{
    char *text = tu_read_file(path, NULL);
    if (!text)
        return -1;
    size_t n = 0;
    char *p = text, *end;
    while (n < cap) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        out[n++] = (int32_t)v;
        p = end;
    }
    free(text);
    return (long)n;
}

/* Read a whole binary file (tu_read_file measures text with strlen). */
static unsigned char *read_bin(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf)
            break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        unsigned char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    *len = n;
    return buf;
}

static tu_ref_model *load_stories(void)
{
    const char *dir = tu_stories_dir();
    tu_ref_model *m = dir ? tu_ref_load(dir) : NULL;
    return m;
}

static void test_ref_forward_reproduces_stories_greedy_ids(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    char *path = tu_fmt("%s/reference/greedy_from_bos.ids", tu_stories_dir());
    int32_t want[STORIES_STEPS + 8];
    long n = read_ids(path, want, STORIES_STEPS + 8);
    free(path);
    assert_int_equal(n, STORIES_STEPS + 1);
    assert_int_equal(want[0], 1);

    tu_ref_model *m = load_stories();
    assert_non_null(m);
    assert_int_equal(tu_ref_vocab(m), 512);
    int32_t got[STORIES_STEPS];
    assert_int_equal(tu_ref_greedy(m, want, 1, STORIES_STEPS, got), 0);
    size_t first_diff = STORIES_STEPS;
    for (size_t i = 0; i < STORIES_STEPS; i++)
        if (got[i] != want[i + 1]) {
            first_diff = i;
            break;
        }
    if (first_diff != STORIES_STEPS)
        printf("first mismatch at step %zu: got %d want %d\n", first_diff,
               got[first_diff], want[first_diff + 1]);
    assert_int_equal(first_diff, STORIES_STEPS);
    tu_ref_free(m);
}

static void test_ref_forward_matches_stories_logits_first64(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    char *ids_path = tu_fmt("%s/reference/greedy_from_bos.ids",
                            tu_stories_dir());
    char *lg_path = tu_fmt("%s/reference/greedy_logits_first64.f32",
                           tu_stories_dir());
    int32_t ids[STORIES_STEPS + 8];
    assert_int_equal(read_ids(ids_path, ids, STORIES_STEPS + 8),
                     STORIES_STEPS + 1);
    size_t len = 0;
    unsigned char *raw = read_bin(lg_path, &len);
    assert_non_null(raw);
    const size_t vocab = 512;
    assert_int_equal(len, STORIES_LOGIT_ROWS * vocab * 4);

    tu_ref_model *m = load_stories();
    assert_non_null(m);
    double *lg = malloc(STORIES_LOGIT_ROWS * vocab * sizeof *lg);
    assert_non_null(lg);
    tu_ref_forward(m, ids, STORIES_LOGIT_ROWS, lg);
    double worst = 0.0;
    size_t worst_at = 0;
    for (size_t i = 0; i < STORIES_LOGIT_ROWS * vocab; i++) {
        float ref;
        memcpy(&ref, raw + 4 * i, 4); /* little-endian host assumed */
        double e = fabs(lg[i] - (double)ref);
        if (!(e <= worst)) {
            worst = e;
            worst_at = i;
        }
    }
    printf("max |ref - llama2.c| over 64x512 logits: %.3g (row %zu)\n", worst,
           worst_at / vocab);
    assert_true(worst < 1e-4);
    free(lg);
    free(raw);
    free(ids_path);
    free(lg_path);
    tu_ref_free(m);
}

/* Feeding a sequence in pieces (KV cache) must give the logits of one full
 * pass: guards the cache indexing every greedy test relies on. */
static void test_ref_forward_incremental_equals_full(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    tu_ref_model *m = load_stories();
    assert_non_null(m);
    const size_t n = 40, v = tu_ref_vocab(m);
    int32_t ids[40];
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 37 + 1) % v);
    double *full = malloc(n * v * sizeof *full);
    double *part = malloc(n * v * sizeof *part);
    assert_non_null(full);
    assert_non_null(part);
    tu_ref_forward(m, ids, n, full);
    tu_ref_cache *c = tu_ref_cache_create(m, n);
    assert_non_null(c);
    assert_int_equal(tu_ref_feed(m, c, ids, 7, part), 0);
    for (size_t i = 7; i < n; i++)
        assert_int_equal(tu_ref_feed(m, c, ids + i, 1, part + i * v), 0);
    assert_int_equal(tu_ref_cache_len(c), n);
    int32_t one = 1;
    assert_int_equal(tu_ref_feed(m, c, &one, 1, NULL), -1); /* full */
    for (size_t i = 0; i < n * v; i++)
        assert_true(fabs(full[i] - part[i]) < 1e-12);
    tu_ref_cache_free(c);
    free(full);
    free(part);
    tu_ref_free(m);
}

/* The reference must fail loudly, not compute garbage, on ids outside the
 * vocabulary. */
static void test_ref_forward_rejects_out_of_range_ids(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    tu_ref_model *m = load_stories();
    assert_non_null(m);
    tu_ref_cache *c = tu_ref_cache_create(m, 4);
    assert_non_null(c);
    int32_t bad[2] = {1, 512};
    assert_int_equal(tu_ref_feed(m, c, bad, 2, NULL), -1);
    bad[1] = -1;
    assert_int_equal(tu_ref_feed(m, c, bad, 2, NULL), -1);
    assert_int_equal(tu_ref_cache_len(c), 0);
    tu_ref_cache_free(c);
    tu_ref_free(m);
}

/* ---- RoPE tables and sliding windows on the generated fixtures --------- */

static tu_ref_model *load_fixture(const char *name)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    tu_ref_model *m = tu_ref_load(dir);
    free(dir);
    assert_non_null(m);
    return m;
}

static void expect_freqs(const char *fixture, size_t seq_len,
                         const double want[8], double want_mult)
{
    tu_ref_model *m = load_fixture(fixture);
    assert_int_equal(tu_ref_config(m)->head_dim, 16);
    double inv[8], mult = 0;
    tu_ref_rope_freqs(m, seq_len, inv, &mult);
    for (size_t i = 0; i < 8; i++) {
        if (fabs(inv[i] - want[i]) > 1e-12 * want[i])
            printf("%s: inv_freq[%zu] = %.17g, want %.17g\n", fixture, i,
                   inv[i], want[i]);
        assert_true(fabs(inv[i] - want[i]) <= 1e-12 * want[i]);
    }
    assert_true(fabs(mult - want_mult) < 1e-12);
    tu_ref_free(m);
}

/* Expected values were computed separately (Python, transcribing
 * transformers' modeling_rope_utils) for head_dim 16, theta 10000. */
static void test_ref_rope_tables_match_transformers_formulas(void **state)
{
    (void)state;
    /* llama3: factor 8, low 1, high 4, original 64: i=0 kept (wavelength
     * 6.3 < 16), i=1,2 blended, i>=3 divided by 8 */
    static const double llama3[8] = {
        1, 0.24438459943539834, 0.013042256043820465, 0.0039528470752104739,
        0.00125, 0.00039528470752104737, 0.000125, 3.9528470752104742e-05};
    expect_freqs("llama3-rope", 1, llama3, 1.0);
    /* yarn: factor 4, original 64 -> ramp over dims [0, 3], attention
     * factor 0.1 ln 4 + 1 */
    static const double yarn[8] = {
        1, 0.23717082451262847, 0.050000000000000003, 0.0079056941504209478,
        0.0025000000000000001, 0.00079056941504209474, 0.00025000000000000001,
        7.9056941504209485e-05};
    expect_freqs("llama-yarn", 1, yarn, 1.138629436111989);
    static const double linear[8] = {
        0.5, 0.15811388300841897, 0.050000000000000003, 0.015811388300841896,
        0.0050000000000000001, 0.0015811388300841895, 0.00050000000000000001,
        0.00015811388300841897};
    expect_freqs("llama-linear", 1, linear, 1.0);
    /* dynamic: default up to max_position (64), NTK base growth after */
    static const double dyn64[8] = {
        1, 0.31622776601683794, 0.10000000000000001, 0.031622776601683791,
        0.01, 0.0031622776601683794, 0.001, 0.00031622776601683794};
    expect_freqs("llama-dynamic", 64, dyn64, 1.0);
    static const double dyn100[8] = {
        1, 0.28394513884825068, 0.080624841875552355, 0.02289303192097197,
        0.0065003651274578205, 0.0018457470786803376, 0.00052409091053464156,
        0.00014881306636086491};
    expect_freqs("llama-dynamic", 100, dyn100, 1.0);
}

/* Mistral fixture: 3 layers, window 16 = the last 16 tokens including the
 * current one.  Token 0 reaches position p only through a chain of hops of
 * at most 15, so positions >= 46 must not depend on it and position 45
 * must.  A window of 17 tokens (j >= i - W) would reach position 48. */
static void test_ref_sliding_window_limits_the_receptive_field(void **state)
{
    (void)state;
    tu_ref_model *m = load_fixture("mistral");
    const size_t n = 50, v = tu_ref_vocab(m);
    int32_t a[50], b[50];
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = (int32_t)((i * 53 + 7) % v);
    b[0] = (a[0] + 100) % (int32_t)v;
    double *la = malloc(n * v * sizeof *la), *lb = malloc(n * v * sizeof *lb);
    assert_non_null(la);
    assert_non_null(lb);
    tu_ref_forward(m, a, n, la);
    tu_ref_forward(m, b, n, lb);
    for (size_t t = 0; t < n; t++) {
        int same = memcmp(la + t * v, lb + t * v, v * sizeof *la) == 0;
        assert_int_equal(same, t >= 46);
    }
    free(la);
    free(lb);
    tu_ref_free(m);

    /* qwen2: layer 0 attends fully (max_window_layers 1), so token 0 still
     * reaches the end of a long sequence. */
    m = load_fixture("qwen2");
    la = malloc(n * v * sizeof *la);
    lb = malloc(n * v * sizeof *lb);
    assert_non_null(la);
    assert_non_null(lb);
    tu_ref_forward(m, a, n, la);
    tu_ref_forward(m, b, n, lb);
    assert_true(memcmp(la + (n - 1) * v, lb + (n - 1) * v, v * sizeof *la));
    free(la);
    free(lb);
    tu_ref_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_forward_reproduces_stories_greedy_ids),
        cmocka_unit_test(test_ref_forward_matches_stories_logits_first64),
        cmocka_unit_test(test_ref_forward_incremental_equals_full),
        cmocka_unit_test(test_ref_forward_rejects_out_of_range_ids),
        cmocka_unit_test(test_ref_rope_tables_match_transformers_formulas),
        cmocka_unit_test(test_ref_sliding_window_limits_the_receptive_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_prefill.c - the prefill kernels (kn_gemm.h, kn_attn_avx2.c) keep the
 * runtime's promise that a sequence gives the same bits alone or in a
 * batch, whatever the thread count: a token's output row of a long step
 * (token panels, row panels, column chunks, ragged edges all crossed)
 * equals the row computed alone in a 1-token step, for every weight
 * format on the float and the integer path; a query row of a tiled
 * attention equals the same row attended alone, for every KV type,
 * window, ring wrap and GQA group; and both stay close to the references. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_ops.h"
#include "kn_qdot.h"
#include "testutil.h"
#include "tmat.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

static const char *wname(kn_wformat f)
{
    static const char *n[] = {"F32", "F16", "BF16", "Q8", "Q4", "Q4S"};
    return (unsigned)f < 6 ? n[f] : "?";
}

/* Y [T][rows] of W and X [T][cols]: the float path, or with q the integer
 * path (activations quantized here, as kn_block does). */
static void product(kn_pool *p, const kn_matrix *W, const float *X, size_t T,
                    float *Y, const float *bias, int q, void *xq)
{
    if (q) {
        kn_qact_quantize(kn_qact_kind_of(W), X, T, W->cols, xq);
        kn_matmul_q(p, W, xq, T, Y, bias);
    } else {
        kn_matmul(p, W, X, T, Y, bias);
    }
}

/* One matrix: every token of a T-token step (1, 2 and 3 threads) has the
 * bits of the same token alone, and the step is close to the reference. */
static void check_rows_alone(const tu_tmat *t, size_t T, int q, kn_pool *p2,
                             kn_pool *p3)
{
    const kn_matrix *W = &t->m;
    size_t rows = W->rows, cols = W->cols;
    float *x = malloc(T * cols * sizeof(float));
    float *bias = malloc(rows * sizeof(float));
    float *alone = malloc(T * rows * sizeof(float));
    float *y = malloc(T * rows * sizeof(float));
    float *ref = malloc(T * rows * sizeof(float));
    void *xq = malloc((size_t)kn_qact_bytes(KN_QACT_I16, T, (uint32_t)cols));
    assert_true(x && bias && alone && y && ref && xq);
    for (size_t i = 0; i < T * cols; i++)
        x[i] = (float)(1 + (i / 32) % 5) * 0.4f * tu_rng_f(&g_rng);
    for (size_t i = 0; i < rows; i++)
        bias[i] = tu_rng_f(&g_rng);
    for (size_t k = 0; k < T; k++)
        product(NULL, W, x + k * cols, 1, alone + k * rows, bias, q, xq);
    kn_pool *pools[3] = {NULL, p2, p3};
    for (int th = 0; th < 3; th++) {
        product(pools[th], W, x, T, y, bias, q, xq);
        for (size_t k = 0; k < T; k++)
            if (memcmp(y + k * rows, alone + k * rows, rows * sizeof(float)))
                fail_msg("%s %s %zux%zu: token %zu of T=%zu differs from the "
                         "token alone (%d threads)", wname(W->fmt),
                         q ? "integer" : "float", rows, cols, k, T, th + 1);
    }
    kn_ref_matmul(W, x, T, ref, bias);
    double e = tu_norm_err(y, ref, T * rows);
    /* the integer path rounds activations to 8 (int4) or 16 (int8) bits */
    double tol = !q ? 1e-5 : W->fmt == KN_W_Q8 ? 1e-4 : 2e-2;
    if (!(e < tol))
        fail_msg("%s %s: normalized error %g vs the reference (tol %g)",
                 wname(W->fmt), q ? "integer" : "float", e, tol);
    free(x), free(bias), free(alone), free(y), free(ref), free(xq);
}

/* check_rows_alone for a random rows x cols matrix of every format, on
 * the float path and, where the format has one, the integer path. */
static void check_rows_alone_all_formats(uint32_t rows, uint32_t cols,
                                         size_t T, kn_pool *p2, kn_pool *p3)
{
    for (int f = 0; f < KN_W_COUNT_; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, rows, cols,
                                 f == KN_W_Q4 ? 64 : 32);
        check_rows_alone(&t, T, 0, p2, p3);
        if (kn_qdot_supported(&t.m))
            check_rows_alone(&t, T, 1, p2, p3);
        tu_tmat_free(&t);
    }
}

static void test_gemm_rows_bit_identical_to_token_alone_all_formats(void **st)
{
    (void)st;
    /* Shapes that cross every tile edge: rows not a multiple of 4 or 8,
     * cols past one 512 block with a ragged tail (and past 64 int blocks
     * with a ragged 32-block), T past the 64/96-token panels with a
     * remainder of 1 or 2 tokens. */
    static const struct { uint32_t rows, cols; size_t T; } sh[] = {
        {13, 1100, 97}, {9, 2100, 130}, {6, 520, 10}, {4, 64, 65},
    };
    kn_pool *p2 = kn_pool_create(2), *p3 = kn_pool_create(3);
    assert_true(p2 && p3);
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        check_rows_alone_all_formats(sh[s].rows, sh[s].cols, sh[s].T, p2, p3);
    kn_pool_free(p2);
    kn_pool_free(p3);
}

/* Decode steps of 2-8 tokens (the float path visits column blocks in the
 * outer loop and tokens in groups of 3): every row equals the token alone,
 * for every format, rows not a multiple of 4, a ragged last column block. */
static void test_decode_rows_bit_identical_to_token_alone_all_formats(void **st)
{
    (void)st;
    static const struct { uint32_t rows, cols; } sh[] = {
        {13, 1100}, {8, 2048}, {6, 520}, {3, 96},
    };
    kn_pool *p2 = kn_pool_create(2), *p3 = kn_pool_create(3);
    assert_true(p2 && p3);
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (size_t T = 2; T <= 8; T++)
            check_rows_alone_all_formats(sh[s].rows, sh[s].cols, T, p2, p3);
    kn_pool_free(p2);
    kn_pool_free(p3);
}

typedef struct mshape { uint32_t rows, cols; } mshape;

/* kn_matmul with AVX-512 against kn_set_no_avx512(1), bit for bit, every
 * weight format, every shape x T, 1 and 2 threads.  1 if it ran, 0 if
 * this machine cannot run the AVX-512 path. */
static int cmp_avx512_avx2(const mshape *sh, size_t nsh, const size_t *Ts,
                           size_t nts, const char *what)
{
    kn_set_no_avx512(0);
    if (!kn_cpu_has_avx512())
        return 0;
    size_t tmax = 0;
    for (size_t k = 0; k < nts; k++)
        tmax = Ts[k] > tmax ? Ts[k] : tmax;
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t s = 0; s < nsh; s++) {
        uint32_t rows = sh[s].rows, cols = sh[s].cols;
        float *x = malloc(tmax * cols * sizeof(float));
        float *bias = malloc(rows * sizeof(float));
        float *y2 = malloc(tmax * rows * sizeof(float));
        float *y5 = malloc(tmax * rows * sizeof(float));
        assert_true(x && bias && y2 && y5);
        for (size_t i = 0; i < tmax * cols; i++)
            x[i] = tu_rng_f(&g_rng);
        for (size_t i = 0; i < rows; i++)
            bias[i] = tu_rng_f(&g_rng);
        for (int f = 0; f < KN_W_COUNT_; f++) {
            tu_tmat t = tu_tmat_make(&g_rng, (kn_wformat)f, rows, cols,
                                     f == KN_W_Q4 ? 64 : 32);
            for (size_t k = 0; k < nts; k++)
                for (int th = 0; th < 2; th++) {
                    kn_set_no_avx512(1);
                    kn_matmul(th ? p2 : NULL, &t.m, x, Ts[k], y2, bias);
                    kn_set_no_avx512(0);
                    kn_matmul(th ? p2 : NULL, &t.m, x, Ts[k], y5, bias);
                    if (memcmp(y2, y5, Ts[k] * rows * sizeof(float)))
                        fail_msg("%s %ux%u T=%zu (%d threads): the AVX-512 "
                                 "%s differs from the AVX2 one", wname(t.m.fmt),
                                 rows, cols, Ts[k], th + 1, what);
                }
            tu_tmat_free(&t);
        }
        free(x), free(bias), free(y2), free(y5);
    }
    kn_pool_free(p2);
    return 1;
}

/* The AVX-512 float GEMM (kn_gemm_avx512.c) against the AVX2 one
 * (kn_set_no_avx512(1)), bit for bit, every weight format: rows that are
 * not a multiple of the 8-row tile (odd ones leave a phantom half row) and
 * that 2 threads split unevenly, columns with a ragged KN_KC block and a
 * scalar tail, T with every remainder of the 6-token tile and past the
 * 128-token panel, and T <= 8 (the decode path).  Without AVX-512 the
 * comparison is skipped, and says so. */
static void test_gemm_avx512_bit_identical_to_avx2_all_formats(void **st)
{
    (void)st;
    static const mshape sh[] = {
        {19, 1100}, {13, 37}, {8, 576}, {1, 520}, {6, 1037}, {33, 64},
    };
    static const size_t Ts[] = {1, 8, 9, 10, 11, 12, 13, 14, 130, 263};
    if (!cmp_avx512_avx2(sh, sizeof sh / sizeof sh[0], Ts, sizeof Ts / sizeof Ts[0], "GEMM"))
        print_message("AVX-512 absent or off (MC_NO_AVX512): the AVX-512 vs "
                      "AVX2 GEMM comparison was skipped\n");
}

/* The AVX-512 2-8-token decode (kn_dec_avx512.c: F32, F16, BF16, Q8; the
 * other formats check that they stay on the AVX2 kernel) against the AVX2
 * one, bit for bit: every T from 1 (AVX2 both ways) to 9 (the GEMM), rows
 * that are not a multiple of the 6-row tile (every remainder 1..5: the
 * short tile repeats its last row in the missing slots) and that 2 threads
 * split unevenly (each half ending in a short tile), columns with a ragged
 * KN_KC block whose length is not a multiple of 32 or 8 (whole 8-groups
 * past the last 32, a scalar tail), shorter than 32 and shorter than 8,
 * and rows of 3 to 8 column blocks (the blocks a row tile walks in order
 * before the next tile). */
static void test_decode_avx512_bit_identical_to_avx2_all_formats(void **st)
{
    (void)st;
    static const mshape sh[] = {
        {19, 1100}, {13, 37}, {5, 1037}, {7, 532}, {1, 520}, {11, 2100},
        {6, 1048}, {4, 64}, {2, 13}, {3, 8}, {29, 1100}, {3, 5},
        {5, 2560}, {9, 3584}, {4, 1536}, {3, 2048}, {7, 4100},
    };
    static const size_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    if (!cmp_avx512_avx2(sh, sizeof sh / sizeof sh[0], Ts, sizeof Ts / sizeof Ts[0], "decode"))
        print_message("AVX-512 absent or off (MC_NO_AVX512): the AVX-512 vs "
                      "AVX2 decode comparison was skipped\n");
}

/* ---- attention ------------------------------------------------------------ */

typedef struct acase {
    kn_kvtype type;
    uint32_t nh, nkv, hd;
    uint64_t cap, window;
    int64_t pos0;
    size_t T;
} acase;

static void fill_kv(kn_kv *kv, const acase *c, int64_t npos, float **kf)
{
    size_t w = (size_t)c->nkv * c->hd;
    size_t es = c->type == KN_KV_F32 ? 4 : c->type == KN_KV_F16 ? 2 : 1;
    memset(kv, 0, sizeof *kv);
    kv->type = c->type;
    kv->n_kv_heads = c->nkv;
    kv->head_dim = c->hd;
    kv->cap = c->cap;
    kv->k = malloc(c->cap * w * es);
    kv->v = malloc(c->cap * w * es);
    if (c->type == KN_KV_I8) {
        kv->k_scale = malloc(c->cap * c->nkv * 4);
        kv->v_scale = malloc(c->cap * c->nkv * 4);
    }
    *kf = malloc(2 * w * sizeof(float));
    assert_true(kv->k && kv->v && *kf);
    for (int64_t p = 0; p < npos; p++) {
        tu_rng_fill(&g_rng, *kf, 2 * w, 2.0f);
        kn_kv_store(kv, p, *kf, *kf + w);
    }
}

/* Each query row of a T-token call (1 and 2 threads) equals the row
 * attended alone at its position; the call is close to kn_ref_attention. */
static void run_acase(const acase *c, kn_pool *p2)
{
    int64_t npos = c->pos0 + (int64_t)c->T;
    kn_kv kv;
    float *kf;
    fill_kv(&kv, c, npos, &kf);
    size_t row = (size_t)c->nh * c->hd, qn = c->T * row;
    float *q = malloc(qn * 4), *o = malloc(qn * 4), *alone = malloc(qn * 4);
    float *ref = malloc(qn * 4);
    float *scr = malloc(kn_attention_scratch_floats(2, (uint64_t)npos, c->hd) * 4);
    assert_true(q && o && alone && ref && scr);
    tu_rng_fill(&g_rng, q, qn, 1.0f);
    for (size_t t = 0; t < c->T; t++)
        kn_attention(NULL, &kv, q + t * row, 1, c->nh, c->pos0 + (int64_t)t,
                     c->window, alone + t * row, scr);
    for (int th = 0; th < 2; th++) {
        kn_attention(th ? p2 : NULL, &kv, q, c->T, c->nh, c->pos0, c->window,
                     o, scr);
        for (size_t t = 0; t < c->T; t++)
            if (memcmp(o + t * row, alone + t * row, row * sizeof(float)))
                fail_msg("attention kv %d nh %u nkv %u hd %u pos0 %lld T %zu "
                         "win %llu: token %zu differs from the token alone "
                         "(%d threads)", c->type, c->nh, c->nkv, c->hd,
                         (long long)c->pos0, c->T,
                         (unsigned long long)c->window, t, th + 1);
    }
    kn_ref_attention(&kv, q, c->T, c->nh, c->pos0, c->window, ref, scr);
    double e = tu_norm_err(o, ref, qn);
    if (!(e < 1e-5))
        fail_msg("attention kv %d T %zu: normalized error %g vs the reference",
                 c->type, c->T, e);
    free(q), free(o), free(alone), free(ref), free(scr), free(kf);
    free(kv.k), free(kv.v), free(kv.k_scale), free(kv.v_scale);
}

static void test_attention_rows_bit_identical_alone_or_in_tiles(void **st)
{
    (void)st;
    /* type, heads, kv heads, head_dim, ring slots, window, pos0, T; a
     * windowed ring holds window + T - 1 slots (kn_block.h) */
    const acase cs[] = {
        {KN_KV_F32, 32, 4, 64, 300, 0, 0, 150},   /* TinyLlama heads, 8:1 */
        {KN_KV_F16, 9, 3, 64, 110, 37, 0, 70},    /* SmolLM heads, window */
        {KN_KV_I8, 4, 4, 16, 100, 0, 0, 45},      /* MHA, int8 cache */
        {KN_KV_F16, 8, 2, 13, 24, 5, 20, 12},     /* odd head_dim, ring wrap */
        {KN_KV_F32, 4, 1, 128, 96, 0, 40, 33},    /* head_dim 128, 4:1 */
        {KN_KV_F16, 6, 2, 64, 50, 33, 90, 17},    /* ring wrapped twice */
        {KN_KV_I8, 32, 4, 64, 40, 0, 39, 1},      /* decode */
    };
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_acase(&cs[i], p2);
    kn_pool_free(p2);
}

/* Cases for the row blocking of kn_attn_avx2.c / kn_attn_avx512.c (2 and 4
 * and 8 rows per register tile): groups 1, 3, 5, 7, 8, whose full tiles
 * hold 64, 63, 60, 63, 64 rows and whose last tiles 2 .. 49 rows (every
 * remainder modulo 2, 4 and 8 occurs), decode tiles of 3 and 8 rows;
 * prompts that start mid-block and end on and off a block edge, so the
 * diagonal blocks give runs of rows with different lanes; windows (rows
 * of one tile starting in different blocks); every KV type; head_dim 64
 * and 16 (sqrt a power of two), 13 (a scalar tail), 40 and 128. */
static const acase g_blocking_cases[] = {
    {KN_KV_F16, 9, 3, 64, 300, 0, 0, 131},    /* SmolLM heads */
    {KN_KV_F32, 32, 4, 64, 300, 0, 5, 67},    /* TinyLlama heads */
    {KN_KV_I8, 7, 1, 64, 200, 0, 3, 70},      /* 7:1, int8 */
    {KN_KV_F16, 10, 2, 40, 200, 0, 31, 26},   /* 5:1, head_dim 40 */
    {KN_KV_F32, 3, 3, 13, 200, 0, 0, 66},     /* MHA: 64 + 2 rows */
    {KN_KV_I8, 2, 2, 16, 200, 0, 17, 95},     /* head_dim 16 */
    {KN_KV_F16, 9, 3, 64, 90, 23, 40, 50},    /* window, ring */
    {KN_KV_F32, 8, 1, 128, 120, 45, 7, 70},   /* window 45, 8 rows/token */
    {KN_KV_I8, 9, 3, 64, 100, 0, 64, 1},      /* decode on a block edge */
    {KN_KV_F16, 32, 4, 64, 100, 0, 95, 1},    /* decode at a block's end */
    {KN_KV_F32, 5, 1, 13, 80, 9, 30, 2},      /* 5 rows per token, window */
};

static void test_attention_row_blocking_rows_alone_or_in_tiles(void **st)
{
    (void)st;
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (int avx512 = 0; avx512 < 2; avx512++) {
        kn_set_no_avx512(!avx512);
        for (size_t i = 0; i < sizeof g_blocking_cases / sizeof g_blocking_cases[0]; i++)
            run_acase(&g_blocking_cases[i], p2);
    }
    kn_set_no_avx512(0);
    kn_pool_free(p2);
}

/* The AVX-512 block step of the tiled attention gives the AVX2 one's bits,
 * 1 and 2 threads, over g_blocking_cases and the tile cases above.
 * Without AVX-512 the comparison is skipped, and says so. */
static void test_attention_avx512_bit_identical_to_avx2(void **st)
{
    (void)st;
    kn_set_no_avx512(0);
    if (!kn_cpu_has_avx512()) {
        print_message("AVX-512 absent or off (MC_NO_AVX512): the AVX-512 vs "
                      "AVX2 attention comparison was skipped\n");
        return;
    }
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t i = 0; i < sizeof g_blocking_cases / sizeof g_blocking_cases[0]; i++) {
        const acase *c = &g_blocking_cases[i];
        int64_t npos = c->pos0 + (int64_t)c->T;
        kn_kv kv;
        float *kf;
        fill_kv(&kv, c, npos, &kf);
        size_t qn = c->T * c->nh * c->hd;
        float *q = malloc(qn * 4), *o2 = malloc(qn * 4), *o5 = malloc(qn * 4);
        float *scr = malloc(kn_attention_scratch_floats(2, (uint64_t)npos, c->hd) * 4);
        assert_true(q && o2 && o5 && scr);
        tu_rng_fill(&g_rng, q, qn, 1.0f);
        for (int th = 0; th < 2; th++) {
            kn_set_no_avx512(1);
            kn_attention(th ? p2 : NULL, &kv, q, c->T, c->nh, c->pos0, c->window, o2, scr);
            kn_set_no_avx512(0);
            kn_attention(th ? p2 : NULL, &kv, q, c->T, c->nh, c->pos0, c->window, o5, scr);
            if (memcmp(o2, o5, qn * sizeof(float)))
                fail_msg("attention kv %d nh %u nkv %u hd %u pos0 %lld T %zu win %llu "
                         "(%d threads): the AVX-512 path differs from the AVX2 one",
                         c->type, c->nh, c->nkv, c->hd, (long long)c->pos0, c->T,
                         (unsigned long long)c->window, th + 1);
        }
        free(q), free(o2), free(o5), free(scr), free(kf);
        free(kv.k), free(kv.v), free(kv.k_scale), free(kv.v_scale);
    }
    kn_pool_free(p2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_rows_bit_identical_to_token_alone_all_formats),
        cmocka_unit_test(test_decode_rows_bit_identical_to_token_alone_all_formats),
        cmocka_unit_test(test_gemm_avx512_bit_identical_to_avx2_all_formats),
        cmocka_unit_test(test_decode_avx512_bit_identical_to_avx2_all_formats),
        cmocka_unit_test(test_attention_rows_bit_identical_alone_or_in_tiles),
        cmocka_unit_test(test_attention_row_blocking_rows_alone_or_in_tiles),
        cmocka_unit_test(test_attention_avx512_bit_identical_to_avx2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_qdot.c - the integer dot products (kn_qdot.h): the AVX2 path equals
 * the scalar reference bit for bit (quantization and product, every int
 * format and group, ragged rows, 1-3 threads); a token's row does not
 * depend on T; known values; the product stays close to the float path;
 * and on stories260k the logits move far less than the weight
 * quantization itself moves them (KL divergence). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_eval.h"
#include "fmt_dtype.h"
#include "kn_qdot.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"
#include "stories_ref.h"
#include "testutil.h"
#include "tmat.h"

static tu_rng g_rng = {0x2545f4914f6cdd1dull};

static const char *fmt_name(kn_wformat f)
{
    return f == KN_W_Q8 ? "Q8" : f == KN_W_Q4 ? "Q4" : "Q4S";
}

/* T rows of cols activations, amplitude varying by block (as real
 * activations do), some exact zeros and an all-zero block. */
static float *make_x(size_t T, uint32_t cols)
{
    float *x = malloc(T * cols * sizeof(float) + 4);
    assert_non_null(x);
    for (size_t i = 0; i < T * cols; i++) {
        float amp = (float)(1 + (i / 32) % 7) * 0.3f;
        x[i] = (i % 29 == 0) ? 0.0f : amp * tu_rng_f(&g_rng);
    }
    if (cols >= 64)
        memset(x + 32, 0, 32 * sizeof(float));
    return x;
}

static void test_qact_avx2_matches_reference_bytes(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    static const uint32_t colss[] = {1, 31, 32, 33, 64, 172, 2048, 5632};
    for (size_t c = 0; c < sizeof colss / sizeof colss[0]; c++)
    for (int k = 0; k < 2; k++) {
        size_t T = 3;
        float *x = make_x(T, colss[c]);
        size_t n = (size_t)kn_qact_bytes((kn_qact_kind)k, T, colss[c]);
        uint8_t *a = malloc(n), *b = malloc(n);
        assert_true(a && b);
        kn_qact_quantize((kn_qact_kind)k, x, T, colss[c], a);
        kn_ref_qact_quantize((kn_qact_kind)k, x, T, colss[c], b);
        if (memcmp(a, b, n) != 0)
            fail_msg("quantized activations (kind %d) differ at cols %u", k,
                     colss[c]);
        free(x);
        free(a);
        free(b);
    }
}

/* The pooled quantization (a prefill's) writes the one-thread bytes,
 * split or not (T x cols below and above KN_POOL_MIN_VALUES), with 1, 2
 * and 3 threads and without a pool. */
static void test_qact_pool_matches_one_thread_bytes(void **state)
{
    (void)state;
    static const struct { size_t T; uint32_t cols; } shapes[] = {
        {1, 2048}, {9, 33}, {16, 5632}, {300, 576}, {97, 1000}};
    for (int th = 0; th <= 3; th++) {
        kn_pool *pool = th ? kn_pool_create(th) : NULL;
        assert_true(!th || pool);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 2; k++) {
            size_t T = shapes[s].T;
            uint32_t cols = shapes[s].cols;
            float *x = make_x(T, cols);
            size_t n = (size_t)kn_qact_bytes((kn_qact_kind)k, T, cols);
            uint8_t *a = malloc(n), *b = malloc(n);
            assert_true(a && b);
            memset(a, 0xa5, n);
            kn_qact_quantize_pool(pool, (kn_qact_kind)k, x, T, cols, a);
            kn_qact_quantize((kn_qact_kind)k, x, T, cols, b);
            if (memcmp(a, b, n) != 0)
                fail_msg("pooled quantization (kind %d, %d threads) differs "
                         "at T %zu cols %u", k, th, T, cols);
            free(x);
            free(a);
            free(b);
        }
        kn_pool_free(pool);
    }
}

static void test_qact_known_values(void **state)
{
    (void)state;
    /* max |x| = 2.54: d = 0.02, q = x / 0.02 rounded half to even. */
    float x[33] = {2.54f, -2.54f, 0.01f, 0.03f, -0.05f, 1.0f};
    x[32] = -4.0f; /* block 2 of 1 value: d = 4/127, q = -127 */
    int8_t buf[2 * 36];
    kn_ref_qact_quantize(KN_QACT_I8, x, 1, 33, buf);
    const float *d = (const float *)(buf + 64);
    assert_true(d[0] == 2.54f / 127.0f);
    /* nibble order: column 2i at position i, column 2i + 1 at 16 + i */
    assert_int_equal(buf[0], 127);
    assert_int_equal(buf[16], -127);
    assert_int_equal(buf[1], 0);    /* 0.5 -> 0 (even) */
    assert_int_equal(buf[17], 2);   /* 1.5 -> 2 (even) */
    assert_int_equal(buf[2], -2);   /* -2.5 -> -2 (even) */
    assert_int_equal(buf[18], 50);
    assert_int_equal(buf[3], 0);
    assert_int_equal(buf[32], -127);
    for (int i = 33; i < 64; i++) /* the padding of the ragged block */
        assert_int_equal(buf[i], 0);
    assert_true(d[1] == 4.0f / 127.0f);
    /* int16: d = 2.54 / 32767; 1.0 -> 12900.39 -> 12900 */
    int16_t b16[2 * 34];
    kn_ref_qact_quantize(KN_QACT_I16, x, 1, 33, b16);
    const float *d16 = (const float *)(b16 + 64);
    assert_true(d16[0] == 2.54f / 32767.0f);
    assert_int_equal(b16[0], 32767);
    assert_int_equal(b16[1], -32767);
    assert_int_equal(b16[5], (int)nearbyintf(1.0f * (1.0f / d16[0])));
    assert_int_equal(b16[32], -32767);
}

/* kn_matmul_q (current force-scalar setting, pool p) against the
 * reference for one matrix and T tokens: bit-identical. */
static void check_bits(kn_pool *p, const tu_tmat *t, size_t T)
{
    const kn_matrix *W = &t->m;
    float *x = make_x(T, W->cols);
    kn_qact_kind k = kn_qact_kind_of(W);
    void *xq = malloc((size_t)kn_qact_bytes(k, T, W->cols));
    float *y = malloc(T * W->rows * sizeof(float));
    float *r = malloc(T * W->rows * sizeof(float));
    float *bias = malloc(W->rows * sizeof(float));
    assert_true(xq && y && r && bias);
    tu_rng_fill(&g_rng, bias, W->rows, 1.0f);
    kn_ref_qact_quantize(k, x, T, W->cols, xq);
    for (int b = 0; b < 2; b++) {
        for (size_t i = 0; i < T * W->rows; i++)
            y[i] = NAN; /* the op must write every output */
        kn_ref_matmul_q(W, xq, T, r, b ? bias : NULL);
        kn_matmul_q(p, W, xq, T, y, b ? bias : NULL);
        if (memcmp(y, r, T * W->rows * sizeof(float)) != 0)
            fail_msg("%s %ux%u g%u T=%zu threads=%d scalar=%d bias=%d: not "
                     "bit-identical to the reference", fmt_name(W->fmt),
                     W->rows, W->cols, W->group, T, kn_pool_threads(p),
                     kn_force_scalar(), b);
    }
    free(x);
    free(xq);
    free(y);
    free(r);
    free(bias);
}

/* The prefill GEMM (kn_gemm.h) in shapes that cross every one of its
 * tiling boundaries: rows not a multiple of the 4-row panel, two column
 * panels of 64 blocks the second of which is not a multiple of 8 blocks
 * (the scale table's scalar tail), a ragged last block, and T over two
 * token panels of 64 with a 1-token tile left; 1 and 3 threads. */
static void test_qdot_gemm_panel_boundaries_bit_identical(void **state)
{
    (void)state;
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    kn_pool *p3 = kn_pool_create(3);
    assert_non_null(p3);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 64u); g *= 2) {
            tu_tmat t = tu_tmat_make(&g_rng, fmts[f], 11, 32 * 77 + 5, g);
            for (int off = 0; off < 2; off++) { /* AVX-512 (if any), AVX2 */
                kn_set_no_avx512(off);
                check_bits(NULL, &t, 131);
                check_bits(p3, &t, 131);
            }
            kn_set_no_avx512(0);
            tu_tmat_free(&t);
        }
    kn_pool_free(p3);
}

/* The AVX-512 prefill GEMM (kn_qgemm_avx512.c) across its own tiling:
 * 16-row groups with a short last one, column panels of 32 (int4) and 16
 * (int8) blocks with a ragged last block, the token panel shrunk for a
 * wide matrix (its table has room for fewer than 64 tokens) with short
 * last tiles, and the scalar path of a matrix too wide for the table
 * (cols > 65536). */
static void test_qdot_avx512_gemm_tiles_bit_identical(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx512(), "CPU lacks AVX-512 F/BW/DQ/VL/VNNI: "
                                     "the AVX-512 kernels are not compared");
    static const uint32_t shapes[][3] = { /* rows, cols, T */
        {37, 32 * 33 + 7, 77}, {16, 32 * 300 + 31, 131}, {18, 9000, 67},
        {3, 65536 + 40, 9},
    };
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t f = 0; f < 3; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tu_tmat t = tu_tmat_make(&g_rng, fmts[f], shapes[s][0], shapes[s][1],
                                     fmts[f] == KN_W_Q8 ? 32 : 64);
            check_bits(NULL, &t, shapes[s][2]);
            check_bits(p2, &t, shapes[s][2]);
            tu_tmat_free(&t);
        }
    kn_pool_free(p2);
}

/* The AVX2 GEMM's own boundaries (kn_gemm_avx2.c): rows over its
 * 64-row accumulator groups (75 = 64 + 8 + 3, 130) and ragged 8-row
 * panels, column panels of 32 blocks with a block-sum tail that is not a
 * multiple of 8 blocks (33 + 1, 77 + 1) and a ragged last block, token
 * tiles of 4 with every remainder (65, 66, 131, 10), groups up to 128,
 * 1 and 3 threads; AVX-512 off.  The half of the test above that runs
 * the AVX2 path, on more shapes. */
static void test_qdot_avx2_gemm_panel_boundaries_bit_identical(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    static const uint32_t shapes[][2] = {
        {11, 32 * 77 + 5}, {75, 32 * 33 + 17}, {130, 64}, {9, 31},
    };
    static const size_t Ts[] = {131, 65, 66, 10};
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    kn_pool *p3 = kn_pool_create(3);
    assert_non_null(p3);
    kn_set_no_avx512(1);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 128u); g *= 2)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tu_tmat t = tu_tmat_make(&g_rng, fmts[f], shapes[s][0], shapes[s][1], g);
                for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                    check_bits(NULL, &t, Ts[i]);
                    if (i == 0)
                        check_bits(p3, &t, Ts[i]);
                }
                tu_tmat_free(&t);
            }
    kn_set_no_avx512(0);
    kn_pool_free(p3);
}

/* Every format, group and shape above against the reference, with the
 * token counts of one side of KN_GEMM_MIN_T: gemm = 0 the decode kernels
 * (T = 1..8), gemm = 1 the prefill GEMM (T = 9, 17). */
static void run_bits_suite(int scalar, int gemm)
{
    static const uint32_t shapes[][2] = {
        {5, 172}, {37, 300}, {64, 64}, {9, 33}, {3, 1}, {130, 256}, {17, 96},
        {6, 576}, {9, 2048}, /* several 8-block batches of the int4
                                batch-1 kernel's parameters, and a tail */
    };
    static const size_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    size_t ti0 = gemm ? 8 : 0, ti1 = gemm ? 10 : 8;
    kn_pool *p2 = kn_pool_create(2), *p3 = kn_pool_create(3);
    assert_true(p2 && p3);
    kn_set_force_scalar(scalar);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 128u); g *= 2)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tu_tmat t = tu_tmat_make(&g_rng, fmts[f], shapes[s][0],
                                         shapes[s][1], g);
                for (size_t ti = ti0; ti < ti1; ti++) {
                    check_bits(NULL, &t, Ts[ti]);
                    check_bits(p2, &t, Ts[ti]);
                    check_bits(p3, &t, Ts[ti]);
                }
                tu_tmat_free(&t);
            }
    kn_set_force_scalar(0);
    kn_pool_free(p2);
    kn_pool_free(p3);
}

static void test_qdot_avx2_decode_bit_identical_to_reference(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    kn_set_no_avx512(1);
    run_bits_suite(0, 0);
}

static void test_qdot_avx2_gemm_bit_identical_to_reference(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    kn_set_no_avx512(1);
    run_bits_suite(0, 1);
}

/* The AVX2 decode (kn_qdot_avx2.c) where its own boundaries lie: rows in
 * passes of 8 (13 and 20 rows: a last pass moved back over its
 * neighbour's rows, thread ranges of 4 and 8), chunks of 64 blocks for
 * the transposed scales (600 blocks: several chunks and a short one, 600
 * groups of 32 then 300 of 64), the x sums of the whole call (T * 600 <=
 * 4096, T <= 6) or of each chunk (T = 7, 8), sub-chunks of 16 blocks for
 * T > 2, and a ragged last block; 1-3 threads. */
static void test_qdot_avx2_decode_chunks_bit_identical(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    static const uint32_t rows[] = {13, 20};
    kn_pool *p2 = kn_pool_create(2), *p3 = kn_pool_create(3);
    assert_true(p2 && p3);
    kn_set_no_avx512(1);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 64u); g *= 2)
            for (size_t r = 0; r < 2; r++) {
                tu_tmat t = tu_tmat_make(&g_rng, fmts[f], rows[r], 32 * 599 + 7, g);
                for (size_t T = 1; T <= 8; T++) {
                    check_bits(NULL, &t, T);
                    check_bits(r ? p3 : p2, &t, T);
                }
                tu_tmat_free(&t);
            }
    kn_set_no_avx512(0);
    kn_pool_free(p2);
    kn_pool_free(p3);
}

static void test_qdot_avx512_decode_bit_identical_to_reference(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx512(), "CPU lacks AVX-512 F/BW/DQ/VL/VNNI: "
                                     "the AVX-512 kernels are not compared");
    run_bits_suite(0, 0);
}

static void test_qdot_avx512_gemm_bit_identical_to_reference(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx512(), "CPU lacks AVX-512 F/BW/DQ/VL/VNNI: "
                                     "the AVX-512 kernels are not compared");
    run_bits_suite(0, 1);
}

/* The AVX-512 integer decode (kn_qdec_avx512.c) alone, in the cases it
 * serves (full blocks, T = 1..8, every int format), so it is
 * checked apart from the AVX2 decode that takes the rest: row counts
 * around its 8-row passes (a short last pass reads its last row again
 * and stores only its own), groups of 32..256 (one group wider than the
 * row), and 9 or 17 groups (its scale tables come 8 groups at a time,
 * the last one short); 1 and 3 threads (row ranges of multiples of 4:
 * 9 rows x 4096 give one thread rows [0, 4), whose pass must not start
 * before row 0; the split only happens past 2^17 multiply-adds). */
static void test_qdot_avx512_int_decode_passes_bit_identical(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx512(), "CPU lacks AVX-512 F/BW/DQ/VL/VNNI");
    static const uint32_t shapes[][2] = {
        {1, 32}, {7, 96}, {8, 288}, {9, 256}, {17, 544}, {27, 1024}, {4, 64},
        {9, 4096}, {13, 4096}, {6, 8192}, {9, 16384}, /* Q4S past 2048
                                    token-blocks: the activation-sum table */
    };
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    kn_pool *p3 = kn_pool_create(3);
    assert_non_null(p3);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 256u); g *= 2)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tu_tmat t = tu_tmat_make(&g_rng, fmts[f], shapes[s][0],
                                         shapes[s][1], g);
                for (size_t T = 1; T <= 8; T++) {
                    check_bits(NULL, &t, T);
                    check_bits(p3, &t, T);
                }
                tu_tmat_free(&t);
            }
    kn_pool_free(p3);
}

static void test_qdot_scalar_bit_identical_to_reference(void **state)
{
    (void)state;
    run_bits_suite(1, 0);
    run_bits_suite(1, 1);
}

/* A failed test longjmps out before it restores the switches: restore
 * them here, so that one failure does not skip or fail the next test. */
/* The AVX-512 decode kernels (kn_qdec_avx512.c: int4 batch 1 in passes
 * of 8 rows, 2-4 tokens in passes of 4 rows with a table of s_b, 5-8 in
 * pairs of rows with the same table; int8 2-4 tokens in passes of 4 rows,
 * 5-8 in pairs, leftover rows alone) against the AVX2 ones, bit for bit:
 * rows that leave every remainder of those passes (1..7), rows of 1, 2,
 * 8, 9, 13, 17 and 18 blocks (a batch of 8 blocks, ragged batches of 1,
 * 2 and 5 after full ones, filled with masked loads), a ragged
 * last block (the AVX2 path on both sides), groups 32..128 (int8: its
 * row scale), T = 1..12 (the GEMM from 9), 1 and 2 threads. */
static void test_qdot_decode_avx512_matches_avx2(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx512(), "CPU lacks AVX-512 F/BW/DQ/VL/VNNI: "
                                     "the AVX-512 decode is not compared");
    static const uint32_t shapes[][2] = {
        {15, 32 * 17}, {23, 32 * 9}, {7, 32 * 8}, {9, 32}, {2, 64}, {1, 32 * 9},
        {12, 32 * 17 + 7}, {5, 32 * 18}, {3, 32 * 13},
    };
    static const kn_wformat fmts[] = {KN_W_Q4, KN_W_Q4S, KN_W_Q8};
    enum { TMAX = 12 };
    kn_pool *p2 = kn_pool_create(2);
    assert_non_null(p2);
    for (size_t f = 0; f < 3; f++)
        for (uint32_t g = 32; g <= (fmts[f] == KN_W_Q8 ? 32u : 128u); g *= 2)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                tu_tmat t = tu_tmat_make(&g_rng, fmts[f], shapes[s][0], shapes[s][1], g);
                const kn_matrix *W = &t.m;
                float *x = make_x(TMAX, W->cols);
                kn_qact_kind k = kn_qact_kind_of(W);
                void *xq = malloc((size_t)kn_qact_bytes(k, TMAX, W->cols));
                float *y[2];
                y[0] = malloc(TMAX * W->rows * sizeof(float));
                y[1] = malloc(TMAX * W->rows * sizeof(float));
                assert_true(x && xq && y[0] && y[1]);
                for (size_t T = 1; T <= TMAX; T++) {
                    kn_qact_quantize(k, x, T, W->cols, xq);
                    for (int th = 0; th < 2; th++) {
                        for (int off = 0; off < 2; off++) {
                            kn_set_no_avx512(off);
                            memset(y[off], 0, T * W->rows * sizeof(float));
                            kn_matmul_q(th ? p2 : NULL, W, xq, T, y[off], NULL);
                        }
                        kn_set_no_avx512(0);
                        if (memcmp(y[0], y[1], T * W->rows * sizeof(float)) != 0)
                            fail_msg("%s %ux%u g%u T=%zu threads=%d: AVX-512 and "
                                     "AVX2 differ", fmt_name(W->fmt), W->rows,
                                     W->cols, g, T, th ? 2 : 1);
                    }
                }
                free(x);
                free(xq);
                free(y[0]);
                free(y[1]);
                tu_tmat_free(&t);
            }
    kn_pool_free(p2);
}

/* Extreme codes: Q8 -127/127 and -128 (a file may hold it) against
 * activations of +-32767, where lane sums come closest to 2^24. */
static void test_qdot_extreme_codes_exact(void **state)
{
    (void)state;
    enum { COLS = 64, T = 12 };
    int8_t q[2 * COLS];
    float sc[2] = {1.0f, 1.0f};
    for (int i = 0; i < COLS; i++) {
        q[i] = (int8_t)(i & 1 ? -127 : 127);
        q[COLS + i] = -128;
    }
    kn_matrix m = {KN_W_Q8, 2, COLS, q, sc, NULL, 0, KN_LAYOUT_ROWS};
    float x[T * COLS];
    for (int i = 0; i < T * COLS; i++)
        x[i] = i & 1 ? -1.0f : 1.0f; /* q = +-32767, d = 1/32767 */
    int16_t xq[T * 2 * 34];
    /* T = 1: the decode kernels; T = 12: the GEMM; each on every SIMD path */
    for (int off = 0; off < 2; off++)
        for (size_t n = 1; n <= T; n += T - 1) {
            kn_set_no_avx512(off);
            kn_qact_quantize(KN_QACT_I16, x, n, COLS, xq); /* d after n rows */
            float y[2 * T], r[2 * T];
            kn_matmul_q(NULL, &m, xq, n, y, NULL);
            kn_ref_matmul_q(&m, xq, n, r, NULL);
            /* row 0: 64 * 127 * 32767 / 32767; row 1: 0 (the +-32767 cancel) */
            assert_float_equal(y[0], 64.0f * 127.0f, 1e-2);
            assert_float_equal(y[1], 0.0f, 0);
            assert_memory_equal(y, r, 2 * n * sizeof y[0]);
        }
    kn_set_no_avx512(0);
}

/* Int4 extremes: codes 15 against zero 0 and codes 0 against zero 15,
 * every activation at +127 or at -128 (the code a non-finite input
 * gets), over 16 blocks of group 32: the batch-1 kernel's A - zero * S
 * must stay exact where |lane| is largest (4 * 15 * 128). */
static void test_qdot_int4_extreme_codes_exact(void **state)
{
    (void)state;
    enum { ROWS = 8, COLS = 512, NG = COLS / 32, T = 12 };
    uint8_t q[ROWS * COLS / 2], z[ROWS * NG];
    uint16_t sc[ROWS * NG];
    for (int r = 0; r < ROWS; r++) {
        memset(q + r * COLS / 2, r & 1 ? 0x00 : 0xff, COLS / 2);
        memset(z + r * NG, r & 1 ? 15 : 0, NG);
        for (int g = 0; g < NG; g++)
            sc[r * NG + g] = 0x3c00; /* 1.0 */
    }
    kn_matrix m = {KN_W_Q4, ROWS, COLS, q, sc, z, 32, KN_LAYOUT_ROWS};
    static int8_t xq[T * (COLS + NG * 4)];
    /* T = 1: the decode kernels; T = 12: the GEMM; each SIMD path.  -128
     * only at T = 1: it is the code of a non-finite input, whose block
     * scale is then non-finite too, and the AVX2 GEMM's sign trick (and
     * the T = 2..8 kernel's) negates it to -128 again: only the batch-1
     * kernel and the AVX-512 GEMM (which biases it to 0) are exact there.
     * -127 is the most negative code a finite input gets. */
    for (int off = 0; off < 2; off++)
        for (size_t n = 1; n <= T; n += T - 1)
            for (int sign = 0; sign < 2; sign++) {
                kn_set_no_avx512(off);
                int lo = n == 1 ? -128 : -127;
                memset(xq, sign ? lo & 0xff : 0x7f, n * COLS);
                float *d = (float *)(xq + n * COLS);   /* the scales follow */
                for (size_t b = 0; b < n * NG; b++)
                    d[b] = 1.0f;
                float y[ROWS * T], r[ROWS * T];
                kn_matmul_q(NULL, &m, xq, n, y, NULL);
                kn_ref_matmul_q(&m, xq, n, r, NULL);
                float want = 15.0f * (float)(sign ? lo : 127) * COLS;
                for (size_t i = 0; i < ROWS * n; i++) {
                    if (memcmp(&y[i], &r[i], sizeof y[i]))
                        fail_msg("avx512 off %d, T %zu, output %zu: %g, the "
                                 "reference %g", off, n, i, y[i], r[i]);
                    assert_true(y[i] == (i & 1 ? -want : want));
                }
            }
    kn_set_no_avx512(0);
}

/* The AVX2 GEMM multiplies the unsigned codes by the signed activations
 * and subtracts zero x (block sum): exact for every code, the -128 of a
 * non-finite input too (the extreme test above keeps -128 at T = 1, as
 * the T = 2..8 kernel's sign trick is not exact there).  Q4 and Q4S, the
 * largest |i_b| (15 x 128 x 32 per block), T = 12, AVX-512 off. */
static void test_qdot_avx2_gemm_int4_code_minus128_exact(void **state)
{
    (void)state;
    TU_SKIP_IF(!kn_cpu_has_avx2(), "CPU lacks AVX2/FMA/F16C");
    enum { ROWS = 18, COLS = 256, NG = COLS / 32, T = 12 };
    uint8_t q[ROWS * COLS / 2], z[ROWS * NG];
    uint16_t sc[ROWS * NG];
    for (int r = 0; r < ROWS; r++) {
        memset(q + r * COLS / 2, r & 1 ? 0x00 : 0xff, COLS / 2);
        memset(z + r * NG, r & 1 ? 15 : 0, NG);
        for (int g = 0; g < NG; g++)
            sc[r * NG + g] = 0x3c00; /* 1.0 */
    }
    static int8_t xq[T * (COLS + NG * 4)];
    memset(xq, 0x80, T * COLS);
    float *d = (float *)(xq + T * COLS);
    for (size_t b = 0; b < T * NG; b++)
        d[b] = 1.0f;
    kn_set_no_avx512(1);
    for (int f = KN_W_Q4; f <= KN_W_Q4S; f++) {
        kn_matrix m = {(kn_wformat)f, ROWS, COLS, q, sc, z, 32, KN_LAYOUT_ROWS};
        float y[ROWS * T], r[ROWS * T];
        kn_matmul_q(NULL, &m, xq, T, y, NULL);
        kn_ref_matmul_q(&m, xq, T, r, NULL);
        for (size_t i = 0; i < ROWS * T; i++) {
            /* Q4: +-15 per code; Q4S: codes 15 and 0 are 7 and -8 */
            float w = f == KN_W_Q4 ? ((i % ROWS) & 1 ? -15.0f : 15.0f)
                                   : ((i % ROWS) & 1 ? -8.0f : 7.0f);
            if (memcmp(&y[i], &r[i], sizeof y[i]))
                fail_msg("%s output %zu: %g, the reference %g",
                         fmt_name((kn_wformat)f), i, y[i], r[i]);
            assert_true(y[i] == w * -128.0f * COLS);
        }
    }
    kn_set_no_avx512(0);
}

/* The kernels find a block's group by a shift: a group that is a multiple
 * of 32 but not a power of two (96, 160) must go to the float path, not
 * get the scales of the wrong group. */
static void test_qdot_refuses_groups_that_are_not_powers_of_two(void **state)
{
    (void)state;
    static const uint32_t ok[] = {32, 64, 128, 256, 4096};
    static const uint32_t no[] = {16, 48, 96, 160, 192, 4064};
    for (int f = KN_W_Q4; f <= KN_W_Q4S; f++) {
        for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
            kn_matrix m = {(kn_wformat)f, 1, 4096, NULL, NULL, NULL, ok[i], KN_LAYOUT_ROWS};
            assert_int_equal(kn_qdot_supported(&m), 1);
        }
        for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
            kn_matrix m = {(kn_wformat)f, 1, 4096, NULL, NULL, NULL, no[i], KN_LAYOUT_ROWS};
            assert_int_equal(kn_qdot_supported(&m), 0);
        }
    }
}

/* Within a few 1/254 of the float path: the activation rounding only. */
static void test_qdot_close_to_float_matmul(void **state)
{
    (void)state;
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    for (size_t f = 0; f < 3; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, fmts[f], 64, 1024, 32);
        size_t T = 4;
        float *x = make_x(T, 1024);
        kn_qact_kind k = kn_qact_kind_of(&t.m);
        void *xq = malloc((size_t)kn_qact_bytes(k, T, 1024));
        float *yq = malloc(T * 64 * sizeof(float)), *yf = malloc(T * 64 * sizeof(float));
        assert_true(xq && yq && yf);
        kn_qact_quantize(k, x, T, 1024, xq);
        kn_matmul_q(NULL, &t.m, xq, T, yq, NULL);
        kn_ref_matmul(&t.m, x, T, yf, NULL);
        double e = tu_norm_err(yq, yf, T * 64);
        printf("%s: integer path vs float: normalized error %.2e\n",
               fmt_name(fmts[f]), e);
        assert_true(e < (fmts[f] == KN_W_Q8 ? 1e-4 : 1e-2));
        assert_true(e > 0.0); /* it is a different computation */
        free(x);
        free(xq);
        free(yq);
        free(yf);
        tu_tmat_free(&t);
    }
}

/* A token's row has the same bits whatever T is and whatever the thread
 * count: the runtime's alone-or-batched promise. */
static void test_qdot_rows_bit_identical_for_every_T(void **state)
{
    (void)state;
    enum { ROWS = 13, TMAX = 12, COLS = 200 };
    static const kn_wformat fmts[] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    kn_pool *pool = kn_pool_create(2);
    assert_non_null(pool);
    for (size_t f = 0; f < 3; f++) {
        tu_tmat t = tu_tmat_make(&g_rng, fmts[f], ROWS, COLS, 64);
        float *x = make_x(TMAX, COLS);
        kn_qact_kind kind = kn_qact_kind_of(&t.m);
        size_t rowb = (size_t)kn_qact_bytes(kind, 1, COLS);
        void *xq = malloc(rowb * TMAX), *x1 = malloc(rowb);
        float alone[TMAX][ROWS], y[TMAX * ROWS];
        assert_true(xq && x1);
        for (size_t k = 0; k < TMAX; k++) {
            kn_qact_quantize(kind, x + k * COLS, 1, COLS, x1);
            kn_matmul_q(NULL, &t.m, x1, 1, alone[k], NULL);
        }
        for (size_t T = 2; T <= TMAX; T++) {
            kn_qact_quantize(kind, x, T, COLS, xq);
            for (int th = 0; th < 2; th++) {
                kn_matmul_q(th ? pool : NULL, &t.m, xq, T, y, NULL);
                for (size_t k = 0; k < T; k++)
                    if (memcmp(y + k * ROWS, alone[k], sizeof alone[k]) != 0)
                        fail_msg("%s: token %zu differs at T=%zu", fmt_name(fmts[f]), k, T);
            }
        }
        free(x);
        free(xq);
        free(x1);
        tu_tmat_free(&t);
    }
    kn_pool_free(pool);
}

/* kn_matmul_q_multi and kn_matmul_multi (one pool job for a block's q/k/v
 * or gate/up) give the bits of one call per matrix: matrices of different
 * row counts (a GQA model's q and k), one under the single-thread
 * threshold alone, 1-3 threads, decode and prefill sizes, with a bias. */
static void test_qdot_multi_matches_one_call_per_matrix(void **state)
{
    (void)state;
    const uint32_t C = 192, rows[3] = {96, 32, 40};
    for (int f = 0; f < 2; f++) {
        kn_wformat fmt = f ? KN_W_Q8 : KN_W_Q4S;
        tu_tmat t[3];
        const kn_matrix *W[3];
        for (int i = 0; i < 3; i++) {
            t[i] = tu_tmat_make(&g_rng, fmt, rows[i], C, f ? 0 : 32);
            W[i] = &t[i].m;
        }
        float *bias = malloc(96 * sizeof(float));
        assert_non_null(bias);
        tu_rng_fill(&g_rng, bias, 96, 1.0f);
        for (int th = 1; th <= 3; th++) {
            kn_pool *p = kn_pool_create(th);
            assert_non_null(p);
            const size_t Ts[] = {1, 4, 20};
            for (size_t k = 0; k < 3; k++) {
                size_t T = Ts[k];
                float *x = make_x(T, C);
                kn_qact_kind kind = kn_qact_kind_of(W[0]);
                void *xq = malloc((size_t)kn_qact_bytes(kind, T, C));
                assert_non_null(xq);
                kn_qact_quantize(kind, x, T, C, xq);
                float *y1[3], *y2[3];
                const float *B[3] = {bias, NULL, bias};
                for (int i = 0; i < 3; i++) {
                    y1[i] = malloc(T * rows[i] * sizeof(float));
                    y2[i] = malloc(T * rows[i] * sizeof(float));
                    assert_true(y1[i] && y2[i]);
                    kn_matmul_q(p, W[i], xq, T, y1[i], B[i]);
                }
                kn_matmul_q_multi(p, 3, W, xq, T, y2, B);
                for (int i = 0; i < 3; i++)
                    assert_memory_equal(y1[i], y2[i], T * rows[i] * sizeof(float));
                for (int i = 0; i < 3; i++)
                    kn_matmul(p, W[i], x, T, y1[i], B[i]);
                kn_matmul_multi(p, 3, W, x, T, y2, B);
                for (int i = 0; i < 3; i++) {
                    assert_memory_equal(y1[i], y2[i], T * rows[i] * sizeof(float));
                    free(y1[i]);
                    free(y2[i]);
                }
                free(x);
                free(xq);
            }
            kn_pool_free(p);
        }
        free(bias);
        for (int i = 0; i < 3; i++)
            tu_tmat_free(&t[i]);
    }
}

/* ---- stories260k: what the integer path does to the logits ---------------- */

enum { NTOK = 256 };

/* Logits [NTOK][vocab] of the stories reference ids through model m. */
static float *stories_logits(const rt_model *m, const int32_t *ids)
{
    return tu_prompt_logits(m, ids, NTOK, 64);
}

static double kld(const float *p, const float *q, uint32_t vocab)
{
    cmp_eval_acc a;
    cmp_eval_acc_init(&a);
    for (size_t t = 0; t < NTOK; t++)
        assert_int_equal(cmp_eval_acc_add(&a, p + t * vocab, q + t * vocab,
                                          vocab, -1), MC_OK);
    cmp_eval_report r;
    assert_int_equal(cmp_eval_acc_report(&a, &r), MC_OK);
    cmp_eval_acc_free(&a);
    return r.kld_mean;
}

/* The quantization's own KLD (f32 model vs the artifact, float path)
 * and the integer path's (artifact float path vs integer path): the second
 * must be under a tenth of the first (issue 16). */
static void check_stories_kld(const char *quant, const char *group)
{
    const char *dir = tu_stories_dir();
    int32_t ids[NTOK];
    assert_int_equal(tu_stories_ref_ids(dir, ids, NTOK), NTOK);
    char *tmp = tu_mkdtemp("qdot");
    char *art = tu_fmt("%s/s.mca", tmp);
    char *cmd = tu_fmt("%s/mcompile %s --target 1GiB --quant %s %s -o %s -q",
                       MC_BIN_DIR, dir, quant, group, art);
    char *out, *err;
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    rt_model *ref, *q;
    mc_error e;
    assert_int_equal(rt_model_open_hf(dir, &ref, &e), MC_OK);
    assert_int_equal(rt_model_open_artifact(art, &q, &e), MC_OK);
    uint32_t V = ref->cfg.vocab_size;
    float *lr = stories_logits(ref, ids);
    kn_set_float_dot(1);
    float *lf = stories_logits(q, ids);
    kn_set_float_dot(0);
    float *li = stories_logits(q, ids);
    double own = kld(lr, lf, V), added = kld(lf, li, V), total = kld(lr, li, V);
    printf("stories260k %s %s: KLD f32->float path %.3e, float->integer path "
           "%.3e (ratio %.3f), f32->integer path %.3e\n", quant, group, own,
           added, added / own, total);
    assert_true(added > 0.0); /* the integer path really ran */
    assert_true(added < own / 10.0);
    free(lr);
    free(lf);
    free(li);
    rt_model_free(ref);
    rt_model_free(q);
    tu_rmtree(tmp);
    free(tmp);
    free(art);
    free(cmd);
    free(out);
    free(err);
}

static void test_stories_int4_integer_path_kld_under_tenth_of_quant(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    check_stories_kld("int4", "--group 32");
}

/* The output layer (the tied embedding) in int4-sym too, as GGUF's --pure
 * Q4_0: int8 activations against the int4 head as well. */
static void test_stories_int4_head_integer_path_kld_under_tenth_of_quant(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    check_stories_kld("int4-sym", "--group 32 --lm-head int4-sym");
}

static void test_stories_int8_integer_path_kld_under_tenth_of_quant(void **state)
{
    (void)state;
    TU_SKIP_IF(!tu_stories_dir(), "stories260k not found in ../shared");
    check_stories_kld("int8", "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_qact_avx2_matches_reference_bytes, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qact_known_values, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qact_pool_matches_one_thread_bytes,
                                  tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx2_decode_bit_identical_to_reference, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx2_decode_chunks_bit_identical, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx2_gemm_bit_identical_to_reference, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx512_decode_bit_identical_to_reference, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx512_gemm_bit_identical_to_reference, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_decode_avx512_matches_avx2, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx512_int_decode_passes_bit_identical, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_scalar_bit_identical_to_reference, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_extreme_codes_exact, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_int4_extreme_codes_exact, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_refuses_groups_that_are_not_powers_of_two, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_close_to_float_matmul, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_rows_bit_identical_for_every_T, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_gemm_panel_boundaries_bit_identical, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx512_gemm_tiles_bit_identical, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_stories_int4_integer_path_kld_under_tenth_of_quant, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_stories_int8_integer_path_kld_under_tenth_of_quant, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_stories_int4_head_integer_path_kld_under_tenth_of_quant, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx2_gemm_int4_code_minus128_exact, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_avx2_gemm_panel_boundaries_bit_identical, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_qdot_multi_matches_one_call_per_matrix, tu_reset_kernel_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_quant.c - RTN / importance-searched quantization into the
 * kn_quant.h layouts: round trips, ragged groups, error bounds, and the
 * kernels reading exactly what cmp_quant wrote. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_quant.h"
#include "fmt_dtype.h"
#include "kn_ops.h"
#include "gptq_fixture.h"
#include "testutil.h"

static uint64_t rs = 0x1234567;
static float urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xFFFFFF) / 16777216.0f;
}
static float nrand(void)
{
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static float *rand_matrix(uint32_t rows, uint32_t cols, float std)
{
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = nrand() * std;
    return w;
}

/* Q8: codes in range, |w - deq| <= scale/2, scale = max|row|/127. */
static void test_q8_round_trip_error_bounded_by_half_step(void **state)
{
    (void)state;
    uint32_t rows = 7, cols = 172;
    float *w = rand_matrix(rows, cols, 0.05f);
    w[3] = 1.0f; /* an outlier in row 0 */
    tu_gq_qm m;
    tu_gq_qm_init(&m, KN_W_Q8, rows, cols, 0);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    float *d = malloc((size_t)rows * cols * sizeof(float));
    cmp_dequant_matrix(&m.b, d);
    for (uint32_t r = 0; r < rows; r++) {
        float amax = 0.0f;
        for (uint32_t c = 0; c < cols; c++)
            amax = fmaxf(amax, fabsf(w[r * cols + c]));
        float s = ((float *)m.scales)[r];
        assert_float_equal(s, amax / 127.0f, 1e-9);
        for (uint32_t c = 0; c < cols; c++) {
            int q = ((int8_t *)m.data)[r * cols + c];
            assert_true(q >= -127 && q <= 127);
            assert_true(fabsf(w[r * cols + c] - d[r * cols + c]) <= s * 0.5f + 1e-7f);
        }
    }
    assert_int_equal(((int8_t *)m.data)[3], 127);
    tu_gq_qm_free(&m);
    free(w);
    free(d);
}

/* Q4/Q4S over 172-wide rows with every group size: the ragged last group
 * has its own parameters, odd widths keep the pad nibble 0, and each value
 * is within half a step of the weight. */
static void check_q4_ragged(kn_wformat f, uint32_t cols, uint32_t g)
{
    uint32_t rows = 5;
    float *w = rand_matrix(rows, cols, 0.1f);
    /* Make the ragged tail's range very different from the rest. */
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = (cols / g) * g; c < cols; c++)
            w[r * cols + c] *= 20.0f;
    tu_gq_qm m;
    tu_gq_qm_init(&m, f, rows, cols, g);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    float *d = malloc((size_t)rows * cols * sizeof(float));
    cmp_dequant_matrix(&m.b, d);
    uint32_t ng = kn_q4_ngroups(cols, g);
    assert_int_equal(ng, (cols + g - 1) / g);
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c = 0; c < cols; c++) {
            cmp_qparam p = cmp_qbuf_get_param(&m.b, r, c / g);
            float step = fabsf(p.scale);
            float x = w[r * cols + c];
            /* Q4S clamps +8 steps to +7: allow a full step at the top. */
            float tol = (f == KN_W_Q4S ? 1.0f : 0.5f) * step + 1e-6f;
            assert_true(fabsf(x - d[r * cols + c]) <= tol);
        }
        if (cols & 1) {
            uint8_t last = ((uint8_t *)m.data)[r * kn_q4_row_bytes(cols) + cols / 2];
            assert_int_equal(last >> 4, 0);
        }
        if (f == KN_W_Q4)
            for (uint32_t gi = 0; gi < ng; gi++)
                assert_true(m.zeros[r * ng + gi] <= 15);
    }
    /* The kernels' view dequantizes to the same floats. */
    kn_matrix km = cmp_qbuf_matrix(&m.b);
    float *row = malloc(cols * sizeof(float));
    for (uint32_t r = 0; r < rows; r++) {
        kn_matrix_row(&km, r, row);
        assert_memory_equal(row, d + (size_t)r * cols, cols * sizeof(float));
    }
    free(row);
    tu_gq_qm_free(&m);
    free(w);
    free(d);
}

static void test_q4_ragged_groups_round_trip(void **state)
{
    (void)state;
    uint32_t gs[3] = {32, 64, 128};
    uint32_t widths[3] = {172, 171, 64};
    for (int gi = 0; gi < 3; gi++)
        for (int wi = 0; wi < 3; wi++) {
            check_q4_ragged(KN_W_Q4, widths[wi], gs[gi]);
            check_q4_ragged(KN_W_Q4S, widths[wi], gs[gi]);
        }
}

/* Exactly representable values survive unchanged: integers times a power
 * of two in a group whose range spans 15 steps. */
static void test_q4_exact_values_round_trip_exactly(void **state)
{
    (void)state;
    uint32_t cols = 96, g = 32;
    float w[96];
    for (uint32_t c = 0; c < cols; c++)
        w[c] = (float)((int)(c % 16) - 5) * 0.125f;
    tu_gq_qm m;
    tu_gq_qm_init(&m, KN_W_Q4, 1, cols, g);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    float d[96];
    cmp_dequant_matrix(&m.b, d);
    assert_memory_equal(w, d, sizeof w);
    assert_int_equal(m.zeros[0], 5);
    assert_int_equal(fmt_f32_to_f16(0.125f), ((uint16_t *)m.scales)[0]);
    tu_gq_qm_free(&m);
}

/* Q4S uses code 0 (-8 steps) for the extreme value like llama.cpp Q4_0. */
static void test_q4s_extreme_maps_to_code_zero(void **state)
{
    (void)state;
    float w[32];
    for (int c = 0; c < 32; c++)
        w[c] = 0.01f * (float)(c - 16);
    w[7] = 0.8f; /* positive extreme: negative scale */
    tu_gq_qm m;
    tu_gq_qm_init(&m, KN_W_Q4S, 1, 32, 32);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    assert_int_equal(cmp_qbuf_get_code(&m.b, 0, 7), 0);
    float d[32];
    cmp_dequant_matrix(&m.b, d);
    assert_float_equal(d[7], 0.8f, 1e-3);
    tu_gq_qm_free(&m);
}

/* A group of zeros quantizes to exact zeros (scale 0, no division). */
static void test_zero_group_stays_zero(void **state)
{
    (void)state;
    float w[64] = {0};
    for (int c = 32; c < 64; c++)
        w[c] = 0.5f;
    kn_wformat fs[3] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    for (int i = 0; i < 3; i++) {
        tu_gq_qm m;
        tu_gq_qm_init(&m, fs[i], 1, 64, 32);
        assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
        float d[64];
        cmp_dequant_matrix(&m.b, d);
        for (int c = 0; c < 32; c++)
            assert_true(d[c] == 0.0f);
        tu_gq_qm_free(&m);
    }
}

/* Importance-weighted search never does worse than plain RTN on the
 * weighted error and does clearly better on heavy-tailed weights. */
static void test_importance_search_reduces_weighted_error(void **state)
{
    (void)state;
    uint32_t rows = 64, cols = 172;
    float *w = rand_matrix(rows, cols, 0.02f);
    for (size_t i = 0; i < (size_t)rows * cols; i += 37)
        w[i] *= 8.0f; /* outliers that RTN wastes range on */
    float imp[172];
    for (uint32_t c = 0; c < cols; c++)
        imp[c] = (c % 13 == 0) ? 50.0f : 0.2f + urand();
    kn_wformat fs[3] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    for (int i = 0; i < 3; i++) {
        tu_gq_qm a, b;
        tu_gq_qm_init(&a, fs[i], rows, cols, 32);
        tu_gq_qm_init(&b, fs[i], rows, cols, 32);
        assert_int_equal(cmp_quant_matrix(w, NULL, &a.b, NULL), MC_OK);
        assert_int_equal(cmp_quant_matrix(w, imp, &b.b, NULL), MC_OK);
        double ea = cmp_quant_weighted_error(w, imp, &a.b);
        double eb = cmp_quant_weighted_error(w, imp, &b.b);
        assert_true(eb <= ea);
        assert_true(eb < 0.9 * ea);
        tu_gq_qm_free(&a);
        tu_gq_qm_free(&b);
    }
    free(w);
}

/* RTN mean squared error matches theory: about step^2/12 for dense
 * uniform-ish values (a broken rounding, e.g. truncation, gives ~step^2/3). */
static void test_rtn_error_matches_uniform_rounding(void **state)
{
    (void)state;
    uint32_t rows = 32, cols = 256;
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = urand() * 2.0f - 1.0f;
    tu_gq_qm m;
    tu_gq_qm_init(&m, KN_W_Q8, rows, cols, 0);
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
    double e = cmp_quant_weighted_error(w, NULL, &m.b) / ((double)rows * cols);
    double step = 1.0 / 127.0;
    assert_true(e < step * step / 12.0 * 1.3);
    assert_true(e > step * step / 12.0 * 0.7);
    tu_gq_qm_free(&m);
    free(w);
}

static void test_quant_rejects_bad_input(void **state)
{
    (void)state;
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = 0.1f;
    tu_gq_qm m;
    tu_gq_qm_init(&m, KN_W_Q4, 1, 64, 48);
    mc_error e;
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, &e), MC_ERR_INVALID_ARG);
    assert_string_equal(e.field, "group");
    tu_gq_qm_free(&m);
    tu_gq_qm_init(&m, KN_W_Q4, 1, 64, 32);
    w[33] = NAN;
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, &e), MC_ERR_NONFINITE);
    assert_string_equal(e.field, "row 0 col 33");
    m.b.zeros = NULL;
    assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, &e), MC_ERR_INVALID_ARG);
    tu_gq_qm_free(&m);
}

/* CMP_Q8_F16 (a tied embedding): each row's scale is the least f16 value
 * at or above max|w| / 127, the codes are RTN under it (none clamped); a
 * zero row keeps 0, a tiny one an f16 subnormal (error under 2^-25 more),
 * a row whose scale is over 65504 keeps the plain f32 scale.  The plain
 * mode (linears) is unchanged on the same rows.  CMP_Q8_F16_MSE: f16
 * scales too, no more squared error per row than CMP_Q8_F16. */
static void test_q8_f16_scales(void **state)
{
    (void)state;
    uint32_t rows = 6, cols = 96;
    float *w = rand_matrix(rows, cols, 0.05f);
    memset(w + cols, 0, cols * sizeof(float));        /* zero row */
    for (uint32_t c = 0; c < cols; c++) {
        w[2 * cols + c] *= 1e-6f;                     /* subnormal scale */
        w[4 * cols + c] *= 2e8f;                      /* over f16 */
    }
    w[3 * cols + 7] = 63.5f; /* max|w| / 127 = 0.5, an f16 value itself */
    double up_err[6] = {0};
    for (int mode = 0; mode < 3; mode++) {
        tu_gq_qm m;
        tu_gq_qm_init(&m, KN_W_Q8, rows, cols, 0);
        m.b.q8scale = (cmp_q8scale)mode;
        assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
        for (uint32_t r = 0; r < rows && mode == 2; r++) {
            float s = ((float *)m.scales)[r];
            double e = 0;
            for (uint32_t c = 0; c < cols; c++) {
                float x = w[r * cols + c];
                float v = s * (float)((int8_t *)m.data)[r * cols + c];
                e += ((double)x - v) * ((double)x - v); /* as the search */
            }
            assert_true(e <= up_err[r]);
            assert_true(r == 4 ? !cmp_quant_f16_exact(s)
                               : cmp_quant_f16_exact(s));
        }
        for (uint32_t r = 0; r < rows && mode < 2; r++) {
            float a = 0.0f;
            for (uint32_t c = 0; c < cols; c++)
                a = fmaxf(a, fabsf(w[r * cols + c]));
            float s = ((float *)m.scales)[r], plain = a / 127.0f;
            if (!mode || r == 4) {
                assert_true(s == plain);
                assert_true(mode || r != 3 || s == 0.5f);
                if (r == 4)
                    assert_false(cmp_quant_f16_exact(s));
            } else {
                uint16_t h = fmt_f32_to_f16(s);
                assert_true(cmp_quant_f16_exact(s));
                assert_true(s >= plain);
                /* the least such f16: the one below is under a / 127 */
                assert_true(h == 0 || fmt_f16_to_f32((uint16_t)(h - 1)) < plain);
                assert_true(r != 1 || s == 0.0f);
                assert_true(r != 2 || (s > 0.0f && s < 6.1e-5f));
                assert_true(r != 3 || s == 0.5f);
            }
            for (uint32_t c = 0; c < cols; c++) {
                int q = ((int8_t *)m.data)[r * cols + c];
                float x = w[r * cols + c];
                assert_int_equal(q, s == 0.0f ? 0 : (int)nearbyintf(x / s));
                assert_true(q >= -127 && q <= 127);
                assert_true(fabsf(x - s * (float)q) <=
                            s / 2 * (1 + 1e-6f) + (mode ? 0x1p-25f : 0));
                if (mode)
                    up_err[r] += ((double)x - (double)(s * (float)q)) *
                                 ((double)x - (double)(s * (float)q));
            }
        }
        tu_gq_qm_free(&m);
    }
    free(w);
}

/* kn_matmul on the quantized matrix equals the float matmul of the
 * dequantized weights (the runtime computes what we measured). */
static void test_kernel_matmul_matches_dequantized_reference(void **state)
{
    (void)state;
    uint32_t rows = 24, cols = 172, T = 3;
    float *w = rand_matrix(rows, cols, 0.1f);
    float *x = rand_matrix(T, cols, 1.0f);
    kn_wformat fs[3] = {KN_W_Q8, KN_W_Q4, KN_W_Q4S};
    for (int i = 0; i < 3; i++) {
        tu_gq_qm m;
        tu_gq_qm_init(&m, fs[i], rows, cols, 64);
        assert_int_equal(cmp_quant_matrix(w, NULL, &m.b, NULL), MC_OK);
        float *d = malloc((size_t)rows * cols * sizeof(float));
        cmp_dequant_matrix(&m.b, d);
        kn_matrix km = cmp_qbuf_matrix(&m.b);
        kn_matrix kf = {KN_W_F32, rows, cols, d, NULL, NULL, 0, KN_LAYOUT_ROWS};
        float y1[72], y2[72];
        kn_matmul(NULL, &km, x, T, y1, NULL);
        kn_ref_matmul(&kf, x, T, y2, NULL);
        for (uint32_t k = 0; k < T * rows; k++)
            assert_float_equal(y1[k], y2[k], 1e-4 * (1.0 + fabsf(y2[k])));
        free(d);
        tu_gq_qm_free(&m);
    }
    free(w);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_round_trip_error_bounded_by_half_step),
        cmocka_unit_test(test_q8_f16_scales),
        cmocka_unit_test(test_q4_ragged_groups_round_trip),
        cmocka_unit_test(test_q4_exact_values_round_trip_exactly),
        cmocka_unit_test(test_q4s_extreme_maps_to_code_zero),
        cmocka_unit_test(test_zero_group_stays_zero),
        cmocka_unit_test(test_importance_search_reduces_weighted_error),
        cmocka_unit_test(test_rtn_error_matches_uniform_rounding),
        cmocka_unit_test(test_quant_rejects_bad_input),
        cmocka_unit_test(test_kernel_matmul_matches_dequantized_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

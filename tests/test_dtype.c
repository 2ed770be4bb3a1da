/* test_dtype.c - dtype table and the f16/bf16 conversions (round to nearest,
 * ties to even; subnormals, Inf and NaN) in formats/fmt_dtype.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "fmt_dtype.h"
#include "testutil.h"

static float f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_dtype_names_and_sizes_round_trip(void **state)
{
    (void)state;
    for (int i = 1; i < FMT_DT_COUNT_; i++) {
        fmt_dtype dt = (fmt_dtype)i;
        assert_int_equal(fmt_dtype_from_name(fmt_dtype_name(dt)), dt);
        assert_true(fmt_dtype_size(dt) >= 1 && fmt_dtype_size(dt) <= 8);
    }
    assert_int_equal(fmt_dtype_from_name("F17"), FMT_DT_INVALID);
    assert_int_equal(fmt_dtype_from_name("f32"), FMT_DT_INVALID); /* exact case */
    assert_int_equal(fmt_dtype_from_name(NULL), FMT_DT_INVALID);
    assert_int_equal(fmt_dtype_size(FMT_DT_INVALID), 0);
    assert_int_equal(fmt_dtype_size(FMT_DT_BF16), 2);
    assert_string_equal(fmt_dtype_name((fmt_dtype)999), "INVALID");
}

/* Every f16 bit pattern survives f16 -> f32 -> f16 exactly, except NaNs,
 * which stay NaNs of the same sign (the conversion makes them quiet). */
static void test_f16_round_trip_is_exact_for_all_65536_values(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fmt_f16_to_f32((uint16_t)h);
        uint16_t back = fmt_f32_to_f16(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan) {
            assert_true(isnan(f));
            assert_int_equal(back & 0x8000, h & 0x8000);
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        } else if (back != h) {
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, (double)f, back);
        }
    }
}

static void test_f16_to_f32_decodes_subnormals_exactly(void **state)
{
    (void)state;
    assert_true(fmt_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(fmt_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));
    assert_true(fmt_f16_to_f32(0x0400) == ldexpf(1.0f, -14));
    assert_true(fmt_f16_to_f32(0x8001) == -ldexpf(1.0f, -24));
    assert_int_equal(bits(fmt_f16_to_f32(0x8000)), 0x80000000u); /* -0 */
    assert_true(fmt_f16_to_f32(0x7bff) == 65504.0f);
}

static void test_f32_to_f16_rounds_ties_to_even(void **state)
{
    (void)state;
    /* 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd) */
    assert_int_equal(fmt_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    /* 1 + 3*2^-11 is halfway between 0x3c01 (odd) and 0x3c02 (even) */
    assert_int_equal(fmt_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
    /* just above the tie rounds up */
    assert_int_equal(fmt_f32_to_f16(f32(bits(1.0f + ldexpf(1.0f, -11)) + 1)), 0x3c01);
    assert_int_equal(fmt_f32_to_f16(-1.0f - ldexpf(1.0f, -11)), 0xbc00);
}

static void test_f32_to_f16_rounds_subnormals_to_nearest_even(void **state)
{
    (void)state;
    float tiny = ldexpf(1.0f, -24); /* smallest f16 subnormal */
    assert_int_equal(fmt_f32_to_f16(tiny), 0x0001);
    assert_int_equal(fmt_f32_to_f16(tiny * 0.5f), 0x0000);        /* tie -> 0 */
    assert_int_equal(fmt_f32_to_f16(tiny * 0.5000001f), 0x0001);  /* above tie */
    assert_int_equal(fmt_f32_to_f16(tiny * 1.5f), 0x0002);        /* tie -> even */
    assert_int_equal(fmt_f32_to_f16(tiny * 2.5f), 0x0002);        /* tie -> even */
    assert_int_equal(fmt_f32_to_f16(-tiny * 0.25f), 0x8000);      /* -0 */
    /* the largest subnormal rounds up into the smallest normal */
    assert_int_equal(fmt_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);
    assert_int_equal(fmt_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);
}

static void test_f32_to_f16_overflows_to_inf(void **state)
{
    (void)state;
    assert_int_equal(fmt_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(fmt_f32_to_f16(65519.99f), 0x7bff); /* below the tie */
    assert_int_equal(fmt_f32_to_f16(65520.0f), 0x7c00);  /* tie -> even = Inf */
    assert_int_equal(fmt_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(fmt_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(fmt_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(fmt_f32_to_f16(-INFINITY), 0xfc00);
}

static void test_f32_to_f16_keeps_nan_a_nan(void **state)
{
    (void)state;
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7f802000u,
                       0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        uint16_t h = fmt_f32_to_f16(f32(nans[i]));
        assert_true((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
}

#ifdef __FLT16_MAX__
/* Compare with the compiler's correctly rounded float -> _Float16 over a
 * stride through all 2^32 float bit patterns (about 1M values). */
static void test_f32_to_f16_matches_compiler_on_sampled_floats(void **state)
{
    (void)state;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        float f = f32((uint32_t)u);
        if (isnan(f))
            continue;
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        uint16_t got = fmt_f32_to_f16(f);
        if (got != want)
            fail_msg("f32 0x%08x: got 0x%04x want 0x%04x", (unsigned)u, got, want);
    }
}
#endif

static void test_f32_to_bf16_rounds_ties_to_even(void **state)
{
    (void)state;
    assert_int_equal(fmt_f32_to_bf16(f32(0x3f808000u)), 0x3f80); /* tie, even */
    assert_int_equal(fmt_f32_to_bf16(f32(0x3f818000u)), 0x3f82); /* tie, odd up */
    assert_int_equal(fmt_f32_to_bf16(f32(0x3f808001u)), 0x3f81); /* above tie */
    assert_int_equal(fmt_f32_to_bf16(f32(0x3f807fffu)), 0x3f80); /* below tie */
    assert_int_equal(fmt_f32_to_bf16(f32(0x00008000u)), 0x0000); /* subnormal tie */
    assert_int_equal(fmt_f32_to_bf16(f32(0x00018000u)), 0x0002);
}

static void test_f32_to_bf16_handles_inf_overflow_and_nan(void **state)
{
    (void)state;
    assert_int_equal(fmt_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(fmt_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(fmt_f32_to_bf16(f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> Inf */
    assert_int_equal(fmt_f32_to_bf16(f32(0x7f7f7fffu)), 0x7f7f);
    /* NaNs whose payload sits only in the low 16 bits must not become Inf */
    uint16_t h = fmt_f32_to_bf16(f32(0x7f800001u));
    assert_true((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0);
    h = fmt_f32_to_bf16(f32(0xffffffffu));
    assert_true((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 && (h & 0x8000));
}

/* Reference bf16 rounding in double arithmetic (exact for these values). */
static uint16_t ref_bf16(float f)
{
    uint32_t u = bits(f), t = u & 0xffff0000u;
    double x = fabs((double)f), lo = fabs((double)f32(t));
    uint32_t e = (t >> 23) & 0xff;
    double ulp = ldexp(1.0, (e ? (int)e : 1) - 127 - 7);
    double hi = lo + ulp; /* may be 2^128: rounds to Inf, as IEEE says */
    uint16_t down = (uint16_t)(t >> 16), up = (uint16_t)(down + 1);
    if (x - lo < hi - x)
        return down;
    if (x - lo > hi - x)
        return up;
    return (down & 1) ? up : down;
}

static void test_f32_to_bf16_matches_reference_on_sampled_floats(void **state)
{
    (void)state;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        float f = f32((uint32_t)u);
        if (isnan(f) || isinf(f))
            continue;
        uint16_t got = fmt_f32_to_bf16(f), want = ref_bf16(f);
        if (got != want)
            fail_msg("f32 0x%08x: got 0x%04x want 0x%04x", (unsigned)u, got, want);
    }
}

static void test_bf16_round_trip_is_exact(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = fmt_bf16_to_f32((uint16_t)b);
        if (isnan(f))
            continue;
        assert_int_equal(fmt_f32_to_bf16(f), b);
    }
}

static void test_array_conversions_match_scalar_and_reject_ints(void **state)
{
    (void)state;
    float src[5] = {1.0f, -2.5f, 65520.0f, 1e-8f, 3.14159f}, back[5];
    unsigned char buf[1 + 5 * 2]; /* odd offset: unaligned on purpose */
    assert_int_equal(fmt_from_f32(FMT_DT_F16, src, buf + 1, 5), 0);
    assert_int_equal(fmt_to_f32(FMT_DT_F16, buf + 1, back, 5), 0);
    for (int i = 0; i < 5; i++)
        assert_true(bits(back[i]) ==
                    bits(fmt_f16_to_f32(fmt_f32_to_f16(src[i]))));
    assert_int_equal(fmt_from_f32(FMT_DT_BF16, src, buf + 1, 5), 0);
    assert_int_equal(fmt_to_f32(FMT_DT_BF16, buf + 1, back, 5), 0);
    for (int i = 0; i < 5; i++)
        assert_true(bits(back[i]) ==
                    bits(fmt_bf16_to_f32(fmt_f32_to_bf16(src[i]))));
    assert_int_equal(fmt_to_f32(FMT_DT_I8, buf, back, 1), -1);
    assert_int_equal(fmt_from_f32(FMT_DT_U8, src, buf, 1), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_names_and_sizes_round_trip),
        cmocka_unit_test(test_f16_round_trip_is_exact_for_all_65536_values),
        cmocka_unit_test(test_f16_to_f32_decodes_subnormals_exactly),
        cmocka_unit_test(test_f32_to_f16_rounds_ties_to_even),
        cmocka_unit_test(test_f32_to_f16_rounds_subnormals_to_nearest_even),
        cmocka_unit_test(test_f32_to_f16_overflows_to_inf),
        cmocka_unit_test(test_f32_to_f16_keeps_nan_a_nan),
#ifdef __FLT16_MAX__
        cmocka_unit_test(test_f32_to_f16_matches_compiler_on_sampled_floats),
#endif
        cmocka_unit_test(test_f32_to_bf16_rounds_ties_to_even),
        cmocka_unit_test(test_f32_to_bf16_handles_inf_overflow_and_nan),
        cmocka_unit_test(test_f32_to_bf16_matches_reference_on_sampled_floats),
        cmocka_unit_test(test_bf16_round_trip_is_exact),
        cmocka_unit_test(test_array_conversions_match_scalar_and_reject_ints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

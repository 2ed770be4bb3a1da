/* test_compile_calib_opts.c - the calibration's effort options of issue
 * 17 on the command line.
 * `--awq-grid coarse|full`: the option needs --calib and names its values
 * when refused; the manifest's calibration object says "awq_grid":
 * "coarse" for the default walk and nothing for the full grid, whose
 * artifact is the one compilers before the option wrote; both verify.
 * `--calib-stats bf16|f32`: the same refusals; the default sums bfloat16
 * products and the manifest says "statistics": "bf16" (so does `inspect`);
 * f32 names nothing, as the compilers before the option wrote; the two
 * artifacts differ, both verify, and bf16 given is the default's bytes.
 * `--calib-forward bf16|f32` (the quantized pass's products): likewise,
 * "forward": "bf16", inspect's "quantized pass: ... products".
 * `--calib-full-pass bf16|f32` (the full-precision weights' products):
 * likewise for int4, "full_pass": "bf16", inspect's "full-precision pass:
 * ... products"; int8's default is f32 (nothing named, the bytes of
 * before) and bf16 given changes them; bf16 with --calib-forward f32 is
 * refused.
 * `--calib-refine on|off`: the same refusals; off is named in the
 * manifest ("refine": false), by inspect and in --json's effort options
 * and changes the bytes; on is the default's bytes, named nowhere. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char *g_dir;
static char *g_ids; /* 10 sequences of 24 ids < 256 */

static int setup(void **state)
{
    (void)state;
    g_dir = tu_mkdtemp("calibopts");
    g_ids = tu_fmt("%s/ids.txt", g_dir);
    int32_t *tok = NULL;
    size_t *off = NULL;
    tu_random_seqs(256, 10, 24, &tok, &off);
    char text[4096];
    size_t n = 0;
    for (size_t i = 0; i < 10 * 24; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%d%s", tok[i],
                              (i + 1) % 24 ? " " : "\n");
    free(tok);
    free(off);
    assert_int_equal(tu_write_file(g_ids, text, n), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    free(g_ids);
    return 0;
}

/* OPT with a valid VALUE is refused without --calib (exit 2, "OPT needs
 * --calib"); with --calib and a BAD value it is refused naming the values
 * it takes (values, NULL-ended) and the bad one. */
static void refused(const char *opt, const char *value, const char *bad,
                    const char *const *values)
{
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s/llama --target 64MiB --quant int8 "
                                "%s %s -o %s/x.mca",
                                MC_FIXTURE_DIR, opt, value, g_dir), 2);
    char *needs = tu_fmt("%s needs --calib", opt);
    assert_non_null(strstr(err, needs));
    free(needs);
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s/llama --target 64MiB --quant int8 --calib "
                                "%s %s %s -o %s/x.mca",
                                MC_FIXTURE_DIR, g_ids, opt, bad, g_dir), 2);
    for (const char *const *v = values; *v; v++)
        assert_non_null(strstr(err, *v));
    assert_non_null(strstr(err, bad));
    free(out);
    free(err);
}

/* Compile the llama fixture --quant QUANT with --calib and EXTRA into ART. */
static void compile_quant(const char *quant, const char *extra, const char *art)
{
    char *out = NULL, *err = NULL;
    int rc = tu_run_bin(&out, &err, "mcompile",
                        "%s/llama --target 64MiB --quant %s --calib %s %s -q -o %s",
                        MC_FIXTURE_DIR, quant, g_ids, extra, art);
    if (rc != 0)
        print_message("%s\n", err ? err : "");
    assert_int_equal(rc, 0);
    free(out);
    free(err);
}

/* The same int4 g32. */
static void compile_with(const char *extra, const char *art)
{
    compile_quant("int4 --group 32", extra, art);
}

static void test_awq_grid_needs_calib_and_names_its_values(void **state)
{
    (void)state;
    static const char *const values[] = {"coarse", "full", NULL};
    refused("--awq-grid", "full", "fine", values);
}

/* The manifest's calibration object of ART (verified). */
static json_t *calibration(const char *art)
{
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "inspect %s --verify --json", art), 0);
    free(err);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "verified")));
    json_t *c = json_object_get(json_object_get(j, "manifest"), "calibration");
    assert_non_null(c);
    json_incref(c);
    json_decref(j);
    free(out);
    return c;
}

static void test_awq_grid_recorded_only_for_the_coarse_walk(void **state)
{
    (void)state;
    const char *grid[3] = {"--method awq", "--method awq --awq-grid coarse",
                           "--method awq --awq-grid full"};
    for (int k = 0; k < 3; k++) {
        char *art = tu_fmt("%s/g%d.mca", g_dir, k);
        compile_with(grid[k], art);
        json_t *c = calibration(art);
        json_t *g = json_object_get(c, "awq_grid");
        if (k < 2)
            assert_string_equal(json_string_value(g), "coarse");
        else
            assert_null(g);
        assert_string_equal(json_string_value(json_object_get(c, "method")),
                            "awq");
        json_decref(c);
        free(art);
    }
}

static void test_calib_stats_needs_calib_and_names_its_values(void **state)
{
    (void)state;
    static const char *const values[] = {"bf16", "f32", NULL};
    refused("--calib-stats", "f32", "f16", values);
    char *x = tu_fmt("%s/x.mca", g_dir);
    assert_int_equal(tu_exists(x), 0);
    free(x);
}

/* flag bf16 (given or the default) names "bf16" under key in the
 * manifest's calibration object and "<label>: bf16 products" in inspect;
 * flag f32 names nothing (the bytes of before) and inspect says float. */
static void recorded_only_for_bf16(const char *flag, const char *key,
                                   const char *label)
{
    char *opt[3] = {tu_fmt("%s", ""), tu_fmt("%s bf16", flag), tu_fmt("%s f32", flag)};
    char *art[3], *text[3];
    for (int k = 0; k < 3; k++) {
        art[k] = tu_fmt("%s/%s%d.mca", g_dir, key, k);
        text[k] = NULL;
        compile_with(opt[k], art[k]);
        char *err = NULL;
        assert_int_equal(tu_run_bin(&text[k], &err, "mcompile", "inspect %s", art[k]), 0);
        free(err);
        json_t *c = calibration(art[k]);
        json_t *s = json_object_get(c, key);
        char *want = tu_fmt("%s: %s products", label, k < 2 ? "bf16" : "float");
        if (k < 2)
            assert_string_equal(json_string_value(s), "bf16");
        else
            assert_null(s);
        assert_non_null(strstr(text[k], want));
        free(want);
        json_decref(c);
    }
    size_t n0 = 0, n2 = 0;
    char *a0 = tu_read_file(art[0], &n0), *a2 = tu_read_file(art[2], &n2);
    assert_non_null(a0);
    assert_non_null(a2);
    assert_int_equal(tu_file_is(art[1], a0, n0), 1);
    assert_false(n0 == n2 && memcmp(a0, a2, n0) == 0);
    free(a0);
    free(a2);
    for (int k = 0; k < 3; k++) {
        free(opt[k]);
        free(art[k]);
        free(text[k]);
    }
}

static void test_calib_stats_recorded_only_for_bf16(void **state)
{
    (void)state;
    recorded_only_for_bf16("--calib-stats", "statistics", "statistics");
}

static void test_calib_forward_needs_calib_and_names_its_values(void **state)
{
    (void)state;
    static const char *const values[] = {"bf16", "f32", NULL};
    refused("--calib-forward", "f32", "f16", values);
    char *x = tu_fmt("%s/x.mca", g_dir);
    assert_int_equal(tu_exists(x), 0);
    free(x);
}

static void test_calib_forward_recorded_only_for_bf16(void **state)
{
    (void)state;
    recorded_only_for_bf16("--calib-forward", "forward", "quantized pass");
}

static void test_calib_full_pass_needs_calib_and_names_its_values(void **state)
{
    (void)state;
    static const char *const values[] = {"bf16", "f32", NULL};
    refused("--calib-full-pass", "f32", "f16", values);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s/llama --target 64MiB --quant int4 --calib %s "
                                "--calib-full-pass bf16 --calib-forward f32 "
                                "-o %s/x.mca",
                                MC_FIXTURE_DIR, g_ids, g_dir), 2);
    assert_non_null(strstr(err, "--calib-full-pass bf16 needs"));
    char *x = tu_fmt("%s/x.mca", g_dir);
    assert_int_equal(tu_exists(x), 0);
    free(x);
    free(out);
    free(err);
}

static void test_calib_full_pass_recorded_only_for_bf16(void **state)
{
    (void)state;
    recorded_only_for_bf16("--calib-full-pass", "full_pass", "full-precision pass");
}

/* The artifacts art[0..3): the first two the same bytes, the third
 * different; frees the paths. */
static void same_same_differs(char *art[3])
{
    char *a[3];
    size_t n[3];
    for (int k = 0; k < 3; k++) {
        a[k] = tu_read_file(art[k], &n[k]);
        assert_non_null(a[k]);
    }
    assert_true(n[0] == n[1] && memcmp(a[0], a[1], n[0]) == 0);
    assert_false(n[0] == n[2] && memcmp(a[0], a[2], n[0]) == 0);
    for (int k = 0; k < 3; k++) {
        free(art[k]);
        free(a[k]);
    }
}

/* int8's default keeps the float full-precision pass: nothing named, the
 * bytes of --calib-full-pass f32; bf16 asked is named and differs. */
static void test_calib_full_pass_int8_default_is_float(void **state)
{
    (void)state;
    static const char *const opt[3] = {"", "--calib-full-pass f32",
                                       "--calib-full-pass bf16"};
    char *art[3];
    for (int k = 0; k < 3; k++) {
        art[k] = tu_fmt("%s/i8full%d.mca", g_dir, k);
        compile_quant("int8", opt[k], art[k]);
        json_t *c = calibration(art[k]);
        json_t *s = json_object_get(c, "full_pass");
        if (k < 2)
            assert_null(s);
        else
            assert_string_equal(json_string_value(s), "bf16");
        json_decref(c);
    }
    same_same_differs(art);
}

static void test_calib_refine_off_is_named_and_changes_the_bytes(void **state)
{
    (void)state;
    static const char *const values[] = {"on", "off", NULL};
    refused("--calib-refine", "off", "maybe", values);
    static const char *const opt[3] = {"", "--calib-refine on", "--calib-refine off"};
    char *art[3];
    for (int k = 0; k < 3; k++) {
        art[k] = tu_fmt("%s/refine%d.mca", g_dir, k);
        char *out = NULL, *err = NULL;
        assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                    "%s/llama --target 64MiB --quant int4 --group 32 "
                                    "--calib %s %s --json -o %s",
                                    MC_FIXTURE_DIR, g_ids, opt[k], art[k]), 0);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        json_t *eff = json_object_get(json_object_get(j, "calibration"), "effort");
        const char *eo = json_string_value(json_object_get(eff, "options"));
        assert_non_null(eo);
        assert_true((strstr(eo, "--calib-refine off") != NULL) == (k == 2));
        assert_true(json_is_boolean(json_object_get(eff, "refine")));
        assert_true(json_is_true(json_object_get(eff, "refine")) == (k < 2));
        json_decref(j);
        json_t *c = calibration(art[k]);
        json_t *r = json_object_get(c, "refine");
        if (k < 2)
            assert_null(r);
        else
            assert_true(json_is_false(r));
        json_decref(c);
        assert_int_equal(tu_run_bin(&out, &err, "mcompile", "inspect %s", art[k]), 0);
        assert_true((strstr(out, "GPTQ codes: unrefined") != NULL) == (k == 2));
        free(out);
        free(err);
    }
    same_same_differs(art);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq_grid_needs_calib_and_names_its_values),
        cmocka_unit_test(test_awq_grid_recorded_only_for_the_coarse_walk),
        cmocka_unit_test(test_calib_stats_needs_calib_and_names_its_values),
        cmocka_unit_test(test_calib_stats_recorded_only_for_bf16),
        cmocka_unit_test(test_calib_forward_needs_calib_and_names_its_values),
        cmocka_unit_test(test_calib_forward_recorded_only_for_bf16),
        cmocka_unit_test(test_calib_full_pass_needs_calib_and_names_its_values),
        cmocka_unit_test(test_calib_full_pass_recorded_only_for_bf16),
        cmocka_unit_test(test_calib_full_pass_int8_default_is_float),
        cmocka_unit_test(test_calib_refine_off_is_named_and_changes_the_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

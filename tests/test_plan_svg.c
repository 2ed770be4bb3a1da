/* test_plan_svg.c - the plan picture: well-formed SVG with every element,
 * rendered by headless Chromium when it is installed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_plan.h"
#include "cmp_svg.h"
#include "mc_alloc.h"
#include "testutil.h"

static int count_substr(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Build the plan of a fixture at a fixed target and render it. */
static char *render_fixture(const char *model, const char *target,
                            uint32_t batch, uint64_t seq, int *fits)
{
    char *cfgpath = tu_fmt("%s/%s/config.json", MC_FIXTURE_DIR, model);
    fmt_model_config cfg;
    mc_error err;
    assert_int_equal(fmt_config_load(cfgpath, &cfg, &err), MC_OK);
    free(cfgpath);
    cmp_plan_request req;
    cmp_plan_request_default(&req);
    assert_int_equal(cmp_parse_size(target, &req.target_bytes), 0);
    req.max_batch = batch;
    req.max_seq = seq;
    cmp_plan *plan = calloc(1, sizeof *plan);
    assert_non_null(plan);
    mc_status st = cmp_plan_build(&cfg, &req, plan, &err);
    assert_true(st == MC_OK || st == MC_ERR_PLAN);
    *fits = plan->fits;
    char *svg = NULL;
    assert_int_equal(cmp_plan_svg(&cfg, plan, &svg, &err), MC_OK);
    free(plan);
    return svg;
}

static void test_plan_svg_has_a_bar_per_format_and_the_frontier(void **state)
{
    (void)state;
    int fits;
    char *svg = render_fixture("llama", "64MiB", 0, 0, &fits);
    assert_true(fits);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "id=\"budget-bars\""));
    assert_int_equal(count_substr(svg, "class=\"seg-weights\""), 4);
    assert_int_equal(count_substr(svg, "class=\"seg-kv\""), 4);
    assert_int_equal(count_substr(svg, "class=\"seg-activations\""), 4);
    assert_int_equal(count_substr(svg, "class=\"seg-headroom\""), 4);
    assert_non_null(strstr(svg, "id=\"target-line\""));
    assert_non_null(strstr(svg, "id=\"frontier\""));
    assert_true(count_substr(svg, "class=\"frontier-point\"") >= 2);
    assert_non_null(strstr(svg, "id=\"chosen-point\""));
    assert_non_null(strstr(svg, "</svg>"));
    mc_free(svg);
}

static void test_plan_svg_marks_formats_that_do_not_fit(void **state)
{
    (void)state;
    int fits;
    /* llama fixture weights: ~0.6 MiB at f32; a tiny target with a long
     * context makes f32 overflow while int4 may still fit. */
    char *svg = render_fixture("llama", "1MiB", 1, 256, &fits);
    assert_non_null(strstr(svg, "data-fits=\"false\""));
    assert_non_null(strstr(svg, "(over)"));
    mc_free(svg);
}

static void test_plan_svg_renders_in_headless_chromium(void **state)
{
    (void)state;
    const char *browser = NULL;
    static const char *const candidates[] = {"/usr/bin/chromium",
                                             "/usr/bin/chromium-browser"};
    for (size_t i = 0; i < 2; i++)
        if (access(candidates[i], X_OK) == 0)
            browser = candidates[i];
    TU_SKIP_IF(!browser, "chromium not installed (apt-get install chromium)");
    int fits;
    char *svg = render_fixture("mistral", "64MiB", 0, 0, &fits);
    char *dir = tu_mkdtemp("svg");
    char *path = tu_fmt("%s/plan.svg", dir);
    assert_int_equal(tu_write_file(path, svg, strlen(svg)), 0);
    char *cmd = tu_fmt("'%s' --headless --no-sandbox --disable-gpu "
                       "--user-data-dir='%s/profile' --dump-dom 'file://%s'",
                       browser, dir, path);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        printf("chromium stderr: %s\n", err);
    assert_int_equal(rc, 0);
    /* The DOM Chromium built: an svg root, no XML parse error, and the
     * elements of the picture. */
    assert_null(strstr(out, "parsererror"));
    assert_non_null(strstr(out, "<svg"));
    assert_non_null(strstr(out, "budget-bars"));
    assert_true(count_substr(out, "seg-weights") >= 4);
    assert_non_null(strstr(out, "frontier-point"));
    /* And it draws: a screenshot of the page is a non-empty PNG. */
    char *shot = tu_fmt("%s/plan.png", dir);
    char *cmd2 = tu_fmt("'%s' --headless --no-sandbox --disable-gpu "
                        "--user-data-dir='%s/profile' --window-size=960,520 "
                        "--screenshot='%s' 'file://%s'",
                        browser, dir, shot, path);
    free(out);
    free(err);
    rc = tu_run(cmd2, &out, &err);
    assert_int_equal(rc, 0);
    size_t len = 0;
    char *png = tu_read_file(shot, &len);
    assert_non_null(png);
    assert_true(len > 1000);
    assert_memory_equal(png, "\x89PNG", 4);
    free(png);
    free(out);
    free(err);
    free(cmd);
    free(cmd2);
    free(shot);
    free(path);
    tu_rmtree(dir);
    free(dir);
    mc_free(svg);
}

static void test_plan_cli_writes_the_svg_file(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("svgcli");
    char *path = tu_fmt("%s/plan.svg", dir);
    char *cmd = tu_fmt("'%s/mcompile' plan '%s/qwen2' --target 64MiB --svg '%s'",
                       MC_BIN_DIR, MC_FIXTURE_DIR, path);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    size_t len = 0;
    char *svg = tu_read_file(path, &len);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "id=\"budget-bars\""));
    assert_non_null(strstr(svg, "</svg>"));
    /* nothing but the picture is left in the directory (no temp files) */
    assert_int_equal(tu_count_entries(dir), 1);
    free(svg);
    free(out);
    free(err);
    free(cmd);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_svg_has_a_bar_per_format_and_the_frontier),
        cmocka_unit_test(test_plan_svg_marks_formats_that_do_not_fit),
        cmocka_unit_test(test_plan_svg_renders_in_headless_chromium),
        cmocka_unit_test(test_plan_cli_writes_the_svg_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

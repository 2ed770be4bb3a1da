/* test_artifact_chaos.c - every allocation of the artifact reader, the
 * runtime loader and the compiler fails in turn (mc_alloc_fail_after):
 * each call must fail cleanly (an error status, no crash, nothing leaked,
 * no partial output file) and succeed once allocations work again. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"
#include "rt_artifact.h"
#include "testutil.h"

static char *g_dir, *g_art;

static int setup(void **state)
{
    (void)state;
    mc_alloc_install_jansson();
    g_dir = tu_mkdtemp("chaos");
    g_art = tu_fmt("%s/a.mca", g_dir);
    char *model = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    cmp_wpolicy_parse("int4", 32, &o.req.policy, NULL);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 2;
    o.req.max_seq = 32;
    o.model = model;
    o.out = g_art;
    o.compress = 1;
    mc_error err;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    free(model);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    free(g_art);
    return 0;
}

static void test_reader_survives_every_failed_allocation(void **state)
{
    (void)state;
    long n = 0;
    for (;; n++) {
        fmt_art *a = NULL;
        mc_error err;
        mc_alloc_fail_after(n);
        mc_status st = fmt_art_open(g_art, &a, &err);
        if (st == MC_OK)
            st = fmt_art_verify(a, NULL, &err);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_art_close(a);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_not_equal(st, MC_OK); /* every allocation is needed */
    }
    printf("reader: %ld allocation failures survived\n", n);
}

static void test_loader_survives_every_failed_allocation(void **state)
{
    (void)state;
    long n = 0;
    for (;; n++) {
        rt_model *m = NULL;
        mc_error err;
        mc_alloc_fail_after(n);
        mc_status st = rt_model_open_artifact(g_art, &m, &err);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            rt_model_free(m);
            break;
        }
        if (st == MC_OK) /* the failure hit an allocation with a fallback */
            rt_model_free(m);
        else
            assert_null(m);
    }
    printf("runtime loader: %ld allocation failures survived\n", n);
}

static void test_compile_survives_every_failed_allocation(void **state)
{
    (void)state;
    char *model = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    char *out = tu_fmt("%s/c.mca", g_dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    cmp_wpolicy_parse("int8", 0, &o.req.policy, NULL);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 1;
    o.req.max_seq = 16;
    o.model = model;
    o.out = out;
    /* Every allocation point normally; every 5th under the sanitizers
     * (each point is a whole compile, and ASan makes them slow). */
    const long step = getenv("MC_UNDER_SANITIZER") ? 5 : 1;
    long n = 0, failed = 0;
    for (;; n += step) {
        mc_error err;
        mc_alloc_fail_after(n);
        mc_status st = cmp_compile(&o, NULL, &err);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        if (st != MC_OK) {
            failed++;
            assert_false(tu_exists(out)); /* nothing partial */
        } else {
            remove(out);
        }
        assert_int_equal(tu_count_entries(g_dir), 1); /* only a.mca: no temps */
    }
    printf("compile: %ld allocation points (every %ld tried), %ld failed "
           "cleanly\n", n, step, failed);
    free(model);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_survives_every_failed_allocation),
        cmocka_unit_test(test_loader_survives_every_failed_allocation),
        cmocka_unit_test(test_compile_survives_every_failed_allocation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_spill.c - cmp_spill: buffers written out come back, byte for byte,
 * from one read-only mapping at aligned addresses; the file leaves no name
 * behind; bad directories are refused naming them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "cmp_spill.h"
#include "mc_alloc.h"
#include "testutil.h"

static void test_spill_round_trip(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("spill");
    cmp_spill *s = NULL;
    mc_error e;
    assert_int_equal(cmp_spill_create(dir, &s, &e), MC_OK);
    enum { N = 5 };
    size_t sizes[N] = {1, 100, 4096, 65537, 3};
    void *slot[N];
    unsigned char *copy[N];
    tu_rng g = {5};
    for (int i = 0; i < N; i++) {
        slot[i] = mc_malloc(sizes[i]);
        copy[i] = malloc(sizes[i]);
        assert_non_null(slot[i]);
        for (size_t k = 0; k < sizes[i]; k++)
            copy[i][k] = ((unsigned char *)slot[i])[k] = (unsigned char)tu_rng_u32(&g);
        assert_int_equal(cmp_spill_put(s, &slot[i], sizes[i], "buffer", &e), MC_OK);
        assert_null(slot[i]); /* freed, to be filled by the map */
    }
    void *none = NULL;
    assert_int_equal(cmp_spill_put(s, &none, 10, "nothing", &e), MC_OK);
    assert_true(cmp_spill_bytes(s) >= 4096 + 65537 + 100);
    assert_int_equal(tu_count_entries(dir), 0); /* no name left behind */
    assert_int_equal(cmp_spill_map(s, &e), MC_OK);
    assert_null(none);
    for (int i = 0; i < N; i++) {
        assert_non_null(slot[i]);
        assert_int_equal((uintptr_t)slot[i] % 64, 0);
        assert_true(cmp_spill_owns(s, slot[i]));
        assert_memory_equal(slot[i], copy[i], sizes[i]);
        free(copy[i]);
    }
    int local;
    assert_false(cmp_spill_owns(s, &local));
    /* no puts after the map */
    void *late = mc_malloc(8);
    assert_int_equal(cmp_spill_put(s, &late, 8, "late", &e), MC_ERR_INVALID_ARG);
    mc_free(late);
    cmp_spill_free(s);
    cmp_spill_free(NULL);
    tu_rmtree(dir);
    free(dir);
}

static void test_spill_refuses_missing_directory(void **state)
{
    (void)state;
    cmp_spill *s = NULL;
    mc_error e;
    assert_int_equal(cmp_spill_create("/nonexistent/mcompile-spill", &s, &e),
                     MC_ERR_IO);
    assert_null(s);
    assert_non_null(strstr(e.message, "/nonexistent/mcompile-spill"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spill_round_trip),
        cmocka_unit_test(test_spill_refuses_missing_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

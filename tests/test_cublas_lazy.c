/* test_cublas_lazy.c - cuBLAS is loaded at its first call, not at start
 * (kernels/cuda/kn_cublas_lazy.c): neither this process (linked like
 * mcompile) nor the two programs map libcublas until a cuBLAS call, and the
 * first call does load it.  Needs a CUDA build, not a device: without a
 * device cublasCreate fails, but only after loading the library. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#ifdef MC_HAVE_CUDA
#include <cublas_v2.h>

#include "kn_cuda.h"

/* 1 when `needle` occurs in a line of the stream. */
static int stream_has(FILE *f, const char *needle)
{
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle))
            found = 1;
    return found;
}

static int self_maps_cublas(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    int found = stream_has(f, "libcublas");
    fclose(f);
    return found;
}

/* Runs first: nothing in this process has called cuBLAS yet. */
static void test_cublas_not_mapped_at_start(void **state)
{
    (void)state;
    assert_int_equal(kn_cublas_loaded(), 0);
    assert_int_equal(self_maps_cublas(), 0);
}

/* The dynamic loader's list for each program (LD_TRACE_LOADED_OBJECTS makes
 * ld.so print what it would load, without running the program). */
static void test_programs_do_not_link_cublas(void **state)
{
    (void)state;
    const char *progs[] = {"mcompile", "mrun"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "LD_TRACE_LOADED_OBJECTS=1 '%s/%s'",
                 MC_BIN_DIR, progs[i]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        char line[4096];
        int libc = 0, cublas = 0;
        while (fgets(line, sizeof line, p)) {
            libc |= strstr(line, "libc.so") != NULL;
            cublas |= strstr(line, "libcublas") != NULL;
        }
        assert_int_equal(pclose(p), 0);
        /* libc in the list shows the trace really listed the libraries */
        assert_int_equal(libc, 1);
        assert_int_equal(cublas, 0);
    }
}

static void test_first_cublas_call_loads_cublas(void **state)
{
    (void)state;
    cublasHandle_t h = NULL;
    cublasStatus_t st = cublasCreate(&h);
    const char *msg = cublasGetStatusString(st);
    assert_non_null(msg);
    assert_true(msg[0] != '\0');
    /* A CUDA build finds its own toolkit's cuBLAS: loading must work even
     * where creating a handle does not (no device). */
    if (!kn_cublas_loaded())
        fail_msg("cuBLAS not loaded: %s", msg);
    assert_int_equal(self_maps_cublas(), 1);
    if (st == CUBLAS_STATUS_SUCCESS)
        assert_int_equal(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cublas_not_mapped_at_start),
        cmocka_unit_test(test_programs_do_not_link_cublas),
        cmocka_unit_test(test_first_cublas_call_loads_cublas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* !MC_HAVE_CUDA */

static void test_cublas_lazy_skipped_without_cuda_build(void **state)
{
    (void)state;
    TU_SKIP_IF(1, "built without CUDA (MC_HAVE_CUDA undefined): no cuBLAS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cublas_lazy_skipped_without_cuda_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif

/* mc_alloc.c - allocation wrappers with a fault-injection countdown. */
#include "mc_alloc.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic long fail_countdown = -1;
static _Atomic uint64_t alloc_count;
static _Atomic int failure_injected;

static int should_fail(void)
{
    atomic_fetch_add(&alloc_count, 1);
    long c = atomic_load(&fail_countdown);
    if (c < 0)
        return 0;
    if (c == 0) {
        atomic_store(&failure_injected, 1);
        return 1; /* stays at 0: every later allocation fails too */
    }
    atomic_fetch_sub(&fail_countdown, 1);
    return 0;
}

void *mc_malloc(size_t size)
{
    if (should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *mc_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *mc_realloc(void *p, size_t size)
{
    if (should_fail())
        return NULL;
    return realloc(p, size ? size : 1);
}

void mc_free(void *p)
{
    free(p);
}

char *mc_strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = mc_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *mc_malloc_array(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return mc_malloc(n * size);
}

void mc_alloc_fail_after(long n)
{
    atomic_store(&failure_injected, 0);
    atomic_store(&fail_countdown, n);
}

uint64_t mc_alloc_count(void)
{
    return atomic_load(&alloc_count);
}

void mc_alloc_reset_count(void)
{
    atomic_store(&alloc_count, 0);
}

int mc_alloc_failure_injected(void)
{
    return atomic_load(&failure_injected);
}

static void *json_malloc(size_t n)
{
    return mc_malloc(n);
}

void mc_alloc_install_jansson(void)
{
    json_set_alloc_funcs(json_malloc, mc_free);
}

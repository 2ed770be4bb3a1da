/* mc_alloc.c - allocation wrappers with a fault-injection countdown. */
#include "mc_alloc.h"

#include <jansson.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic long fail_countdown = -1;
static _Atomic uint64_t alloc_count;
static _Atomic int failure_injected;
static _Atomic int tracking;
static _Atomic int64_t live_bytes;
static _Atomic int64_t peak_bytes;

/* Usable sizes, not requested ones: what the heap really holds, and it
 * needs no header, so a block allocated before tracking started (or by
 * plain malloc) can still be freed here. */
static void track_add(void *p)
{
    if (!p || !atomic_load_explicit(&tracking, memory_order_relaxed))
        return;
    int64_t now = atomic_fetch_add(&live_bytes, (int64_t)malloc_usable_size(p)) +
                  (int64_t)malloc_usable_size(p);
    int64_t pk = atomic_load(&peak_bytes);
    while (now > pk && !atomic_compare_exchange_weak(&peak_bytes, &pk, now))
        ;
}

static void track_sub(void *p)
{
    if (p && atomic_load_explicit(&tracking, memory_order_relaxed))
        atomic_fetch_sub(&live_bytes, (int64_t)malloc_usable_size(p));
}

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
    void *p = malloc(size ? size : 1);
    track_add(p);
    return p;
}

void *mc_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    track_add(p);
    return p;
}

void *mc_zeroed(size_t n, size_t size)
{
    void *p = mc_malloc_array(n ? n : 1, size ? size : 1);
    if (p)
        memset(p, 0, (n ? n : 1) * (size ? size : 1));
    return p;
}

void *mc_realloc(void *p, size_t size)
{
    if (should_fail())
        return NULL;
    /* On failure realloc leaves p allocated: count it out only on success. */
    size_t before = p && atomic_load(&tracking) ? malloc_usable_size(p) : 0;
    void *q = realloc(p, size ? size : 1);
    if (q) {
        atomic_fetch_sub(&live_bytes, (int64_t)before);
        track_add(q);
    }
    return q;
}

void mc_free(void *p)
{
    track_sub(p);
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

void mc_alloc_track(int on)
{
    atomic_store(&tracking, on ? 1 : 0);
}

int64_t mc_alloc_live_bytes(void)
{
    return atomic_load(&live_bytes);
}

int64_t mc_alloc_peak_bytes(void)
{
    return atomic_load(&peak_bytes);
}

void mc_alloc_reset_peak(void)
{
    atomic_store(&peak_bytes, atomic_load(&live_bytes));
}

static void *json_malloc(size_t n)
{
    return mc_malloc(n);
}

void mc_alloc_install_jansson(void)
{
    json_set_alloc_funcs(json_malloc, mc_free);
}

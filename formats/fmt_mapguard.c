/* fmt_mapguard.c - SIGBUS on a truncated mapped input becomes an error
 * (see fmt_mapguard.h for the design). */
#include "fmt_mapguard.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SLOTS 128

/* A slot is published by storing its base last (non-zero = in use), and
 * retired by clearing it first, so the handler never reads a half-written
 * entry. */
static struct {
    _Atomic uintptr_t base;
    size_t len;
    char path[PATH_MAX];
} slots[SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* The page size, read outside the handler (sysconf is not
 * async-signal-safe). */
static uintptr_t page_size = 4096;

/* The first file that faulted, for the error message. */
static _Atomic int tripped;
static char tripped_path[PATH_MAX];

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t b = atomic_load(&slots[i].base);
        if (!b || a < b || a - b >= slots[i].len)
            continue;
        uintptr_t from = a & ~(page_size - 1);
        size_t n = (size_t)(b + slots[i].len - from);
        /* Zero pages from the fault to the end: the read is retried and
         * succeeds; the run goes on to a check that refuses its results. */
        void *m = mmap((void *)from, n, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (m == MAP_FAILED)
            break;
        int expected = 0;
        if (atomic_compare_exchange_strong(&tripped, &expected, 2)) {
            memcpy(tripped_path, slots[i].path, sizeof tripped_path);
            atomic_store(&tripped, 1);
        }
        return;
    }
    /* Not ours: die by the signal as if no handler were installed. */
    signal(sig, SIG_DFL);
}

void fmt_mapguard_install(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0)
        page_size = (uintptr_t)ps;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGBUS, &sa, NULL);
}

int fmt_mapguard_watch(const void *base, size_t len, const char *path)
{
    if (!base || !len)
        return -1;
    pthread_mutex_lock(&slots_lock);
    int s = -1;
    for (int i = 0; i < SLOTS && s < 0; i++)
        if (!atomic_load(&slots[i].base))
            s = i;
    if (s >= 0) {
        slots[s].len = len;
        snprintf(slots[s].path, sizeof slots[s].path, "%s",
                 path ? path : "<mapped file>");
        atomic_store(&slots[s].base, (uintptr_t)base);
    }
    pthread_mutex_unlock(&slots_lock);
    return s;
}

void fmt_mapguard_unwatch(int slot)
{
    if (slot < 0 || slot >= SLOTS)
        return;
    pthread_mutex_lock(&slots_lock);
    atomic_store(&slots[slot].base, 0);
    pthread_mutex_unlock(&slots_lock);
}

/* The watched slot whose mapping holds [a, a + n), or -1; under
 * slots_lock. */
static int slot_of(uintptr_t a, size_t n)
{
    if (!a || !n || a + n < a)
        return -1;
    for (int i = 0; i < SLOTS; i++) {
        uintptr_t b = atomic_load(&slots[i].base);
        if (b && a >= b && a - b <= slots[i].len && n <= slots[i].len - (a - b))
            return i;
    }
    return -1;
}

int fmt_mapguard_covers(const void *p, size_t n)
{
    pthread_mutex_lock(&slots_lock);
    int i = slot_of((uintptr_t)p, n);
    pthread_mutex_unlock(&slots_lock);
    return i >= 0;
}

size_t fmt_mapguard_drop(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t dropped = 0;
    pthread_mutex_lock(&slots_lock);
    int i = slot_of(a, n);
    if (i >= 0) {
        /* whole pages, not past the mapping (its base is page-aligned) */
        uintptr_t b = atomic_load(&slots[i].base);
        uintptr_t lo = a & ~(page_size - 1);
        uintptr_t hi = (a + n + page_size - 1) & ~(page_size - 1);
        uintptr_t end = (b + slots[i].len + page_size - 1) & ~(page_size - 1);
        if (hi > end)
            hi = end;
        if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0)
            dropped = hi - lo;
    }
    pthread_mutex_unlock(&slots_lock);
    return dropped;
}

mc_status fmt_mapguard_check(mc_error *err)
{
    if (atomic_load(&tripped) == 0)
        return MC_OK;
    /* 2: the handler is copying the path right now; it takes a moment */
    while (atomic_load(&tripped) != 1)
        sched_yield();
    return mc_fail(err, MC_ERR_IO, tripped_path, NULL, -1,
                   "the file changed size while it was being read (another "
                   "process truncated or rewrote it); results from it were "
                   "discarded and nothing was written");
}

/* cmp_par.c - row-parallel loops (see cmp_par.h). */
#include "cmp_par.h"

#include <pthread.h>
#include <time.h>

double cmp_par_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

cmp_clock cmp_par_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    cmp_clock c = {cmp_par_now(), (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec};
    return c;
}

cmp_clock cmp_par_clock_add(cmp_clock *acc, cmp_clock t0)
{
    cmp_clock t = cmp_par_clock();
    acc->wall += t.wall - t0.wall;
    acc->cpu += t.cpu - t0.cpu;
    return t;
}

void cmp_par_clock_add_outer(cmp_clock *acc, cmp_clock t0,
                             const cmp_clock *inner, cmp_clock inner0)
{
    cmp_par_clock_add(acc, t0);
    acc->wall -= inner->wall - inner0.wall;
    acc->cpu -= inner->cpu - inner0.cpu;
}

int cmp_par_threads(const kn_pool *p)
{
    return p ? kn_pool_threads(p) : 1;
}

typedef struct par_job {
    uint32_t n, align;
    cmp_par_fn fn;
    void *ctx;
} par_job;

/* Row where slot t's range starts: t/T of the aligned blocks. */
static uint32_t range_start(const par_job *j, int t, int T)
{
    uint64_t blocks = ((uint64_t)j->n + j->align - 1) / j->align;
    uint64_t r = blocks * (uint64_t)t / (uint64_t)T * j->align;
    return r < j->n ? (uint32_t)r : j->n;
}

static void par_thread(void *ctx, int tid, int nth)
{
    const par_job *j = ctx;
    uint32_t r0 = range_start(j, tid, nth), r1 = range_start(j, tid + 1, nth);
    if (r1 > r0)
        j->fn(j->ctx, r0, r1, tid);
}

void cmp_par_rows(kn_pool *p, uint32_t n, uint32_t align, cmp_par_fn fn,
                  void *ctx)
{
    if (n == 0)
        return;
    if (cmp_par_threads(p) <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    par_job j = {n, align ? align : 1, fn, ctx};
    /* Threads started for the call, not the pool's: its workers spin
     * about 1 ms after every job and its caller spins until the last
     * part is done, and the factorizations run thousands of these
     * regions (a column or a row each): a profile of the SmolLM-shape
     * calibration on the loaded 2-core machine had 23 % of the CPU in
     * kn_pool's waits. */
    cmp_par_spawn(cmp_par_threads(p), par_thread, &j);
}

typedef struct spawn_part {
    void (*fn)(void *ctx, int tid, int nth);
    void *ctx;
    int tid, nth;
} spawn_part;

static void *spawn_main(void *arg)
{
    const spawn_part *q = arg;
    q->fn(q->ctx, q->tid, q->nth);
    return NULL;
}

void cmp_par_spawn(int nth, void (*fn)(void *ctx, int tid, int nth),
                   void *ctx)
{
    if (nth < 1)
        nth = 1;
    if (nth > CMP_PAR_MAX_SPAWN)
        nth = CMP_PAR_MAX_SPAWN;
    spawn_part part[CMP_PAR_MAX_SPAWN];
    pthread_t th[CMP_PAR_MAX_SPAWN];
    int started[CMP_PAR_MAX_SPAWN];
    for (int i = 0; i < nth; i++) {
        part[i] = (spawn_part){fn, ctx, i, nth};
        started[i] = i > 0 &&
                     pthread_create(&th[i], NULL, spawn_main, &part[i]) == 0;
    }
    for (int i = 0; i < nth; i++)
        if (!started[i]) /* tid 0, and any thread that could not start */
            spawn_main(&part[i]);
    for (int i = 1; i < nth; i++)
        if (started[i])
            pthread_join(th[i], NULL);
}

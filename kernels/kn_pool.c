/* kn_pool.c - a fixed pool of persistent worker threads (see kn_ops.h).
 *
 * kn_pool_run publishes (fn, ctx) under a generation counter; workers spin
 * briefly on the counter (a matmul is followed by the next within
 * microseconds during decode) and then sleep on a condition variable, so an
 * idle pool costs nothing on a shared machine.  The caller runs as thread 0
 * and waits for the others the same way: spin, then sleep.
 *
 * The spin yields the CPU every few steps.  A job is split statically, so
 * it ends when its last share does; when the machine has other work, or
 * the pool more threads than CPUs, the thread holding that share may be
 * waiting for the very CPU a finished thread spins on, and a pure spin
 * keeps it waiting for a time slice (milliseconds) per job.  Measured on 2
 * CPUs, SmolLM2 shape int4 batch-1 decode (bench_vs): 4 threads 8.1 ->
 * 176.7 tok/s, 2 threads beside a busy process 14-16 -> 82-99 tok/s,
 * 2 threads alone 213 either way.
 *
 * A shared job (kn_pool_run_shared: its threads claim the work as they go)
 * ends when the caller's call returns and the workers that ENTERED it
 * return: a worker enters with one compare-and-swap on `entry`, which the
 * caller closes when its own call is done, so a worker parked past that
 * point skips the job (it never reads fn or ctx of a job it did not
 * enter).  Ordinary jobs wait for every worker as before.  Beside a busy
 * process, 2 threads, SmolLM2 int4 decode: tg1 101.6 -> 108.7, tg8
 * 277.8 -> 310.7 tok/s (medians of 4); quiet, no change beyond the
 * spread. */
#include "kn_ops.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "kn_cpus.h"
#include "mc_alloc.h"

/* Iterations of the brief spin before sleeping (a few microseconds). */
#define KN_POOL_SPIN 20000
/* Spin steps between yields (sched_yield costs ~0.2 us when nothing else
 * wants the CPU). */
#define KN_POOL_YIELD_EVERY 16

struct kn_pool {
    int nthreads;                 /* including the caller */
    pthread_t *threads;           /* [nthreads - 1] workers */
    pthread_mutex_t mu;           /* guards sleeping on the two conds */
    pthread_cond_t cv_work;       /* gen changed or stop */
    pthread_cond_t cv_done;       /* done reached the job's target */
    void (*fn)(void *ctx, int tid, int nth); /* current job */
    void *ctx;
    atomic_uint gen;              /* incremented once per job */
    /* The job's admission: gen << 32 | KN_POOL_CLOSED | workers entered.
     * A worker runs the job only if it enters it (one CAS); a shared job
     * is closed by its caller when the caller's call returns, so a worker
     * parked until then skips it without touching fn or ctx. */
    _Atomic uint64_t entry;
    atomic_int done;              /* entered workers that have returned */
    atomic_int shared;            /* the job may close before all enter */
    atomic_int stop;              /* 1: workers exit */
};

#define KN_POOL_CLOSED (UINT64_C(1) << 31)
#define KN_POOL_COUNT (KN_POOL_CLOSED - 1)

/* The number of returns the job's caller waits for: every worker for a
 * job that is not shared, those that entered once a shared one is closed,
 * -1 (not known yet) before that. */
static int job_target(const kn_pool *p, uint64_t e)
{
    if (e & KN_POOL_CLOSED)
        return (int)(e & KN_POOL_COUNT);
    return atomic_load(&p->shared) ? -1 : p->nthreads - 1;
}

typedef struct kn_worker_arg {
    kn_pool *p;
    int tid;
} kn_worker_arg;

/* One step of a spin: a pause, and every KN_POOL_YIELD_EVERY steps a
 * yield, so that a thread the scheduler parked on this CPU (the one whose
 * share the job still waits for, when the machine has other work or fewer
 * CPUs than threads) runs now instead of after our time slice. */
static inline void kn_spin_step(int i)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((i % KN_POOL_YIELD_EVERY) == KN_POOL_YIELD_EVERY - 1)
        sched_yield();
}

static void *kn_worker_main(void *arg)
{
    kn_pool *p = ((kn_worker_arg *)arg)->p;
    int tid = ((kn_worker_arg *)arg)->tid;
    mc_free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < KN_POOL_SPIN; i++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed))
                break;
            kn_spin_step(i);
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (g == seen && atomic_load(&p->stop))
            return NULL;
        seen = g;
        /* Enter job g unless its caller closed it (a shared job finished
         * without us) or a newer one replaced it (the loop sees that). */
        uint64_t e = atomic_load(&p->entry);
        int in = 0;
        while (!in && (unsigned)(e >> 32) == g && !(e & KN_POOL_CLOSED))
            in = atomic_compare_exchange_weak(&p->entry, &e, e + 1);
        if (!in)
            continue;
        p->fn(p->ctx, tid, p->nthreads);
        /* seq_cst: either this load sees the close, or the caller's load
         * after closing sees this return (no lost wake-up).  When this
         * return completes the job the caller may already be publishing
         * the next one; a signal computed from it is only spurious. */
        int d = atomic_fetch_add(&p->done, 1) + 1;
        if (d == job_target(p, atomic_load(&p->entry))) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

kn_pool *kn_pool_create(int nthreads)
{
    if (nthreads <= 0)
        nthreads = kn_cpu_count();
    if (nthreads > 256)
        nthreads = 256;
    kn_pool *p = mc_calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = 1;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        mc_free(p);
        return NULL;
    }
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (nthreads > 1) {
        p->threads = mc_calloc((size_t)nthreads - 1, sizeof *p->threads);
        if (!p->threads) {
            kn_pool_free(p);
            return NULL;
        }
    }
    for (int i = 1; i < nthreads; i++) {
        kn_worker_arg *a = mc_malloc(sizeof *a);
        if (!a) {
            kn_pool_free(p);
            return NULL;
        }
        a->p = p;
        a->tid = i;
        if (pthread_create(&p->threads[i - 1], NULL, kn_worker_main, a) != 0) {
            mc_free(a);
            kn_pool_free(p);
            return NULL;
        }
        p->nthreads = i + 1; /* threads[0 .. i-1] are running */
    }
    return p;
}

void kn_pool_free(kn_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    mc_free(p->threads);
    mc_free(p);
}

int kn_pool_threads(const kn_pool *p)
{
    return p ? p->nthreads : 1;
}

static void run(kn_pool *p, void (*fn)(void *ctx, int tid, int nth), void *ctx,
                int shared)
{
    if (!p || p->nthreads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* Nothing of the previous job is running: its caller (us) waited for
     * every worker that entered it. */
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->shared, shared);
    atomic_store(&p->done, 0);
    unsigned g = atomic_load(&p->gen) + 1;
    atomic_store(&p->entry, (uint64_t)g << 32); /* publishes fn and ctx */
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->gen, g);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->nthreads);

    int target = shared ? (int)(atomic_fetch_or(&p->entry, KN_POOL_CLOSED) & KN_POOL_COUNT)
                        : p->nthreads - 1;
    for (int i = 0; i < KN_POOL_SPIN; i++) {
        if (atomic_load(&p->done) == target)
            return;
        kn_spin_step(i);
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->done) != target)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void kn_pool_run(kn_pool *p, void (*fn)(void *ctx, int tid, int nth),
                 void *ctx)
{
    run(p, fn, ctx, 0);
}

void kn_pool_run_shared(kn_pool *p, void (*fn)(void *ctx, int tid, int nth),
                        void *ctx)
{
    run(p, fn, ctx, 1);
}

static atomic_size_t g_min_values; /* 0: KN_POOL_MIN_VALUES */

size_t kn_pool_min_values(void)
{
    size_t v = atomic_load(&g_min_values);
    return v ? v : KN_POOL_MIN_VALUES;
}

void kn_set_pool_min_values(size_t v)
{
    atomic_store(&g_min_values, v);
}

/* kn_pool_rows: units [0, n) claimed KN_POOL_ROWS_CLAIMS times per thread
 * at most, so a parked worker leaves little for the others. */
#define KN_POOL_ROWS_CLAIMS 4

typedef struct rows_job {
    void (*fn)(void *ctx, size_t u0, size_t u1);
    void *ctx;
    size_t n, chunk;
    atomic_size_t next;
} rows_job;

static void rows_task(void *c, int tid, int nth)
{
    (void)tid;
    (void)nth;
    rows_job *j = c;
    for (;;) {
        size_t u0 = atomic_fetch_add(&j->next, j->chunk);
        if (u0 >= j->n)
            return;
        size_t u1 = j->n - u0 < j->chunk ? j->n : u0 + j->chunk;
        j->fn(j->ctx, u0, u1);
    }
}

void kn_pool_rows(kn_pool *p, size_t n, size_t min_units,
                  void (*fn)(void *ctx, size_t u0, size_t u1), void *ctx)
{
    int nth = p ? kn_pool_threads(p) : 1;
    if (nth < 2 || n < 2 || n < min_units) {
        if (n)
            fn(ctx, 0, n);
        return;
    }
    rows_job j = {fn, ctx, n, 0, 0};
    size_t parts = (size_t)nth * KN_POOL_ROWS_CLAIMS;
    j.chunk = (n + parts - 1) / parts;
    atomic_init(&j.next, 0);
    kn_pool_run_shared(p, rows_task, &j);
}

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
 * 2 threads alone 213 either way. */
#include "kn_ops.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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
    pthread_cond_t cv_done;       /* remaining reached 0 */
    void (*fn)(void *ctx, int tid, int nth); /* current job */
    void *ctx;
    atomic_uint gen;              /* incremented once per job */
    atomic_int remaining;         /* workers still running the job */
    atomic_int stop;              /* 1: workers exit */
};

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
        p->fn(p->ctx, tid, p->nthreads);
        if (atomic_fetch_sub_explicit(&p->remaining, 1,
                                      memory_order_acq_rel) == 1) {
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

void kn_pool_run(kn_pool *p, void (*fn)(void *ctx, int tid, int nth),
                 void *ctx)
{
    if (!p || p->nthreads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->remaining, p->nthreads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, p->nthreads);

    for (int i = 0; i < KN_POOL_SPIN; i++) {
        if (atomic_load_explicit(&p->remaining, memory_order_acquire) == 0)
            return;
        kn_spin_step(i);
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->remaining, memory_order_acquire) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/*
 * kn_steal.h - a decode product's rows shared out with stealing, for
 * kn_pool_run_shared.
 *
 * Each thread owns the contiguous share of rows kn_task_rows gives it and
 * streams it front to back, KN_STEAL_ROWS rows a claim, as a static split
 * does.  A thread whose share is done claims rows from the BACK of the
 * others' shares, so the share of a thread the scheduler has parked
 * (another process on its CPU) is finished by the threads that run, and
 * kn_pool_run_shared returns without waiting for the parked one.  On a
 * quiet machine the owners finish together and little is stolen: each
 * still reads one sequential stream (a shared counter handing out
 * interleaved chunks measured 16 % slower, docs/benchmarks.md, session
 * 12).
 *
 * A claim is one compare-and-swap on the share's (front, back) pair, so
 * every chunk is computed by exactly one thread; the claimer sets its Y
 * rows to the bias (or 0) first.  Which thread computes a row does not
 * change its bits (each output element's sum is the kernels' canonical
 * order whatever the range, kn_gemm.h), so results depend neither on the
 * thread count nor on who stole what.  Nothing allocates: the state lives
 * in the caller's job context.
 */
#ifndef KN_STEAL_H
#define KN_STEAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kn_gemm.h"
#include "kn_internal.h"
#include "kn_ops.h"

#define KN_STEAL_ROWS 96u   /* rows per claim: a multiple of 16 (panels,
                               kn_task_rows) and of 6 (kn_dec_avx512's tile) */
#define KN_STEAL_THREADS 16 /* more threads than this split statically */

typedef struct kn_steal_share {
    _Alignas(64) _Atomic uint64_t fb; /* front | back << 32, in claims */
} kn_steal_share;

typedef struct kn_steal {
    kn_steal_share s[KN_STEAL_THREADS];
    uint32_t rows, share; /* share: rows per thread, kn_task_rows' */
    int nth;
} kn_steal;

/* 1 if kn_steal can split rows over nth threads. */
static inline int kn_steal_ok(int nth)
{
    return nth > 1 && nth <= KN_STEAL_THREADS;
}

/* Before the job: thread t's share [t * share, min((t + 1) * share, rows))
 * in claims of KN_STEAL_ROWS rows.  Requires kn_steal_ok(nth). */
static inline void kn_steal_init(kn_steal *st, uint32_t rows, int nth)
{
    uint32_t share = (uint32_t)(((uint64_t)rows + (uint64_t)nth - 1) / (uint64_t)nth);
    share = (share + 15) & ~15u;
    st->rows = rows;
    st->share = share;
    st->nth = nth;
    for (int t = 0; t < nth; t++) {
        uint64_t a = (uint64_t)share * (uint64_t)t, n = 0;
        if (a < rows) {
            uint64_t len = rows - a < share ? rows - a : share;
            n = (len + KN_STEAL_ROWS - 1) / KN_STEAL_ROWS;
        }
        atomic_init(&st->s[t].fb, n << 32);
    }
}

/* Claim a chunk of share v, from its front (its owner) or its back; 1 and
 * the rows in [*r0, *r1), or 0 when the share is used up. */
static inline int kn_steal_claim(kn_steal *st, int v, int front,
                                 uint32_t *r0, uint32_t *r1)
{
    _Atomic uint64_t *fb = &st->s[v].fb;
    uint64_t cur = atomic_load_explicit(fb, memory_order_relaxed);
    for (;;) {
        uint64_t f = cur & 0xffffffffu, b = cur >> 32;
        if (f >= b)
            return 0;
        uint64_t next = front ? cur + 1 : ((b - 1) << 32) | f;
        if (atomic_compare_exchange_weak_explicit(fb, &cur, next,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed)) {
            uint64_t k = front ? f : b - 1;
            uint64_t a = (uint64_t)st->share * (uint64_t)v + k * KN_STEAL_ROWS;
            uint64_t end = (uint64_t)st->share * (uint64_t)(v + 1);
            if (end > st->rows)
                end = st->rows;
            *r0 = (uint32_t)a;
            *r1 = (uint32_t)(a + KN_STEAL_ROWS < end ? a + KN_STEAL_ROWS : end);
            return 1;
        }
    }
}

/* Thread tid's next rows: its own share's front first, then the back of
 * the others' shares (tid + 1, tid + 2, ... around); *victim starts at 0
 * and carries the walk between calls.  Y rows of the claim are set to
 * bias (or 0) for T tokens.  0 when no rows are left anywhere. */
static inline int kn_steal_next(kn_steal *st, int tid, int *victim, float *Y,
                                size_t T, const float *bias, uint32_t *r0,
                                uint32_t *r1)
{
    int got = 0;
    while (*victim < st->nth && !got) {
        got = kn_steal_claim(st, (tid + *victim) % st->nth, *victim == 0, r0, r1);
        if (!got)
            (*victim)++;
    }
    if (!got)
        return 0;
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = *r0; r < *r1; r++)
            Y[t * st->rows + r] = bias ? bias[r] : 0.0f;
    return 1;
}

/* st set up for a product of `rows` rows of T tokens on pool `use` when it
 * is a decode product (T <= KN_GEMM_MIN_T) over kn_steal_ok threads: run
 * it with kn_pool_run_shared.  NULL otherwise: kn_pool_run, static shares
 * (the prefill GEMM packs its panels per range, so it keeps one range). */
static inline kn_steal *kn_steal_for(kn_steal *st, uint32_t rows, size_t T,
                                     const kn_pool *use)
{
    int nth = kn_pool_threads(use);
    if (T > KN_GEMM_MIN_T || !kn_steal_ok(nth))
        return NULL;
    kn_steal_init(st, rows, nth);
    return st;
}

/* Thread tid's next range of a product's rows: kn_steal_next's claims with
 * st, kn_task_rows' one share without (Y set to bias or 0 either way).
 * *it starts at 0.  0 when the thread has no more rows. */
static inline int kn_rows_next(kn_steal *st, int tid, int nth, int *it, float *Y,
                               size_t T, uint32_t rows, const float *bias,
                               uint32_t *r0, uint32_t *r1)
{
    if (st)
        return kn_steal_next(st, tid, it, Y, T, bias, r0, r1);
    if ((*it)++)
        return 0;
    return kn_task_rows(Y, T, rows, bias, tid, nth, r0, r1);
}

#endif

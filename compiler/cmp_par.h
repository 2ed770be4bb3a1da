/*
 * cmp_par.h - the calibration's row-parallel loops on a kn_pool.
 *
 * GPTQ, the scale refit, the code descent, the retarget solve and the
 * output-error measures treat the rows of a weight matrix independently
 * once their shared inputs (H, its factor) are ready.  cmp_par_rows hands
 * each of as many threads as the pool has one contiguous range of rows;
 * the threads are started for the call (cmp_par_spawn), not the pool's
 * own, whose idle spinning cost more than the work of the many small
 * regions a factorization runs.  Every row's result is
 * computed exactly as it would be alone, and sums over rows are added in
 * row order afterwards by the caller, so results do not depend on the
 * number of threads: an artifact is the same on 2 cores and on 64.
 *
 * Work space: callers allocate one scratch set per thread up front, in the
 * calling thread (cmp_par_threads tells how many), so that allocation
 * failures are reported in one place and the memory plan can count them.
 */
#ifndef CMP_PAR_H
#define CMP_PAR_H

#include <stdint.h>

#include "kn_ops.h"

/* Threads cmp_par_rows runs on: kn_pool_threads(p), 1 for NULL. */
int cmp_par_threads(const kn_pool *p);

/* fn(ctx, r0, r1, slot) over contiguous ranges covering [0, n): slot t <
 * cmp_par_threads(p) gets rows [t * n / T, (t + 1) * n / T) rounded to
 * multiples of align (>= 1; the last range ends at n), possibly empty.
 * p NULL or one thread: fn(ctx, 0, n, 0) on the calling thread; else slot
 * 0 on the calling thread and the others on threads started and joined
 * by the call (cmp_par_spawn; p only gives the count).  fn must not use
 * the pool itself. */
typedef void (*cmp_par_fn)(void *ctx, uint32_t r0, uint32_t r1, int slot);
void cmp_par_rows(kn_pool *p, uint32_t n, uint32_t align, cmp_par_fn fn,
                  void *ctx);

/* fn(ctx, tid, nth) for every tid < nth (at most CMP_PAR_MAX_SPAWN): tid 0
 * on the calling thread, the others on threads started for this call and
 * joined before it returns (a thread that cannot start has its share run
 * on the caller afterwards).  Nothing spins: for work that takes
 * milliseconds per call next to a thread of its own (the merge's and the
 * compile's writers), where a pool's idle spinning (kn_pool: ~1 ms per wait
 * on CPUs whose pause is ~140 cycles) would take that thread's core. */
#define CMP_PAR_MAX_SPAWN 64
void cmp_par_spawn(int nth, void (*fn)(void *ctx, int tid, int nth),
                   void *ctx);

/* Monotonic seconds (CLOCK_MONOTONIC). */
double cmp_par_now(void);

/* A phase's seconds: wall (monotonic) and CPU (every thread of the
 * process, CLOCK_PROCESS_CPUTIME_ID: pool workers spinning count too).
 * The calibration's phase times (cmp_calib_times) are sums of these: on a
 * shared machine the CPU seconds are the steadier figure. */
typedef struct cmp_clock {
    double wall, cpu;
} cmp_clock;
/* The clocks now (as a point in time). */
cmp_clock cmp_par_clock(void);
/* *acc += now - t0 (both clocks); returns now. */
cmp_clock cmp_par_clock_add(cmp_clock *acc, cmp_clock t0);
/* *acc += (now - t0) - (*inner - inner0): an outer phase's time less
 * what an inner phase (*inner, which read inner0 at t0) took meanwhile. */
void cmp_par_clock_add_outer(cmp_clock *acc, cmp_clock t0,
                             const cmp_clock *inner, cmp_clock inner0);

#endif /* CMP_PAR_H */

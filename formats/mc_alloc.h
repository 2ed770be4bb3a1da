/*
 * mc_alloc.h - the allocator every mcompile library allocation goes through.
 *
 * Why: fault injection.  Tests set a countdown with mc_alloc_fail_after(n);
 * the n-th allocation after that returns NULL (and every one after it, until
 * reset), so each error path that follows a failed allocation runs under the
 * sanitizers.  jansson is routed here too (mc_alloc_install_jansson), so JSON
 * parsing fails the same way.  Behaviour matches malloc/calloc/realloc/free:
 * mc_free(NULL) is a no-op, mc_calloc checks n*size for overflow.
 */
#ifndef MC_ALLOC_H
#define MC_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *mc_malloc(size_t size);
void *mc_calloc(size_t n, size_t size);
void *mc_realloc(void *p, size_t size);
void mc_free(void *p);
char *mc_strdup(const char *s);
/* malloc(n*size) with overflow check; NULL on overflow. */
void *mc_malloc_array(size_t n, size_t size);
/* As mc_calloc, but the zeros are written now, so each page is the
 * process's own before any thread reads it.  For sums that threads read
 * and then add to: a calloc'd page that is read first maps the shared
 * zero page, and the first write then replaces it and flushes the other
 * threads' TLBs with an interrupt each (perf, the calibration's
 * statistics: ~1.3 % of a compile's CPU in those interrupts). */
void *mc_zeroed(size_t n, size_t size);

/* Fault injection.  n < 0 disables (the default).  n == 0 fails the next
 * allocation.  Returns nothing; mc_alloc_count() says how many allocations
 * were attempted since the last mc_alloc_reset_count(). */
void mc_alloc_fail_after(long n);
uint64_t mc_alloc_count(void);
void mc_alloc_reset_count(void);
/* 1 if an injected failure has happened since mc_alloc_fail_after(). */
int mc_alloc_failure_injected(void);

/* Memory accounting, for checking memory estimates against what a run
 * really holds.  Off by default (no cost but one relaxed load per call).
 * While on, every mc_ allocation adds its usable size (malloc_usable_size:
 * the requested size plus the allocator's rounding) to a live count and
 * every mc_free subtracts it; the peak is the highest live count since the
 * last mc_alloc_reset_peak().  Blocks allocated before tracking started
 * are subtracted when freed, so measure as peak - live at the reset.
 * Thread-safe. */
void mc_alloc_track(int on);
int64_t mc_alloc_live_bytes(void);
int64_t mc_alloc_peak_bytes(void);
void mc_alloc_reset_peak(void);

/* Route jansson's allocations through mc_malloc/mc_free.  Idempotent. */
void mc_alloc_install_jansson(void);

#endif /* MC_ALLOC_H */

/*
 * fmt_mapguard.h - a mapped input that shrinks while we read it.
 *
 * Safetensors shards and artifacts are mapped, not read.  If another
 * process truncates such a file meanwhile, touching a page past the new
 * end raises SIGBUS, which would kill the process and leave its temporary
 * output behind.
 *
 * The choice, and why: the mapped bytes are read everywhere (merge math,
 * conversion, quantization, the forward pass), on the worker threads of a
 * pool, so a sigsetjmp/siglongjmp around "the regions that read mapped
 * input" would mean a jump buffer in every worker and unwinding through
 * pool code that holds locks.  Reading instead of mapping would copy every
 * weight once more (the runtime maps weights so that they cost no copy).
 * Instead the SIGBUS handler installed here looks up the faulting address
 * among the watched mappings, maps anonymous zero pages over the rest of
 * that mapping (so the faulting read, re-executed, sees zeros and every
 * thread runs on), and records which file it was.  The run's results are
 * then worthless but harmless, and they are never published:
 * fmt_atomic_commit and fmt_atomic_dir_commit call fmt_mapguard_check
 * first and fail (removing the temporary) when a mapped input shrank, and
 * the runtime checks it before it returns results.  The error names the
 * file.  A SIGBUS at an address we do not watch keeps its default action
 * (the process dies by it, as before).
 *
 * Signal safety: the handler uses only atomics, mmap and memcpy into a
 * static buffer; the table is fixed-size (no allocation).
 */
#ifndef FMT_MAPGUARD_H
#define FMT_MAPGUARD_H

#include <stddef.h>

#include "mc_error.h"

/* Install the SIGBUS handler.  Called once by the programs (a library user
 * decides for itself); without it a truncated input kills the process. */
void fmt_mapguard_install(void);

/* Watch the mapping [base, base + len) of path (the path is copied).
 * Returns a slot for fmt_mapguard_unwatch, or -1 when the table is full
 * (the mapping is then unguarded: a fault kills the process as before). */
int fmt_mapguard_watch(const void *base, size_t len, const char *path);
/* Stop watching (before munmap).  -1 is a no-op. */
void fmt_mapguard_unwatch(int slot);

/* Drop the pages of [p, p + n) from the process's resident set when the
 * range lies inside one watched mapping (madvise MADV_DONTNEED, rounded
 * out to whole pages inside it): the mappings are read-only views of
 * files, so a page touched again is read back from the file (the page
 * cache), the same bytes.  For memory that is read once and done with,
 * like a calibrated block's source weights.  Returns the bytes dropped
 * (0: not in a watched mapping, e.g. a heap copy, or madvise refused). */
size_t fmt_mapguard_drop(const void *p, size_t n);
/* 1 when [p, p + n) lies inside one watched mapping (what
 * fmt_mapguard_drop can drop), else 0. */
int fmt_mapguard_covers(const void *p, size_t n);

/* MC_OK, or MC_ERR_IO naming the first mapped input that shrank while in
 * use during this process's life ("changed size while being read"). */
mc_status fmt_mapguard_check(mc_error *err);

#endif /* FMT_MAPGUARD_H */

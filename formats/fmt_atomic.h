/*
 * fmt_atomic.h - outputs that appear whole or not at all.
 *
 * A file is written to "<dir>/.<name>.mctmp-<pid>-<n>-<place>" in the destination's
 * directory, fsynced, renamed over the final name, and the directory is
 * fsynced.  A directory output (merge writes a model directory) is built in
 * "<parent>/.<name>.mctmp-<pid>-<n>-<place>/" and swapped in at commit; a previous
 * output stays intact until that instant.
 *
 * Every temp path in use is registered; fmt_atomic_install_signal_handlers()
 * makes SIGINT/SIGTERM/SIGHUP remove them before the process dies with the
 * same signal.  After SIGKILL nothing can clean up, so temp names carry the
 * pid and where it lives (<place>: a hash of the host name and the PID
 * namespace): fmt_atomic_sweep_stale() removes temps in a directory whose
 * pid, of this place, is no longer alive (another place's pid cannot be
 * judged from here: a container sharing the volume), and every create
 * calls it for its own directory.
 * Write errors (ENOSPC, EIO, short writes) are reported with the path.
 * Writeback of a file's data starts every 8 MiB written (sync_file_range,
 * without waiting: an I/O error still surfaces at the commit's fsync), so
 * the disk works while the caller computes and the commit waits only for
 * the tail -- 0.9 s -> 5 ms for a 2 GiB merge shard.
 */
#ifndef FMT_ATOMIC_H
#define FMT_ATOMIC_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

typedef struct fmt_atomic_file fmt_atomic_file;

mc_status fmt_atomic_create(const char *final_path, fmt_atomic_file **out,
                            mc_error *err);
/* Write all n bytes (retries short writes, reports ENOSPC/EIO). */
mc_status fmt_atomic_write(fmt_atomic_file *f, const void *data, size_t n,
                           mc_error *err);
/* Bytes written so far. */
uint64_t fmt_atomic_tell(const fmt_atomic_file *f);
const char *fmt_atomic_temp_path(const fmt_atomic_file *f);
/* fsync, rename into place, fsync the directory; frees f in all cases. */
mc_status fmt_atomic_commit(fmt_atomic_file *f, mc_error *err);
/* Remove the temp file and free f.  NULL is a no-op. */
void fmt_atomic_abort(fmt_atomic_file *f);

typedef struct fmt_atomic_dir fmt_atomic_dir;

/* Start building directory final_dir.  Files inside are written with
 * fmt_atomic_create(fmt_atomic_dir_path(d) + "/name") or plain writes. */
mc_status fmt_atomic_dir_create(const char *final_dir, fmt_atomic_dir **out,
                                mc_error *err);
/* The temporary directory to write into (borrowed). */
const char *fmt_atomic_dir_path(const fmt_atomic_dir *d);
/* fsync the contents, replace final_dir (an old one is removed only after
 * the new one is in place), free d in all cases. */
mc_status fmt_atomic_dir_commit(fmt_atomic_dir *d, mc_error *err);
/* Remove the temporary directory and free d.  NULL is a no-op. */
void fmt_atomic_dir_abort(fmt_atomic_dir *d);

/* Install SIGINT/SIGTERM/SIGHUP handlers that remove registered temps and
 * re-raise.  Called once by the programs, not by the library. */
void fmt_atomic_install_signal_handlers(void);
/* Remove stale temps (dead owner pid) in dir; returns how many. */
int fmt_atomic_sweep_stale(const char *dir);

#endif /* FMT_ATOMIC_H */

/*
 * kn_cpus.h - how many CPUs this process may keep busy.
 *
 * The thread pool (kn_ops.h) splits each job statically, so threads beyond
 * the process's CPUs do not just share cores: every matrix product waits
 * for whichever thread the scheduler has parked.  Measured on 2 CPUs
 * (SmolLM2-135M shape, int4, batch-1 decode), with a pool that spun
 * without yielding: 2 threads 209 tok/s, 3 threads 9.8, 4 threads 7.1
 * (kn_pool.c now yields in its spin, which keeps 4 threads near 2's, but
 * no thread count above the CPUs is faster).  So the default thread
 * counts (the pools, mrun, mcompile, merge) come from here, not from the
 * CPUs online:
 *
 *   kn_cpu_count() = min(the CPUs in the affinity mask (taskset, cpusets),
 *                        the cgroup CPU limit rounded up (docker --cpus,
 *                        Kubernetes CPU limits), if there is one), >= 1.
 *
 * The cgroup limit is the lowest found on the path from the process's own
 * cgroup up to the mount's root (what a container sees): cgroup v2
 * cpu.max ("max 100000" or "150000 100000" -> 2), v1 cpu.cfs_quota_us
 * over cpu.cfs_period_us (-1 = none).  A missing, unreadable or malformed
 * file is no limit; only regular files are read, at most 63 bytes each.
 * Read on every call (a few small files): callers size pools, not steps.
 */
#ifndef KN_CPUS_H
#define KN_CPUS_H

#include <stddef.h>
#include <stdint.h>

int kn_cpu_count(void);

/* The pieces, for tests and the fuzz target.  Each returns CPUs (>= 1),
 * or 0 for "no limit" (including text that is not what the kernel
 * writes).  Texts need not be NUL-terminated. */

/* cgroup v2 cpu.max: "max[ PERIOD]" or "QUOTA[ PERIOD]" (period default
 * 100000), ceil(QUOTA / PERIOD). */
uint32_t kn_cpu_quota_v2(const char *text, size_t len);
/* cgroup v1: ceil(quota / period) for quota > 0. */
uint32_t kn_cpu_quota_v1(const char *quota, size_t qlen, const char *period,
                         size_t plen);
/* The lowest limit for the process whose /proc/self/cgroup reads
 * proc_cgroup, with the cgroup file systems mounted at root (normally
 * "/sys/fs/cgroup": v2 there or at root/unified, v1's cpu controller at
 * root/<its controllers> or root/cpu).  Paths with a ".." element are
 * ignored. */
uint32_t kn_cpu_quota_at(const char *root, const char *proc_cgroup, size_t len);

#endif

/* fuzz_cgroup_cpu.c - the cgroup CPU limit's parsers (kn_cpus.h): any
 * bytes as cpu.max, as cfs_quota_us / cfs_period_us (split at the first
 * NUL) and as /proc/self/cgroup (under a root that does not exist, so the
 * walk builds and checks paths but opens nothing) give a CPU count within
 * range, never a crash or an out-of-bounds read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kn_cpus.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *t = (const char *)data;
    if (kn_cpu_quota_v2(t, size) > 65536u)
        abort();
    const char *nul = memchr(t, '\0', size);
    size_t q = nul ? (size_t)(nul - t) : size;
    size_t rest = nul ? size - q - 1 : 0;
    if (kn_cpu_quota_v1(t, q, nul ? nul + 1 : t + size, rest) > 65536u)
        abort();
    if (kn_cpu_quota_at("/nonexistent-mcompile-fuzz-root", t, size) != 0)
        abort();
    return 0;
}

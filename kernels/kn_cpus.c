/* kn_cpus.c - how many CPUs this process may keep busy (see kn_cpus.h). */
#include "kn_cpus.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Above any real machine; keeps the arithmetic below in range. */
#define KN_CPUS_MAX 65536u

/* Skip spaces and tabs from text[*at]. */
static void skip_blanks(const char *t, size_t len, size_t *at)
{
    while (*at < len && (t[*at] == ' ' || t[*at] == '\t'))
        (*at)++;
}

/* A decimal number of up to 18 digits at text[*at] into *v; 0 if none. */
static int read_u64(const char *t, size_t len, size_t *at, uint64_t *v)
{
    size_t i = *at;
    uint64_t x = 0;
    while (i < len && t[i] >= '0' && t[i] <= '9' && i - *at < 18)
        x = x * 10 + (uint64_t)(t[i++] - '0');
    if (i == *at || (i < len && t[i] >= '0' && t[i] <= '9'))
        return 0; /* no digits, or too many */
    *at = i;
    *v = x;
    return 1;
}

/* Only trailing white space (the kernel's newline) may follow. */
static int at_end(const char *t, size_t len, size_t at)
{
    for (; at < len; at++)
        if (t[at] != ' ' && t[at] != '\t' && t[at] != '\n' && t[at] != '\0')
            return 0;
    return 1;
}

static uint32_t ceil_cpus(uint64_t quota, uint64_t period)
{
    if (quota == 0 || period == 0)
        return 0;
    uint64_t c = quota / period + (quota % period != 0);
    return c > KN_CPUS_MAX ? KN_CPUS_MAX : (uint32_t)c;
}

uint32_t kn_cpu_quota_v2(const char *t, size_t len)
{
    size_t at = 0;
    uint64_t quota = 0, period = 100000;
    skip_blanks(t, len, &at);
    if (len - at >= 3 && memcmp(t + at, "max", 3) == 0)
        return 0; /* no limit */
    if (!read_u64(t, len, &at, &quota))
        return 0;
    size_t before = at;
    skip_blanks(t, len, &at);
    if (at > before && at < len && t[at] != '\n' && !read_u64(t, len, &at, &period))
        return 0;
    return at_end(t, len, at) ? ceil_cpus(quota, period) : 0;
}

uint32_t kn_cpu_quota_v1(const char *q, size_t qlen, const char *p, size_t plen)
{
    size_t qa = 0, pa = 0;
    uint64_t quota, period;
    skip_blanks(q, qlen, &qa);
    skip_blanks(p, plen, &pa);
    if (!read_u64(q, qlen, &qa, &quota) || !at_end(q, qlen, qa) ||
        !read_u64(p, plen, &pa, &period) || !at_end(p, plen, pa))
        return 0; /* "-1" (no limit) lands here too */
    return ceil_cpus(quota, period);
}

/* Up to cap - 1 bytes of the regular file dir/name into buf; -1 if it
 * cannot be read (O_NONBLOCK: a FIFO put there does not hang us). */
static ssize_t read_small(const char *dir, const char *name, char *buf, size_t cap)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -1;
    struct stat st;
    ssize_t got = -1;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        got = read(fd, buf, cap - 1);
    close(fd);
    return got;
}

static uint32_t limit_in(const char *dir, int v2)
{
    char a[64], b[64];
    if (v2) {
        ssize_t n = read_small(dir, "cpu.max", a, sizeof a);
        return n > 0 ? kn_cpu_quota_v2(a, (size_t)n) : 0;
    }
    ssize_t nq = read_small(dir, "cpu.cfs_quota_us", a, sizeof a);
    ssize_t np = nq > 0 ? read_small(dir, "cpu.cfs_period_us", b, sizeof b) : -1;
    return np > 0 ? kn_cpu_quota_v1(a, (size_t)nq, b, (size_t)np) : 0;
}

static uint32_t lower(uint32_t a, uint32_t b)
{
    return a == 0 ? b : b == 0 ? a : a < b ? a : b;
}

/* The lowest limit in base + path and each of its parents up to base. */
static uint32_t lowest_on_path(const char *base, const char *path, size_t plen, int v2)
{
    char dir[PATH_MAX];
    size_t blen = strlen(base);
    int n = snprintf(dir, sizeof dir, "%s%.*s", base, (int)plen, path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return 0;
    uint32_t best = 0;
    size_t end = (size_t)n;
    for (;;) {
        while (end > blen && dir[end - 1] == '/')
            end--;
        dir[end] = '\0';
        best = lower(best, limit_in(dir, v2));
        if (end <= blen)
            return best;
        while (end > blen && dir[end - 1] != '/')
            end--;
    }
}

/* A cgroup path as the kernel writes it: absolute, no "." or ".."
 * element (the text is read, so it is checked like any input). */
static int path_ok(const char *p, size_t n)
{
    if (n == 0 || p[0] != '/')
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\0')
            return 0;
        if (p[i] == '.' && (i == 0 || p[i - 1] == '/') &&
            (i + 1 == n || p[i + 1] == '/' ||
             (p[i + 1] == '.' && (i + 2 == n || p[i + 2] == '/'))))
            return 0;
    }
    return 1;
}

/* Does the comma-separated list c[0..n) name the "cpu" controller? */
static int names_cpu(const char *c, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && c[j] != ',')
            j++;
        if (j - i == 3 && memcmp(c + i, "cpu", 3) == 0)
            return 1;
        i = j + 1;
    }
    return 0;
}

uint32_t kn_cpu_quota_at(const char *root, const char *t, size_t len)
{
    uint32_t best = 0;
    char base[PATH_MAX];
    for (size_t at = 0; at < len;) {
        size_t eol = at;
        while (eol < len && t[eol] != '\n')
            eol++;
        /* ID:CONTROLLERS:PATH */
        const char *line = t + at;
        size_t n = eol - at, c1 = 0, c2;
        at = eol + 1;
        while (c1 < n && line[c1] != ':')
            c1++;
        for (c2 = c1 + 1; c2 < n && line[c2] != ':'; c2++)
            ;
        if (c1 >= n || c2 >= n)
            continue;
        const char *ctl = line + c1 + 1, *path = line + c2 + 1;
        size_t nctl = c2 - c1 - 1, npath = n - c2 - 1;
        if (!path_ok(path, npath))
            continue;
        if (c1 == 1 && line[0] == '0' && nctl == 0) { /* v2 */
            best = lower(best, lowest_on_path(root, path, npath, 1));
            int m = snprintf(base, sizeof base, "%s/unified", root);
            if (m > 0 && (size_t)m < sizeof base)
                best = lower(best, lowest_on_path(base, path, npath, 1));
        } else if (names_cpu(ctl, nctl)) { /* v1's cpu controller */
            int m = snprintf(base, sizeof base, "%s/%.*s", root, (int)nctl, ctl);
            if (m > 0 && (size_t)m < sizeof base && memchr(ctl, '/', nctl) == NULL)
                best = lower(best, lowest_on_path(base, path, npath, 0));
            m = snprintf(base, sizeof base, "%s/cpu", root);
            if (m > 0 && (size_t)m < sizeof base)
                best = lower(best, lowest_on_path(base, path, npath, 0));
        }
    }
    return best;
}

/* The affinity mask's CPUs (a mask for up to 8192 CPUs on the stack, so
 * nothing allocates); the CPUs online if it cannot be read. */
static uint32_t affinity_cpus(void)
{
    cpu_set_t set[8];
    if (sched_getaffinity(0, sizeof set, set) == 0) {
        int n = CPU_COUNT_S(sizeof set, set);
        if (n > 0)
            return (uint32_t)n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (uint32_t)(n > KN_CPUS_MAX ? KN_CPUS_MAX : n) : 1;
}

int kn_cpu_count(void)
{
    uint32_t n = affinity_cpus();
    char text[4096];
    ssize_t len = read_small("/proc/self", "cgroup", text, sizeof text);
    if (len > 0)
        n = lower(n, kn_cpu_quota_at("/sys/fs/cgroup", text, (size_t)len));
    return n > 0 ? (int)n : 1;
}

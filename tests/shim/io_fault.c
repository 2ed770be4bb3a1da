/*
 * io_fault.c - an LD_PRELOAD shim that makes writes fail (or the process
 * die by a signal) after a given number of bytes, to test that outputs stay
 * atomic under ENOSPC, EIO, SIGINT, SIGTERM and SIGKILL.
 *
 * Driven by the environment (read once, at the first intercepted call):
 *   MC_FAULT_AFTER_BYTES=N     bytes the tracked files may receive in total;
 *                              the write that would cross N is cut short at
 *                              N (a short write), the next one fails
 *                              (default: never)
 *   MC_FAULT_WRITE_ERRNO=E     ENOSPC (default) or EIO: errno of the
 *                              failing write/pwrite, and of fsync/fdatasync
 *                              of a tracked fd once N was reached
 *   MC_FAULT_SIGNAL=S          INT, TERM or KILL: instead of failing, raise
 *                              that signal in the process when N is reached
 *   MC_FAULT_PATH_SUBSTR=s     track only files opened (open, openat, creat,
 *                              their 64-bit forms) for writing whose path
 *                              contains s; default: every file opened for
 *                              writing.  stdin/stdout/stderr are never
 *                              tracked, so error messages get through.
 *   MC_FAULT_TRUNCATE_MAPPED=s a file whose path contains s is truncated
 *                              to half its size (page-aligned) right after
 *                              it is mapped (mmap with a descriptor), as if
 *                              another process truncated it during the
 *                              run: reads of its second half then raise
 *                              SIGBUS (test of fmt_mapguard.h)
 * The shim prints nothing.  It is async-signal-safe enough for its use: no
 * allocation, atomics for the counters.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 65536

static atomic_uchar tracked[MAX_FD];
static atomic_int inited;
static long long after_bytes = -1;   /* -1: never */
static int fault_errno = ENOSPC;
static int fault_signal;             /* 0: fail with errno instead */
static char path_substr[512];
static atomic_llong written;         /* bytes accepted on tracked fds */
static atomic_int tripped;           /* the limit was reached */

/* The value of environment variable name into buf[cap] (cut to fit). */
static void env_copy(const char *name, char *buf, size_t cap)
{
    const char *s = getenv(name);
    if (!s)
        return;
    size_t n = strlen(s);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

static void init(void)
{
    if (atomic_load(&inited))
        return;
    const char *s = getenv("MC_FAULT_AFTER_BYTES");
    if (s && *s)
        after_bytes = atoll(s);
    s = getenv("MC_FAULT_WRITE_ERRNO");
    if (s && strcmp(s, "EIO") == 0)
        fault_errno = EIO;
    s = getenv("MC_FAULT_SIGNAL");
    if (s && strcmp(s, "INT") == 0)
        fault_signal = SIGINT;
    else if (s && strcmp(s, "TERM") == 0)
        fault_signal = SIGTERM;
    else if (s && strcmp(s, "KILL") == 0)
        fault_signal = SIGKILL;
    env_copy("MC_FAULT_PATH_SUBSTR", path_substr, sizeof path_substr);
    atomic_store(&inited, 1);
}

static void *next(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void note_open(int fd, const char *path, int flags)
{
    if (fd < 3 || fd >= MAX_FD)
        return;
    init();
    int writing = (flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT);
    int match = !path_substr[0] || (path && strstr(path, path_substr));
    /* A directory opened read-only for fsync is tracked too when it
     * matches, so fsync of the output's directory can fail. */
    atomic_store(&tracked[fd], (unsigned char)(match && (writing || path_substr[0])));
}

/* How many of n bytes a write on fd may pass; -1 (errno set) to fail. */
static ssize_t allow(int fd, size_t n)
{
    init();
    if (fd < 0 || fd >= MAX_FD || !atomic_load(&tracked[fd]) || after_bytes < 0)
        return (ssize_t)n;
    long long done = atomic_load(&written);
    if (done >= after_bytes) {
        atomic_store(&tripped, 1);
        if (fault_signal) {
            raise(fault_signal);
            /* INT/TERM: the program's handler ran and re-raised; if it
             * returned anyway, fail the write. */
        }
        errno = fault_errno;
        return -1;
    }
    long long room = after_bytes - done;
    size_t k = (long long)n > room ? (size_t)room : n; /* short: caller retries */
    if (k == 0 && n > 0) {
        errno = fault_errno;
        return -1;
    }
    return (ssize_t)k;
}

static void account(int fd, ssize_t w)
{
    if (w > 0 && fd >= 0 && fd < MAX_FD && atomic_load(&tracked[fd]))
        atomic_fetch_add(&written, w);
}

/* The next definition of name, looked up once into *slot (each wrapper
 * keeps its own slot). */
static void *next_once(void **slot, const char *name)
{
    if (!*slot)
        *slot = next(name);
    return *slot;
}

ssize_t write(int fd, const void *buf, size_t n)
{
    static void *slot;
    ssize_t (*real)(int, const void *, size_t) =
        (ssize_t (*)(int, const void *, size_t))next_once(&slot, "write");
    ssize_t k = allow(fd, n);
    if (k < 0)
        return -1;
    ssize_t w = real(fd, buf, (size_t)k);
    account(fd, w);
    return w;
}

static ssize_t do_pwrite(const char *name, int fd, const void *buf, size_t n,
                         off_t off)
{
    ssize_t (*real)(int, const void *, size_t, off_t) =
        (ssize_t (*)(int, const void *, size_t, off_t))next(name);
    ssize_t k = allow(fd, n);
    if (k < 0)
        return -1;
    ssize_t w = real(fd, buf, (size_t)k, off);
    account(fd, w);
    return w;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    return do_pwrite("pwrite", fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    return do_pwrite("pwrite64", fd, buf, n, off);
}

static int sync_fails(int fd)
{
    init();
    return fd >= 0 && fd < MAX_FD && atomic_load(&tracked[fd]) &&
           after_bytes >= 0 && atomic_load(&written) >= after_bytes &&
           !fault_signal;
}

/* fsync/fdatasync: fail on a tracked fd once the limit was reached. */
static int do_sync(void **slot, const char *name, int fd)
{
    int (*real)(int) = (int (*)(int))next_once(slot, name);
    if (sync_fails(fd)) {
        errno = fault_errno;
        return -1;
    }
    return real(fd);
}

int fsync(int fd)
{
    static void *slot;
    return do_sync(&slot, "fsync", fd);
}

int fdatasync(int fd)
{
    static void *slot;
    return do_sync(&slot, "fdatasync", fd);
}

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE
               ? (mode_t)va_arg(ap, int) : 0;
}

/* Calls the next name: an openat-style function (dirfd first) when at is
 * set, an open-style one otherwise; then tracks the fd. */
static int do_open(const char *name, int at, int dirfd, const char *path,
                   int flags, mode_t mode)
{
    int fd;
    if (at)
        fd = ((int (*)(int, const char *, int, ...))next(name))(dirfd, path,
                                                                flags, mode);
    else
        fd = ((int (*)(const char *, int, ...))next(name))(path, flags, mode);
    note_open(fd, path, flags);
    return fd;
}

/* The variadic wrappers read the mode argument (va_arg cannot be passed
 * on), then do_open; written out, not a macro, to keep control flow
 * visible. */
int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_open("open", 0, 0, path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_open("open64", 0, 0, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_open("openat", 1, dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return do_open("openat64", 1, dirfd, path, flags, mode);
}

static int do_creat(const char *name, const char *path, mode_t mode)
{
    int (*real)(const char *, mode_t) =
        (int (*)(const char *, mode_t))next(name);
    int fd = real(path, mode);
    note_open(fd, path, O_WRONLY | O_CREAT);
    return fd;
}

int creat(const char *path, mode_t mode)
{
    return do_creat("creat", path, mode);
}

int creat64(const char *path, mode_t mode)
{
    return do_creat("creat64", path, mode);
}

int close(int fd)
{
    static void *slot;
    int (*real)(int) = (int (*)(int))next_once(&slot, "close");
    if (fd >= 0 && fd < MAX_FD)
        atomic_store(&tracked[fd], 0);
    return real(fd);
}

/* fopen'd files (e.g. a config.json copy) go through open internally in
 * glibc without the PLT, so track them here. */
#include <stdio.h>
static FILE *do_fopen(void **slot, const char *name, const char *path,
                      const char *mode)
{
    FILE *(*real)(const char *, const char *) =
        (FILE * (*)(const char *, const char *)) next_once(slot, name);
    FILE *f = real(path, mode);
    if (f && mode && (strchr(mode, 'w') || strchr(mode, 'a') ||
                      strchr(mode, '+')))
        note_open(fileno(f), path, O_WRONLY | O_CREAT);
    return f;
}

FILE *fopen(const char *path, const char *mode)
{
    static void *slot;
    return do_fopen(&slot, "fopen", path, mode);
}

FILE *fopen64(const char *path, const char *mode)
{
    static void *slot;
    return do_fopen(&slot, "fopen64", path, mode);
}

/* mmap: after mapping a file named by MC_FAULT_TRUNCATE_MAPPED, cut the
 * file to half (the mapping stays as long as it was). */
static void *do_mmap(void **slot, const char *name, void *addr, size_t len,
                     int prot, int flags, int fd, off_t off)
{
    void *(*real)(void *, size_t, int, int, int, off_t) =
        (void *(*)(void *, size_t, int, int, int, off_t))next_once(slot, name);
    void *p = real(addr, len, prot, flags, fd, off);
    /* Read now, not in init(): under ASan the first intercepted call comes
     * from the sanitizer's start-up, before the environment is readable. */
    const char *want = getenv("MC_FAULT_TRUNCATE_MAPPED");
    if (p == MAP_FAILED || fd < 0 || !want || !*want || (flags & MAP_ANONYMOUS))
        return p;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return p;
    path[n] = '\0';
    if (strstr(path, want))
        truncate(path, (off_t)(len / 2) & ~(off_t)4095);
    return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    static void *slot;
    return do_mmap(&slot, "mmap", addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    static void *slot;
    return do_mmap(&slot, "mmap64", addr, len, prot, flags, fd, off);
}

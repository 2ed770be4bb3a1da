/* fmt_atomic.c - temp-file-then-rename outputs, their signal cleanup and the
 * sweep of temps left behind by killed processes.  See fmt_atomic.h. */
#include "fmt_atomic.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "fmt_input.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"
#include "mc_checked.h"

#define TMP_TAG ".mctmp-"
#define WRITE_BUF_BYTES (1u << 20) /* batches small writes into few syscalls */
/* Writeback of a file's data is started every WB_STEP_BYTES written
 * (sync_file_range(SYNC_FILE_RANGE_WRITE), which does not wait), so the
 * disk writes while the producer computes and the fsync at commit waits
 * only for the last few MiB instead of the whole file: a 2 GiB merge
 * shard spent 0.8-0.9 s in that fsync, every core idle.  The range ends
 * on a WB_STEP_BYTES boundary below the bytes written, so the page the
 * next write appends to is never under writeback. */
#define WB_STEP_BYTES (8u << 20)

/* ---- registry of temp paths ------------------------------------------------
 * A fixed static table, because the signal handler may only touch memory
 * that no allocator owns.  A slot's state is set to SLOT_FILE/SLOT_DIR only
 * after its path is fully written, and back to SLOT_FREE before the path may
 * be reused, so the handler never sees a half-written path (except in a
 * reuse race with another thread, which costs at most one failed unlink). */
enum { SLOT_FREE = 0, SLOT_FILE = 1, SLOT_DIR = 2 };
#define REG_SLOTS 64

static struct {
    _Atomic int state;
    char path[PATH_MAX];
} reg[REG_SLOTS];
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned long tmp_counter;

static int reg_add(const char *path, int kind)
{
    size_t n = strlen(path);
    if (n >= PATH_MAX)
        return -1;
    pthread_mutex_lock(&reg_lock);
    int slot = -1;
    for (int i = 0; i < REG_SLOTS; i++) {
        if (atomic_load(&reg[i].state) == SLOT_FREE) {
            slot = i;
            break;
        }
    }
    if (slot >= 0) {
        memcpy(reg[slot].path, path, n + 1);
        atomic_store(&reg[slot].state, kind);
    }
    pthread_mutex_unlock(&reg_lock);
    return slot;
}

static void reg_remove(int slot)
{
    if (slot >= 0 && slot < REG_SLOTS)
        atomic_store(&reg[slot].state, SLOT_FREE);
}

/* Empty a flat temp directory and remove it using only async-signal-safe
 * calls (open, getdents64 as a raw syscall, unlinkat, close, rmdir).  Model
 * directories are flat, so one level is enough here; the sweep handles the
 * rest after a crash. */
static void remove_flat_dir_signal_safe(const char *path)
{
    static char dents[8192] __attribute__((aligned(8)));
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        for (;;) {
            long n = syscall(SYS_getdents64, fd, dents, sizeof dents);
            if (n <= 0)
                break;
            for (long off = 0; off < n;) {
                /* struct linux_dirent64: u64 ino, s64 off, u16 reclen,
                 * u8 type, char name[] */
                unsigned short reclen;
                memcpy(&reclen, dents + off + 16, sizeof reclen);
                const char *name = dents + off + 19;
                if (!(name[0] == '.' && (name[1] == '\0' ||
                                         (name[1] == '.' && name[2] == '\0'))))
                    unlinkat(fd, name, 0);
                if (reclen == 0)
                    break;
                off += reclen;
            }
        }
        close(fd);
    }
    rmdir(path);
}

static void cleanup_handler(int sig)
{
    int saved = errno;
    for (int i = 0; i < REG_SLOTS; i++) {
        int st = atomic_load(&reg[i].state);
        if (st == SLOT_FILE)
            unlink(reg[i].path);
        else if (st == SLOT_DIR)
            remove_flat_dir_signal_safe(reg[i].path);
    }
    errno = saved;
    /* SA_RESETHAND restored the default action; the signal is blocked until
     * we return, then it is delivered and the process dies by it. */
    raise(sig);
}

void fmt_atomic_install_signal_handlers(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue; /* e.g. nohup: the user asked us to survive SIGHUP */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = cleanup_handler;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(sigs[i], &sa, NULL);
    }
}

/* ---- path helpers --------------------------------------------------------- */

/* Split path into a malloc'ed directory ("." if none) and its last
 * component (pointer into path, trailing slashes ignored via *name_len). */
static char *split_path(const char *path, const char **name, size_t *name_len)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    *name = path + start;
    *name_len = len - start;
    if (start == 0)
        return mc_strdup(".");
    size_t dlen = start > 1 ? start - 1 : 1; /* keep "/" for root */
    char *dir = mc_malloc(dlen + 1);
    if (dir) {
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
    }
    return dir;
}

/* "<dir>/.<name>.mctmp-<pid>-<n>", malloc'ed. */
/* Where a pid means this process: a hash of the host name and the PID
 * namespace (the inode of /proc/self/ns/pid), 8 hex digits.  A temp whose
 * name carries another place's token belongs to a process the sweep
 * cannot see (another container on a shared volume, another host over
 * NFS): kill(pid, 0) would call it dead while it writes. */
static char place_token_text[9];
static pthread_once_t place_once = PTHREAD_ONCE_INIT;

static void init_place_token(void)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    struct stat ns;
    unsigned long long ino = stat("/proc/self/ns/pid", &ns) == 0
                                 ? (unsigned long long)ns.st_ino : 0;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *c = host; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    for (int k = 0; k < 8; k++)
        h = (h ^ (uint8_t)(ino >> (8 * k))) * 16777619u;
    snprintf(place_token_text, sizeof place_token_text, "%08x", h);
}

static const char *place_token(void)
{
    pthread_once(&place_once, init_place_token);
    return place_token_text;
}

static char *temp_name(const char *dir, const char *name, size_t name_len)
{
    unsigned long n = atomic_fetch_add(&tmp_counter, 1);
    size_t cap = strlen(dir) + name_len + 64;
    char *t = mc_malloc(cap);
    if (t)
        snprintf(t, cap, "%s/.%.*s" TMP_TAG "%ld-%lu-%s", dir, (int)name_len,
                 name, (long)getpid(), n, place_token());
    return t;
}

static mc_status io_fail(mc_error *err, const char *path, const char *what,
                         const char *tmp, int e)
{
    if (tmp)
        return mc_fail(err, MC_ERR_IO, path, NULL, -1, "%s '%s' failed: %s",
                       what, tmp, strerror(e));
    return mc_fail(err, MC_ERR_IO, path, NULL, -1, "%s failed: %s", what,
                   strerror(e));
}

/* fsync a directory so a rename in it is durable.  File systems that cannot
 * fsync directories (EINVAL) are accepted: there is nothing more to do. */
static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        rc = errno;
    close(fd);
    return rc;
}

/* rm -rf using *at calls relative to dirfd (not signal-safe; normal use). */
static void remove_tree_at(int at, const char *name)
{
    if (unlinkat(at, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
        return;
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        remove_tree_at(dirfd(d), e->d_name);
    }
    closedir(d);
    unlinkat(at, name, AT_REMOVEDIR);
}

static void remove_tree(const char *path)
{
    remove_tree_at(AT_FDCWD, path);
}

/* ---- stale sweep ---------------------------------------------------------- */

/* Parse the owner pid of a temp name ".<name>.mctmp-<pid>-<n>"; 0 if the
 * name is not one of ours. */
static pid_t temp_owner(const char *name)
{
    if (name[0] != '.')
        return 0;
    const char *tag = NULL;
    for (const char *p = strstr(name, TMP_TAG); p; p = strstr(p + 1, TMP_TAG))
        tag = p; /* the last tag: the user's own name may contain one */
    if (!tag)
        return 0;
    const char *p = tag + strlen(TMP_TAG);
    long pid = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 10; p++, digits++)
        pid = pid * 10 + (*p - '0');
    if (digits == 0 || *p != '-' || pid <= 0 || pid > INT_MAX)
        return 0;
    p++;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == '\0') /* written before the names carried a place */
        return (pid_t)pid;
    /* "-TOKEN": ours to judge only when written here (place_token) */
    if (*p != '-' || strlen(p + 1) != 8 || strcmp(p + 1, place_token()) != 0)
        return 0;
    return (pid_t)pid;
}

int fmt_atomic_sweep_stale(const char *dir)
{
    if (!dir)
        return 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        pid_t pid = temp_owner(e->d_name);
        if (pid == 0 || pid == getpid())
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to judge (EPERM: alive) */
        remove_tree_at(dfd, e->d_name);
        removed++;
    }
    closedir(d);
    return removed;
}

/* ---- atomic files --------------------------------------------------------- */

struct fmt_atomic_file {
    char *final_path;     /* where the file appears at commit */
    char *temp_path;      /* registered temp in the same directory */
    char *dir;            /* directory of both, fsynced after rename */
    int fd;
    int slot;             /* registry slot of temp_path */
    unsigned char *buf;   /* pending bytes not yet written to fd */
    size_t buf_len;       /* bytes pending in buf */
    uint64_t total;       /* bytes accepted by fmt_atomic_write */
    uint64_t on_fd;       /* bytes written to fd (total - buf_len) */
    uint64_t wb_started;  /* writeback started for [0, wb_started) */
};

static void file_free(fmt_atomic_file *f)
{
    mc_free(f->final_path);
    mc_free(f->temp_path);
    mc_free(f->dir);
    mc_free(f->buf);
    mc_free(f);
}

mc_status fmt_atomic_create(const char *final_path, fmt_atomic_file **out,
                            mc_error *err)
{
    if (!out)
        return mc_fail(err, MC_ERR_INVALID_ARG, final_path, NULL, -1, "out is NULL");
    *out = NULL;
    if (!final_path || !final_path[0])
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "empty output path");
    /* Before anything is created: never an input, never a special file. */
    mc_status gst = fmt_output_check_file(final_path, err);
    if (gst != MC_OK)
        return gst;
    fmt_atomic_file *f = mc_calloc(1, sizeof *f);
    if (!f)
        return mc_fail(err, MC_ERR_NOMEM, final_path, NULL, -1,
                       "allocating an output file");
    f->fd = -1;
    f->slot = -1;
    const char *name;
    size_t name_len;
    f->final_path = mc_strdup(final_path);
    f->dir = split_path(final_path, &name, &name_len);
    f->temp_path = f->dir ? temp_name(f->dir, name, name_len) : NULL;
    f->buf = mc_malloc(WRITE_BUF_BYTES);
    if (!f->final_path || !f->temp_path || !f->buf) {
        file_free(f);
        return mc_fail(err, MC_ERR_NOMEM, final_path, NULL, -1,
                       "allocating an output file");
    }
    if (name_len == 0 || (name_len <= 2 && name[0] == '.' &&
                          (name_len == 1 || name[1] == '.'))) {
        file_free(f);
        return mc_fail(err, MC_ERR_INVALID_ARG, final_path, NULL, -1,
                       "output path does not name a file");
    }
    fmt_atomic_sweep_stale(f->dir);
    /* Register before the file exists, so no instant leaves it unlisted. */
    f->slot = reg_add(f->temp_path, SLOT_FILE);
    if (f->slot < 0) {
        file_free(f);
        return mc_fail(err, MC_ERR_INVALID_ARG, final_path, NULL, -1,
                       "too many outputs open at once (at most %d) or path "
                       "too long", REG_SLOTS);
    }
    f->fd = open(f->temp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd < 0) {
        int e = errno;
        mc_status st = io_fail(err, final_path, "creating temporary file",
                               f->temp_path, e);
        reg_remove(f->slot);
        file_free(f);
        return st;
    }
    *out = f;
    return MC_OK;
}

/* Start writing [wb_started, the last WB_STEP_BYTES boundary of on_fd)
 * to disk without waiting.  Errors are ignored here on purpose: without
 * a wait flag sync_file_range neither waits nor consumes a writeback
 * error, so an EIO still reaches the fsync at commit, and a file system
 * or file that cannot do this (EINVAL, ESPIPE, ENOSYS) is written back
 * by that fsync as before. */
static void start_writeback(fmt_atomic_file *f)
{
    uint64_t end = f->on_fd - f->on_fd % WB_STEP_BYTES;
    if (end <= f->wb_started)
        return;
    (void)sync_file_range(f->fd, (off_t)f->wb_started,
                          (off_t)(end - f->wb_started), SYNC_FILE_RANGE_WRITE);
    f->wb_started = end;
}

/* Write n bytes straight to fd, retrying short writes and EINTR. */
static mc_status write_all(fmt_atomic_file *f, const unsigned char *p, size_t n,
                           mc_error *err)
{
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return io_fail(err, f->final_path, "writing temporary file",
                           f->temp_path, errno);
        }
        if (w == 0)
            return io_fail(err, f->final_path, "writing temporary file",
                           f->temp_path, ENOSPC);
        p += w;
        n -= (size_t)w;
        f->on_fd += (uint64_t)w;
    }
    start_writeback(f);
    return MC_OK;
}

static mc_status flush_buf(fmt_atomic_file *f, mc_error *err)
{
    mc_status st = write_all(f, f->buf, f->buf_len, err);
    f->buf_len = 0;
    return st;
}

mc_status fmt_atomic_write(fmt_atomic_file *f, const void *data, size_t n,
                           mc_error *err)
{
    if (!f || (!data && n))
        return mc_fail(err, MC_ERR_INVALID_ARG, f ? f->final_path : NULL, NULL,
                       -1, "write to a NULL file or from a NULL buffer");
    uint64_t total;
    if (!mc_add_u64(f->total, n, &total))
        return mc_fail(err, MC_ERR_OVERFLOW, f->final_path, NULL, -1,
                       "output larger than 2^64 bytes");
    const unsigned char *p = data;
    if (n >= WRITE_BUF_BYTES - f->buf_len) {
        mc_status st = flush_buf(f, err);
        if (st == MC_OK && n >= WRITE_BUF_BYTES)
            st = write_all(f, p, n, err);
        else if (st == MC_OK) {
            memcpy(f->buf, p, n);
            f->buf_len = n;
        }
        if (st != MC_OK)
            return st;
    } else {
        memcpy(f->buf + f->buf_len, p, n);
        f->buf_len += n;
    }
    f->total = total;
    return MC_OK;
}

uint64_t fmt_atomic_tell(const fmt_atomic_file *f)
{
    return f ? f->total : 0;
}

const char *fmt_atomic_temp_path(const fmt_atomic_file *f)
{
    return f ? f->temp_path : NULL;
}

void fmt_atomic_abort(fmt_atomic_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    unlink(f->temp_path);
    reg_remove(f->slot);
    file_free(f);
}

mc_status fmt_atomic_commit(fmt_atomic_file *f, mc_error *err)
{
    if (!f)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1, "commit of NULL");
    /* An input that shrank while mapped made this output worthless. */
    mc_status st = fmt_mapguard_check(err);
    if (st != MC_OK) {
        fmt_atomic_abort(f);
        return st;
    }
    st = flush_buf(f, err);
    if (st == MC_OK && fsync(f->fd) != 0)
        st = io_fail(err, f->final_path, "fsync of temporary file",
                     f->temp_path, errno);
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0 && st == MC_OK)
        st = io_fail(err, f->final_path, "closing temporary file",
                     f->temp_path, errno);
    if (st == MC_OK && rename(f->temp_path, f->final_path) != 0)
        st = io_fail(err, f->final_path, "renaming temporary file",
                     f->temp_path, errno);
    if (st != MC_OK) {
        fmt_atomic_abort(f);
        return st;
    }
    reg_remove(f->slot);
    int e = fsync_dir(f->dir);
    if (e != 0)
        st = io_fail(err, f->final_path, "fsync of directory", f->dir, e);
    file_free(f);
    return st;
}

/* ---- atomic directories --------------------------------------------------- */

struct fmt_atomic_dir {
    char *final_dir;  /* directory that appears at commit */
    char *temp_dir;   /* registered temp directory beside it */
    char *parent;     /* their common parent, fsynced after the swap */
    const char *base; /* last component of final_dir (into final_dir) */
    size_t base_len;
    int slot;
};

static void dir_free(fmt_atomic_dir *d)
{
    mc_free(d->final_dir);
    mc_free(d->temp_dir);
    mc_free(d->parent);
    mc_free(d);
}

/* The marker by which fmt_output_check_dir recognises a directory we
 * wrote (and so may replace); fsynced with the rest at commit.  At
 * commit (listed) it is written again with the names of the entries the
 * directory holds: anything a user adds later is not in the list, and the
 * next run leaves the directory alone. */
static mc_status write_marker(const fmt_atomic_dir *d, int listed,
                              mc_error *err)
{
    static const char head[] =
        "This directory was written by mcompile.  A later mcompile run may\n"
        "replace it as a whole if it holds only what is listed below; a\n"
        "directory without this file is never replaced.\n";
    char *text = mc_malloc(FMT_OUTPUT_MARKER_MAX);
    if (!text)
        return mc_fail(err, MC_ERR_NOMEM, d->final_dir, NULL, -1,
                       "allocating an output directory");
    size_t len = (size_t)snprintf(text, FMT_OUTPUT_MARKER_MAX, "%s", head);
    DIR *dir = listed ? opendir(d->temp_dir) : NULL;
    if (listed && !dir) {
        mc_status st = io_fail(err, d->final_dir, "listing", d->temp_dir, errno);
        mc_free(text);
        return st;
    }
    if (dir) {
        len += (size_t)snprintf(text + len, FMT_OUTPUT_MARKER_MAX - len,
                                "%s\n", FMT_OUTPUT_MARKER_LIST);
        struct dirent *ent;
        while ((ent = readdir(dir)) != NULL) {
            const char *n = ent->d_name;
            if (!strcmp(n, ".") || !strcmp(n, "..") ||
                !strcmp(n, FMT_OUTPUT_MARKER))
                continue;
            if (len + strlen(n) + 2 >= FMT_OUTPUT_MARKER_MAX) {
                closedir(dir);
                mc_free(text);
                return mc_fail(err, MC_ERR_INVALID_ARG, d->final_dir, NULL,
                               -1, "too many entries to list in %s",
                               FMT_OUTPUT_MARKER);
            }
            len += (size_t)snprintf(text + len, FMT_OUTPUT_MARKER_MAX - len,
                                    "%s\n", n);
        }
        closedir(dir);
    }
    size_t cap = strlen(d->temp_dir) + sizeof FMT_OUTPUT_MARKER + 2;
    char *p = mc_malloc(cap);
    if (!p) {
        mc_free(text);
        return mc_fail(err, MC_ERR_NOMEM, d->final_dir, NULL, -1,
                       "allocating an output directory");
    }
    snprintf(p, cap, "%s/%s", d->temp_dir, FMT_OUTPUT_MARKER);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                  0666);
    int e = 0;
    if (fd < 0) {
        e = errno;
    } else {
        for (size_t off = 0; off < len && e == 0;) {
            ssize_t w = write(fd, text + off, len - off);
            if (w < 0 && errno != EINTR)
                e = errno;
            else if (w == 0)
                e = ENOSPC;
            else if (w > 0)
                off += (size_t)w; /* a short write: the rest follows */
        }
        if (close(fd) != 0 && e == 0)
            e = errno;
    }
    mc_free(text);
    mc_status st = e ? io_fail(err, d->final_dir, "writing the marker", p, e)
                     : MC_OK;
    mc_free(p);
    return st;
}

mc_status fmt_atomic_dir_create(const char *final_dir, fmt_atomic_dir **out,
                                mc_error *err)
{
    if (!out)
        return mc_fail(err, MC_ERR_INVALID_ARG, final_dir, NULL, -1, "out is NULL");
    *out = NULL;
    if (!final_dir || !final_dir[0])
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "empty output directory");
    /* Only a directory we wrote (or an empty one) holding no input. */
    mc_status gst = fmt_output_check_dir(final_dir, err);
    if (gst != MC_OK)
        return gst;
    fmt_atomic_dir *d = mc_calloc(1, sizeof *d);
    if (!d)
        return mc_fail(err, MC_ERR_NOMEM, final_dir, NULL, -1,
                       "allocating an output directory");
    d->slot = -1;
    d->final_dir = mc_strdup(final_dir);
    d->parent = d->final_dir ? split_path(d->final_dir, &d->base, &d->base_len)
                             : NULL;
    d->temp_dir = d->parent ? temp_name(d->parent, d->base, d->base_len) : NULL;
    if (!d->final_dir || !d->parent || !d->temp_dir) {
        dir_free(d);
        return mc_fail(err, MC_ERR_NOMEM, final_dir, NULL, -1,
                       "allocating an output directory");
    }
    if (d->base_len == 0 || d->base[0] == '/' ||
        (d->base_len <= 2 && d->base[0] == '.' &&
         (d->base_len == 1 || d->base[1] == '.'))) {
        dir_free(d);
        return mc_fail(err, MC_ERR_INVALID_ARG, final_dir, NULL, -1,
                       "output path does not name a directory");
    }
    fmt_atomic_sweep_stale(d->parent);
    d->slot = reg_add(d->temp_dir, SLOT_DIR);
    if (d->slot < 0) {
        dir_free(d);
        return mc_fail(err, MC_ERR_INVALID_ARG, final_dir, NULL, -1,
                       "too many outputs open at once (at most %d) or path "
                       "too long", REG_SLOTS);
    }
    if (mkdir(d->temp_dir, 0777) != 0) {
        mc_status st = io_fail(err, final_dir, "creating temporary directory",
                               d->temp_dir, errno);
        reg_remove(d->slot);
        dir_free(d);
        return st;
    }
    mc_status mst = write_marker(d, 0, err);
    if (mst != MC_OK) {
        fmt_atomic_dir_abort(d);
        return mst;
    }
    *out = d;
    return MC_OK;
}

const char *fmt_atomic_dir_path(const fmt_atomic_dir *d)
{
    return d ? d->temp_dir : NULL;
}

void fmt_atomic_dir_abort(fmt_atomic_dir *d)
{
    if (!d)
        return;
    remove_tree(d->temp_dir);
    reg_remove(d->slot);
    dir_free(d);
}

/* fsync every regular file directly inside dir, then dir itself: files
 * written with plain writes are not durable otherwise. */
static mc_status fsync_tree(const char *path, const char *final, mc_error *err)
{
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return io_fail(err, final, "opening temporary directory", path, errno);
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return io_fail(err, final, "reading temporary directory", path, e);
    }
    mc_status st = MC_OK;
    struct dirent *e;
    while (st == MC_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == '\0' ||
                                    (e->d_name[1] == '.' && e->d_name[2] == '\0')))
            continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue; /* a symlink or vanished entry: nothing to flush */
        if (fsync(fd) != 0 && errno != EINVAL)
            st = io_fail(err, final, "fsync of", e->d_name, errno);
        close(fd);
    }
    if (st == MC_OK && fsync(dfd) != 0 && errno != EINVAL)
        st = io_fail(err, final, "fsync of temporary directory", path, errno);
    closedir(d);
    return st;
}

mc_status fmt_atomic_dir_commit(fmt_atomic_dir *d, mc_error *err)
{
    if (!d)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1, "commit of NULL");
    mc_status st = fmt_mapguard_check(err); /* see fmt_atomic_commit */
    /* what the run wrote, for the next one; and the old output checked
     * again: a user may have put a file into it while we ran */
    if (st == MC_OK)
        st = write_marker(d, 1, err);
    if (st == MC_OK)
        st = fmt_output_check_dir(d->final_dir, err);
    if (st == MC_OK)
        st = fsync_tree(d->temp_dir, d->final_dir, err);
    if (st != MC_OK) {
        fmt_atomic_dir_abort(d);
        return st;
    }
    struct stat sb;
    if (lstat(d->final_dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            st = mc_fail(err, MC_ERR_INVALID_ARG, d->final_dir, NULL, -1,
                         "exists and is not a directory; refusing to "
                         "replace it");
            fmt_atomic_dir_abort(d);
            return st;
        }
        /* Swap in one step: the old output stays whole until the new one is
         * in place, then it is removed from the (still registered) temp. */
        if (renameat2(AT_FDCWD, d->temp_dir, AT_FDCWD, d->final_dir,
                      RENAME_EXCHANGE) != 0) {
            if (errno != EINVAL && errno != ENOSYS) {
                st = io_fail(err, d->final_dir, "swapping in directory",
                             d->temp_dir, errno);
                fmt_atomic_dir_abort(d);
                return st;
            }
            /* No RENAME_EXCHANGE on this file system: move the old one to
             * a second temp name first; final_dir is briefly absent. */
            char *old = temp_name(d->parent, d->base, d->base_len);
            int oslot = old ? reg_add(old, SLOT_DIR) : -1;
            if (!old || oslot < 0 || rename(d->final_dir, old) != 0) {
                int e = old && oslot >= 0 ? errno : ENOMEM;
                reg_remove(oslot);
                mc_free(old);
                st = io_fail(err, d->final_dir, "moving aside old directory",
                             NULL, e);
                fmt_atomic_dir_abort(d);
                return st;
            }
            if (rename(d->temp_dir, d->final_dir) != 0) {
                int e = errno;
                rename(old, d->final_dir); /* put the old output back */
                reg_remove(oslot);
                mc_free(old);
                st = io_fail(err, d->final_dir, "renaming temporary directory",
                             NULL, e);
                fmt_atomic_dir_abort(d);
                return st;
            }
            remove_tree(old);
            reg_remove(oslot);
            mc_free(old);
        } else {
            remove_tree(d->temp_dir); /* now holds the previous output */
        }
    } else if (rename(d->temp_dir, d->final_dir) != 0) {
        st = io_fail(err, d->final_dir, "renaming temporary directory",
                     d->temp_dir, errno);
        fmt_atomic_dir_abort(d);
        return st;
    }
    reg_remove(d->slot);
    int e = fsync_dir(d->parent);
    if (e != 0)
        st = io_fail(err, d->final_dir, "fsync of directory", d->parent, e);
    dir_free(d);
    return st;
}

/* fmt_input.c - non-blocking input opens, the inputs of this run, and the
 * output guard (see fmt_input.h). */
#include "fmt_input.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the inputs of this run ------------------------------------------------
 * A fixed table: a run opens a handful of files (shards, configs, an
 * adapter or two), and a fixed table cannot fail to allocate.  Should it
 * ever fill up, the guard stops trusting it and refuses to replace any
 * existing path (safe, and said so in the message). */
#define MAX_INPUTS 4096

static struct {
    dev_t dev;
    ino_t ino;
} inputs[MAX_INPUTS];
static size_t n_inputs;
static int inputs_overflow;
static int tracking; /* fmt_input_begin_run was called */
static pthread_mutex_t inputs_lock = PTHREAD_MUTEX_INITIALIZER;

void fmt_input_note(const struct stat *st)
{
    pthread_mutex_lock(&inputs_lock);
    if (!tracking) {
        pthread_mutex_unlock(&inputs_lock);
        return;
    }
    size_t i = 0;
    while (i < n_inputs &&
           !(inputs[i].dev == st->st_dev && inputs[i].ino == st->st_ino))
        i++;
    if (i == n_inputs) {
        if (n_inputs < MAX_INPUTS) {
            inputs[n_inputs].dev = st->st_dev;
            inputs[n_inputs].ino = st->st_ino;
            n_inputs++;
        } else {
            inputs_overflow = 1;
        }
    }
    pthread_mutex_unlock(&inputs_lock);
}

int fmt_input_is_input(const struct stat *st)
{
    pthread_mutex_lock(&inputs_lock);
    int found = 0;
    for (size_t i = 0; i < n_inputs && !found; i++)
        found = inputs[i].dev == st->st_dev && inputs[i].ino == st->st_ino;
    pthread_mutex_unlock(&inputs_lock);
    return found;
}

void fmt_input_begin_run(void)
{
    pthread_mutex_lock(&inputs_lock);
    tracking = 1;
    n_inputs = 0;
    inputs_overflow = 0;
    pthread_mutex_unlock(&inputs_lock);
}

static int overflowed(void)
{
    pthread_mutex_lock(&inputs_lock);
    int o = inputs_overflow;
    pthread_mutex_unlock(&inputs_lock);
    return o;
}

const char *fmt_input_kind(const struct stat *st)
{
    switch (st->st_mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "a special file";
    }
}

/* ---- opening inputs --------------------------------------------------------- */

mc_status fmt_input_open(const char *path, int *fd_out, struct stat *st_out,
                         mc_error *err)
{
    *fd_out = -1;
    if (!path || !*path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "empty input path");
    /* O_NONBLOCK: opening a FIFO with no writer, or some devices, would
     * otherwise wait forever.  O_NOCTTY: a terminal never becomes ours. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return mc_fail(err, errno == ENOENT ? MC_ERR_NOT_FOUND : MC_ERR_IO,
                       path, NULL, -1, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mc_fail(err, MC_ERR_IO, path, NULL, -1, "cannot stat: %s",
                       strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return mc_fail(err, MC_ERR_IO, path, NULL, -1,
                       "is %s, not a regular file; expected a file to read",
                       fmt_input_kind(&st));
    }
    /* A regular file never blocks, but later reads should not see EAGAIN
     * semantics either: back to an ordinary descriptor. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return mc_fail(err, MC_ERR_IO, path, NULL, -1, "fcntl failed: %s",
                       strerror(e));
    }
    fmt_input_note(&st);
    *fd_out = fd;
    if (st_out)
        *st_out = st;
    return MC_OK;
}

mc_status fmt_input_fopen(const char *path, FILE **fp, mc_error *err)
{
    *fp = NULL;
    int fd;
    mc_status s = fmt_input_open(path, &fd, NULL, err);
    if (s != MC_OK)
        return s;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return mc_fail(err, e == ENOMEM ? MC_ERR_NOMEM : MC_ERR_IO, path, NULL,
                       -1, "fdopen failed: %s", strerror(e));
    }
    *fp = f;
    return MC_OK;
}

/* ---- the output guard ------------------------------------------------------ */

static mc_status refuse(mc_error *err, const char *path, const char *why,
                        const char *what)
{
    return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                   "refusing to replace it: %s%s; nothing was written", why,
                   what ? what : "");
}

mc_status fmt_output_check_file(const char *path, mc_error *err)
{
    struct stat st;
    if (!path || !*path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "empty output path");
    if (strcmp(path, "-") == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "'-' (standard output) cannot take this output; "
                       "name a file (./- for a file called '-')");
    /* A link is refused, dangling or not: renaming over it would replace
     * the link and leave what it points to stale (/dev/stdout is one), and
     * opening through it would write wherever it points. */
    if (lstat(path, &st) != 0)
        return MC_OK; /* absent */
    if (S_ISLNK(st.st_mode))
        return refuse(err, path, "it is a symbolic link (name the file it "
                      "points to, or remove the link)", NULL);
    if (!S_ISREG(st.st_mode))
        return refuse(err, path, "it is ", fmt_input_kind(&st));
    if (fmt_input_is_input(&st))
        return refuse(err, path, "it is an input of this run (the same file, "
                      "possibly through a link)", NULL);
    if (overflowed())
        return refuse(err, path, "more inputs were opened than can be "
                      "compared against", NULL);
    return MC_OK;
}

mc_status fmt_output_check_ours(const char *path, const char *what,
                                const char *head, const char *mark,
                                size_t window, mc_error *err)
{
    mc_status s = fmt_output_check_file(path, err);
    struct stat st;
    if (s != MC_OK || lstat(path, &st) != 0 || st.st_size == 0)
        return s; /* refused, absent, or empty: nothing to lose */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    char buf[65536];
    if (window > sizeof buf - 1)
        window = sizeof buf - 1;
    size_t got = 0;
    while (fd >= 0 && got < window) {
        ssize_t r = read(fd, buf + got, window - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    int ours = got > 0 && (!head || (got >= strlen(head) &&
                                     memcmp(buf, head, strlen(head)) == 0));
    if (ours && mark) {
        ours = 0;
        size_t ml = strlen(mark);
        for (size_t i = 0; !ours && ml <= got && i <= got - ml; i++)
            ours = memcmp(buf + i, mark, ml) == 0;
    }
    if (!ours)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "refusing to replace it: it exists and is not %s "
                       "(remove it, or choose another name); nothing was "
                       "written", what);
    return MC_OK;
}

/* The absolute path path names, its directory resolved (malloc'ed; NULL
 * when the directory does not resolve): an existing path through
 * realpath, a new one as realpath(directory) + "/" + its name. */
static char *fmt_output_canonical(const char *path)
{
    char *r = realpath(path, NULL);
    if (r)
        return r;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char *dir;
    if (!slash)
        dir = realpath(".", NULL);
    else if (slash == path)
        dir = realpath("/", NULL);
    else {
        char *d = strndup(path, (size_t)(slash - path));
        dir = d ? realpath(d, NULL) : NULL;
        free(d);
    }
    if (!dir)
        return NULL;
    size_t n = strlen(dir) + strlen(name) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s/%s", strcmp(dir, "/") ? dir : "", name);
    free(dir);
    return out;
}

int fmt_output_same(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    /* one of them does not exist yet: compare the resolved directories
     * and the names */
    char *ca = fmt_output_canonical(a), *cb = fmt_output_canonical(b);
    int same = ca && cb ? strcmp(ca, cb) == 0 : strcmp(a, b) == 0;
    free(ca);
    free(cb);
    return same;
}

/* 1 if an input of this run lies in the directory dfd (owned, closed
 * here), looking depth more levels down; *empty cleared on any entry.
 * Entries are compared without following links: replacing the directory
 * removes a link, never what it points to. */
static int holds_input(int dfd, int depth, int *empty, int *marked)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))
            continue;
        *empty = 0;
        if (marked && strcmp(n, FMT_OUTPUT_MARKER) == 0)
            *marked = 1;
        struct stat st;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISREG(st.st_mode) && fmt_input_is_input(&st)) {
            found = 1;
        } else if (S_ISDIR(st.st_mode) && depth > 0) {
            int sub = openat(dirfd(d), n,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int dummy = 0;
            if (sub >= 0)
                found = holds_input(sub, depth - 1, &dummy, NULL);
        }
    }
    closedir(d);
    return found;
}

int fmt_output_marker_lists(const char *text, size_t len, const char *name)
{
    static const char head[] = "\n" FMT_OUTPUT_MARKER_LIST "\n";
    const size_t hl = sizeof head - 1, nl = strlen(name);
    size_t start = 0;
    for (;;) { /* the list header: the first "\nfiles:\n" */
        if (start + hl > len)
            return -1;
        if (memcmp(text + start, head, hl) == 0)
            break;
        start++;
    }
    /* the lines after it, each "NAME\n"; a last line without '\n' is
     * not a whole entry */
    for (size_t p = start + hl; p < len;) {
        const char *e = memchr(text + p, '\n', len - p);
        if (!e)
            return 0;
        size_t ll = (size_t)(e - (text + p));
        if (ll == nl && memcmp(text + p, name, nl) == 0)
            return 1;
        p += ll + 1;
    }
    return 0;
}

/* 1 (and its name in name) if the marked directory path holds an entry
 * its marker does not list: the user's, added after we wrote it.  A
 * marker without the list (written before it had one) lists nothing and
 * allows everything, as then. */
static int foreign_entry(const char *path, char *name, size_t cap)
{
    char mp[PATH_MAX];
    snprintf(mp, sizeof mp, "%s/%s", path, FMT_OUTPUT_MARKER);
    int fd = open(mp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char *text = malloc(FMT_OUTPUT_MARKER_MAX);
    size_t got = 0;
    while (text && got < FMT_OUTPUT_MARKER_MAX) {
        ssize_t r = read(fd, text + got, FMT_OUTPUT_MARKER_MAX - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!text)
        return 0;
    int found = 0;
    DIR *d = fmt_output_marker_lists(text, got, "") >= 0 ? opendir(path) : NULL;
    struct dirent *e;
    while (d && !found && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, FMT_OUTPUT_MARKER))
            continue;
        if (fmt_output_marker_lists(text, got, n) == 0) {
            snprintf(name, cap, "%s", n);
            found = 1;
        }
    }
    if (d)
        closedir(d);
    free(text);
    return found;
}

mc_status fmt_output_check_dir(const char *path, mc_error *err)
{
    struct stat st;
    if (!path || !*path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "empty output directory");
    /* lstat("link/") follows the link: look at the name without its
     * trailing slashes */
    char bare[PATH_MAX];
    size_t bl = strlen(path);
    while (bl > 1 && path[bl - 1] == '/')
        bl--;
    snprintf(bare, sizeof bare, "%.*s", (int)bl, path);
    if (lstat(bare, &st) != 0)
        return MC_OK;
    /* the swap at commit would replace the link, not its target: say so
     * now, not after the work (a dangling link included) */
    if (S_ISLNK(st.st_mode))
        return refuse(err, path, "it is a symbolic link (name the directory "
                      "it points to, or remove the link)", NULL);
    if (!S_ISDIR(st.st_mode))
        return refuse(err, path, "it is ", fmt_input_kind(&st));
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return mc_fail(err, MC_ERR_IO, path, NULL, -1,
                       "cannot read the existing directory: %s",
                       strerror(errno));
    int empty = 1, marked = 0;
    if (holds_input(dfd, 4, &empty, &marked))
        return refuse(err, path, "an input of this run lies in it", NULL);
    if (!empty && !marked)
        return refuse(err, path, "it is a directory that mcompile did not "
                      "write (no " FMT_OUTPUT_MARKER " marker); choose a new "
                      "name or remove it yourself", NULL);
    if (!empty && overflowed())
        return refuse(err, path, "more inputs were opened than can be "
                      "compared against", NULL);
    char foreign[256];
    if (marked && foreign_entry(path, foreign, sizeof foreign)) {
        char why[400];
        snprintf(why, sizeof why, "it holds '%s', which mcompile did not "
                 "write (its %s lists what it wrote); move that out first",
                 foreign, FMT_OUTPUT_MARKER);
        return refuse(err, path, why, NULL);
    }
    return MC_OK;
}

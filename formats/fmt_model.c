/* fmt_model.c - open a checkpoint (directory, single file, or sharded index)
 * and cross-check the index against the shards.  See fmt_model.h. */
#include "fmt_model.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt_input.h"
#include "mc_alloc.h"
#include "mc_checked.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"
#define INDEX_MAX_BYTES (100u << 20) /* far above any real index */

typedef struct mtensor {
    const fmt_st_tensor *t; /* borrowed from shards[shard] */
    size_t shard;
} mtensor;

struct fmt_model {
    char *dir;             /* holds config.json and the shards */
    char *config_path;     /* dir/config.json (not read here) */
    int sharded;
    char **shard_names;    /* file names inside dir */
    fmt_st_file **shards;
    size_t nshards;
    mtensor *all;          /* shard order, then data-offset order */
    size_t nall;
    size_t *by_name;       /* indices into all, sorted by tensor name */
    uint64_t total_bytes;
};

void fmt_model_close(fmt_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nshards; i++) {
        if (m->shards) /* NULL when allocating it failed */
            fmt_st_close(m->shards[i]);
        mc_free(m->shard_names[i]);
    }
    mc_free(m->shards);
    mc_free(m->shard_names);
    mc_free(m->all);
    mc_free(m->by_name);
    mc_free(m->config_path);
    mc_free(m->dir);
    mc_free(m);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mc_malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Directory part of path ("." if none), malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return mc_strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *d = mc_malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

static mc_status read_small(const char *path, char **text, size_t *len,
                            mc_error *err)
{
    *text = NULL;
    int fd;
    struct stat sb;
    mc_status ost = fmt_input_open(path, &fd, &sb, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    if ((uint64_t)sb.st_size > INDEX_MAX_BYTES) {
        close(fd);
        return mc_fail(err, MC_ERR_FORMAT, path, NULL, -1,
                       "not a regular file of at most %u bytes", INDEX_MAX_BYTES);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = mc_malloc(n + 1);
    if (!buf) {
        close(fd);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating %zu bytes", n);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            close(fd);
            mc_free(buf);
            return mc_fail(err, MC_ERR_IO, path, NULL, (int64_t)got,
                           "read failed: %s", strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return MC_OK;
}

/* index_path: the index that listed the shards, or NULL for one file. */
static mc_status open_shards(fmt_model *m, size_t n, const char *index_path,
                             mc_error *err)
{
    m->shards = mc_calloc(n, sizeof *m->shards);
    if (!m->shards)
        return mc_fail(err, MC_ERR_NOMEM, m->dir, NULL, -1, "allocating shards");
    for (size_t i = 0; i < n; i++) {
        char *p = join(m->dir, m->shard_names[i]);
        if (!p)
            return mc_fail(err, MC_ERR_NOMEM, m->dir, NULL, -1, "allocating a path");
        mc_status st = fmt_st_open(p, &m->shards[i], err);
        if (st == MC_ERR_NOT_FOUND && index_path)
            mc_fail(err, st, p, NULL, -1, "shard listed in %s does not exist",
                    index_path);
        mc_free(p);
        if (st != MC_OK)
            return st;
    }
    return MC_OK;
}

static int cmp_tensor(const void *a, const void *b, void *ctx)
{
    const mtensor *all = ctx, *x = &all[*(const size_t *)a], *y = &all[*(const size_t *)b];
    int c = strcmp(x->t->name, y->t->name);
    if (c != 0)
        return c;
    return x->shard < y->shard ? -1 : x->shard > y->shard; /* deterministic */
}

/* Flat tensor list, name index and total bytes over all shards. */
static mc_status index_tensors(fmt_model *m, mc_error *err)
{
    size_t n = 0;
    for (size_t s = 0; s < m->nshards; s++)
        if (!mc_add_size(n, fmt_st_count(m->shards[s]), &n))
            return mc_fail(err, MC_ERR_OVERFLOW, m->dir, NULL, -1, "tensor count");
    m->all = mc_malloc_array(n, sizeof *m->all);
    m->by_name = mc_malloc_array(n, sizeof *m->by_name);
    if (!m->all || !m->by_name)
        return mc_fail(err, MC_ERR_NOMEM, m->dir, NULL, -1, "allocating tensors");
    for (size_t s = 0; s < m->nshards; s++) {
        for (size_t i = 0; i < fmt_st_count(m->shards[s]); i++) {
            const fmt_st_tensor *t = fmt_st_get(m->shards[s], i);
            if (!mc_add_u64(m->total_bytes, t->nbytes, &m->total_bytes))
                return mc_fail(err, MC_ERR_OVERFLOW, m->dir, t->name, -1,
                               "total tensor bytes overflow 64 bits");
            m->by_name[m->nall] = m->nall;
            m->all[m->nall++] = (mtensor){t, s};
        }
    }
    qsort_r(m->by_name, n, sizeof *m->by_name, cmp_tensor, m->all);
    return MC_OK;
}

/* Index and shards must agree both ways; total_size must match.  Order
 * matters for clear messages: a tensor stored twice is reported as such
 * before either copy is compared with the map. */
static mc_status cross_check(fmt_model *m, const fmt_model_index *ix,
                             const char *index_path, mc_error *err)
{
    for (size_t k = 1; k < m->nall; k++) {
        const mtensor *a = &m->all[m->by_name[k - 1]], *b = &m->all[m->by_name[k]];
        if (strcmp(a->t->name, b->t->name) == 0)
            return mc_fail(err, MC_ERR_FORMAT, fmt_st_path(m->shards[b->shard]),
                           b->t->name, (int64_t)b->t->file_offset,
                           "tensor '%s' appears in two shards ('%s' and '%s')",
                           b->t->name, m->shard_names[a->shard],
                           m->shard_names[b->shard]);
    }
    for (size_t i = 0; i < fmt_model_index_tensor_count(ix); i++) {
        size_t s;
        const char *name = fmt_model_index_tensor(ix, i, &s);
        if (!fmt_st_find(m->shards[s], name))
            return mc_fail(err, MC_ERR_FORMAT, index_path, name, -1,
                           "weight_map puts '%s' in shard '%s', which has no "
                           "such tensor", name, m->shard_names[s]);
    }
    /* Now every map entry is in its shard and no tensor is stored twice, so
     * a count mismatch means some shard tensor is not in the map. */
    for (size_t k = 0; k < m->nall && m->nall != fmt_model_index_tensor_count(ix); k++) {
        const mtensor *mt = &m->all[k];
        size_t lo = 0, hi = fmt_model_index_tensor_count(ix), s;
        int found = 0;
        while (lo < hi && !found) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(mt->t->name, fmt_model_index_tensor(ix, mid, &s));
            found = c == 0;
            if (c < 0)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (!found)
            return mc_fail(err, MC_ERR_FORMAT, fmt_st_path(m->shards[mt->shard]),
                           mt->t->name, (int64_t)mt->t->file_offset,
                           "tensor '%s' is in shard '%s' but missing from the "
                           "index weight_map", mt->t->name,
                           m->shard_names[mt->shard]);
    }
    uint64_t total;
    if (fmt_model_index_total_size(ix, &total) && total != m->total_bytes)
        return mc_fail(err, MC_ERR_FORMAT, index_path, "total_size", -1,
                       "metadata.total_size is %llu but the shards hold %llu "
                       "tensor bytes", (unsigned long long)total,
                       (unsigned long long)m->total_bytes);
    return MC_OK;
}

static mc_status open_index(fmt_model *m, const char *index_path, mc_error *err)
{
    char *text;
    size_t len = 0;
    mc_status st = read_small(index_path, &text, &len, err);
    if (st != MC_OK)
        return st;
    fmt_model_index *ix = NULL;
    st = fmt_model_parse_index(text, len, index_path, &ix, err);
    mc_free(text);
    if (st != MC_OK)
        return st;
    size_t n = fmt_model_index_shard_count(ix);
    m->sharded = 1;
    m->shard_names = mc_calloc(n, sizeof *m->shard_names);
    if (!m->shard_names)
        st = mc_fail(err, MC_ERR_NOMEM, index_path, NULL, -1, "allocating shards");
    for (size_t i = 0; st == MC_OK && i < n; i++) {
        m->shard_names[i] = mc_strdup(fmt_model_index_shard_name(ix, i));
        if (!m->shard_names[i])
            st = mc_fail(err, MC_ERR_NOMEM, index_path, NULL, -1, "allocating shards");
        else
            m->nshards = i + 1;
    }
    if (st == MC_OK)
        st = open_shards(m, n, index_path, err);
    if (st == MC_OK)
        st = index_tensors(m, err);
    if (st == MC_OK)
        st = cross_check(m, ix, index_path, err);
    fmt_model_index_free(ix);
    return st;
}

static mc_status open_single(fmt_model *m, const char *file_name, mc_error *err)
{
    m->shard_names = mc_calloc(1, sizeof *m->shard_names);
    if (m->shard_names)
        m->shard_names[0] = mc_strdup(file_name);
    if (!m->shard_names || !m->shard_names[0])
        return mc_fail(err, MC_ERR_NOMEM, m->dir, NULL, -1, "allocating shards");
    m->nshards = 1;
    mc_status st = open_shards(m, 1, NULL, err);
    return st == MC_OK ? index_tensors(m, err) : st;
}

static int is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static mc_status open_path(fmt_model *m, const char *path, mc_error *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return mc_fail(err, errno == ENOENT ? MC_ERR_NOT_FOUND : MC_ERR_IO, path,
                       NULL, -1, "cannot open: %s", strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        m->dir = mc_strdup(path);
        char *ip = m->dir ? join(path, INDEX_NAME) : NULL;
        char *sp = m->dir ? join(path, SINGLE_NAME) : NULL;
        mc_status st = MC_OK;
        if (!ip || !sp)
            st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a path");
        else if (is_file(ip))
            st = open_index(m, ip, err);
        else if (is_file(sp))
            st = open_single(m, SINGLE_NAME, err);
        /* there but no regular file (a FIFO, a device, a directory, a
         * link loop): the open says what it is, not "no model here" */
        else if (exists(ip))
            st = open_index(m, ip, err);
        else if (exists(sp))
            st = open_single(m, SINGLE_NAME, err);
        else
            st = mc_fail(err, MC_ERR_NOT_FOUND, path, NULL, -1,
                         "no " SINGLE_NAME " or " INDEX_NAME " in this "
                         "directory");
        mc_free(ip);
        mc_free(sp);
        return st;
    }
    m->dir = dir_of(path);
    if (!m->dir)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a path");
    size_t len = strlen(path);
    if (len >= 5 && strcmp(path + len - 5, ".json") == 0)
        return open_index(m, path, err);
    const char *base = strrchr(path, '/');
    return open_single(m, base ? base + 1 : path, err);
}

mc_status fmt_model_open(const char *path, fmt_model **out, mc_error *err)
{
    if (!out || !path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1, "NULL argument");
    *out = NULL;
    fmt_model *m = mc_calloc(1, sizeof *m);
    if (!m)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a model");
    mc_status st = open_path(m, path, err);
    if (st == MC_OK) {
        m->config_path = join(m->dir, "config.json");
        if (!m->config_path)
            st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a path");
    }
    if (st != MC_OK) {
        fmt_model_close(m);
        return st;
    }
    *out = m;
    return MC_OK;
}

const char *fmt_model_dir(const fmt_model *m) { return m ? m->dir : NULL; }
const char *fmt_model_config_path(const fmt_model *m)
{
    return m ? m->config_path : NULL;
}
int fmt_model_is_sharded(const fmt_model *m) { return m ? m->sharded : 0; }
size_t fmt_model_shard_count(const fmt_model *m) { return m ? m->nshards : 0; }

const char *fmt_model_shard_name(const fmt_model *m, size_t i)
{
    return m && i < m->nshards ? m->shard_names[i] : NULL;
}

const fmt_st_file *fmt_model_shard(const fmt_model *m, size_t i)
{
    return m && i < m->nshards ? m->shards[i] : NULL;
}

size_t fmt_model_tensor_count(const fmt_model *m) { return m ? m->nall : 0; }

const fmt_st_tensor *fmt_model_tensor(const fmt_model *m, size_t i, size_t *shard)
{
    if (!m || i >= m->nall)
        return NULL;
    if (shard)
        *shard = m->all[i].shard;
    return m->all[i].t;
}

const fmt_st_tensor *fmt_model_find(const fmt_model *m, const char *name,
                                    size_t *shard)
{
    if (!m || !name)
        return NULL;
    size_t lo = 0, hi = m->nall;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const mtensor *mt = &m->all[m->by_name[mid]];
        int c = strcmp(name, mt->t->name);
        if (c == 0) {
            if (shard)
                *shard = mt->shard;
            return mt->t;
        }
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

uint64_t fmt_model_total_bytes(const fmt_model *m) { return m ? m->total_bytes : 0; }

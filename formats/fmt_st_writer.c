/* fmt_st_writer.c - streaming safetensors writer (fmt_safetensors.h).
 *
 * Tensors are declared first so the header (which holds every offset) can
 * be written before any data; data then streams through fmt_atomic, so a
 * failed or interrupted write never leaves a partial file at the final
 * path.  The header text is produced here, not by a JSON library, so the
 * bytes depend only on the calls: same calls, same file.  Data is packed in
 * declaration order with no padding between tensors (the format's tiling
 * rule forbids gaps); only the header is padded, with spaces, to 8 bytes. */
#include "fmt_safetensors.h"

#include <stdio.h>
#include <string.h>

#include "fmt_atomic.h"
#include "fmt_json_strict.h"
#include "mc_alloc.h"
#include "mc_checked.h"

typedef struct wtensor {
    char *name;
    fmt_dtype dtype;
    int ndim;
    uint64_t shape[FMT_ST_MAX_DIMS];
    uint64_t begin, end; /* data_offsets (bytes into the data buffer) */
} wtensor;

enum { W_DECLARE, W_DATA, W_FAILED };

struct fmt_st_writer {
    char *path;             /* final path, for errors */
    fmt_atomic_file *out;   /* temp file until finish */
    wtensor *t;             /* declared tensors, in order */
    size_t n, cap;
    size_t *hash;           /* open addressing over names: index+1, 0 empty */
    size_t hcap;            /* power of two, > 2n */
    char **meta;            /* (key, value) pairs after format=pt */
    size_t nmeta;
    int state;
    uint64_t data_bytes;    /* sum of tensor sizes */
    uint64_t header_bytes;  /* 8 + padded N */
    uint64_t written;       /* data bytes written so far */
};

static size_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

/* Slot for name: its index+1 if present (*found = 1), else an empty slot. */
static size_t hash_slot(const fmt_st_writer *w, const char *name, int *found)
{
    size_t i = name_hash(name) & (w->hcap - 1);
    while (w->hash[i]) {
        if (strcmp(w->t[w->hash[i] - 1].name, name) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & (w->hcap - 1);
    }
    *found = 0;
    return i;
}

static int grow(fmt_st_writer *w)
{
    size_t cap = w->cap ? 2 * w->cap : 64;
    wtensor *t = mc_realloc(w->t, cap * sizeof *t);
    if (!t)
        return 0;
    w->t = t;
    w->cap = cap;
    size_t hcap = 4 * cap;
    size_t *h = mc_calloc(hcap, sizeof *h);
    if (!h)
        return 0;
    mc_free(w->hash);
    w->hash = h;
    w->hcap = hcap;
    for (size_t k = 0; k < w->n; k++) {
        int found;
        w->hash[hash_slot(w, w->t[k].name, &found)] = k + 1;
    }
    return 1;
}

static void writer_free(fmt_st_writer *w)
{
    for (size_t i = 0; i < w->n; i++)
        mc_free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->nmeta; i++)
        mc_free(w->meta[i]);
    mc_free(w->meta);
    mc_free(w->t);
    mc_free(w->hash);
    mc_free(w->path);
    mc_free(w);
}

mc_status fmt_st_writer_create(const char *path, fmt_st_writer **out,
                               mc_error *err)
{
    if (!out || !path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1, "NULL argument");
    *out = NULL;
    fmt_st_writer *w = mc_calloc(1, sizeof *w);
    if (w)
        w->path = mc_strdup(path);
    if (!w || !w->path || !grow(w)) {
        if (w)
            writer_free(w);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a writer");
    }
    mc_status st = fmt_atomic_create(path, &w->out, err);
    if (st != MC_OK) {
        writer_free(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

static mc_status check_name(const fmt_st_writer *w, const char *what,
                            const char *s, mc_error *err)
{
    if (!s || !s[0])
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "empty or NULL %s", what);
    if (!fmt_utf8_valid((const unsigned char *)s, strlen(s), NULL))
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "%s is not valid UTF-8", what);
    return MC_OK;
}

mc_status fmt_st_writer_add(fmt_st_writer *w, const char *name, fmt_dtype dt,
                            int ndim, const uint64_t *shape, mc_error *err)
{
    if (!w)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, name, -1, "NULL writer");
    if (w->state != W_DECLARE)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "tensor declared after begin_data");
    mc_status st = check_name(w, "tensor name", name, err);
    if (st != MC_OK)
        return st;
    if (strcmp(name, "__metadata__") == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "'__metadata__' is reserved; it cannot name a tensor");
    if (fmt_dtype_size(dt) == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > FMT_ST_MAX_DIMS || (ndim > 0 && !shape))
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "rank %d; expected 0..%d with a shape", ndim,
                       FMT_ST_MAX_DIMS);
    int found;
    hash_slot(w, name, &found);
    if (found)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "tensor '%s' declared twice", name);
    uint64_t nbytes = fmt_dtype_size(dt), end;
    for (int d = 0; d < ndim; d++)
        if (!mc_mul_u64(nbytes, shape[d], &nbytes))
            return mc_fail(err, MC_ERR_OVERFLOW, w->path, name, -1,
                           "tensor byte size overflows 64 bits");
    if (!mc_add_u64(w->data_bytes, nbytes, &end) || end > (uint64_t)INT64_MAX)
        return mc_fail(err, MC_ERR_OVERFLOW, w->path, name, -1,
                       "file size overflows 63 bits");
    if (w->n == w->cap && !grow(w))
        return mc_fail(err, MC_ERR_NOMEM, w->path, name, -1, "allocating tensors");
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = mc_strdup(name);
    if (!t->name)
        return mc_fail(err, MC_ERR_NOMEM, w->path, name, -1, "allocating names");
    t->dtype = dt;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    t->begin = w->data_bytes;
    t->end = end;
    w->data_bytes = end;
    w->hash[hash_slot(w, name, &found)] = ++w->n;
    return MC_OK;
}

mc_status fmt_st_writer_set_metadata(fmt_st_writer *w, const char *key,
                                     const char *value, mc_error *err)
{
    if (!w)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, key, -1, "NULL writer");
    if (w->state != W_DECLARE)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                       "metadata set after begin_data");
    mc_status st = check_name(w, "metadata key", key, err);
    if (st == MC_OK && !value)
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1, "NULL value");
    if (st == MC_OK && !fmt_utf8_valid((const unsigned char *)value,
                                       strlen(value), NULL))
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                     "metadata value is not valid UTF-8");
    if (st != MC_OK)
        return st;
    if (strcmp(key, "format") == 0) {
        if (strcmp(value, "pt") == 0)
            return MC_OK;
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                       "format must be \"pt\" (transformers refuses others)");
    }
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                           "metadata key '%s' set twice", key);
    char **m = mc_realloc(w->meta, (w->nmeta + 1) * 2 * sizeof *m);
    if (!m)
        return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1, "allocating metadata");
    w->meta = m;
    char *k = mc_strdup(key), *v = mc_strdup(value);
    if (!k || !v) {
        mc_free(k);
        mc_free(v);
        return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1, "allocating metadata");
    }
    m[2 * w->nmeta] = k;
    m[2 * w->nmeta + 1] = v;
    w->nmeta++;
    return MC_OK;
}

/* ---- header text ---------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 1024;
        while (n > cap - b->len) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *p = mc_realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}

/* JSON string with the minimal escapes; UTF-8 passes through unchanged. */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void build_header(const fmt_st_writer *w, sbuf *b)
{
    sb_puts(b, "{\"__metadata__\":{\"format\":\"pt\"");
    for (size_t i = 0; i < w->nmeta; i++) {
        sb_puts(b, ",");
        sb_json_string(b, w->meta[2 * i]);
        sb_puts(b, ":");
        sb_json_string(b, w->meta[2 * i + 1]);
    }
    sb_puts(b, "}");
    for (size_t i = 0; i < w->n; i++) {
        const wtensor *t = &w->t[i];
        sb_puts(b, ",");
        sb_json_string(b, t->name);
        sb_puts(b, ":{\"dtype\":\"");
        sb_puts(b, fmt_dtype_name(t->dtype));
        sb_puts(b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d)
                sb_puts(b, ",");
            sb_u64(b, t->shape[d]);
        }
        sb_puts(b, "],\"data_offsets\":[");
        sb_u64(b, t->begin);
        sb_puts(b, ",");
        sb_u64(b, t->end);
        sb_puts(b, "]}");
    }
    sb_puts(b, "}");
    while (!b->oom && b->len % 8) /* a failed append leaves len unchanged */
        sb_puts(b, " ");
}

mc_status fmt_st_writer_begin_data(fmt_st_writer *w, mc_error *err)
{
    if (!w || w->state != W_DECLARE)
        return mc_fail(err, MC_ERR_INVALID_ARG, w ? w->path : NULL, NULL, -1,
                       "begin_data called twice or after a failure");
    sbuf b = {0};
    build_header(w, &b);
    if (b.oom) {
        mc_free(b.p);
        w->state = W_FAILED;
        return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1,
                       "allocating the header");
    }
    if (b.len > FMT_ST_MAX_HEADER) {
        mc_free(b.p);
        w->state = W_FAILED;
        return mc_fail(err, MC_ERR_UNSUPPORTED, w->path, NULL, -1,
                       "header of %zu bytes exceeds the %llu readers accept",
                       b.len, FMT_ST_MAX_HEADER);
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    mc_status st = fmt_atomic_write(w->out, len8, 8, err);
    if (st == MC_OK)
        st = fmt_atomic_write(w->out, b.p, b.len, err);
    mc_free(b.p);
    w->header_bytes = 8 + (uint64_t)b.len;
    w->state = st == MC_OK ? W_DATA : W_FAILED;
    return st;
}

mc_status fmt_st_writer_write(fmt_st_writer *w, const void *data, size_t nbytes,
                              mc_error *err)
{
    if (!w || w->state != W_DATA)
        return mc_fail(err, MC_ERR_INVALID_ARG, w ? w->path : NULL, NULL, -1,
                       "write before begin_data or after a failure");
    if (nbytes > w->data_bytes - w->written)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "write of %zu bytes goes past the %llu declared data "
                       "bytes (%llu already written)", nbytes,
                       (unsigned long long)w->data_bytes,
                       (unsigned long long)w->written);
    mc_status st = fmt_atomic_write(w->out, data, nbytes, err);
    if (st != MC_OK) {
        w->state = W_FAILED;
        return st;
    }
    w->written += nbytes;
    return MC_OK;
}

mc_status fmt_st_writer_finish(fmt_st_writer *w, mc_error *err)
{
    if (!w)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1, "NULL writer");
    mc_status st = MC_OK;
    if (w->state == W_DECLARE)
        st = fmt_st_writer_begin_data(w, err);
    if (st == MC_OK && w->state != W_DATA)
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                     "finish after a failed write; nothing was written");
    if (st == MC_OK && w->written != w->data_bytes) {
        size_t k = 0;
        while (k < w->n && w->t[k].end <= w->written)
            k++;
        const wtensor *t = &w->t[k < w->n ? k : w->n - 1];
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, t->name, -1,
                     "only %llu of %llu data bytes written; tensor '%s' "
                     "(bytes %llu..%llu) is incomplete",
                     (unsigned long long)w->written,
                     (unsigned long long)w->data_bytes, t->name,
                     (unsigned long long)t->begin, (unsigned long long)t->end);
    }
    if (st != MC_OK) {
        fmt_st_writer_abort(w);
        return st;
    }
    fmt_atomic_file *out = w->out;
    w->out = NULL;
    writer_free(w);
    return fmt_atomic_commit(out, err);
}

void fmt_st_writer_abort(fmt_st_writer *w)
{
    if (!w)
        return;
    fmt_atomic_abort(w->out);
    writer_free(w);
}

uint64_t fmt_st_writer_total_bytes(const fmt_st_writer *w)
{
    return w ? w->header_bytes + w->data_bytes : 0;
}

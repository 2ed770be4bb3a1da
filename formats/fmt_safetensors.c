/* fmt_safetensors.c - safetensors reader (validates everything before it
 * hands out a pointer).  The streaming writer is in fmt_st_writer.c.
 * See fmt_safetensors.h for the byte layout and the rules. */
#include "fmt_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fmt_input.h"
#include "fmt_json_strict.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"
#include "mc_checked.h"

struct fmt_st_file {
    char *path;               /* as given; used in errors */
    const unsigned char *base;/* whole file (mapping or borrowed buffer) */
    size_t size;              /* bytes at base */
    void *map;                /* mmap address to unmap, NULL for memory */
    int map_slot;             /* fmt_mapguard slot of map (when map) */
    fmt_st_tensor *tensors;   /* count entries, data-offset order */
    size_t count;
    size_t *by_name;          /* tensor indices sorted by name (fmt_st_find) */
    char **meta;              /* meta_count (key, value) pairs, flattened */
    size_t meta_count;
};

/* Tensor being validated: where it sits in the header, for messages. */
typedef struct pending {
    uint64_t begin, end;   /* data_offsets */
    size_t hdr_off;        /* file offset of its data_offsets value */
    size_t idx;            /* index in f->tensors (declaration order) */
} pending;

/* Real safetensors dtypes that mcompile does not handle: reject by name
 * with "unsupported", not "unknown" (the file is fine, we are not). */
static const char *const unsupported_dtypes[] = {
    "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
};

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return json_integer_value(v) < 0 ? "negative" : "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Cursor over the header: the JSON text, its file offset and the file. */
typedef struct hdr {
    const char *text;  /* JSON header, not NUL-terminated */
    size_t len;        /* N */
    const char *path;
    int64_t base;      /* file offset of text[0] (always 8) */
} hdr;

static int64_t at(const hdr *h, size_t off)
{
    return h->base + (int64_t)off;
}

static mc_status parse_metadata(fmt_st_file *f, const hdr *h, json_t *obj,
                                size_t val_off, mc_error *err)
{
    if (!json_is_object(obj))
        return mc_fail(err, MC_ERR_FORMAT, h->path, "__metadata__",
                       at(h, val_off), "__metadata__ is %s; expected an "
                       "object of string -> string", json_kind(obj));
    size_t n = json_object_size(obj);
    fmt_json_member *mem = mc_malloc_array(n, sizeof *mem);
    f->meta = mc_calloc(n, 2 * sizeof *f->meta);
    if (!mem || !f->meta) {
        mc_free(mem);
        return mc_fail(err, MC_ERR_NOMEM, h->path, "__metadata__", -1,
                       "allocating metadata");
    }
    fmt_json_scan_object(h->text, h->len, val_off, mem, n);
    size_t i = 0;
    const char *key;
    json_t *v;
    mc_status st = MC_OK;
    json_object_foreach(obj, key, v) {
        if (!json_is_string(v)) {
            st = mc_fail(err, MC_ERR_FORMAT, h->path, key, at(h, mem[i].value),
                         "__metadata__ value for '%s' is %s; expected a string",
                         key, json_kind(v));
            break;
        }
        f->meta[2 * i] = mc_strdup(key);
        f->meta[2 * i + 1] = mc_strdup(json_string_value(v));
        f->meta_count = ++i;
        if (!f->meta[2 * i - 2] || !f->meta[2 * i - 1]) {
            st = mc_fail(err, MC_ERR_NOMEM, h->path, key, -1, "allocating metadata");
            break;
        }
    }
    mc_free(mem);
    return st;
}

static mc_status parse_dtype(const hdr *h, const char *name, json_t *v,
                             size_t off, fmt_dtype *out, mc_error *err)
{
    if (!json_is_string(v))
        return mc_fail(err, MC_ERR_FORMAT, h->path, name, at(h, off),
                       "dtype is %s; expected a string such as \"F32\"",
                       json_kind(v));
    const char *s = json_string_value(v);
    *out = fmt_dtype_from_name(s);
    if (*out != FMT_DT_INVALID)
        return MC_OK;
    for (size_t i = 0; i < sizeof unsupported_dtypes / sizeof *unsupported_dtypes; i++)
        if (strcmp(s, unsupported_dtypes[i]) == 0)
            return mc_fail(err, MC_ERR_UNSUPPORTED, h->path, name, at(h, off),
                           "dtype '%s' is not supported by mcompile", s);
    return mc_fail(err, MC_ERR_FORMAT, h->path, name, at(h, off),
                   "unknown dtype '%.64s'; expected one of F64 F32 F16 BF16 I64 "
                   "I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2", s);
}

static mc_status parse_shape(const hdr *h, fmt_st_tensor *t, json_t *v,
                             size_t off, mc_error *err)
{
    if (!json_is_array(v))
        return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, off),
                       "shape is %s; expected a list of non-negative integers",
                       json_kind(v));
    size_t nd = json_array_size(v);
    if (nd > FMT_ST_MAX_DIMS)
        return mc_fail(err, MC_ERR_UNSUPPORTED, h->path, t->name, at(h, off),
                       "shape has %zu dimensions; at most %d are supported",
                       nd, FMT_ST_MAX_DIMS);
    t->ndim = (int)nd;
    t->nelem = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(v, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, off),
                           "shape[%zu] is %s; expected a non-negative integer",
                           d, json_kind(e));
        t->shape[d] = (uint64_t)json_integer_value(e);
        if (!mc_mul_u64(t->nelem, t->shape[d], &t->nelem))
            return mc_fail(err, MC_ERR_OVERFLOW, h->path, t->name, at(h, off),
                           "shape product overflows 64 bits");
    }
    if (!mc_mul_u64(t->nelem, fmt_dtype_size(t->dtype), &t->nbytes))
        return mc_fail(err, MC_ERR_OVERFLOW, h->path, t->name, at(h, off),
                       "shape x element size (%zu bytes) overflows 64 bits",
                       fmt_dtype_size(t->dtype));
    return MC_OK;
}

static mc_status parse_offsets(const hdr *h, const fmt_st_tensor *t, json_t *v,
                               size_t off, pending *p, mc_error *err)
{
    json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(b) ||
        !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < 0)
        return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, off),
                       "data_offsets must be [begin, end] with non-negative "
                       "integers");
    p->begin = (uint64_t)json_integer_value(b);
    p->end = (uint64_t)json_integer_value(e);
    p->hdr_off = off;
    if (p->begin > p->end)
        return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, off),
                       "data_offsets [%llu, %llu] has begin > end",
                       (unsigned long long)p->begin, (unsigned long long)p->end);
    if (p->end - p->begin != t->nbytes)
        return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, off),
                       "data_offsets [%llu, %llu] span %llu bytes but shape x "
                       "%s needs %llu", (unsigned long long)p->begin,
                       (unsigned long long)p->end,
                       (unsigned long long)(p->end - p->begin),
                       fmt_dtype_name(t->dtype), (unsigned long long)t->nbytes);
    return MC_OK;
}

/* One tensor entry: exactly {dtype, shape, data_offsets}. */
static mc_status parse_entry(const hdr *h, fmt_st_tensor *t, json_t *obj,
                             size_t val_off, pending *p, mc_error *err)
{
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    if (!json_is_object(obj))
        return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, val_off),
                       "tensor entry is %s; expected an object with dtype, "
                       "shape, data_offsets", json_kind(obj));
    fmt_json_member mem[4];
    size_t nmem = fmt_json_scan_object(h->text, h->len, val_off, mem, 4);
    size_t off[3] = {val_off, val_off, val_off};
    json_t *vals[3] = {NULL, NULL, NULL};
    const char *key;
    json_t *v;
    size_t i = 0;
    json_object_foreach(obj, key, v) {
        size_t k = 0;
        while (k < 3 && strcmp(key, keys[k]) != 0)
            k++;
        if (k == 3)
            return mc_fail(err, MC_ERR_FORMAT, h->path, t->name,
                           at(h, i < nmem && i < 4 ? mem[i].key : val_off),
                           "unexpected key '%.64s' in tensor entry; expected "
                           "only dtype, shape, data_offsets", key);
        vals[k] = v;
        if (i < nmem && i < 4)
            off[k] = mem[i].value;
        i++;
    }
    for (size_t k = 0; k < 3; k++)
        if (!vals[k])
            return mc_fail(err, MC_ERR_FORMAT, h->path, t->name, at(h, val_off),
                           "tensor entry has no '%s'; expected dtype, shape "
                           "and data_offsets", keys[k]);
    mc_status st = parse_dtype(h, t->name, vals[0], off[0], &t->dtype, err);
    if (st == MC_OK)
        st = parse_shape(h, t, vals[1], off[1], err);
    if (st == MC_OK)
        st = parse_offsets(h, t, vals[2], off[2], p, err);
    return st;
}

static int cmp_pending(const void *a, const void *b, void *ctx)
{
    const fmt_st_file *sort_file = ctx;
    const pending *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(sort_file->tensors[x->idx].name, sort_file->tensors[y->idx].name);
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const fmt_st_file *sort_file = ctx;
    const size_t *x = a, *y = b;
    return strcmp(sort_file->tensors[*x].name, sort_file->tensors[*y].name);
}

/* Sorted offsets must tile [0, buflen) exactly; then lay out the tensors in
 * data order with pointers into the buffer. */
static mc_status check_tiling(fmt_st_file *f, pending *p, size_t n,
                              uint64_t data_start, mc_error *err)
{
    uint64_t buflen = f->size - data_start, expect = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *name = f->tensors[p[i].idx].name;
        if (p[i].begin > expect)
            return mc_fail(err, MC_ERR_FORMAT, f->path, name,
                           (int64_t)(data_start + expect),
                           "gap of %llu bytes before tensor '%s' (data_offsets "
                           "begin %llu, previous data ends at %llu); expected "
                           "tensors to tile the data buffer",
                           (unsigned long long)(p[i].begin - expect), name,
                           (unsigned long long)p[i].begin,
                           (unsigned long long)expect);
        if (p[i].begin < expect)
            return mc_fail(err, MC_ERR_FORMAT, f->path, name,
                           8 + (int64_t)p[i].hdr_off,
                           "data_offsets of '%s' begin at %llu, overlapping "
                           "'%s' which ends at %llu; expected no overlaps",
                           name, (unsigned long long)p[i].begin, prev,
                           (unsigned long long)expect);
        if (p[i].end > buflen)
            return mc_fail(err, MC_ERR_FORMAT, f->path, name,
                           8 + (int64_t)p[i].hdr_off,
                           "data_offsets end %llu is past the end of the data "
                           "buffer (%llu bytes); file truncated?",
                           (unsigned long long)p[i].end,
                           (unsigned long long)buflen);
        expect = p[i].end;
        prev = name;
    }
    if (expect != buflen)
        return mc_fail(err, MC_ERR_FORMAT, f->path, NULL,
                       (int64_t)(data_start + expect),
                       "%llu trailing bytes after the last tensor; expected "
                       "the data buffer to end at byte %llu",
                       (unsigned long long)(buflen - expect),
                       (unsigned long long)(data_start + expect));
    /* Reorder into data order; names move with their tensors. */
    fmt_st_tensor *sorted = mc_malloc_array(n, sizeof *sorted);
    if (!sorted)
        return mc_fail(err, MC_ERR_NOMEM, f->path, NULL, -1, "allocating tensors");
    for (size_t i = 0; i < n; i++) {
        sorted[i] = f->tensors[p[i].idx];
        sorted[i].file_offset = data_start + p[i].begin;
        sorted[i].data = f->base + sorted[i].file_offset;
    }
    mc_free(f->tensors);
    f->tensors = sorted;
    return MC_OK;
}

static mc_status parse_tensors(fmt_st_file *f, const hdr *h, json_t *root,
                               uint64_t data_start, mc_error *err)
{
    size_t total = json_object_size(root);
    size_t n = total - (json_object_get(root, "__metadata__") ? 1 : 0);
    fmt_json_member *mem = mc_malloc_array(total, sizeof *mem);
    pending *p = mc_malloc_array(n, sizeof *p);
    f->tensors = mc_calloc(n, sizeof *f->tensors);
    f->by_name = mc_malloc_array(n, sizeof *f->by_name);
    mc_status st = MC_OK;
    if (!mem || !p || !f->tensors || !f->by_name) {
        st = mc_fail(err, MC_ERR_NOMEM, f->path, NULL, -1, "allocating tensors");
        goto out;
    }
    size_t top = fmt_json_skip_ws(h->text, h->len, 0);
    size_t nmem = fmt_json_scan_object(h->text, h->len, top, mem, total);
    size_t i = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        size_t voff = i < nmem && i < total ? mem[i].value : top;
        i++;
        if (strcmp(key, "__metadata__") == 0) {
            st = parse_metadata(f, h, v, voff, err);
        } else {
            size_t k = f->count;
            fmt_st_tensor *t = &f->tensors[k];
            t->name = mc_strdup(key);
            if (!t->name) {
                st = mc_fail(err, MC_ERR_NOMEM, f->path, key, -1, "allocating names");
                goto out;
            }
            f->count++;
            p[k].idx = k;
            st = parse_entry(h, t, v, voff, &p[k], err);
        }
        if (st != MC_OK)
            goto out;
    }
    qsort_r(p, n, sizeof *p, cmp_pending, f);
    st = check_tiling(f, p, n, data_start, err);
    if (st == MC_OK) {
        for (size_t k = 0; k < n; k++)
            f->by_name[k] = k;
        qsort_r(f->by_name, n, sizeof *f->by_name, cmp_by_name, f);
    }
out:
    mc_free(mem);
    mc_free(p);
    return st;
}

static mc_status parse_file(fmt_st_file *f, mc_error *err)
{
    if (f->size < 8)
        return mc_fail(err, MC_ERR_FORMAT, f->path, NULL, 0,
                       "file is %zu bytes; expected at least 8 (the header "
                       "length)", f->size);
    uint64_t n = le64(f->base);
    if (n > FMT_ST_MAX_HEADER)
        return mc_fail(err, MC_ERR_FORMAT, f->path, NULL, 0,
                       "header length %llu exceeds the limit of %llu bytes",
                       (unsigned long long)n, FMT_ST_MAX_HEADER);
    if (n > f->size - 8)
        return mc_fail(err, MC_ERR_FORMAT, f->path, NULL, 0,
                       "header length %llu runs past the end of the file "
                       "(%zu bytes); expected 8 + N <= file size",
                       (unsigned long long)n, f->size);
    hdr h = {(const char *)f->base + 8, (size_t)n, f->path, 8};
    json_t *root = NULL;
    mc_status st = fmt_json_load_strict(h.text, h.len, f->path, 8, &root, err);
    if (st != MC_OK)
        return st;
    if (h.text[0] != '{') /* the reference reader insists, so do we */
        st = mc_fail(err, MC_ERR_FORMAT, f->path, NULL, 8,
                     "header starts with 0x%02x; expected '{'",
                     (unsigned char)h.text[0]);
    if (st == MC_OK)
        st = parse_tensors(f, &h, root, 8 + n, err);
    json_decref(root);
    return st;
}

void fmt_st_close(fmt_st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->count; i++)
        mc_free((char *)f->tensors[i].name);
    for (size_t i = 0; i < 2 * f->meta_count; i++)
        mc_free(f->meta[i]);
    mc_free(f->meta);
    mc_free(f->tensors);
    mc_free(f->by_name);
    if (f->map) {
        fmt_mapguard_unwatch(f->map_slot);
        munmap(f->map, f->size);
    }
    mc_free(f->path);
    mc_free(f);
}

static mc_status finish_open(fmt_st_file *f, fmt_st_file **out, mc_error *err)
{
    mc_status st = parse_file(f, err);
    if (st != MC_OK) {
        fmt_st_close(f);
        return st;
    }
    *out = f;
    return MC_OK;
}

mc_status fmt_st_open_memory(const void *data, size_t size, const char *name,
                             fmt_st_file **out, mc_error *err)
{
    if (!out || (!data && size))
        return mc_fail(err, MC_ERR_INVALID_ARG, name, NULL, -1,
                       "NULL output or buffer");
    *out = NULL;
    fmt_st_file *f = mc_calloc(1, sizeof *f);
    if (f)
        f->path = mc_strdup(name ? name : "<memory>");
    if (!f || !f->path) {
        mc_free(f);
        return mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "allocating a file");
    }
    f->base = data ? data : (const unsigned char *)"";
    f->size = size;
    return finish_open(f, out, err);
}

mc_status fmt_st_open(const char *path, fmt_st_file **out, mc_error *err)
{
    if (!out || !path)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1, "NULL argument");
    *out = NULL;
    int fd;
    struct stat sb;
    mc_status ost = fmt_input_open(path, &fd, &sb, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    fmt_st_file *f = mc_calloc(1, sizeof *f);
    if (f)
        f->path = mc_strdup(path);
    if (!f || !f->path) {
        close(fd);
        mc_free(f);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a file");
    }
    f->size = (size_t)sb.st_size;
    if (f->size == 0) {
        f->base = (const unsigned char *)"";
    } else {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            fmt_st_close(f);
            return mc_fail(err, MC_ERR_IO, path, NULL, -1, "mmap failed: %s",
                           strerror(e));
        }
        f->map = m;
        f->map_slot = fmt_mapguard_watch(m, f->size, path);
        f->base = m;
    }
    close(fd); /* the mapping keeps the file alive */
    return finish_open(f, out, err);
}

const char *fmt_st_path(const fmt_st_file *f) { return f ? f->path : NULL; }
size_t fmt_st_count(const fmt_st_file *f) { return f ? f->count : 0; }

const fmt_st_tensor *fmt_st_get(const fmt_st_file *f, size_t i)
{
    return f && i < f->count ? &f->tensors[i] : NULL;
}

const fmt_st_tensor *fmt_st_find(const fmt_st_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const fmt_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *fmt_st_metadata(const fmt_st_file *f, const char *key)
{
    for (size_t i = 0; f && key && i < f->meta_count; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}

size_t fmt_st_metadata_count(const fmt_st_file *f) { return f ? f->meta_count : 0; }

int fmt_st_metadata_at(const fmt_st_file *f, size_t i, const char **key,
                       const char **value)
{
    if (!f || i >= f->meta_count)
        return 0;
    if (key)
        *key = f->meta[2 * i];
    if (value)
        *value = f->meta[2 * i + 1];
    return 1;
}

int fmt_st_tensor_same(const fmt_st_tensor *a, const fmt_st_tensor *b)
{
    return a && b && a->dtype == b->dtype && a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
           a->nbytes == b->nbytes &&
           memcmp(a->data, b->data, (size_t)a->nbytes) == 0;
}

/* fmt_gguf_write.c - streaming GGUF writer (fmt_gguf.h).
 *
 * Metadata is serialized into one growing buffer as it is added (its bytes
 * depend only on the calls), tensors are declared with their sizes, so at
 * begin_data every offset is known and the whole header goes out before
 * the first data byte: the data then streams through fmt_atomic without
 * ever seeking back.  The padding between tensors is inserted here, so a
 * caller writes exactly each tensor's bytes. */
#include "fmt_gguf.h"

#include <stdio.h>
#include <string.h>

#include "fmt_atomic.h"
#include "mc_alloc.h"
#include "mc_checked.h"

typedef struct gtensor {
    char *name;
    fmt_gguf_ttype type;
    int ndim;
    uint64_t ne[FMT_GGUF_MAX_DIMS];
    uint64_t offset; /* relative to the data section */
    uint64_t bytes;  /* without padding */
} gtensor;

enum { G_DECLARE, G_DATA, G_FAILED };

struct fmt_gguf_writer {
    char *path;            /* final path, for errors */
    fmt_atomic_file *out;  /* temp file until finish */
    uint8_t *kv;           /* serialized key/value pairs */
    size_t kv_len, kv_cap;
    char **keys;           /* added keys, for the duplicate check */
    size_t nkeys, keys_cap;
    gtensor *t;
    size_t nt, t_cap;
    uint32_t align;
    int state;
    uint64_t data_bytes;   /* data section size, padded */
    uint64_t pos;          /* data bytes written, padding included */
    size_t cur;            /* tensor being written */
};

const char *fmt_gguf_ttype_name(fmt_gguf_ttype t)
{
    switch (t) {
    case FMT_GGUF_T_F32: return "F32";
    case FMT_GGUF_T_F16: return "F16";
    case FMT_GGUF_T_Q4_0: return "Q4_0";
    case FMT_GGUF_T_Q4_1: return "Q4_1";
    case FMT_GGUF_T_Q5_0: return "Q5_0";
    case FMT_GGUF_T_Q8_0: return "Q8_0";
    case FMT_GGUF_T_BF16: return "BF16";
    }
    return NULL;
}

mc_status fmt_gguf_row_bytes(fmt_gguf_ttype t, uint64_t ne0, const char *name,
                             uint64_t *out, mc_error *err)
{
    uint64_t esz = 0, bsz = 0; /* element bytes, or block bytes */
    switch (t) {
    case FMT_GGUF_T_F32: esz = 4; break;
    case FMT_GGUF_T_F16: case FMT_GGUF_T_BF16: esz = 2; break;
    case FMT_GGUF_T_Q4_0: bsz = FMT_GGUF_Q4_0_BYTES; break;
    case FMT_GGUF_T_Q4_1: bsz = FMT_GGUF_Q4_1_BYTES; break;
    case FMT_GGUF_T_Q5_0: bsz = FMT_GGUF_Q5_0_BYTES; break;
    case FMT_GGUF_T_Q8_0: bsz = FMT_GGUF_Q8_0_BYTES; break;
    default:
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, name, -1,
                       "ggml type %d is not one of F32, F16, BF16, Q8_0, "
                       "Q4_0, Q4_1, Q5_0", (int)t);
    }
    if (esz)
        return mc_mul_u64(ne0, esz, out)
                   ? MC_OK
                   : mc_fail(err, MC_ERR_OVERFLOW, NULL, name, -1,
                             "row of %llu elements overflows",
                             (unsigned long long)ne0);
    if (ne0 % FMT_GGUF_QK)
        return mc_fail(err, MC_ERR_SHAPE, NULL, name, -1,
                       "%s stores blocks of %u along ne[0]; ne[0] = %llu is "
                       "not a multiple of %u", fmt_gguf_ttype_name(t),
                       FMT_GGUF_QK, (unsigned long long)ne0, FMT_GGUF_QK);
    *out = ne0 / FMT_GGUF_QK * bsz;
    return MC_OK;
}

mc_status fmt_gguf_writer_create(const char *path, fmt_gguf_writer **out,
                                 mc_error *err)
{
    *out = NULL;
    fmt_gguf_writer *w = mc_calloc(1, sizeof *w);
    if (!w || !(w->path = mc_strdup(path))) {
        mc_free(w);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    }
    w->align = FMT_GGUF_DEFAULT_ALIGN;
    mc_status st = fmt_atomic_create(path, &w->out, err);
    if (st != MC_OK) {
        mc_free(w->path);
        mc_free(w);
        return st;
    }
    *out = w;
    return MC_OK;
}

static mc_status need_declare(fmt_gguf_writer *w, const char *what,
                              mc_error *err)
{
    if (w->state == G_DECLARE)
        return MC_OK;
    return mc_fail(err, MC_ERR_INVALID_ARG, w->path, what, -1,
                   "'%s' added after begin_data: metadata and tensors are "
                   "all declared before the data", what);
}

/* Append n bytes to the metadata buffer. */
static int kv_put(fmt_gguf_writer *w, const void *p, size_t n)
{
    if (n > w->kv_cap - w->kv_len) {
        size_t cap = w->kv_cap ? w->kv_cap : 1024;
        while (n > cap - w->kv_len) {
            if (cap > SIZE_MAX / 2)
                return 0;
            cap *= 2;
        }
        uint8_t *b = mc_realloc(w->kv, cap);
        if (!b)
            return 0;
        w->kv = b;
        w->kv_cap = cap;
    }
    if (n)
        memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 1;
}

static int kv_u32(fmt_gguf_writer *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return kv_put(w, b, 4);
}

static int kv_u64(fmt_gguf_writer *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return kv_put(w, b, 8);
}

static int kv_str(fmt_gguf_writer *w, const char *s, size_t len)
{
    return kv_u64(w, len) && kv_put(w, s, len);
}

/* Checks and records key, then writes it and the value type.  Rolls the
 * buffer back on a later failure via *mark. */
static mc_status kv_begin(fmt_gguf_writer *w, const char *key,
                          fmt_gguf_vtype vt, size_t *mark, mc_error *err)
{
    mc_status st = need_declare(w, key ? key : "(null)", err);
    if (st != MC_OK)
        return st;
    size_t klen = key ? strlen(key) : 0;
    if (klen == 0 || klen > FMT_GGUF_MAX_KEY)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                       "a metadata key is 1..%u bytes", FMT_GGUF_MAX_KEY);
    if (strcmp(key, "general.alignment") == 0)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                       "general.alignment is set with fmt_gguf_set_alignment "
                       "(it must be a u32 power of two that the writer "
                       "pads to)");
    for (size_t i = 0; i < w->nkeys; i++)
        if (strcmp(w->keys[i], key) == 0)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                           "duplicate metadata key '%s'", key);
    if (w->nkeys == w->keys_cap) {
        size_t cap = w->keys_cap ? 2 * w->keys_cap : 32;
        char **k = mc_realloc(w->keys, cap * sizeof *k);
        if (!k)
            return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1,
                           "out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    if (!(w->keys[w->nkeys] = mc_strdup(key)))
        return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1, "out of memory");
    w->nkeys++;
    *mark = w->kv_len;
    if (!kv_str(w, key, klen) || !kv_u32(w, (uint32_t)vt))
        return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1, "out of memory");
    return MC_OK;
}

/* Undo a half-added key (its value did not fit in memory). */
static mc_status kv_fail(fmt_gguf_writer *w, size_t mark, const char *key,
                         mc_error *err)
{
    w->kv_len = mark;
    mc_free(w->keys[--w->nkeys]);
    return mc_fail(err, MC_ERR_NOMEM, w->path, key, -1, "out of memory");
}

static size_t vsize(fmt_gguf_vtype t)
{
    switch (t) {
    case FMT_GGUF_V_U8: case FMT_GGUF_V_I8: case FMT_GGUF_V_BOOL: return 1;
    case FMT_GGUF_V_U16: case FMT_GGUF_V_I16: return 2;
    case FMT_GGUF_V_U32: case FMT_GGUF_V_I32: case FMT_GGUF_V_F32: return 4;
    case FMT_GGUF_V_U64: case FMT_GGUF_V_I64: case FMT_GGUF_V_F64: return 8;
    default: return 0;
    }
}

/* A scalar of a fixed-size type whose little-endian bytes are in v. */
static mc_status add_scalar(fmt_gguf_writer *w, const char *key,
                            fmt_gguf_vtype vt, uint64_t v, mc_error *err)
{
    size_t mark;
    mc_status st = kv_begin(w, key, vt, &mark, err);
    if (st != MC_OK)
        return st;
    uint8_t b[8];
    size_t n = vsize(vt);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return kv_put(w, b, n) ? MC_OK : kv_fail(w, mark, key, err);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

mc_status fmt_gguf_add_u32(fmt_gguf_writer *w, const char *key, uint32_t v,
                           mc_error *err)
{
    return add_scalar(w, key, FMT_GGUF_V_U32, v, err);
}

mc_status fmt_gguf_add_i32(fmt_gguf_writer *w, const char *key, int32_t v,
                           mc_error *err)
{
    return add_scalar(w, key, FMT_GGUF_V_I32, (uint32_t)v, err);
}

mc_status fmt_gguf_add_u64(fmt_gguf_writer *w, const char *key, uint64_t v,
                           mc_error *err)
{
    return add_scalar(w, key, FMT_GGUF_V_U64, v, err);
}

mc_status fmt_gguf_add_f32(fmt_gguf_writer *w, const char *key, float v,
                           mc_error *err)
{
    return add_scalar(w, key, FMT_GGUF_V_F32, f32_bits(v), err);
}

mc_status fmt_gguf_add_bool(fmt_gguf_writer *w, const char *key, int v,
                            mc_error *err)
{
    return add_scalar(w, key, FMT_GGUF_V_BOOL, v ? 1 : 0, err);
}

mc_status fmt_gguf_add_string(fmt_gguf_writer *w, const char *key,
                              const char *s, size_t len, mc_error *err)
{
    size_t mark;
    mc_status st = kv_begin(w, key, FMT_GGUF_V_STRING, &mark, err);
    if (st != MC_OK)
        return st;
    return kv_str(w, s, len) ? MC_OK : kv_fail(w, mark, key, err);
}

mc_status fmt_gguf_add_array(fmt_gguf_writer *w, const char *key,
                             fmt_gguf_vtype elem, const void *vals, size_t n,
                             mc_error *err)
{
    size_t esz = vsize(elem);
    if (!esz)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, key, -1,
                       "array element type %d is not a fixed-size scalar "
                       "(strings go through fmt_gguf_add_string_array, "
                       "arrays of arrays are not written)", (int)elem);
    size_t bytes;
    if (!mc_mul_size(n, esz, &bytes))
        return mc_fail(err, MC_ERR_OVERFLOW, w->path, key, -1,
                       "array of %zu elements overflows", n);
    size_t mark;
    mc_status st = kv_begin(w, key, FMT_GGUF_V_ARRAY, &mark, err);
    if (st != MC_OK)
        return st;
    /* values are host order; the format is little-endian, as every host
     * this project builds for (test_gguf checks the bytes) */
    if (!kv_u32(w, (uint32_t)elem) || !kv_u64(w, n) || !kv_put(w, vals, bytes))
        return kv_fail(w, mark, key, err);
    return MC_OK;
}

mc_status fmt_gguf_add_string_array(fmt_gguf_writer *w, const char *key,
                                    const char *const *strs,
                                    const size_t *lens, size_t n,
                                    mc_error *err)
{
    size_t mark;
    mc_status st = kv_begin(w, key, FMT_GGUF_V_ARRAY, &mark, err);
    if (st != MC_OK)
        return st;
    if (!kv_u32(w, FMT_GGUF_V_STRING) || !kv_u64(w, n))
        return kv_fail(w, mark, key, err);
    for (size_t i = 0; i < n; i++)
        if (!kv_str(w, strs[i], lens[i]))
            return kv_fail(w, mark, key, err);
    return MC_OK;
}

mc_status fmt_gguf_set_alignment(fmt_gguf_writer *w, uint32_t align,
                                 mc_error *err)
{
    mc_status st = need_declare(w, "general.alignment", err);
    if (st != MC_OK)
        return st;
    if (align < 8 || align > (1u << 20) || (align & (align - 1)))
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, "general.alignment",
                       -1, "alignment %u is not a power of two in [8, 1 MiB]",
                       align);
    if (w->nt)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, "general.alignment",
                       -1, "the alignment is set before any tensor is "
                       "declared (offsets depend on it)");
    w->align = align;
    return MC_OK;
}

mc_status fmt_gguf_add_tensor(fmt_gguf_writer *w, const char *name,
                              fmt_gguf_ttype type, int ndim,
                              const uint64_t *ne, mc_error *err)
{
    mc_status st = need_declare(w, name ? name : "(null)", err);
    if (st != MC_OK)
        return st;
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > FMT_GGUF_MAX_NAME)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "a tensor name is 1..%u bytes (ggml's GGML_MAX_NAME)",
                       FMT_GGUF_MAX_NAME);
    if (ndim < 1 || ndim > FMT_GGUF_MAX_DIMS)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "%d dimensions; GGUF tensors have 1..%d", ndim,
                       FMT_GGUF_MAX_DIMS);
    for (size_t i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                           "duplicate tensor name '%s'", name);
    uint64_t bytes;
    if ((st = fmt_gguf_row_bytes(type, ne[0], name, &bytes, err)) != MC_OK) {
        if (err)
            snprintf(err->file, sizeof err->file, "%s", w->path);
        return st;
    }
    for (int d = 1; d < ndim; d++)
        if (!mc_mul_u64(bytes, ne[d], &bytes))
            return mc_fail(err, MC_ERR_OVERFLOW, w->path, name, -1,
                           "tensor size overflows 64 bits");
    for (int d = 0; d < ndim; d++)
        if (ne[d] == 0)
            return mc_fail(err, MC_ERR_SHAPE, w->path, name, -1,
                           "dimension %d is 0", d);
    uint64_t off, next;
    if (!mc_align_up_u64(w->data_bytes, w->align, &off) ||
        !mc_add_u64(off, bytes, &next))
        return mc_fail(err, MC_ERR_OVERFLOW, w->path, name, -1,
                       "data section overflows 64 bits");
    if (w->nt == w->t_cap) {
        size_t cap = w->t_cap ? 2 * w->t_cap : 64;
        gtensor *t = mc_realloc(w->t, cap * sizeof *t);
        if (!t)
            return mc_fail(err, MC_ERR_NOMEM, w->path, name, -1,
                           "out of memory");
        w->t = t;
        w->t_cap = cap;
    }
    gtensor *t = &w->t[w->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = mc_strdup(name)))
        return mc_fail(err, MC_ERR_NOMEM, w->path, name, -1, "out of memory");
    t->type = type;
    t->ndim = ndim;
    memcpy(t->ne, ne, (size_t)ndim * sizeof *ne);
    t->offset = off;
    t->bytes = bytes;
    w->data_bytes = next;
    w->nt++;
    return MC_OK;
}

uint64_t fmt_gguf_tensor_bytes(const fmt_gguf_writer *w, size_t i)
{
    return i < w->nt ? w->t[i].bytes : 0;
}

static const uint8_t zeros[4096];

static mc_status write_zeros(fmt_atomic_file *f, uint64_t n, mc_error *err)
{
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        mc_status st = fmt_atomic_write(f, zeros, k, err);
        if (st != MC_OK)
            return st;
        n -= k;
    }
    return MC_OK;
}

mc_status fmt_gguf_begin_data(fmt_gguf_writer *w, mc_error *err)
{
    mc_status st = need_declare(w, "begin_data", err);
    if (st != MC_OK)
        return st;
    /* general.alignment goes last so the typed adders never see it */
    size_t nkv = w->nkeys;
    if (w->align != FMT_GGUF_DEFAULT_ALIGN) {
        if (!kv_str(w, "general.alignment", 17) ||
            !kv_u32(w, FMT_GGUF_V_U32) || !kv_u32(w, w->align))
            return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1,
                           "out of memory");
        nkv++;
    }
    /* the tensor infos follow the metadata in the same buffer */
    for (size_t i = 0; i < w->nt; i++) {
        const gtensor *t = &w->t[i];
        int ok = kv_str(w, t->name, strlen(t->name)) &&
                 kv_u32(w, (uint32_t)t->ndim);
        for (int d = 0; ok && d < t->ndim; d++)
            ok = kv_u64(w, t->ne[d]);
        if (!ok || !kv_u32(w, (uint32_t)t->type) || !kv_u64(w, t->offset))
            return mc_fail(err, MC_ERR_NOMEM, w->path, t->name, -1,
                           "out of memory");
    }
    uint8_t head[24];
    memcpy(head, FMT_GGUF_MAGIC, 4);
    uint64_t f[3] = {FMT_GGUF_VERSION, w->nt, nkv};
    for (int i = 0; i < 4; i++)
        head[4 + i] = (uint8_t)(f[0] >> (8 * i));
    for (int i = 0; i < 8; i++) {
        head[8 + i] = (uint8_t)(f[1] >> (8 * i));
        head[16 + i] = (uint8_t)(f[2] >> (8 * i));
    }
    uint64_t hdr = sizeof head + (uint64_t)w->kv_len, padded;
    if (!mc_align_up_u64(hdr, w->align, &padded))
        return mc_fail(err, MC_ERR_OVERFLOW, w->path, NULL, -1,
                       "header size overflows");
    w->state = G_FAILED; /* until the header is out */
    if ((st = fmt_atomic_write(w->out, head, sizeof head, err)) != MC_OK ||
        (st = fmt_atomic_write(w->out, w->kv, w->kv_len, err)) != MC_OK ||
        (st = write_zeros(w->out, padded - hdr, err)) != MC_OK)
        return st;
    w->state = G_DATA;
    return MC_OK;
}

mc_status fmt_gguf_write(fmt_gguf_writer *w, const void *data, size_t n,
                         mc_error *err)
{
    if (w->state != G_DATA)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "tensor data is written after begin_data and before "
                       "finish (or the writer already failed)");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->nt)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                           "%zu bytes more than the declared tensors hold", n);
        const gtensor *t = &w->t[w->cur];
        mc_status st;
        if (w->pos < t->offset) {
            st = write_zeros(w->out, t->offset - w->pos, err);
            if (st != MC_OK) {
                w->state = G_FAILED;
                return st;
            }
            w->pos = t->offset;
        }
        uint64_t left = t->offset + t->bytes - w->pos;
        size_t k = n < left ? n : (size_t)left;
        if ((st = fmt_atomic_write(w->out, p, k, err)) != MC_OK) {
            w->state = G_FAILED;
            return st;
        }
        w->pos += k;
        p += k;
        n -= k;
        if (k == left)
            w->cur++;
    }
    return MC_OK;
}

static void writer_free(fmt_gguf_writer *w)
{
    for (size_t i = 0; i < w->nkeys; i++)
        mc_free(w->keys[i]);
    for (size_t i = 0; i < w->nt; i++)
        mc_free(w->t[i].name);
    mc_free(w->keys);
    mc_free(w->t);
    mc_free(w->kv);
    mc_free(w->path);
    mc_free(w);
}

mc_status fmt_gguf_finish(fmt_gguf_writer *w, mc_error *err)
{
    mc_status st = MC_OK;
    /* a tensor of 0 bytes cannot be declared, so cur == nt means every
     * declared byte arrived */
    if (w->state != G_DATA)
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                     "finish before begin_data (or after a failed write)");
    else if (w->cur != w->nt)
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, w->t[w->cur].name, -1,
                     "tensor '%s' (%zu of %zu) is not fully written",
                     w->t[w->cur].name, w->cur + 1, w->nt);
    else {
        /* ggml pads after the last tensor too */
        uint64_t end;
        if (!mc_align_up_u64(w->data_bytes, w->align, &end))
            end = w->data_bytes;
        st = write_zeros(w->out, end - w->pos, err);
    }
    if (st == MC_OK) {
        st = fmt_atomic_commit(w->out, err);
    } else {
        fmt_atomic_abort(w->out);
    }
    writer_free(w);
    return st;
}

void fmt_gguf_abort(fmt_gguf_writer *w)
{
    if (!w)
        return;
    fmt_atomic_abort(w->out);
    writer_free(w);
}

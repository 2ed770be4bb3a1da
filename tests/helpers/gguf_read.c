/* gguf_read.c - the tests' GGUF reader (gguf_read.h). */
#include "gguf_read.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "testutil.h"

typedef struct cur {
    const uint8_t *b;
    size_t len, pos;
    tg_file *f;
} cur;

static int fail(cur *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(c->f->why, sizeof c->f->why, "at byte %zu: ", c->pos);
    vsnprintf(c->f->why + n, sizeof c->f->why - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static int take(cur *c, size_t n, const uint8_t **p)
{
    *p = NULL;
    if (n > c->len - c->pos)
        return fail(c, "%zu bytes past the end", n);
    *p = c->b + c->pos;
    c->pos += n;
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static int rd(cur *c, int n, uint64_t *v)
{
    const uint8_t *p = NULL;
    if (take(c, (size_t)n, &p))
        return -1;
    *v = le(p, n);
    return 0;
}

static int rd_str(cur *c, char **s, size_t *slen, const uint8_t **raw)
{
    uint64_t n;
    const uint8_t *p = NULL;
    if (rd(c, 8, &n) || n > c->len || take(c, (size_t)n, &p))
        return fail(c, "bad string length");
    if (raw)
        *raw = p;
    if (slen)
        *slen = (size_t)n;
    if (s) {
        *s = malloc((size_t)n + 1);
        memcpy(*s, p, (size_t)n);
        (*s)[n] = 0;
    }
    return 0;
}

static int fixed_size(uint32_t t)
{
    static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? sz[t] : -1;
}

static int skip_value(cur *c, uint32_t type, int depth)
{
    const uint8_t *p = NULL;
    if (type == 8)
        return rd_str(c, NULL, NULL, NULL);
    if (type == 9) {
        uint64_t elem = 0, n = 0;
        if (depth > 0 || rd(c, 4, &elem) || rd(c, 8, &n))
            return fail(c, "bad array");
        for (uint64_t i = 0; i < n; i++)
            if (skip_value(c, (uint32_t)elem, depth + 1))
                return -1;
        return 0;
    }
    int s = fixed_size(type);
    if (s <= 0)
        return fail(c, "unknown value type %u", type);
    return take(c, (size_t)s, &p);
}

static uint64_t type_bytes(uint32_t type, uint64_t ne0, int *ok)
{
    *ok = 1;
    switch (type) {
    case 0: return ne0 * 4;
    case 1: case 30: return ne0 * 2;
    case 2: *ok = ne0 % 32 == 0; return ne0 / 32 * 18;
    case 3: *ok = ne0 % 32 == 0; return ne0 / 32 * 20;
    case 6: *ok = ne0 % 32 == 0; return ne0 / 32 * 22;
    case 8: *ok = ne0 % 32 == 0; return ne0 / 32 * 34;
    default: *ok = 0; return 0;
    }
}

int tg_open(const char *path, tg_file *f)
{
    memset(f, 0, sizeof *f);
    f->buf = (uint8_t *)tu_read_file(path, &f->len);
    cur c = {f->buf, f->len, 0, f};
    if (!f->buf) {
        snprintf(f->why, sizeof f->why, "cannot read %s", path);
        return -1;
    }
    const uint8_t *p = NULL;
    uint64_t v = 0, nt = 0, nkv = 0;
    if (take(&c, 4, &p) || memcmp(p, "GGUF", 4) != 0) {
        fail(&c, "magic is not GGUF");
        goto bad;
    }
    if (rd(&c, 4, &v) || (f->version = (uint32_t)v) != 3) {
        fail(&c, "version %llu, expected 3", (unsigned long long)v);
        goto bad;
    }
    if (rd(&c, 8, &nt) || rd(&c, 8, &nkv) || nt > 1000000 || nkv > 1000000) {
        fail(&c, "bad counts");
        goto bad;
    }
    f->kv = calloc((size_t)nkv + 1, sizeof *f->kv);
    f->t = calloc((size_t)nt + 1, sizeof *f->t);
    f->align = 32;
    for (uint64_t i = 0; i < nkv; i++, f->nkv++) {
        tg_kv *k = &f->kv[i];
        if (rd_str(&c, &k->key, NULL, NULL) || rd(&c, 4, &v))
            goto bad;
        k->type = (uint32_t)v;
        if (k->type == 9) {
            uint64_t e = 0, n = 0;
            if (rd(&c, 4, &e) || rd(&c, 8, &n))
                goto bad;
            k->elem = (uint32_t)e;
            k->n = n;
            k->val = c.b + c.pos;
            k->val_off = c.pos;
            for (uint64_t j = 0; j < n; j++)
                if (skip_value(&c, k->elem, 1))
                    goto bad;
        } else {
            k->val = c.b + c.pos;
            k->val_off = c.pos;
            if (skip_value(&c, k->type, 0))
                goto bad;
        }
        if (strcmp(k->key, "general.alignment") == 0) {
            if (k->type != 4) {
                fail(&c, "general.alignment is type %u, not u32", k->type);
                goto bad;
            }
            f->align = (uint32_t)le(k->val, 4);
        }
    }
    if (f->align == 0 || (f->align & (f->align - 1))) {
        fail(&c, "alignment %u not a power of two", f->align);
        goto bad;
    }
    for (uint64_t i = 0; i < nt; i++, f->nt++) {
        tg_tensor *t = &f->t[i];
        if (rd_str(&c, &t->name, NULL, NULL) || rd(&c, 4, &v) || v < 1 ||
            v > 4) {
            fail(&c, "bad tensor info");
            goto bad;
        }
        t->ndim = (uint32_t)v;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (rd(&c, 8, &t->ne[d]))
                goto bad;
        for (uint32_t d = t->ndim; d < 4; d++)
            t->ne[d] = 1;
        if (rd(&c, 4, &v) || rd(&c, 8, &t->offset))
            goto bad;
        t->type = (uint32_t)v;
        int ok;
        t->bytes = type_bytes(t->type, t->ne[0], &ok) * t->ne[1] * t->ne[2] *
                   t->ne[3];
        if (!ok || t->offset % f->align) {
            fail(&c, "tensor %s: type %u ne0 %llu offset %llu", t->name,
                 t->type, (unsigned long long)t->ne[0],
                 (unsigned long long)t->offset);
            goto bad;
        }
    }
    f->data_off = (c.pos + f->align - 1) / f->align * f->align;
    for (size_t i = c.pos; i < f->data_off && i < f->len; i++)
        if (f->buf[i]) {
            c.pos = i;
            fail(&c, "non-zero header padding");
            goto bad;
        }
    for (size_t i = 0; i < f->nt; i++) {
        tg_tensor *t = &f->t[i];
        if (f->data_off > f->len || t->offset > f->len - f->data_off ||
            t->bytes > f->len - f->data_off - t->offset) {
            fail(&c, "tensor %s data past the end", t->name);
            goto bad;
        }
        t->data = f->buf + f->data_off + t->offset;
    }
    return 0;
bad:
    tg_close(f);
    return -1;
}

void tg_close(tg_file *f)
{
    for (size_t i = 0; i < f->nkv; i++)
        free(f->kv[i].key);
    for (size_t i = 0; i < f->nt; i++)
        free(f->t[i].name);
    free(f->kv);
    free(f->t);
    free(f->buf);
    f->kv = NULL;
    f->t = NULL;
    f->buf = NULL;
    f->nkv = f->nt = 0;
}

const tg_kv *tg_kv_find(const tg_file *f, const char *key)
{
    for (size_t i = 0; i < f->nkv; i++)
        if (strcmp(f->kv[i].key, key) == 0)
            return &f->kv[i];
    return NULL;
}

const tg_tensor *tg_tensor_find(const tg_file *f, const char *name)
{
    for (size_t i = 0; i < f->nt; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

uint32_t tg_kv_u32(const tg_file *f, const char *key)
{
    const tg_kv *k = tg_kv_find(f, key);
    return k && k->type == 4 ? (uint32_t)le(k->val, 4) : 0;
}

float tg_kv_f32(const tg_file *f, const char *key)
{
    const tg_kv *k = tg_kv_find(f, key);
    float x = 0;
    if (k && k->type == 6)
        memcpy(&x, k->val, 4);
    return x;
}

const char *tg_kv_str(const tg_file *f, const char *key, size_t *len)
{
    const tg_kv *k = tg_kv_find(f, key);
    *len = 0;
    if (!k || k->type != 8)
        return "";
    *len = (size_t)le(k->val, 8);
    return (const char *)k->val + 8;
}

static float h2f(const uint8_t *p)
{
    return fmt_f16_to_f32((uint16_t)le(p, 2));
}

int tg_row_f32(const tg_tensor *t, uint64_t r, float *out)
{
    uint64_t n = t->ne[0];
    int ok;
    const uint8_t *row = t->data + r * type_bytes(t->type, n, &ok);
    switch (t->type) {
    case 0:
        memcpy(out, row, (size_t)n * 4);
        return 0;
    case 1:
        for (uint64_t i = 0; i < n; i++)
            out[i] = h2f(row + 2 * i);
        return 0;
    case 30:
        for (uint64_t i = 0; i < n; i++)
            out[i] = fmt_bf16_to_f32((uint16_t)le(row + 2 * i, 2));
        return 0;
    case 8: /* Q8_0: f16 d, i8 qs[32] */
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + 34 * b;
            float d = h2f(blk);
            for (int j = 0; j < 32; j++)
                out[32 * b + j] = d * (float)(int8_t)blk[2 + j];
        }
        return 0;
    case 6: /* Q5_0: f16 d, u32 qh (LE), u8 qs[16]; as ggml's
             * dequantize_row_q5_0: bit j of qh is element j's fifth bit,
             * bit j + 16 element j + 16's */
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + 22 * b;
            float d = h2f(blk);
            uint32_t qh = (uint32_t)le(blk + 2, 4);
            for (int j = 0; j < 16; j++) {
                int x0 = (int)((blk[6 + j] & 15) | (((qh >> j) << 4) & 0x10));
                int x1 = (int)((blk[6 + j] >> 4) | ((qh >> (j + 12)) & 0x10));
                out[32 * b + j] = d * (float)(x0 - 16);
                out[32 * b + j + 16] = d * (float)(x1 - 16);
            }
        }
        return 0;
    case 2: /* Q4_0: f16 d, u8 qs[16]; low nibbles 0..15, high 16..31 */
    case 3: /* Q4_1: f16 d, f16 m, u8 qs[16] */
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + (t->type == 2 ? 18 : 20) * b;
            float d = h2f(blk), m = t->type == 3 ? h2f(blk + 2) : 0.0f;
            const uint8_t *qs = blk + (t->type == 2 ? 2 : 4);
            for (int j = 0; j < 16; j++) {
                int lo = qs[j] & 15, hi = qs[j] >> 4;
                if (t->type == 2) {
                    out[32 * b + j] = d * (float)(lo - 8);
                    out[32 * b + j + 16] = d * (float)(hi - 8);
                } else {
                    out[32 * b + j] = d * (float)lo + m;
                    out[32 * b + j + 16] = d * (float)hi + m;
                }
            }
        }
        return 0;
    default:
        return -1;
    }
}

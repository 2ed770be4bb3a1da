/* cmp_export_src.c - what an export reads: an artifact's tensors in their
 * stored formats, or a model directory's float tensors, one at a time
 * (cmp_export.h).
 *
 * An artifact tensor's section is read (and, for zstd, decompressed) into
 * one buffer reused from tensor to tensor, with its raw checksum checked:
 * an export never writes bytes the compiler did not store.  A model
 * directory's tensors are views into its mapping. */
#include "cmp_export.h"

#include <jansson.h>
#include <string.h>

#include "fmt_artifact.h"
#include "fmt_file.h"
#include "fmt_model.h"
#include "mc_alloc.h"

#define TOKENIZER_MAX (256u << 20) /* bytes: the runtime's own limit */

struct cmp_xsrc {
    char *path;
    fmt_art *art;            /* artifact input, or */
    fmt_model *model;        /* model directory input */
    fmt_model_config cfg;
    char *tok;               /* tokenizer.json bytes, or NULL */
    size_t tok_len;
    uint8_t *buf;            /* the loaded artifact section */
    uint64_t buf_cap;
};

static mc_status open_artifact(cmp_xsrc *s, mc_error *err)
{
    mc_status st = fmt_art_open(s->path, &s->art, err);
    if (st != MC_OK)
        return st;
    const json_t *cfg = json_object_get(fmt_art_manifest(s->art), "config");
    char *text = cfg ? json_dumps(cfg, JSON_COMPACT) : NULL;
    if (!text)
        return mc_fail(err, MC_ERR_FORMAT, s->path, "config", -1,
                       "the manifest has no config object");
    st = fmt_config_parse(text, strlen(text), s->path, &s->cfg, err);
    json_free_t jfree; /* json_dumps allocates with jansson's allocator */
    json_get_alloc_funcs(NULL, &jfree);
    jfree(text);
    if (st != MC_OK)
        return st;
    size_t ti = fmt_art_find_section(s->art, "tokenizer");
    if (ti == (size_t)-1)
        return MC_OK;
    const fmt_art_section *sec = fmt_art_section_at(s->art, ti);
    if (sec->raw_bytes > TOKENIZER_MAX)
        return mc_fail(err, MC_ERR_UNSUPPORTED, s->path, "tokenizer", -1,
                       "the embedded tokenizer is %llu bytes, over 256 MiB",
                       (unsigned long long)sec->raw_bytes);
    s->tok_len = (size_t)sec->raw_bytes;
    if (!(s->tok = mc_malloc(s->tok_len + 1)))
        return mc_fail(err, MC_ERR_NOMEM, s->path, "tokenizer", -1,
                       "out of memory");
    return fmt_art_section_read(s->art, ti, s->tok, sec->raw_bytes, 1, err);
}

static mc_status open_model(cmp_xsrc *s, mc_error *err)
{
    mc_status st = fmt_model_open(s->path, &s->model, err);
    if (st != MC_OK)
        return st;
    /* read through fmt_file (sized to the file) rather than
     * fmt_config_load, whose fixed 16 MiB read buffer would be most of an
     * export's peak for a small model */
    char *ctext;
    size_t clen;
    const char *cpath = fmt_model_config_path(s->model);
    st = fmt_file_read(cpath, 16u << 20, "16 MiB", &ctext, &clen, err);
    if (st != MC_OK)
        return st;
    st = fmt_config_parse(ctext, clen, cpath, &s->cfg, err);
    mc_free(ctext);
    if (st != MC_OK)
        return st;
    size_t n = strlen(fmt_model_dir(s->model)) + 16;
    char *tp = mc_malloc(n);
    if (!tp)
        return mc_fail(err, MC_ERR_NOMEM, s->path, NULL, -1, "out of memory");
    snprintf(tp, n, "%s/tokenizer.json", fmt_model_dir(s->model));
    mc_error e2;
    st = fmt_file_read(tp, TOKENIZER_MAX, "256 MiB", &s->tok, &s->tok_len,
                       &e2);
    mc_free(tp);
    if (st == MC_ERR_NOT_FOUND)
        return MC_OK; /* a model without a tokenizer exports without one */
    if (st != MC_OK && err)
        *err = e2;
    return st;
}

mc_status cmp_xsrc_open(const char *path, cmp_xsrc **out, mc_error *err)
{
    *out = NULL;
    cmp_xsrc *s = mc_calloc(1, sizeof *s);
    if (!s || !(s->path = mc_strdup(path))) {
        mc_free(s);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    }
    mc_status st = fmt_art_is_artifact(path) ? open_artifact(s, err)
                                             : open_model(s, err);
    if (st != MC_OK) {
        cmp_xsrc_close(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

void cmp_xsrc_close(cmp_xsrc *s)
{
    if (!s)
        return;
    fmt_art_close(s->art);
    fmt_model_close(s->model);
    mc_free(s->tok);
    mc_free(s->buf);
    mc_free(s->path);
    mc_free(s);
}

const fmt_model_config *cmp_xsrc_config(const cmp_xsrc *s)
{
    return &s->cfg;
}

const char *cmp_xsrc_tokenizer(const cmp_xsrc *s, size_t *len)
{
    *len = s->tok_len;
    return s->tok;
}

size_t cmp_xsrc_count(const cmp_xsrc *s)
{
    return s->art ? fmt_art_tensor_count(s->art)
                  : fmt_model_tensor_count(s->model);
}

int cmp_xsrc_has(const cmp_xsrc *s, const char *name)
{
    return s->art ? fmt_art_find_tensor(s->art, name) != NULL
                  : fmt_model_find(s->model, name, NULL) != NULL;
}

mc_status cmp_xsrc_info(const cmp_xsrc *s, size_t i, cmp_xtensor *t,
                        mc_error *err)
{
    memset(t, 0, sizeof *t);
    if (s->art) {
        const fmt_art_tensor *a = fmt_art_tensor_at(s->art, i);
        t->name = a->name;
        t->fmt = (kn_wformat)a->fmt; /* the same numbers (kn_names.c) */
        if (a->rows > UINT32_MAX || a->cols > UINT32_MAX)
            return mc_fail(err, MC_ERR_UNSUPPORTED, s->path, a->name, -1,
                           "%s %llux%llu is not exportable (rows and "
                           "columns must fit 32 bits)", a->format,
                           (unsigned long long)a->rows,
                           (unsigned long long)a->cols);
        t->ndim = a->ndim;
        t->rows = (uint32_t)a->rows;
        t->cols = (uint32_t)a->cols;
        t->group = a->group;
        /* the runtime's checks: each part exactly the kn_quant.h size */
        if ((t->fmt == KN_W_Q4 || t->fmt == KN_W_Q4S) &&
            (t->group == 0 || t->group % 32))
            return mc_fail(err, MC_ERR_FORMAT, s->path, a->name, -1,
                           "int4 group %u; expected 32, 64 or 128", t->group);
        if (a->data.bytes != kn_wformat_data_bytes(t->fmt, t->rows, t->cols) ||
            a->scales.bytes !=
                kn_wformat_scale_bytes(t->fmt, t->rows, t->cols, t->group) ||
            a->zeros.bytes !=
                kn_wformat_zero_bytes(t->fmt, t->rows, t->cols, t->group))
            return mc_fail(err, MC_ERR_FORMAT, s->path, a->name, -1,
                           "part sizes disagree with %s %ux%u group %u",
                           a->format, t->rows, t->cols, t->group);
        return MC_OK;
    }
    const fmt_st_tensor *m = fmt_model_tensor(s->model, i, NULL);
    t->name = m->name;
    if (m->dtype == FMT_DT_F32)
        t->fmt = KN_W_F32;
    else if (m->dtype == FMT_DT_F16)
        t->fmt = KN_W_F16;
    else if (m->dtype == FMT_DT_BF16)
        t->fmt = KN_W_BF16;
    else
        return mc_fail(err, MC_ERR_UNSUPPORTED, s->path, m->name, -1,
                       "dtype %s; expected F32, F16 or BF16",
                       fmt_dtype_name(m->dtype));
    if (m->ndim < 1 || m->ndim > 2 || m->shape[0] > UINT32_MAX ||
        m->shape[m->ndim - 1] > UINT32_MAX)
        return mc_fail(err, MC_ERR_SHAPE, s->path, m->name, -1,
                       "%d dimensions; expected a vector or a matrix "
                       "(each under 2^32)", m->ndim);
    t->ndim = m->ndim;
    t->rows = m->ndim == 2 ? (uint32_t)m->shape[0] : 1;
    t->cols = (uint32_t)m->shape[m->ndim - 1];
    t->data = m->data;
    return MC_OK;
}

mc_status cmp_xsrc_load(cmp_xsrc *s, size_t i, cmp_xtensor *t, mc_error *err)
{
    mc_status st = cmp_xsrc_info(s, i, t, err);
    if (st != MC_OK || !s->art)
        return st;
    const fmt_art_tensor *a = fmt_art_tensor_at(s->art, i);
    const fmt_art_section *sec = fmt_art_section_at(s->art, a->section);
    if (sec->raw_bytes > SIZE_MAX)
        return mc_fail(err, MC_ERR_OVERFLOW, s->path, a->name, -1,
                       "section of %llu bytes does not fit in memory",
                       (unsigned long long)sec->raw_bytes);
    if (sec->raw_bytes > s->buf_cap) {
        mc_free(s->buf);
        s->buf_cap = 0;
        if (!(s->buf = mc_malloc((size_t)sec->raw_bytes)))
            return mc_fail(err, MC_ERR_NOMEM, s->path, a->name, -1,
                           "out of memory for a %llu-byte section",
                           (unsigned long long)sec->raw_bytes);
        s->buf_cap = sec->raw_bytes;
    }
    st = fmt_art_section_read(s->art, a->section, s->buf, sec->raw_bytes, 1,
                              err);
    if (st != MC_OK)
        return st;
    /* fmt_art_open checked that every part lies inside its section */
    t->data = s->buf + a->data.off;
    t->scales = a->scales.bytes ? s->buf + a->scales.off : NULL;
    t->zeros = a->zeros.bytes ? s->buf + a->zeros.off : NULL;
    /* a zero is a 4-bit code (the runtime's rt_artifact.c checks the
     * same): Q5_0's c = q - zero + 16 and Q8_0's q - zero rely on it */
    for (uint64_t k = 0; t->zeros && k < a->zeros.bytes; k++)
        if (t->zeros[k] > 15)
            return mc_fail(err, MC_ERR_FORMAT, s->path, a->name, -1,
                           "int4 zero %u at index %llu; expected 0..15",
                           t->zeros[k], (unsigned long long)k);
    return MC_OK;
}

uint64_t cmp_xtensor_bytes(const cmp_xtensor *t)
{
    return kn_wformat_data_bytes(t->fmt, t->rows, t->cols) +
           kn_wformat_scale_bytes(t->fmt, t->rows, t->cols, t->group) +
           kn_wformat_zero_bytes(t->fmt, t->rows, t->cols, t->group);
}

static float rd_f32(const uint8_t *p)
{
    float x;
    memcpy(&x, p, 4);
    return x;
}

static uint16_t rd_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

void cmp_xtensor_row_f32(const cmp_xtensor *t, uint32_t r, float *out)
{
    uint64_t n = t->cols;
    switch (t->fmt) {
    case KN_W_F32:
        memcpy(out, t->data + (uint64_t)r * n * 4, (size_t)n * 4);
        return;
    case KN_W_F16:
    case KN_W_BF16: {
        const uint8_t *p = t->data + (uint64_t)r * n * 2;
        for (uint64_t c = 0; c < n; c++)
            out[c] = t->fmt == KN_W_F16 ? fmt_f16_to_f32(rd_u16(p + 2 * c))
                                        : fmt_bf16_to_f32(rd_u16(p + 2 * c));
        return;
    }
    case KN_W_Q8: {
        float s = rd_f32(t->scales + 4 * (uint64_t)r);
        const int8_t *q = (const int8_t *)t->data + (uint64_t)r * n;
        for (uint64_t c = 0; c < n; c++)
            out[c] = s * (float)q[c];
        return;
    }
    default: { /* Q4, Q4S */
        uint32_t ng = kn_q4_ngroups(t->cols, t->group);
        const uint8_t *q = t->data + (uint64_t)r * kn_q4_row_bytes(t->cols);
        for (uint64_t c = 0; c < n; c++) {
            uint64_t g = (uint64_t)r * ng + c / t->group;
            float s = fmt_f16_to_f32(rd_u16(t->scales + 2 * g));
            int z = t->fmt == KN_W_Q4 ? t->zeros[g] : KN_Q4_ZERO_SYM;
            int v = c & 1 ? q[c / 2] >> 4 : q[c / 2] & 15;
            out[c] = s * (float)(v - z);
        }
        return;
    }
    }
}

/* fmt_artifact_write.c - streaming artifact writer (layout in
 * fmt_artifact.h).  One pass: header and manifest first, then each section
 * (hashed, and zstd-compressed when asked, as the bytes arrive), then the
 * section table and trailer, all through fmt_atomic so the file appears
 * whole or not at all. */
#include "fmt_artifact.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#include "fmt_atomic.h"
#include "mc_alloc.h"
#include "mc_checked.h"

typedef struct wsec {
    char *name, *kind;
    uint64_t raw_bytes;
    fmt_art_codec codec;
    uint64_t offset, stored_bytes, stored_xxh3, raw_xxh3; /* filled on write */
} wsec;

struct fmt_art_writer {
    char path[512];
    fmt_atomic_file *f;
    wsec *secs;
    size_t nsecs, cap;
    int level;                  /* zstd level */
    uint64_t manifest_xxh3;     /* repeated in the trailer */
    int begun;
    size_t cur;                 /* section being written */
    uint64_t cur_raw;           /* raw bytes of it written so far */
    int cur_open;               /* its start has been emitted */
    XXH3_state_t *hraw, *hstored;
    ZSTD_CCtx *cc;
    uint8_t *zbuf;              /* compressed output buffer */
    size_t zcap;
};

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

mc_status fmt_art_writer_create(const char *path, fmt_art_writer **out,
                                mc_error *err)
{
    *out = NULL;
    fmt_art_writer *w = mc_calloc(1, sizeof *w);
    if (!w)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    snprintf(w->path, sizeof w->path, "%s", path);
    w->level = 3;
    *out = w;
    return MC_OK;
}

void fmt_art_writer_set_level(fmt_art_writer *w, int level)
{
    w->level = level;
}

mc_status fmt_art_writer_add_section(fmt_art_writer *w, const char *name,
                                     const char *kind, uint64_t raw_bytes,
                                     fmt_art_codec codec, mc_error *err)
{
    if (w->begun)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "sections must be declared before begin");
    if (codec > FMT_ART_CODEC_ZSTD || w->nsecs >= FMT_ART_MAX_SECTIONS)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                       "bad codec or too many sections");
    for (size_t i = 0; i < w->nsecs; i++)
        if (strcmp(w->secs[i].name, name) == 0)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, name, -1,
                           "duplicate section name");
    if (w->nsecs == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        wsec *ns = mc_realloc(w->secs, nc * sizeof *ns);
        if (!ns)
            return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1,
                           "out of memory");
        w->secs = ns;
        w->cap = nc;
    }
    wsec *s = &w->secs[w->nsecs];
    memset(s, 0, sizeof *s);
    s->name = mc_strdup(name);
    s->kind = mc_strdup(kind);
    if (!s->name || !s->kind) {
        mc_free(s->name);
        mc_free(s->kind);
        return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1, "out of memory");
    }
    s->raw_bytes = raw_bytes;
    s->codec = codec;
    w->nsecs++;
    return MC_OK;
}

static mc_status put(fmt_art_writer *w, const void *p, size_t n,
                     mc_error *err)
{
    return n ? fmt_atomic_write(w->f, p, n, err) : MC_OK;
}

static mc_status pad_to(fmt_art_writer *w, uint64_t align, mc_error *err)
{
    static const uint8_t zeros[4096];
    uint64_t pos = fmt_atomic_tell(w->f), target;
    if (!mc_align_up_u64(pos, align, &target))
        return mc_fail(err, MC_ERR_OVERFLOW, w->path, NULL, -1, "overflow");
    while (pos < target) {
        size_t n = (size_t)(target - pos < sizeof zeros ? target - pos
                                                         : sizeof zeros);
        mc_status st = put(w, zeros, n, err);
        if (st != MC_OK)
            return st;
        pos += n;
    }
    return MC_OK;
}

mc_status fmt_art_writer_begin(fmt_art_writer *w, const json_t *manifest,
                               mc_error *err)
{
    if (w->begun || !json_is_object(manifest))
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "begin needs a JSON object manifest, once");
    json_t *m = json_deep_copy(manifest);
    json_t *secs = json_array();
    if (!m || !secs) {
        json_decref(m);
        json_decref(secs);
        return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1, "out of memory");
    }
    int bad = 0;
    for (size_t i = 0; i < w->nsecs; i++)
        bad |= json_array_append_new(
            secs, json_pack("{s:s, s:s, s:I}", "name", w->secs[i].name, "kind",
                            w->secs[i].kind,
                            "raw_bytes", (json_int_t)w->secs[i].raw_bytes));
    bad |= json_object_set_new(m, "sections", secs);
    bad |= json_object_set_new(m, "format", json_string("mcompile-artifact"));
    bad |= json_object_set_new(m, "version", json_integer(FMT_ART_VERSION));
    char *text = bad ? NULL : json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    if (!text)
        return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1,
                       "cannot serialize the manifest");
    size_t mlen = strlen(text);
    if (mlen > FMT_ART_MAX_MANIFEST) {
        mc_free(text);
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, "manifest", -1,
                       "manifest of %zu bytes exceeds the %u-byte limit", mlen,
                       FMT_ART_MAX_MANIFEST);
    }
    uint8_t h[FMT_ART_HEADER_BYTES] = {0};
    memcpy(h, FMT_ART_MAGIC, 8);
    wr32(h + 8, FMT_ART_VERSION);
    wr32(h + 12, FMT_ART_HEADER_BYTES);
    wr64(h + 16, FMT_ART_HEADER_BYTES);
    wr64(h + 24, mlen);
    w->manifest_xxh3 = fmt_art_xxh3(text, mlen);
    wr64(h + 32, w->manifest_xxh3);
    wr32(h + 40, FMT_ART_ALIGN);
    wr64(h + 56, fmt_art_xxh3(h, 56));
    mc_status st = fmt_atomic_create(w->path, &w->f, err);
    if (st == MC_OK)
        st = put(w, h, sizeof h, err);
    if (st == MC_OK)
        st = put(w, text, mlen, err);
    mc_free(text);
    if (st != MC_OK)
        return st;
    w->hraw = XXH3_createState();
    w->hstored = XXH3_createState();
    if (!w->hraw || !w->hstored)
        return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1, "out of memory");
    w->begun = 1;
    return MC_OK;
}

static mc_status stored_out(fmt_art_writer *w, const void *p, size_t n,
                            mc_error *err)
{
    /* raw sections store the raw bytes: their one hash is taken in
     * fmt_art_writer_write and copied at close */
    if (w->secs[w->cur].codec != FMT_ART_CODEC_RAW)
        XXH3_64bits_update(w->hstored, p, n);
    w->secs[w->cur].stored_bytes += n;
    return put(w, p, n, err);
}

static mc_status open_section(fmt_art_writer *w, mc_error *err)
{
    mc_status st = pad_to(w, FMT_ART_ALIGN, err);
    if (st != MC_OK)
        return st;
    wsec *s = &w->secs[w->cur];
    s->offset = fmt_atomic_tell(w->f);
    XXH3_64bits_reset(w->hraw);
    XXH3_64bits_reset(w->hstored);
    w->cur_raw = 0;
    if (s->codec == FMT_ART_CODEC_ZSTD) {
        if (!w->cc) {
            w->cc = ZSTD_createCCtx();
            w->zcap = ZSTD_CStreamOutSize();
            w->zbuf = mc_malloc(w->zcap);
            if (!w->cc || !w->zbuf)
                return mc_fail(err, MC_ERR_NOMEM, w->path, NULL, -1,
                               "out of memory");
        }
        ZSTD_CCtx_reset(w->cc, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(w->cc, ZSTD_c_compressionLevel, w->level);
        ZSTD_CCtx_setParameter(w->cc, ZSTD_c_nbWorkers, 0);
        ZSTD_CCtx_setParameter(w->cc, ZSTD_c_windowLog, 22);
        ZSTD_CCtx_setPledgedSrcSize(w->cc, s->raw_bytes);
    }
    w->cur_open = 1;
    return MC_OK;
}

static mc_status zstd_push(fmt_art_writer *w, const void *p, size_t n,
                           ZSTD_EndDirective mode, mc_error *err)
{
    ZSTD_inBuffer in = {p, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {w->zbuf, w->zcap, 0};
        size_t r = ZSTD_compressStream2(w->cc, &out, &in, mode);
        if (ZSTD_isError(r))
            return mc_fail(err, MC_ERR_IO, w->path, w->secs[w->cur].name, -1,
                           "zstd: %s", ZSTD_getErrorName(r));
        mc_status st = stored_out(w, w->zbuf, out.pos, err);
        if (st != MC_OK)
            return st;
        if (mode == ZSTD_e_end ? r == 0 : in.pos == in.size)
            return MC_OK;
    }
}

static mc_status close_section(fmt_art_writer *w, mc_error *err)
{
    wsec *s = &w->secs[w->cur];
    if (s->codec == FMT_ART_CODEC_ZSTD) {
        mc_status st = zstd_push(w, NULL, 0, ZSTD_e_end, err);
        if (st != MC_OK)
            return st;
    }
    s->raw_xxh3 = XXH3_64bits_digest(w->hraw);
    s->stored_xxh3 = s->codec == FMT_ART_CODEC_RAW
                         ? s->raw_xxh3
                         : XXH3_64bits_digest(w->hstored);
    w->cur++;
    w->cur_open = 0;
    return MC_OK;
}

/* Close the current section if complete, and any empty ones after it. */
static mc_status advance(fmt_art_writer *w, mc_error *err)
{
    while (w->cur < w->nsecs) {
        if (!w->cur_open) {
            mc_status st = open_section(w, err);
            if (st != MC_OK)
                return st;
        }
        if (w->cur_raw < w->secs[w->cur].raw_bytes)
            return MC_OK;
        mc_status st = close_section(w, err);
        if (st != MC_OK)
            return st;
    }
    return MC_OK;
}

mc_status fmt_art_writer_write(fmt_art_writer *w, const void *data, size_t n,
                               mc_error *err)
{
    if (!w->begun)
        return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                       "write before begin");
    const uint8_t *p = data;
    while (n > 0) {
        mc_status st = advance(w, err);
        if (st != MC_OK)
            return st;
        if (w->cur >= w->nsecs)
            return mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                           "more bytes written than the sections declare");
        wsec *s = &w->secs[w->cur];
        uint64_t left = s->raw_bytes - w->cur_raw;
        size_t k = (size_t)(left < n ? left : n);
        XXH3_64bits_update(w->hraw, p, k);
        st = s->codec == FMT_ART_CODEC_ZSTD
                 ? zstd_push(w, p, k, ZSTD_e_continue, err)
                 : stored_out(w, p, k, err);
        if (st != MC_OK)
            return st;
        w->cur_raw += k;
        p += k;
        n -= k;
    }
    return advance(w, err);
}

static void free_writer(fmt_art_writer *w)
{
    for (size_t i = 0; i < w->nsecs; i++) {
        mc_free(w->secs[i].name);
        mc_free(w->secs[i].kind);
    }
    mc_free(w->secs);
    XXH3_freeState(w->hraw);
    XXH3_freeState(w->hstored);
    ZSTD_freeCCtx(w->cc);
    mc_free(w->zbuf);
    mc_free(w);
}

mc_status fmt_art_writer_finish(fmt_art_writer *w, mc_error *err)
{
    mc_status st = MC_OK;
    if (!w->begun) {
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, NULL, -1,
                     "finish before begin");
        goto fail;
    }
    if ((st = advance(w, err)) != MC_OK)
        goto fail;
    if (w->cur < w->nsecs) {
        st = mc_fail(err, MC_ERR_INVALID_ARG, w->path, w->secs[w->cur].name,
                     -1, "section '%s' got %llu of %llu bytes",
                     w->secs[w->cur].name, (unsigned long long)w->cur_raw,
                     (unsigned long long)w->secs[w->cur].raw_bytes);
        goto fail;
    }
    if ((st = pad_to(w, 64, err)) != MC_OK)
        goto fail;
    uint64_t tab = fmt_atomic_tell(w->f);
    XXH3_64bits_reset(w->hstored);
    for (size_t i = 0; i < w->nsecs; i++) {
        uint8_t e[FMT_ART_ENTRY_BYTES] = {0};
        wr64(e, w->secs[i].offset);
        wr64(e + 8, w->secs[i].stored_bytes);
        wr64(e + 16, w->secs[i].raw_bytes);
        wr64(e + 24, w->secs[i].stored_xxh3);
        wr64(e + 32, w->secs[i].raw_xxh3);
        wr32(e + 40, (uint32_t)w->secs[i].codec);
        XXH3_64bits_update(w->hstored, e, sizeof e);
        if ((st = put(w, e, sizeof e, err)) != MC_OK)
            goto fail;
    }
    uint8_t t[FMT_ART_TRAILER_BYTES] = {0};
    memcpy(t, FMT_ART_END_MAGIC, 8);
    wr64(t + 8, tab);
    wr64(t + 16, w->nsecs);
    wr64(t + 24, XXH3_64bits_digest(w->hstored));
    wr64(t + 32, fmt_atomic_tell(w->f) + FMT_ART_TRAILER_BYTES);
    wr64(t + 40, w->manifest_xxh3);
    wr64(t + 56, fmt_art_xxh3(t, 56));
    if ((st = put(w, t, sizeof t, err)) != MC_OK)
        goto fail;
    st = fmt_atomic_commit(w->f, err);
    w->f = NULL;
    free_writer(w);
    return st;
fail:
    fmt_atomic_abort(w->f);
    free_writer(w);
    return st;
}

void fmt_art_writer_abort(fmt_art_writer *w)
{
    if (!w)
        return;
    fmt_atomic_abort(w->f);
    free_writer(w);
}

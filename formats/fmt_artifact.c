/* fmt_artifact.c - artifact reader: cheap checks on open, deep checks on
 * demand, streaming section reads.  Layout in fmt_artifact.h; the writer is
 * fmt_artifact_write.c. */
#include "fmt_artifact.h"
#include "fmt_json_strict.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "fmt_input.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"
#include "mc_checked.h"

struct fmt_art {
    char name[512];             /* path or caller name, for messages */
    const uint8_t *base;        /* whole file */
    uint64_t size;              /* bytes */
    void *map;                  /* mmap'ed region (NULL for memory opens) */
    size_t map_len;
    int map_slot;               /* fmt_mapguard slot of map (when map) */
    json_t *manifest;           /* owned */
    const char *manifest_text;  /* view into base */
    uint64_t manifest_bytes;
    fmt_art_section *sections;  /* [nsections] */
    size_t nsections;
    fmt_art_tensor *tensors;    /* [ntensors] */
    size_t ntensors;
    uint64_t table_offset;      /* start of the section table */
};

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

uint64_t fmt_art_xxh3(const void *data, size_t n)
{
    return (uint64_t)XXH3_64bits(data, n);
}

#define CORRUPT(a, off, ...)                                                   \
    mc_fail(err, MC_ERR_FORMAT, (a)->name, NULL, (int64_t)(off), __VA_ARGS__)

static mc_status check_header(fmt_art *a, mc_error *err, uint64_t *align)
{
    const uint8_t *h = a->base;
    if (a->size < FMT_ART_HEADER_BYTES + FMT_ART_TRAILER_BYTES)
        return CORRUPT(a, 0, "file is %llu bytes, an artifact has at least %u "
                       "(truncated?)", (unsigned long long)a->size,
                       FMT_ART_HEADER_BYTES + FMT_ART_TRAILER_BYTES);
    if (memcmp(h, FMT_ART_MAGIC, 8) != 0)
        return CORRUPT(a, 0, "not an mcompile artifact (bad magic)");
    if (rd64(h + 56) != fmt_art_xxh3(h, 56))
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, "header", 56,
                       "header checksum mismatch (header damaged)");
    uint32_t version = rd32(h + 8);
    if (version != FMT_ART_VERSION)
        return mc_fail(err, MC_ERR_UNSUPPORTED, a->name, "version", 8,
                       "artifact version %u, this build reads version %u",
                       version, FMT_ART_VERSION);
    if (rd32(h + 12) != FMT_ART_HEADER_BYTES)
        return CORRUPT(a, 12, "header_bytes %u, expected %u", rd32(h + 12),
                       FMT_ART_HEADER_BYTES);
    if (rd64(h + 16) != FMT_ART_HEADER_BYTES)
        return CORRUPT(a, 16, "manifest must start at byte %u",
                       FMT_ART_HEADER_BYTES);
    uint32_t al = rd32(h + 40);
    if (al < 64 || al > (1u << 20) || (al & (al - 1)) != 0)
        return CORRUPT(a, 40, "alignment %u is not a power of two in "
                       "[64, 1 MiB]", al);
    if (rd32(h + 44) != 0 || rd64(h + 48) != 0)
        return CORRUPT(a, 44, "reserved header fields must be zero");
    a->manifest_bytes = rd64(h + 24);
    if (a->manifest_bytes > FMT_ART_MAX_MANIFEST ||
        !mc_range_ok(FMT_ART_HEADER_BYTES, a->manifest_bytes,
                     a->size - FMT_ART_TRAILER_BYTES))
        return CORRUPT(a, 24, "manifest of %llu bytes does not fit the file",
                       (unsigned long long)a->manifest_bytes);
    a->manifest_text = (const char *)h + FMT_ART_HEADER_BYTES;
    if (fmt_art_xxh3(a->manifest_text, a->manifest_bytes) != rd64(h + 32))
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, "manifest",
                       FMT_ART_HEADER_BYTES,
                       "manifest checksum mismatch (manifest damaged)");
    *align = al;
    return MC_OK;
}

static mc_status check_table(fmt_art *a, uint64_t align, mc_error *err)
{
    uint64_t toff = a->size - FMT_ART_TRAILER_BYTES;
    const uint8_t *t = a->base + toff;
    if (memcmp(t, FMT_ART_END_MAGIC, 8) != 0)
        return CORRUPT(a, toff, "trailer magic missing (file truncated or "
                       "extended?)");
    if (rd64(t + 56) != fmt_art_xxh3(t, 56))
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, "trailer",
                       (int64_t)toff + 56, "trailer checksum mismatch");
    if (rd64(t + 32) != a->size)
        return CORRUPT(a, toff + 32, "trailer says %llu bytes, file has %llu",
                       (unsigned long long)rd64(t + 32),
                       (unsigned long long)a->size);
    if (rd64(t + 40) != rd64(a->base + 32))
        return CORRUPT(a, toff + 40, "trailer and header disagree on the "
                       "manifest checksum");
    if (rd64(t + 48) != 0)
        return CORRUPT(a, toff + 48, "reserved trailer field must be zero");
    uint64_t tab = rd64(t + 8), count = rd64(t + 16), tbytes;
    if (count > FMT_ART_MAX_SECTIONS ||
        !mc_mul_u64(count, FMT_ART_ENTRY_BYTES, &tbytes) ||
        tab > toff || tbytes != toff - tab || tab % 64 != 0)
        return CORRUPT(a, toff + 8, "section table (offset %llu, %llu "
                       "entries) does not end at the trailer",
                       (unsigned long long)tab, (unsigned long long)count);
    if (fmt_art_xxh3(a->base + tab, tbytes) != rd64(t + 24))
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, "section table",
                       (int64_t)tab, "section table checksum mismatch");
    a->table_offset = tab;
    uint64_t data_start;
    if (!mc_align_up_u64(FMT_ART_HEADER_BYTES + a->manifest_bytes, align,
                         &data_start) || data_start > tab)
        return CORRUPT(a, tab, "section table overlaps the manifest");
    a->nsections = (size_t)count;
    a->sections = mc_calloc(count ? count : 1, sizeof *a->sections);
    if (!a->sections)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    uint64_t prev_end = data_start;
    for (size_t i = 0; i < a->nsections; i++) {
        const uint8_t *e = a->base + tab + i * FMT_ART_ENTRY_BYTES;
        uint64_t eoff = tab + i * FMT_ART_ENTRY_BYTES;
        fmt_art_section *s = &a->sections[i];
        s->offset = rd64(e);
        s->stored_bytes = rd64(e + 8);
        s->raw_bytes = rd64(e + 16);
        s->stored_xxh3 = rd64(e + 24);
        s->raw_xxh3 = rd64(e + 32);
        uint32_t codec = rd32(e + 40);
        if (rd32(e + 44) != 0 || rd64(e + 48) != 0 || rd64(e + 56) != 0)
            return CORRUPT(a, eoff + 44, "section %zu: reserved fields must "
                           "be zero", i);
        if (codec > FMT_ART_CODEC_ZSTD)
            return CORRUPT(a, eoff + 40, "section %zu: unknown codec %u", i,
                           codec);
        s->codec = (fmt_art_codec)codec;
        if (s->offset % align != 0)
            return CORRUPT(a, eoff, "section %zu: offset %llu is not a "
                           "multiple of the alignment %llu", i,
                           (unsigned long long)s->offset,
                           (unsigned long long)align);
        if (s->offset < prev_end || !mc_range_ok(s->offset, s->stored_bytes,
                                                 tab))
            return CORRUPT(a, eoff, "section %zu: bytes [%llu, +%llu) overlap "
                           "another part of the file or run past the table",
                           i, (unsigned long long)s->offset,
                           (unsigned long long)s->stored_bytes);
        if (s->codec == FMT_ART_CODEC_RAW && s->stored_bytes != s->raw_bytes)
            return CORRUPT(a, eoff + 8, "section %zu: raw section with stored "
                           "%llu != raw %llu bytes", i,
                           (unsigned long long)s->stored_bytes,
                           (unsigned long long)s->raw_bytes);
        if (s->codec == FMT_ART_CODEC_ZSTD &&
            s->raw_bytes > (uint64_t)1 << 46)
            return CORRUPT(a, eoff + 16, "section %zu: implausible raw size "
                           "%llu", i, (unsigned long long)s->raw_bytes);
        s->stored = a->base + s->offset;
        prev_end = s->offset + s->stored_bytes;
    }
    return MC_OK;
}

/* ---- manifest schema ---------------------------------------------------- */

static int get_u64(const json_t *o, const char *key, uint64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static int get_part(const json_t *o, const char *key, fmt_art_part *p)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_array(v) || json_array_size(v) != 2)
        return 0;
    const json_t *a = json_array_get(v, 0), *b = json_array_get(v, 1);
    if (!json_is_integer(a) || !json_is_integer(b) ||
        json_integer_value(a) < 0 || json_integer_value(b) < 0)
        return 0;
    p->off = (uint64_t)json_integer_value(a);
    p->bytes = (uint64_t)json_integer_value(b);
    return 1;
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* First name that appears twice (sorting a copy: O(n log n) even for the
 * 2^20 sections a hostile file may declare), NULL if none; *nomem set when
 * the copy cannot be allocated. */
static const char *find_duplicate(const char **names, size_t n, int *nomem)
{
    *nomem = 0;
    if (n < 2)
        return NULL;
    const char **v = mc_malloc_array(n, sizeof *v);
    if (!v) {
        *nomem = 1;
        return NULL;
    }
    memcpy(v, names, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_str);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (strcmp(v[i - 1], v[i]) == 0)
            dup = v[i];
    mc_free(v);
    return dup;
}

static const char *const g_wformat[FMT_ART_NFORMATS] = {
    [FMT_ART_F32] = "f32", [FMT_ART_F16] = "f16", [FMT_ART_BF16] = "bf16",
    [FMT_ART_Q8] = "q8",   [FMT_ART_Q4] = "q4",   [FMT_ART_Q4S] = "q4s",
};

const char *fmt_art_wformat_name(fmt_art_wformat f)
{
    return (unsigned)f < FMT_ART_NFORMATS ? g_wformat[f] : "?";
}

int fmt_art_wformat_parse(const char *s, fmt_art_wformat *out)
{
    for (int i = 0; s && i < FMT_ART_NFORMATS; i++)
        if (strcmp(s, g_wformat[i]) == 0) {
            *out = (fmt_art_wformat)i;
            return 0;
        }
    return -1;
}

#define SCHEMA(field, ...)                                                     \
    mc_fail(err, MC_ERR_FORMAT, a->name, field, FMT_ART_HEADER_BYTES,          \
            __VA_ARGS__)

static mc_status check_sections_schema(fmt_art *a, mc_error *err)
{
    const json_t *secs = json_object_get(a->manifest, "sections");
    if (!json_is_array(secs) || json_array_size(secs) != a->nsections)
        return SCHEMA("sections", "manifest lists %zu sections, the table has "
                      "%zu", json_is_array(secs) ? json_array_size(secs) : 0,
                      a->nsections);
    for (size_t i = 0; i < a->nsections; i++) {
        const json_t *s = json_array_get(secs, i);
        const json_t *nm = json_object_get(s, "name");
        const json_t *kd = json_object_get(s, "kind");
        uint64_t raw;
        if (!json_is_string(nm) || !json_is_string(kd) ||
            !get_u64(s, "raw_bytes", &raw))
            return SCHEMA("sections", "section %zu needs name, kind and "
                          "raw_bytes", i);
        if (raw != a->sections[i].raw_bytes)
            return SCHEMA("sections", "section %zu: manifest raw_bytes %llu, "
                          "table %llu", i, (unsigned long long)raw,
                          (unsigned long long)a->sections[i].raw_bytes);
        a->sections[i].name = json_string_value(nm);
        a->sections[i].kind = json_string_value(kd);
    }
    const char **names = mc_malloc_array(a->nsections ? a->nsections : 1,
                                         sizeof *names);
    if (!names)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    for (size_t i = 0; i < a->nsections; i++)
        names[i] = a->sections[i].name;
    int nomem;
    const char *dup = find_duplicate(names, a->nsections, &nomem);
    mc_free(names);
    if (nomem)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    if (dup)
        return SCHEMA("sections", "duplicate section name '%s'", dup);
    return MC_OK;
}

static mc_status check_part(fmt_art *a, const fmt_art_tensor *t,
                            const char *what, fmt_art_part p, mc_error *err)
{
    uint64_t raw = a->sections[t->section].raw_bytes;
    if (p.bytes == 0)
        return MC_OK;
    if (p.off % FMT_ART_PART_ALIGN != 0 || !mc_range_ok(p.off, p.bytes, raw))
        return SCHEMA(t->name, "tensor '%s' %s [%llu, +%llu) is unaligned or "
                      "outside its section of %llu bytes", t->name, what,
                      (unsigned long long)p.off, (unsigned long long)p.bytes,
                      (unsigned long long)raw);
    return MC_OK;
}

static mc_status check_tensors_schema(fmt_art *a, mc_error *err)
{
    const json_t *ts = json_object_get(a->manifest, "tensors");
    if (!json_is_array(ts))
        return SCHEMA("tensors", "manifest needs a \"tensors\" array");
    a->ntensors = json_array_size(ts);
    a->tensors = mc_calloc(a->ntensors ? a->ntensors : 1, sizeof *a->tensors);
    if (!a->tensors)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    for (size_t i = 0; i < a->ntensors; i++) {
        const json_t *o = json_array_get(ts, i);
        fmt_art_tensor *t = &a->tensors[i];
        const json_t *nm = json_object_get(o, "name");
        const json_t *fm = json_object_get(o, "format");
        const json_t *sh = json_object_get(o, "shape");
        uint64_t sec, group;
        if (!json_is_string(nm) || !json_is_string(fm) || !json_is_array(sh) ||
            !get_u64(o, "section", &sec) || !get_u64(o, "group", &group) ||
            !get_part(o, "data", &t->data) ||
            !get_part(o, "scales", &t->scales) ||
            !get_part(o, "zeros", &t->zeros))
            return SCHEMA("tensors", "tensor %zu needs name, format, shape, "
                          "group, section, data, scales, zeros", i);
        t->name = json_string_value(nm);
        if (fmt_art_wformat_parse(json_string_value(fm), &t->fmt) != 0)
            return SCHEMA(t->name, "tensor '%s': unknown format '%s'", t->name,
                          json_string_value(fm));
        t->format = fmt_art_wformat_name(t->fmt);
        size_t nd = json_array_size(sh);
        uint64_t d0 = 0, d1 = 0;
        if (nd < 1 || nd > 2 ||
            !json_is_integer(json_array_get(sh, 0)) ||
            json_integer_value(json_array_get(sh, 0)) <= 0 ||
            (nd == 2 && (!json_is_integer(json_array_get(sh, 1)) ||
                         json_integer_value(json_array_get(sh, 1)) <= 0)))
            return SCHEMA(t->name, "tensor '%s': shape must be [n] or "
                          "[rows, cols] of positive integers", t->name);
        d0 = (uint64_t)json_integer_value(json_array_get(sh, 0));
        if (nd == 2)
            d1 = (uint64_t)json_integer_value(json_array_get(sh, 1));
        t->ndim = (int)nd;
        t->rows = nd == 2 ? d0 : 1;
        t->cols = nd == 2 ? d1 : d0;
        if (t->rows > UINT32_MAX || t->cols > UINT32_MAX || group > 4096)
            return SCHEMA(t->name, "tensor '%s': dimensions or group too "
                          "large", t->name);
        t->group = (uint32_t)group;
        if (sec >= a->nsections)
            return SCHEMA(t->name, "tensor '%s': section %llu of %zu", t->name,
                          (unsigned long long)sec, a->nsections);
        t->section = (size_t)sec;
        /* a tensor's bytes are its own section's: named after it, of kind
         * "tensor" (the writer's layout); one pointed at another tensor's
         * or the tokenizer's would load other bytes under its name */
        const fmt_art_section *ts = &a->sections[t->section];
        if (strcmp(ts->name, t->name) != 0 || strcmp(ts->kind, "tensor") != 0)
            return SCHEMA(t->name, "tensor '%s': section %zu is '%s' of kind "
                          "'%s'; expected its own, of kind 'tensor'", t->name,
                          t->section, ts->name, ts->kind);
        mc_status st;
        if ((st = check_part(a, t, "data", t->data, err)) != MC_OK ||
            (st = check_part(a, t, "scales", t->scales, err)) != MC_OK ||
            (st = check_part(a, t, "zeros", t->zeros, err)) != MC_OK)
            return st;
        if (t->data.bytes == 0)
            return SCHEMA(t->name, "tensor '%s' has no data", t->name);
    }
    const char **names = mc_malloc_array(a->ntensors ? a->ntensors : 1,
                                         sizeof *names);
    if (!names)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    for (size_t i = 0; i < a->ntensors; i++)
        names[i] = a->tensors[i].name;
    int nomem;
    const char *dup = find_duplicate(names, a->ntensors, &nomem);
    mc_free(names);
    if (nomem)
        return mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1, "out of memory");
    if (dup)
        return SCHEMA("tensors", "duplicate tensor '%s'", dup);
    return MC_OK;
}

static mc_status check_manifest(fmt_art *a, mc_error *err)
{
    /* The strict loader tells an allocation that failed inside jansson's
     * lexer (reported by jansson as a syntax error) from damaged text. */
    mc_status st = fmt_json_load_strict(a->manifest_text, a->manifest_bytes,
                                        a->name, FMT_ART_HEADER_BYTES,
                                        &a->manifest, err);
    if (st != MC_OK) {
        if (err && st == MC_ERR_FORMAT && !err->field[0])
            snprintf(err->field, sizeof err->field, "manifest");
        return st;
    }
    const json_t *f = json_object_get(a->manifest, "format");
    if (!json_is_string(f) ||
        strcmp(json_string_value(f), "mcompile-artifact") != 0)
        return SCHEMA("format", "manifest format must be "
                      "\"mcompile-artifact\"");
    uint64_t v;
    if (!get_u64(a->manifest, "version", &v) || v != FMT_ART_VERSION)
        return SCHEMA("version", "manifest version must be %u",
                      FMT_ART_VERSION);
    static const char *const objs[] = {"config", "plan", "provenance"};
    for (size_t i = 0; i < 3; i++)
        if (!json_is_object(json_object_get(a->manifest, objs[i])))
            return SCHEMA(objs[i], "manifest needs an object \"%s\"", objs[i]);
    st = check_sections_schema(a, err);
    if (st != MC_OK)
        return st;
    /* "tokenizer" says whether the tokenizer section is there */
    const json_t *tk = json_object_get(a->manifest, "tokenizer");
    size_t ts = fmt_art_find_section(a, "tokenizer");
    int has = ts < a->nsections && strcmp(a->sections[ts].kind, "tokenizer") == 0;
    if (tk && (!json_is_boolean(tk) || json_is_true(tk) != has))
        return SCHEMA("tokenizer", "manifest \"tokenizer\" is %s, but the "
                      "artifact has %s section \"tokenizer\" of kind "
                      "\"tokenizer\"", json_is_true(tk) ? "true" : "not true",
                      has ? "a" : "no");
    return check_tensors_schema(a, err);
}

static mc_status open_common(fmt_art *a, mc_error *err)
{
    uint64_t align = 0;
    mc_status st = check_header(a, err, &align);
    if (st == MC_OK)
        st = check_table(a, align, err);
    if (st == MC_OK)
        st = check_manifest(a, err);
    return st;
}

mc_status fmt_art_open_memory(const void *data, size_t size, const char *name,
                              fmt_art **out, mc_error *err)
{
    *out = NULL;
    fmt_art *a = mc_calloc(1, sizeof *a);
    if (!a)
        return mc_fail(err, MC_ERR_NOMEM, name, NULL, -1, "out of memory");
    snprintf(a->name, sizeof a->name, "%s", name ? name : "<memory>");
    a->base = data;
    a->size = size;
    mc_status st = open_common(a, err);
    if (st != MC_OK) {
        fmt_art_close(a);
        return st;
    }
    *out = a;
    return MC_OK;
}

mc_status fmt_art_open(const char *path, fmt_art **out, mc_error *err)
{
    *out = NULL;
    int fd;
    struct stat st;
    mc_status ost = fmt_input_open(path, &fd, &st, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            close(fd);
            return mc_fail(err, MC_ERR_IO, path, NULL, -1, "mmap failed: %s",
                           strerror(errno));
        }
    }
    close(fd);
    /* watched from the start: the header checks read the mapping too */
    int slot = map ? fmt_mapguard_watch(map, len, path) : -1;
    static const uint8_t empty[1];
    fmt_art *a = NULL;
    mc_status s = fmt_art_open_memory(map ? map : empty, len, path, &a, err);
    if (s != MC_OK) {
        fmt_mapguard_unwatch(slot);
        if (map)
            munmap(map, len);
        return s;
    }
    a->map = map;
    a->map_len = len;
    a->map_slot = slot;
    *out = a;
    return MC_OK;
}

void fmt_art_close(fmt_art *a)
{
    if (!a)
        return;
    if (a->manifest)
        json_decref(a->manifest);
    mc_free(a->sections);
    mc_free(a->tensors);
    if (a->map) {
        fmt_mapguard_unwatch(a->map_slot);
        munmap(a->map, a->map_len);
    }
    mc_free(a);
}

uint64_t fmt_art_file_bytes(const fmt_art *a) { return a->size; }
const uint8_t *fmt_art_bytes(const fmt_art *a) { return a->base; }
const json_t *fmt_art_manifest(const fmt_art *a) { return a->manifest; }
const char *fmt_art_manifest_text(const fmt_art *a, size_t *len)
{
    if (len)
        *len = (size_t)a->manifest_bytes;
    return a->manifest_text;
}
size_t fmt_art_section_count(const fmt_art *a) { return a->nsections; }
const fmt_art_section *fmt_art_section_at(const fmt_art *a, size_t i)
{
    return i < a->nsections ? &a->sections[i] : NULL;
}
size_t fmt_art_find_section(const fmt_art *a, const char *name)
{
    for (size_t i = 0; i < a->nsections; i++)
        if (strcmp(a->sections[i].name, name) == 0)
            return i;
    return (size_t)-1;
}
size_t fmt_art_tensor_count(const fmt_art *a) { return a->ntensors; }
const fmt_art_tensor *fmt_art_tensor_at(const fmt_art *a, size_t i)
{
    return i < a->ntensors ? &a->tensors[i] : NULL;
}
const fmt_art_tensor *fmt_art_find_tensor(const fmt_art *a, const char *name)
{
    for (size_t i = 0; i < a->ntensors; i++)
        if (strcmp(a->tensors[i].name, name) == 0)
            return &a->tensors[i];
    return NULL;
}

/* ---- deep checks and reads ------------------------------------------------ */

mc_status fmt_art_verify_section(const fmt_art *a, size_t i, mc_error *err)
{
    const fmt_art_section *s = &a->sections[i];
    if (fmt_art_xxh3(s->stored, (size_t)s->stored_bytes) != s->stored_xxh3)
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                       (int64_t)s->offset, "section %zu ('%s') checksum "
                       "mismatch: its bytes are damaged", i, s->name);
    return MC_OK;
}

/* Stream-decompress section s into dst (dst_cap bytes at a time when sink
 * is set: the same scratch buffer reused, hashing as it goes). */
static mc_status zstd_stream(const fmt_art *a, size_t i, uint8_t *dst,
                             uint64_t dst_bytes, int scratch,
                             XXH3_state_t *hs, mc_error *err)
{
    const fmt_art_section *s = &a->sections[i];
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!dc)
        return mc_fail(err, MC_ERR_NOMEM, a->name, s->name, -1,
                       "out of memory");
    /* Bound the window a damaged frame can ask for (our writer uses far
     * less): 2^27 bytes. */
    ZSTD_DCtx_setParameter(dc, ZSTD_d_windowLogMax, 27);
    ZSTD_inBuffer in = {s->stored, (size_t)s->stored_bytes, 0};
    uint64_t produced = 0;
    size_t ret = 1;
    mc_status st = MC_OK;
    while (ret != 0) {
        ZSTD_outBuffer out;
        if (scratch) {
            out = (ZSTD_outBuffer){dst, (size_t)dst_bytes, 0};
        } else {
            uint64_t left = dst_bytes - produced;
            out = (ZSTD_outBuffer){dst + produced, (size_t)left, 0};
        }
        size_t in_before = in.pos;
        ret = ZSTD_decompressStream(dc, &out, &in);
        if (ZSTD_isError(ret)) {
            st = mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                         (int64_t)(s->offset + in.pos),
                         "section %zu ('%s'): zstd frame is damaged: %s", i,
                         s->name, ZSTD_getErrorName(ret));
            break;
        }
        if (hs)
            XXH3_64bits_update(hs, out.dst, out.pos);
        produced += out.pos;
        if (produced > s->raw_bytes ||
            (!scratch && ret != 0 && out.pos == 0 && in.pos == in_before)) {
            st = mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                         (int64_t)s->offset, "section %zu ('%s'): zstd frame "
                         "decompresses to more than the %llu bytes declared",
                         i, s->name, (unsigned long long)s->raw_bytes);
            break;
        }
        if (ret != 0 && in.pos == in.size && out.pos < out.size) {
            st = mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                         (int64_t)(s->offset + in.pos), "section %zu ('%s'): "
                         "zstd frame is truncated", i, s->name);
            break;
        }
    }
    if (st == MC_OK && (produced != s->raw_bytes || in.pos != in.size))
        st = mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                     (int64_t)s->offset, "section %zu ('%s'): zstd frame gives "
                     "%llu bytes, %llu declared%s", i, s->name,
                     (unsigned long long)produced,
                     (unsigned long long)s->raw_bytes,
                     in.pos != in.size ? " (trailing bytes)" : "");
    ZSTD_freeDCtx(dc);
    return st;
}

/* Padding (between the manifest, the sections and the table) must be zero:
 * it is covered by no checksum, so a flipped bit there is caught here. */
static mc_status check_padding(const fmt_art *a, uint64_t from, uint64_t to,
                               mc_error *err)
{
    for (uint64_t i = from; i < to; i++)
        if (a->base[i] != 0)
            return mc_fail(err, MC_ERR_CHECKSUM, a->name, "padding",
                           (int64_t)i, "non-zero padding byte (the file is "
                           "damaged)");
    return MC_OK;
}

mc_status fmt_art_verify(const fmt_art *a, size_t *bad, mc_error *err)
{
    uint64_t pos = FMT_ART_HEADER_BYTES + a->manifest_bytes;
    for (size_t i = 0; i <= a->nsections; i++) {
        uint64_t next = i < a->nsections ? a->sections[i].offset
                                         : a->table_offset;
        mc_status st = check_padding(a, pos, next, err);
        if (st != MC_OK) {
            if (bad)
                *bad = i;
            return st;
        }
        if (i < a->nsections)
            pos = a->sections[i].offset + a->sections[i].stored_bytes;
    }
    enum { SCRATCH = 1 << 17 };
    uint8_t *buf = NULL;
    XXH3_state_t *hs = NULL;
    for (size_t i = 0; i < a->nsections; i++) {
        const fmt_art_section *s = &a->sections[i];
        mc_status st = fmt_art_verify_section(a, i, err);
        if (st == MC_OK && s->codec == FMT_ART_CODEC_ZSTD) {
            if (!buf)
                buf = mc_malloc(SCRATCH);
            if (!hs)
                hs = XXH3_createState();
            if (!buf || !hs) {
                st = mc_fail(err, MC_ERR_NOMEM, a->name, NULL, -1,
                             "out of memory");
            } else {
                XXH3_64bits_reset(hs);
                st = zstd_stream(a, i, buf, SCRATCH, 1, hs, err);
                if (st == MC_OK && XXH3_64bits_digest(hs) != s->raw_xxh3)
                    st = mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                                 (int64_t)s->offset, "section %zu ('%s'): "
                                 "decompressed bytes fail their checksum", i,
                                 s->name);
            }
        }
        if (st != MC_OK) {
            if (bad)
                *bad = i;
            mc_free(buf);
            XXH3_freeState(hs);
            return st;
        }
    }
    mc_free(buf);
    XXH3_freeState(hs);
    return MC_OK;
}

mc_status fmt_art_section_read(const fmt_art *a, size_t i, void *dst,
                               uint64_t dst_bytes, int check, mc_error *err)
{
    if (i >= a->nsections)
        return mc_fail(err, MC_ERR_INVALID_ARG, a->name, NULL, -1,
                       "section %zu of %zu", i, a->nsections);
    const fmt_art_section *s = &a->sections[i];
    if (dst_bytes != s->raw_bytes)
        return mc_fail(err, MC_ERR_INVALID_ARG, a->name, s->name, -1,
                       "destination of %llu bytes for a %llu-byte section",
                       (unsigned long long)dst_bytes,
                       (unsigned long long)s->raw_bytes);
    if (s->codec == FMT_ART_CODEC_RAW) {
        if (s->raw_bytes)
            memcpy(dst, s->stored, (size_t)s->raw_bytes);
    } else {
        mc_status st = zstd_stream(a, i, dst, dst_bytes, 0, NULL, err);
        if (st != MC_OK)
            return st;
    }
    if (check && fmt_art_xxh3(dst, (size_t)dst_bytes) != s->raw_xxh3)
        return mc_fail(err, MC_ERR_CHECKSUM, a->name, s->name,
                       (int64_t)s->offset, "section %zu ('%s') checksum "
                       "mismatch after reading", i, s->name);
    return MC_OK;
}

mc_status fmt_art_file_xxh3(const char *path, uint64_t *out, mc_error *err)
{
    int fd;
    mc_status ost = fmt_input_open(path, &fd, NULL, err);
    if (ost != MC_OK)
        return ost;
    enum { BUF = 1 << 20 };
    uint8_t *buf = mc_malloc(BUF);
    XXH3_state_t *hs = XXH3_createState();
    mc_status st = MC_OK;
    if (!buf || !hs) {
        st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
        goto done;
    }
    XXH3_64bits_reset(hs);
    for (;;) {
        ssize_t r = read(fd, buf, BUF);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = mc_fail(err, MC_ERR_IO, path, NULL, -1, "read failed: %s",
                         strerror(errno));
            goto done;
        }
        if (r == 0)
            break;
        XXH3_64bits_update(hs, buf, (size_t)r);
    }
    *out = XXH3_64bits_digest(hs);
done:
    mc_free(buf);
    XXH3_freeState(hs);
    close(fd);
    return st;
}

int fmt_art_is_artifact(const char *path)
{
    /* Not fmt_input_open: a probe of a would-be output is no input.  Still
     * non-blocking, so a FIFO at the path cannot hang the probe. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    char m[8];
    ssize_t r = read(fd, m, 8);
    close(fd);
    return r == 8 && memcmp(m, FMT_ART_MAGIC, 8) == 0;
}

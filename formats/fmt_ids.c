/* fmt_ids.c - token-id files (see fmt_ids.h for the grammar). */
#include "fmt_ids.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_file.h"
#include "mc_alloc.h"
#include "mc_checked.h"

typedef struct ids_ctx {
    const uint8_t *s;    /* text */
    size_t len;          /* bytes */
    const char *name;    /* for messages */
    uint32_t vocab_size; /* 0: no range check */
    mc_error *err;
} ids_ctx;

static mc_status fail_at(const ids_ctx *c, size_t line, size_t line_start,
                         size_t pos, const char *what)
{
    char shown[16];
    if (pos >= c->len)
        snprintf(shown, sizeof shown, "end of file");
    else if (c->s[pos] >= 0x20 && c->s[pos] < 0x7F)
        snprintf(shown, sizeof shown, "'%c'", c->s[pos]);
    else
        snprintf(shown, sizeof shown, "byte 0x%02X", c->s[pos]);
    return mc_fail(c->err, MC_ERR_FORMAT, c->name, NULL, (int64_t)pos,
                   "line %zu, column %zu: %s (found %s)", line,
                   pos - line_start + 1, what, shown);
}

/* One pass.  With ids == NULL: validate and count.  Otherwise fill ids and
 * offsets (the text is known to be valid). */
static mc_status scan(const ids_ctx *c, int32_t *ids, size_t *offsets,
                      size_t *n_ids, size_t *n_seqs)
{
    size_t i = 0, line = 1, nid = 0, nseq = 0;
    const uint8_t *s = c->s;
    while (i < c->len) {
        size_t start = i;
        const uint8_t *nl = memchr(s + i, '\n', c->len - i);
        size_t end = nl ? (size_t)(nl - s) : c->len;
        if (end - start > FMT_IDS_MAX_LINE)
            return fail_at(c, line, start, start + FMT_IDS_MAX_LINE,
                           "line longer than 64 MiB");
        const uint8_t *z = memchr(s + start, '\0', end - start);
        if (z)
            return fail_at(c, line, start, (size_t)(z - s), "NUL byte in text");
        size_t stop = end;
        if (stop > start && s[stop - 1] == '\r')
            stop--;
        size_t k = start;
        while (k < stop && (s[k] == ' ' || s[k] == '\t'))
            k++;
        if (k < stop && s[k] != '#') {
            if (ids)
                offsets[nseq] = nid;
            while (k < stop) {
                if (s[k] < '0' || s[k] > '9')
                    return fail_at(c, line, start, k,
                                   "expected a decimal token id");
                uint64_t v = 0;
                size_t d0 = k;
                while (k < stop && s[k] >= '0' && s[k] <= '9') {
                    v = v * 10 + (uint64_t)(s[k] - '0');
                    if (v > INT32_MAX)
                        return fail_at(c, line, start, d0,
                                       "token id larger than 2147483647");
                    k++;
                }
                if (k < stop && s[k] != ' ' && s[k] != '\t')
                    return fail_at(c, line, start, k,
                                   "expected a space, tab or end of line "
                                   "after a token id");
                if (c->vocab_size && v >= c->vocab_size) {
                    char what[96];
                    snprintf(what, sizeof what,
                             "token id %llu is not below the vocabulary "
                             "size %u", (unsigned long long)v, c->vocab_size);
                    return fail_at(c, line, start, d0, what);
                }
                if (ids)
                    ids[nid] = (int32_t)v;
                if (!mc_add_size(nid, 1, &nid))
                    return fail_at(c, line, start, d0, "too many ids");
                while (k < stop && (s[k] == ' ' || s[k] == '\t'))
                    k++;
            }
            nseq++;
        }
        i = nl ? end + 1 : end;
        line++;
    }
    if (ids)
        offsets[nseq] = nid;
    *n_ids = nid;
    *n_seqs = nseq;
    return MC_OK;
}

mc_status fmt_ids_parse(const void *data, size_t len, const char *name,
                        uint32_t vocab_size, fmt_ids **out, mc_error *err)
{
    if (!out || (!data && len))
        return mc_fail(err, MC_ERR_INVALID_ARG, name, NULL, -1,
                       "fmt_ids_parse: NULL argument");
    *out = NULL;
    ids_ctx c = {data ? data : (const void *)"", len, name ? name : "<memory>",
                 vocab_size, err};
    size_t n_ids, n_seqs;
    mc_status r = scan(&c, NULL, NULL, &n_ids, &n_seqs);
    if (r)
        return r;
    if (n_seqs == 0)
        return mc_fail(err, MC_ERR_FORMAT, c.name, NULL, 0,
                       "contains no token ids (one sequence per line)");
    fmt_ids *f = mc_calloc(1, sizeof *f);
    size_t n_off;
    if (f && mc_add_size(n_seqs, 1, &n_off)) {
        f->ids = mc_malloc_array(n_ids, sizeof *f->ids);
        f->offsets = mc_malloc_array(n_off, sizeof *f->offsets);
    }
    if (!f || !f->ids || !f->offsets) {
        fmt_ids_free(f);
        return mc_fail(err, MC_ERR_NOMEM, c.name, NULL, -1,
                       "out of memory for %zu token ids", n_ids);
    }
    scan(&c, f->ids, f->offsets, &f->n_ids, &f->n_seqs);
    *out = f;
    return MC_OK;
}

mc_status fmt_ids_load(const char *path, uint32_t vocab_size, fmt_ids **out,
                       mc_error *err)
{
    if (!path || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "fmt_ids_load: NULL argument");
    *out = NULL;
    char *buf;
    size_t n;
    mc_status st = fmt_file_read(path, SIZE_MAX - 1, "the address space",
                                 &buf, &n, err);
    if (st != MC_OK)
        return st;
    mc_status r = fmt_ids_parse(buf, n, path, vocab_size, out, err);
    mc_free(buf);
    return r;
}

void fmt_ids_free(fmt_ids *f)
{
    if (!f)
        return;
    mc_free(f->ids);
    mc_free(f->offsets);
    mc_free(f);
}

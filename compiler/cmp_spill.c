/* cmp_spill.c - write-then-map temporary file (see cmp_spill.h). */
#include "cmp_spill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mc_alloc.h"

typedef struct spill_fix {
    void **slot;
    uint64_t off;
} spill_fix;

struct cmp_spill {
    int fd;
    char *dir;             /* for messages */
    uint64_t size;         /* bytes written, the last put's end */
    spill_fix *fix;
    size_t nfix, capfix;
    uint8_t *base;         /* the mapping, after cmp_spill_map */
    size_t map_len;
};

mc_status cmp_spill_create(const char *dir, cmp_spill **out, mc_error *err)
{
    *out = NULL;
    cmp_spill *s = mc_calloc(1, sizeof *s);
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "spill file");
    s->fd = -1;
    s->dir = mc_strdup(dir && *dir ? dir : ".");
    if (!s->dir) {
        cmp_spill_free(s);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "spill file");
    }
#ifdef O_TMPFILE
    s->fd = open(s->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (s->fd < 0) {
        /* no O_TMPFILE on this file system: a named file, unlinked at once */
        size_t n = strlen(s->dir) + 32;
        char *path = mc_malloc(n);
        if (!path) {
            cmp_spill_free(s);
            return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "spill file");
        }
        snprintf(path, n, "%s/.mcompile-spill-XXXXXX", s->dir);
        s->fd = mkostemp(path, O_CLOEXEC);
        if (s->fd >= 0)
            unlink(path);
        mc_free(path);
    }
    if (s->fd < 0) {
        int e = errno;
        mc_status st = mc_fail(err, MC_ERR_IO, s->dir, "spill file", -1,
                               "cannot create a temporary file in %s: %s",
                               s->dir, strerror(e));
        cmp_spill_free(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

mc_status cmp_spill_put(cmp_spill *s, void **slot, size_t bytes,
                        const char *what, mc_error *err)
{
    if (!*slot || bytes == 0)
        return MC_OK;
    if (s->base)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, what, -1,
                       "spill file already mapped");
    if (s->nfix == s->capfix) {
        size_t nc = s->capfix ? 2 * s->capfix : 64;
        spill_fix *f = mc_realloc(s->fix, nc * sizeof *f);
        if (!f)
            return mc_fail(err, MC_ERR_NOMEM, NULL, what, -1, "spill list");
        s->fix = f;
        s->capfix = nc;
    }
    uint64_t off = (s->size + 63) & ~(uint64_t)63;
    const uint8_t *p = *slot;
    size_t done = 0;
    while (done < bytes) {
        ssize_t w = pwrite(s->fd, p + done, bytes - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return mc_fail(err, MC_ERR_IO, s->dir, what, -1,
                           "writing %zu bytes of %s to the spill file in %s: %s",
                           bytes, what, s->dir, strerror(e));
        }
        done += (size_t)w;
    }
    s->fix[s->nfix].slot = slot;
    s->fix[s->nfix].off = off;
    s->nfix++;
    s->size = off + bytes;
    mc_free(*slot);
    *slot = NULL;
    return MC_OK;
}

mc_status cmp_spill_map(cmp_spill *s, mc_error *err)
{
    if (s->base || s->size == 0)
        return MC_OK;
    void *b = mmap(NULL, (size_t)s->size, PROT_READ, MAP_SHARED, s->fd, 0);
    if (b == MAP_FAILED) {
        int e = errno;
        return mc_fail(err, MC_ERR_IO, s->dir, "spill file", -1,
                       "cannot map the %llu-byte spill file: %s",
                       (unsigned long long)s->size, strerror(e));
    }
    s->base = b;
    s->map_len = (size_t)s->size;
    for (size_t i = 0; i < s->nfix; i++)
        *s->fix[i].slot = s->base + s->fix[i].off;
    return MC_OK;
}

int cmp_spill_owns(const cmp_spill *s, const void *p)
{
    const uint8_t *q = p;
    return s && s->base && q >= s->base && q < s->base + s->map_len;
}

uint64_t cmp_spill_bytes(const cmp_spill *s)
{
    return s ? s->size : 0;
}

void cmp_spill_free(cmp_spill *s)
{
    if (!s)
        return;
    if (s->base)
        munmap(s->base, s->map_len);
    if (s->fd >= 0)
        close(s->fd);
    mc_free(s->fix);
    mc_free(s->dir);
    mc_free(s);
}

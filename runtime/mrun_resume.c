/* mrun_resume.c - what --resume reads of an existing output (see
 * mrun_resume.h). */
#include "mrun_resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_jsonl.h"
#include "rt_plan.h"

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int mrun_resume_has(const mrun_resume *r, const char *id)
{
    return r->n &&
           bsearch(&id, r->ids, r->n, sizeof *r->ids, cmp_str) != NULL;
}

void mrun_resume_free(mrun_resume *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->ids[i]);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

uint64_t mrun_resume_bytes(const mrun_resume *r)
{
    uint64_t n = r->ids ? rt_plan_heap_chunk(r->cap * sizeof *r->ids) : 0;
    for (size_t i = 0; i < r->n; i++)
        n += rt_plan_heap_chunk(strlen(r->ids[i]) + 1);
    return n;
}

int mrun_resume_load(const char *path, int quiet, mrun_resume *r)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return 0; /* nothing to resume: a fresh run */
        fprintf(stderr, "mrun: --resume: cannot read %s: %s\n", path,
                strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t lcap = 0, cap = 0;
    ssize_t n;
    off_t good = 0;
    uint64_t k = 0;
    int rc = 0;
    while ((n = getline(&line, &lcap, f)) > 0) {
        if (line[n - 1] != '\n') {
            /* a partial last line, cut off below; with no whole line
             * before it, only if it can be the start of one of ours (a
             * file without a newline is not evidence that mrun wrote it) */
            static const char start[] = "{\"id\":";
            size_t m = (size_t)n < sizeof start - 1 ? (size_t)n : sizeof start - 1;
            /* a crash can also leave a zero-filled tail: nothing of value */
            size_t zeros = 0;
            while (zeros < (size_t)n && line[zeros] == '\0')
                zeros++;
            if (k == 0 && zeros < (size_t)n && memcmp(line, start, m) != 0) {
                fprintf(stderr,
                        "mrun: --resume: %s holds no whole line and does not "
                        "start as mrun's lines do ({\"id\":...); not "
                        "resuming into a file mrun did not write\n", path);
                rc = 1;
            }
            break;
        }
        k++;
        char *id = NULL;
        int failed = 0;
        mc_error e;
        mc_error_clear(&e);
        if (rt_jsonl_output_id(line, (size_t)n - 1, &id, &failed, &e) !=
            MC_OK) {
            fprintf(stderr,
                    "mrun: --resume: %s line %llu: %s; not resuming into "
                    "a file mrun did not write\n",
                    path, (unsigned long long)k, e.message);
            rc = 1;
            break;
        }
        if (r->n == cap) {
            cap = cap ? 2 * cap : 1024;
            char **p = realloc(r->ids, cap * sizeof *p);
            if (!p) {
                free(id);
                fprintf(stderr, "mrun: out of memory\n");
                rc = 1;
                break;
            }
            r->ids = p;
            r->cap = cap;
        }
        r->ids[r->n++] = id;
        r->failed += (uint64_t)failed;
        good += n;
    }
    free(line);
    fclose(f);
    if (rc)
        return rc;
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size > good) {
        if (truncate(path, good) != 0) {
            fprintf(stderr, "mrun: --resume: cannot cut the partial last "
                    "line of %s: %s\n", path, strerror(errno));
            return 1;
        }
        if (!quiet)
            fprintf(stderr, "mrun: --resume: dropped a partial last line "
                    "(%lld bytes) of %s\n",
                    (long long)(st.st_size - good), path);
    }
    if (r->n) /* an empty output: skip is NULL, and qsort(NULL) is UB */
        qsort(r->ids, r->n, sizeof *r->ids, cmp_str);
    if (!quiet)
        fprintf(stderr, "mrun: --resume: %zu lines already in %s\n",
                r->n, path);
    return 0;
}

uint64_t mrun_count_lines(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char buf[1 << 16];
    size_t r;
    uint64_t n = 0;
    int last = '\n';
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < r; i++)
            n += buf[i] == '\n';
        last = buf[r - 1];
    }
    fclose(f);
    return n + (last != '\n');
}

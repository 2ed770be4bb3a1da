/* invalid_cases.c - enumerate tests/invalid/<group>/<case>/ folders. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "invalid_cases.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the entries of dir (no dot files); NULL if no dir. */
static char **list_dir(const char *dir, size_t *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    size_t cap = 16;
    char **names = malloc(cap * sizeof *names);
    assert_non_null(names);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap *= 2;
            names = realloc(names, cap * sizeof *names);
            assert_non_null(names);
        }
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, *n, sizeof *names, cmp_names);
    return names;
}

static void free_list(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

int tu_for_each_invalid_case(const char *group,
                             void (*check)(const char *case_dir,
                                           const char *expect, void *ctx),
                             void *ctx)
{
    char *root = tu_fmt("%s/tests/invalid/%s", MC_SOURCE_DIR, group);
    size_t n;
    char **names = list_dir(root, &n);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        char *dir = tu_fmt("%s/%s", root, names[i]);
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            free(dir);
            continue;
        }
        char *ep = tu_fmt("%s/expect", dir);
        char *expect = tu_read_file(ep, NULL);
        if (!expect)
            fail_msg("invalid case %s/%s has no expect file", group, names[i]);
        expect[strcspn(expect, "\n")] = '\0';
        size_t len = strlen(expect);
        while (len > 0 && (expect[len - 1] == ' ' || expect[len - 1] == '\r' ||
                           expect[len - 1] == '\t'))
            expect[--len] = '\0';
        printf("[ CASE     ] %s/%s\n", group, names[i]);
        fflush(stdout);
        check(dir, expect, ctx);
        count++;
        free(expect);
        free(ep);
        free(dir);
    }
    free_list(names, n);
    free(root);
    return count;
}

char *tu_case_file(const char *case_dir, const char *suffix)
{
    size_t n, sl = strlen(suffix);
    char **names = list_dir(case_dir, &n);
    char *path = NULL;
    for (size_t i = 0; i < n && !path; i++) {
        size_t len = strlen(names[i]);
        if (len >= sl && strcmp(names[i] + len - sl, suffix) == 0)
            path = tu_fmt("%s/%s", case_dir, names[i]);
    }
    free_list(names, n);
    return path;
}

void tu_assert_case_error(const char *case_dir, const char *expect,
                          const char *msg)
{
    if (!strstr(msg, expect))
        fail_msg("error \"%s\"\n  does not contain \"%s\"", msg, expect);
    if (strstr(msg, case_dir))
        return;
    size_t n;
    char **names = list_dir(case_dir, &n);
    int named = 0;
    for (size_t i = 0; i < n && !named; i++)
        named = strcmp(names[i], "expect") != 0 && strstr(msg, names[i]) != NULL;
    free_list(names, n);
    if (!named)
        fail_msg("error \"%s\"\n  names no file of %s", msg, case_dir);
}

char *tu_read_binary(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
            assert_non_null(buf);
        }
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* test_readme.c - every command the README documents runs as written.
 *
 * Extracts the commands of the ```sh blocks of README.md (a line ending in
 * '\' continues on the next; '#' comment lines and blank lines are
 * skipped), points them at this build (a word starting with "build/" ->
 * MC_BIN_DIR, one starting with "/tmp/" -> a private temp dir, so parallel
 * runs do not collide) and runs them in order from MC_SOURCE_DIR, each of
 * which must exit 0.  Not run: scripts/demo, scripts/test and scripts/bench
 * (they build and run everything themselves), and commands that use
 * ../shared when it is absent or under sanitizers (MC_UNDER_SANITIZER set:
 * calibration takes minutes there), said so on stdout. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct cmds {
    char **v;
    size_t n, cap;
} cmds;

static void cmds_add(cmds *c, const char *s, size_t n)
{
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    while (n && isspace((unsigned char)*s))
        s++, n--;
    if (!n || *s == '#')
        return;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->v = realloc(c->v, c->cap * sizeof *c->v);
        assert_non_null(c->v);
    }
    c->v[c->n] = strndup(s, n);
    assert_non_null(c->v[c->n]);
    c->n++;
}

static void cmds_free(cmds *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->v[i]);
    free(c->v);
    memset(c, 0, sizeof *c);
}

/* The commands of the ```sh blocks of markdown text md. */
static void extract(const char *md, cmds *out)
{
    memset(out, 0, sizeof *out);
    int in_block = 0, in_sh = 0;
    char *cur = NULL; /* a command being joined over '\' lines */
    size_t cur_len = 0;
    for (const char *l = md; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (n >= 3 && !strncmp(l, "```", 3)) {
            if (!in_block) {
                /* opening fence: the info string says the language */
                size_t k = n - 3;
                const char *lang = l + 3;
                in_sh = (k == 2 && !strncmp(lang, "sh", 2)) ||
                        (k == 4 && !strncmp(lang, "bash", 4));
            } else {
                in_sh = 0;
            }
            in_block = !in_block;
            if (cur) { /* a block ending inside a continuation */
                cmds_add(out, cur, cur_len);
                free(cur);
                cur = NULL;
                cur_len = 0;
            }
        } else if (in_sh) {
            int cont = n > 0 && l[n - 1] == '\\';
            size_t k = cont ? n - 1 : n;
            cur = realloc(cur, cur_len + k + 2);
            assert_non_null(cur);
            memcpy(cur + cur_len, l, k);
            cur_len += k;
            cur[cur_len++] = ' ';
            cur[cur_len] = '\0';
            if (!cont) {
                cmds_add(out, cur, cur_len);
                free(cur);
                cur = NULL;
                cur_len = 0;
            }
        }
        l = e ? e + 1 : l + n;
    }
    free(cur);
}

/* cmd with every word-initial `from` replaced by `to` (malloc'ed). */
static char *replace_words(const char *cmd, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to), n = strlen(cmd);
    char *r = malloc(n * (tl + 1) + 1);
    assert_non_null(r);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int start = i == 0 || isspace((unsigned char)cmd[i - 1]) ||
                    cmd[i - 1] == '=' || cmd[i - 1] == '\'' ||
                    cmd[i - 1] == '"';
        if (start && !strncmp(cmd + i, from, fl)) {
            memcpy(r + k, to, tl);
            k += tl;
            i += fl;
        } else {
            r[k++] = cmd[i++];
        }
    }
    r[k] = '\0';
    return r;
}

static int starts_with_word(const char *cmd, const char *w)
{
    size_t n = strlen(w);
    return !strncmp(cmd, w, n) &&
           (cmd[n] == '\0' || isspace((unsigned char)cmd[n]));
}

static void test_readme_extraction_joins_continuations(void **state)
{
    (void)state;
    const char *md = "text\n```sh\n# comment\nbuild/mcompile a \\\n    --b c"
                     "\n\nbuild/mrun x\n```\n```json\n{\"no\": 1}\n```\n"
                     "```sh\nscripts/demo   # note\n```\n";
    cmds c;
    extract(md, &c);
    assert_int_equal(c.n, 3);
    assert_string_equal(c.v[0], "build/mcompile a      --b c");
    assert_string_equal(c.v[1], "build/mrun x");
    assert_string_equal(c.v[2], "scripts/demo   # note");
    char *r = replace_words("build/mcompile build/fixtures/x -o /tmp/a "
                            "--x=build/y rebuild/z", "build/", "B/");
    assert_string_equal(r, "B/mcompile B/fixtures/x -o /tmp/a --x=B/y "
                           "rebuild/z");
    free(r);
    cmds_free(&c);
}

static void test_readme_commands_run_as_written(void **state)
{
    (void)state;
    char *path = tu_fmt("%s/README.md", MC_SOURCE_DIR);
    char *md = tu_read_file(path, NULL);
    free(path);
    assert_non_null(md);
    cmds c;
    extract(md, &c);
    free(md);
    assert_true(c.n >= 8); /* the tour has been found */
    char *tmp = tu_mkdtemp("readme");
    char *bin = tu_fmt("%s/", MC_BIN_DIR);
    char *tmpslash = tu_fmt("%s/", tmp);
    int have_shared = tu_stories_dir() != NULL;
    const char *san = getenv("MC_UNDER_SANITIZER");
    int under_san = san && *san && strcmp(san, "0") != 0;
    size_t ran = 0, failed = 0;
    for (size_t i = 0; i < c.n; i++) {
        const char *cmd = c.v[i];
        if (starts_with_word(cmd, "scripts/demo") ||
            starts_with_word(cmd, "scripts/test") ||
            starts_with_word(cmd, "scripts/bench")) {
            printf("[  SKIP    ] %s (runs the whole build itself)\n", cmd);
            continue;
        }
        if (!have_shared && strstr(cmd, "../shared")) {
            printf("[  SKIP    ] %s (../shared is absent)\n", cmd);
            continue;
        }
        /* Calibrating stories260k takes ~20 s normally but minutes under
         * ASan; the normal build runs these commands. */
        if (under_san && strstr(cmd, "../shared")) {
            printf("[  SKIP    ] %s (too slow under sanitizers; the normal "
                   "build runs it)\n", cmd);
            continue;
        }
        /* /tmp/ first: MC_BIN_DIR may itself live under /tmp (a CI clone),
         * and its path must not be rewritten. */
        char *a = replace_words(cmd, "/tmp/", tmpslash);
        char *b = replace_words(a, "build/", bin);
        char *full = tu_fmt("cd '%s' && %s", MC_SOURCE_DIR, b);
        char *out = NULL, *err = NULL;
        int rc = tu_run(full, &out, &err);
        ran++;
        if (rc != 0) {
            failed++;
            printf("[  FAILED  ] README command %zu exited %d:\n  %s\n"
                   "  (ran: %s)\nstdout:\n%s\nstderr:\n%s\n", i + 1, rc, cmd,
                   b, out ? out : "", err ? err : "");
        } else {
            printf("[       OK ] %s\n", cmd);
        }
        free(out);
        free(err);
        free(full);
        free(b);
        free(a);
    }
    tu_rmtree(tmp);
    free(tmp);
    free(tmpslash);
    free(bin);
    cmds_free(&c);
    assert_true(ran > 0);
    if (failed)
        fail_msg("%zu of %zu README commands failed (see above)", failed, ran);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_extraction_joins_continuations),
        cmocka_unit_test(test_readme_commands_run_as_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

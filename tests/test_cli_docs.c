/* test_cli_docs.c - the CLI reference (docs/cli.md) and the man pages
 * (docs/man/mcompile.1, mrun.1) say what the programs' --help says:
 * scripts/gen-cli-docs regenerates them into a temp dir from the built programs and the
 * checked-in files must be identical.  On a difference, run
 *   scripts/gen-cli-docs build
 * and commit the result. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static char *g_out; /* the regenerated docs dir */

static int setup(void **state)
{
    (void)state;
    g_out = tu_mkdtemp("clidocs");
    char *cmd = tu_fmt("'%s/scripts/gen-cli-docs' '%s' '%s'", MC_SOURCE_DIR,
                       MC_BIN_DIR, g_out);
    char *err = NULL;
    int rc = tu_run(cmd, NULL, &err);
    if (rc != 0)
        fprintf(stderr, "%s: exit %d\n%s\n", cmd, rc, err ? err : "");
    free(cmd);
    free(err);
    return rc == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_out);
    free(g_out);
    return 0;
}

/* Fail, showing the diff, when the checked-in file differs. */
static void assert_in_sync(const char *rel)
{
    char *fresh = tu_fmt("%s/%s", g_out, rel);
    char *kept = tu_fmt("%s/docs/%s", MC_SOURCE_DIR, rel);
    assert_true(tu_exists(fresh));
    if (!tu_exists(kept))
        fail_msg("docs/%s is missing: run scripts/gen-cli-docs build", rel);
    char *cmd = tu_fmt("diff -u '%s' '%s'", kept, fresh);
    char *out = NULL;
    int rc = tu_run(cmd, &out, NULL);
    if (rc != 0) {
        printf("%s", out ? out : "");
        fail_msg("docs/%s is out of date with the programs' --help (diff "
                 "above); run scripts/gen-cli-docs build", rel);
    }
    free(out);
    free(cmd);
    free(kept);
    free(fresh);
}

static void test_cli_md_matches_programs_help(void **state)
{
    (void)state;
    assert_in_sync("cli.md");
}

static void test_man_pages_match_programs_help(void **state)
{
    (void)state;
    assert_in_sync("man/mcompile.1");
    assert_in_sync("man/mrun.1");
}

static void test_cli_md_holds_every_option_of_mrun_help(void **state)
{
    (void)state;
    /* The generator copies the help text whole: each option line of
     * `mrun --help` appears verbatim in cli.md. */
    char *help = NULL;
    char *cmd = tu_fmt("'%s/mrun' --help", MC_BIN_DIR);
    assert_int_equal(tu_run(cmd, &help, NULL), 0);
    char *mdpath = tu_fmt("%s/cli.md", g_out);
    char *md = tu_read_file(mdpath, NULL);
    free(mdpath);
    assert_non_null(md);
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(help, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save), lines++)
        if (!strstr(md, l))
            fail_msg("cli.md lacks the help line: %s", l);
    assert_true(lines > 10);
    free(md);
    free(help);
    free(cmd);
}

static void test_man_pages_render_without_warnings(void **state)
{
    (void)state;
    TU_SKIP_IF(tu_run("command -v groff >/dev/null", NULL, NULL) != 0,
               "groff is not installed");
    const char *pages[] = {"man/mcompile.1", "man/mrun.1"};
    for (size_t i = 0; i < 2; i++) {
        char *cmd = tu_fmt("groff -man -ww -z '%s/%s'", g_out, pages[i]);
        char *err = NULL;
        int rc = tu_run(cmd, NULL, &err);
        if (rc != 0 || (err && *err))
            fail_msg("%s: exit %d: %s", cmd, rc, err ? err : "");
        free(err);
        free(cmd);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_md_matches_programs_help),
        cmocka_unit_test(test_man_pages_match_programs_help),
        cmocka_unit_test(test_cli_md_holds_every_option_of_mrun_help),
        cmocka_unit_test(test_man_pages_render_without_warnings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_install.c - `cmake --install` gives a usable installation: the two
 * programs, the static libraries, the public header, mcompile.pc and the
 * man pages, and a small C program builds against them with
 * `pkg-config --cflags --libs mcompile` and runs a fixture model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* The embedder's program: open a model, generate 4 tokens, print them. */
static const char *g_app =
    "#include <stdio.h>\n"
    "#include <mcrt.h>\n"
    "int main(int argc, char **argv)\n"
    "{\n"
    "    if (argc < 2) return 2;\n"
    "    mcrt *h;\n"
    "    if (mcrt_open(argv[1], NULL, &h) != 0) {\n"
    "        fprintf(stderr, \"%s\\n\", mcrt_last_error(NULL));\n"
    "        return 1;\n"
    "    }\n"
    "    int32_t prompt[3] = {1, 2, 3}, out[4];\n"
    "    const int32_t *p[1] = {prompt};\n"
    "    size_t n[1] = {3};\n"
    "    mcrt_gen_params gp;\n"
    "    mcrt_gen_params_default(&gp);\n"
    "    gp.max_new_tokens = 4;\n"
    "    gp.use_model_eos = 0;\n"
    "    mcrt_result r = {.ids = out};\n"
    "    int rc = mcrt_generate(h, p, n, 1, &gp, &r);\n"
    "    if (rc == 0)\n"
    "        printf(\"generated %zu\\n\", r.n_ids);\n"
    "    mcrt_close(h);\n"
    "    return rc != 0;\n"
    "}\n";

typedef struct inst {
    char *root;    /* temp dir holding prefix/ and the app */
    char *prefix;  /* the install prefix */
    char *pcdir;   /* prefix/<libdir>/pkgconfig */
} inst;

static int setup(void **state)
{
    inst *in = calloc(1, sizeof *in);
    in->root = tu_mkdtemp("install");
    in->prefix = tu_fmt("%s/prefix", in->root);
    char *cmd = tu_fmt("cmake --install '%s' --prefix '%s'", MC_BIN_DIR,
                       in->prefix);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fprintf(stderr, "%s\nstdout:\n%s\nstderr:\n%s\n", cmd, out, err);
    free(cmd);
    free(out);
    free(err);
    if (rc != 0)
        return -1;
    /* libdir is lib or lib64 or lib/<multiarch> by GNUInstallDirs */
    char *find = tu_fmt("find '%s' -name mcompile.pc", in->prefix);
    rc = tu_run(find, &out, NULL);
    free(find);
    if (rc != 0 || !out || !strstr(out, "/pkgconfig/mcompile.pc")) {
        free(out);
        return -1;
    }
    *strstr(out, "/mcompile.pc") = '\0';
    in->pcdir = out;
    *state = in;
    return 0;
}

static int teardown(void **state)
{
    inst *in = *state;
    if (in) {
        tu_rmtree(in->root);
        free(in->root);
        free(in->prefix);
        free(in->pcdir);
        free(in);
    }
    return 0;
}

static void assert_installed(const inst *in, const char *rel)
{
    char *p = tu_fmt("%s/%s", in->prefix, rel);
    if (!tu_exists(p))
        fail_msg("not installed: %s", p);
    free(p);
}

static void test_install_puts_programs_header_libs_and_man_pages(void **state)
{
    inst *in = *state;
    assert_installed(in, "bin/mcompile");
    assert_installed(in, "bin/mrun");
    assert_installed(in, "include/mcompile/mcrt.h");
    assert_installed(in, "share/man/man1/mcompile.1");
    assert_installed(in, "share/man/man1/mrun.1");
    const char *libs[] = {"libmc_runtime.a", "libmc_kernels.a",
                          "libmc_formats.a", "libmc_compiler.a"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        char *p = tu_fmt("%s/../%s", in->pcdir, libs[i]);
        if (!tu_exists(p))
            fail_msg("not installed: %s", p);
        free(p);
    }
    /* the installed program runs */
    char *cmd = tu_fmt("'%s/bin/mcompile' --version", in->prefix);
    char *out = NULL;
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_non_null(strstr(out, "mcompile"));
    free(out);
    free(cmd);
}

static void test_install_pkg_config_gives_flags(void **state)
{
    inst *in = *state;
    char *cmd = tu_fmt("PKG_CONFIG_PATH='%s' pkg-config --cflags --libs "
                       "mcompile", in->pcdir);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, err);
    assert_non_null(strstr(out, "-lmc_runtime"));
    assert_non_null(strstr(out, "/include/mcompile"));
    free(out);
    free(err);
    free(cmd);
    cmd = tu_fmt("PKG_CONFIG_PATH='%s' pkg-config --modversion mcompile",
                 in->pcdir);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_memory_equal(out, MC_VERSION, strlen(MC_VERSION));
    free(out);
    free(cmd);
}

static void test_install_small_program_builds_and_runs(void **state)
{
    inst *in = *state;
    char *src = tu_fmt("%s/app.c", in->root);
    assert_int_equal(tu_write_file(src, g_app, strlen(g_app)), 0);
#ifdef MC_SANITIZE
    /* the installed libraries are instrumented: link the runtime too */
    const char *san = "-fsanitize=address,undefined";
#else
    const char *san = "";
#endif
    char *cmd = tu_fmt("cd '%s' && PKG_CONFIG_PATH='%s' gcc -std=c11 -Wall "
                       "-Werror %s -o app app.c $(PKG_CONFIG_PATH='%s' "
                       "pkg-config --cflags --libs mcompile)",
                       in->root, in->pcdir, san, in->pcdir);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("%s: exit %d:\n%s", cmd, rc, err);
    free(out);
    free(err);
    free(cmd);
    cmd = tu_fmt("'%s/app' '%s/llama'", in->root, MC_FIXTURE_DIR);
    rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("%s: exit %d:\n%s", cmd, rc, err);
    assert_non_null(strstr(out, "generated 4"));
    free(out);
    free(err);
    free(cmd);
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_install_puts_programs_header_libs_and_man_pages),
        cmocka_unit_test(test_install_pkg_config_gives_flags),
        cmocka_unit_test(test_install_small_program_builds_and_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

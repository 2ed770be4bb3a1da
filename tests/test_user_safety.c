/* test_user_safety.c - the real mcompile and mrun binaries never destroy
 * what is not theirs and never hang or crash on hostile files or options.
 * One test per class of defect (docs/reliability.md, "User data"):
 *   - an output path never replaces an input of the run (also through a
 *     symlink) nor a directory mcompile did not write;
 *   - a FIFO given as any kind of input fails at once (each command runs
 *     under `timeout`, so a hang fails the test instead of blocking it);
 *   - a FIFO or a device is never replaced as an output;
 *   - an input truncated while mapped gives exit 1, a message naming it and
 *     no temporary (the I/O shim truncates it right after mmap);
 *   - NaN, Inf, hex and trailing junk in numeric options are usage errors;
 *   - a manifest whose plan figures disagree with the artifact is refused;
 *   - `mcompile .` names its output after the directory.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "fmt_artifact.h"
#include "fmt_safetensors.h"
#include "testutil.h"

#ifndef MC_IO_SHIM
#define MC_IO_SHIM ""
#endif

#define FX MC_FIXTURE_DIR
#define TIMEOUT "timeout -k 5 60 " /* generous for ASan; a hang is 124 */

static char *g_out, *g_err;

/* Run a command line (printf-style) under TIMEOUT, in directory dir
 * (NULL: here); its exit status, stdout in g_out and stderr in g_err. */
static int vrun_in(const char *dir, const char *fmt, va_list ap)
{
    char args[8192];
    vsnprintf(args, sizeof args, fmt, ap);
    free(g_out);
    free(g_err);
    char *cmd = dir ? tu_fmt("cd '%s' && " TIMEOUT "%s", dir, args)
                    : tu_fmt(TIMEOUT "%s", args);
    int rc = tu_run(cmd, &g_out, &g_err);
    free(cmd);
    return rc;
}

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vrun_in(NULL, fmt, ap);
    va_end(ap);
    return rc;
}

static int run_in(const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int run_in(const char *dir, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vrun_in(dir, fmt, ap);
    va_end(ap);
    return rc;
}

/* Expect exit status rc and every needle in stderr. */
static void expect(int got, int rc, const char *what, const char *n1,
                   const char *n2)
{
    if (got != rc || (n1 && !strstr(g_err, n1)) || (n2 && !strstr(g_err, n2)))
        fail_msg("%s: exit %d (want %d), stderr: %s", what, got, rc, g_err);
}

static int is_fifo(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0 && S_ISFIFO(st.st_mode);
}

/* 1 if a ".mctmp-" temporary is in dir. */
static int has_temp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL)
        found |= strstr(e->d_name, ".mctmp-") != NULL;
    closedir(d);
    return found;
}

static void copy_dir(const char *src, const char *dst)
{
    char *cmd = tu_fmt("cp -r '%s' '%s'", src, dst);
    assert_int_equal(system(cmd), 0);
    free(cmd);
}

static void test_outputs_never_replace_inputs_or_foreign_data(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-out");
    char *m = tu_fmt("%s/m", d), *cfg = tu_fmt("%s/m/config.json", d);
    char *w = tu_fmt("%s/m/model.safetensors", d);
    copy_dir(FX "/llama", m);
    size_t cfg_len, w_len;
    char *cfg0 = tu_read_file(cfg, &cfg_len), *w0 = tu_read_file(w, &w_len);
    char *lcfg = tu_fmt("%s/cfg-link", d), *lw = tu_fmt("%s/w-link", d);
    assert_int_equal(symlink(cfg, lcfg), 0);
    assert_int_equal(symlink(w, lw), 0);
    /* file outputs over an input, directly and through a symlink */
    expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m,
               cfg), 1, "plan --svg config.json", "input of this run", NULL);
    expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m,
               lcfg), 1, "plan --svg link", "symbolic link", NULL);
    expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 --metrics %s",
               MC_BIN_DIR, m, lw), 1, "mrun --metrics link", "symbolic link",
           NULL);
    expect(run("%s/mcompile %s --target 64MiB -o %s", MC_BIN_DIR, m, lw), 1,
           "compile -o link", "refusing", NULL);
    /* a directory mcompile did not write, holding the user's file */
    char *user = tu_fmt("%s/user", d), *notes = tu_fmt("%s/user/notes", d);
    assert_int_equal(mkdir(user, 0777), 0);
    assert_int_equal(tu_write_file(notes, "mine", 4), 0);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o %s",
               MC_BIN_DIR, m, user), 1, "merge -o user dir",
           ".mcompile-output", "nothing was written");
    char *n1 = tu_read_file(notes, NULL);
    assert_string_equal(n1, "mine");
    free(n1);
    /* our own output is replaced; then used as an input it is not */
    char *out = tu_fmt("%s/out", d);
    for (int i = 0; i < 2; i++)
        expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain "
                   "-o %s -q", MC_BIN_DIR, m, out), 0, "merge -o own output",
               NULL, NULL);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o %s",
               MC_BIN_DIR, out, out), 1, "merge -o its input", "input", NULL);
    /* a file the user put into our output makes it theirs: kept */
    char *mine = tu_fmt("%s/out/my-notes.txt", d);
    assert_int_equal(tu_write_file(mine, "keep", 4), 0);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o %s",
               MC_BIN_DIR, m, out), 1, "merge -o own output + user file",
           "my-notes.txt", "did not write");
    assert_true(tu_file_is(mine, "keep", 4));
    assert_int_equal(unlink(mine), 0);
    free(mine);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o %s "
               "-q", MC_BIN_DIR, m, out), 0, "merge -o own output again", NULL,
           NULL);
    /* a regular file that is no input but not metrics is kept; an empty
     * one, and then the metrics written into it, are replaced */
    char *prom = tu_fmt("%s/metrics.prom", d);
    assert_int_equal(tu_write_file(prom, "old", 3), 0);
    expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 -q --metrics %s",
               MC_BIN_DIR, m, prom), 1, "mrun --metrics user file",
           "not a metrics file mrun wrote", NULL);
    assert_true(tu_file_is(prom, "old", 3));
    assert_int_equal(tu_write_file(prom, "", 0), 0);
    for (int i = 0; i < 2; i++)
        expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 -q --metrics %s",
                   MC_BIN_DIR, m, prom), 0, "mrun --metrics own file", NULL,
               NULL);
    char *p1 = tu_read_file(prom, NULL);
    assert_non_null(strstr(p1, "mcompile_"));
    free(p1);
    /* the inputs are byte-identical, and no temporary is left anywhere */
    size_t l1, l2;
    char *cfg1 = tu_read_file(cfg, &l1), *w1 = tu_read_file(w, &l2);
    assert_true(l1 == cfg_len && memcmp(cfg0, cfg1, l1) == 0);
    assert_true(l2 == w_len && memcmp(w0, w1, l2) == 0);
    assert_false(has_temp(d));
    assert_false(has_temp(m));
    free(cfg0), free(cfg1), free(w0), free(w1);
    free(prom), free(out), free(user), free(notes), free(lcfg), free(lw);
    free(cfg), free(w), free(m);
    tu_rmtree(d);
    free(d);
}

/* Outputs with a recognisable form replace only an earlier one of their
 * own kind: plan --svg never replaces the weights beside config.json (plan
 * does not open them) or a user's file; export --format gguf replaces an
 * earlier export, not a user's file or artifact; a symbolic link (live
 * or dangling, /dev/stdout's kind) and "-" are refused as outputs; mrun's
 * --output and --metrics are the same file under another spelling. */
static void test_outputs_replace_only_their_own_kind(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-own");
    char *m = tu_fmt("%s/m", d), *w = tu_fmt("%s/m/model.safetensors", d);
    copy_dir(FX "/llama", m);
    size_t w_len;
    char *w0 = tu_read_file(w, &w_len);
    char *notes = tu_fmt("%s/notes.txt", d), *art = tu_fmt("%s/a.mca", d);
    char *user_art = tu_fmt("%s/user.mca", d);
    assert_int_equal(tu_write_file(notes, "my notes", 8), 0);
    expect(run("%s/mcompile %s --target 64MiB -q -o %s", MC_BIN_DIR, m, art),
           0, "compile", NULL, NULL);
    expect(run("%s/mcompile %s --target 64MiB -q -o %s", MC_BIN_DIR, m,
               user_art), 0, "compile", NULL, NULL);
    size_t ua_len;
    char *ua0 = tu_read_file(user_art, &ua_len);

    expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m, w),
           1, "plan --svg weights", "not a plan picture mcompile wrote", NULL);
    expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m,
               notes), 1, "plan --svg notes", "not a plan picture", NULL);
    char *svg = tu_fmt("%s/plan.svg", d);
    for (int i = 0; i < 2; i++)
        expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m,
                   svg), 0, "plan --svg own picture", NULL, NULL);

    expect(run("%s/mcompile export %s --format gguf -o %s", MC_BIN_DIR, art,
               notes), 1, "export gguf notes", "not a GGUF file mcompile", NULL);
    expect(run("%s/mcompile export %s --format gguf -o %s", MC_BIN_DIR, art,
               user_art), 1, "export gguf user artifact", "not a GGUF", NULL);
    char *gg = tu_fmt("%s/a.gguf", d);
    for (int i = 0; i < 2; i++)
        expect(run("%s/mcompile export %s --format gguf -o %s -q", MC_BIN_DIR,
                   art, gg), 0, "export gguf own file", NULL, NULL);

    /* links and "-" */
    char *live = tu_fmt("%s/live.gguf", d), *dang = tu_fmt("%s/dang", d);
    assert_int_equal(symlink(gg, live), 0);
    assert_int_equal(symlink("/nonexistent/target", dang), 0);
    expect(run("%s/mcompile export %s --format gguf -o %s", MC_BIN_DIR, art,
               live), 1, "export gguf link", "symbolic link", NULL);
    expect(run("%s/mcompile %s --target 64MiB -o %s", MC_BIN_DIR, m, dang), 1,
           "compile -o dangling link", "symbolic link", NULL);
    expect(run("%s/mcompile plan %s --target 1GiB --svg %s", MC_BIN_DIR, m,
               dang), 1, "plan --svg dangling link", "symbolic link", NULL);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o %s",
               MC_BIN_DIR, m, dang), 1, "merge -o dangling link",
           "symbolic link", NULL);
    char *ldir = tu_fmt("%s/ldir", d), *tdir = tu_fmt("%s/tdir", d);
    assert_int_equal(mkdir(tdir, 0777), 0);
    assert_int_equal(symlink(tdir, ldir), 0);
    expect(run("%s/mcompile merge %s --lora " FX "/adapters/llama-plain -o "
               "%s/", MC_BIN_DIR, m, ldir), 1, "merge -o link/",
           "symbolic link", NULL);
    free(ldir), free(tdir);
    expect(run_in(d, "%s/mcompile export %s --format gguf -o -", MC_BIN_DIR,
                  art), 1, "export -o -", "standard output", NULL);
    expect(run_in(d, "%s/mcompile %s --target 64MiB -o -", MC_BIN_DIR, m), 1,
           "compile -o -", "standard output", NULL);
    char *dash = tu_fmt("%s/-", d);
    assert_false(tu_exists(dash));
    free(dash);

    /* mrun: the same file under two spellings, one not yet existing */
    char *in = tu_fmt("%s/in.jsonl", d), *out = tu_fmt("%s/o.jsonl", d);
    char *out2 = tu_fmt("%s/../%s/o.jsonl", d, strrchr(d, '/') + 1);
    assert_int_equal(tu_write_file(in, "{\"ids\": [1, 2]}\n", 16), 0);
    expect(run("%s/mrun %s --input %s --output %s --metrics %s -q", MC_BIN_DIR,
               art, in, out, out2), 2, "mrun --output = --metrics",
           "same file", NULL);
    assert_false(tu_exists(out));
    expect(run("%s/mrun %s --input %s --output %s -q", MC_BIN_DIR, art, in,
               dang), 1, "mrun --output dangling link", "symbolic link", NULL);
    /* results are appended in place: a link to a file is written through
     * (a DVC / git-annex path), and stays a link */
    char *res = tu_fmt("%s/res.jsonl", d), *lres = tu_fmt("%s/lres.jsonl", d);
    assert_int_equal(tu_write_file(res, "", 0), 0);
    assert_int_equal(symlink(res, lres), 0);
    expect(run("%s/mrun %s --input %s --output %s -q", MC_BIN_DIR, art, in,
               lres), 0, "mrun --output link to a file", NULL, NULL);
    char *got = tu_read_file(res, NULL);
    assert_non_null(strstr(got, "\"id\":1"));
    free(got);
    struct stat ls;
    assert_int_equal(lstat(lres, &ls), 0);
    assert_true(S_ISLNK(ls.st_mode));
    free(res), free(lres);
    /* '-' is standard output, not a file called '-' */
    expect(run_in(d, "%s/mrun %s --input %s --output - --metrics ./- -q",
                  MC_BIN_DIR, art, in), 0, "mrun --output - --metrics ./-",
           NULL, NULL);

    /* nothing of the user's moved */
    assert_true(tu_file_is(notes, "my notes", 8));
    assert_true(tu_file_is(user_art, ua0, ua_len));
    assert_true(tu_file_is(w, w0, w_len));
    struct stat sl;
    assert_int_equal(lstat(live, &sl), 0);
    assert_true(S_ISLNK(sl.st_mode));
    assert_false(has_temp(d));
    free(w0), free(ua0), free(in), free(out), free(out2), free(live);
    free(dang), free(gg), free(svg), free(notes), free(art), free(user_art);
    free(m), free(w);
    tu_rmtree(d);
    free(d);
}

static void test_fifo_as_any_input_fails_promptly(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-fifo");
    char *fifo = tu_fmt("%s/fifo", d);
    assert_int_equal(mkfifo(fifo, 0666), 0);
    char *art = tu_fmt("%s/a.mca", d);
    expect(run("%s/mcompile " FX "/llama --target 64MiB -q -o %s", MC_BIN_DIR,
               art), 0, "compile", NULL, NULL);
    /* model directories and an adapter with one file replaced by a FIFO */
    /* why: what the message says (the FIFO named, wherever it is) */
    static const struct {
        const char *src, *file, *why;
    } swaps[] = {{"llama", "config.json", "FIFO"},
                 {"llama", "model.safetensors", "FIFO"},
                 {"llama", "tokenizer.json", "FIFO"}, /* optional; no FIFO */
                 {"llama-sharded", "model.safetensors.index.json", "FIFO"},
                 {"llama-sharded", "model-00002-of-00003.safetensors", "FIFO"},
                 {"adapters/llama-plain", "adapter_config.json", "FIFO"},
                 {"adapters/llama-plain", "adapter_model.safetensors", "FIFO"}};
    for (size_t i = 0; i < sizeof swaps / sizeof swaps[0]; i++) {
        char *src = tu_fmt(FX "/%s", swaps[i].src);
        char *dir = tu_fmt("%s/case%zu", d, i);
        copy_dir(src, dir);
        char *p = tu_fmt("%s/%s", dir, swaps[i].file);
        unlink(p);
        assert_int_equal(mkfifo(p, 0666), 0);
        int adapter = strstr(swaps[i].src, "adapters") != NULL;
        if (adapter) {
            expect(run("%s/mcompile merge " FX "/llama --lora %s -o %s/o%zu",
                       MC_BIN_DIR, dir, d, i), 1, p, swaps[i].why,
                   swaps[i].file);
            expect(run("%s/mcompile " FX "/llama --target 64MiB --lora %s -o "
                       "%s/o%zu.mca", MC_BIN_DIR, dir, d, i), 1, p,
                   swaps[i].why, NULL);
        } else {
            expect(run("%s/mcompile %s --target 64MiB -o %s/o%zu.mca",
                       MC_BIN_DIR, dir, d, i), 1, p, swaps[i].why,
                   swaps[i].file);
            if (strcmp(swaps[i].file, "tokenizer.json") != 0)
                expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1",
                           MC_BIN_DIR, dir), 1, p, swaps[i].why, NULL);
        }
        free(p);
        free(dir);
        free(src);
    }
    /* a FIFO named directly: index, artifact, model file, option files */
    expect(run("%s/mcompile %s/case3/model.safetensors.index.json --target "
               "64MiB -o %s/i.mca", MC_BIN_DIR, d, d), 1, "index named",
           "FIFO", NULL);
    expect(run("%s/mrun %s --tokens 1", MC_BIN_DIR, fifo), 1, "mrun FIFO",
           "FIFO", NULL);
    expect(run("%s/mcompile inspect %s", MC_BIN_DIR, fifo), 1, "inspect",
           "FIFO", NULL);
    expect(run("%s/mcompile eval %s --ref " FX "/llama --tokens %s",
               MC_BIN_DIR, fifo, fifo), 1, "eval artifact", "FIFO", NULL);
    expect(run("%s/mcompile eval %s --ref " FX "/llama --tokens %s",
               MC_BIN_DIR, art, fifo), 1, "eval --tokens", "FIFO", NULL);
    expect(run("%s/mcompile plan %s --target 1GiB", MC_BIN_DIR, fifo), 1,
           "plan config", NULL, NULL);
    expect(run("%s/mrun %s --tokens-file %s", MC_BIN_DIR, art, fifo), 1,
           "--tokens-file", "FIFO", NULL);
    expect(run("%s/mrun %s --prompts-file %s", MC_BIN_DIR, art, fifo), 1,
           "--prompts-file", "FIFO", NULL);
    expect(run("%s/mcompile " FX "/llama --target 64MiB --quant int8 --calib "
               "%s -o %s/c.mca", MC_BIN_DIR, fifo, d), 1, "--calib", "FIFO",
           NULL);
    free(art);
    free(fifo);
    tu_rmtree(d);
    free(d);
}

static void test_special_files_are_never_outputs(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-special");
    char *fifo = tu_fmt("%s/fifo", d), *fdir = tu_fmt("%s/fifodir", d);
    assert_int_equal(mkfifo(fifo, 0666), 0);
    assert_int_equal(mkfifo(fdir, 0666), 0);
    expect(run("%s/mcompile plan " FX "/llama --target 1GiB --svg %s",
               MC_BIN_DIR, fifo), 1, "--svg FIFO", "a FIFO", NULL);
    expect(run("%s/mrun " FX "/llama --tokens 1 --max-new-tokens 1 "
               "--metrics %s", MC_BIN_DIR, fifo), 1, "--metrics FIFO",
           "a FIFO", NULL);
    expect(run("%s/mcompile " FX "/llama --target 64MiB -o %s", MC_BIN_DIR,
               fifo), 1, "compile -o FIFO", "refusing", NULL);
    expect(run("%s/mcompile merge " FX "/llama --lora " FX
               "/adapters/llama-plain -o %s", MC_BIN_DIR, fdir), 1,
           "merge -o FIFO", "a FIFO", NULL);
    expect(run("%s/mrun " FX "/llama --tokens 1 --max-new-tokens 1 "
               "--metrics /dev/null", MC_BIN_DIR), 1, "--metrics /dev/null",
           "character device", NULL);
    assert_true(is_fifo(fifo));
    assert_true(is_fifo(fdir));
    assert_int_equal(tu_count_entries(d), 2); /* nothing else appeared */
    free(fifo);
    free(fdir);
    tu_rmtree(d);
    free(d);
}

/* One command under the shim, which truncates `victim` right after mmap. */
static int run_truncating(const char *victim, const char *cmdline)
{
    const char *asan = getenv("ASAN_OPTIONS");
    char *env = tu_fmt("LD_PRELOAD='%s' MC_FAULT_TRUNCATE_MAPPED='%s' "
                       "ASAN_OPTIONS='%s%sverify_asan_link_order=0'",
                       MC_IO_SHIM, victim, asan ? asan : "",
                       asan && *asan ? ":" : "");
    int rc = run("env %s %s", env, cmdline);
    free(env);
    return rc;
}

static void test_input_truncated_while_mapped_is_a_clean_error(void **st)
{
    (void)st;
    TU_SKIP_IF(!MC_IO_SHIM[0], "the I/O fault shim was not built");
    char *d = tu_mkdtemp("safe-trunc");
    char *m = tu_fmt("%s/m", d), *w = tu_fmt("%s/m/model.safetensors", d);
    char *cmd[3];
    cmd[0] = tu_fmt("%s/mcompile merge %s --lora " FX "/adapters/llama-plain "
                    "-o %s/merged", MC_BIN_DIR, m, d);
    cmd[1] = tu_fmt("%s/mcompile %s --target 64MiB --quant int8 -o %s/x.mca",
                    MC_BIN_DIR, m, d);
    cmd[2] = tu_fmt("%s/mrun %s --tokens '1 2 3' --max-new-tokens 4",
                    MC_BIN_DIR, m);
    struct stat sb;
    assert_int_equal(stat(FX "/llama/model.safetensors", &sb), 0);
    const off_t full = sb.st_size;
    for (int i = 0; i < 3; i++) {
        tu_rmtree(m);
        copy_dir(FX "/llama", m);
        int rc = run_truncating(w, cmd[i]);
        if (rc == 127 || strstr(g_err, "ASan runtime does not come first"))
            TU_SKIP_IF(1, "the shim cannot be preloaded here");
        /* not killed by SIGBUS (135): a message naming the file, exit 1 */
        expect(rc, 1, cmd[i], w, "changed size while it was being read");
        assert_int_equal(stat(w, &sb), 0);
        assert_true(sb.st_size <= full / 2); /* the shim did truncate it */
        assert_false(has_temp(d));
    }
    char *merged = tu_fmt("%s/merged", d), *x = tu_fmt("%s/x.mca", d);
    assert_false(tu_exists(merged));
    assert_false(tu_exists(x));
    free(merged);
    free(x);
    for (int i = 0; i < 3; i++)
        free(cmd[i]);
    free(w);
    free(m);
    tu_rmtree(d);
    free(d);
}

static void test_numeric_options_are_strict(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-num");
    char *art = tu_fmt("%s/a.mca", d);
    expect(run("%s/mcompile " FX "/llama --target 64MiB -q -o %s", MC_BIN_DIR,
               art), 0, "compile", NULL, NULL);
    static const struct {
        const char *flag, *value;
    } bad[] = {{"--temperature", "nan"}, {"--temperature", "inf"},
               {"--temperature", "-inf"}, {"--temperature", "1e999"},
               {"--temperature", "0.5x"}, {"--temperature", "''"},
               {"--temperature", "' 1'"}, {"--temperature", "0x1p1"},
               {"--top-p", "nan"},       {"--top-p", "0"},
               {"--top-p", "1.5"},       {"--seed", "-1"},
               {"--seed", "99999999999999999999"}, {"--top-k", "1e3"},
               {"--max-new-tokens", "0x10"}, {"--threads", "+4"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *what = tu_fmt("mrun %s %s", bad[i].flag, bad[i].value);
        expect(run("%s/mrun %s --tokens 1 %s %s", MC_BIN_DIR, art, bad[i].flag,
                   bad[i].value), 2, what, bad[i].flag, NULL);
        free(what);
    }
    expect(run("%s/mrun %s --tokens 1 --max-new-tokens 2 --temperature 0.7 "
               "--top-p 0.9 --seed 3 -q", MC_BIN_DIR, art), 0, "valid", NULL,
           NULL);
    const char *mc[][2] = {
        {"merge " FX "/llama --lora " FX "/adapters/llama-plain:nan -o X",
         "--lora weight"},
        {"merge " FX "/llama --lora " FX "/adapters/llama-plain:inf -o X",
         "--lora weight"},
        {FX "/llama --target 64MiB --lora " FX "/adapters/llama-plain:nan",
         "--lora weight"},
        {FX "/llama --target 64MiB --compress --zstd-level 3x", "--zstd-level"},
        {"plan " FX "/llama --target 1GiB --max-seq 1e3", "--max-seq"},
        {"plan " FX "/llama --target 1GiB --max-batch nan", "--max-batch"},
        {"plan " FX "/llama --target 0x10GiB", "--target"},
        {"plan " FX "/llama --target nanGiB", "--target"},
        {"eval X --ref " FX "/llama --tokens X --threads nan", "--threads"}};
    for (size_t i = 0; i < sizeof mc / sizeof mc[0]; i++)
        expect(run_in(d, "%s/mcompile %s", MC_BIN_DIR, mc[i][0]), 2,
               mc[i][0], mc[i][1], NULL);
    char *x = tu_fmt("%s/X", d);
    assert_false(tu_exists(x));
    free(x);
    free(art);
    tu_rmtree(d);
    free(d);
}

/* Rewrite artifact src as dst with plan[key] = value, every checksum
 * recomputed: a doctored file that passes every integrity check. */
/* Copy src to dst with its manifest changed by doctor (may be NULL) and
 * the checksums redone, as anyone can. */
static void rewrite_manifest(const char *src, const char *dst,
                             void (*doctor)(json_t *man))
{
    fmt_art *a = NULL;
    mc_error e;
    assert_int_equal(fmt_art_open(src, &a, &e), MC_OK);
    json_t *man = json_deep_copy(fmt_art_manifest(a));
    if (doctor)
        doctor(man);
    fmt_art_writer *w = NULL;
    assert_int_equal(fmt_art_writer_create(dst, &w, &e), MC_OK);
    size_t n = fmt_art_section_count(a);
    for (size_t i = 0; i < n; i++) {
        const fmt_art_section *s = fmt_art_section_at(a, i);
        assert_int_equal(fmt_art_writer_add_section(w, s->name, s->kind,
                                                    s->raw_bytes, s->codec,
                                                    &e), MC_OK);
    }
    assert_int_equal(fmt_art_writer_begin(w, man, &e), MC_OK);
    for (size_t i = 0; i < n; i++) {
        const fmt_art_section *s = fmt_art_section_at(a, i);
        void *buf = malloc(s->raw_bytes ? (size_t)s->raw_bytes : 1);
        assert_int_equal(fmt_art_section_read(a, i, buf, s->raw_bytes, 1, &e),
                         MC_OK);
        assert_int_equal(fmt_art_writer_write(w, buf, (size_t)s->raw_bytes,
                                              &e), MC_OK);
        free(buf);
    }
    assert_int_equal(fmt_art_writer_finish(w, &e), MC_OK);
    json_decref(man);
    fmt_art_close(a);
}

static const char *g_plan_key;
static json_int_t g_plan_value;

static void doctor_plan(json_t *man)
{
    json_object_set_new(json_object_get(man, "plan"), g_plan_key,
                        json_integer(g_plan_value));
}

static void rewrite_plan(const char *src, const char *dst, const char *key,
                         json_int_t value)
{
    g_plan_key = key;
    g_plan_value = value;
    rewrite_manifest(src, dst, key ? doctor_plan : NULL);
}

/* The first tensor's bytes taken from the last tensor's section. */
static void doctor_section(json_t *man)
{
    json_t *ts = json_object_get(man, "tensors");
    json_t *last = json_object_get(json_array_get(ts, json_array_size(ts) - 1),
                                   "section");
    json_object_set(json_array_get(ts, 0), "section", last);
}

static void doctor_tokenizer(json_t *man)
{
    json_object_set_new(man, "tokenizer", json_true());
}

/* A tied config while lm_head.weight is stored (the llama fixture's). */
static void doctor_tie(json_t *man)
{
    json_object_set_new(json_object_get(man, "config"), "tie_word_embeddings",
                        json_true());
}

static void doctor_target(json_t *man)
{
    json_object_set_new(json_object_get(man, "plan"), "target_bytes",
                        json_integer(1));
}

/* Manifests re-signed with tables that disagree are refused by mrun and by
 * `inspect --verify` alike (which before checked the checksums only). */
static void test_doctored_manifest_tables_are_refused(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-tab");
    char *art = tu_fmt("%s/a.mca", d), *doc = tu_fmt("%s/doc.mca", d);
    expect(run("%s/mcompile " FX "/llama --target 64MiB -q -o %s", MC_BIN_DIR,
               art), 0, "compile", NULL, NULL);
    expect(run("%s/mcompile inspect --verify %s", MC_BIN_DIR, art), 0,
           "inspect --verify", NULL, NULL);
    assert_non_null(strstr(g_out, "the runtime loads it"));
    static const struct {
        void (*doctor)(json_t *);
        const char *needle;
    } cases[] = {
        {doctor_section, "expected its own"},
        {doctor_tokenizer, "\"tokenizer\" is true"},
        {doctor_tie, "no place for it"},
        {doctor_target, "expected fits"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(doc);
        rewrite_manifest(art, doc, cases[i].doctor);
        expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1", MC_BIN_DIR, doc),
               1, cases[i].needle, cases[i].needle, NULL);
        expect(run("%s/mcompile inspect --verify %s", MC_BIN_DIR, doc), 1,
               cases[i].needle, cases[i].needle, NULL);
    }
    /* a .mca whose magic is damaged is a damaged artifact to mrun too,
     * not a safetensors file with a strange header */
    size_t len;
    char *bytes = tu_read_file(art, &len);
    bytes[0] ^= 0x20;
    unlink(doc);
    assert_int_equal(tu_write_file(doc, bytes, len), 0);
    free(bytes);
    expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1", MC_BIN_DIR, doc), 1,
           "damaged magic", "bad magic", NULL);
    free(art);
    free(doc);
    tu_rmtree(d);
    free(d);
}

static void test_doctored_manifest_plan_is_refused(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-man");
    char *art = tu_fmt("%s/a.mca", d), *doc = tu_fmt("%s/doc.mca", d);
    expect(run("%s/mcompile " FX "/llama --target 64MiB -q --compress -o %s",
               MC_BIN_DIR, art), 0, "compile", NULL, NULL);
    /* the rewrite itself yields a valid artifact */
    rewrite_plan(art, doc, NULL, 0);
    expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 -q", MC_BIN_DIR, doc),
           0, "undoctored rewrite", NULL, NULL);
    static const char *const keys[] = {"total_bytes", "weights_bytes",
                                       "kv_bytes", "activation_bytes"};
    for (size_t i = 0; i < 4; i++) {
        unlink(doc);
        rewrite_plan(art, doc, keys[i], 1000);
        expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 --json",
                   MC_BIN_DIR, doc), 1, keys[i], keys[i], "disagree");
    }
    free(art);
    free(doc);
    tu_rmtree(d);
    free(d);
}

/* Copy fixture src into dst with one more tensor, extra, holding the
 * values of tensor like (any shape: like's); config.json copied, with
 * cfg_from replaced by cfg_to when given. */
static void fixture_plus(const char *src, const char *dst, const char *extra,
                         const char *like, const char *cfg_from,
                         const char *cfg_to)
{
    copy_dir(src, dst);
    char *in = tu_fmt("%s/model.safetensors", src);
    char *out = tu_fmt("%s/model.safetensors", dst);
    fmt_st_file *f;
    fmt_st_writer *w;
    mc_error e;
    assert_int_equal(fmt_st_open(in, &f, &e), MC_OK);
    assert_int_equal(unlink(out), 0);
    assert_int_equal(fmt_st_writer_create(out, &w, &e), MC_OK);
    size_t n = fmt_st_count(f);
    const fmt_st_tensor *lk = fmt_st_find(f, like);
    assert_non_null(lk);
    for (size_t i = 0; i <= n; i++) {
        const fmt_st_tensor *t = i < n ? fmt_st_get(f, i) : lk;
        assert_int_equal(fmt_st_writer_add(w, i < n ? t->name : extra, t->dtype,
                                           t->ndim, t->shape, &e), MC_OK);
    }
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    for (size_t i = 0; i <= n; i++) {
        const fmt_st_tensor *t = i < n ? fmt_st_get(f, i) : lk;
        assert_int_equal(fmt_st_writer_write(w, t->data, (size_t)t->nbytes, &e),
                         MC_OK);
    }
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_OK);
    fmt_st_close(f);
    if (cfg_from) {
        char *cp = tu_fmt("%s/config.json", dst);
        size_t len;
        char *text = tu_read_file(cp, &len);
        char *at = strstr(text, cfg_from);
        assert_non_null(at);
        char *edited = tu_fmt("%.*s%s%s", (int)(at - text), text, cfg_to,
                              at + strlen(cfg_from));
        assert_int_equal(tu_write_file(cp, edited, strlen(edited)), 0);
        free(edited);
        free(text);
        free(cp);
    }
    free(in);
    free(out);
}

/* Every tensor of a checkpoint is one its config implies, or the compile
 * refuses it by name: a layer past num_hidden_layers, a stray tensor, a
 * tied model's lm_head.weight that is not its embedding.  A tied model
 * storing its embedding twice and RoPE's inv_freq buffers are fine. */
static void test_checkpoint_tensors_match_the_config(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-ckpt");
    static const struct {
        const char *src, *extra, *like, *from, *to;
        int rc;
        const char *needle;
    } cases[] = {
        {"llama", "model.extra.weight", "model.norm.weight", NULL, NULL, 1,
         "has no place for"},
        {"llama", "model.layers.0.self_attn.rotary_emb.inv_freq",
         "model.norm.weight", NULL, NULL, 0, NULL},
        {"qwen2", "lm_head.weight", "model.embed_tokens.weight", NULL, NULL, 0,
         NULL},
        {"qwen2", "lm_head.weight", "model.layers.0.mlp.gate_proj.weight",
         NULL, NULL, 1, "differs from model.embed_tokens"},
        {"llama", "model.layers.0.extra", "model.norm.weight",
         "\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3", 1,
         "num_hidden_layers is 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *src = tu_fmt(FX "/%s", cases[i].src);
        char *m = tu_fmt("%s/m%zu", d, i), *art = tu_fmt("%s/m%zu.mca", d, i);
        fixture_plus(src, m, cases[i].extra, cases[i].like, cases[i].from,
                     cases[i].to);
        expect(run("%s/mcompile %s --target 64MiB -q -o %s", MC_BIN_DIR, m, art),
               cases[i].rc, cases[i].extra, cases[i].needle, NULL);
        assert_int_equal(tu_exists(art), cases[i].rc == 0);
        /* mrun on the checkpoint itself agrees about a tied lm_head */
        if (!strcmp(cases[i].extra, "lm_head.weight"))
            expect(run("%s/mrun %s --tokens 1 --max-new-tokens 1 -q",
                       MC_BIN_DIR, m), cases[i].rc, "mrun tied lm_head",
                   cases[i].needle, NULL);
        free(src), free(m), free(art);
    }
    tu_rmtree(d);
    free(d);
}

static void test_default_output_is_named_after_the_directory(void **st)
{
    (void)st;
    char *d = tu_mkdtemp("safe-name");
    char *m = tu_fmt("%s/tiny-llama", d);
    copy_dir(FX "/llama", m);
    expect(run_in(m, "%s/mcompile . --target 64MiB -q", MC_BIN_DIR), 0,
           "mcompile .", NULL, NULL);
    char *want = tu_fmt("%s/tiny-llama.mca", m), *hidden = tu_fmt("%s/..mca", m);
    assert_true(tu_exists(want));
    assert_false(tu_exists(hidden));
    /* from a sibling: "../tiny-llama/." names the directory too */
    char *sib = tu_fmt("%s/sib", d), *want2 = tu_fmt("%s/sib/tiny-llama.mca", d);
    assert_int_equal(mkdir(sib, 0777), 0);
    expect(run_in(sib, "%s/mcompile ../tiny-llama/. --target 64MiB -q",
                  MC_BIN_DIR), 0, "mcompile ../x/.", NULL, NULL);
    assert_true(tu_exists(want2));
    assert_int_equal(tu_count_entries(sib), 1);
    free(sib);
    free(want2);
    free(want);
    free(hidden);
    free(m);
    tu_rmtree(d);
    free(d);
}

static int teardown(void **st)
{
    (void)st;
    free(g_out);
    free(g_err);
    g_out = g_err = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outputs_never_replace_inputs_or_foreign_data),
        cmocka_unit_test(test_outputs_replace_only_their_own_kind),
        cmocka_unit_test(test_fifo_as_any_input_fails_promptly),
        cmocka_unit_test(test_special_files_are_never_outputs),
        cmocka_unit_test(test_input_truncated_while_mapped_is_a_clean_error),
        cmocka_unit_test(test_numeric_options_are_strict),
        cmocka_unit_test(test_doctored_manifest_plan_is_refused),
        cmocka_unit_test(test_doctored_manifest_tables_are_refused),
        cmocka_unit_test(test_checkpoint_tensors_match_the_config),
        cmocka_unit_test(test_default_output_is_named_after_the_directory),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}

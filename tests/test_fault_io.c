/* test_fault_io.c - the real programs under the I/O fault shim
 * (tests/shim/io_fault.c, LD_PRELOAD): `mcompile merge` and
 * `mcompile MODEL --target ... -o X.mca` with writes failing (ENOSPC, EIO)
 * at several byte positions, and with SIGINT / SIGTERM / SIGKILL arriving
 * mid-write.  Each case checks:
 *   - a previous output at the same path is byte-identical afterwards;
 *   - ENOSPC/EIO: exit status 1 and an error naming the output path and
 *     the errno text; no ".mctmp-" temporary left;
 *   - INT/TERM: the process dies by the signal (or exits non-zero) and no
 *     temporary is left (the programs' handlers remove them);
 *   - KILL: the temporary is left, recognisable by its name
 *     (".<name>.mctmp-<pid>-<n>-<place>"), and the next run removes it
 *     (fmt_atomic_sweep_stale on the output's directory).
 * Under ASan the shim is preloaded with verify_asan_link_order=0 (the shim
 * itself is built without sanitizers); if that fails the cases are skipped
 * with a message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmt_atomic.h"
#include "testutil.h"

#ifndef MC_IO_SHIM
#define MC_IO_SHIM ""
#endif

/* ---- running a program ---------------------------------------------------- */

typedef struct run_result {
    int exited;      /* 1: exit status in code */
    int code;
    int sig;         /* signal that killed it, else 0 */
    char *err;       /* stderr text (malloc'ed) */
} run_result;

static int under_sanitizer(void)
{
#ifdef MC_SANITIZE
    return 1;
#else
    return getenv("MC_UNDER_SANITIZER") != NULL;
#endif
}

/* Run argv with the shim preloaded (when fault != NULL) and the given
 * MC_FAULT_* settings ("KEY=VALUE" strings, NULL-terminated). */
static run_result run_prog(char *const argv[], const char *const *fault,
                           const char *errpath)
{
    run_result r;
    memset(&r, 0, sizeof r);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int nul = open("/dev/null", O_RDWR);
        if (fd < 0 || nul < 0)
            _exit(120);
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(fd, 2);
        for (const char *const *f = fault; f && *f; f++)
            putenv((char *)*f);
        if (fault) {
            setenv("LD_PRELOAD", MC_IO_SHIM, 1);
            if (under_sanitizer()) {
                const char *old = getenv("ASAN_OPTIONS");
                char buf[1024];
                snprintf(buf, sizeof buf, "%s%sverify_asan_link_order=0",
                         old ? old : "", old && *old ? ":" : "");
                setenv("ASAN_OPTIONS", buf, 1);
            }
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st)) {
        r.exited = 1;
        r.code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
        r.sig = WTERMSIG(st);
    }
    r.err = tu_read_file(errpath, NULL);
    if (!r.err)
        r.err = calloc(1, 1);
    return r;
}

/* ---- snapshots of outputs ------------------------------------------------- */

/* A file or a flat directory's files, concatenated with their names, so two
 * snapshots compare with one memcmp. */
typedef struct snap {
    char *bytes;
    size_t len;
} snap;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void snap_add(snap *s, const void *p, size_t n)
{
    s->bytes = realloc(s->bytes, s->len + n + 1);
    assert_non_null(s->bytes);
    memcpy(s->bytes + s->len, p, n);
    s->len += n;
}

static snap take_snap(const char *path)
{
    snap s = {NULL, 0};
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    if (!S_ISDIR(sb.st_mode)) {
        size_t n;
        char *b = tu_read_file(path, &n);
        assert_non_null(b);
        snap_add(&s, b, n);
        free(b);
        return s;
    }
    DIR *d = opendir(path);
    assert_non_null(d);
    char *names[256];
    size_t nn = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && nn < 256)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            names[nn++] = strdup(e->d_name);
    closedir(d);
    qsort(names, nn, sizeof names[0], cmp_str);
    for (size_t i = 0; i < nn; i++) {
        char *p = tu_fmt("%s/%s", path, names[i]);
        size_t n;
        char *b = tu_read_file(p, &n);
        assert_non_null(b);
        snap_add(&s, names[i], strlen(names[i]) + 1);
        snap_add(&s, &n, sizeof n);
        snap_add(&s, b, n);
        free(b);
        free(p);
        free(names[i]);
    }
    return s;
}

static int snap_equal(const snap *a, const snap *b)
{
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

/* Sum of file sizes (a file, or the files of a flat directory). */
static long long out_bytes(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    if (!S_ISDIR(sb.st_mode))
        return (long long)sb.st_size;
    long long total = 0;
    DIR *d = opendir(path);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *p = tu_fmt("%s/%s", path, e->d_name);
        if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
            total += sb.st_size;
        free(p);
    }
    closedir(d);
    return total;
}

/* Names in dir holding ".mctmp-" (also one level down, in a temp dir). */
static int count_temps(const char *dir, char *first, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, ".mctmp-")) {
            if (n == 0 && first)
                snprintf(first, cap, "%s", e->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

/* 1 if name looks like ".<name>.mctmp-<pid>-<n>-<place>" with a numeric
 * pid and an 8-hex-digit place. */
static int temp_name_ok(const char *name, const char *base)
{
    char want[256];
    snprintf(want, sizeof want, ".%s.mctmp-", base);
    if (strncmp(name, want, strlen(want)) != 0)
        return 0;
    const char *p = name + strlen(want);
    char *end;
    long pid = strtol(p, &end, 10);
    if (pid <= 0 || *end != '-')
        return 0;
    strtol(end + 1, &end, 10);
    return *end == '-' && strlen(end + 1) == 8 &&
           strspn(end + 1, "0123456789abcdef") == 8;
}

/* ---- the cases ------------------------------------------------------------ */

typedef struct job {
    const char *label;
    char *tmp;               /* scratch dir (holds the output) */
    char *out;               /* output path (file or directory) */
    const char *base;        /* its last component */
    char *argv_ok[16];       /* the run that makes the previous output */
    char *argv_new[16];      /* the run under faults (different content) */
    char *errpath;
} job;

static void job_free(job *j)
{
    tu_rmtree(j->tmp);
    free(j->tmp);
    free(j->out);
    free(j->errpath);
    for (int i = 0; i < 16; i++) {
        free(j->argv_ok[i]);
        free(j->argv_new[i]);
    }
}

/* A job called label (static) writing base (static) in a new temp dir;
 * the caller fills in the two command lines. */
static void job_init(job *j, const char *label, const char *base)
{
    memset(j, 0, sizeof *j);
    j->label = label;
    j->tmp = tu_mkdtemp("fio");
    j->out = tu_fmt("%s/%s", j->tmp, base);
    j->base = base;
    j->errpath = tu_fmt("%s.stderr", j->tmp);
}

static void make_merge_job(job *j)
{
    job_init(j, "merge", "merged");
    const char *a[] = {"%s/mcompile", "merge", "%s/llama", "--lora",
                       "%s/adapters/llama-plain", "-o", "%s", "-q", NULL};
    const char *b[] = {"%s/mcompile", "merge", "%s/llama", "--lora",
                       "%s/adapters/llama-dora", "-o", "%s", "-q", NULL};
    const char *const *src[2] = {a, b};
    char **dst[2] = {j->argv_ok, j->argv_new};
    for (int k = 0; k < 2; k++) {
        dst[k][0] = tu_fmt(src[k][0], MC_BIN_DIR);
        dst[k][1] = strdup("merge");
        dst[k][2] = tu_fmt(src[k][2], MC_FIXTURE_DIR);
        dst[k][3] = strdup("--lora");
        dst[k][4] = tu_fmt(src[k][4], MC_FIXTURE_DIR);
        dst[k][5] = strdup("-o");
        dst[k][6] = strdup(j->out);
        dst[k][7] = strdup("-q");
    }
}

static void make_compile_job(job *j)
{
    job_init(j, "compile", "m.mca");
    const char *quant[2] = {"int8", "int4"};
    char **dst[2] = {j->argv_ok, j->argv_new};
    for (int k = 0; k < 2; k++) {
        int i = 0;
        dst[k][i++] = tu_fmt("%s/mcompile", MC_BIN_DIR);
        dst[k][i++] = tu_fmt("%s/llama", MC_FIXTURE_DIR);
        dst[k][i++] = strdup("--target");
        dst[k][i++] = strdup("64MiB");
        dst[k][i++] = strdup("--quant");
        dst[k][i++] = strdup(quant[k]);
        dst[k][i++] = strdup("--max-batch");
        dst[k][i++] = strdup("2");
        dst[k][i++] = strdup("--max-seq");
        dst[k][i++] = strdup("64");
        dst[k][i++] = strdup("-o");
        dst[k][i++] = strdup(j->out);
        dst[k][i++] = strdup("-q");
    }
}

/* A clean run with the shim loaded but no limit: checks the shim loads and
 * gives the bytes the new output will have. */
static int shim_usable(job *j, long long *bytes)
{
    if (!MC_IO_SHIM[0] || access(MC_IO_SHIM, R_OK) != 0) {
        printf("[  SKIP    ] no I/O shim built (MC_IO_SHIM)\n");
        return 0;
    }
    char *scratch = tu_fmt("%s/probe", j->tmp);
    assert_int_equal(mkdir(scratch, 0777), 0);
    /* Same run, output redirected into scratch. */
    int outi = 0; /* the argument after -o */
    for (int i = 1; i < 16 && j->argv_new[i]; i++)
        if (strcmp(j->argv_new[i - 1], "-o") == 0)
            outi = i;
    assert_true(outi > 0);
    char *saved = j->argv_new[outi];
    j->argv_new[outi] = tu_fmt("%s/%s", scratch, j->base);
    const char *env[] = {"MC_FAULT_PATH_SUBSTR=.mctmp-", NULL};
    run_result r = run_prog(j->argv_new, env, j->errpath);
    int ok = r.exited && r.code == 0;
    if (!ok)
        printf("[  SKIP    ] %s under the shim failed (exit %d, signal %d): "
               "%s\n", j->label, r.code, r.sig, r.err);
    *bytes = out_bytes(j->argv_new[outi]);
    free(j->argv_new[outi]);
    j->argv_new[outi] = saved;
    tu_rmtree(scratch);
    free(scratch);
    free(r.err);
    return ok;
}

static const char *strerr_of(const char *e)
{
    return strcmp(e, "EIO") == 0 ? "Input/output error"
                                 : "No space left on device";
}

static void check_intact(job *j, const snap *before, const char *what)
{
    snap now = take_snap(j->out);
    if (!snap_equal(before, &now))
        fail_msg("%s %s: previous output changed", j->label, what);
    free(now.bytes);
}

/* Runs j's new command with the shim tripping after pos bytes of its
 * temporaries, how said by the variable var=value (MC_FAULT_WRITE_ERRNO or
 * MC_FAULT_SIGNAL). */
static run_result run_faulted(job *j, long long pos, const char *var,
                              const char *value)
{
    char envb[64], envf[64];
    snprintf(envb, sizeof envb, "MC_FAULT_AFTER_BYTES=%lld", pos);
    snprintf(envf, sizeof envf, "%s=%s", var, value);
    const char *env[] = {envb, envf, "MC_FAULT_PATH_SUBSTR=.mctmp-", NULL};
    return run_prog(j->argv_new, env, j->errpath);
}

/* No temporaries left and the previous output untouched. */
static void check_clean(job *j, const snap *before, const char *what)
{
    int temps = count_temps(j->tmp, NULL, 0);
    if (temps)
        fail_msg("%s %s: %d temporaries left", j->label, what, temps);
    check_intact(j, before, what);
}

static void errno_cases(job *j, const snap *before, long long total)
{
    const char *errs[] = {"ENOSPC", "EIO"};
    long long pos[] = {0, 1, 4099, total / 2, total - 1, total};
    int cases = 0;
    for (int e = 0; e < 2; e++) {
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            run_result r = run_faulted(j, pos[p], "MC_FAULT_WRITE_ERRNO",
                                       errs[e]);
            char what[96];
            snprintf(what, sizeof what, "%s at byte %lld", errs[e], pos[p]);
            if (!r.exited || r.code != 1)
                fail_msg("%s %s: expected exit 1, got exit %d signal %d: %s",
                         j->label, what, r.code, r.sig, r.err);
            if (!strstr(r.err, j->base) || !strstr(r.err, strerr_of(errs[e])))
                fail_msg("%s %s: message does not name the path and the "
                         "error: %s", j->label, what, r.err);
            check_clean(j, before, what);
            if (cases == 0)
                printf("  %s %s: %s", j->label, what, r.err);
            cases++;
            free(r.err);
        }
    }
    printf("[ FIGURES  ] %s: %d write-failure cases (ENOSPC/EIO at %zu byte "
           "positions of %lld), all clean\n", j->label, cases,
           sizeof pos / sizeof pos[0], total);
}

static void signal_cases(job *j, const snap *before, long long total)
{
    const char *sigs[] = {"INT", "TERM"};
    const int signo[] = {SIGINT, SIGTERM};
    long long pos[] = {1, total / 2, total - 1};
    for (int s = 0; s < 2; s++) {
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            run_result r = run_faulted(j, pos[p], "MC_FAULT_SIGNAL", sigs[s]);
            char what[96];
            snprintf(what, sizeof what, "SIG%s at byte %lld", sigs[s], pos[p]);
            if (!(r.sig == signo[s] || (r.exited && r.code != 0)))
                fail_msg("%s %s: expected death by the signal, got exit %d "
                         "signal %d", j->label, what, r.code, r.sig);
            check_clean(j, before, what);
            free(r.err);
        }
    }
    printf("[ FIGURES  ] %s: 6 SIGINT/SIGTERM cases, died by the signal, no "
           "temporaries, previous output intact\n", j->label);
}

static void kill_case(job *j, const snap *before, long long total)
{
    for (int round = 0; round < 2; round++) {
        run_result r = run_faulted(j, total / 2, "MC_FAULT_SIGNAL", "KILL");
        assert_int_equal(r.sig, SIGKILL);
        free(r.err);
        char first[256] = "";
        int temps = count_temps(j->tmp, first, sizeof first);
        if (temps != 1)
            fail_msg("%s SIGKILL: expected the one stale temporary, found %d",
                     j->label, temps);
        if (!temp_name_ok(first, j->base))
            fail_msg("%s SIGKILL: temporary '%s' is not recognisable",
                     j->label, first);
        check_intact(j, before, "SIGKILL");
        if (round == 0) {
            /* The next run of the program sweeps it. */
            run_result ok = run_prog(j->argv_ok, NULL, j->errpath);
            assert_true(ok.exited && ok.code == 0);
            free(ok.err);
            if (count_temps(j->tmp, NULL, 0) != 0)
                fail_msg("%s: the next run did not remove the stale temporary",
                         j->label);
            check_intact(j, before, "run after SIGKILL");
        } else {
            /* The library call on its own. */
            assert_int_equal(fmt_atomic_sweep_stale(j->tmp), 1);
            assert_int_equal(count_temps(j->tmp, NULL, 0), 0);
        }
    }
    printf("[ FIGURES  ] %s: SIGKILL leaves one recognisable temporary; the "
           "next run and fmt_atomic_sweep_stale remove it\n", j->label);
}

static void run_job(job *j)
{
    /* The previous output. */
    run_result r = run_prog(j->argv_ok, NULL, j->errpath);
    if (!r.exited || r.code != 0)
        fail_msg("%s: clean run failed (exit %d signal %d): %s", j->label,
                 r.code, r.sig, r.err);
    free(r.err);
    snap before = take_snap(j->out);
    long long total = 0;
    if (!shim_usable(j, &total)) {
        free(before.bytes);
        job_free(j);
        if (under_sanitizer())
            printf("[  SKIP    ] LD_PRELOAD shim with ASan: see above\n");
        skip();
    }
    assert_true(total > 8192);
    errno_cases(j, &before, total);
    signal_cases(j, &before, total);
    kill_case(j, &before, total);
    free(before.bytes);
    job_free(j);
}

static void test_fault_io_merge_keeps_previous_output(void **state)
{
    (void)state;
    job j;
    make_merge_job(&j);
    run_job(&j);
}

static void test_fault_io_compile_keeps_previous_output(void **state)
{
    (void)state;
    job j;
    make_compile_job(&j);
    run_job(&j);
}

/* `mcompile export` (a GGUF file, a compressed-tensors directory) under
 * the same faults: the previous export from the int8 artifact survives
 * every failed export of the int4 one.  The inputs live in the build
 * directory, out of the scratch directory the cases count. */
static void test_fault_io_export_keeps_previous_output(void **state)
{
    (void)state;
    static char in[4096];
    snprintf(in, sizeof in, "%s/fio-export-in", MC_BIN_DIR);
    tu_rmtree(in);
    assert_int_equal(mkdir(in, 0755), 0);
    const char *quant[2] = {"int8", "int4"};
    for (int k = 0; k < 2; k++) {
        char *cmd = tu_fmt("'%s/mcompile' '%s/llama' --target 64MiB --quant "
                           "%s -o '%s/%s.mca' -q", MC_BIN_DIR, MC_FIXTURE_DIR,
                           quant[k], in, quant[k]);
        assert_int_equal(tu_run(cmd, NULL, NULL), 0);
        free(cmd);
    }
    const char *fmts[2][2] = {{"gguf", "m.gguf"},
                              {"compressed-tensors", "ct"}};
    for (int f = 0; f < 2; f++) {
        job j;
        job_init(&j, fmts[f][0], fmts[f][1]);
        char **dst[2] = {j.argv_ok, j.argv_new};
        for (int k = 0; k < 2; k++) {
            int i = 0;
            dst[k][i++] = tu_fmt("%s/mcompile", MC_BIN_DIR);
            dst[k][i++] = strdup("export");
            dst[k][i++] = tu_fmt("%s/%s.mca", in, quant[k]);
            dst[k][i++] = strdup("--format");
            dst[k][i++] = strdup(fmts[f][0]);
            dst[k][i++] = strdup("-o");
            dst[k][i++] = strdup(j.out);
            dst[k][i++] = strdup("-q");
        }
        run_job(&j);
    }
    tu_rmtree(in);
}

/* A calibrated compile whose spill file (cmp_spill.h: the quantized blocks
 * on their way to the artifact) hits ENOSPC: exit 1 naming the spill file
 * and the error, the previous artifact intact, nothing left in the
 * directory (the spill file is unnamed). */
static void test_fault_io_calib_spill_enospc(void **state)
{
    (void)state;
    if (!MC_IO_SHIM[0] || access(MC_IO_SHIM, R_OK) != 0) {
        printf("[  SKIP    ] no I/O shim built (MC_IO_SHIM)\n");
        skip();
    }
    char *tmp = tu_mkdtemp("spillfault");
    char *ids = tu_fmt("%s/calib.ids", tmp);
    char *out = tu_fmt("%s/m.mca", tmp);
    char *errpath = tu_fmt("%s.err", tmp);
    FILE *f = fopen(ids, "w");
    assert_non_null(f);
    tu_rng g = {99};
    for (int l = 0; l < 6; l++, fputc('\n', f))
        for (int t = 0; t < 32; t++)
            fprintf(f, "%s%u", t ? " " : "", tu_rng_u32(&g) % 256);
    fclose(f);
    char *argv[] = {tu_fmt("%s/mcompile", MC_BIN_DIR),
                    tu_fmt("%s/llama", MC_FIXTURE_DIR), "--target", "64MiB",
                    "--quant", "int4", "--calib", ids, "--max-batch", "2",
                    "--max-seq", "64", "-o", out, "-q", NULL};
    run_result r = run_prog(argv, NULL, errpath);
    assert_true(r.exited && r.code == 0);
    free(r.err);
    snap before = take_snap(out);
    const char *env[] = {"MC_FAULT_AFTER_BYTES=100",
                         "MC_FAULT_WRITE_ERRNO=ENOSPC", NULL};
    r = run_prog(argv, env, errpath);
    if (under_sanitizer() && !(r.exited && r.code == 1)) {
        printf("[  SKIP    ] LD_PRELOAD shim with ASan: exit %d signal %d\n",
               r.code, r.sig);
    } else {
        if (!r.exited || r.code != 1 || !strstr(r.err, "spill file") ||
            !strstr(r.err, "No space left on device"))
            fail_msg("expected exit 1 naming the spill file and ENOSPC, got "
                     "exit %d signal %d: %s", r.code, r.sig, r.err);
        printf("  calib spill ENOSPC: %s", r.err);
        snap now = take_snap(out);
        assert_true(snap_equal(&before, &now));
        free(now.bytes);
        assert_int_equal(tu_count_entries(tmp), 2); /* calib.ids, m.mca */
    }
    free(r.err);
    free(before.bytes);
    free(argv[0]);
    free(argv[1]);
    unlink(errpath);
    tu_rmtree(tmp);
    free(tmp);
    free(ids);
    free(out);
    free(errpath);
}

/* A first run (no previous output) that fails leaves nothing at all. */
static void test_fault_io_failed_first_run_leaves_nothing(void **state)
{
    (void)state;
    job j[2];
    make_merge_job(&j[0]);
    make_compile_job(&j[1]);
    for (int k = 0; k < 2; k++) {
        if (!MC_IO_SHIM[0] || access(MC_IO_SHIM, R_OK) != 0) {
            job_free(&j[k]);
            continue;
        }
        const char *env[] = {"MC_FAULT_AFTER_BYTES=5000",
                             "MC_FAULT_WRITE_ERRNO=ENOSPC",
                             "MC_FAULT_PATH_SUBSTR=.mctmp-", NULL};
        run_result r = run_prog(j[k].argv_new, env, j[k].errpath);
        assert_true(r.exited && r.code == 1);
        assert_false(tu_exists(j[k].out));
        assert_int_equal(tu_count_entries(j[k].tmp), 0);
        free(r.err);
        job_free(&j[k]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_io_merge_keeps_previous_output),
        cmocka_unit_test(test_fault_io_compile_keeps_previous_output),
        cmocka_unit_test(test_fault_io_export_keeps_previous_output),
        cmocka_unit_test(test_fault_io_failed_first_run_leaves_nothing),
        cmocka_unit_test(test_fault_io_calib_spill_enospc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

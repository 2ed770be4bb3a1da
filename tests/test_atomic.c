/* test_atomic.c - outputs appear whole or not at all (formats/fmt_atomic.h):
 * commit/abort, failing writes, signal cleanup and the stale-temp sweep. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmt_atomic.h"
#include "fmt_input.h"
#include "invalid_cases.h"
#include "mc_alloc.h"
#include "testutil.h"

/* Entries of dir whose name marks them as our temps. */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, ".mctmp-") != NULL;
    closedir(d);
    return n;
}

static void assert_file_is(const char *path, const char *want)
{
    size_t n;
    char *got = tu_read_binary(path, &n);
    assert_non_null(got);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(got, want, n);
    free(got);
}

static void test_atomic_commit_creates_file_with_contents(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out.bin", dir);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    assert_int_equal(fmt_atomic_write(f, "hello ", 6, &e), MC_OK);
    assert_int_equal(fmt_atomic_write(f, "world", 5, &e), MC_OK);
    assert_int_equal(fmt_atomic_tell(f), 11);
    assert_false(tu_exists(p)); /* nothing at the final path before commit */
    assert_int_equal(fmt_atomic_commit(f, &e), MC_OK);
    assert_file_is(p, "hello world");
    assert_int_equal(tu_count_entries(dir), 1);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* A file of several writeback steps (fmt_atomic starts writeback every
 * 8 MiB written, without waiting), written in pieces that are buffered
 * (small) and written straight through (>= 1 MiB), reads back whole. */
static void test_atomic_large_file_with_early_writeback_reads_back(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/big.bin", dir);
    size_t total = (21u << 20) + 3;
    unsigned char *data = malloc(total);
    assert_non_null(data);
    for (size_t i = 0; i < total; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    static const size_t piece[] = {7, 3u << 20, 65536, 1u << 20, 4095,
                                   (5u << 20) + 1, 100};
    size_t off = 0;
    for (size_t k = 0; off < total; k++) {
        size_t n = piece[k % (sizeof piece / sizeof piece[0])];
        n = n < total - off ? n : total - off;
        assert_int_equal(fmt_atomic_write(f, data + off, n, &e), MC_OK);
        off += n;
    }
    assert_int_equal(fmt_atomic_tell(f), total);
    assert_int_equal(fmt_atomic_commit(f, &e), MC_OK);
    size_t n;
    unsigned char *got = (unsigned char *)tu_read_binary(p, &n);
    assert_non_null(got);
    assert_int_equal(n, total);
    assert_memory_equal(got, data, total);
    assert_int_equal(count_temps(dir), 0);
    free(got);
    free(data);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_temp_is_hidden_beside_target_with_pid(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out.bin", dir);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    char *prefix = tu_fmt("%s/.out.bin.mctmp-%ld-", dir, (long)getpid());
    assert_memory_equal(fmt_atomic_temp_path(f), prefix, strlen(prefix));
    assert_true(tu_exists(fmt_atomic_temp_path(f)));
    fmt_atomic_abort(f);
    assert_int_equal(tu_count_entries(dir), 0);
    free(prefix);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_abort_keeps_previous_file(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out.bin", dir);
    assert_int_equal(tu_write_file(p, "old", 3), 0);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    assert_int_equal(fmt_atomic_write(f, "new!", 4, &e), MC_OK);
    fmt_atomic_abort(f);
    assert_file_is(p, "old");
    assert_int_equal(tu_count_entries(dir), 1);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* In a child limited to 64 KiB files (RLIMIT_FSIZE, SIGXFSZ ignored, so
 * write fails with EFBIG like a full disk), write 1 MiB over p.  The child
 * exits 0 if the write failed with MC_ERR_IO naming p, 1 otherwise. */
static int write_too_big_in_child(const char *p)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {65536, 65536};
        setrlimit(RLIMIT_FSIZE, &rl);
        static char block[1 << 16];
        memset(block, 'x', sizeof block);
        fmt_atomic_file *f;
        mc_error e;
        if (fmt_atomic_create(p, &f, &e) != MC_OK)
            _exit(2);
        mc_status st = MC_OK;
        for (int i = 0; i < 16 && st == MC_OK; i++)
            st = fmt_atomic_write(f, block, sizeof block, &e);
        if (st == MC_OK)
            st = fmt_atomic_commit(f, &e);
        else
            fmt_atomic_abort(f);
        char msg[2048];
        mc_error_format(&e, msg, sizeof msg);
        _exit(st == MC_ERR_IO && strstr(msg, p) && strstr(msg, "File too large")
                  ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_atomic_failing_write_keeps_previous_file_and_no_temp(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out.bin", dir);
    assert_int_equal(tu_write_file(p, "previous", 8), 0);
    assert_int_equal(write_too_big_in_child(p), 0);
    assert_file_is(p, "previous");
    assert_int_equal(tu_count_entries(dir), 1);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_create_in_missing_dir_names_path(void **state)
{
    (void)state;
    fmt_atomic_file *f = (fmt_atomic_file *)1;
    mc_error e;
    assert_int_equal(fmt_atomic_create("/nonexistent-dir/x.bin", &f, &e), MC_ERR_IO);
    assert_null(f);
    assert_string_equal(e.file, "/nonexistent-dir/x.bin");
}

/* Child: install the handlers, open a temp file (or dir), report ready on
 * the pipe, wait for the signal.  Parent: send sig, expect death by it and
 * an empty directory. */
static void check_signal_cleanup(int sig, int as_dir)
{
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out", dir);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        fmt_atomic_install_signal_handlers();
        mc_error e;
        if (as_dir) {
            fmt_atomic_dir *d;
            if (fmt_atomic_dir_create(p, &d, &e) != MC_OK)
                _exit(2);
            char *inner = tu_fmt("%s/config.json", fmt_atomic_dir_path(d));
            tu_write_file(inner, "{}", 2);
        } else {
            fmt_atomic_file *f;
            if (fmt_atomic_create(p, &f, &e) != MC_OK ||
                fmt_atomic_write(f, "partial", 7, &e) != MC_OK)
                _exit(2);
        }
        if (write(fds[1], "r", 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    assert_int_equal(tu_count_entries(dir), 1); /* the temp exists */
    assert_int_equal(kill(pid, sig), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), sig);
    assert_int_equal(tu_count_entries(dir), 0);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_sigint_removes_temp_file(void **state)
{
    (void)state;
    check_signal_cleanup(SIGINT, 0);
}

static void test_atomic_sigterm_removes_temp_file(void **state)
{
    (void)state;
    check_signal_cleanup(SIGTERM, 0);
}

static void test_atomic_sighup_removes_temp_file(void **state)
{
    (void)state;
    check_signal_cleanup(SIGHUP, 0);
}

static void test_atomic_sigterm_removes_temp_dir_with_contents(void **state)
{
    (void)state;
    check_signal_cleanup(SIGTERM, 1);
}

/* Leave a temp behind by SIGKILL (no handler can run), then sweep. */
static void test_atomic_sweep_removes_temp_of_killed_process(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out", dir);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        fmt_atomic_install_signal_handlers();
        fmt_atomic_file *f;
        fmt_atomic_dir *d;
        mc_error e;
        char *q = tu_fmt("%s/outdir", dir);
        if (fmt_atomic_create(p, &f, &e) != MC_OK ||
            fmt_atomic_dir_create(q, &d, &e) != MC_OK)
            _exit(2);
        char *inner = tu_fmt("%s/w.safetensors", fmt_atomic_dir_path(d));
        tu_write_file(inner, "x", 1);
        if (write(fds[1], "r", 1) != 1)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    close(fds[0]);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(tu_count_entries(dir), 2); /* both temps survived */
    assert_int_equal(fmt_atomic_sweep_stale(dir), 2);
    assert_int_equal(tu_count_entries(dir), 0);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_sweep_keeps_temps_of_live_processes(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out", dir);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    /* A temp owned by our parent (alive) and an unrelated dot file. */
    char *other = tu_fmt("%s/.x.mctmp-%ld-0", dir, (long)getppid());
    char *plain = tu_fmt("%s/.notes.mctmp-abc", dir);
    assert_int_equal(tu_write_file(other, "", 0), 0);
    assert_int_equal(tu_write_file(plain, "", 0), 0);
    assert_int_equal(fmt_atomic_sweep_stale(dir), 0);
    assert_int_equal(tu_count_entries(dir), 3);
    fmt_atomic_abort(f);
    free(other);
    free(plain);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* A dead pid's temp is swept only when it carries this place's token
 * (host and PID namespace): another container's pid cannot be judged
 * from here.  Temps named before the token (no place) are judged as
 * before. */
static void test_atomic_sweep_judges_only_its_own_place(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("atomic"), *p = tu_fmt("%s/out", dir);
    fmt_atomic_file *f;
    mc_error e;
    assert_int_equal(fmt_atomic_create(p, &f, &e), MC_OK);
    const char *tmp = fmt_atomic_temp_path(f);
    const char *place = strrchr(tmp, '-') + 1;
    assert_int_equal(strlen(place), 8);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char other[9];
    snprintf(other, sizeof other, "%08x", (unsigned)strtoul(place, NULL, 16) ^ 1u);
    char *mine = tu_fmt("%s/.a.mctmp-%ld-0-%s", dir, (long)dead, place);
    char *theirs = tu_fmt("%s/.b.mctmp-%ld-0-%s", dir, (long)dead, other);
    char *old = tu_fmt("%s/.c.mctmp-%ld-0", dir, (long)dead);
    assert_int_equal(tu_write_file(mine, "", 0), 0);
    assert_int_equal(tu_write_file(theirs, "", 0), 0);
    assert_int_equal(tu_write_file(old, "", 0), 0);
    assert_int_equal(fmt_atomic_sweep_stale(dir), 2);
    assert_false(tu_exists(mine));
    assert_false(tu_exists(old));
    assert_true(tu_exists(theirs));
    assert_true(tu_exists(tmp)); /* our own live temp */
    fmt_atomic_abort(f);
    free(mine), free(theirs), free(old);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_atomic_dir_commit_creates_directory(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *out = tu_fmt("%s/model", root);
    fmt_atomic_dir *d;
    mc_error e;
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_OK);
    char *f = tu_fmt("%s/config.json", fmt_atomic_dir_path(d));
    assert_int_equal(tu_write_file(f, "{}", 2), 0);
    assert_false(tu_exists(out));
    assert_int_equal(fmt_atomic_dir_commit(d, &e), MC_OK);
    char *g = tu_fmt("%s/config.json", out);
    assert_file_is(g, "{}");
    assert_int_equal(tu_count_entries(root), 1);
    free(f);
    free(g);
    tu_rmtree(root);
    free(out);
    free(root);
}

static void test_atomic_dir_commit_replaces_previous_directory(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *out = tu_fmt("%s/model", root);
    char *old = tu_fmt("%s/old.txt", out), *sub = tu_fmt("%s/sub", out);
    char *mark = tu_fmt("%s/" FMT_OUTPUT_MARKER, out);
    assert_int_equal(mkdir(out, 0777), 0);
    assert_int_equal(mkdir(sub, 0777), 0);
    assert_int_equal(tu_write_file(old, "old", 3), 0);
    assert_int_equal(tu_write_file(mark, "", 0), 0); /* a previous output */
    fmt_atomic_dir *d;
    mc_error e;
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_OK);
    /* a file written through fmt_atomic inside the temp dir */
    char *np = tu_fmt("%s/new.txt", fmt_atomic_dir_path(d));
    fmt_atomic_file *f;
    assert_int_equal(fmt_atomic_create(np, &f, &e), MC_OK);
    assert_int_equal(fmt_atomic_write(f, "new", 3, &e), MC_OK);
    assert_int_equal(fmt_atomic_commit(f, &e), MC_OK);
    assert_true(tu_exists(old)); /* old output whole until commit */
    assert_int_equal(fmt_atomic_dir_commit(d, &e), MC_OK);
    assert_false(tu_exists(old));
    char *nf = tu_fmt("%s/new.txt", out);
    assert_file_is(nf, "new");
    assert_int_equal(tu_count_entries(out), 2); /* new.txt and the marker */
    assert_true(tu_exists(mark));
    assert_int_equal(tu_count_entries(root), 1); /* old one removed */
    free(mark);
    free(np);
    free(nf);
    free(old);
    free(sub);
    tu_rmtree(root);
    free(out);
    free(root);
}

static void test_atomic_dir_abort_keeps_previous_directory(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *out = tu_fmt("%s/model", root);
    char *old = tu_fmt("%s/old.txt", out);
    char *mark = tu_fmt("%s/" FMT_OUTPUT_MARKER, out);
    assert_int_equal(mkdir(out, 0777), 0);
    assert_int_equal(tu_write_file(old, "old", 3), 0);
    assert_int_equal(tu_write_file(mark, "", 0), 0); /* a previous output */
    free(mark);
    fmt_atomic_dir *d;
    mc_error e;
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_OK);
    char *f = tu_fmt("%s/x", fmt_atomic_dir_path(d));
    assert_int_equal(tu_write_file(f, "x", 1), 0);
    fmt_atomic_dir_abort(d);
    assert_file_is(old, "old");
    assert_int_equal(tu_count_entries(root), 1);
    free(f);
    free(old);
    tu_rmtree(root);
    free(out);
    free(root);
}

/* A directory without the marker is the user's: never replaced, whatever
 * it holds; an empty one holds nothing to lose and is replaced. */
static void test_atomic_dir_replaces_only_directories_it_wrote(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *out = tu_fmt("%s/model", root);
    char *notes = tu_fmt("%s/notes.txt", out);
    assert_int_equal(mkdir(out, 0777), 0);
    assert_int_equal(tu_write_file(notes, "mine", 4), 0);
    fmt_atomic_dir *d = NULL;
    mc_error e;
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_ERR_INVALID_ARG);
    assert_null(d);
    assert_non_null(strstr(e.message, FMT_OUTPUT_MARKER));
    assert_file_is(notes, "mine");
    assert_int_equal(tu_count_entries(root), 1); /* no temp either */
    assert_int_equal(unlink(notes), 0);
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_OK);
    assert_int_equal(fmt_atomic_dir_commit(d, &e), MC_OK);
    char *mark = tu_fmt("%s/" FMT_OUTPUT_MARKER, out);
    assert_true(tu_exists(mark)); /* so the next run may replace it */
    free(mark);
    free(notes);
    tu_rmtree(root);
    free(out);
    free(root);
}

static void test_atomic_dir_refuses_to_replace_a_file(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *out = tu_fmt("%s/model", root);
    assert_int_equal(tu_write_file(out, "file", 4), 0);
    fmt_atomic_dir *d = NULL;
    mc_error e;
    /* refused before anything is created (fmt_output_check_dir) */
    assert_int_equal(fmt_atomic_dir_create(out, &d, &e), MC_ERR_INVALID_ARG);
    assert_null(d);
    assert_non_null(strstr(e.message, "a regular file"));
    assert_file_is(out, "file");
    assert_int_equal(tu_count_entries(root), 1);
    tu_rmtree(root);
    free(out);
    free(root);
}

/* Fail each allocation in turn: no leak, no temp left, no crash. */
static void test_atomic_survives_each_failed_allocation(void **state)
{
    (void)state;
    char *root = tu_mkdtemp("atomic"), *p = tu_fmt("%s/f", root);
    char *out = tu_fmt("%s/d", root);
    for (long k = 0;; k++) {
        mc_alloc_fail_after(k);
        mc_error e;
        fmt_atomic_file *f = NULL;
        fmt_atomic_dir *d = NULL;
        mc_status st = fmt_atomic_create(p, &f, &e);
        if (st == MC_OK)
            st = fmt_atomic_write(f, "x", 1, &e);
        if (st == MC_OK) {
            st = fmt_atomic_commit(f, &e);
            f = NULL;
        }
        if (st == MC_OK)
            st = fmt_atomic_dir_create(out, &d, &e);
        if (st == MC_OK) {
            st = fmt_atomic_dir_commit(d, &e);
            d = NULL;
        }
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_atomic_abort(f);
        fmt_atomic_dir_abort(d);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
        assert_int_equal(count_temps(root), 0);
        assert_true(k < 1000);
    }
    tu_rmtree(root);
    free(p);
    free(out);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_atomic_commit_creates_file_with_contents),
        cmocka_unit_test(test_atomic_large_file_with_early_writeback_reads_back),
        cmocka_unit_test(test_atomic_temp_is_hidden_beside_target_with_pid),
        cmocka_unit_test(test_atomic_abort_keeps_previous_file),
        cmocka_unit_test(test_atomic_failing_write_keeps_previous_file_and_no_temp),
        cmocka_unit_test(test_atomic_create_in_missing_dir_names_path),
        cmocka_unit_test(test_atomic_sigint_removes_temp_file),
        cmocka_unit_test(test_atomic_sigterm_removes_temp_file),
        cmocka_unit_test(test_atomic_sighup_removes_temp_file),
        cmocka_unit_test(test_atomic_sigterm_removes_temp_dir_with_contents),
        cmocka_unit_test(test_atomic_sweep_removes_temp_of_killed_process),
        cmocka_unit_test(test_atomic_sweep_keeps_temps_of_live_processes),
        cmocka_unit_test(test_atomic_sweep_judges_only_its_own_place),
        cmocka_unit_test(test_atomic_dir_commit_creates_directory),
        cmocka_unit_test(test_atomic_dir_commit_replaces_previous_directory),
        cmocka_unit_test(test_atomic_dir_abort_keeps_previous_directory),
        cmocka_unit_test(test_atomic_dir_refuses_to_replace_a_file),
        cmocka_unit_test(test_atomic_dir_replaces_only_directories_it_wrote),
        cmocka_unit_test(test_atomic_survives_each_failed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

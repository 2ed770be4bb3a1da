/* test_mrun_jsonl.c - the real mrun binary on JSONL jobs (--input/--output):
 * a job of mixed lengths and kinds (generation greedy and seeded, label
 * scores, continuations, over-long requests with and without --truncate,
 * malformed and blank lines) gives the results of the same requests run
 * one by one; a job killed with SIGKILL at random points and resumed
 * gives a byte-identical file; SIGINT finishes the lines in flight; waves
 * and continuous batching write the same bytes; --metrics is rewritten
 * during the job; the progress line shows on a terminal only; an
 * existing output is not overwritten without --resume. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "json_lines.h"
#include "testutil.h"

static char *g_out, *g_err;

/* Run build/mrun with the printf-formatted arguments; stdout and stderr
 * into g_out and g_err.  Returns the exit status. */
#define mrun(...) tu_run_bin(&g_out, &g_err, "mrun", __VA_ARGS__)

/* The fixed flags of every run: a small plan so that requests share
 * steps and prompts are split into chunks. */
#define PLAN "--max-batch 3 --max-seq 96 --prefill-chunk 8 --threads 2"

static char *g_model;

/* Under ASan/UBSan (MC_UNDER_SANITIZER) mrun runs several times slower:
 * the jobs and the kill rounds shrink so the file stays within ctest's
 * timeout; the checks are the same. */
static size_t scaled(size_t n, size_t under_sanitizer)
{
    return getenv("MC_UNDER_SANITIZER") ? under_sanitizer : n;
}

static int setup(void **st)
{
    (void)st;
    g_model = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    free(g_model);
    free(g_out);
    free(g_err);
    return 0;
}

/* ---- the mixed job ----------------------------------------------------- */

typedef struct line {
    const char *kind;          /* "gen", "sample", "labels", "cont", "bad" */
    int32_t ids[100];
    size_t n;
    int max_new;
    uint64_t seed;
    int32_t cont[4];
    size_t n_cont;
} line;

static void ids_text(char *buf, size_t cap, const int32_t *ids, size_t n,
                     const char *sep)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? sep : "",
                              (int)ids[i]);
}

/* Lines of every kind, lengths 1..90 (some over the plan's max_seq 96 with
 * their new tokens), written to path as JSONL with blank and malformed
 * lines between.  Returns the number of lines in L (input line k+1 is
 * L[k]). */
static size_t write_mixed(const char *path, line *L, size_t cap)
{
    tu_rng g = {0xC0FFEEull};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    size_t n = 0;
    const char *kinds[] = {"gen", "sample", "labels", "gen", "cont",
                           "sample", "gen", "labels"};
    for (size_t k = 0; k < cap; k++) {
        line *l = &L[n++];
        memset(l, 0, sizeof *l);
        if (k % 9 == 4) {
            l->kind = k % 2 ? "bad" : "blank";
            fputs(k % 2 ? "{\"ids\": [1, 2,\n" : "   \n", f);
            continue;
        }
        l->kind = kinds[k % 8];
        l->n = 1 + tu_rng_u32(&g) % 90;
        for (size_t i = 0; i < l->n; i++)
            l->ids[i] = (int32_t)(tu_rng_u32(&g) % 256);
        l->max_new = 1 + (int)(tu_rng_u32(&g) % 24);
        l->seed = 77 + k;
        char ids[1024];
        ids_text(ids, sizeof ids, l->ids, l->n, ",");
        fprintf(f, "{\"id\": \"r%zu\", \"ids\": [%s]", k, ids);
        if (!strcmp(l->kind, "labels")) {
            fputs(", \"labels\": [3, 40, 77]", f);
        } else if (!strcmp(l->kind, "cont")) {
            l->n_cont = 3;
            for (size_t i = 0; i < 3; i++)
                l->cont[i] = (int32_t)(5 + 11 * i);
            fputs(", \"continuation\": [5, 16, 27]", f);
        } else {
            fprintf(f, ", \"max_new_tokens\": %d", l->max_new);
            if (!strcmp(l->kind, "sample"))
                fprintf(f, ", \"temperature\": 0.9, \"top_k\": 50, "
                           "\"seed\": %llu",
                        (unsigned long long)l->seed);
        }
        fputs("}\n", f);
    }
    fclose(f);
    return n;
}

static void assert_close(double a, double b)
{
    if (fabs(a - b) > 2e-6 * fabs(b) + 1e-6)
        fail_msg("%.9g != %.9g", a, b);
}

/* Line l run alone with the one-prompt options; its result line o. */
static void check_one_by_one(const line *l, const json_t *o,
                             const char *trunc)
{
    char ids[1024];
    ids_text(ids, sizeof ids, l->ids, l->n, " ");
    int over = !strcmp(l->kind, "labels")  ? l->n > 96
               : !strcmp(l->kind, "cont") ? l->n + l->n_cont > 96
                                          : l->n + (size_t)l->max_new > 96;
    int rc;
    if (!strcmp(l->kind, "labels"))
        rc = mrun("%s --tokens '%s' --score-labels '3 40 77' %s %s --json",
                  g_model, ids, PLAN, trunc);
    else if (!strcmp(l->kind, "cont"))
        rc = mrun("%s --tokens '%s' --score-continuation '5 16 27' %s %s "
                  "--json", g_model, ids, PLAN, trunc);
    else {
        char samp[96] = "";
        if (!strcmp(l->kind, "sample"))
            snprintf(samp, sizeof samp,
                     "--temperature 0.9 --top-k 50 --seed %llu",
                     (unsigned long long)l->seed);
        rc = mrun("%s --tokens '%s' --max-new-tokens %d %s %s %s --json",
                  g_model, ids, l->max_new, PLAN, trunc, samp);
    }
    const json_t *err = json_object_get(o, "error");
    if (over && !*trunc) {
        assert_int_equal(rc, 1);
        assert_non_null(err);
        assert_non_null(strstr(json_string_value(err), "max_seq 96"));
        assert_int_equal(json_integer_value(json_object_get(o, "max_seq")),
                         96);
        return;
    }
    assert_int_equal(rc, 0);
    assert_null(err);
    json_error_t je;
    json_t *one = json_loads(g_out, 0, &je);
    assert_non_null(one);
    if (!strcmp(l->kind, "labels")) {
        const json_t *a = json_object_get(
            json_array_get(json_object_get(one, "scores"), 0), "labels");
        const json_t *b = json_object_get(o, "labels");
        assert_int_equal(json_array_size(b), 3);
        size_t best = 0;
        for (size_t j = 0; j < 3; j++) {
            double x = json_number_value(
                json_object_get(json_array_get(a, j), "logprob"));
            double y = json_number_value(
                json_object_get(json_array_get(b, j), "logprob"));
            assert_close(y, x);
            if (y > json_number_value(json_object_get(
                        json_array_get(b, best), "logprob")))
                best = j;
        }
        assert_true(json_equal(json_object_get(o, "label"),
                               json_object_get(json_array_get(b, best),
                                               "label")));
    } else if (!strcmp(l->kind, "cont")) {
        const json_t *s = json_array_get(json_object_get(one, "scores"), 0);
        const json_t *a = json_object_get(s, "logprobs");
        const json_t *b = json_object_get(o, "continuation_logprobs");
        for (size_t j = 0; j < 3; j++)
            assert_close(json_number_value(json_array_get(b, j)),
                         json_number_value(json_array_get(a, j)));
        assert_close(json_number_value(json_object_get(o,
                                                       "continuation_sum")),
                     json_number_value(json_object_get(s, "sum")));
    } else {
        const json_t *s = json_array_get(json_object_get(one, "sequences"),
                                         0);
        assert_true(json_equal(json_object_get(s, "ids"),
                               json_object_get(o, "ids")));
        assert_int_equal(json_array_size(json_object_get(o, "ids")),
                         json_integer_value(json_object_get(
                             o, "generated_tokens")));
        assert_string_equal(json_string_value(json_object_get(
                                s, "stop_reason")),
                            json_string_value(json_object_get(
                                o, "stop_reason")));
        assert_int_equal(json_integer_value(json_object_get(
                             s, "prompt_tokens")),
                         json_integer_value(json_object_get(
                             o, "prompt_tokens")));
    }
    json_decref(one);
}

static void run_mixed(const char *trunc)
{
    char *dir = tu_mkdtemp("jsonl-mixed");
    char *in = tu_fmt("%s/in.jsonl", dir), *out = tu_fmt("%s/out.jsonl", dir);
    static line L[40];
    size_t nl = write_mixed(in, L, scaled(40, 20));
    int rc = mrun("%s --input %s --output %s %s %s", g_model, in, out, PLAN,
                  trunc);
    size_t n;
    json_t **o = tu_json_lines(out, &n);
    size_t k = 0, bad = 0, over = 0;
    for (size_t i = 0; i < nl; i++) {
        if (!strcmp(L[i].kind, "blank"))
            continue; /* no output line */
        assert_true(k < n);
        assert_int_equal(json_integer_value(json_object_get(o[k], "line")),
                         i + 1);
        if (!strcmp(L[i].kind, "bad")) {
            const char *e = json_string_value(json_object_get(o[k], "error"));
            char *want = tu_fmt("line %zu: not JSON", i + 1);
            assert_non_null(e);
            assert_non_null(strstr(e, want));
            free(want);
            bad++;
        } else {
            char id[32];
            snprintf(id, sizeof id, "r%zu", i);
            assert_string_equal(json_string_value(json_object_get(o[k], "id")),
                                id);
            over += json_object_get(o[k], "error") != NULL;
            check_one_by_one(&L[i], o[k], trunc);
        }
        k++;
    }
    assert_int_equal(k, n);
    assert_true(bad > 0);
    assert_true(*trunc ? over == 0 : over > 0);
    /* Some line failed: exit 1, and stderr says how many and why. */
    assert_int_equal(rc, 1);
    tu_json_lines_free(o, n);
    tu_rmtree(dir);
    free(in);
    free(out);
    free(dir);
}

static void test_jsonl_mixed_job_equals_requests_one_by_one(void **st)
{
    (void)st;
    run_mixed("");
}

static void test_jsonl_overlong_with_truncate_equals_one_by_one(void **st)
{
    (void)st;
    run_mixed("--truncate left");
}

/* ---- kills and resumes ---------------------------------------------------- */

/* A job of n lines of mixed kinds (default-seeded sampling among them). */
static void write_long_job(const char *path, size_t n)
{
    tu_rng g = {0xBADC0DEull};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t k = 0; k < n; k++) {
        size_t len = 1 + tu_rng_u32(&g) % 60;
        fprintf(f, "{\"ids\": [");
        for (size_t i = 0; i < len; i++)
            fprintf(f, "%s%u", i ? "," : "", tu_rng_u32(&g) % 256);
        if (k % 4 == 3)
            fprintf(f, "], \"labels\": [3, [9, 40, 7]]}\n");
        else
            fprintf(f, "], \"max_new_tokens\": %u%s}\n",
                    1 + tu_rng_u32(&g) % 30,
                    k % 2 ? ", \"temperature\": 1.0" : "");
        if (k % 50 == 17)
            fputs("{oops\n", f);
    }
    fclose(f);
}

/* Start mrun on the job in the background; SIGKILL it after us
 * microseconds (unless it ended), or, with us < 0, as soon as out holds
 * more than its size at the start (the job is then surely mid-way, however
 * loaded the machine is).  Returns 1 if it was killed. */
static int run_and_kill(const char *in, const char *out, int resume,
                        long us)
{
    struct stat sb;
    off_t start = stat(out, &sb) == 0 ? sb.st_size : 0;
    char *bin = tu_fmt("%s/mrun", MC_BIN_DIR);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        execl(bin, bin, g_model, "--input", in, "--output", out,
              "--max-batch", "3", "--max-seq", "96", "--prefill-chunk", "8",
              "--threads", "2", "--temperature", "0", "--seed", "5",
              resume ? "--resume" : "-q", (char *)NULL);
        _exit(127);
    }
    int status = 0, reaped = 0;
    if (us >= 0) {
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    } else {
        const struct timespec ms = {0, 1000000};
        while (!(reaped = waitpid(pid, &status, WNOHANG) == pid) &&
               !(stat(out, &sb) == 0 && sb.st_size > start))
            nanosleep(&ms, NULL);
    }
    if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    free(bin);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

static void test_jsonl_sigkill_then_resume_is_byte_identical(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("jsonl-kill");
    char *in = tu_fmt("%s/in.jsonl", dir), *ref = tu_fmt("%s/ref.jsonl", dir),
         *out = tu_fmt("%s/out.jsonl", dir);
    write_long_job(in, scaled(160, 60));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN " --seed 5 -q",
                          g_model, in, ref),
                     1); /* the "{oops" lines */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long run_us = (t1.tv_sec - t0.tv_sec) * 1000000L +
                  (t1.tv_nsec - t0.tv_nsec) / 1000;
    size_t ref_len;
    char *want = tu_read_file(ref, &ref_len);
    assert_non_null(want);
    tu_rng g = {0x5EEDull};
    int kills = 0;
    for (int round = 0; round < (int)scaled(6, 2); round++) {
        unlink(out);
        /* Up to three kills at random points of the run, each followed
         * by a resume that may itself be killed. */
        int k = 1 + (int)(tu_rng_u32(&g) % 3);
        /* Round 0's first kill waits for the first output line: the
         * random times alone may all fall after the job's end when the
         * machine is busier than during the reference run. */
        for (int i = 0; i < k; i++)
            kills += run_and_kill(in, out, i > 0,
                                  round == 0 && i == 0
                                      ? -1
                                      : (long)(tu_rng_u32(&g) %
                                               (uint32_t)run_us));
        assert_int_equal(mrun("%s --input %s --output %s " PLAN
                              " --seed 5 --resume", g_model, in, out),
                         1);
        size_t got_len = 0;
        char *got = tu_read_file(out, &got_len);
        if (!got || got_len != ref_len)
            printf("[  INFO    ] round %d (%d kills): %zu of %zu bytes; the "
                   "resume said:\n%s\n", round, k, got_len, ref_len,
                   g_err ? g_err : "");
        free(got);
        assert_true(tu_file_is(out, want, ref_len));
    }
    printf("[  INFO    ] %d of the runs were killed mid-job (run %.2f s)\n",
           kills, run_us / 1e6);
    assert_true(kills > 0);
    /* A partial last line (a write cut short) is dropped on resume. */
    size_t half = ref_len / 2;
    assert_int_equal(tu_write_file(out, want, half), 0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN
                          " --seed 5 --resume", g_model, in, out),
                     1);
    assert_non_null(strstr(g_err, "dropped a partial last line"));
    assert_true(tu_file_is(out, want, ref_len));
    /* So is a partial FIRST line, the start of one of ours ... */
    assert_int_equal(tu_write_file(out, want, 9), 0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN
                          " --seed 5 --resume", g_model, in, out),
                     1);
    assert_true(tu_file_is(out, want, ref_len));
    /* ... but a file with no newline that does not start as our lines do
     * is the user's: refused, untouched. */
    assert_int_equal(tu_write_file(out, "my notes", 8), 0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN
                          " --seed 5 --resume", g_model, in, out),
                     1);
    assert_non_null(strstr(g_err, "did not write"));
    assert_true(tu_file_is(out, "my notes", 8));
    /* a zero-filled tail (a crash on some file systems) is cut */
    assert_int_equal(tu_write_file(out, "\0\0\0\0\0\0\0\0", 8), 0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN
                          " --seed 5 --resume", g_model, in, out),
                     1);
    assert_true(tu_file_is(out, want, ref_len));
    /* An empty output (killed between its creation and the first line)
     * resumes as a fresh run. */
    assert_int_equal(tu_write_file(out, "", 0), 0);
    assert_int_equal(mrun("%s --input %s --output %s " PLAN
                          " --seed 5 --resume", g_model, in, out),
                     1);
    assert_true(tu_file_is(out, want, ref_len));
    /* Without --resume an existing output is not touched. */
    assert_int_equal(mrun("%s --input %s --output %s " PLAN, g_model, in,
                          out),
                     2);
    assert_non_null(strstr(g_err, "--resume"));
    /* Waves write the same bytes. */
    assert_int_equal(mrun("%s --input %s --output %s/w.jsonl " PLAN
                          " --seed 5 -q --schedule waves", g_model, in, dir),
                     1);
    char *wp = tu_fmt("%s/w.jsonl", dir);
    assert_true(tu_file_is(wp, want, ref_len));
    free(wp);
    free(want);
    tu_rmtree(dir);
    free(in);
    free(ref);
    free(out);
    free(dir);
}

static void test_jsonl_sigint_finishes_lines_in_flight(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("jsonl-int");
    char *in = tu_fmt("%s/in.jsonl", dir), *out = tu_fmt("%s/out.jsonl", dir),
         *ref = tu_fmt("%s/ref.jsonl", dir);
    write_long_job(in, scaled(400, 150));
    assert_int_equal(mrun("%s --input %s --output %s " PLAN " -q", g_model,
                          in, ref),
                     1);
    /* SIGINT shortly after the start: mrun reports and exits 1 with
     * complete lines only. */
    char *cmd = tu_fmt("%s/mrun %s --input %s --output %s " PLAN
                       " & p=$!; sleep 0.3; kill -INT $p; wait $p",
                       MC_BIN_DIR, g_model, in, out);
    char *o = NULL, *e = NULL;
    int rc = tu_run(cmd, &o, &e);
    assert_int_equal(rc, 1);
    size_t len, ref_len;
    char *got = tu_read_file(out, &len);
    char *want = tu_read_file(ref, &ref_len);
    if (strstr(e, "interrupted")) {
        assert_true(len < ref_len);
        assert_non_null(strstr(e, "--resume"));
    }
    assert_true(len == 0 || got[len - 1] == '\n');
    assert_memory_equal(got, want, len); /* a prefix of the full output */
    assert_int_equal(mrun("%s --input %s --output %s " PLAN " --resume -q",
                          g_model, in, out),
                     1);
    free(got);
    assert_true(tu_file_is(out, want, ref_len));
    free(want);
    free(o);
    free(e);
    free(cmd);
    tu_rmtree(dir);
    free(in);
    free(out);
    free(ref);
    free(dir);
}

/* --metrics is rewritten during the job (every 2 s), not only at the end:
 * the file appears, with requests served, while mrun still runs. */
static void test_jsonl_metrics_written_during_the_job(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("jsonl-metrics");
    char *in = tu_fmt("%s/in.jsonl", dir), *out = tu_fmt("%s/out.jsonl", dir),
         *met = tu_fmt("%s/m.prom", dir), *bin = tu_fmt("%s/mrun", MC_BIN_DIR);
    write_long_job(in, 20000); /* far longer than 2 s */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(bin, bin, g_model, "--input", in, "--output", out,
              "--metrics", met, "--max-batch", "3", "--threads", "1", "-q",
              (char *)NULL);
        _exit(127);
    }
    int seen = 0, status;
    for (int i = 0; i < 1200 && !seen; i++) { /* up to 60 s */
        usleep(50000);
        assert_int_equal(waitpid(pid, &status, WNOHANG), 0); /* running */
        seen = tu_exists(met);
    }
    assert_true(seen);
    size_t len;
    char *m = tu_read_file(met, &len);
    assert_non_null(m);
    assert_non_null(strstr(m, "mcompile_requests_served_total "));
    assert_null(strstr(m, "mcompile_requests_served_total 0\n"));
    free(m);
    kill(pid, SIGINT);
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    tu_rmtree(dir);
    free(in);
    free(out);
    free(met);
    free(bin);
    free(dir);
}

/* The progress line: on a terminal only (script(1) gives mrun a pty). */
static void test_jsonl_progress_only_on_a_terminal(void **st)
{
    (void)st;
    TU_SKIP_IF(!tu_exists("/usr/bin/script"), "no script(1) to make a pty");
    char *dir = tu_mkdtemp("jsonl-tty");
    char *in = tu_fmt("%s/in.jsonl", dir);
    write_long_job(in, 40);
    char *cmd = tu_fmt("script -qec '%s/mrun %s --input %s --output %s/o1 "
                       PLAN "' /dev/null",
                       MC_BIN_DIR, g_model, in, dir);
    char *o = NULL;
    assert_int_equal(tu_run(cmd, &o, NULL), 1); /* the "{oops" line */
    assert_non_null(strstr(o, "\rmrun: 41/41 lines (1 failed)"));
    assert_non_null(strstr(o, "ETA"));
    assert_non_null(strstr(o, "slots"));
    free(o);
    /* Not a terminal: no progress line, only the summary. */
    assert_int_equal(mrun("%s --input %s --output %s/o2 " PLAN, g_model, in,
                          dir),
                     1);
    assert_null(strchr(g_err, '\r'));
    assert_non_null(strstr(g_err, "41 lines written (1 failed"));
    free(cmd);
    tu_rmtree(dir);
    free(in);
    free(dir);
}

static void test_jsonl_usage_errors(void **st)
{
    (void)st;
    assert_int_equal(mrun("%s --input /dev/null", g_model), 2);
    assert_int_equal(mrun("%s --input x --output y --tokens 1", g_model), 2);
    assert_int_equal(mrun("%s --input x --output - --resume", g_model), 2);
    assert_int_equal(mrun("%s --input x --output y --schedule fast", g_model),
                     2);
    char *dir = tu_mkdtemp("jsonl-usage");
    char *in = tu_fmt("%s/in.jsonl", dir);
    assert_int_equal(tu_write_file(in, "{\"ids\":[1]}\n", 12), 0);
    /* The output guard (fmt_input.h): an input is never an output, exit 1
     * with the input untouched, as for every other output path. */
    assert_int_equal(mrun("%s --input %s --output %s", g_model, in, in), 1);
    assert_non_null(strstr(g_err, "--output"));
    assert_true(tu_file_is(in, "{\"ids\":[1]}\n", 12));
    /* stdin to stdout */
    char *cmd = tu_fmt("printf '{\"ids\":[1,2],\"max_new_tokens\":2}\\n' | "
                       "%s/mrun %s --input - --output - -q",
                       MC_BIN_DIR, g_model);
    char *o = NULL;
    assert_int_equal(tu_run(cmd, &o, NULL), 0);
    assert_non_null(strstr(o, "\"id\":1,\"line\":1,\"prompt_tokens\":2,"
                              "\"generated_tokens\":2"));
    free(o);
    free(cmd);
    tu_rmtree(dir);
    free(in);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_mixed_job_equals_requests_one_by_one),
        cmocka_unit_test(test_jsonl_overlong_with_truncate_equals_one_by_one),
        cmocka_unit_test(test_jsonl_sigkill_then_resume_is_byte_identical),
        cmocka_unit_test(test_jsonl_sigint_finishes_lines_in_flight),
        cmocka_unit_test(test_jsonl_metrics_written_during_the_job),
        cmocka_unit_test(test_jsonl_progress_only_on_a_terminal),
        cmocka_unit_test(test_jsonl_usage_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

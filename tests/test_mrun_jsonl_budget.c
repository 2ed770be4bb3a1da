/* test_mrun_jsonl_budget.c - the dataset job's byte budget (rt_plan.h
 * rt_job_budget; mrun --max-line-bytes, --hold-bytes), on the real mrun:
 * a line over the cap is an error line under its line number and the job
 * goes on; a line whose JSON does not fit the parse scratch likewise; the
 * output is byte-identical whatever the hold budget (a budget of 1 byte
 * makes reading wait for every write), and so is a resumed job; a job of
 * long lines peaks within its plan (session + job buffers); a budget that
 * does not fit the artifact's target is refused at start, and so is a
 * --resume table of ids too large for what the target leaves; the stop
 * strings' token table likewise fails its lines when it does not fit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "rt_plan.h"
#include "testutil.h"
#include "tok_fixture.h"

static char *g_out, *g_err;

#define mrun(...) tu_run_bin(&g_out, &g_err, "mrun", __VA_ARGS__)

/* A small plan, so that lines share steps and prompts run in chunks. */
#define PLAN "--max-batch 3 --max-seq 96 --prefill-chunk 8 --threads 2"

static char *g_model;

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

/* n comma-separated ids drawn from g (< 256), into f. */
static void put_ids(FILE *f, tu_rng *g, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? ",%u" : "%u", tu_rng_u32(g) % 256);
}

/* A job of every kind: greedy and seeded generation, labels of one and
 * several tokens, a continuation, a stop token, over the plan, malformed
 * and blank lines.  Returns the number of output lines. */
static size_t write_mixed(const char *path, size_t n)
{
    tu_rng g = {0xB0D6E7ull};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    size_t out = 0;
    for (size_t k = 0; k < n; k++, out++) {
        switch (k % 9) {
        case 7:
            fputs("{\"ids\": [1, 2,\n", f); /* not JSON */
            continue;
        case 8:
            fputs("  \n", f); /* blank: no output line */
            out--;
            continue;
        default:
            break;
        }
        fprintf(f, "{\"id\": \"r%zu\", \"ids\": [", k);
        put_ids(f, &g, 1 + tu_rng_u32(&g) % 80);
        fputs("]", f);
        if (k % 9 == 2)
            fputs(", \"labels\": [3, [40, 41], 77]", f);
        else if (k % 9 == 4)
            fputs(", \"continuation\": [5, 16, 27]", f);
        else if (k % 9 == 5)
            fprintf(f, ", \"max_new_tokens\": 24, \"temperature\": 0.9, "
                       "\"seed\": %zu", k);
        else
            fprintf(f, ", \"max_new_tokens\": %u, \"stop\": [7]",
                    1 + tu_rng_u32(&g) % 30);
        fputs("}\n", f);
    }
    fclose(f);
    return out;
}

/* The job in -> out with extra flags; returns mrun's exit status. */
static int run_job(const char *in, const char *out, const char *extra)
{
    remove(out);
    return mrun("%s " PLAN " --input %s --output %s %s", g_model, in, out,
                extra);
}

static char *slurp(const char *path, size_t *len)
{
    char *s = tu_read_file(path, len);
    assert_non_null(s);
    return s;
}

/* The k-th line (0-based) of s, as a new string without '\n'. */
static char *nth_line(const char *s, size_t k)
{
    for (; k > 0; k--) {
        s = strchr(s, '\n');
        assert_non_null(s);
        s++;
    }
    const char *e = strchr(s, '\n');
    assert_non_null(e);
    return tu_fmt("%.*s", (int)(e - s), s);
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* The number right after the first `key` in s: "held at most " in the
 * verbose summary, "\nmcompile_peak_rss_bytes " in the metrics,
 * "\"total_bytes\": " in a JSON report. */
static unsigned long long figure_after(const char *s, const char *key)
{
    const char *p = strstr(s, key);
    assert_non_null(p);
    return strtoull(p + strlen(key), NULL, 10);
}

/* ---- the formula ------------------------------------------------------- */

static void test_budget_formula_adds_its_terms_and_checks_ranges(void **st)
{
    (void)st;
    rt_job_budget b;
    mc_error err;
    assert_int_equal(rt_plan_job_budget(1 << 20, 4 << 20, 4096, &b, &err),
                     MC_OK);
    assert_int_equal(b.scratch_bytes, RT_JOB_SCRATCH_PER_LINE_BYTE << 20);
    assert_int_equal(b.one_line_bytes, RT_JOB_LINE_PER_LINE_BYTE * (1 << 20) +
                                           RT_JOB_LINE_PER_TOKEN * 4096 +
                                           RT_JOB_LINE_BASE);
    assert_int_equal(b.total_bytes, (1 << 20) + 1 + b.scratch_bytes +
                                        (4 << 20) + b.one_line_bytes);
    assert_int_equal(rt_plan_job_budget(RT_JOB_MIN_LINE_BYTES - 1, 1, 1, &b,
                                        &err),
                     MC_ERR_INVALID_ARG);
    assert_string_equal(err.field, "--max-line-bytes");
    assert_int_equal(rt_plan_job_budget(RT_JOB_MAX_LINE_BYTES + 1, 1, 1, &b,
                                        &err),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(rt_plan_job_budget(4096, 0, 1, &b, &err),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(rt_plan_job_budget(4096, UINT64_MAX - 10, 1, &b, &err),
                     MC_ERR_OVERFLOW);
    assert_int_equal(rt_plan_heap_chunk(1), 32);
    assert_int_equal(rt_plan_heap_chunk(24), 32);
    assert_int_equal(rt_plan_heap_chunk(25), 48);
    assert_int_equal(rt_plan_heap_chunk(4096), 4112);
    /* the options size a job's buffers: out of range or without a job,
     * a usage error */
    assert_int_equal(mrun("%s --tokens '1 2' --hold-bytes 5", g_model), 2);
    assert_non_null(strstr(g_err, "--input job"));
    assert_int_equal(mrun("%s --input x --output y --max-line-bytes 100",
                          g_model),
                     2);
    assert_non_null(strstr(g_err, "--max-line-bytes"));
}

/* ---- long lines -------------------------------------------------------- */

/* Lines over --max-line-bytes (one in the middle, one last without its
 * '\n') get an error line under their line number; every other line gets
 * the bytes it gets when the cap lets the long lines in. */
static void test_budget_line_over_the_cap_is_an_error_line(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-long");
    char *in = tu_fmt("%s/in.jsonl", dir), *o1 = tu_fmt("%s/a.jsonl", dir),
         *o2 = tu_fmt("%s/b.jsonl", dir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs("{\"id\": \"a\", \"ids\": [1, 2, 3], \"max_new_tokens\": 5}\n", f);
    fputs("{\"id\": \"long\", \"ids\": [1], \"max_new_tokens\": 4, "
          "\"gold\": \"", f);
    for (int i = 0; i < 5000; i++)
        fputc('x', f);
    fputs("\"}\n", f);
    fputs("{\"id\": \"b\", \"ids\": [4, 5], \"labels\": [3, 9]}\n", f);
    fputs("{\"id\": \"c\", \"ids\": [6], \"max_new_tokens\": 3}\n", f);
    fputs("{\"id\": \"tail\", \"ids\": [", f);
    for (int i = 0; i < 2000; i++)
        fputs(i ? ",1" : "1", f);
    fputs("]}", f); /* no '\n' */
    fclose(f);
    assert_int_equal(run_job(in, o1, "--max-line-bytes 1024"), 1);
    assert_non_null(strstr(g_err, "input 2"));
    assert_int_equal(run_job(in, o2, ""), 1); /* "tail" is over max_seq */
    size_t l1, l2;
    char *a = slurp(o1, &l1), *b = slurp(o2, &l2);
    assert_int_equal(count_lines(a), 5);
    char *x = nth_line(a, 1);
    assert_string_equal(x, "{\"id\":2,\"line\":2,\"error\":\"line 2: 5059 "
                           "bytes, longer than --max-line-bytes 1024 "
                           "(skipped)\"}");
    free(x);
    x = nth_line(a, 4);
    assert_non_null(strstr(x, "{\"id\":5,\"line\":5,\"error\":\"line 5: 4024 "
                              "bytes, longer than"));
    free(x);
    for (size_t k = 0; k < 5; k++) {
        char *p = nth_line(a, k), *q = nth_line(b, k);
        if (k != 1 && k != 4)
            assert_string_equal(p, q);
        else
            assert_string_not_equal(p, q); /* read when the cap allows */
        free(p);
        free(q);
    }
    free(a);
    free(b);
    tu_rmtree(dir);
    free(in);
    free(o1);
    free(o2);
    free(dir);
}

/* A line within the cap whose JSON tree needs more than the parse
 * scratch (an array of empty objects: ~77 bytes of tree per byte) is an
 * error line too, and the next line is served. */
static void test_budget_parse_scratch_overflow_is_an_error_line(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-scratch");
    char *in = tu_fmt("%s/in.jsonl", dir), *out = tu_fmt("%s/o.jsonl", dir);
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    fputs("{\"id\": \"tree\", \"ids\": [1], \"meta\": [", f);
    for (int i = 0; i < 1300; i++)
        fputs(i ? ",{}" : "{}", f);
    fputs("]}\n{\"id\": \"next\", \"ids\": [1, 2], \"max_new_tokens\": 2}\n",
          f);
    fclose(f);
    assert_int_equal(run_job(in, out, "--max-line-bytes 4096"), 1);
    size_t len;
    char *s = slurp(out, &len);
    char *x = nth_line(s, 0);
    assert_non_null(strstr(x, "{\"id\":1,\"line\":1,\"error\":\"line 1: its "
                              "JSON (3937 bytes) needs more than the job's "
                              "parse scratch of 65536 bytes"));
    free(x);
    x = nth_line(s, 1);
    assert_non_null(strstr(x, "{\"id\":\"next\",\"line\":2,\"prompt_tokens\""));
    free(x);
    /* With room for its tree, the same line is served. */
    assert_int_equal(run_job(in, out, "--max-line-bytes 65536"), 0);
    free(s);
    tu_rmtree(dir);
    free(in);
    free(out);
    free(dir);
}

/* ---- back-pressure ------------------------------------------------------ */

/* The held lines' budget changes when lines are read, never what they
 * give: 1 byte (every line waits for the one before to be written), a
 * few lines' worth and the default write the same bytes, waves too. */
static void test_budget_tiny_hold_gives_identical_bytes(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-hold");
    char *in = tu_fmt("%s/in.jsonl", dir), *ref = tu_fmt("%s/r.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir);
    size_t n = write_mixed(in, 60);
    assert_int_equal(run_job(in, ref, "-v"), 1); /* malformed lines */
    unsigned long long waits = figure_after(g_err, "reading waited ");
    assert_int_equal(waits, 0);
    size_t rl;
    char *want = slurp(ref, &rl);
    assert_int_equal(count_lines(want), n);
    const char *flags[] = {"--hold-bytes 1 -v", "--hold-bytes 6000 -v",
                           "--hold-bytes 1 --schedule waves -v"};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(run_job(in, out, flags[i]), 1);
        assert_true(tu_file_is(out, want, rl));
        unsigned long long held = figure_after(g_err, "held at most "),
                           one = figure_after(g_err, "one line ");
        unsigned long long hold = strtoull(flags[i] + 13, NULL, 10);
        printf("%s: held at most %llu bytes, waited %llu times\n", flags[i],
               held, figure_after(g_err, "reading waited "));
        assert_true(figure_after(g_err, "reading waited ") > 0);
        assert_true(held > 0 && held < hold + one);
        if (hold == 1) /* one line at a time: at most one line's bytes */
            assert_true(held <= one);
    }
    free(want);
    tu_rmtree(dir);
    free(in);
    free(ref);
    free(out);
    free(dir);
}

/* A job cut after k lines (and half of the next, as a crash leaves it)
 * and resumed under a 1-byte budget ends byte-identical. */
static void test_budget_resume_is_byte_identical(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-resume");
    char *in = tu_fmt("%s/in.jsonl", dir), *ref = tu_fmt("%s/r.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir);
    write_mixed(in, 40);
    assert_int_equal(run_job(in, ref, "--hold-bytes 1"), 1);
    size_t rl;
    char *want = slurp(ref, &rl);
    const size_t cuts[] = {0, 1, 7, 20, 33};
    for (size_t i = 0; i < 5; i++) {
        /* the first cuts[i] lines, then half of the next one */
        const char *p = want;
        for (size_t k = 0; k < cuts[i]; k++)
            p = strchr(p, '\n') + 1;
        size_t keep = (size_t)(p - want) +
                      (size_t)(strchr(p, '\n') - p) / 2;
        assert_int_equal(tu_write_file(out, want, keep), 0);
        assert_int_equal(mrun("%s " PLAN " --input %s --output %s --resume "
                              "--hold-bytes 1 -q",
                              g_model, in, out),
                         1); /* the malformed lines failed */
        assert_true(tu_file_is(out, want, rl));
    }
    free(want);
    tu_rmtree(dir);
    free(in);
    free(ref);
    free(out);
    free(dir);
}

/* ---- the plan ----------------------------------------------------------- */

/* A job of long lines (prompts near the cap, truncated to the plan,
 * long generations, labels) on a compiled artifact peaks within its plan:
 * the artifact's total plus the job's buffers, which the metrics report
 * as the planned bytes. */
static void test_budget_long_lines_peak_within_the_plan(void **st)
{
    (void)st;
    TU_SKIP_IF(getenv("MC_UNDER_SANITIZER") != NULL,
               "sanitizer runtimes add shadow memory to the RSS");
    char *dir = tu_mkdtemp("budget-rss");
    char *art = tu_fmt("%s/m.mca", dir), *in = tu_fmt("%s/in.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir), *met = tu_fmt("%s/m.prom", dir);
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "%s --target 64MiB --quant int8 --max-batch 4 "
                                "--max-seq 256 --threads 2 -q -o %s",
                                g_model, art),
                     0);
    tu_rng g = {0x5EEDull};
    FILE *f = fopen(in, "w");
    assert_non_null(f);
    for (int k = 0; k < 24; k++) {
        fprintf(f, "{\"id\": %d, \"ids\": [", k);
        put_ids(f, &g, 2000 + tu_rng_u32(&g) % 12000); /* 8-56 KB */
        if (k % 4 == 3)
            fputs("], \"labels\": [3, [40, 41, 42], 77]}\n", f);
        else
            fprintf(f, "], \"max_new_tokens\": %u}\n",
                    100 + tu_rng_u32(&g) % 155);
    }
    fclose(f);
    assert_int_equal(mrun("%s --input %s --output %s --metrics %s --truncate "
                          "left --max-line-bytes 65536 --hold-bytes 65536 "
                          "--threads 2 -q",
                          art, in, out, met),
                     0);
    size_t len;
    char *m = slurp(met, &len);
    unsigned long long planned = figure_after(m, "\nmcompile_planned_bytes "),
                       peak = figure_after(m, "\nmcompile_peak_rss_bytes ");
    /* planned = the artifact's total + the job's budget */
    assert_int_equal(mrun("%s --tokens '1 2' --max-new-tokens 1 --json -q",
                          art),
                     0);
    const char *p = strstr(g_out, "\"planned_bytes\": ");
    assert_non_null(p);
    unsigned long long session = strtoull(p + 17, NULL, 10);
    rt_job_budget b;
    assert_int_equal(rt_plan_job_budget(65536, 65536, 256, &b, NULL), MC_OK);
    assert_int_equal(planned, session + b.total_bytes);
    /* --json shows what a job adds with the defaults, and the target */
    rt_job_budget d;
    assert_int_equal(rt_plan_job_budget(RT_JOB_DEFAULT_LINE_BYTES,
                                        RT_JOB_DEFAULT_HOLD_BYTES, 256, &d,
                                        NULL),
                     MC_OK);
    char *want = tu_fmt("\"job_bytes\": %llu, \"target_bytes\": %llu, ",
                        (unsigned long long)d.total_bytes, 64ull << 20);
    assert_non_null(strstr(g_out, want));
    free(want);
    printf("long-line job: peak RSS %llu of planned %llu (session %llu + "
           "job %llu): %.3f\n",
           peak, planned, session, (unsigned long long)b.total_bytes,
           (double)peak / (double)planned);
    assert_true(peak <= planned);
    free(m);
    tu_rmtree(dir);
    free(art);
    free(in);
    free(out);
    free(met);
    free(dir);
}

/* mcompile plans the default job inside --target and shows it; a job
 * whose options need more than the target leaves is refused at start
 * (exit 2, nothing written). */
static void test_budget_that_does_not_fit_the_target_is_refused(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-target");
    char *art = tu_fmt("%s/m.mca", dir), *in = tu_fmt("%s/in.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir);
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "plan %s --target 64MiB --max-batch 2 "
                                "--max-seq 64",
                                g_model),
                     0);
    assert_non_null(strstr(g_out, "  dataset job "));
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "%s --target 64MiB --max-batch 2 --max-seq 64 "
                                "--threads 2 -q -o %s",
                                g_model, art),
                     0);
    assert_int_equal(tu_write_file(in, "{\"ids\": [1, 2]}\n", 16), 0);
    assert_int_equal(mrun("%s --input %s --output %s -q", art, in, out), 0);
    remove(out);
    assert_int_equal(mrun("%s --input %s --output %s --hold-bytes 100000000 "
                          "-q",
                          art, in, out),
                     2);
    assert_non_null(strstr(g_err, "do not fit the plan"));
    assert_non_null(strstr(g_err, "target 67108864"));
    assert_false(tu_exists(out));
    /* A target too small for the default job is refused by the planner. */
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "plan %s --target 12MiB --max-batch 2 "
                                "--max-seq 64",
                                g_model),
                     1);
    assert_non_null(strstr(g_err, "dataset job"));
    tu_rmtree(dir);
    free(art);
    free(in);
    free(out);
    free(dir);
}

/* The bytes model's plan at 2 x 64 (2 threads) needs with the default
 * job's buffers: a target of exactly that leaves nothing to spare. */
static unsigned long long session_and_job(const char *model)
{
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "plan %s --target 64MiB --max-batch 2 "
                                "--max-seq 64 --threads 2 --json",
                                model),
                     0);
    return figure_after(g_out, "\"total_bytes\": ") +
           figure_after(g_out, "\"job_bytes\": ");
}

/* The --resume table (the ids already written) joins the job's plan: on
 * an artifact whose target leaves 1 MiB beside the session and the
 * default job, a table of 40,000 ids (~1.8 MB) is refused, one of 50
 * is not. */
static void test_budget_resume_table_counts_in_the_plan(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-table");
    char *art = tu_fmt("%s/m.mca", dir), *in = tu_fmt("%s/in.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir);
    unsigned long long target = session_and_job(g_model) + (1 << 20);
    assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                "%s --target %llu --max-batch 2 --max-seq 64 "
                                "--threads 2 -q -o %s",
                                g_model, target, art),
                     0);
    for (int big = 1; big >= 0; big--) {
        size_t n = big ? 40000 : 50;
        FILE *fi = fopen(in, "w"), *fo = fopen(out, "w");
        assert_non_null(fi);
        assert_non_null(fo);
        for (size_t k = 1; k <= n + 1; k++) {
            fprintf(fi, "{\"id\": \"line-%zu\", \"ids\": [1, 2], "
                        "\"max_new_tokens\": 1}\n", k);
            if (k <= n) /* every line but the last is already written */
                fprintf(fo, "{\"id\":\"line-%zu\",\"line\":%zu,"
                            "\"prompt_tokens\":2}\n", k, k);
        }
        fclose(fi);
        fclose(fo);
        int rc = mrun("%s --input %s --output %s --resume --threads 2 -q",
                      art, in, out);
        if (big) {
            assert_int_equal(rc, 2);
            assert_non_null(strstr(g_err, "the ids of the 40000 lines "
                                          "already written take "));
        } else {
            assert_int_equal(rc, 0);
            size_t len;
            char *s = slurp(out, &len);
            assert_int_equal(count_lines(s), n + 1);
            free(s);
        }
    }
    tu_rmtree(dir);
    free(art);
    free(in);
    free(out);
    free(dir);
}

/* Stop strings need a table of every token's text, built at the first
 * line that has them: its bytes join the job's plan.  On an artifact
 * (with a tokenizer) whose target leaves 512 bytes beside the session
 * and the default job, a stop-string line is an error line naming the
 * table, and lines without stop strings are served; with 1 MiB left,
 * the same line is served. */
static void test_budget_stop_string_table_counts_in_the_plan(void **st)
{
    (void)st;
    char *dir = tu_mkdtemp("budget-stop"), *model = tu_fmt("%s/model", dir);
    char *art = tu_fmt("%s/m.mca", dir), *in = tu_fmt("%s/in.jsonl", dir),
         *out = tu_fmt("%s/o.jsonl", dir);
    assert_int_equal(mkdir(model, 0755), 0);
    const char *files[2] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *a = tu_fmt("%s/%s", g_model, files[i]);
        char *b = tu_fmt("%s/%s", model, files[i]);
        assert_int_equal(symlink(a, b), 0);
        free(a);
        free(b);
    }
    char *tok = tu_fmt("%s/tokenizer.json", model);
    tu_tiny_tokenizer_write(tok);
    free(tok);
    unsigned long long need = session_and_job(model);
    const char *job = "{\"id\": \"plain\", \"prompt\": \"ab ab\", "
                      "\"max_new_tokens\": 3}\n"
                      "{\"id\": \"stop\", \"prompt\": \"ab\", "
                      "\"max_new_tokens\": 8, \"stop\": [\"b\"]}\n";
    assert_int_equal(tu_write_file(in, job, strlen(job)), 0);
    for (int room = 0; room < 2; room++) {
        assert_int_equal(tu_run_bin(&g_out, &g_err, "mcompile",
                                    "%s --target %llu --max-batch 2 "
                                    "--max-seq 64 --threads 2 -q -o %s",
                                    model, need + (room ? 1 << 20 : 512),
                                    art),
                         0);
        remove(out);
        assert_int_equal(mrun("%s --input %s --output %s --threads 2 -q",
                              art, in, out),
                         room ? 0 : 1);
        size_t len;
        char *s = slurp(out, &len);
        char *a = nth_line(s, 0), *b = nth_line(s, 1);
        assert_non_null(strstr(a, "\"id\":\"plain\",\"line\":1,"
                                  "\"prompt_tokens\""));
        if (room)
            assert_non_null(strstr(b, "\"stop_reason\""));
        else
            assert_non_null(strstr(b, "\"error\":\"line 2: stop strings "
                                      "need the token text table ("));
        free(a);
        free(b);
        free(s);
    }
    tu_rmtree(dir);
    free(model);
    free(art);
    free(in);
    free(out);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_formula_adds_its_terms_and_checks_ranges),
        cmocka_unit_test(test_budget_line_over_the_cap_is_an_error_line),
        cmocka_unit_test(test_budget_parse_scratch_overflow_is_an_error_line),
        cmocka_unit_test(test_budget_tiny_hold_gives_identical_bytes),
        cmocka_unit_test(test_budget_resume_is_byte_identical),
        cmocka_unit_test(test_budget_long_lines_peak_within_the_plan),
        cmocka_unit_test(test_budget_that_does_not_fit_the_target_is_refused),
        cmocka_unit_test(test_budget_resume_table_counts_in_the_plan),
        cmocka_unit_test(test_budget_stop_string_table_counts_in_the_plan),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

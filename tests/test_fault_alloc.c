/* test_fault_alloc.c - fail the N-th allocation, for every N (or an evenly
 * spread sample when a run makes many), over the operations a user runs:
 * open + validate a model (plain and sharded), parse config and adapters,
 * merge into a directory, compile an artifact, load it + create a session +
 * generate, load a tokenizer.
 *
 * For each operation a clean run first counts its allocations
 * (mc_alloc_count).  Then for each chosen N, mc_alloc_fail_after(N) makes
 * the N-th allocation and every later one fail, and the call must
 *   - return an error status (MC_ERR_NOMEM, or another clean error with a
 *     message), never crash;
 *   - leave no output and no temporary file in the output directory;
 *   - free everything it allocated: heap bytes in use (mallinfo2, or the
 *     sanitizer allocator's count under ASan) and open file descriptors are
 *     the same before and after the failed call;
 *   - finish: each point runs in a child process, so a crash or a hang
 *     (POINT_TIMEOUT_S) is reported with its N.
 * Each test has a wall-time budget; when an operation has more points than
 * fit, an even spread runs (see run_chaos).  MC_FA_EXHAUSTIVE=1 runs them
 * all; MC_FA_FILTER=<glob> selects tests.
 * The figures (allocations per clean run, points exercised, statuses seen)
 * are printed; docs/reliability.md quotes them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef MC_SANITIZE
/* From <sanitizer/allocator_interface.h> (not installed with every gcc). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#include "cmp_compile.h"
#include "cmp_merge.h"
#include "fmt_config.h"
#include "fmt_model.h"
#include "fmt_peft.h"
#include "fmt_safetensors.h"
#include "mc_alloc.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"
#include "rt_tokenizer.h"
#include "testutil.h"

/* MAX_POINTS: candidate points of one operation (all of [0, count) when
 * count is below it, else the first FIRST_ALL plus an even spread).
 * TEST_BUDGET_S: wall time of one test function, shared by its operations,
 * so that each stays under ~10 s normal and ~30 s under ASan and the whole
 * executable under ~1 min / ~3 min on the 2-core CI machine. */
#ifdef MC_SANITIZE
#define POINT_TIMEOUT_S 15   /* a point taking longer is a hang */
#define MAX_POINTS 1000
#define TEST_BUDGET_S 25.0
#else
#define POINT_TIMEOUT_S 5
#define MAX_POINTS 2000
#define TEST_BUDGET_S 8.0
#endif
#define FIRST_ALL 64

/* MC_FA_EXHAUSTIVE=1 in the environment: every point of every operation,
 * no time budget (for a one-off thorough run; minutes to hours). */
static size_t g_max_points = MAX_POINTS;
static double g_budget_scale = 1.0;
#define MIN_POINTS 48

/* ---- measurement -------------------------------------------------------- */

static size_t heap_in_use(void)
{
#ifdef MC_SANITIZE
    return __sanitizer_get_current_allocated_bytes();
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

static int open_fds(void)
{
    return tu_count_entries("/proc/self/fd");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Entries of dir whose name holds ".mctmp-" (our temporaries). */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".mctmp-"))
            n++;
    closedir(d);
    return n;
}

/* ---- the driver ----------------------------------------------------------- */

/* An operation under test: runs once, releases everything it opened, and
 * returns the first failing status (err filled).  outdir: a directory the
 * operation may write into (must be empty again after a failure). */
typedef mc_status (*op_fn)(void *ctx, const char *outdir, mc_error *err);

typedef struct chaos_stats {
    uint64_t allocs;      /* allocations of a clean run */
    size_t points;        /* points exercised */
    size_t nomem;         /* failed with MC_ERR_NOMEM */
    size_t other_err;     /* failed with another status (clean error) */
    size_t ok_despite;    /* returned OK although a failure was injected */
    size_t leaks;         /* points that left heap bytes or fds behind */
    size_t crashes;       /* points where the process died */
    size_t hangs;         /* points that did not finish in POINT_TIMEOUT_S */
    size_t leftovers;     /* points that left files in outdir */
} chaos_stats;

static void empty_dir(const char *dir)
{
    tu_rmtree(dir);
    assert_int_equal(mkdir(dir, 0777), 0);
}

/* One point, run in a child process so that a crash or a hang at some N
 * is reported with its N instead of taking the whole test down.  The child
 * measures its own heap and fds around the call and sends the result back
 * through a pipe, then leaves with _exit (no LSan pass per child: the heap
 * count is exact, see heap_in_use). */
enum { PT_DONE = 0, PT_CRASH = 1, PT_HANG = 2 };

typedef struct point_result {
    int outcome;             /* PT_* */
    int sig;                 /* PT_CRASH: the signal */
    mc_status st;
    int injected;
    long long heap_delta;    /* bytes */
    int fd_delta;
    char message[256];
} point_result;

static point_result run_point(op_fn op, void *ctx, const char *outdir, long n)
{
    point_result pr;
    memset(&pr, 0, sizeof pr);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        mc_error err;
        mc_error_clear(&err);
        size_t heap0 = heap_in_use();
        int fd0 = open_fds();
        mc_alloc_fail_after(n);
        pr.st = op(ctx, outdir, &err);
        pr.injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        pr.heap_delta = (long long)heap_in_use() - (long long)heap0;
        pr.fd_delta = open_fds() - fd0;
        size_t ml = strnlen(err.message, sizeof pr.message - 1);
        memcpy(pr.message, err.message, ml);
        pr.message[ml] = '\0';
        ssize_t w = write(fds[1], &pr, sizeof pr);
        _exit(w == (ssize_t)sizeof pr ? 0 : 3);
    }
    close(fds[1]);
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int ready = poll(&pfd, 1, POINT_TIMEOUT_S * 1000);
    ssize_t got = ready > 0 ? read(fds[0], &pr, sizeof pr) : -1;
    close(fds[0]);
    if (ready <= 0)
        kill(pid, SIGKILL);
    int wst = 0;
    waitpid(pid, &wst, 0);
    if (ready <= 0) {
        pr.outcome = PT_HANG;
    } else if (got != (ssize_t)sizeof pr) {
        pr.outcome = PT_CRASH;
        pr.sig = WIFSIGNALED(wst) ? WTERMSIG(wst) : 0;
    } else {
        pr.outcome = PT_DONE;
    }
    return pr;
}

/* Run operation op at the chosen failure points.  budget_s: wall time it
 * may take (at least MIN_POINTS points run whatever the time). */
static chaos_stats run_chaos(const char *name, op_fn op, void *ctx,
                             double budget_s)
{
    chaos_stats cs;
    memset(&cs, 0, sizeof cs);
    char *tmp = tu_mkdtemp("fa");
    char *outdir = tu_fmt("%s/out", tmp);
    mc_error err;
    double t0 = now_s();

    /* Warm up once-only state (jansson seed, kernel dispatch, stdio), then
     * count a clean run. */
    empty_dir(outdir);
    mc_alloc_fail_after(-1);
    mc_status st = op(ctx, outdir, &err);
    if (st != MC_OK) {
        char buf[1600];
        print_error("%s: clean run failed: %s\n", name,
                    mc_error_format(&err, buf, sizeof buf));
    }
    assert_int_equal(st, MC_OK);
    empty_dir(outdir);
    mc_alloc_reset_count();
    assert_int_equal(op(ctx, outdir, &err), MC_OK);
    cs.allocs = mc_alloc_count();
    empty_dir(outdir);

    uint64_t count = cs.allocs;
    /* Candidates: every N when there are at most MAX_POINTS, else the first
     * FIRST_ALL and an even spread over the rest.  Visiting order: the
     * first FIRST_ALL in turn, then the others in bit-reversed order, so
     * that wherever the time budget stops the run, the points visited are
     * spread evenly over the whole operation. */
    size_t ncand = count <= g_max_points ? (size_t)count : g_max_points;
    size_t head = ncand < FIRST_ALL ? ncand : FIRST_ALL;
    size_t rest = ncand - head, bits = 0;
    while (((size_t)1 << bits) < rest)
        bits++;
    size_t visit = 0, slots = head + ((size_t)1 << bits);
    for (size_t k = 0; k < slots; k++) {
        size_t idx; /* candidate index */
        if (k < head) {
            idx = k;
        } else {
            size_t i = k - head, r = 0;
            for (size_t b = 0; b < bits; b++)
                if (i & ((size_t)1 << b))
                    r |= (size_t)1 << (bits - 1 - b);
            if (r >= rest)
                continue;
            idx = head + r;
        }
        if (visit >= MIN_POINTS && now_s() - t0 > budget_s * g_budget_scale)
            break;
        visit++;
        long n = count <= g_max_points || idx < FIRST_ALL
                     ? (long)idx
                     : (long)(FIRST_ALL + (count - FIRST_ALL) *
                                              (idx - FIRST_ALL) /
                                              (ncand - FIRST_ALL));
        point_result pr = run_point(op, ctx, outdir, n);
        int temps = count_temps(tmp);
        cs.points++;
        if (pr.outcome == PT_HANG) {
            cs.hangs++;
            print_error("%s: N=%ld: no answer after %d s (hang), killed\n",
                        name, n, POINT_TIMEOUT_S);
            if (cs.hangs >= 2) {
                print_error("%s: stopping this operation after 2 hangs\n",
                            name);
                break;
            }
        } else if (pr.outcome == PT_CRASH) {
            cs.crashes++;
            print_error("%s: N=%ld: crashed (%s)\n", name, n,
                        strsignal(pr.sig));
        } else if (pr.st == MC_OK) {
            if (pr.injected) {
                cs.ok_despite++;
                if (cs.ok_despite <= 3)
                    print_message("  %s: N=%ld: OK although an allocation "
                                  "failed\n", name, n);
            }
        } else if (pr.st == MC_ERR_NOMEM) {
            cs.nomem++;
        } else {
            cs.other_err++;
            if (cs.other_err <= 3)
                print_message("  %s: N=%ld: status %d (%s): %s\n", name, n,
                              (int)pr.st, mc_status_str(pr.st), pr.message);
        }
        if (pr.outcome == PT_DONE && pr.st != MC_OK && !pr.message[0])
            print_error("%s: N=%ld: status %d with no message\n", name, n,
                        (int)pr.st);
        if (pr.outcome == PT_DONE && (pr.heap_delta != 0 || pr.fd_delta != 0)) {
            cs.leaks++;
            if (cs.leaks <= 6)
                print_error("%s: N=%ld: leak: heap %+lld bytes, fds %+d "
                            "(status %d)\n", name, n, pr.heap_delta,
                            pr.fd_delta, (int)pr.st);
        }
        int entries = tu_count_entries(outdir);
        if (pr.outcome == PT_DONE && pr.st != MC_OK &&
            (entries != 0 || temps != 0)) {
            cs.leftovers++;
            if (cs.leftovers <= 6)
                print_error("%s: N=%ld: %d entries in the output dir, %d "
                            "temps beside it after a failure\n", name, n,
                            entries, temps);
        }
        if (entries != 0 || temps != 0)
            empty_dir(outdir);
    }
    double dt = now_s() - t0;
    print_message("[ FIGURES  ] %-26s allocations %6llu, points exercised "
                  "%4zu (%s), NOMEM %zu, other error %zu, ok-despite %zu, "
                  "leaks %zu, leftovers %zu, crashes %zu, hangs %zu, "
                  "%.1f s\n", name,
                  (unsigned long long)cs.allocs, cs.points,
                  cs.points == count ? "all" : "sampled", cs.nomem,
                  cs.other_err, cs.ok_despite, cs.leaks, cs.leftovers,
                  cs.crashes, cs.hangs, dt);
    tu_rmtree(tmp);
    free(outdir);
    free(tmp);
    return cs;
}

/* Every test requires: at least one point, no leak, no leftovers, and every
 * injected failure reported as an error. */
static int expect_clean(const chaos_stats *cs)
{
    return cs->points == 0 || cs->leaks || cs->leftovers || cs->ok_despite ||
           cs->crashes || cs->hangs;
}

/* ---- operations ----------------------------------------------------------- */

static char *fixture(const char *name)
{
    return tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
}

/* The safetensors writer on its own: 40 small tensors with long names (a
 * header of a few KiB, so its buffer grows while it is built, and its
 * length is not a multiple of 8 when that happens) plus metadata. */
static mc_status op_st_writer(void *ctx, const char *outdir, mc_error *err)
{
    (void)ctx;
    char *path = tu_fmt("%s/w.safetensors", outdir);
    fmt_st_writer *w = NULL;
    const float vals[3] = {1, 2, 3};
    const uint64_t shape[1] = {3};
    mc_status st = fmt_st_writer_create(path, &w, err);
    for (int i = 0; i < 40 && st == MC_OK; i++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.mlp.%.*s.weight", i,
                 1 + i % 7, "abcdefg");
        st = fmt_st_writer_add(w, name, FMT_DT_F32, 1, shape, err);
    }
    if (st == MC_OK)
        st = fmt_st_writer_set_metadata(w, "note", "fault", err);
    if (st == MC_OK)
        st = fmt_st_writer_begin_data(w, err);
    for (int i = 0; i < 40 && st == MC_OK; i++)
        st = fmt_st_writer_write(w, vals, sizeof vals, err);
    if (st == MC_OK) {
        st = fmt_st_writer_finish(w, err);
        w = NULL;
    }
    fmt_st_writer_abort(w);
    free(path);
    return st;
}

static void test_fault_alloc_safetensors_writer(void **state)
{
    (void)state;
    int bad = 0;
    chaos_stats cs = run_chaos("fmt_st_writer 40 tensors", op_st_writer, NULL,
                               TEST_BUDGET_S / 4);
    bad += expect_clean(&cs);
    assert_int_equal(bad, 0);
}

static mc_status op_model_open(void *ctx, const char *outdir, mc_error *err)
{
    (void)outdir;
    fmt_model *m = NULL;
    mc_status st = fmt_model_open(ctx, &m, err);
    if (st == MC_OK && fmt_model_tensor_count(m) == 0)
        st = mc_fail(err, MC_ERR_FORMAT, ctx, NULL, -1, "no tensors");
    fmt_model_close(m);
    return st;
}

static mc_status op_rt_model_open(void *ctx, const char *outdir, mc_error *err)
{
    (void)outdir;
    rt_model *m = NULL;
    mc_status st = rt_model_open(ctx, &m, err);
    rt_model_free(m);
    return st;
}

static void test_fault_alloc_model_open_plain_and_sharded(void **state)
{
    (void)state;
    int bad = 0;
    const char *names[] = {"llama", "llama-sharded", "qwen2", "llama-bf16"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *dir = fixture(names[i]);
        char *label = tu_fmt("fmt_model_open %s", names[i]);
        chaos_stats cs = run_chaos(label, op_model_open, dir, TEST_BUDGET_S / 5);
        bad += expect_clean(&cs);
        free(label);
        free(dir);
    }
    char *dir = fixture("llama-sharded");
    chaos_stats cs = run_chaos("rt_model_open llama-sharded", op_rt_model_open,
                               dir, TEST_BUDGET_S / 5);
    bad += expect_clean(&cs);
    free(dir);
    assert_int_equal(bad, 0);
}

static mc_status op_config_and_adapter(void *ctx, const char *outdir,
                                       mc_error *err)
{
    (void)outdir;
    const char *adapter = ctx;
    char *cfgp = fixture("llama/config.json");
    fmt_model_config cfg;
    mc_status st = fmt_config_load(cfgp, &cfg, err);
    free(cfgp);
    if (st != MC_OK)
        return st;
    fmt_peft_adapter *a = NULL;
    st = fmt_peft_open(adapter, &a, err);
    fmt_peft_close(a);
    return st;
}

static void test_fault_alloc_config_and_adapter_parse(void **state)
{
    (void)state;
    int bad = 0;
    const char *names[] = {"llama-plain", "llama-dora", "llama-patterns",
                           "llama-mts", "llama-regex", "llama-layers",
                           "llama-embed", "qwen2-lm-head"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *dir = tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR, names[i]);
        char *label = tu_fmt("config+peft %s", names[i]);
        chaos_stats cs = run_chaos(label, op_config_and_adapter, dir,
                                   TEST_BUDGET_S / 8);
        bad += expect_clean(&cs);
        free(label);
        free(dir);
    }
    assert_int_equal(bad, 0);
}

typedef struct merge_ctx {
    const char *base;        /* fixture name */
    const char *adapters[3]; /* adapter names, NULL-terminated */
    fmt_dtype dtype;
} merge_ctx;

static mc_status op_merge(void *ctx, const char *outdir, mc_error *err)
{
    const merge_ctx *mc = ctx;
    char *base = fixture(mc->base);
    char *dirs[3] = {NULL, NULL, NULL};
    cmp_adapter_spec specs[3];
    size_t n = 0;
    for (; n < 3 && mc->adapters[n]; n++) {
        dirs[n] = tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR, mc->adapters[n]);
        specs[n].dir = dirs[n];
        specs[n].weight = n ? 0.5 : 1.0;
    }
    char *out = tu_fmt("%s/merged", outdir);
    fmt_model *m = NULL;
    cmp_merge *mg = NULL;
    mc_status st = fmt_model_open(base, &m, err);
    if (st == MC_OK)
        st = cmp_merge_open(m, specs, n, &mg, err);
    if (st == MC_OK)
        st = cmp_merge_write(mg, out, mc->dtype, NULL, err);
    cmp_merge_close(mg);
    fmt_model_close(m);
    for (size_t i = 0; i < n; i++)
        free(dirs[i]);
    free(out);
    free(base);
    return st;
}

static void test_fault_alloc_merge_write(void **state)
{
    (void)state;
    int bad = 0;
    merge_ctx a = {"llama", {"llama-plain", "llama-dora", NULL}, FMT_DT_INVALID};
    chaos_stats cs = run_chaos("merge llama plain+dora", op_merge, &a,
                               TEST_BUDGET_S / 3);
    bad += expect_clean(&cs);
    merge_ctx b = {"llama-sharded", {"llama-mts", NULL}, FMT_DT_BF16};
    cs = run_chaos("merge llama-sharded mts", op_merge, &b, TEST_BUDGET_S / 3);
    bad += expect_clean(&cs);
    merge_ctx c = {"qwen2", {"qwen2-lm-head", NULL}, FMT_DT_INVALID};
    cs = run_chaos("merge qwen2 lm-head", op_merge, &c, TEST_BUDGET_S / 3);
    bad += expect_clean(&cs);
    assert_int_equal(bad, 0);
}

typedef struct compile_ctx {
    const char *model;
    const char *quant;
    const char *adapter;     /* or NULL */
    int compress;
} compile_ctx;

static mc_status op_compile(void *ctx, const char *outdir, mc_error *err)
{
    const compile_ctx *cc = ctx;
    char *model = fixture(cc->model);
    char *out = tu_fmt("%s/m.mca", outdir);
    char *ad = cc->adapter ? tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR,
                                    cc->adapter) : NULL;
    cmp_adapter_spec spec = {ad, 1.0};
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    mc_status st = cmp_wpolicy_parse(cc->quant, 32, &o.req.policy, err);
    o.req.target_bytes = 64ull << 20;
    o.req.max_batch = 2;
    o.req.max_seq = 64;
    o.model = model;
    o.out = out;
    o.compress = cc->compress;
    if (ad) {
        o.adapters = &spec;
        o.n_adapters = 1;
    }
    if (st == MC_OK)
        st = cmp_compile(&o, NULL, err);
    free(ad);
    free(out);
    free(model);
    return st;
}

static void test_fault_alloc_compile_artifact(void **state)
{
    (void)state;
    int bad = 0;
    compile_ctx a = {"llama", "int8", NULL, 0};
    chaos_stats cs = run_chaos("compile llama int8", op_compile, &a,
                               TEST_BUDGET_S / 2);
    bad += expect_clean(&cs);
    compile_ctx b = {"llama-sharded", "int4", "llama-plain", 1};
    cs = run_chaos("compile sharded int4+lora+zstd", op_compile, &b,
                   TEST_BUDGET_S / 2);
    bad += expect_clean(&cs);
    assert_int_equal(bad, 0);
}

typedef struct session_ctx {
    char *artifact;          /* compiled once, before the chaos */
} session_ctx;

static mc_status op_session(void *ctx, const char *outdir, mc_error *err)
{
    (void)outdir;
    const session_ctx *sc = ctx;
    rt_model *m = NULL;
    rt_session *s = NULL;
    mc_status st = rt_model_open_artifact(sc->artifact, &m, err);
    if (st == MC_OK)
        st = rt_session_create(m, &m->plan.layout.limits, &m->plan.layout, &s, err);
    if (st == MC_OK) {
        int32_t prompt[4] = {1, 17, 42, 99};
        int32_t ids[4];
        rt_prompt p = {prompt, 4};
        rt_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_new_tokens = 4;
        rt_gen_result r;
        memset(&r, 0, sizeof r);
        r.ids = ids;
        st = rt_session_generate(s, &p, 1, &gp, &r, err);
        if (st == MC_OK && r.n + (r.stop == RT_STOP_TOKEN) == 0)
            st = mc_fail(err, MC_ERR_FORMAT, NULL, NULL, -1, "no tokens");
    }
    rt_session_free(s);
    rt_model_free(m);
    return st;
}

static void test_fault_alloc_artifact_session_generate(void **state)
{
    (void)state;
    int bad = 0;
    const compile_ctx variants[] = {{"llama", "int4", NULL, 0},
                                    {"qwen2", "int8", NULL, 1}};
    for (size_t i = 0; i < 2; i++) {
        char *dir = tu_mkdtemp("fas");
        session_ctx sc = {tu_fmt("%s/m.mca", dir)};
        mc_error err;
        assert_int_equal(op_compile((void *)&variants[i], dir, &err), MC_OK);
        char *label = tu_fmt("artifact+session %s %s%s", variants[i].model,
                             variants[i].quant,
                             variants[i].compress ? " zstd" : "");
        chaos_stats cs = run_chaos(label, op_session, &sc, TEST_BUDGET_S / 2);
        bad += expect_clean(&cs);
        free(label);
        free(sc.artifact);
        tu_rmtree(dir);
        free(dir);
    }
    assert_int_equal(bad, 0);
}

static mc_status op_tokenizer(void *ctx, const char *outdir, mc_error *err)
{
    (void)outdir;
    rt_tokenizer *t = NULL;
    mc_status st = rt_tokenizer_load(ctx, &t, err);
    if (st == MC_OK) {
        static const char text[] = "Hello fault injection: ünïcödé 123!";
        int32_t ids[128];
        size_t n = 0;
        st = rt_tokenizer_encode(t, text, sizeof text - 1, 1, ids, 128, &n,
                                 err);
        char buf[512];
        size_t len = 0;
        if (st == MC_OK)
            st = rt_tokenizer_decode(t, ids, n, 1, buf, sizeof buf, &len);
    }
    rt_tokenizer_free(t);
    return st;
}

static void test_fault_alloc_tokenizer_load(void **state)
{
    (void)state;
    int bad = 0;
    char *path = tu_fmt("%s/tokenizers/mistral-7b-instruct-v0.1/tokenizer.json",
                        MC_SHARED_DIR);
    if (!tu_exists(path)) {
        free(path);
        TU_SKIP_IF(1, "no tokenizer fixture in ../shared/tokenizers");
    }
    chaos_stats cs = run_chaos("tokenizer mistral", op_tokenizer, path,
                                TEST_BUDGET_S);
    bad += expect_clean(&cs);
    free(path);
    assert_int_equal(bad, 0);
}

/* mc_alloc's accounting (used to check memory plans): live and peak
 * bytes follow malloc, calloc, realloc and free, allocator rounding
 * aside; a failed allocation counts nothing. */
static void test_alloc_tracking_counts_live_and_peak(void **state)
{
    (void)state;
    mc_alloc_track(1);
    mc_alloc_reset_peak();
    int64_t base = mc_alloc_live_bytes();
    char *a = mc_malloc(1 << 20);
    char *b = mc_calloc(1000, 1000);
    assert_non_null(a);
    assert_non_null(b);
    int64_t live = mc_alloc_live_bytes() - base;
    assert_true(live >= (1 << 20) + 1000000 && live <= (1 << 20) + 1000000 + 8192);
    a = mc_realloc(a, 3 << 20);
    assert_non_null(a);
    live = mc_alloc_live_bytes() - base;
    assert_true(live >= (3 << 20) + 1000000 && live <= (3 << 20) + 1000000 + 8192);
    mc_free(b);
    mc_alloc_fail_after(0);
    assert_null(mc_malloc(4096));
    mc_alloc_fail_after(-1);
    mc_free(a);
    assert_int_equal(mc_alloc_live_bytes(), base);
    int64_t peak = mc_alloc_peak_bytes() - base;
    assert_true(peak >= (3 << 20) + 1000000 && peak <= (3 << 20) + 1000000 + 8192);
    mc_alloc_reset_peak();
    assert_int_equal(mc_alloc_peak_bytes(), base);
    mc_alloc_track(0);
}

/* mc_zeroed: zeros, counted like mc_calloc, NULL on overflow and under an
 * injected failure. */
static void test_zeroed_allocation(void **state)
{
    (void)state;
    mc_alloc_track(1);
    int64_t base = mc_alloc_live_bytes();
    double *z = mc_zeroed(300000, sizeof(double));
    assert_non_null(z);
    assert_true(mc_alloc_live_bytes() - base >= 300000 * (int64_t)sizeof(double));
    for (size_t i = 0; i < 300000; i++)
        assert_true(z[i] == 0.0);
    mc_free(z);
    assert_int_equal(mc_alloc_live_bytes(), base);
    assert_null(mc_zeroed(SIZE_MAX / 4, 8));
    mc_alloc_fail_after(0);
    assert_null(mc_zeroed(16, 8));
    mc_alloc_fail_after(-1);
    mc_alloc_track(0);
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
#ifndef MC_SANITIZE
    /* mallinfo2 counts chunks parked in the tcache and fastbins as in use,
     * which hides or invents leaks; with both off its count is exact.  The
     * tcache can only be turned off before start, so re-exec once. */
    const char *tun = getenv("GLIBC_TUNABLES");
    if (!tun || !strstr(tun, "tcache_count=0")) {
        setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0", 1);
        execv("/proc/self/exe", argv);
        /* if exec fails, run anyway: leak figures may then be noisy */
    }
    mallopt(M_MXFAST, 0);
    /* One arena for every thread: a pool worker's first free() may make
     * glibc create a new arena, whose 2256-byte header mallinfo2 counts as
     * in use; whether it does depends on thread timing, so on a loaded
     * machine that read as a leak in the points that start a pool. */
    mallopt(M_ARENA_MAX, 1);
#endif
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (getenv("MC_FA_EXHAUSTIVE")) {
        g_max_points = (size_t)-1;
        g_budget_scale = 1e9;
    }
    mc_alloc_install_jansson();
    /* MC_FA_FILTER=<glob>: run only matching tests (to chase one leak). */
    if (getenv("MC_FA_FILTER"))
        cmocka_set_test_filter(getenv("MC_FA_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_alloc_safetensors_writer),
        cmocka_unit_test(test_fault_alloc_model_open_plain_and_sharded),
        cmocka_unit_test(test_fault_alloc_config_and_adapter_parse),
        cmocka_unit_test(test_fault_alloc_merge_write),
        cmocka_unit_test(test_fault_alloc_compile_artifact),
        cmocka_unit_test(test_fault_alloc_artifact_session_generate),
        cmocka_unit_test(test_fault_alloc_tokenizer_load),
        cmocka_unit_test(test_alloc_tracking_counts_live_and_peak),
        cmocka_unit_test(test_zeroed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

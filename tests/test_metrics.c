/* test_metrics.c - runtime/rt_metrics.h writes valid Prometheus text
 * exposition (every line parsed back against the format's grammar), with
 * the figures it was given, atomically, and reports failures. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "mc_alloc.h"
#include "rt_metrics.h"
#include "testutil.h"

/* ---- a checker of the text exposition format (0.0.4) ------------------- */

#define MAX_FAMILIES 64

typedef struct family {
    char name[128];
    char type[16];
    int help, samples;
} family;

typedef struct parsed {
    family fam[MAX_FAMILIES];
    int n;
} parsed;

static int is_name_start(int c) { return isalpha(c) || c == '_' || c == ':'; }
static int is_name_char(int c) { return isalnum(c) || c == '_' || c == ':'; }

/* Length of the metric name at s (0 if none). */
static size_t name_len(const char *s)
{
    if (!is_name_start((unsigned char)s[0]))
        return 0;
    size_t n = 1;
    while (is_name_char((unsigned char)s[n]))
        n++;
    return n;
}

static family *find(parsed *p, const char *name, size_t n)
{
    for (int i = 0; i < p->n; i++)
        if (strlen(p->fam[i].name) == n && !strncmp(p->fam[i].name, name, n))
            return &p->fam[i];
    return NULL;
}

static family *add(parsed *p, const char *name, size_t n)
{
    assert_true(p->n < MAX_FAMILIES);
    assert_true(n < sizeof p->fam[0].name);
    family *f = &p->fam[p->n++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, n);
    return f;
}

/* A sample value: a float, NaN, +Inf or -Inf, then end (no timestamps:
 * we never write them). Returns 0 when valid. */
static int parse_value(const char *s, double *v)
{
    if (!strcmp(s, "NaN")) {
        *v = NAN;
        return 0;
    }
    if (!strcmp(s, "+Inf") || !strcmp(s, "-Inf")) {
        *v = s[0] == '+' ? INFINITY : -INFINITY;
        return 0;
    }
    char *end;
    if (!*s || isspace((unsigned char)*s))
        return -1;
    *v = strtod(s, &end);
    return *end == '\0' ? 0 : -1;
}

/* Labels {name="value",...}: returns chars consumed, or 0 if malformed. */
static size_t parse_labels(const char *s)
{
    size_t i = 0;
    if (s[i++] != '{')
        return 0;
    for (;;) {
        if (s[i] == '}')
            return i + 1;
        size_t n = name_len(s + i);
        if (!n || !strncmp(s + i, "__", 2))
            return 0;
        i += n;
        if (s[i++] != '=' || s[i++] != '"')
            return 0;
        while (s[i] && s[i] != '"') {
            if (s[i] == '\\') {
                if (s[i + 1] != '\\' && s[i + 1] != '"' && s[i + 1] != 'n')
                    return 0;
                i++;
            }
            if (s[i] == '\n')
                return 0;
            i++;
        }
        if (s[i++] != '"')
            return 0;
        if (s[i] == ',')
            i++;
        else if (s[i] != '}')
            return 0;
    }
}

/* Parse the whole text against the grammar.  Returns 0 when every line
 * matches, else -1 with the first offending line explained in why.  Fills
 * p with the families seen. */
#define BAD(...)                                                               \
    do {                                                                       \
        snprintf(why, whyn, __VA_ARGS__);                                      \
        free(copy);                                                            \
        return -1;                                                             \
    } while (0)
static int check_exposition(const char *text, parsed *p, char *why,
                            size_t whyn)
{
    memset(p, 0, sizeof *p);
    why[0] = '\0';
    size_t len = strlen(text);
    char *copy = NULL;
    if (len == 0 || text[len - 1] != '\n')
        BAD("empty, or the last line does not end with a newline");
    copy = strdup(text);
    assert_non_null(copy);
    int lineno = 0;
    for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7)) {
            const char *nm = l + 7;
            size_t n = name_len(nm);
            if (!n || nm[n] != ' ')
                BAD("line %d: bad metric name: %s", lineno, l);
            family *f = find(p, nm, n);
            if (!f)
                f = add(p, nm, n);
            if (l[2] == 'H') {
                if (f->help++)
                    BAD("line %d: second HELP for %s", lineno, f->name);
                if (!nm[n + 1])
                    BAD("line %d: empty HELP", lineno);
            } else {
                const char *t = nm + n + 1;
                if (f->type[0] || f->samples)
                    BAD("line %d: TYPE after samples or twice: %s", lineno, l);
                if (strcmp(t, "counter") && strcmp(t, "gauge") &&
                    strcmp(t, "histogram") && strcmp(t, "summary") &&
                    strcmp(t, "untyped"))
                    BAD("line %d: unknown type '%s'", lineno, t);
                snprintf(f->type, sizeof f->type, "%s", t);
            }
            continue;
        }
        if (l[0] == '#')
            continue; /* other comments are allowed */
        size_t n = name_len(l);
        if (!n)
            BAD("line %d: no metric name: %s", lineno, l);
        family *f = find(p, l, n);
        if (!f || !f->type[0])
            BAD("line %d: sample before its # TYPE: %s", lineno, l);
        f->samples++;
        const char *r = l + n;
        if (*r == '{') {
            size_t k = parse_labels(r);
            if (!k)
                BAD("line %d: malformed labels: %s", lineno, l);
            r += k;
        }
        if (*r != ' ')
            BAD("line %d: no space before the value: %s", lineno, l);
        double v;
        if (parse_value(r + 1, &v))
            BAD("line %d: bad value '%s'", lineno, r + 1);
    }
    free(copy);
    return 0;
}
#undef BAD

static void assert_valid_exposition(const char *text, parsed *p)
{
    char why[512];
    if (check_exposition(text, p, why, sizeof why))
        fail_msg("not valid exposition format: %s", why);
}

/* m formatted in memory (new, mc_free it), checked to be a valid
 * exposition. */
static char *format_valid(const rt_metrics *m)
{
    char *text = NULL;
    assert_int_equal(rt_metrics_format_prometheus(m, &text, NULL, NULL),
                     MC_OK);
    parsed p;
    assert_valid_exposition(text, &p);
    return text;
}

/* The value of the sample line that starts with `key ` (name + labels). */
static double sample(const char *text, const char *key)
{
    size_t k = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ')
            return strtod(l + k + 1, NULL);
    fail_msg("no sample %s", key);
    return 0;
}

static void fill(rt_metrics *m)
{
    rt_metrics_init(m);
    m->planned_bytes = 71303168;
    m->arena_bytes = 4194304;
    m->arena_high_water_bytes = 3000000;
    m->peak_rss_bytes = 50000000;
    m->prefill_tokens = 300;
    m->prefill_seconds = 0.5;
    m->decode_tokens = 64;
    m->decode_seconds = 2.0;
    m->requests_served = 7;
    m->requests_refused[RT_REFUSE_PLAN] = 2;
    m->requests_refused[RT_REFUSE_INPUT] = 1;
}

/* ---- tests ------------------------------------------------------------- */

static void test_metrics_output_matches_exposition_grammar(void **state)
{
    (void)state;
    rt_metrics m;
    fill(&m);
    char *dir = tu_mkdtemp("metrics");
    char *path = tu_fmt("%s/mrun.prom", dir);
    mc_error e;
    assert_int_equal(rt_metrics_write_prometheus(&m, path, &e), MC_OK);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    parsed p;
    assert_valid_exposition(text, &p);
    assert_true(p.n >= 12);
    for (int i = 0; i < p.n; i++) {
        const family *f = &p.fam[i];
        assert_true(f->help == 1);
        assert_true(f->type[0] != '\0');
        assert_true(f->samples >= 1);
        assert_memory_equal(f->name, "mcompile_", 9);
        size_t n = strlen(f->name);
        if (!strcmp(f->type, "counter"))
            assert_string_equal(f->name + n - 6, "_total");
        else
            assert_true(strstr(f->name, "_bytes") ||
                        strstr(f->name, "_per_second"));
    }
    free(text);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_metrics_reports_the_figures_given(void **state)
{
    (void)state;
    rt_metrics m;
    fill(&m);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(rt_metrics_format_prometheus(&m, &text, &len, NULL),
                     MC_OK);
    assert_int_equal(strlen(text), len);
    assert_true(sample(text, "mcompile_planned_bytes") == 71303168.0);
    assert_true(sample(text, "mcompile_arena_bytes") == 4194304.0);
    assert_true(sample(text, "mcompile_arena_high_water_bytes") == 3000000.0);
    assert_true(sample(text, "mcompile_peak_rss_bytes") == 50000000.0);
    assert_true(sample(text, "mcompile_prefill_tokens_total") == 300.0);
    assert_true(sample(text, "mcompile_prefill_tokens_per_second") == 600.0);
    assert_true(sample(text, "mcompile_decode_tokens_per_second") == 32.0);
    assert_true(sample(text, "mcompile_decode_seconds_total") == 2.0);
    assert_true(sample(text, "mcompile_requests_served_total") == 7.0);
    assert_true(sample(text,
                       "mcompile_requests_refused_total{reason=\"plan\"}") ==
                2.0);
    assert_true(sample(text,
                       "mcompile_requests_refused_total{reason=\"input\"}") ==
                1.0);
    assert_true(sample(text,
                       "mcompile_requests_refused_total{reason=\"other\"}") ==
                0.0);
    mc_free(text);
}

static void test_metrics_zero_seconds_gives_zero_rate_not_nan(void **state)
{
    (void)state;
    rt_metrics m;
    rt_metrics_init(&m);
    m.decode_tokens = 5; /* tokens but no time measured */
    char *text = format_valid(&m);
    assert_true(sample(text, "mcompile_decode_tokens_per_second") == 0.0);
    mc_free(text);
}

static void test_metrics_checker_rejects_malformed_lines(void **state)
{
    (void)state;
    /* The checker must be able to fail. */
    const char *bad[] = {
        "mcompile_x 1\n",                                      /* no TYPE */
        "# HELP mcompile_x h\n# TYPE mcompile_x gauge\nmcompile_x one\n",
        "# HELP mcompile_x h\n# TYPE mcompile_x gauge\nmcompile_x{a=b} 1\n",
        "# HELP mcompile_x h\n# TYPE mcompile_x gage\nmcompile_x 1\n",
        "# HELP mcompile_x h\n# TYPE mcompile_x gauge\nmcompile_x 1",
        "# HELP mcompile_x h\n# TYPE mcompile_x gauge\n1x 1\n",
        "# HELP mcompile_x h\n# TYPE mcompile_x gauge\nmcompile_x 1\n"
        "# TYPE mcompile_x gauge\n",
    };
    parsed p;
    char why[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (check_exposition(bad[i], &p, why, sizeof why) == 0)
            fail_msg("case %zu accepted: %s", i, bad[i]);
    /* and accepts what the format allows */
    const char *good =
        "# HELP a_total x\n# TYPE a_total counter\n"
        "a_total{reason=\"a\\\"b\",x=\"\"} +Inf\n# a comment\n"
        "a_total{reason=\"c\"} 1.5e-3\n";
    assert_int_equal(check_exposition(good, &p, why, sizeof why), 0);
}

static void test_metrics_write_to_missing_dir_fails_with_path(void **state)
{
    (void)state;
    rt_metrics m;
    fill(&m);
    char *dir = tu_mkdtemp("metrics");
    char *path = tu_fmt("%s/no/such/dir/m.prom", dir);
    mc_error e;
    assert_int_equal(rt_metrics_write_prometheus(&m, path, &e), MC_ERR_IO);
    assert_non_null(strstr(e.file, "no/such/dir"));
    assert_false(tu_exists(path));
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_metrics_rewrite_replaces_whole_file(void **state)
{
    (void)state;
    rt_metrics m;
    fill(&m);
    char *dir = tu_mkdtemp("metrics");
    char *path = tu_fmt("%s/m.prom", dir);
    /* a file that is not metrics is refused, untouched */
    assert_int_equal(tu_write_file(path, "garbage that is longer than it "
                                         "should be\n", 42), 0);
    mc_error e;
    assert_int_equal(rt_metrics_write_prometheus(&m, path, &e),
                     MC_ERR_INVALID_ARG);
    assert_non_null(strstr(e.message, "not a metrics file"));
    assert_true(tu_file_is(path, "garbage that is longer than it should be\n",
                           42));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rt_metrics_write_prometheus(&m, path, NULL), MC_OK);
    m.requests_served = 8;
    assert_int_equal(rt_metrics_write_prometheus(&m, path, NULL), MC_OK);
    char *text = tu_read_file(path, NULL);
    parsed p;
    assert_valid_exposition(text, &p);
    assert_true(sample(text, "mcompile_requests_served_total") == 8.0);
    assert_int_equal(tu_count_entries(dir), 1); /* no temp left behind */
    free(text);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_metrics_survives_each_failed_allocation(void **state)
{
    (void)state;
    rt_metrics m;
    fill(&m);
    char *dir = tu_mkdtemp("metrics");
    char *path = tu_fmt("%s/m.prom", dir);
    int saw_ok = 0;
    for (long k = 0; k < 200 && !saw_ok; k++) {
        mc_alloc_fail_after(k);
        mc_error e;
        mc_status s = rt_metrics_write_prometheus(&m, path, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        if (s == MC_OK) {
            saw_ok = !injected;
        } else {
            assert_true(s == MC_ERR_NOMEM || s == MC_ERR_IO);
            assert_false(tu_exists(path));
        }
    }
    assert_true(saw_ok);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_metrics_counts_requests_by_reason(void **state)
{
    (void)state;
    assert_int_equal(rt_metrics_reason_of_status(MC_ERR_PLAN), RT_REFUSE_PLAN);
    assert_int_equal(rt_metrics_reason_of_status(MC_ERR_INVALID_ARG),
                     RT_REFUSE_INPUT);
    assert_int_equal(rt_metrics_reason_of_status(MC_ERR_IO), RT_REFUSE_OTHER);
    assert_string_equal(rt_metrics_reason_name(RT_REFUSE_PLAN), "plan");
    rt_metrics m;
    rt_metrics_init(&m);
    rt_metrics_count(&m, MC_OK, 3);
    rt_metrics_count(&m, MC_ERR_PLAN, 2);
    rt_metrics_count(&m, MC_ERR_IO, 1);
    rt_metrics_count(NULL, MC_OK, 1);
    assert_int_equal(m.requests_served, 3);
    assert_int_equal(m.requests_refused[RT_REFUSE_PLAN], 2);
    assert_int_equal(m.requests_refused[RT_REFUSE_INPUT], 0);
    assert_int_equal(m.requests_refused[RT_REFUSE_OTHER], 1);
    assert_true(rt_metrics_peak_rss_bytes() > 0);
}

static void test_metrics_from_mcrt_reports_a_real_run(void **state)
{
    (void)state;
    char *model = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    mcrt *h = NULL;
    mcrt_options o;
    mcrt_options_default(&o);
    o.threads = 1;
    if (mcrt_open(model, &o, &h) != 0)
        fail_msg("mcrt_open %s: %s", model, mcrt_last_error(NULL));
    int32_t prompt[3] = {1, 2, 3}, out[4];
    const int32_t *p[1] = {prompt};
    size_t n[1] = {3};
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.max_new_tokens = 4;
    gp.use_model_eos = 0;
    mcrt_result r = {.ids = out};
    int rc = mcrt_generate(h, p, n, 1, &gp, &r);
    assert_int_equal(rc, 0);
    rt_metrics m;
    rt_metrics_init(&m);
    rt_metrics_from_mcrt(&m, h);
    mcrt_info info;
    assert_int_equal(mcrt_get_info(h, &info), 0);
    assert_true(m.arena_bytes == info.arena_bytes && m.arena_bytes > 0);
    assert_true(m.planned_bytes == info.planned_bytes);
    assert_true(m.planned_bytes >= m.arena_bytes);
    assert_true(m.arena_high_water_bytes > 0 &&
                m.arena_high_water_bytes <= m.arena_bytes);
    assert_int_equal(m.requests_served, 1);
    assert_int_equal(m.prefill_tokens, 3);
    assert_true(m.decode_tokens >= 3);
    assert_true(m.peak_rss_bytes > m.arena_bytes);
    char *text = format_valid(&m);
    assert_true(sample(text, "mcompile_requests_served_total") == 1.0);
    assert_true(sample(text, "mcompile_decode_tokens_per_second") > 0.0);
    mc_free(text);
    mcrt_close(h);
    free(model);
}

/* The program end to end: mrun --metrics writes this format, served and
 * refused requests included. */
static void test_mrun_metrics_file_counts_served_and_refused(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("metrics");
    char *art = tu_fmt("%s/small.mca", dir);
    char *prom = tu_fmt("%s/mrun.prom", dir);
    char *cmd = tu_fmt("'%s/mcompile' '%s/llama' --target 64MiB --max-seq 8 "
                       "--max-batch 1 -q -o '%s'", MC_BIN_DIR, MC_FIXTURE_DIR,
                       art);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    free(cmd);
    /* served: 3 prompt tokens + 4 new fit max_seq 8 */
    cmd = tu_fmt("'%s/mrun' '%s' --tokens '1 2 3' --max-new-tokens 4 "
                 "--ignore-eos -q --metrics '%s'", MC_BIN_DIR, art, prom);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    free(cmd);
    char *text = tu_read_file(prom, NULL);
    assert_non_null(text);
    parsed p;
    assert_valid_exposition(text, &p);
    assert_true(sample(text, "mcompile_requests_served_total") == 1.0);
    assert_true(sample(text, "mcompile_decode_tokens_total") >= 3.0);
    assert_true(sample(text, "mcompile_planned_bytes") > 0.0);
    assert_true(sample(text, "mcompile_peak_rss_bytes") >
                sample(text, "mcompile_arena_bytes"));
    free(text);
    /* refused: 10 prompt tokens exceed the plan's max_seq 8 */
    cmd = tu_fmt("'%s/mrun' '%s' --tokens '1 2 3 4 5 6 7 8 9 10' "
                 "--max-new-tokens 4 -q --metrics '%s'", MC_BIN_DIR, art,
                 prom);
    assert_int_equal(tu_run(cmd, NULL, NULL), 1);
    free(cmd);
    text = tu_read_file(prom, NULL);
    assert_non_null(text);
    assert_valid_exposition(text, &p);
    assert_true(sample(text, "mcompile_requests_served_total") == 0.0);
    assert_true(sample(text,
                       "mcompile_requests_refused_total{reason=\"plan\"}") ==
                1.0);
    free(text);
    free(prom);
    free(art);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_output_matches_exposition_grammar),
        cmocka_unit_test(test_metrics_reports_the_figures_given),
        cmocka_unit_test(test_metrics_zero_seconds_gives_zero_rate_not_nan),
        cmocka_unit_test(test_metrics_checker_rejects_malformed_lines),
        cmocka_unit_test(test_metrics_write_to_missing_dir_fails_with_path),
        cmocka_unit_test(test_metrics_rewrite_replaces_whole_file),
        cmocka_unit_test(test_metrics_survives_each_failed_allocation),
        cmocka_unit_test(test_metrics_counts_requests_by_reason),
        cmocka_unit_test(test_metrics_from_mcrt_reports_a_real_run),
        cmocka_unit_test(test_mrun_metrics_file_counts_served_and_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

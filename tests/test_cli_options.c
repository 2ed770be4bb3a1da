/* test_cli_options.c - the option tables (formats/mc_opt.h) of every
 * command: the engine on a table of its own (each kind, strict numbers,
 * the forms of a flag, help before anything), then the real tables: every
 * flag of every command is in its --help (library text and the programs'
 * output), no flag is listed twice, an unknown flag is named, and the
 * programs refuse bad numbers naming the flag and the expected range. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_calib.h"
#include "cmp_cli.h"
#include "mc_opt.h"
#include "mc_parse.h"
#include "mrun_opts.h"
#include "testutil.h"

/* ---- the engine on a table of its own ----------------------------------- */

typedef struct demo {
    const char *pos, *name;
    int on, off, mode, n_calls;
    uint32_t u32;
    uint64_t u64;
    int threads;
    float f;
    double top_p;
} demo;

static int on_call(void *base, const mc_opt *row, const char *flag,
                   const char *v, char *why, size_t n)
{
    (void)row;
    demo *d = base;
    if (strcmp(v, "bad") == 0) {
        snprintf(why, n, "%s: no 'bad' here", flag);
        return -1;
    }
    d->n_calls++;
    return 0;
}

static const mc_opt_choice modes[] = {
    {"fast", 1, 0}, {"slow", 2, 0}, {"quick", 1, 1}, {NULL, 0, 0}};

static const mc_opt demo_sub[] = {
    {.kind = MC_OPT_F64, .flags = "--top-p", .value = "P",
     .off = offsetof(demo, top_p), .flo = 0, .fhi = 1,
     .fflags = MC_PARSE_LO_OPEN, .help = "in (0, 1]"},
    {.kind = MC_OPT_END},
};

static const mc_opt demo_opts[] = {
    {.kind = MC_OPT_SECTION, .help = "Things:"},
    {.kind = MC_OPT_STR, .flags = "-n, --name", .value = "NAME",
     .off = offsetof(demo, name), .help = "a name\nsecond line"},
    {.kind = MC_OPT_SET, .flags = "--on", .off = offsetof(demo, on),
     .help = "switch on"},
    {.kind = MC_OPT_CLEAR, .flags = "--no-off", .off = offsetof(demo, off),
     .help = "switch off"},
    {.kind = MC_OPT_U32, .flags = "--u32", .value = "N",
     .off = offsetof(demo, u32), .ulo = 1, .uhi = 65536, .help = "u32"},
    {.kind = MC_OPT_U64, .flags = "--u64", .value = "N",
     .off = offsetof(demo, u64), .ulo = 0, .uhi = UINT64_MAX, .help = "u64"},
    {.kind = MC_OPT_INT, .flags = "--threads", .value = "N",
     .off = offsetof(demo, threads), .ulo = 1, .uhi = 256,
     .help = "threads"},
    {.kind = MC_OPT_F32, .flags = "--temp", .value = "T",
     .off = offsetof(demo, f), .flo = 0, .fhi = 1e4, .help = "temperature"},
    {.kind = MC_OPT_CHOICE, .flags = "--mode", .value = "fast|slow",
     .off = offsetof(demo, mode), .choices = modes, .help = "mode"},
    {.kind = MC_OPT_CALL, .flags = "--call", .value = "X", .call = on_call,
     .help = "a handler"},
    {.kind = MC_OPT_CALL, .flags = "--a-very-long-flag-name", .value = "X",
     .call = on_call, .help = "help on the next line"},
    {.kind = MC_OPT_TABLE, .sub = demo_sub},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

static const mc_opt_cmd demo_cmd = {
    .name = "demo",
    .usage = "usage: demo THING [options]\n",
    .footer = "the end\n",
    .positional = "THING",
    .positional_off = offsetof(demo, pos),
    .extra_hint = ": one THING only",
    .opts = demo_opts,
};

static char g_why[512];

/* Parse a NULL-terminated list of words into *d (zeroed, off = 1). */
static int demo_parse(demo *d, ...)
{
    char *argv[32] = {"demo"};
    int argc = 1;
    va_list ap;
    va_start(ap, d);
    for (char *a; (a = va_arg(ap, char *)) != NULL && argc < 31;)
        argv[argc++] = a;
    va_end(ap);
    memset(d, 0, sizeof *d);
    d->off = 1;
    g_why[0] = '\0';
    return mc_opt_parse(&demo_cmd, argc, argv, d, g_why, sizeof g_why);
}

static void assert_why(const char *want)
{
    if (!strstr(g_why, want))
        fail_msg("message '%s' lacks '%s'", g_why, want);
}

static void test_mc_opt_parses_every_kind_into_its_field(void **st)
{
    (void)st;
    demo d;
    assert_int_equal(demo_parse(&d, "thing", "-n", "x", "--on", "--no-off",
                                "--u32", "65536", "--u64",
                                "18446744073709551615", "--threads", "8",
                                "--temp", "0.5", "--mode", "slow", "--call",
                                "1", "--call", "2", "--top-p", "1", NULL),
                     0);
    assert_string_equal(d.pos, "thing");
    assert_string_equal(d.name, "x");
    assert_int_equal(d.on, 1);
    assert_int_equal(d.off, 0);
    assert_int_equal(d.u32, 65536);
    assert_true(d.u64 == UINT64_MAX);
    assert_int_equal(d.threads, 8);
    assert_true(d.f == 0.5f);
    assert_int_equal(d.mode, 2);
    assert_int_equal(d.n_calls, 2);
    assert_true(d.top_p == 1.0);
    /* --flag=value, the long name of an alias, an alias choice */
    assert_int_equal(demo_parse(&d, "--name=y", "--mode=quick", "--u32=7",
                                NULL), 0);
    assert_string_equal(d.name, "y");
    assert_int_equal(d.mode, 1);
    assert_int_equal(d.u32, 7);
    /* "--" ends the options; "-" is a positional */
    assert_int_equal(demo_parse(&d, "--", "--on", NULL), 0);
    assert_string_equal(d.pos, "--on");
    assert_int_equal(d.on, 0);
    assert_int_equal(demo_parse(&d, "-", NULL), 0);
    assert_string_equal(d.pos, "-");
    /* a value may start with '-' */
    assert_int_equal(demo_parse(&d, "--name", "-q", NULL), 0);
    assert_string_equal(d.name, "-q");
}

static void test_mc_opt_refuses_bad_numbers_naming_flag_and_range(void **st)
{
    (void)st;
    demo d;
    static const char *const bad_u[] = {"0", "65537", "0x10", "1e3", " 5",
                                        "5 ", "-1", "+3", "", "1.0", "nan",
                                        "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad_u / sizeof bad_u[0]; i++) {
        assert_int_equal(demo_parse(&d, "--u32", bad_u[i], NULL), -1);
        assert_why("--u32: expected a whole number in [1, 65536], got '");
        assert_int_equal(d.u32, 0);
    }
    assert_int_equal(demo_parse(&d, "--threads", "257", NULL), -1);
    assert_why("--threads: expected a whole number in [1, 256], got '257'");
    static const char *const bad_f[] = {"nan", "inf", "-inf", "1e400",
                                        "0x1p3", "10001", "-0.5", "1,5",
                                        "", "e5", "."};
    for (size_t i = 0; i < sizeof bad_f / sizeof bad_f[0]; i++) {
        assert_int_equal(demo_parse(&d, "--temp", bad_f[i], NULL), -1);
        assert_why("--temp: expected a finite number in [0, 10000], got '");
    }
    assert_int_equal(demo_parse(&d, "--top-p", "0", NULL), -1);
    assert_why("--top-p: expected a finite number in (0, 1], got '0'");
    assert_int_equal(demo_parse(&d, "--top-p=1.5", NULL), -1);
    assert_why("--top-p: expected a finite number in (0, 1], got '1.5'");
}

static void test_mc_opt_names_the_flag_in_every_usage_error(void **st)
{
    (void)st;
    demo d;
    assert_int_equal(demo_parse(&d, "--nope", NULL), -1);
    assert_string_equal(g_why, "unknown option '--nope'");
    assert_int_equal(demo_parse(&d, "--nope=3", NULL), -1);
    assert_string_equal(g_why, "unknown option '--nope'");
    assert_int_equal(demo_parse(&d, "-x", NULL), -1);
    assert_string_equal(g_why, "unknown option '-x'");
    assert_int_equal(demo_parse(&d, "--u32", NULL), -1);
    assert_string_equal(g_why, "--u32 needs a value (N)");
    assert_int_equal(demo_parse(&d, "--on=1", NULL), -1);
    assert_string_equal(g_why, "--on takes no value (got '1')");
    assert_int_equal(demo_parse(&d, "--mode", "medium", NULL), -1);
    /* the alias is accepted but not advertised */
    assert_string_equal(g_why, "--mode: expected fast or slow, got 'medium'");
    assert_int_equal(demo_parse(&d, "--call", "bad", NULL), -1);
    assert_string_equal(g_why, "--call: no 'bad' here");
    assert_int_equal(demo_parse(&d, "a", "b", NULL), -1);
    assert_string_equal(g_why, "unexpected argument 'b': one THING only");
}

static void test_mc_opt_help_comes_before_anything_else(void **st)
{
    (void)st;
    demo d;
    assert_int_equal(demo_parse(&d, "--u32", "0", "--help", NULL),
                     MC_OPT_HELP_ASKED);
    assert_int_equal(demo_parse(&d, "--nope", "-h", NULL), MC_OPT_HELP_ASKED);
    assert_int_equal(d.u32, 0);
    /* a value that reads "--help" is a value; after "--" a positional */
    assert_int_equal(demo_parse(&d, "--name", "--help", NULL), 0);
    assert_string_equal(d.name, "--help");
    assert_int_equal(demo_parse(&d, "--", "--help", NULL), 0);
    assert_string_equal(d.pos, "--help");
}

static void test_mc_opt_help_lays_out_every_row(void **st)
{
    (void)st;
    char *h = mc_opt_help(&demo_cmd);
    assert_non_null(h);
    assert_string_equal(
        h, "usage: demo THING [options]\n"
           "Things:\n"
           "  -n, --name NAME  a name\n"
           "                   second line\n"
           "  --on             switch on\n"
           "  --no-off         switch off\n"
           "  --u32 N          u32\n"
           "  --u64 N          u64\n"
           "  --threads N      threads\n"
           "  --temp T         temperature\n"
           "  --mode fast|slow mode\n"
           "  --call X         a handler\n"
           "  --a-very-long-flag-name X\n"
           "                   help on the next line\n"
           "  --top-p P        in (0, 1]\n"
           "  -h, --help       this text\n"
           "the end\n");
    free(h);
}

/* ---- the real tables ----------------------------------------------------- */

typedef struct flag_check {
    const char *help;      /* the --help text */
    const char *cmd;       /* for messages */
    char seen[128][40];    /* flags met so far (duplicates) */
    size_t n;
} flag_check;

/* The flag is in the help as a word (followed by a space, ',', '=' or a
 * line end), it is listed once, and a row with a value has a hint. */
static void check_flag(const char *flag, const mc_opt *row, void *ctx)
{
    flag_check *c = ctx;
    assert_true(flag[0] == '-');
    int found = 0;
    for (const char *p = c->help; (p = strstr(p, flag)) != NULL; p++) {
        char after = p[strlen(flag)];
        char before = p == c->help ? ' ' : p[-1];
        if ((before == ' ' || before == '[') &&
            (after == ' ' || after == ',' || after == '\n' || after == ']'))
            found = 1;
    }
    if (!found)
        fail_msg("%s --help does not list %s", c->cmd, flag);
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->seen[i], flag) == 0)
            fail_msg("%s lists %s twice", c->cmd, flag);
    assert_true(c->n < 128);
    snprintf(c->seen[c->n++], sizeof c->seen[0], "%s", flag);
    if (row->kind != MC_OPT_SET && row->kind != MC_OPT_CLEAR &&
        row->kind != MC_OPT_HELP && !row->value && row->kind != MC_OPT_CALL)
        fail_msg("%s %s takes a value without a hint", c->cmd, flag);
}

static const mc_opt_cmd *const g_cmds[] = {
    &cmp_cli_compile_cmd, &cmp_cli_merge_cmd, &cmp_cli_plan_cmd,
    &cmp_cli_inspect_cmd, &cmp_cli_eval_cmd,  &cmp_cli_export_cmd,
    &mrun_cmd};

/* argv of the program for cmd's --help ("mcompile plan" -> "plan"). */
static char *help_command(const mc_opt_cmd *cmd)
{
    if (cmd == &mrun_cmd)
        return tu_fmt("'%s/mrun' --help", MC_BIN_DIR);
    if (cmd == &cmp_cli_compile_cmd)
        return tu_fmt("'%s/mcompile' MODEL --help", MC_BIN_DIR);
    return tu_fmt("'%s/mcompile' %s --help", MC_BIN_DIR,
                  cmd->name + strlen("mcompile "));
}

static void test_every_flag_of_every_command_is_in_its_help(void **st)
{
    (void)st;
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) {
        flag_check *c = calloc(1, sizeof *c);
        assert_non_null(c);
        char *h = mc_opt_help(g_cmds[i]);
        assert_non_null(h);
        c->help = h;
        c->cmd = g_cmds[i]->name;
        mc_opt_each_flag(g_cmds[i]->opts, check_flag, c);
        assert_true(c->n >= 5); /* at least --json/-q/-v/-h/--help-ish */
        /* and the program prints that very text */
        char *cmd = help_command(g_cmds[i]), *out = NULL;
        assert_int_equal(tu_run(cmd, &out, NULL), 0);
        if (strcmp(out, h) != 0)
            fail_msg("%s: the program's --help is not its table's", cmd);
        free(out);
        free(cmd);
        free(h);
        free(c);
    }
}

static void test_compile_help_names_every_method(void **st)
{
    (void)st;
    char *h = mc_opt_help(&cmp_cli_compile_cmd);
    for (int m = 0; m <= CMP_QM_BEST_ALL; m++) {
        char word[32];
        snprintf(word, sizeof word, " %s ", cmp_qmethod_name((cmp_qmethod)m));
        if (!strstr(h, word))
            fail_msg("--method help lacks '%s'", word);
    }
    free(h);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "x --target 1G --method nope"), 2);
    free(out);
    assert_non_null(strstr(err, "--method: expected rtn, awq, gptq, best, "
                                "awq+gptq, gptaq, awq+gptaq or best-all, "
                                "got 'nope'"));
    free(err);
}

/* Each program refuses: exit 2, the message naming the flag. */
static void expect_refusal(const char *prog, const char *args,
                           const char *want)
{
    char *out = NULL, *err = NULL;
    int rc = tu_run_bin(&out, &err, prog, "%s", args);
    free(out);
    if (rc != 2 || !strstr(err, want))
        fail_msg("%s %s: exit %d, stderr '%s' (want exit 2 and '%s')", prog,
                 args, rc, err, want);
    free(err);
}

static void test_programs_refuse_bad_numbers_and_unknown_flags(void **st)
{
    (void)st;
    expect_refusal("mcompile", "plan cfg.json --target 1G --max-batch 0x10",
                   "mcompile plan: --max-batch: expected a whole number in "
                   "[1, 4294967295], got '0x10'");
    expect_refusal("mcompile", "plan cfg.json --target 1G --threads 1000",
                   "--threads: expected a whole number in [1, 256]");
    expect_refusal("mcompile", "plan cfg.json --target 1G --group 48",
                   "--group: expected 32, 64 or 128, got '48'");
    expect_refusal("mcompile", "plan cfg.json --target lots",
                   "--target: expected a size such as 24GiB");
    expect_refusal("mcompile", "plan cfg.json --target 0",
                   "--target: expected a size such as 24GiB, 1.5G, 512MiB "
                   "or 4096 (bytes), not 0, got '0'");
    expect_refusal("mcompile", "m --target 1G --zstd-level 20",
                   "mcompile: --zstd-level: expected a whole number in [1, "
                   "19], got '20'");
    expect_refusal("mcompile", "m --target 1G --heldout -1",
                   "--heldout: expected a whole number in [0, 1073741824]");
    expect_refusal("mcompile", "m --target 1G --lora d:nan",
                   "--lora weight: expected a finite number in [-1e+06, "
                   "1e+06], got 'nan'");
    expect_refusal("mcompile", "eval a --ref b --tokens c --max-seqs 0",
                   "mcompile eval: --max-seqs: expected a whole number in "
                   "[1, 1073741824], got '0'");
    expect_refusal("mcompile", "m --target 1G --bogus",
                   "mcompile: unknown option '--bogus'");
    expect_refusal("mcompile", "merge b --lora a -o o --bogus 1",
                   "mcompile merge: unknown option '--bogus'");
    expect_refusal("mcompile", "export a --format gguf -o x --bogus",
                   "mcompile export: unknown option '--bogus'");
    expect_refusal("mcompile", "inspect a --bogus",
                   "mcompile inspect: unknown option '--bogus'");
    expect_refusal("mcompile", "m1 m2 --target 1G",
                   "unexpected argument 'm2': a second model");
    expect_refusal("mrun", "m --tokens 1 --temperature nan",
                   "mrun: --temperature: expected a finite number in [0, "
                   "10000], got 'nan'");
    expect_refusal("mrun", "m --tokens 1 --max-new-tokens 1e3",
                   "--max-new-tokens: expected a whole number in [0, "
                   "1000000], got '1e3'");
    expect_refusal("mrun", "m --tokens 1 --device tpu",
                   "mrun: --device: expected cpu or cuda, got 'tpu'");
    expect_refusal("mrun", "m --tokens 1 --seed=-1",
                   "--seed: expected a whole number in [0, "
                   "18446744073709551615], got '-1'");
    expect_refusal("mrun", "m --tokens 1 --json=1",
                   "mrun: --json takes no value (got '1')");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mc_opt_parses_every_kind_into_its_field),
        cmocka_unit_test(test_mc_opt_refuses_bad_numbers_naming_flag_and_range),
        cmocka_unit_test(test_mc_opt_names_the_flag_in_every_usage_error),
        cmocka_unit_test(test_mc_opt_help_comes_before_anything_else),
        cmocka_unit_test(test_mc_opt_help_lays_out_every_row),
        cmocka_unit_test(test_every_flag_of_every_command_is_in_its_help),
        cmocka_unit_test(test_compile_help_names_every_method),
        cmocka_unit_test(test_programs_refuse_bad_numbers_and_unknown_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* cli_merge.c - `mcompile merge`: merge PEFT LoRA adapters into a base model
 * (the library is compiler/cmp_merge.h; this file parses options and
 * prints). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmp_cli.h"
#include "cmp_merge.h"
#include "fmt_model.h"
#include "mc_alloc.h"
#include "mc_parse.h"

#define MAX_ADAPTERS 64

static const char usage_text[] =
    "usage: mcompile merge BASE --lora ADAPTER_DIR[:WEIGHT] [--lora ...]\n"
    "                      -o OUT_DIR [--dtype keep|f32|f16|bf16] [--json]\n"
    "                      [-q] [-v]\n"
    "\n"
    "Merge PEFT LoRA adapters into the base weights, as PEFT's\n"
    "merge_and_unload does (LoRA, rsLoRA, DoRA, rank/alpha patterns,\n"
    "embedding LoRA, modules_to_save, biases).  BASE is a model directory or\n"
    "a .safetensors file with config.json beside it.  Several adapters are\n"
    "applied in order, each delta multiplied by its WEIGHT (default 1).\n"
    "Values are computed in float64 and rounded once to the output dtype\n"
    "(default: keep each tensor's dtype).  OUT_DIR mirrors BASE: same\n"
    "shards and names, index, config.json and tokenizer files; it appears\n"
    "whole or not at all.\n"
    "\n"
    "  --lora DIR[:W]   adapter directory (adapter_config.json +\n"
    "                   adapter_model.safetensors), optional weight W\n"
    "  -o, --output DIR output model directory (never an input; an existing\n"
    "                   one is replaced only if mcompile wrote it)\n"
    "  --dtype T        keep (default), f32, f16 or bf16\n"
    "  --json           print a JSON report on stdout\n"
    "  -q, --quiet      print nothing on success\n"
    "  -v, --verbose    list the adapters and what they change\n"
    "  -h, --help       this text\n"
    "\n"
    "exit status: 0 ok, 1 error (nothing written), 2 usage\n";

typedef struct opts {
    const char *base, *out;
    cmp_adapter_spec lora[MAX_ADAPTERS];
    char *lora_dirs[MAX_ADAPTERS]; /* owned copies (DIR part of DIR:W) */
    size_t n_lora;
    fmt_dtype dtype;               /* FMT_DT_INVALID = keep */
    const char *dtype_name;
    int json, quiet, verbose;
} opts;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "mcompile merge: ");
    fprintf(stderr, fmt, arg ? arg : "");
    fprintf(stderr, "\n(see mcompile merge --help)\n");
    return 2;
}

int cmp_cli_parse_lora(const char *arg, char **dir_out, double *weight,
                       char *why, size_t n)
{
    *dir_out = NULL;
    char *dir = strdup(arg);
    if (!dir) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    double w = 1.0;
    char *colon = strrchr(dir, ':');
    if (colon && colon[1]) {
        char *end;
        (void)strtod(colon + 1, &end); /* "reads as a number" (nan too) */
        if (*end == '\0') {
            if (mc_parse_f64("--lora weight", colon + 1, -1e6, 1e6, 0, &w,
                             why, n) != 0) {
                free(dir);
                return -1;
            }
            *colon = '\0';
        }
    }
    if (!dir[0]) {
        free(dir);
        snprintf(why, n, "--lora needs a directory");
        return -1;
    }
    *dir_out = dir;
    *weight = w;
    return 0;
}

static int parse_lora(opts *o, const char *arg)
{
    if (o->n_lora == MAX_ADAPTERS)
        return usage_error("too many --lora (at most 64)", NULL);
    char *dir, why[256];
    double w;
    if (cmp_cli_parse_lora(arg, &dir, &w, why, sizeof why) != 0)
        return usage_error("%s", why);
    o->lora_dirs[o->n_lora] = dir;
    o->lora[o->n_lora].dir = dir;
    o->lora[o->n_lora].weight = w;
    o->n_lora++;
    return 0;
}

static int parse_dtype(opts *o, const char *v)
{
    static const struct {
        const char *name;
        fmt_dtype dt;
    } t[] = {{"keep", FMT_DT_INVALID}, {"f32", FMT_DT_F32},
             {"f16", FMT_DT_F16},      {"bf16", FMT_DT_BF16},
             {"float32", FMT_DT_F32},  {"float16", FMT_DT_F16},
             {"bfloat16", FMT_DT_BF16}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(v, t[i].name) == 0) {
            o->dtype = t[i].dt;
            o->dtype_name = t[i].name;
            return 0;
        }
    return usage_error("--dtype must be keep, f32, f16 or bf16, not '%s'", v);
}

/* Value of an option given as "--opt VALUE" or "--opt=VALUE". */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static int parse_args(int argc, char **argv, opts *o)
{
    int only_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_positional || a[0] != '-' || a[1] == '\0') {
            if (o->base)
                return usage_error("unexpected argument '%s'", a);
            o->base = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_positional = 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
            o->verbose = 1;
        } else if (strncmp(a, "--lora", 6) == 0 && (a[6] == 0 || a[6] == '=')) {
            const char *v = opt_value(argc, argv, &i, "--lora");
            if (!v)
                return usage_error("--lora needs ADAPTER_DIR[:WEIGHT]", NULL);
            if (parse_lora(o, v))
                return 2;
        } else if (strcmp(a, "-o") == 0 ||
                   (strncmp(a, "--output", 8) == 0 &&
                    (a[8] == 0 || a[8] == '='))) {
            const char *v = a[1] == 'o' ? (i + 1 < argc ? argv[++i] : NULL)
                                        : opt_value(argc, argv, &i, "--output");
            if (!v || !*v)
                return usage_error("-o needs an output directory", NULL);
            o->out = v;
        } else if (strncmp(a, "--dtype", 7) == 0 &&
                   (a[7] == 0 || a[7] == '=')) {
            const char *v = opt_value(argc, argv, &i, "--dtype");
            if (!v)
                return usage_error("--dtype needs keep, f32, f16 or bf16",
                                   NULL);
            if (parse_dtype(o, v))
                return 2;
        } else {
            return usage_error("unknown option '%s'", a);
        }
    }
    if (!o->base)
        return usage_error("missing BASE (a model directory or .safetensors)",
                           NULL);
    if (!o->n_lora)
        return usage_error("at least one --lora ADAPTER_DIR is needed", NULL);
    if (!o->out)
        return usage_error("missing -o OUT_DIR", NULL);
    return 0;
}

static void print_json_report(const opts *o, const cmp_merge_report *r)
{
    json_t *ad = json_array();
    for (size_t i = 0; i < o->n_lora; i++)
        json_array_append_new(ad, json_pack("{s:s, s:f}", "dir", o->lora[i].dir,
                                            "weight", o->lora[i].weight));
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:o, s:s, s:I, s:I, s:I, s:I, s:b, s:f, s:I, s:f}",
        "status", "ok", "base", o->base, "output", o->out, "adapters", ad,
        "dtype", o->dtype_name, "tensors", (json_int_t)r->tensors,
        "tensors_touched", (json_int_t)r->tensors_touched, "lora_modules",
        (json_int_t)r->lora_modules, "replaced", (json_int_t)r->replaced,
        "untied_lm_head", r->untied_lm_head, "max_abs_delta",
        r->max_abs_delta, "bytes_written", (json_int_t)r->bytes_written,
        "seconds", r->seconds);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) : NULL;
    if (s) {
        printf("%s\n", s);
        json_free_t jfree;
        json_get_alloc_funcs(NULL, &jfree);
        jfree(s);
    }
    json_decref(j);
}

static int fail(const opts *o, const mc_error *e)
{
    char buf[2048];
    mc_error_format(e, buf, sizeof buf);
    fprintf(stderr, "mcompile merge: %s\n", buf);
    if (o->json) {
        json_t *j = json_pack("{s:s, s:i, s:s, s:s}", "status", "error",
                              "code", (int)e->status, "kind",
                              mc_status_str(e->status), "error", buf);
        char *s = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
        if (s) {
            printf("%s\n", s);
            json_free_t jfree;
            json_get_alloc_funcs(NULL, &jfree);
            jfree(s);
        }
        json_decref(j);
    }
    return 1;
}

/* Progress with ETA on stderr, only on a terminal, a few times a second. */
typedef struct progress {
    double start, last;
    int shown;
} progress;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void show_progress(uint64_t done, uint64_t total, void *ctx)
{
    progress *p = ctx;
    double t = mono();
    if (t - p->last < 0.25 && done < total)
        return;
    p->last = t;
    double frac = total ? (double)done / (double)total : 1.0;
    double el = t - p->start;
    double eta = frac > 0 ? el / frac - el : 0;
    fprintf(stderr, "\rmerging %3.0f%%  %.1f / %.1f GB  ETA %.0f s   ",
            100 * frac, (double)done / 1e9, (double)total / 1e9, eta);
    p->shown = 1;
}

static void print_verbose(const cmp_merge *m, FILE *out)
{
    size_t touched = 0;
    for (size_t i = 0; i < cmp_merge_tensor_count(m); i++) {
        int t = 0;
        const char *name = cmp_merge_tensor_name(m, i);
        cmp_merge_tensor_info(m, name, NULL, NULL, NULL, &t);
        if (t) {
            fprintf(out, "  changes %s\n", name);
            touched++;
        }
    }
    if (cmp_merge_unties_lm_head(m))
        fprintf(out, "  unties lm_head from embed_tokens\n");
    fprintf(out, "  %zu of %zu tensors change\n", touched,
            cmp_merge_tensor_count(m));
}

int cmp_cli_merge(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FMT_DT_INVALID;
    o.dtype_name = "keep";
    int rc = parse_args(argc, argv, &o);
    mc_error e;
    mc_error_clear(&e);
    fmt_model *base = NULL;
    cmp_merge *m = NULL;
    cmp_merge_report r;
    if (rc)
        goto done;
    if (fmt_model_open(o.base, &base, &e) != MC_OK ||
        cmp_merge_open(base, o.lora, o.n_lora, &m, &e) != MC_OK) {
        rc = fail(&o, &e);
        goto done;
    }
    FILE *info = o.json ? stderr : stdout;
    if (o.verbose)
        print_verbose(m, info);
    progress prog = {mono(), 0, 0};
    if (!o.quiet && !o.json && isatty(2))
        cmp_merge_set_progress(m, show_progress, &prog);
    mc_status wst = cmp_merge_write(m, o.out, o.dtype, &r, &e);
    if (prog.shown)
        fprintf(stderr, "\r\033[K");
    if (wst != MC_OK) {
        rc = fail(&o, &e);
        goto done;
    }
    if (o.json)
        print_json_report(&o, &r);
    else if (!o.quiet)
        fprintf(info,
                "merged %zu adapter%s into %zu of %zu tensors%s -> %s "
                "(%.1f MB, %.2f s, max |delta| %.3g)\n",
                r.adapters, r.adapters == 1 ? "" : "s", r.tensors_touched,
                r.tensors, r.untied_lm_head ? ", lm_head untied" : "", o.out,
                (double)r.bytes_written / 1e6, r.seconds, r.max_abs_delta);
done:
    cmp_merge_close(m);
    fmt_model_close(base);
    for (size_t i = 0; i < o.n_lora; i++)
        free(o.lora_dirs[i]);
    return rc;
}

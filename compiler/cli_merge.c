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

typedef struct opts {
    const char *base, *out;
    cmp_cli_loras lora;
    fmt_dtype dtype;               /* FMT_DT_INVALID = keep */
    const char *dtype_name;
    int json, quiet, verbose;
} opts;

static int on_dtype(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n)
{
    (void)row;
    opts *o = base;
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
    snprintf(why, n, "%s: expected keep, f32, f16 or bf16, got '%s'", flag,
             v);
    return -1;
}

static const mc_opt merge_opts[] = {
    {.kind = MC_OPT_CALL, .flags = "--lora", .value = "DIR[:W]",
     .off = offsetof(opts, lora), .call = cmp_cli_on_lora,
     .help = "adapter directory (adapter_config.json +\n"
             "adapter_model.safetensors), optional weight W"},
    {.kind = MC_OPT_STR, .flags = "-o, --output", .value = "DIR",
     .off = offsetof(opts, out),
     .help = "output model directory (never an input; an existing\n"
             "one is replaced only if mcompile wrote it)"},
    {.kind = MC_OPT_CALL, .flags = "--dtype", .value = "T", .call = on_dtype,
     .help = "keep (default), f32, f16 or bf16"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = offsetof(opts, json),
     .help = "print a JSON report on stdout"},
    {.kind = MC_OPT_SET, .flags = "-q, --quiet", .off = offsetof(opts, quiet),
     .help = "print nothing on success"},
    {.kind = MC_OPT_SET, .flags = "-v, --verbose",
     .off = offsetof(opts, verbose),
     .help = "list the adapters and what they change"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

const mc_opt_cmd cmp_cli_merge_cmd = {
    .name = "mcompile merge",
    .usage =
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
        "\n",
    .footer = "\nexit status: 0 ok, 1 error (nothing written), 2 usage\n",
    .positional = "BASE",
    .positional_off = offsetof(opts, base),
    .opts = merge_opts,
};

/* After the table: what the options need together.  0, or 2 (printed). */
static int check_args(const opts *o)
{
    const mc_opt_cmd *c = &cmp_cli_merge_cmd;
    if (!o->base)
        return cmp_cli_usage(c, "missing BASE (a model directory or "
                             ".safetensors)");
    if (!o->lora.n)
        return cmp_cli_usage(c, "at least one --lora ADAPTER_DIR is needed");
    if (!o->out)
        return cmp_cli_usage(c, "missing -o OUT_DIR");
    if (!*o->out)
        return cmp_cli_usage(c, "-o needs an output directory");
    return 0;
}

static void print_json_report(const opts *o, const cmp_merge_report *r)
{
    json_t *ad = json_array();
    for (size_t i = 0; i < o->lora.n; i++)
        json_array_append_new(ad, json_pack("{s:s, s:f}", "dir",
                                            o->lora.spec[i].dir, "weight",
                                            o->lora.spec[i].weight));
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
    opts o;
    memset(&o, 0, sizeof o);
    o.dtype = FMT_DT_INVALID;
    o.dtype_name = "keep";
    mc_error e;
    mc_error_clear(&e);
    fmt_model *base = NULL;
    cmp_merge *m = NULL;
    cmp_merge_report r;
    int rc = cmp_cli_parse(&cmp_cli_merge_cmd, argc, argv, &o);
    if (rc >= 0)
        goto done; /* --help, or a usage error */
    if ((rc = check_args(&o)) != 0)
        goto done;
    if (fmt_model_open(o.base, &base, &e) != MC_OK ||
        cmp_merge_open(base, o.lora.spec, o.lora.n, &m, &e) != MC_OK) {
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
    cmp_cli_loras_free(&o.lora);
    return rc;
}

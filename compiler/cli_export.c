/* cli_export.c - `mcompile export`: write a compiled artifact (or a model
 * directory) as GGUF for llama.cpp or as a compressed-tensors directory for
 * vLLM and transformers (the library is compiler/cmp_export.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cmp_cli.h"
#include "cmp_export.h"
#include "mc_alloc.h"

/* Every option of `mcompile export`. */
typedef struct export_cli {
    const char *in, *out, *fmt, *int4;
    cmp_export_opts o;
    int json, quiet, verbose;
} export_cli;

static const mc_opt_choice format_choices[] = {
    {"gguf", CMP_EXPORT_GGUF, 0}, {"compressed-tensors", CMP_EXPORT_CT, 0},
    {NULL, 0, 0}};

/* --format: the value (for the report) and the format. */
static int on_format(void *base, const mc_opt *row, const char *flag,
                     const char *v, char *why, size_t n)
{
    (void)row;
    export_cli *e = base;
    for (const mc_opt_choice *c = format_choices; c->name; c++)
        if (strcmp(v, c->name) == 0) {
            e->fmt = c->name;
            e->o.format = (cmp_export_format)c->value;
            return 0;
        }
    snprintf(why, n, "%s: expected gguf or compressed-tensors, got '%s'",
             flag, v);
    return -1;
}

static const mc_opt export_opts[] = {
    {.kind = MC_OPT_CALL, .flags = "--format", .value = "F",
     .call = on_format, .help = "gguf or compressed-tensors"},
    {.kind = MC_OPT_STR, .flags = "-o, --output", .value = "OUT",
     .off = offsetof(export_cli, out),
     .help = "the .gguf file, or the output directory"},
    {.kind = MC_OPT_STR, .flags = "--gguf-int4", .value = "T",
     .off = offsetof(export_cli, int4),
     .help = "gguf: asymmetric int4 groups as q5_0 (default:\n"
             "exact, 5.5 bits per weight), q4_1 (5 bits; its f16\n"
             "offset rounds scale x zero, a shift of up to 1/136\n"
             "of a scale: the report says how much) or q8_0\n"
             "(exact, 8.5 bits)"},
    {.kind = MC_OPT_SET, .flags = "--strict",
     .off = offsetof(export_cli, o.strict),
     .help = "refuse instead of the float32 fallback"},
    {.kind = MC_OPT_SET, .flags = "--ignore-sliding-window",
     .off = offsetof(export_cli, o.ignore_window),
     .help = "gguf: export a sliding-window model anyway\n"
             "(llama.cpp's llama/qwen2 graphs attend to the whole\n"
             "context: outputs agree only up to the window)"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = offsetof(export_cli, json),
     .help = "print a JSON report on stdout"},
    {.kind = MC_OPT_SET, .flags = "-q, --quiet",
     .off = offsetof(export_cli, quiet), .help = "print nothing on success"},
    {.kind = MC_OPT_SET, .flags = "-v, --verbose",
     .off = offsetof(export_cli, verbose),
     .help = "also print the tokenizer and the largest tensor"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

const mc_opt_cmd cmp_cli_export_cmd = {
    .name = "mcompile export",
    .usage =
    "usage: mcompile export INPUT --format gguf|compressed-tensors -o OUT\n"
    "                       [--gguf-int4 q4_1|q5_0|q8_0] [--strict]\n"
    "                       [--ignore-sliding-window] [--json] [-q] [-v]\n"
    "\n"
    "Write a compiled artifact (.mca) or a model directory for another\n"
    "engine.  gguf: one file for llama.cpp (metadata, the embedded\n"
    "tokenizer, int8 as Q8_0, symmetric int4 (--quant int4-sym) as Q4_0,\n"
    "asymmetric int4 as --gguf-int4 says).\n"
    "compressed-tensors: a Hugging Face directory (config.json with its\n"
    "quantization_config, model.safetensors, tokenizer files) for vLLM\n"
    "(tensor-parallel serving) and transformers; int4 and int8 are\n"
    "pack-quantized.  A rotated artifact needs nothing more: the rotation\n"
    "is in its weights.  A quantized tensor the format cannot hold as it is\n"
    "(a row that is not a multiple of 32 for GGUF, or of the int4 group\n"
    "for compressed-tensors) is written as float32 with our exact\n"
    "dequantized values, and said so; --strict refuses instead.  One tensor\n"
    "is in memory at a time; the output appears whole or not at all.\n"
    "\n",
    .footer = "\nexit status: 0 ok, 1 error (nothing written), 2 usage\n",
    .positional = "INPUT",
    .positional_off = offsetof(export_cli, in),
    .extra_hint = ": one INPUT only",
    .opts = export_opts,
};

int cmp_cli_export(int argc, char **argv)
{
    export_cli ec;
    memset(&ec, 0, sizeof ec);
    int rc = cmp_cli_parse(&cmp_cli_export_cmd, argc, argv, &ec);
    if (rc >= 0)
        return rc;
    const mc_opt_cmd *cmd = &cmp_cli_export_cmd;
    if (!ec.in)
        return cmp_cli_usage(cmd, "no INPUT");
    if (!ec.out)
        return cmp_cli_usage(cmd, "no -o OUT");
    if (!ec.fmt)
        return cmp_cli_usage(cmd, "no --format (gguf or compressed-tensors)");
    const char *in = ec.in, *out = ec.out, *fmt = ec.fmt;
    int json = ec.json, quiet = ec.quiet, verbose = ec.verbose;
    cmp_export_opts o = ec.o;
    const char *int4 = ec.int4;
    if (int4 && o.format != CMP_EXPORT_GGUF)
        return cmp_cli_usage(cmd, "--gguf-int4 applies to --format gguf "
                                  "only, not %s", fmt);
    if (o.ignore_window && o.format != CMP_EXPORT_GGUF)
        return cmp_cli_usage(cmd, "--ignore-sliding-window applies to --format "
                                  "gguf only (compressed-tensors keeps the "
                                  "window in config.json), not %s", fmt);
    if (int4 && !strcmp(int4, "q4_1"))
        o.gguf_int4 = CMP_GGUF_INT4_Q4_1;
    else if (int4 && !strcmp(int4, "q5_0"))
        o.gguf_int4 = CMP_GGUF_INT4_Q5_0;
    else if (int4 && !strcmp(int4, "q8_0"))
        o.gguf_int4 = CMP_GGUF_INT4_Q8_0;
    else if (int4)
        return cmp_cli_usage(cmd, "--gguf-int4: expected q4_1, q5_0 or "
                                  "q8_0, got '%s'", int4);
    cmp_export_report rep;
    mc_error err;
    mc_error_clear(&err);
    mc_status st = cmp_export(in, out, &o, &rep, &err);
    if (st != MC_OK) {
        char line[2048];
        fprintf(stderr, "mcompile export: %s\n",
                mc_error_format(&err, line, sizeof line));
    }
    if (json) {
        json_t *j = json_pack(
            "{s:s, s:s, s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:I, "
            "s:I, s:f, s:s, s:b, s:{s:I, s:I, s:s, s:s, s:I, s:f}}",
            "input", in, "output", out, "format", fmt, "status", (int)st,
            "error", st == MC_OK ? "" : err.message, "tensors",
            (json_int_t)rep.tensors, "quantized", (json_int_t)rep.quantized,
            "fallback", (json_int_t)rep.fallback, "bytes",
            (json_int_t)rep.bytes, "tokenizer", rep.tokenizer, "arch",
            rep.arch, "q4_1_blocks", (json_int_t)rep.q4_1_blocks,
            "q4_1_inexact", (json_int_t)rep.q4_1_inexact, "q4_1_max_err",
            rep.q4_1_max_err, "tokenizer_note", rep.tokenizer_note,
            "dense_embed", rep.dense_embed, "q8_0", "tensors",
            (json_int_t)rep.q8_tensors, "exact", (json_int_t)rep.q8_exact,
            "exact_names", rep.q8_exact_names, "inexact_first",
            rep.q8_inexact_first, "rows_inexact",
            (json_int_t)rep.q8_rows_inexact, "max_scale_err", rep.q8_max_err);
        char *t = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        if (t)
            printf("%s\n", t);
        mc_free(t);
        json_decref(j);
    } else if (st == MC_OK && !quiet) {
        printf("exported %s -> %s (%s, %s): %zu tensors, %zu quantized, "
               "%llu bytes\n", in, out, fmt, rep.arch, rep.tensors,
               rep.quantized, (unsigned long long)rep.bytes);
        if (rep.fallback)
            printf("  %zu quantized tensor%s written as float32 (exact "
                   "dequantized values); first: %s: %s\n", rep.fallback,
                   rep.fallback == 1 ? "" : "s", rep.fallback_first,
                   rep.fallback_why);
        if (rep.dense_embed)
            printf("  the quantized embeddings (the tied output layer) "
                   "written dequantized in float32: the engines look them "
                   "up dense\n");
        if (rep.q8_exact)
            printf("  Q8_0 from int8, bit-exact (each row's scale an f16 "
                   "value): %s\n", rep.q8_exact_names);
        if (rep.q8_tensors > rep.q8_exact)
            printf("  Q8_0 from int8, not exact: %zu tensor%s (first: %s), "
                   "%llu rows whose f32 scale the f16 block scale rounds "
                   "by up to %.2g of it\n", rep.q8_tensors - rep.q8_exact,
                   rep.q8_tensors - rep.q8_exact == 1 ? "" : "s",
                   rep.q8_inexact_first,
                   (unsigned long long)rep.q8_rows_inexact, rep.q8_max_err);
        if (rep.q4_1_inexact)
            printf("  Q4_1: %llu of %llu blocks differ from ours by up to "
                   "%.2g of their scale (the f16 offset); --gguf-int4 q5_0 "
                   "(the default) is exact\n", (unsigned long long)rep.q4_1_inexact,
                   (unsigned long long)rep.q4_1_blocks, rep.q4_1_max_err);
        if (rep.tokenizer_note[0])
            printf("  tokenizer: llama.cpp will differ from Hugging Face "
                   "where: %s\n", rep.tokenizer_note);
        if (verbose)
            printf("  tokenizer: %s; largest input tensor %llu bytes (the "
                   "export holds about one tensor)\n", rep.tokenizer,
                   (unsigned long long)rep.largest_tensor);
    }
    return st == MC_OK ? 0 : 1;
}

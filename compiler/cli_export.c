/* cli_export.c - `mcompile export`: write a compiled artifact (or a model
 * directory) as GGUF for llama.cpp or as a compressed-tensors directory for
 * vLLM and transformers (the library is compiler/cmp_export.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cmp_cli.h"
#include "cmp_export.h"
#include "mc_alloc.h"

static const char usage_text[] =
    "usage: mcompile export INPUT --format gguf|compressed-tensors -o OUT\n"
    "                       [--gguf-int4 q4_1|q5_0|q8_0] [--strict]\n"
    "                       [--ignore-sliding-window] [--json] [-q] [-v]\n"
    "\n"
    "Write a compiled artifact (.mca) or a model directory for another\n"
    "engine.  gguf: one file for llama.cpp (metadata, the embedded\n"
    "tokenizer, int8 as Q8_0, symmetric int4 as Q4_0, asymmetric int4 as\n"
    "--gguf-int4 says).\n"
    "compressed-tensors: a Hugging Face directory (config.json with its\n"
    "quantization_config, model.safetensors, tokenizer files) for vLLM\n"
    "(tensor-parallel serving) and transformers; int4 and int8 are\n"
    "pack-quantized.  A rotated artifact needs nothing more: the rotation\n"
    "is in its weights.  A quantized tensor the format cannot hold as it is\n"
    "(a row that is not a multiple of 32 for GGUF, or of the int4 group\n"
    "for compressed-tensors) is written as float32 with our exact\n"
    "dequantized values, and said so; --strict refuses instead.  One tensor\n"
    "is in memory at a time; the output appears whole or not at all.\n"
    "\n"
    "  --format F       gguf or compressed-tensors\n"
    "  -o, --output OUT the .gguf file, or the output directory\n"
    "  --gguf-int4 T    gguf: asymmetric int4 groups as q5_0 (default:\n"
    "                   exact, 5.5 bits per weight), q4_1 (5 bits; its f16\n"
    "                   offset rounds scale x zero, a shift of up to 1/136\n"
    "                   of a scale: the report says how much) or q8_0\n"
    "                   (exact, 8.5 bits)\n"
    "  --strict         refuse instead of the float32 fallback\n"
    "  --ignore-sliding-window\n"
    "                   gguf: export a sliding-window model anyway\n"
    "                   (llama.cpp's llama/qwen2 graphs attend to the whole\n"
    "                   context: outputs agree only up to the window)\n"
    "  --json           print a JSON report on stdout\n"
    "  -q, --quiet      print nothing on success\n"
    "  -v, --verbose    also print the tokenizer and the largest tensor\n"
    "  -h, --help       this text\n"
    "\n"
    "exit status: 0 ok, 1 error (nothing written), 2 usage\n";

static int usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "mcompile export: %s%s\n(see mcompile export --help)\n",
            msg, arg ? arg : "");
    return 2;
}

int cmp_cli_export(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *fmt = NULL, *int4 = NULL;
    int json = 0, quiet = 0, verbose = 0;
    cmp_export_opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--format") || !strcmp(a, "-o") ||
                   !strcmp(a, "--output") || !strcmp(a, "--gguf-int4")) {
            if (i + 1 >= argc)
                return usage_error("missing value after ", a);
            if (!strcmp(a, "--format"))
                fmt = argv[++i];
            else if (!strcmp(a, "--gguf-int4"))
                int4 = argv[++i];
            else
                out = argv[++i];
        } else if (!strcmp(a, "--strict")) {
            o.strict = 1;
        } else if (!strcmp(a, "--ignore-sliding-window")) {
            o.ignore_window = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option ", a);
        } else if (!in) {
            in = a;
        } else {
            return usage_error("more than one INPUT: ", a);
        }
    }
    if (!in)
        return usage_error("no INPUT", NULL);
    if (!out)
        return usage_error("no -o OUT", NULL);
    if (!fmt)
        return usage_error("no --format (gguf or compressed-tensors)", NULL);
    if (!strcmp(fmt, "gguf"))
        o.format = CMP_EXPORT_GGUF;
    else if (!strcmp(fmt, "compressed-tensors"))
        o.format = CMP_EXPORT_CT;
    else
        return usage_error("--format is gguf or compressed-tensors, not ",
                           fmt);
    if (int4 && o.format != CMP_EXPORT_GGUF)
        return usage_error("--gguf-int4 applies to --format gguf only, not ",
                           fmt);
    if (o.ignore_window && o.format != CMP_EXPORT_GGUF)
        return usage_error("--ignore-sliding-window applies to --format gguf "
                           "only (compressed-tensors keeps the window in "
                           "config.json), not ", fmt);
    if (int4 && !strcmp(int4, "q4_1"))
        o.gguf_int4 = CMP_GGUF_INT4_Q4_1;
    else if (int4 && !strcmp(int4, "q5_0"))
        o.gguf_int4 = CMP_GGUF_INT4_Q5_0;
    else if (int4 && !strcmp(int4, "q8_0"))
        o.gguf_int4 = CMP_GGUF_INT4_Q8_0;
    else if (int4)
        return usage_error("--gguf-int4 is q4_1, q5_0 or q8_0, not ", int4);
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
            "s:I, s:f, s:s}",
            "input", in, "output", out, "format", fmt, "status", (int)st,
            "error", st == MC_OK ? "" : err.message, "tensors",
            (json_int_t)rep.tensors, "quantized", (json_int_t)rep.quantized,
            "fallback", (json_int_t)rep.fallback, "bytes",
            (json_int_t)rep.bytes, "tokenizer", rep.tokenizer, "arch",
            rep.arch, "q4_1_blocks", (json_int_t)rep.q4_1_blocks,
            "q4_1_inexact", (json_int_t)rep.q4_1_inexact, "q4_1_max_err",
            rep.q4_1_max_err, "tokenizer_note", rep.tokenizer_note);
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

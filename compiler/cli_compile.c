/* cli_compile.c - `mcompile MODEL --target SIZE [-o OUT.mca] ...`: merge,
 * convert, plan and emit an artifact (cmp_compile.h).  This file holds the
 * option table and the checks of the options together; what the command
 * prints is cli_compile_report.c. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_compile_report.h"
#include "cmp_cli.h"
#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"
#include "mc_parse.h"

/* Every option of the compile form. */
typedef struct compile_cli {
    cmp_compile_opts o;    /* model, out, calib, req, ... as the library
                              takes them */
    cmp_cli_loras lora;
    uint64_t heldout;      /* --heldout N; UINT64_MAX: not given */
    int calib_device;      /* -1 not given, 0 cpu, 1 cuda */
    int awq_grid;          /* -1 not given, 0 coarse, 1 full */
    int calib_stages;      /* 0 not given, else 1, 2 or 4 */
    int calib_stats;       /* -1 not given, 0 bf16 (the default), 1 f32 */
    int calib_fwd;         /* -1 not given, 0 bf16 (the default), 1 f32 */
    int calib_full_pass;   /* -1 not given, 0 bf16, 1 f32 */
    uint64_t calib_seqs;   /* 0 not given */
    uint64_t calib_full_layers; /* 0 not given */
    int calib_refine;      /* -1 not given, 0 on, 1 off */
    int method_set;        /* --method given */
    int no_rotate, json, quiet, verbose;
} compile_cli;

/* --quant: a format of the plan's, or auto (int4 is what it starts from;
 * the group may follow). */
static int on_quant(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n)
{
    compile_cli *c = base;
    if (strcmp(v, "auto") == 0) {
        mc_error e;
        cmp_wpolicy keep = c->o.req.policy; /* an earlier --lm-head */
        cmp_wpolicy_parse("int4", c->o.req.policy.group, &c->o.req.policy,
                          &e);
        c->o.req.policy.lm_head_set = keep.lm_head_set;
        c->o.req.policy.lm_head_fmt = keep.lm_head_fmt;
        c->o.quant_auto = 1;
        return 0;
    }
    if (cmp_cli_on_quant(base, row, flag, v, why, n) != 0) {
        snprintf(why, n, "%s: expected f32, f16, bf16, int8, int4, int4-sym or "
                 "auto, got '%s'", flag, v);
        return -1;
    }
    c->o.quant_auto = 0;
    return 0;
}

/* --method: every name cmp_qmethod_parse knows, listed when refused. */
static int on_method(void *base, const mc_opt *row, const char *flag,
                     const char *v, char *why, size_t n)
{
    (void)row;
    compile_cli *c = base;
    if (cmp_qmethod_parse(v, &c->o.method) == 0) {
        c->method_set = 1;
        return 0;
    }
    char list[256] = "";
    for (int m = 0; m <= CMP_QM_BEST_ALL; m++) {
        size_t k = strlen(list);
        snprintf(list + k, sizeof list - k, "%s%s",
                 m == 0 ? "" : m == CMP_QM_BEST_ALL ? " or " : ", ",
                 cmp_qmethod_name((cmp_qmethod)m));
    }
    snprintf(why, n, "%s: expected %s, got '%s'", flag, list, v);
    return -1;
}

static const mc_opt_choice device_choices[] = {
    {"cpu", 0, 0}, {"cuda", 1, 0}, {NULL, 0, 0}};
static const mc_opt_choice awq_grid_choices[] = {
    {"coarse", 0, 0}, {"full", 1, 0}, {NULL, 0, 0}};
static const mc_opt_choice stats_choices[] = {
    {"bf16", 0, 0}, {"f32", 1, 0}, {NULL, 0, 0}};
static const mc_opt_choice refine_choices[] = {
    {"on", 0, 0}, {"off", 1, 0}, {NULL, 0, 0}};
static const mc_opt_choice stages_choices[] = {
    {"1", 1, 0}, {"2", 2, 0}, {"4", 4, 0}, {NULL, 0, 0}};

#define F(field) offsetof(compile_cli, field)

static const mc_opt compile_opts[] = {
    {.kind = MC_OPT_STR, .flags = "-o", .value = "OUT.mca", .off = F(o.out),
     .help = "output (default: MODEL's name + .mca, here)"},
    {.kind = MC_OPT_CALL, .flags = "--lora", .value = "DIR[:W]",
     .off = F(lora), .call = cmp_cli_on_lora,
     .help = "merge a PEFT LoRA adapter with weight W (default 1);\n"
             "repeatable; merged in memory, never written to disk"},
    {.kind = MC_OPT_CALL, .flags = "--quant", .value = "Q", .off = F(o.req),
     .call = on_quant,
     .help = "f32 | f16 | bf16 | int8 | int4 | int4-sym | auto\n"
             "(default f16); int4 has a scale and a zero per group,\n"
             "int4-sym a scale only (GGUF's Q4_0 at --group 32);\n"
             "auto picks int4 / int8 / f16 per linear layer to\n"
             "fit --target (needs --calib, --max-batch, --max-seq)"},
    {.kind = MC_OPT_TABLE, .sub = cmp_cli_plan_opts, .off = F(o.req)},
    {.kind = MC_OPT_STR, .flags = "--calib", .value = "FILE",
     .off = F(o.calib),
     .help = "calibration data: token ids (one sequence per line) or\n"
             "plain text, tokenized with the tokenizer.json beside\n"
             "MODEL and cut into sequences of up to 512 tokens"},
    {.kind = MC_OPT_U64, .flags = "--heldout", .value = "N",
     .off = F(heldout), .ulo = 0, .uhi = 1u << 30,
     .help = "calibration sequences kept out for the quality\n"
             "summary (default a tenth; 0: calibrate on all)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-device", .value = "cpu|cuda",
     .off = F(calib_device), .choices = device_choices,
     .help = "where the calibration statistics are summed\n"
             "(default cpu; cuda: cuBLAS in double)"},
    {.kind = MC_OPT_CALL, .flags = "--calib-memory", .value = "SIZE",
     .off = F(o.calib_memory), .ulo = 1, .call = cmp_cli_on_size,
     .help = "memory budget of the calibration (default 75%\n"
             "of RAM); over it, first slower scale refits and\n"
             "whole-block moves, then the widest inputs keep\n"
             "lean statistics (no GPTAQ there)"},
    {.kind = MC_OPT_CALL, .flags = "--method", .value = "M",
     .call = on_method,
     .help = "rtn | awq | gptq | gptaq | awq+gptq | awq+gptaq |\n"
             "best | best-all (default best with --calib: gptaq,\n"
             "and awq+gptaq or act-order only where a cheap proxy\n"
             "says they can win; best-all tries every method on\n"
             "every group; without --calib, plain round-to-nearest;\n"
             "only gptaq, awq+gptaq and the best ones run the\n"
             "full-precision pass: the others are about twice as\n"
             "fast and report errors on their own inputs)"},
    {.kind = MC_OPT_CHOICE, .flags = "--awq-grid", .value = "coarse|full",
     .off = F(awq_grid), .choices = awq_grid_choices,
     .help = "AWQ's alpha search (awq and best methods): coarse\n"
             "(default) tries 11 of the 20 alphas 0..0.95, every\n"
             "third then the neighbours of the best; full tries\n"
             "all 20 (the same pick where the error is unimodal)"},
    {.kind = MC_OPT_F64, .flags = "--calib-time", .value = "SECONDS",
     .off = F(o.calib_time_s), .flo = 0.0, .fhi = 1e9,
     .fflags = MC_PARSE_LO_OPEN,
     .help = "a time budget for the calibration: the effort\n"
             "(--method gptaq, then --calib-refine off, then\n"
             "--calib-full-layers, then gptq, then --calib-stages,\n"
             "then --calib-seqs) is cut until the estimate fits;\n"
             "the estimate rests on a rate measured at start, so\n"
             "the choice depends on the machine and its load: the\n"
             "options printed reproduce the artifact without it"},
    {.kind = MC_OPT_F64, .flags = "--calib-passes", .value = "N",
     .off = F(o.calib_passes), .flo = 0.0, .fhi = 1e6,
     .help = "without --calib-time, the effort is cut as\n"
             "--calib-time cuts it (down to gptq unrefined; never\n"
             "fewer stages or tokens) until the estimate is within\n"
             "N forward passes over the calibration tokens, or\n"
             "10 minutes at 100 G multiply-adds/s: the same\n"
             "choice on every machine (default 7: a 7B shape's\n"
             "default is cut, a 135M's is not; 0: no cap)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-stages", .value = "1|2|4",
     .off = F(calib_stages), .choices = stages_choices,
     .help = "passes collecting a block's statistics (default 4:\n"
             "each input group after the ones before it are\n"
             "quantized, the passes reusing each other's work;\n"
             "2 and 1 are less exact and, on Llama-family\n"
             "shapes, no cheaper)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-stats", .value = "bf16|f32",
     .off = F(calib_stats), .choices = stats_choices,
     .help = "products of the calibration statistics (default\n"
             "bf16: inputs rounded to bfloat16, sums in float per\n"
             "128 tokens and in double across: the same bits on\n"
             "every CPU, ~1.5x faster where it has AVX512_BF16;\n"
             "f32: float inputs, the artifacts of before)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-forward", .value = "bf16|f32",
     .off = F(calib_fwd), .choices = stats_choices,
     .help = "products of the quantized pass's int8/int4\n"
             "linears (default bf16: activations rounded to\n"
             "bfloat16, codes exact, scales after: the same bits\n"
             "on every CPU, ~1.9x the rate where it has\n"
             "AVX512_BF16; f32: float activations, the artifacts\n"
             "of before)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-full-pass", .value = "bf16|f32",
     .off = F(calib_full_pass), .choices = stats_choices,
     .help = "products of the full-precision weights (the\n"
             "unquantized model's pass that gptaq and best aim\n"
             "at, and the linears not yet quantized): bf16,\n"
             "weights and activations rounded to bfloat16,\n"
             "~1.8x the rate where the CPU has AVX512_BF16; f32:\n"
             "float (default bf16 with int4 / int4-sym linears,\n"
             "f32 otherwise: int8's error is near bfloat16's\n"
             "rounding); bf16 needs --calib-forward bf16"},
    {.kind = MC_OPT_U64, .flags = "--calib-seqs", .value = "N",
     .off = F(calib_seqs), .ulo = 1, .uhi = 1u << 30,
     .help = "calibrate on the first N sequences not held out\n"
             "(default all)"},
    {.kind = MC_OPT_U64, .flags = "--calib-full-layers", .value = "N",
     .off = F(calib_full_layers), .ulo = 1, .uhi = 1u << 20,
     .help = "gptaq / best: the full-precision pass and its\n"
             "statistics on the first N blocks only; the blocks\n"
             "after them calibrate on their own inputs (as\n"
             "gptq): less time than gptaq on every block, less\n"
             "error than gptq (default: the first half, rounded\n"
             "up, with int8 linears; every block with int4;\n"
             "--calib-time steps down to 3/4, 1/2 and 1/4)"},
    {.kind = MC_OPT_CHOICE, .flags = "--calib-refine", .value = "on|off",
     .off = F(calib_refine), .choices = refine_choices,
     .help = "after GPTQ: refit the group scales, move codes\n"
             "by +-1 where the error drops, refit again (on,\n"
             "the default); off keeps GPTQ's codes as they come:\n"
             "a few % more error, a search ~3x faster (the\n"
             "most of a 7B layer's time; --calib-time takes it\n"
             "after gptaq unless on is given)"},
    {.kind = MC_OPT_SET, .flags = "--no-rotate", .off = F(no_rotate),
     .help = "with --calib, do not rotate the model first (the\n"
             "default rotates the residual stream and value heads\n"
             "by Hadamard matrices: same function, less error;\n"
             "a tied model then stores its own lm_head too)"},
    {.kind = MC_OPT_SET, .flags = "--compress", .off = F(o.compress),
     .help = "zstd every section (level 3; --zstd-level N)"},
    {.kind = MC_OPT_INT, .flags = "--zstd-level", .value = "N",
     .off = F(o.zstd_level), .ulo = 1, .uhi = 19,
     .help = "zstd level of --compress, 1 to 19"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = F(json),
     .help = "one JSON object on stdout"},
    {.kind = MC_OPT_SET, .flags = "-q", .off = F(quiet), .help = "quieter"},
    {.kind = MC_OPT_SET, .flags = "-v", .off = F(verbose),
     .help = "print the whole plan (and with --calib, the time\n"
             "of each phase; --json has them too)"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

#undef F

const mc_opt_cmd cmp_cli_compile_cmd = {
    .name = "mcompile",
    .usage =
        "usage: mcompile MODEL --target SIZE [-o OUT.mca] [options]\n"
        "  MODEL            Hugging Face directory (or .safetensors / "
        "index.json)\n",
    .footer = "exit: 0 ok, 1 failure (or the plan does not fit), 2 usage\n",
    .positional = "MODEL",
    .positional_off = offsetof(compile_cli, o.model),
    .extra_hint = ": a second model, or a command mcompile does not know",
    .opts = compile_opts,
};

/* What the options need together.  Returns -1 to go on, else 2 (the
 * usage error printed).  Fills what depends on several options. */
static int check_args(compile_cli *c)
{
    const mc_opt_cmd *cmd = &cmp_cli_compile_cmd;
    cmp_compile_opts *o = &c->o;
    if (!o->model || o->req.target_bytes == 0)
        return cmp_cli_usage(cmd, "need MODEL and --target SIZE");
    if (o->quant_auto && !o->calib)
        return cmp_cli_usage(cmd, "--quant auto measures each layer on "
                             "calibration ids: add --calib FILE");
    if (o->quant_auto && (!o->req.max_batch || !o->req.max_seq))
        return cmp_cli_usage(cmd, "--quant auto needs --max-batch and "
                             "--max-seq (the budget is weights + KV cache "
                             "+ activations)");
    if (o->calib && !o->quant_auto && o->req.policy.linear != KN_W_Q8 &&
        o->req.policy.linear != KN_W_Q4 && o->req.policy.linear != KN_W_Q4S)
        return cmp_cli_usage(cmd, "--calib quantizes the linear layers: use "
                             "it with --quant int8, int4, int4-sym or auto");
    if (c->method_set && !o->calib)
        return cmp_cli_usage(cmd, "--method needs --calib FILE (without "
                             "calibration ids, compile rounds to nearest)");
    if ((o->calib_memory || c->calib_device >= 0) && !o->calib)
        return cmp_cli_usage(cmd, "--calib-memory and --calib-device need "
                             "--calib FILE");
    if (c->awq_grid >= 0 && !o->calib)
        return cmp_cli_usage(cmd, "--awq-grid needs --calib FILE");
    if (c->calib_stats >= 0 && !o->calib)
        return cmp_cli_usage(cmd, "--calib-stats needs --calib FILE");
    if (c->calib_fwd >= 0 && !o->calib)
        return cmp_cli_usage(cmd, "--calib-forward needs --calib FILE");
    if (c->calib_full_pass >= 0 && !o->calib)
        return cmp_cli_usage(cmd, "--calib-full-pass needs --calib FILE");
    if (c->calib_full_pass == 0 && c->calib_fwd == 1)
        return cmp_cli_usage(cmd, "--calib-full-pass bf16 needs the "
                             "quantized pass in bfloat16 too: leave out "
                             "--calib-forward f32");
    if ((o->calib_time_s > 0.0 || c->calib_stages || c->calib_seqs ||
         c->calib_full_layers) && !o->calib)
        return cmp_cli_usage(cmd, "--calib-time, --calib-stages, --calib-seqs "
                             "and --calib-full-layers need --calib FILE");
    if (o->calib_passes >= 0.0 && (!o->calib || o->calib_time_s > 0.0))
        return cmp_cli_usage(cmd, "--calib-passes needs --calib FILE and "
                             "no --calib-time (a budget in seconds replaces "
                             "the cap)");
    if (o->calib_passes >= 0.0 && o->quant_auto)
        return cmp_cli_usage(cmd, "--calib-passes does not cover --quant "
                             "auto's measuring pass (nor does the default "
                             "cap): use --quant int8, int4 or int4-sym");
    if (o->calib_passes < 0.0)
        o->calib_passes = CMP_CALIB_PASSES_DEFAULT;
    if (c->calib_refine >= 0 && !o->calib)
        return cmp_cli_usage(cmd, "--calib-refine needs --calib FILE");
    if (o->calib_time_s > 0.0 && o->quant_auto)
        return cmp_cli_usage(cmd, "--calib-time does not cover --quant "
                             "auto's measuring pass: use --quant int8, "
                             "int4 or int4-sym");
    o->calib_stages = (uint32_t)c->calib_stages;
    o->calib_seqs = (size_t)c->calib_seqs;
    o->calib_full_layers = (uint32_t)c->calib_full_layers;
    o->calib_no_refine = c->calib_refine == 1;
    o->calib_refine_fixed = c->calib_refine == 0;
    o->method_fixed = c->method_set;
    o->awq_full_grid = c->awq_grid == 1;
    if (c->heldout != UINT64_MAX && !o->calib)
        return cmp_cli_usage(cmd, "--heldout needs --calib FILE");
    if (c->heldout != UINT64_MAX)
        o->heldout = c->heldout ? (long)c->heldout : -1; /* 0: none */
    o->calib_gpu = c->calib_device == 1;
    o->calib_stats_f32 = c->calib_stats == 1;
    o->calib_fwd_f32 = c->calib_fwd == 1;
    o->calib_full_pass = c->calib_full_pass < 0   ? CMP_FULL_PASS_DEFAULT
                         : c->calib_full_pass == 0 ? CMP_FULL_PASS_BF16
                                                   : CMP_FULL_PASS_F32;
    o->rotate = o->calib && !c->no_rotate;
    if (o->calib && !c->method_set)
        o->method = CMP_QM_BEST;
    o->adapters = c->lora.spec;
    o->n_adapters = c->lora.n;
    return -1;
}

/* "<name>.mca" in the current directory, name being the model's real last
 * component: "." or "../x/" name the directory they resolve to, not a
 * hidden "..mca". */
static char *default_out(const char *model)
{
    char buf[PATH_MAX > 4096 ? PATH_MAX : 4096];
    if (!realpath(model, buf))
        snprintf(buf, sizeof buf, "%s", model);
    if (strcmp(buf, "/") == 0)
        snprintf(buf, sizeof buf, "model"); /* the root has no name */
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *b = strrchr(buf, '/');
    b = b ? b + 1 : buf;
    char out[4200];
    snprintf(out, sizeof out, "%s.mca", b);
    return mc_strdup(out);
}

int cmp_cli_compile(int argc, char **argv)
{
    compile_cli c;
    memset(&c, 0, sizeof c);
    cmp_plan_request_default(&c.o.req);
    c.heldout = UINT64_MAX;
    c.calib_device = -1;
    c.awq_grid = -1;
    c.calib_stats = -1;
    c.calib_fwd = -1;
    c.calib_full_pass = -1;
    c.calib_refine = -1;
    c.o.calib_passes = -1.0; /* not given */
    char *out_owned = NULL;
    int rc = cmp_cli_parse(&cmp_cli_compile_cmd, argc, argv, &c);
    if (rc < 0)
        rc = check_args(&c);
    if (rc >= 0)
        goto done;
    cmp_compile_opts *o = &c.o;
    cmp_cli_calib_prog cp = {!c.quiet && !c.json && isatty(2), !c.quiet, 0.0};
    o->progress = cmp_cli_calib_progress;
    o->capped = cmp_cli_calib_capped;
    o->progress_ctx = &cp;
    o->threads = 0; /* every CPU: kernels give the same bits on any count */
    if (!o->out)
        o->out = out_owned = default_out(o->model);
    struct stat st;
    if (o->out && stat(o->out, &st) == 0 && !fmt_art_is_artifact(o->out)) {
        fprintf(stderr, "mcompile: refusing to overwrite '%s': it exists and "
                "is not an mcompile artifact (an input?)\n", o->out);
        rc = 1;
        goto done;
    }
    cmp_compile_report rep;
    mc_error err;
    mc_error_clear(&err);
    double t0 = cmp_cli_mono_s();
    mc_status s = cmp_compile(o, &rep, &err);
    double seconds = cmp_cli_mono_s() - t0;
    rc = s == MC_OK ? 0 : 1;
    if (s == MC_ERR_PLAN && rep.plan.total_bytes) {
        char bd[256];
        if (!c.quiet && !c.json)
            cmp_cli_print_plan(stderr, &rep.cfg, &rep.plan);
        fprintf(stderr, "mcompile: batch %u x context %llu does not fit: %s\n",
                rep.plan.limits.max_batch,
                (unsigned long long)rep.plan.limits.max_seq,
                cmp_plan_breakdown(&rep.plan, bd, sizeof bd));
    } else if (s != MC_OK) {
        char buf[1600];
        fprintf(stderr, "mcompile: %s\n", mc_error_format(&err, buf, sizeof buf));
    }
    cmp_cli_compile_print(o, &rep, s, seconds, c.json, c.quiet, c.verbose);
    cmp_compile_report_release(&rep);
done:
    cmp_cli_loras_free(&c.lora);
    mc_free(out_owned);
    return rc;
}

/* cli_opts.c - what the option tables of mcompile's commands share
 * (cmp_cli.h): the parse-and-report step, the plan's options (plan and
 * compile) and --lora (merge and compile). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_cli.h"
#include "cmp_plan.h"
#include "mc_parse.h"

int cmp_cli_usage(const mc_opt_cmd *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see %s --help)\n", cmd->name);
    return 2;
}

int cmp_cli_parse(const mc_opt_cmd *cmd, int argc, char **argv, void *base)
{
    char why[1024];
    int r = mc_opt_parse(cmd, argc, argv, base, why, sizeof why);
    if (r == MC_OPT_HELP_ASKED) {
        char *h = mc_opt_help(cmd);
        if (!h) {
            fprintf(stderr, "%s: out of memory\n", cmd->name);
            return 1;
        }
        fputs(h, stdout);
        free(h);
        return 0;
    }
    return r ? cmp_cli_usage(cmd, "%s", why) : -1;
}

/* ---- --lora DIR[:W] ------------------------------------------------------ */

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

int cmp_cli_on_lora(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n)
{
    cmp_cli_loras *l = (cmp_cli_loras *)((char *)base + row->off);
    if (l->n == CMP_CLI_MAX_ADAPTERS) {
        snprintf(why, n, "%s: at most %d adapters", flag,
                 CMP_CLI_MAX_ADAPTERS);
        return -1;
    }
    if (cmp_cli_parse_lora(v, &l->dirs[l->n], &l->spec[l->n].weight, why,
                           n) != 0)
        return -1;
    l->spec[l->n].dir = l->dirs[l->n];
    l->n++;
    return 0;
}

void cmp_cli_loras_free(cmp_cli_loras *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->dirs[i]); /* cmp_cli_parse_lora: strdup */
    l->n = 0;
}

/* ---- the plan's options (base: a cmp_plan_request) ----------------------- */

static int size_value(const char *flag, const char *v, uint64_t lo,
                      uint64_t hi, uint64_t *out, char *why, size_t n)
{
    uint64_t u;
    if (cmp_parse_size(v, &u) != 0 || u < lo || u > hi) {
        snprintf(why, n, "%s: expected a size such as 24GiB, 1.5G, 512MiB "
                 "or 4096 (bytes)%s, got '%s'", flag,
                 lo ? ", not 0" : "", v);
        return -1;
    }
    *out = u;
    return 0;
}

int cmp_cli_on_size(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n)
{
    return size_value(flag, v, row->ulo, row->uhi ? row->uhi : UINT64_MAX,
                      (uint64_t *)((char *)base + row->off), why, n);
}

static int on_reserve(void *base, const mc_opt *row, const char *flag,
                      const char *v, char *why, size_t n)
{
    uint64_t u;
    if (size_value(flag, v, 0, INT64_MAX, &u, why, n) != 0)
        return -1;
    ((cmp_plan_request *)((char *)base + row->off))->reserve_bytes =
        (int64_t)u;
    return 0;
}

int cmp_cli_on_quant(void *base, const mc_opt *row, const char *flag,
                     const char *v, char *why, size_t n)
{
    cmp_plan_request *r = (cmp_plan_request *)((char *)base + row->off);
    mc_error e;
    mc_error_clear(&e);
    cmp_wpolicy keep = r->policy; /* an earlier --lm-head survives */
    if (cmp_wpolicy_parse(v, r->policy.group, &r->policy, &e) != MC_OK) {
        snprintf(why, n, "%s: expected f32, f16, bf16, int8, int4 or "
                 "int4-sym, got '%s'", flag, v);
        return -1;
    }
    r->policy.lm_head_set = keep.lm_head_set;
    r->policy.lm_head_fmt = keep.lm_head_fmt;
    return 0;
}

static int on_lm_head(void *base, const mc_opt *row, const char *flag,
                      const char *v, char *why, size_t n)
{
    cmp_plan_request *r = (cmp_plan_request *)((char *)base + row->off);
    static const struct {
        const char *name;
        kn_wformat f;
    } c[] = {{"f32", KN_W_F32}, {"f16", KN_W_F16}, {"bf16", KN_W_BF16},
             {"int8", KN_W_Q8}, {"int4", KN_W_Q4}, {"int4-sym", KN_W_Q4S}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (strcmp(v, c[i].name) == 0) {
            r->policy.lm_head_set = 1; /* also kept by a later --quant */
            r->policy.lm_head_fmt = c[i].f;
            return 0;
        }
    snprintf(why, n, "%s: expected f32, f16, bf16, int8, int4 or int4-sym, "
             "got '%s'", flag, v);
    return -1;
}

static int on_group(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n)
{
    cmp_plan_request *r = (cmp_plan_request *)((char *)base + row->off);
    uint64_t g = 0;
    if (mc_parse_u64(flag, v, 32, 128, &g, why, n) != 0 ||
        (g != 32 && g != 64 && g != 128)) {
        snprintf(why, n, "%s: expected 32, 64 or 128, got '%s'", flag, v);
        return -1;
    }
    r->policy.group = (uint32_t)g; /* also read by a later --quant */
    return 0;
}

static int on_kv(void *base, const mc_opt *row, const char *flag,
                 const char *v, char *why, size_t n)
{
    cmp_plan_request *r = (cmp_plan_request *)((char *)base + row->off);
    if (kn_kvtype_parse(v, &r->kv_type) != 0) {
        snprintf(why, n, "%s: expected f16, int8 or f32, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

static int on_device(void *base, const mc_opt *row, const char *flag,
                     const char *v, char *why, size_t n)
{
    cmp_plan_request *r = (cmp_plan_request *)((char *)base + row->off);
    if (strcmp(v, "cpu") == 0)
        r->device = CMP_DEV_CPU;
    else if (strcmp(v, "cuda") == 0)
        r->device = CMP_DEV_CUDA;
    else {
        snprintf(why, n, "%s: expected cpu or cuda, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

#define R(field) offsetof(cmp_plan_request, field)

/* Rows whose fields are plain take their offset in cmp_plan_request; the
 * handlers take the request itself (off 0) and reach their field. */
const mc_opt cmp_cli_plan_opts[] = {
    {.kind = MC_OPT_CALL, .flags = "--target", .value = "SIZE",
     .off = R(target_bytes), .ulo = 1, .call = cmp_cli_on_size,
     .help = "memory available: 24GiB, 24G, 1.5GiB, 512MiB, bytes"},
    {.kind = MC_OPT_CALL, .flags = "--group", .value = "G", .call = on_group,
     .help = "int4 / int4-sym group size 32 | 64 | 128 (default 128)"},
    {.kind = MC_OPT_U32, .flags = "--max-batch", .value = "B",
     .off = R(max_batch), .ulo = 1, .uhi = UINT32_MAX,
     .help = "sequences per step (default: the most that fit, <= 64)"},
    {.kind = MC_OPT_U64, .flags = "--max-seq", .value = "T",
     .off = R(max_seq), .ulo = 1, .uhi = UINT32_MAX,
     .help = "context per sequence (default min(max_position, 4096))"},
    {.kind = MC_OPT_U32, .flags = "--prefill-chunk", .value = "C",
     .off = R(prefill_chunk), .ulo = 1, .uhi = UINT32_MAX,
     .help = "token rows per step (default min(256, batch x context))"},
    {.kind = MC_OPT_INT, .flags = "--threads", .value = "N",
     .off = R(threads), .ulo = 1, .uhi = 256,
     .help = "threads the plan is sized for (default 4)"},
    {.kind = MC_OPT_CALL, .flags = "--lm-head", .value = "F",
     .call = on_lm_head,
     .help = "output layer f32 | f16 | bf16 | int8 | int4 |\n"
             "int4-sym (default: int8 with quantized linears; one\n"
             "untied by the rotation: f32 from an f32 checkpoint,\n"
             "else the embedding's format); int4 at --group, round\n"
             "to nearest, as GGUF's --pure Q4_0 / Q4_1; tied, the\n"
             "output layer is the embedding: its format (f16 keeps\n"
             "a float embedding)"},
    {.kind = MC_OPT_CALL, .flags = "--kv", .value = "f16|int8|f32",
     .call = on_kv, .help = "KV cache type (default f16)"},
    {.kind = MC_OPT_CALL, .flags = "--device", .value = "cpu|cuda",
     .call = on_device,
     .help = "reserve default: cpu 32 MiB, cuda 1 GiB + 32 MiB"},
    {.kind = MC_OPT_CALL, .flags = "--reserve", .value = "SIZE",
     .call = on_reserve, .help = "device reserve, overriding the default"},
    {.kind = MC_OPT_END},
};

#undef R

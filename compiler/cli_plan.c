/* cli_plan.c - `mcompile plan MODEL_OR_CONFIG --target SIZE ...`: the memory
 * breakdown, the batch x context frontier and what dominates, from
 * config.json alone (no weights needed). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cmp_cli.h"
#include "cmp_compile.h"
#include "cmp_plan.h"
#include "cmp_svg.h"
#include "rt_plan.h"
#include "fmt_atomic.h"
#include "fmt_config.h"
#include "fmt_input.h"
#include "mc_alloc.h"

#define GIB 1073741824.0

/* Every option of `mcompile plan`. */
typedef struct plan_cli {
    cmp_plan_request req;
    const char *model;     /* MODEL_OR_CONFIG */
    const char *svg_path;  /* --svg, or NULL */
    int json, calibrated;
    int quiet_verbose;     /* -q, -v: accepted, nothing to change */
} plan_cli;

static const mc_opt plan_opts[] = {
    {.kind = MC_OPT_CALL, .flags = "--quant", .value = "Q",
     .off = offsetof(plan_cli, req), .call = cmp_cli_on_quant,
     .help = "f32 | f16 | bf16 | int8 | int4 | int4-sym (default f16)"},
    {.kind = MC_OPT_TABLE, .sub = cmp_cli_plan_opts,
     .off = offsetof(plan_cli, req)},
    {.kind = MC_OPT_STR, .flags = "--svg", .value = "FILE",
     .off = offsetof(plan_cli, svg_path),
     .help = "also draw the plan (budget bars per format and the\n"
             "batch x context frontier) as an SVG picture"},
    {.kind = MC_OPT_SET, .flags = "--calibrated",
     .off = offsetof(plan_cli, calibrated),
     .help = "plan what `mcompile --calib` compiles: its rotation\n"
             "gives a tied model its own output layer"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = offsetof(plan_cli, json),
     .help = "one JSON object on stdout"},
    {.kind = MC_OPT_SET, .flags = "-q, -v",
     .off = offsetof(plan_cli, quiet_verbose),
     .help = "accepted for symmetry (the plan is the output)"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

const mc_opt_cmd cmp_cli_plan_cmd = {
    .name = "mcompile plan",
    .usage = "usage: mcompile plan MODEL_OR_CONFIG --target SIZE [options]\n"
             "  MODEL_OR_CONFIG  a model directory, a config.json, or a file "
             "beside\n                   one (weights are not read)\n",
    .footer = "exit: 0 fits, 1 does not fit (breakdown on stderr) or error, "
              "2 usage\n",
    .positional = "MODEL_OR_CONFIG",
    .positional_off = offsetof(plan_cli, model),
    .extra_hint = ": one model only",
    .opts = plan_opts,
};

/* config.json of a model directory, a .json path, or beside a file. */
static char *config_path_for(const char *arg)
{
    struct stat st;
    size_t n = strlen(arg);
    char *p = mc_malloc(n + 16);
    if (!p)
        return NULL;
    if (stat(arg, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(p, n + 16, "%s/config.json", arg);
    } else if (n >= 5 && strcmp(arg + n - 5, ".json") == 0 &&
               !strstr(arg, "index.json")) {
        snprintf(p, n + 16, "%s", arg);
    } else {
        const char *slash = strrchr(arg, '/');
        if (slash)
            snprintf(p, n + 16, "%.*s/config.json", (int)(slash - arg), arg);
        else
            snprintf(p, n + 16, "config.json");
    }
    return p;
}

int cmp_cli_load_config(const char *arg, fmt_model_config *cfg, char *path,
                        size_t n)
{
    char *p = config_path_for(arg);
    if (!p) {
        fprintf(stderr, "mcompile: out of memory\n");
        return 1;
    }
    snprintf(path, n, "%s", p);
    mc_error err;
    mc_status st = fmt_config_load(p, cfg, &err);
    mc_free(p);
    if (st != MC_OK) {
        char buf[1600];
        fprintf(stderr, "mcompile: %s\n", mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    return 0;
}

void cmp_cli_print_plan(FILE *o, const fmt_model_config *cfg,
                        const cmp_plan *p)
{
    char buf[512];
    fprintf(o, "model: %s, %u layers, hidden %u, heads %u/%u, vocab %u, "
            "%llu parameters\n", cfg->model_type, cfg->num_layers,
            cfg->hidden_size, cfg->num_heads, cfg->num_kv_heads,
            cfg->vocab_size, (unsigned long long)p->params);
    /* The output layer's format too: --lm-head and the int8 rule for
     * quantized linears make it differ from the linears' (cfg is the
     * compiled model's: untied when a calibrated compile rotates). */
    int tied = cfg->tie_word_embeddings;
    uint32_t group = cmp_wpolicy_linear_group(&p->req.policy);
    kn_wformat head = cmp_plan_role_format(
        &p->req.policy, tied ? CMP_ROLE_EMBED : CMP_ROLE_LM_HEAD, tied);
    char groups[48] = "";
    if (group)
        snprintf(groups, sizeof groups, " groups of %u", group);
    char head_group[48] = "";
    if (head == KN_W_Q4 || head == KN_W_Q4S)
        snprintf(head_group, sizeof head_group, " groups of %u",
                 p->req.policy.group);
    fprintf(o, "weights: --quant %s (linear %s%s), output layer %s%s%s, "
            "KV %s, device %s\n",
            p->req.policy.quant, kn_wformat_name(p->req.policy.linear),
            groups, kn_wformat_name(head), head_group,
            tied ? " (the tied embedding)" : "",
            kn_kvtype_name(p->limits.kv_type),
            p->req.device == CMP_DEV_CUDA ? "cuda" : "cpu");
    fprintf(o, "plan: batch %u x context %llu (%s), prefill chunk %u, "
            "threads %d\n", p->limits.max_batch,
            (unsigned long long)p->limits.max_seq,
            p->chosen ? "chosen" : "requested", p->limits.prefill_chunk,
            p->limits.threads);
    fprintf(o, "  weights      %9.2f GiB  %llu bytes\n", p->weights_bytes / GIB,
            (unsigned long long)p->weights_bytes);
    fprintf(o, "  KV cache     %9.2f GiB  %llu bytes (%llu per token%s)\n",
            p->kv_bytes / GIB, (unsigned long long)p->kv_bytes,
            (unsigned long long)p->kv_bytes_per_token,
            cfg->sliding_window ? ", capped by the sliding window" : "");
    fprintf(o, "  activations  %9.2f GiB  %llu bytes (logits %llu, sampler "
            "%llu, attention workspace %llu; buffers share bytes by "
            "lifetime)\n", p->activation_bytes / GIB,
            (unsigned long long)p->activation_bytes,
            (unsigned long long)p->logits_bytes,
            (unsigned long long)p->sampler_bytes,
            (unsigned long long)p->workspace_bytes);
    fprintf(o, "  reserve      %9.2f GiB  %llu bytes (%s)\n",
            p->reserve_bytes / GIB, (unsigned long long)p->reserve_bytes,
            p->reserve_source);
    if (p->job_bytes)
        fprintf(o, "  dataset job  %9.2f GiB  %llu bytes (mrun --input "
                "buffers at the default --max-line-bytes %llu and "
                "--hold-bytes %llu; beside the total)\n",
                p->job_bytes / GIB, (unsigned long long)p->job_bytes,
                RT_JOB_DEFAULT_LINE_BYTES, RT_JOB_DEFAULT_HOLD_BYTES);
    fprintf(o, "  total        %9.2f GiB  of target %.2f GiB: %s\n",
            p->total_bytes / GIB, p->target_bytes / GIB,
            p->fits ? "fits" : "DOES NOT FIT");
    fprintf(o, "frontier (longest context that fits per batch size):\n");
    fprintf(o, "  %7s  %11s\n", "batch", "max context");
    for (size_t i = 0; i < p->nfrontier; i++)
        fprintf(o, "  %7u  %11llu%s\n", p->frontier[i].batch,
                (unsigned long long)p->frontier[i].max_seq,
                p->frontier[i].max_seq == cfg->max_position_embeddings
                    ? "  (model maximum)" : "");
    if (p->nfrontier == 0)
        fprintf(o, "  (nothing fits)\n");
    fprintf(o, "%s\n", cmp_plan_dominant(p, buf, sizeof buf));
}

/* Render the plan picture and write it atomically; 0 on success. */
static int write_svg(const char *path, const fmt_model_config *cfg,
                     const cmp_plan *plan)
{
    mc_error err;
    mc_error_clear(&err);
    char *svg = NULL;
    fmt_atomic_file *f = NULL;
    /* an existing file is replaced only if it is an earlier picture */
    mc_status st = fmt_output_check_ours(path, "a plan picture mcompile "
                                         "wrote", "<?xml", CMP_SVG_MARK,
                                         1024, &err);
    if (st == MC_OK)
        st = cmp_plan_svg(cfg, plan, &svg, &err);
    if (st == MC_OK)
        st = fmt_atomic_create(path, &f, &err);
    if (st == MC_OK)
        st = fmt_atomic_write(f, svg, strlen(svg), &err);
    if (st == MC_OK) {
        st = fmt_atomic_commit(f, &err);
        f = NULL;
    }
    fmt_atomic_abort(f);
    mc_free(svg);
    if (st != MC_OK) {
        char buf[1600];
        fprintf(stderr, "mcompile plan: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    return 0;
}

int cmp_cli_plan(int argc, char **argv)
{
    plan_cli pc;
    memset(&pc, 0, sizeof pc);
    cmp_plan_request_default(&pc.req);
    int rc = cmp_cli_parse(&cmp_cli_plan_cmd, argc, argv, &pc);
    if (rc >= 0)
        return rc;
    if (!pc.model || pc.req.target_bytes == 0)
        return cmp_cli_usage(&cmp_cli_plan_cmd,
                             "need MODEL_OR_CONFIG and --target");
    cmp_plan_request req = pc.req;
    const char *model = pc.model, *svg_path = pc.svg_path;
    int json = pc.json, calibrated = pc.calibrated;
    fmt_model_config cfg;
    char cpath[4096];
    if (cmp_cli_load_config(model, &cfg, cpath, sizeof cpath) != 0)
        return 1;
    /* the declared dtype stands for the checkpoint's (weights not read) */
    if (calibrated)
        cmp_plan_untie_for_rotation(&cfg, &req.policy,
                                    cfg.torch_dtype == FMT_DT_F32);
    /* the tokenizer.json beside config.json: compile would embed it */
    char *slash = strrchr(cpath, '/');
    if (slash) {
        *slash = '\0';
        req.tokenizer_bytes = cmp_plan_tokenizer_bytes(cpath);
        *slash = '/';
    } else {
        req.tokenizer_bytes = cmp_plan_tokenizer_bytes(".");
    }
    cmp_plan plan;
    mc_error err;
    mc_error_clear(&err);
    mc_status st = cmp_plan_build(&cfg, &req, &plan, &err);
    if (st != MC_OK && st != MC_ERR_PLAN) {
        char buf[1600];
        fprintf(stderr, "mcompile plan: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    /* The picture is drawn for plans that do not fit too: it shows why. */
    if (svg_path && write_svg(svg_path, &cfg, &plan) != 0)
        return 1;
    if (json) {
        json_t *o = cmp_plan_to_json(&plan);
        char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        if (s)
            printf("%s\n", s);
        mc_free(s);
        json_decref(o);
    } else {
        cmp_cli_print_plan(stdout, &cfg, &plan);
    }
    if (st == MC_ERR_PLAN) {
        char bd[256];
        fprintf(stderr, "mcompile plan: batch %u x context %llu does not fit: "
                "%s\n", plan.limits.max_batch,
                (unsigned long long)plan.limits.max_seq,
                cmp_plan_breakdown(&plan, bd, sizeof bd));
        return 1;
    }
    return 0;
}

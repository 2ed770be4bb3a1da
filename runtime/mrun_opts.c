/* mrun_opts.c - mrun's option table and the checks of its options
 * (mrun_opts.h). */
#include "mrun_opts.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_file.h"
#include "fmt_ids.h"
#include "fmt_input.h"
#include "mc_alloc.h"
#include "mc_parse.h"
#include "rt_stopstr.h"

void *mrun_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "mrun: out of memory\n");
        exit(1);
    }
    return q;
}

void mrun_seqs_add(mrun_seqs *s, const int32_t *ids, size_t n)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->ids = mrun_xrealloc(s->ids, s->cap * sizeof *s->ids);
        s->len = mrun_xrealloc(s->len, s->cap * sizeof *s->len);
    }
    s->ids[s->n] = mrun_xrealloc(NULL, n * sizeof *ids);
    if (n)
        memcpy(s->ids[s->n], ids, n * sizeof *ids);
    s->len[s->n++] = n;
}

static void texts_add(mrun_cli *c, const char *t)
{
    if (c->n_texts == c->cap_texts) {
        c->cap_texts = c->cap_texts ? 2 * c->cap_texts : 8;
        c->texts = mrun_xrealloc(c->texts, c->cap_texts * sizeof *c->texts);
    }
    c->texts[c->n_texts++] = t;
}

static int usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mrun: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(see mrun --help)\n");
    return 2;
}

/* One list of ids in fmt_ids syntax ("1 2 3") into a new array.  Returns
 * 0, or -1 with the message in why[wn].  allow_empty: "" gives zero ids. */
static int parse_id_list(const char *opt, const char *v, int allow_empty,
                         int32_t **out, size_t *n, char *why, size_t wn)
{
    *out = NULL;
    *n = 0;
    if (allow_empty && v[strspn(v, " \t")] == '\0')
        return 0;
    fmt_ids *f = NULL;
    mc_error e;
    mc_error_clear(&e);
    if (fmt_ids_parse(v, strlen(v), opt, 0, &f, &e) != MC_OK) {
        snprintf(why, wn, "%s: '%s' is not a list of token ids: %s", opt, v,
                 e.message);
        return -1;
    }
    int rc = 0;
    if (f->n_seqs != 1) {
        snprintf(why, wn, "%s: one line of token ids expected", opt);
        rc = -1;
    } else {
        *out = mrun_xrealloc(NULL, f->n_ids * sizeof **out);
        memcpy(*out, f->ids, f->n_ids * sizeof **out);
        *n = f->n_ids;
    }
    fmt_ids_free(f);
    return rc;
}

/* ---- handlers of the rows a field cannot say -------------------------- */

/* --tokens (one more prompt), --score-label (one more label): an id list
 * appended to the mrun_seqs at the row's offset. */
static int on_seq(void *base, const mc_opt *r, const char *flag,
                  const char *v, char *why, size_t n)
{
    mrun_cli *c = base;
    int32_t *ids;
    size_t k;
    if (parse_id_list(flag, v, 0, &ids, &k, why, n))
        return -1;
    mrun_seqs_add((mrun_seqs *)((char *)base + r->off), ids, k);
    free(ids);
    if (r->off == offsetof(mrun_cli, labels))
        c->score_labels = 1;
    return 0;
}

/* --stop-string: one more stop string (repeatable). */
static int on_stop_string(void *base, const mc_opt *r, const char *flag,
                          const char *v, char *why, size_t n)
{
    (void)r;
    mrun_cli *c = base;
    size_t len = strlen(v);
    if (len == 0 || len > RT_STOP_STRING_MAX) {
        snprintf(why, n, "%s: a stop string has 1..%d bytes", flag,
                 RT_STOP_STRING_MAX);
        return -1;
    }
    if (c->n_stop_str == c->cap_stop_str) {
        c->cap_stop_str = c->cap_stop_str ? 2 * c->cap_stop_str : 4;
        c->stop_str = mrun_xrealloc(c->stop_str, c->cap_stop_str *
                                                     sizeof *c->stop_str);
        c->stop_str_len = mrun_xrealloc(
            c->stop_str_len, c->cap_stop_str * sizeof *c->stop_str_len);
    }
    c->stop_str[c->n_stop_str] = v;
    c->stop_str_len[c->n_stop_str++] = len;
    return 0;
}

static int on_prompt(void *base, const mc_opt *r, const char *flag,
                     const char *v, char *why, size_t n)
{
    (void)r, (void)flag, (void)why, (void)n;
    texts_add(base, v);
    return 0;
}

static void seqs_free(mrun_seqs *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->ids[i]);
    free(s->ids);
    free(s->len);
    memset(s, 0, sizeof *s);
}

/* --stop, --score-continuation: a later one replaces. */
static int on_ids(void *base, const mc_opt *r, const char *flag,
                  const char *v, char *why, size_t n)
{
    mrun_cli *c = base;
    int32_t **dst = r->off == offsetof(mrun_cli, stop) ? &c->stop : &c->cont;
    size_t *cnt = dst == &c->stop ? &c->n_stop : &c->n_cont;
    free(*dst);
    *dst = NULL;
    *cnt = 0;
    if (parse_id_list(flag, v, dst == &c->stop, dst, cnt, why, n))
        return -1;
    if (dst == &c->cont)
        c->score_cont = 1;
    return 0;
}

/* --score-labels replaces every label with one-token labels
 * (--score-label appends one label of one or more tokens: on_seq). */
static int on_labels(void *base, const mc_opt *r, const char *flag,
                     const char *v, char *why, size_t n)
{
    (void)r;
    mrun_cli *c = base;
    int32_t *ids;
    size_t k;
    if (parse_id_list(flag, v, 0, &ids, &k, why, n))
        return -1;
    seqs_free(&c->labels);
    for (size_t i = 0; i < k; i++)
        mrun_seqs_add(&c->labels, ids + i, 1);
    free(ids);
    c->score_labels = 1;
    return 0;
}

/* ---- the table ---------------------------------------------------------- */

static const mc_opt_choice kv_choices[] = {
    {"f32", 1, 0}, {"f16", 2, 0}, {"int8", 3, 0}, {"i8", 3, 1}, {NULL, 0, 0}};
static const mc_opt_choice truncate_choices[] = {
    {"left", 1, 0}, {"right", 2, 0}, {NULL, 0, 0}};
static const mc_opt_choice schedule_choices[] = {
    {"continuous", 0, 0}, {"waves", 1, 0}, {NULL, 0, 0}};
static const mc_opt_choice device_choices[] = {
    {"cpu", MCRT_DEVICE_CPU, 0}, {"cuda", MCRT_DEVICE_CUDA, 0}, {NULL, 0, 0}};

#define F(field) offsetof(mrun_cli, field)

static const mc_opt mrun_opts[] = {
    {.kind = MC_OPT_SECTION, .help = "Input (one of; token ids are decimal, "
     "separated by spaces or tabs):"},
    {.kind = MC_OPT_CALL, .flags = "--tokens", .value = "\"1 2 3\"",
     .off = F(in), .call = on_seq,
     .help = "one prompt of token ids (repeatable)"},
    {.kind = MC_OPT_STR, .flags = "--tokens-file", .value = "FILE",
     .off = F(tokens_file), .help = "one prompt of ids per line; blank lines "
     "and\nlines starting with '#' are skipped"},
    {.kind = MC_OPT_CALL, .flags = "--prompt", .value = "TEXT",
     .call = on_prompt, .help = "one text prompt (repeatable; needs the\n"
     "tokenizer an artifact embeds, or a\ntokenizer.json beside the model)"},
    {.kind = MC_OPT_STR, .flags = "--prompts-file", .value = "FILE",
     .off = F(prompts_file), .help = "one text prompt per line"},

    {.kind = MC_OPT_SECTION, .help = "Dataset job (JSON Lines; see "
     "docs/datasets.md):"},
    {.kind = MC_OPT_STR, .flags = "--input", .value = "FILE|-",
     .off = F(job.input), .help = "one JSON object per line: \"prompt\" "
     "(text) or\n\"ids\", optional \"id\", max_new_tokens,\ntemperature, "
     "top_k, top_p, seed, stop, and\n\"labels\" or \"continuation\" to "
     "score; the\noptions below are the defaults for the lines"},
    {.kind = MC_OPT_STR, .flags = "--output", .value = "FILE|-",
     .off = F(job.output), .help = "one result line per input line, in "
     "input\norder, each written once it and all earlier\nlines are done; "
     "bad lines and requests beyond\nthe plan get an \"error\" line (exit 1 "
     "at the\nend); an existing FILE needs --resume"},
    {.kind = MC_OPT_SET, .flags = "--resume", .off = F(job.resume),
     .help = "continue an interrupted job: skip the ids\nalready in the "
     "output, append the rest"},
    {.kind = MC_OPT_CHOICE, .flags = "--schedule", .value = "continuous|waves",
     .off = F(job.waves), .choices = schedule_choices,
     .help = "admit a request as soon as a slot is\nfree (default), or in "
     "waves of max_batch"},
    {.kind = MC_OPT_U64, .flags = "--max-line-bytes", .value = "N",
     .off = F(job.max_line_bytes), .ulo = RT_JOB_MIN_LINE_BYTES,
     .uhi = RT_JOB_MAX_LINE_BYTES,
     .help = "longest input line (default 1048576); a\nlonger one gets an "
     "error line and is read\npast; the job's buffers grow with it\n"
     "(docs/plan.md)"},
    {.kind = MC_OPT_U64, .flags = "--hold-bytes", .value = "N",
     .off = F(job.hold_bytes), .ulo = 1, .uhi = 1ull << 40,
     .help = "bytes the lines read and not yet written\nmay hold (default "
     "4194304); reading waits\nwhile they hold more"},

    {.kind = MC_OPT_SECTION, .help = "Generation (default mode):"},
    {.kind = MC_OPT_U32, .flags = "--max-new-tokens", .value = "N",
     .off = F(gp.max_new_tokens), .ulo = 0, .uhi = 1000000,
     .help = "tokens to generate per prompt (default 16)"},
    /* 0 is greedy; beyond 1e4 every distribution is flat anyway */
    {.kind = MC_OPT_F32, .flags = "--temperature", .value = "T",
     .off = F(gp.temperature), .flo = 0, .fhi = 1e4,
     .help = "0 = greedy (default)"},
    {.kind = MC_OPT_U32, .flags = "--top-k", .value = "K",
     .off = F(gp.top_k), .ulo = 0, .uhi = UINT32_MAX,
     .help = "keep the K likeliest tokens (default 0: off)"},
    {.kind = MC_OPT_F32, .flags = "--top-p", .value = "P",
     .off = F(gp.top_p), .flo = 0, .fhi = 1, .fflags = MC_PARSE_LO_OPEN,
     .help = "nucleus filter in (0, 1] (default 1: off)"},
    {.kind = MC_OPT_U64, .flags = "--seed", .value = "S", .off = F(gp.seed),
     .ulo = 0, .uhi = UINT64_MAX,
     .help = "RNG seed (default 0); sequence i uses (S, i)"},
    {.kind = MC_OPT_CALL, .flags = "--stop", .value = "\"ids\"",
     .off = F(stop), .call = on_ids, .help = "extra stop token ids"},
    {.kind = MC_OPT_CALL, .flags = "--stop-string", .value = "TEXT",
     .call = on_stop_string, .help = "stop once the generated text holds "
     "TEXT\n(repeatable; needs the tokenizer); the\ntext is cut before it, "
     "the ids keep the\ntoken that completed it (\"stop_string\")"},
    {.kind = MC_OPT_CLEAR, .flags = "--ignore-eos", .off = F(gp.use_model_eos),
     .help = "do not stop at the model's EOS ids"},

    {.kind = MC_OPT_SECTION, .help = "Scoring (no generation):"},
    {.kind = MC_OPT_CALL, .flags = "--score-labels", .value = "\"ids\"",
     .off = F(labels), .call = on_labels,
     .help = "log-prob of each label token after each prompt"},
    {.kind = MC_OPT_CALL, .flags = "--score-label", .value = "\"ids\"",
     .off = F(labels), .call = on_seq,
     .help = "one label of one or more tokens (repeatable,\nadds to "
     "--score-labels): the sum of its\ntokens' log-probs after each prompt"},
    {.kind = MC_OPT_CALL, .flags = "--score-continuation", .value = "\"ids\"",
     .off = F(cont), .call = on_ids, .help = "log-prob of each continuation "
     "token and\ntheir sum, after each prompt"},

    {.kind = MC_OPT_SECTION, .help = "Plan and machine:"},
    {.kind = MC_OPT_INT, .flags = "--threads", .value = "N",
     .off = F(opts.threads), .ulo = 1, .uhi = 256,
     .help = "worker threads (default: the CPUs this process may use, at most the plan's)"},
    {.kind = MC_OPT_U32, .flags = "--max-batch", .value = "N",
     .off = F(opts.max_batch), .ulo = 1, .uhi = 65536,
     .help = "sequences per step (default: the plan's)"},
    {.kind = MC_OPT_U64, .flags = "--max-seq", .value = "N",
     .off = F(opts.max_seq), .ulo = 1, .uhi = 1ull << 32,
     .help = "context per sequence (default: the plan's)"},
    {.kind = MC_OPT_U32, .flags = "--prefill-chunk", .value = "N",
     .off = F(opts.prefill_chunk), .ulo = 1, .uhi = 1u << 20,
     .help = "token rows per step (default: the plan's)"},
    {.kind = MC_OPT_CHOICE, .flags = "--kv", .value = "f32|f16|int8",
     .off = F(opts.kv_type), .choices = kv_choices,
     .help = "KV cache type (default: the plan's, else f32)"},
    {.kind = MC_OPT_CHOICE, .flags = "--device", .value = "cpu|cuda",
     .off = F(opts.device), .choices = device_choices,
     .help = "where to run (default: the plan's device, else\n"
             "cpu); cuda needs a CUDA build and a GPU"},
    {.kind = MC_OPT_CHOICE, .flags = "--truncate", .value = "left|right",
     .off = F(gp.truncate), .choices = truncate_choices,
     .help = "fit over-long prompts instead of refusing"},

    {.kind = MC_OPT_SECTION, .help = "Output:"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = F(json),
     .help = "one JSON object on stdout (below)"},
    {.kind = MC_OPT_STR, .flags = "--metrics", .value = "FILE",
     .off = F(metrics_path), .help = "write Prometheus text metrics at the "
     "end of\nthe run (also when it is refused); with\n--input also every 2 "
     "s during the job;\nnever over an input or a device/FIFO"},
    {.kind = MC_OPT_CLEAR, .flags = "--no-special", .off = F(add_special),
     .help = "with a tokenizer: no BOS added, specials kept"},
    {.kind = MC_OPT_SET, .flags = "-q", .off = F(quiet),
     .help = "quieter (no timing)"},
    {.kind = MC_OPT_SET, .flags = "-v", .off = F(verbose),
     .help = "more (plan and a memory summary on stderr)"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

#undef F

const mc_opt_cmd mrun_cmd = {
    .name = "mrun",
    .usage =
        "usage: mrun MODEL INPUT [options]\n"
        "       mrun MODEL --input FILE --output FILE [options]   (dataset "
        "job)\n"
        "\n"
        "MODEL is a Hugging Face model directory (config.json + safetensors) "
        "or\nan mcompile artifact.\n\n",
    .footer =
        "\n"
        "Default output: one line per sequence with the generated ids (a tab "
        "and\nthe decoded text follow when a tokenizer is present); timing "
        "(prefill\nand decode tokens/s) on stderr.  Exit: 0 ok, 1 failure, 2 "
        "usage.\n"
        "\n"
        "JSON: \"sequences\" [{ids, text, prompt_tokens, stop_reason}] or "
        "\"scores\";\n\"error\" when refused; prefill_tok_s, decode_tok_s, "
        "prefill_tokens,\ndecode_tokens, prefill_seconds, decode_seconds, "
        "requests, refused,\nrefused_by {plan, input, other}; memory in "
        "bytes: planned_bytes (plan:\nweights + arena + reserve), "
        "reserve_bytes, job_bytes (what a\n--input job adds with default "
        "options), target_bytes (the\nartifact's --target; 0 unknown), "
        "weights_mapped_bytes,\narena_bytes, "
        "arena_high_water_bytes (measured arena peak),\narena_touched_bytes "
        "(arena bytes really written), kv_bytes,\npeak_rss_bytes (process "
        "peak RSS), weight_bytes, params; plan\n(stored|overridden|runtime), "
        "threads, max_batch, max_seq, prefill_chunk.\nAlways "
        "arena_touched_bytes <= arena_high_water_bytes <= arena_bytes <=\n"
        "planned_bytes.\n",
    .help_col = 26,
    .positional = "MODEL",
    .positional_off = offsetof(mrun_cli, model),
    .opts = mrun_opts,
};

/* ---- after the table: files and the options together ------------------ */

/* The inputs named by files: ids (fmt_ids) and text lines.  Returns -1 to
 * go on, else an exit code. */
static int read_input_files(mrun_cli *c)
{
    if (c->tokens_file) {
        fmt_ids *f = NULL;
        mc_error e;
        mc_error_clear(&e);
        mc_status st = fmt_ids_load(c->tokens_file, 0, &f, &e);
        if (st != MC_OK) {
            char buf[1400];
            fprintf(stderr, "mrun: --tokens-file: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
            return st == MC_ERR_FORMAT ? 2 : 1;
        }
        for (size_t i = 0; i < f->n_seqs; i++) {
            size_t n;
            const int32_t *ids = fmt_ids_seq(f, i, &n);
            mrun_seqs_add(&c->in, ids, n);
        }
        fmt_ids_free(f);
    }
    if (c->prompts_file) {
        mc_error e;
        mc_error_clear(&e);
        size_t len;
        if (fmt_file_read(c->prompts_file, 1u << 30, "1 GiB",
                          &c->prompts_text, &len, &e) != MC_OK) {
            char buf[1400];
            fprintf(stderr, "mrun: --prompts-file: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
            return 1;
        }
        for (char *save = NULL,
                  *l = strtok_r(c->prompts_text, "\n", &save);
             l; l = strtok_r(NULL, "\n", &save))
            if (*l)
                texts_add(c, l);
        if (c->n_texts == 0)
            return usage_error("%s: no prompts in the file", c->prompts_file);
    }
    return -1;
}

/* --input mode: the JSONL job takes the generation options as defaults
 * for its lines.  Returns -1 to go on, else an exit code. */
static int check_job_args(mrun_cli *c)
{
    mrun_job_opts *j = &c->job;
    if (!j->input || !j->output)
        return usage_error("--input and --output go together");
    if (c->in.n || c->n_texts || c->tokens_file || c->prompts_file)
        return usage_error("--input replaces --tokens/--prompt/...-file");
    if (c->score_labels || c->score_cont || c->json)
        return usage_error("with --input, lines give \"labels\" or "
                           "\"continuation\"; results are the output "
                           "lines (no --json)");
    if (j->resume && !strcmp(j->output, "-"))
        return usage_error("--resume needs an output file, not stdout");
    /* Inputs are compared by device+inode when the job opens its files
     * (fmt_output_check_file); here only the two outputs with each other. */
    if (c->metrics_path && strcmp(j->output, "-") != 0 &&
        fmt_output_same(c->metrics_path, j->output))
        return usage_error("--output and --metrics name the same file");
    j->metrics = c->metrics_path;
    j->metrics_period = 2.0;
    j->defaults = (rt_jsonl_defaults){
        .max_new_tokens = c->gp.max_new_tokens,
        .temperature = c->gp.temperature, .top_k = c->gp.top_k,
        .top_p = c->gp.top_p, .seed = c->gp.seed,
        .add_special = c->add_special};
    j->stop = c->stop;
    j->n_stop = c->n_stop;
    j->stop_str = c->stop_str;
    j->stop_str_len = c->stop_str_len;
    j->n_stop_str = c->n_stop_str;
    j->use_model_eos = c->gp.use_model_eos;
    j->truncate = c->gp.truncate;
    j->quiet = c->quiet;
    j->verbose = c->verbose;
    return -1;
}

int mrun_cli_parse(int argc, char **argv, mrun_cli *c)
{
    memset(c, 0, sizeof *c);
    mcrt_gen_params_default(&c->gp);
    mcrt_options_default(&c->opts);
    c->add_special = 1;
    char why[1400];
    int r = mc_opt_parse(&mrun_cmd, argc, argv, c, why, sizeof why);
    if (r == MC_OPT_HELP_ASKED) {
        char *h = mc_opt_help(&mrun_cmd);
        if (!h) {
            fprintf(stderr, "mrun: out of memory\n");
            return 1;
        }
        fputs(h, stdout);
        free(h);
        return 0;
    }
    if (r != 0)
        return usage_error("%s", why);
    if (!c->model)
        return usage_error("no MODEL given");
    if (c->job.input || c->job.output || c->job.resume)
        return check_job_args(c);
    if (c->job.max_line_bytes || c->job.hold_bytes)
        return usage_error("--max-line-bytes and --hold-bytes size the "
                           "buffers of an --input job");
    int rc = read_input_files(c);
    if (rc >= 0)
        return rc;
    if (c->n_texts && c->in.n)
        return usage_error("give token ids or text prompts, not both");
    if (!c->n_texts && c->in.n == 0)
        return usage_error("no input: use --tokens, --tokens-file, --prompt "
                           "or --prompts-file");
    if (c->score_labels && c->score_cont)
        return usage_error("--score-labels and --score-continuation are "
                           "separate runs");
    c->gp.stop_ids = c->stop;
    c->gp.n_stop = c->n_stop;
    return -1;
}

void mrun_cli_free(mrun_cli *c)
{
    seqs_free(&c->in);
    seqs_free(&c->labels);
    free(c->texts);
    mc_free(c->prompts_text); /* fmt_file_read: mc_alloc */
    free(c->stop);
    free(c->cont);
    free(c->stop_str);
    free(c->stop_str_len);
    memset(c, 0, sizeof *c);
}

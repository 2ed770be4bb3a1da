/* mrun - run a model: generate from token ids or text, or score.
 *
 * Uses the public API (mcrt.h), the tokenizer (rt_tokenizer.h) for text,
 * the token-id parser that calibration and eval share (fmt_ids.h) and the
 * Prometheus writer (rt_metrics.h).  Results on stdout, timing on stderr.
 * Exit codes: 0 ok, 1 failure (model, plan refusal, I/O), 2 usage.
 *
 * --json prints ONE object on stdout, also when a run is refused after the
 * model opened (then with "error", exit 1).  Results come first, then
 * "prefill_tok_s" and the other figures.  Keys:
 *   "sequences": [{"ids": [int], "text": str|null, "prompt_tokens": int,
 *     "stop_reason": "length"|"stop_token"|"none"}]      (generation), or
 *   "scores": [{"labels": [{"id": int, "logprob": num}]}
 *              | {"logprobs": [num], "sum": num}]        (scoring)
 *   "error": str                                         (only on failure)
 *   "prefill_tok_s", "decode_tok_s", "prefill_seconds", "decode_seconds":
 *     num; "prefill_tokens", "decode_tokens": int
 *   "requests": int (sequences submitted), "refused": int, "refused_by":
 *     {"plan": int, "input": int, "other": int}
 *   bytes, int: "planned_bytes" (the plan: weights + arena + reserve; an
 *     artifact's manifest total, for a HF model weights + the arena built
 *     at load), "reserve_bytes", "weights_mapped_bytes" (every weight byte
 *     held), "arena_bytes" (allocated), "arena_high_water_bytes" (measured
 *     arena peak, canary scan), "arena_touched_bytes" (arena bytes really
 *     written), "kv_bytes", "peak_rss_bytes" (process peak
 *     RSS: VmHWM, else ru_maxrss * 1024), "weight_bytes" (read per token)
 *   "params": int, "plan": "stored"|"overridden"|"runtime",
 *   "threads", "max_batch", "max_seq", "prefill_chunk": int
 * Always arena_touched_bytes <= arena_high_water_bytes <= arena_bytes <=
 * planned_bytes; figures
 * are 0 when the model did not open.  --metrics FILE writes the same
 * figures as Prometheus text (rt_metrics.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_file.h"
#include "fmt_ids.h"
#include "fmt_input.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"
#include "mc_parse.h"
#include "mcrt.h"
#include "mrun_help.h"
#include "mrun_job.h"
#include "rt_metrics.h"
#include "rt_tokenizer.h"

typedef struct seqs {
    int32_t **ids;
    size_t *len;
    size_t n, cap;
} seqs;

typedef struct cli {
    const char *model;
    seqs in;
    const char **texts;        /* --prompt values and prompts-file lines */
    size_t n_texts, cap_texts;
    char *prompts_text;        /* the prompts file, owning its lines */
    const char *prompts_file;
    const char *tokens_file;
    const char *metrics_path;
    mcrt_gen_params gp;
    int32_t *stop;
    size_t n_stop;
    int32_t *labels;
    size_t n_labels;
    int32_t *cont;
    size_t n_cont;
    int score_labels, score_cont;
    mcrt_options opts;
    int json, quiet, verbose, add_special;
    mrun_job_opts job;         /* --input: the JSONL job (mrun_job.h) */
} cli;

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

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "mrun: out of memory\n");
        exit(1);
    }
    return q;
}

static void seqs_add(seqs *s, const int32_t *ids, size_t n)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->ids = xrealloc(s->ids, s->cap * sizeof *s->ids);
        s->len = xrealloc(s->len, s->cap * sizeof *s->len);
    }
    s->ids[s->n] = xrealloc(NULL, n * sizeof *ids);
    if (n)
        memcpy(s->ids[s->n], ids, n * sizeof *ids);
    s->len[s->n++] = n;
}

static void texts_add(cli *c, const char *t)
{
    if (c->n_texts == c->cap_texts) {
        c->cap_texts = c->cap_texts ? 2 * c->cap_texts : 8;
        c->texts = xrealloc(c->texts, c->cap_texts * sizeof *c->texts);
    }
    c->texts[c->n_texts++] = t;
}

/* One list of ids in fmt_ids syntax ("1 2 3") into a new array.  Returns 0,
 * or 2 after a usage message.  allow_empty: "" gives zero ids. */
static int parse_id_list(const char *opt, const char *v, int allow_empty,
                         int32_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (allow_empty && v[strspn(v, " \t")] == '\0')
        return 0;
    fmt_ids *f = NULL;
    mc_error e;
    mc_error_clear(&e);
    if (fmt_ids_parse(v, strlen(v), opt, 0, &f, &e) != MC_OK)
        return usage_error("%s: '%s' is not a list of token ids: %s", opt, v,
                           e.message);
    int rc = 0;
    if (f->n_seqs != 1) {
        rc = usage_error("%s: one line of token ids expected", opt);
    } else {
        *out = xrealloc(NULL, f->n_ids * sizeof **out);
        memcpy(*out, f->ids, f->n_ids * sizeof **out);
        *n = f->n_ids;
    }
    fmt_ids_free(f);
    return rc;
}

/* Option numbers (mc_parse.h: whole, finite, in range).  0, or 2 after
 * a usage message naming the flag. */
static int opt_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi,
                   uint64_t *out)
{
    char why[256];
    return mc_parse_u64(flag, v, lo, hi, out, why, sizeof why)
               ? usage_error("%s", why)
               : 0;
}

static int opt_f32(const char *flag, const char *v, double lo, double hi,
                   int flags, float *out)
{
    char why[256];
    double d;
    if (mc_parse_f64(flag, v, lo, hi, flags, &d, why, sizeof why))
        return usage_error("%s", why);
    *out = (float)d;
    return 0;
}

/* The inputs named by files: ids (fmt_ids) and text lines.  Returns -1 to
 * go on, else an exit code. */
static int read_input_files(cli *c)
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
            seqs_add(&c->in, ids, n);
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

/* 1 if option a takes a value (the next argument). */
static int takes_value(const char *a)
{
    static const char *const k[] = {
        "--tokens", "--tokens-file", "--prompt", "--prompts-file",
        "--metrics", "--max-new-tokens", "--temperature", "--top-p",
        "--top-k", "--seed", "--stop", "--score-labels",
        "--score-continuation", "--threads", "--max-batch", "--max-seq",
        "--prefill-chunk", "--kv", "--truncate", "--input", "--output",
        "--schedule", "--device"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(a, k[i]))
            return 1;
    return 0;
}

/* --input mode: the JSONL job takes the generation options as defaults
 * for its lines.  Returns -1 to go on, else an exit code. */
static int check_job_args(cli *c)
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
    struct stat so, sm;
    if (c->metrics_path &&
        (!strcmp(c->metrics_path, j->output) ||
         (stat(c->metrics_path, &sm) == 0 && stat(j->output, &so) == 0 &&
          sm.st_dev == so.st_dev && sm.st_ino == so.st_ino)))
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
    j->use_model_eos = c->gp.use_model_eos;
    j->truncate = c->gp.truncate;
    j->quiet = c->quiet;
    j->verbose = c->verbose;
    return -1;
}

/* Returns -1 to continue, else an exit code. */
static int parse_args(int argc, char **argv, cli *c)
{
    memset(c, 0, sizeof *c);
    mcrt_gen_params_default(&c->gp);
    mcrt_options_default(&c->opts);
    c->add_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
        int32_t *ids;
        size_t n;
        int takes = takes_value(a);
        if (takes && !v)
            return usage_error("%s needs a value", a);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(g_usage, stdout);
            return 0;
        } else if (!strcmp(a, "-q")) {
            c->quiet = 1;
        } else if (!strcmp(a, "-v")) {
            c->verbose = 1;
        } else if (!strcmp(a, "--json")) {
            c->json = 1;
        } else if (!strcmp(a, "--no-special")) {
            c->add_special = 0;
        } else if (!strcmp(a, "--resume")) {
            c->job.resume = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            c->gp.use_model_eos = 0;
        } else if (!takes) {
            if (a[0] == '-' && a[1])
                return usage_error("unknown option '%s'", a);
            if (c->model)
                return usage_error("unexpected argument '%s'", a);
            c->model = a;
            continue;
        } else if (!strcmp(a, "--tokens")) {
            if (parse_id_list(a, v, 0, &ids, &n))
                return 2;
            seqs_add(&c->in, ids, n);
            free(ids);
        } else if (!strcmp(a, "--tokens-file")) {
            c->tokens_file = v;
        } else if (!strcmp(a, "--prompt")) {
            texts_add(c, v);
        } else if (!strcmp(a, "--prompts-file")) {
            c->prompts_file = v;
        } else if (!strcmp(a, "--input")) {
            c->job.input = v;
        } else if (!strcmp(a, "--output")) {
            c->job.output = v;
        } else if (!strcmp(a, "--schedule")) {
            if (strcmp(v, "continuous") && strcmp(v, "waves"))
                return usage_error("--schedule: continuous or waves, got "
                                   "'%s'", v);
            c->job.waves = !strcmp(v, "waves");
        } else if (!strcmp(a, "--metrics")) {
            c->metrics_path = v;
        } else if (!strcmp(a, "--max-new-tokens")) {
            if (opt_u64(a, v, 0, 1000000, &u))
                return 2;
            c->gp.max_new_tokens = (uint32_t)u;
        } else if (!strcmp(a, "--temperature")) {
            /* 0 is greedy; beyond 1e4 every distribution is flat anyway */
            if (opt_f32(a, v, 0, 1e4, 0, &c->gp.temperature))
                return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (opt_f32(a, v, 0, 1, MC_PARSE_LO_OPEN, &c->gp.top_p))
                return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (opt_u64(a, v, 0, UINT32_MAX, &u))
                return 2;
            c->gp.top_k = (uint32_t)u;
        } else if (!strcmp(a, "--seed")) {
            if (opt_u64(a, v, 0, UINT64_MAX, &c->gp.seed))
                return 2;
        } else if (!strcmp(a, "--stop")) {
            free(c->stop);
            if (parse_id_list(a, v, 1, &c->stop, &c->n_stop))
                return 2;
        } else if (!strcmp(a, "--score-labels")) {
            free(c->labels);
            if (parse_id_list(a, v, 0, &c->labels, &c->n_labels))
                return 2;
            c->score_labels = 1;
        } else if (!strcmp(a, "--score-continuation")) {
            free(c->cont);
            if (parse_id_list(a, v, 0, &c->cont, &c->n_cont))
                return 2;
            c->score_cont = 1;
        } else if (!strcmp(a, "--threads")) {
            if (opt_u64(a, v, 1, 256, &u))
                return 2;
            c->opts.threads = (int)u;
        } else if (!strcmp(a, "--max-batch")) {
            if (opt_u64(a, v, 1, 65536, &u))
                return 2;
            c->opts.max_batch = (uint32_t)u;
        } else if (!strcmp(a, "--max-seq")) {
            if (opt_u64(a, v, 1, 1ull << 32, &u))
                return 2;
            c->opts.max_seq = u;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (opt_u64(a, v, 1, 1u << 20, &u))
                return 2;
            c->opts.prefill_chunk = (uint32_t)u;
        } else if (!strcmp(a, "--kv")) {
            if (!strcmp(v, "f32"))
                c->opts.kv_type = 1;
            else if (!strcmp(v, "f16"))
                c->opts.kv_type = 2;
            else if (!strcmp(v, "int8") || !strcmp(v, "i8"))
                c->opts.kv_type = 3;
            else
                return usage_error("--kv: f32, f16 or int8, got '%s'", v);
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu") || !strcmp(v, "cuda"))
                c->opts.device = v[1] == 'u' ? MCRT_DEVICE_CUDA
                                             : MCRT_DEVICE_CPU;
            else
                return usage_error("--device: cpu or cuda, got '%s'", v);
        } else if (!strcmp(a, "--truncate")) {
            if (!strcmp(v, "left"))
                c->gp.truncate = 1;
            else if (!strcmp(v, "right"))
                c->gp.truncate = 2;
            else
                return usage_error("--truncate: left or right, got '%s'", v);
        } else {
            return usage_error("unknown option '%s'", a);
        }
        if (takes)
            i++; /* the value was consumed */
    }
    if (!c->model)
        return usage_error("no MODEL given");
    if (c->job.input || c->job.output || c->job.resume)
        return check_job_args(c);
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

/* Why no tokenizer was loaded (the loader's own message), for the error a
 * text request gets; empty when none was found. */
static char tok_why[1400];

/* The tokenizer: the one an artifact embeds (h opened), else
 * tokenizer.json beside the model (dir/tokenizer.json or the file's dir).
 * *from says which, for -v.  On failure tok_why holds the reason. */
static rt_tokenizer *load_tokenizer(const cli *c, const mcrt *h,
                                    const char **from)
{
    rt_tokenizer *t = NULL;
    mc_error e;
    mc_error_clear(&e);
    size_t len = 0;
    const char *emb = h ? mcrt_tokenizer_json(h, &len) : NULL;
    *from = "none";
    if (emb) {
        if (rt_tokenizer_load_memory(emb, len, "embedded tokenizer.json", &t,
                                     &e) == MC_OK) {
            *from = "embedded in the artifact";
            return t;
        }
        mc_error_format(&e, tok_why, sizeof tok_why);
        if (c->verbose)
            fprintf(stderr, "mrun: embedded tokenizer ignored: %s\n",
                    tok_why);
    }
    char path[4096];
    struct stat st;
    const char *slash = strrchr(c->model, '/');
    if (stat(c->model, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/tokenizer.json", c->model);
    else if (slash)
        snprintf(path, sizeof path, "%.*s/tokenizer.json",
                 (int)(slash - c->model), c->model);
    else
        snprintf(path, sizeof path, "tokenizer.json");
    if (stat(path, &st) != 0)
        return NULL;
    if (rt_tokenizer_load(path, &t, &e) != MC_OK) {
        mc_error_format(&e, tok_why, sizeof tok_why);
        if (c->verbose)
            fprintf(stderr, "mrun: tokenizer ignored: %s\n", tok_why);
        return NULL;
    }
    *from = "tokenizer.json beside the model";
    return t;
}

/* Text prompts -> ids.  Returns -1 to go on, else an exit code. */
static int encode_inputs(cli *c, const rt_tokenizer *tok)
{
    if (!tok && tok_why[0]) {
        fprintf(stderr, "mrun: --prompt/--prompts-file need a tokenizer, "
                        "and it could not be loaded: %s\n", tok_why);
        return 1;
    }
    if (!tok) {
        fprintf(stderr, "mrun: --prompt/--prompts-file need a tokenizer: the "
                        "artifact embeds none and there is no tokenizer.json "
                        "beside the model (use --tokens)\n");
        return 1;
    }
    for (size_t i = 0; i < c->n_texts; i++) {
        const char *text = c->texts[i];
        size_t need = 0, n = 0, len = strlen(text);
        mc_error e;
        mc_error_clear(&e);
        rt_tokenizer_encode(tok, text, len, c->add_special, NULL, 0, &need,
                            &e);
        int32_t *ids = xrealloc(NULL, (need ? need : 1) * sizeof *ids);
        if (rt_tokenizer_encode(tok, text, len, c->add_special, ids, need, &n,
                                &e)) {
            char buf[1400];
            fprintf(stderr, "mrun: cannot encode prompt %zu: %s\n", i + 1,
                    mc_error_format(&e, buf, sizeof buf));
            free(ids);
            return 1;
        }
        if (n == 0) {
            free(ids);
            fprintf(stderr, "mrun: prompt %zu encodes to no tokens\n", i + 1);
            return 1;
        }
        seqs_add(&c->in, ids, n);
        free(ids);
    }
    return -1;
}

/* JSON string: quotes and escapes. */
static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (ch == '\r')
            fputs("\\r", f);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* Decoded text of ids (malloc'ed) or NULL. */
static char *decode(const rt_tokenizer *tok, const int32_t *ids, size_t n,
                    size_t *len)
{
    if (!tok)
        return NULL;
    size_t need = 0;
    rt_tokenizer_decode(tok, ids, n, 1, NULL, 0, &need);
    char *b = xrealloc(NULL, need + 1);
    if (rt_tokenizer_decode(tok, ids, n, 1, b, need + 1, len)) {
        free(b);
        return NULL;
    }
    return b;
}

/* Sizes a plan-less session for the request (an artifact's plan wins). */
static int open_model(const cli *c, mcrt **h)
{
    uint64_t longest = 0;
    size_t extra = c->score_labels ? 0
                   : c->score_cont ? c->n_cont
                                   : c->gp.max_new_tokens;
    for (size_t i = 0; i < c->in.n; i++)
        if (c->in.len[i] + extra > longest)
            longest = c->in.len[i] + extra;
    mcrt_options o = c->opts;
    o.want_batch = c->in.n > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)c->in.n;
    o.want_seq = longest;
    int rc = mcrt_open(c->model, &o, h);
    if (rc)
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(NULL));
    return rc;
}

/* What a run did, for --json, -v and --metrics. */
typedef struct report {
    rt_metrics m;              /* Prometheus figures */
    mcrt_info info;            /* zero when the model did not open */
    mcrt_stats st;
    uint64_t requests;         /* sequences submitted */
    uint64_t refused;          /* of those, refused (any reason) */
} report;

static const char *plan_name(int source)
{
    return source == MCRT_PLAN_STORED       ? "stored"
           : source == MCRT_PLAN_OVERRIDDEN ? "overridden"
                                            : "runtime";
}

static double rate(uint64_t n, double s)
{
    return s > 0 ? (double)n / s : 0.0;
}

/* h may be NULL (the model did not open: open_status says why and all
 * requests count as refused). */
static void report_fill(report *r, const mcrt *h, size_t n_req,
                        int open_status)
{
    memset(r, 0, sizeof *r);
    rt_metrics_init(&r->m);
    if (!h) {
        r->requests = r->refused = n_req;
        rt_metrics_count(&r->m, open_status, n_req);
        r->m.peak_rss_bytes = rt_metrics_peak_rss_bytes();
        return;
    }
    mcrt_get_info(h, &r->info);
    mcrt_get_stats(h, &r->st);
    rt_metrics_from_mcrt(&r->m, h); /* planned, high water, counters too */
    r->requests = r->st.requests;
    r->refused = r->st.refused;
}

/* The figures of the --json object (after the results); closes it. */
static void json_figures(const report *r, const char *error)
{
    const rt_metrics *m = &r->m;
    const mcrt_info *in = &r->info;
    if (error) {
        printf("\"error\": ");
        json_str(stdout, error, strlen(error));
        printf(", ");
    }
    printf("\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
           "\"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, ",
           rate(m->prefill_tokens, m->prefill_seconds),
           rate(m->decode_tokens, m->decode_seconds), m->prefill_seconds,
           m->decode_seconds);
    const struct {
        const char *key;
        uint64_t v;
    } f[] = {{"prefill_tokens", m->prefill_tokens},
             {"decode_tokens", m->decode_tokens},
             {"requests", r->requests},
             {"refused", r->refused},
             {"planned_bytes", m->planned_bytes},
             {"reserve_bytes", in->reserve_bytes},
             {"weights_mapped_bytes", in->weights_mapped_bytes},
             {"arena_bytes", m->arena_bytes},
             {"arena_high_water_bytes", m->arena_high_water_bytes},
             {"arena_touched_bytes", m->arena_touched_bytes},
             {"kv_bytes", in->kv_bytes},
             {"peak_rss_bytes", m->peak_rss_bytes},
             {"weight_bytes", in->weight_bytes},
             {"params", in->params},
             {"threads", (uint64_t)(in->threads > 0 ? in->threads : 0)},
             {"max_batch", in->max_batch},
             {"max_seq", in->max_seq},
             {"prefill_chunk", in->prefill_chunk}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        printf("\"%s\": %llu, ", f[i].key, (unsigned long long)f[i].v);
    printf("\"refused_by\": {\"plan\": %llu, \"input\": %llu, \"other\": "
           "%llu}, \"plan\": \"%s\"}\n",
           (unsigned long long)m->requests_refused[RT_REFUSE_PLAN],
           (unsigned long long)m->requests_refused[RT_REFUSE_INPUT],
           (unsigned long long)m->requests_refused[RT_REFUSE_OTHER],
           plan_name(in->plan_source));
}

/* Timing (after a run that went well, unless -q), the -v memory summary
 * and --metrics.  Returns 0, or 1 when the metrics file could not be
 * written. */
static int report_finish(const cli *c, const report *r, int ok)
{
    const rt_metrics *m = &r->m;
    if (!c->quiet && ok)
        fprintf(stderr,
                "mrun: prefill %llu tokens in %.3f s (%.1f tok/s); decode "
                "%llu tokens in %.3f s (%.1f tok/s)\n",
                (unsigned long long)m->prefill_tokens, m->prefill_seconds,
                rate(m->prefill_tokens, m->prefill_seconds),
                (unsigned long long)m->decode_tokens, m->decode_seconds,
                rate(m->decode_tokens, m->decode_seconds));
    if (c->verbose)
        fprintf(stderr,
                "mrun: memory: planned %llu, arena %llu (high water %llu), "
                "peak RSS %llu, weights %llu bytes; prefill %.1f tok/s, "
                "decode %.1f tok/s; requests %llu, refused %llu\n",
                (unsigned long long)m->planned_bytes,
                (unsigned long long)m->arena_bytes,
                (unsigned long long)m->arena_high_water_bytes,
                (unsigned long long)m->peak_rss_bytes,
                (unsigned long long)r->info.weights_mapped_bytes,
                rate(m->prefill_tokens, m->prefill_seconds),
                rate(m->decode_tokens, m->decode_seconds),
                (unsigned long long)r->requests,
                (unsigned long long)r->refused);
    if (!c->metrics_path)
        return 0;
    mc_error e;
    mc_error_clear(&e);
    if (rt_metrics_write_prometheus(m, c->metrics_path, &e) != MC_OK) {
        char buf[1400];
        fprintf(stderr, "mrun: cannot write metrics: %s\n",
                mc_error_format(&e, buf, sizeof buf));
        return 1;
    }
    return 0;
}

/* Generation; results on stdout (for --json, the object's first key). */
static int run_generate(const cli *c, mcrt *h, const rt_tokenizer *tok)
{
    size_t n = c->in.n, M = c->gp.max_new_tokens;
    mcrt_result *res = xrealloc(NULL, n * sizeof *res);
    int32_t *buf = xrealloc(NULL, (n * M > 0 ? n * M : 1) * sizeof *buf);
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].ids = buf + i * M;
    }
    int rc = mcrt_generate(h, (const int32_t *const *)c->in.ids, c->in.len, n,
                           &c->gp, res);
    if (c->json && !rc)
        printf("\"sequences\": [");
    for (size_t i = 0; !rc && i < n; i++) {
        size_t tl = 0;
        char *text = decode(tok, res[i].ids, res[i].n_ids, &tl);
        if (c->json) {
            printf("%s{\"ids\": [", i ? ", " : "");
            for (size_t j = 0; j < res[i].n_ids; j++)
                printf("%s%d", j ? ", " : "", (int)res[i].ids[j]);
            printf("], \"text\": ");
            if (text)
                json_str(stdout, text, tl);
            else
                printf("null");
            printf(", \"prompt_tokens\": %zu, \"stop_reason\": \"%s\"}",
                   res[i].prompt_used,
                   res[i].stop_reason == 2   ? "stop_token"
                   : res[i].stop_reason == 1 ? "length"
                                             : "none");
        } else {
            for (size_t j = 0; j < res[i].n_ids; j++)
                printf("%s%d", j ? " " : "", (int)res[i].ids[j]);
            if (text) {
                putchar('\t');
                for (size_t j = 0; j < tl; j++)
                    fputs(text[j] == '\n'   ? "\\n"
                          : text[j] == '\t' ? "\\t"
                                            : (char[2]){text[j], 0},
                          stdout);
            }
            putchar('\n');
        }
        free(text);
    }
    if (c->json && !rc)
        printf("], ");
    free(res);
    free(buf);
    return rc;
}

static void print_scores(const cli *c, size_t n, const float *lab,
                         float *const *per, const double *sum)
{
    if (c->json)
        printf("\"scores\": [");
    for (size_t i = 0; i < n; i++) {
        if (c->json) {
            printf("%s{", i ? ", " : "");
            if (lab) {
                printf("\"labels\": [");
                for (size_t j = 0; j < c->n_labels; j++)
                    printf("%s{\"id\": %d, \"logprob\": %.7g}", j ? ", " : "",
                           (int)c->labels[j], lab[i * c->n_labels + j]);
                printf("]}");
            } else {
                printf("\"logprobs\": [");
                for (size_t j = 0; j < c->n_cont; j++)
                    printf("%s%.7g", j ? ", " : "", per[i][j]);
                printf("], \"sum\": %.9g}", sum[i]);
            }
        } else if (lab) {
            for (size_t j = 0; j < c->n_labels; j++)
                printf("%s%.7g", j ? " " : "", lab[i * c->n_labels + j]);
            putchar('\n');
        } else {
            printf("%.9g\t", sum[i]);
            for (size_t j = 0; j < c->n_cont; j++)
                printf("%s%.7g", j ? " " : "", per[i][j]);
            putchar('\n');
        }
    }
    if (c->json)
        printf("], ");
}

/* Scoring; results as run_generate. */
static int run_score(const cli *c, mcrt *h)
{
    size_t n = c->in.n;
    int rc;
    float *lab = NULL, *per = NULL;
    float **per_ptr = NULL;
    double *sum = NULL;
    if (c->score_labels) {
        lab = xrealloc(NULL, n * c->n_labels * sizeof *lab);
        rc = mcrt_score_labels(h, (const int32_t *const *)c->in.ids, c->in.len,
                               n, c->labels, c->n_labels, lab,
                               c->gp.truncate);
    } else {
        per = xrealloc(NULL, n * c->n_cont * sizeof *per);
        per_ptr = xrealloc(NULL, n * sizeof *per_ptr);
        sum = xrealloc(NULL, n * sizeof *sum);
        const int32_t **conts = xrealloc(NULL, n * sizeof *conts);
        size_t *cl = xrealloc(NULL, n * sizeof *cl);
        for (size_t i = 0; i < n; i++) {
            per_ptr[i] = per + i * c->n_cont;
            conts[i] = c->cont;
            cl[i] = c->n_cont;
        }
        rc = mcrt_score_continuations(h, (const int32_t *const *)c->in.ids,
                                      c->in.len, n, conts, cl, per_ptr, sum,
                                      c->gp.truncate);
        free(conts);
        free(cl);
    }
    if (!rc)
        print_scores(c, n, lab, per_ptr, sum);
    free(lab);
    free(per);
    free(per_ptr);
    free(sum);
    return rc;
}

static void cli_free(cli *c)
{
    for (size_t i = 0; i < c->in.n; i++)
        free(c->in.ids[i]);
    free(c->in.ids);
    free(c->in.len);
    free(c->texts);
    mc_free(c->prompts_text); /* fmt_file_read: mc_alloc */
    free(c->stop);
    free(c->labels);
    free(c->cont);
    memset(c, 0, sizeof *c);
}

/* Open the model (and its tokenizer), run, report.  An artifact is opened
 * before encoding text (its tokenizer is inside it, and its plan does not
 * depend on the request); a Hugging Face model after, so that a plan-less
 * session is sized for the encoded request. */
static int run(cli *c)
{
    mcrt *h = NULL;
    report r;
    int rc = 0, ost = 0;
    size_t n_req = c->n_texts ? c->n_texts : c->in.n;
    if (c->job.input) {
        const char *tok_from;
        if (open_model(c, &h))
            return 1;
        rt_tokenizer *tok = load_tokenizer(c, h, &tok_from);
        rc = mrun_job_run(&c->job, h, tok);
        rt_tokenizer_free(tok);
        mcrt_close(h);
        return rc;
    }
    if (mcrt_is_artifact(c->model))
        ost = open_model(c, &h);
    const char *tok_from = "none";
    rt_tokenizer *tok = ost ? NULL : load_tokenizer(c, h, &tok_from);
    if (!ost && c->n_texts && (rc = encode_inputs(c, tok)) >= 0) {
        rt_tokenizer_free(tok);
        mcrt_close(h);
        return rc;
    }
    if (!ost && !h)
        ost = open_model(c, &h);
    if (ost) {
        report_fill(&r, NULL, n_req, ost);
        report_finish(c, &r, 0);
        rt_tokenizer_free(tok);
        return 1;
    }
    /* Every input is open now: refuse a --metrics path that is one of
     * them (or a device, a FIFO...) before running, not after. */
    mc_error ge;
    if (c->metrics_path &&
        fmt_output_check_file(c->metrics_path, &ge) != MC_OK) {
        char buf[1400];
        fprintf(stderr, "mrun: --metrics: %s\n",
                mc_error_format(&ge, buf, sizeof buf));
        mcrt_close(h);
        rt_tokenizer_free(tok);
        return 1;
    }
    if (c->verbose) {
        mcrt_info in;
        mcrt_get_info(h, &in);
        fprintf(stderr,
                "mrun: %llu params, plan (%s): max_batch %u, max_seq %llu, "
                "prefill_chunk %u, threads %d, arena %llu bytes (KV %llu); "
                "tokenizer: %s\n",
                (unsigned long long)in.params, plan_name(in.plan_source),
                in.max_batch, (unsigned long long)in.max_seq,
                in.prefill_chunk, in.threads,
                (unsigned long long)in.arena_bytes,
                (unsigned long long)in.kv_bytes, tok_from);
    }
    if (c->json)
        printf("{");
    rc = c->score_labels || c->score_cont ? run_score(c, h)
                                          : run_generate(c, h, tok);
    report_fill(&r, h, c->in.n, 0);
    if (rc)
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(h));
    if (c->json)
        json_figures(&r, rc ? mcrt_last_error(h) : NULL);
    rc = rc ? 1 : 0;
    if (report_finish(c, &r, rc == 0))
        rc = 1;
    mcrt_close(h);
    rt_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv)
{
    fmt_mapguard_install();
    fmt_input_begin_run(); /* --metrics never replaces what this run reads */
    cli c;
    int rc = parse_args(argc, argv, &c);
    if (rc < 0)
        rc = run(&c);
    cli_free(&c);
    return rc;
}

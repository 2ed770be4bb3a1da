/* mrun - run a model: generate from token ids or text, or score.
 *
 * Uses the public API (mcrt.h) plus the tokenizer (rt_tokenizer.h) for
 * --prompt.  Prints results on stdout, timing on stderr.  Exit codes:
 * 0 ok, 1 failure (model, plan refusal, I/O), 2 usage. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mcrt.h"
#include "rt_tokenizer.h"

static const char *g_usage =
    "usage: mrun MODEL INPUT [options]\n"
    "\n"
    "MODEL is a Hugging Face model directory (config.json + safetensors) or\n"
    "an mcompile artifact.\n"
    "\n"
    "Input (one of; token ids are separated by spaces or commas):\n"
    "  --tokens \"1 2 3\"        one prompt of token ids (repeatable)\n"
    "  --tokens-file FILE      one prompt of ids per line\n"
    "  --prompt TEXT           one text prompt (repeatable; needs a\n"
    "                          tokenizer.json beside the model)\n"
    "  --prompts-file FILE     one text prompt per line\n"
    "\n"
    "Generation (default mode):\n"
    "  --max-new-tokens N      tokens to generate per prompt (default 16)\n"
    "  --temperature T         0 = greedy (default)\n"
    "  --top-k K  --top-p P    sampling filters (default off)\n"
    "  --seed S                RNG seed (default 0); sequence i uses (S, i)\n"
    "  --stop \"ids\"            extra stop token ids\n"
    "  --ignore-eos            do not stop at the model's EOS ids\n"
    "\n"
    "Scoring (no generation):\n"
    "  --score-labels \"ids\"    log-prob of each label token after each prompt\n"
    "  --score-continuation \"ids\"  log-prob of each continuation token and\n"
    "                          their sum, after each prompt\n"
    "\n"
    "Plan and machine:\n"
    "  --threads N             worker threads (default: all CPUs)\n"
    "  --max-batch N --max-seq N --prefill-chunk N   session limits\n"
    "  --kv f32|f16|i8         KV cache type (default: the plan's, else f32)\n"
    "  --truncate left|right   fit over-long prompts instead of refusing\n"
    "\n"
    "Output:\n"
    "  --json                  one JSON object on stdout\n"
    "  --no-special            with a tokenizer: no BOS added, specials kept\n"
    "  -q, -v                  quieter (no timing) / more (plan on stderr)\n"
    "  -h, --help              this text\n"
    "\n"
    "Default output: one line per sequence with the generated ids (a tab and\n"
    "the decoded text follow when a tokenizer is present); timing (prefill\n"
    "and decode tokens/s) on stderr.  Exit: 0 ok, 1 failure, 2 usage.\n";

typedef struct seqs {
    int32_t **ids;
    size_t *len;
    size_t n, cap;
} seqs;

typedef struct cli {
    const char *model;
    seqs in;
    int have_text;             /* prompts came as text */
    const char **texts;        /* pending --prompt texts */
    size_t n_texts, cap_texts;
    const char *prompts_file;
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
} cli;

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

/* Parse "1 2, 3" into a new array; returns -1 on a bad number. */
static int parse_ids(const char *s, int32_t **out, size_t *n)
{
    int32_t *v = NULL;
    size_t k = 0, cap = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' ||
               *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\t' &&
             *end != '\n' && *end != '\r')) {
            free(v);
            return -1;
        }
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            v = xrealloc(v, cap * sizeof *v);
        }
        v[k++] = (int32_t)x;
        p = end;
    }
    *out = v;
    *n = k;
    return 0;
}

static void seqs_add(seqs *s, int32_t *ids, size_t n)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->ids = xrealloc(s->ids, s->cap * sizeof *s->ids);
        s->len = xrealloc(s->len, s->cap * sizeof *s->len);
    }
    s->ids[s->n] = ids;
    s->len[s->n++] = n;
}

static char *read_text_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *b = xrealloc(NULL, cap);
    size_t r;
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            cap *= 2;
            b = xrealloc(b, cap);
        }
    }
    fclose(f);
    b[n] = '\0';
    return b;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno)
        return -1;
    *out = v;
    return 0;
}

static int parse_f(const char *s, float *out)
{
    char *end;
    errno = 0;
    if (!s)
        return -1;
    float v = strtof(s, &end);
    if (end == s || *end || errno)
        return -1;
    *out = v;
    return 0;
}

/* Returns -1 to continue, else an exit code. */
static int parse_args(int argc, char **argv, cli *c)
{
    memset(c, 0, sizeof *c);
    mcrt_gen_params_default(&c->gp);
    mcrt_options_default(&c->opts);
    c->add_special = 1;
    const char *tokens_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u;
#define NEED_VALUE()                                                           \
    if (!v)                                                                    \
        return usage_error("%s needs a value", a);                            \
    i++
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
        } else if (!strcmp(a, "--ignore-eos")) {
            c->gp.use_model_eos = 0;
        } else if (!strcmp(a, "--tokens")) {
            NEED_VALUE();
            int32_t *ids;
            size_t n;
            if (parse_ids(v, &ids, &n))
                return usage_error("--tokens: '%s' is not a list of token ids",
                                   v);
            if (n == 0)
                return usage_error("--tokens: empty prompt");
            seqs_add(&c->in, ids, n);
        } else if (!strcmp(a, "--tokens-file")) {
            NEED_VALUE();
            tokens_file = v;
        } else if (!strcmp(a, "--prompt")) {
            NEED_VALUE();
            if (c->n_texts == c->cap_texts) {
                c->cap_texts = c->cap_texts ? 2 * c->cap_texts : 8;
                c->texts = xrealloc(c->texts, c->cap_texts * sizeof *c->texts);
            }
            c->texts[c->n_texts++] = v;
        } else if (!strcmp(a, "--prompts-file")) {
            NEED_VALUE();
            c->prompts_file = v;
        } else if (!strcmp(a, "--max-new-tokens")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u > 1000000)
                return usage_error("--max-new-tokens: bad value '%s'", v);
            c->gp.max_new_tokens = (uint32_t)u;
        } else if (!strcmp(a, "--temperature")) {
            NEED_VALUE();
            if (parse_f(v, &c->gp.temperature) || c->gp.temperature < 0)
                return usage_error("--temperature: bad value '%s'", v);
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE();
            if (parse_f(v, &c->gp.top_p) || c->gp.top_p <= 0 ||
                c->gp.top_p > 1)
                return usage_error("--top-p: must be in (0, 1], got '%s'", v);
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u > UINT32_MAX)
                return usage_error("--top-k: bad value '%s'", v);
            c->gp.top_k = (uint32_t)u;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            if (parse_u64(v, &c->gp.seed))
                return usage_error("--seed: bad value '%s'", v);
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            if (parse_ids(v, &c->stop, &c->n_stop))
                return usage_error("--stop: bad id list '%s'", v);
        } else if (!strcmp(a, "--score-labels")) {
            NEED_VALUE();
            if (parse_ids(v, &c->labels, &c->n_labels) || c->n_labels == 0)
                return usage_error("--score-labels: bad id list '%s'", v);
            c->score_labels = 1;
        } else if (!strcmp(a, "--score-continuation")) {
            NEED_VALUE();
            if (parse_ids(v, &c->cont, &c->n_cont) || c->n_cont == 0)
                return usage_error("--score-continuation: bad id list '%s'", v);
            c->score_cont = 1;
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u < 1 || u > 256)
                return usage_error("--threads: 1..256, got '%s'", v);
            c->opts.threads = (int)u;
        } else if (!strcmp(a, "--max-batch")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u < 1 || u > 65536)
                return usage_error("--max-batch: bad value '%s'", v);
            c->opts.max_batch = (uint32_t)u;
        } else if (!strcmp(a, "--max-seq")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u < 1 || u > (1ull << 32))
                return usage_error("--max-seq: bad value '%s'", v);
            c->opts.max_seq = u;
        } else if (!strcmp(a, "--prefill-chunk")) {
            NEED_VALUE();
            if (parse_u64(v, &u) || u < 1 || u > (1u << 20))
                return usage_error("--prefill-chunk: bad value '%s'", v);
            c->opts.prefill_chunk = (uint32_t)u;
        } else if (!strcmp(a, "--kv")) {
            NEED_VALUE();
            if (!strcmp(v, "f32"))
                c->opts.kv_type = 1;
            else if (!strcmp(v, "f16"))
                c->opts.kv_type = 2;
            else if (!strcmp(v, "i8"))
                c->opts.kv_type = 3;
            else
                return usage_error("--kv: f32, f16 or i8, got '%s'", v);
        } else if (!strcmp(a, "--truncate")) {
            NEED_VALUE();
            if (!strcmp(v, "left"))
                c->gp.truncate = 1;
            else if (!strcmp(v, "right"))
                c->gp.truncate = 2;
            else
                return usage_error("--truncate: left or right, got '%s'", v);
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (!c->model) {
            c->model = a;
        } else {
            return usage_error("unexpected argument '%s'", a);
        }
#undef NEED_VALUE
    }
    if (!c->model)
        return usage_error("no MODEL given");
    if (tokens_file) {
        char *text = read_text_file(tokens_file);
        if (!text) {
            fprintf(stderr, "mrun: cannot read %s: %s\n", tokens_file,
                    strerror(errno));
            return 1;
        }
        size_t line = 0;
        for (char *save = NULL, *l = strtok_r(text, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save)) {
            line++;
            int32_t *ids;
            size_t n;
            if (parse_ids(l, &ids, &n)) {
                free(text);
                return usage_error("%s:%zu: not a list of token ids",
                                   tokens_file, line);
            }
            if (n)
                seqs_add(&c->in, ids, n);
            else
                free(ids);
        }
        free(text);
    }
    c->have_text = c->n_texts > 0 || c->prompts_file;
    if (c->have_text && c->in.n)
        return usage_error("give token ids or text prompts, not both");
    if (!c->have_text && c->in.n == 0)
        return usage_error("no input: use --tokens, --tokens-file, --prompt "
                           "or --prompts-file");
    if (c->score_labels && c->score_cont)
        return usage_error("--score-labels and --score-continuation are "
                           "separate runs");
    c->gp.stop_ids = c->stop;
    c->gp.n_stop = c->n_stop;
    return -1;
}

/* Tokenizer beside the model (dir/tokenizer.json or the file's dir). */
static rt_tokenizer *load_tokenizer(const char *model, int verbose)
{
    char path[4096];
    struct stat st;
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/tokenizer.json", model);
    } else {
        const char *slash = strrchr(model, '/');
        if (slash)
            snprintf(path, sizeof path, "%.*s/tokenizer.json",
                     (int)(slash - model), model);
        else
            snprintf(path, sizeof path, "tokenizer.json");
    }
    if (stat(path, &st) != 0)
        return NULL;
    rt_tokenizer *t = NULL;
    mc_error e;
    if (rt_tokenizer_load(path, &t, &e) != MC_OK) {
        char buf[1400];
        if (verbose)
            fprintf(stderr, "mrun: tokenizer ignored: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
        return NULL;
    }
    return t;
}

static int encode_text(const rt_tokenizer *tok, const char *text, int special,
                       seqs *out)
{
    size_t need = 0;
    mc_error e;
    size_t len = strlen(text);
    rt_tokenizer_encode(tok, text, len, special, NULL, 0, &need, &e);
    int32_t *ids = xrealloc(NULL, (need ? need : 1) * sizeof *ids);
    size_t n = 0;
    if (rt_tokenizer_encode(tok, text, len, special, ids, need, &n, &e)) {
        char buf[1400];
        fprintf(stderr, "mrun: cannot encode prompt: %s\n",
                mc_error_format(&e, buf, sizeof buf));
        free(ids);
        return 1;
    }
    if (n == 0) {
        free(ids);
        fprintf(stderr, "mrun: prompt encodes to no tokens\n");
        return 1;
    }
    seqs_add(out, ids, n);
    return 0;
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

/* The one place that opens the model: an artifact path (magic check) can be
 * dispatched here (rt_model_open behind mcrt_open also dispatches, so
 * embedders get the same).  Sizes a plan-less session for the request. */
static int open_model(const cli *c, size_t nseq, uint64_t longest, mcrt **h)
{
    mcrt_options o = c->opts;
    o.want_batch = nseq > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)nseq;
    o.want_seq = longest;
    int rc = mcrt_open(c->model, &o, h);
    if (rc) {
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(NULL));
        return 1;
    }
    return 0;
}

static const char *stop_name(int r)
{
    return r == 2 ? "stop_token" : r == 1 ? "length" : "none";
}

static void print_timing(const cli *c, const mcrt *h)
{
    mcrt_stats st;
    mcrt_get_stats(h, &st);
    if (c->quiet)
        return;
    fprintf(stderr,
            "mrun: prefill %llu tokens in %.3f s (%.1f tok/s); decode %llu "
            "tokens in %.3f s (%.1f tok/s)\n",
            (unsigned long long)st.prefill_tokens, st.prefill_seconds,
            st.prefill_seconds > 0 ? st.prefill_tokens / st.prefill_seconds
                                   : 0.0,
            (unsigned long long)st.decode_tokens, st.decode_seconds,
            st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds
                                  : 0.0);
}

static void json_timing(const mcrt *h)
{
    mcrt_stats st;
    mcrt_info info;
    mcrt_get_stats(h, &st);
    mcrt_get_info(h, &info);
    printf("\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, "
           "\"prefill_tokens\": %llu, \"decode_tokens\": %llu, "
           "\"prefill_seconds\": %.6f, \"decode_seconds\": %.6f, "
           "\"threads\": %d, \"max_batch\": %u, \"max_seq\": %llu, "
           "\"prefill_chunk\": %u, \"arena_bytes\": %llu, \"kv_bytes\": %llu, "
           "\"weight_bytes\": %llu, \"params\": %llu}\n",
           st.prefill_seconds > 0 ? st.prefill_tokens / st.prefill_seconds : 0.0,
           st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0.0,
           (unsigned long long)st.prefill_tokens,
           (unsigned long long)st.decode_tokens, st.prefill_seconds,
           st.decode_seconds, info.threads, info.max_batch,
           (unsigned long long)info.max_seq, info.prefill_chunk,
           (unsigned long long)info.arena_bytes,
           (unsigned long long)info.kv_bytes,
           (unsigned long long)info.weight_bytes,
           (unsigned long long)info.params);
}

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
    if (rc) {
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(h));
        free(res);
        free(buf);
        return 1;
    }
    if (c->json)
        printf("{\"sequences\": [");
    for (size_t i = 0; i < n; i++) {
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
                   res[i].prompt_used, stop_name(res[i].stop_reason));
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
    if (c->json) {
        printf("], ");
        json_timing(h);
    }
    free(res);
    free(buf);
    return 0;
}

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
    if (rc) {
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(h));
    } else {
        if (c->json)
            printf("{\"scores\": [");
        for (size_t i = 0; i < n; i++) {
            if (c->json) {
                printf("%s{", i ? ", " : "");
                if (lab) {
                    printf("\"labels\": [");
                    for (size_t j = 0; j < c->n_labels; j++)
                        printf("%s{\"id\": %d, \"logprob\": %.7g}",
                               j ? ", " : "", (int)c->labels[j],
                               lab[i * c->n_labels + j]);
                    printf("]}");
                } else {
                    printf("\"logprobs\": [");
                    for (size_t j = 0; j < c->n_cont; j++)
                        printf("%s%.7g", j ? ", " : "", per_ptr[i][j]);
                    printf("], \"sum\": %.9g}", sum[i]);
                }
            } else if (lab) {
                for (size_t j = 0; j < c->n_labels; j++)
                    printf("%s%.7g", j ? " " : "", lab[i * c->n_labels + j]);
                putchar('\n');
            } else {
                printf("%.9g\t", sum[i]);
                for (size_t j = 0; j < c->n_cont; j++)
                    printf("%s%.7g", j ? " " : "", per_ptr[i][j]);
                putchar('\n');
            }
        }
        if (c->json) {
            printf("], ");
            json_timing(h);
        }
    }
    free(lab);
    free(per);
    free(per_ptr);
    free(sum);
    return rc ? 1 : 0;
}

/* Text prompts -> ids.  Returns -1 to go on, else an exit code. */
static int encode_inputs(cli *c, const rt_tokenizer *tok)
{
    if (!tok) {
        fprintf(stderr, "mrun: --prompt/--prompts-file need a tokenizer.json "
                        "beside the model; none was found or it could not "
                        "be loaded (use --tokens)\n");
        return 1;
    }
    for (size_t i = 0; i < c->n_texts; i++)
        if (encode_text(tok, c->texts[i], c->add_special, &c->in))
            return 1;
    if (c->prompts_file) {
        char *text = read_text_file(c->prompts_file);
        if (!text) {
            fprintf(stderr, "mrun: cannot read %s: %s\n", c->prompts_file,
                    strerror(errno));
            return 1;
        }
        for (char *save = NULL, *l = strtok_r(text, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save))
            if (*l && encode_text(tok, l, c->add_special, &c->in)) {
                free(text);
                return 1;
            }
        free(text);
    }
    if (c->in.n == 0)
        return usage_error("no prompts in the input");
    return -1;
}

static void cli_free(cli *c)
{
    for (size_t i = 0; i < c->in.n; i++)
        free(c->in.ids[i]);
    free(c->in.ids);
    free(c->in.len);
    free(c->texts);
    free(c->stop);
    free(c->labels);
    free(c->cont);
    memset(c, 0, sizeof *c);
}

int main(int argc, char **argv)
{
    cli c;
    int rc = parse_args(argc, argv, &c);
    if (rc >= 0) {
        cli_free(&c);
        return rc;
    }
    rt_tokenizer *tok = load_tokenizer(c.model, c.verbose);
    if (c.have_text && (rc = encode_inputs(&c, tok)) >= 0) {
        rt_tokenizer_free(tok);
        cli_free(&c);
        return rc;
    }
    uint64_t longest = 0;
    size_t extra = c.score_labels ? 0 : c.score_cont ? c.n_cont
                                                      : c.gp.max_new_tokens;
    for (size_t i = 0; i < c.in.n; i++)
        if (c.in.len[i] + extra > longest)
            longest = c.in.len[i] + extra;
    mcrt *h = NULL;
    if (open_model(&c, c.in.n, longest, &h)) {
        rt_tokenizer_free(tok);
        cli_free(&c);
        return 1;
    }
    if (c.verbose) {
        mcrt_info info;
        mcrt_get_info(h, &info);
        fprintf(stderr,
                "mrun: %llu params, plan: max_batch %u, max_seq %llu, "
                "prefill_chunk %u, threads %d, arena %llu bytes (KV %llu)\n",
                (unsigned long long)info.params, info.max_batch,
                (unsigned long long)info.max_seq, info.prefill_chunk,
                info.threads, (unsigned long long)info.arena_bytes,
                (unsigned long long)info.kv_bytes);
    }
    rc = c.score_labels || c.score_cont ? run_score(&c, h)
                                        : run_generate(&c, h, tok);
    if (rc == 0)
        print_timing(&c, h);
    mcrt_close(h);
    rt_tokenizer_free(tok);
    cli_free(&c);
    return rc;
}

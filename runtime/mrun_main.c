/* mrun - run a model: generate from token ids or text, or score.
 *
 * Uses the public API (mcrt.h), the tokenizer (rt_tokenizer.h) for text
 * and the Prometheus writer (rt_metrics.h); its options are one table
 * (mrun_opts.h), its output is printed by mrun_print.h (which documents
 * the --json object).  Results on stdout, timing on stderr.
 * Exit codes: 0 ok, 1 failure (model, plan refusal, I/O), 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_ids.h"
#include "fmt_input.h"
#include "fmt_mapguard.h"
#include "kn_cpus.h"
#include "mcrt.h"
#include "mrun_job.h"
#include "mrun_opts.h"
#include "mrun_print.h"
#include "rt_stopstr.h"
#include "rt_tokenizer.h"

/* Why no tokenizer was loaded (the loader's own message), for the error a
 * text request gets; empty when none was found. */
static char tok_why[1400];

/* The tokenizer: the one an artifact embeds (h opened), else
 * tokenizer.json beside the model (dir/tokenizer.json or the file's dir).
 * *from says which, for -v.  On failure tok_why holds the reason. */
static rt_tokenizer *load_tokenizer(const mrun_cli *c, const mcrt *h,
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
static int encode_inputs(mrun_cli *c, const rt_tokenizer *tok)
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
        int32_t *ids = mrun_xrealloc(NULL, (need ? need : 1) * sizeof *ids);
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
        mrun_seqs_add(&c->in, ids, n);
        free(ids);
    }
    return -1;
}

/* Decoded text of ids (malloc'ed) or NULL. */
static char *decode(const rt_tokenizer *tok, const int32_t *ids, size_t n,
                    size_t *len)
{
    if (!tok)
        return NULL;
    size_t need = 0;
    rt_tokenizer_decode(tok, ids, n, 1, NULL, 0, &need);
    char *b = mrun_xrealloc(NULL, need + 1);
    if (rt_tokenizer_decode(tok, ids, n, 1, b, need + 1, len)) {
        free(b);
        return NULL;
    }
    return b;
}

/* An artifact's plan caps the threads (their scratch is in its arena):
 * say so when that leaves CPUs idle, since prefill is compute-bound, and
 * how to plan for more. */
static void note_threads(const mrun_cli *c, mcrt *h)
{
    mcrt_info in;
    if (mcrt_get_info(h, &in) != 0 || in.device != MCRT_DEVICE_CPU ||
        in.plan_source == MCRT_PLAN_RUNTIME)
        return;
    int cpus = kn_cpu_count(), want = c->opts.threads > 0 ? c->opts.threads : cpus;
    if (want > cpus)
        want = cpus; /* more would not run faster (kn_cpus.h) */
    if (in.threads >= want)
        return;
    if (c->opts.threads > 0)
        fprintf(stderr, "mrun: note: running %d thread%s, not the %d asked for: ",
                in.threads, in.threads == 1 ? "" : "s", c->opts.threads);
    else
        fprintf(stderr, "mrun: note: running %d thread%s on %d CPUs: ", in.threads,
                in.threads == 1 ? "" : "s", cpus);
    fprintf(stderr, "the artifact's plan is sized for %d (`mcompile ... --threads %d` "
            "plans for more)\n", in.threads, want);
}

/* Sizes a plan-less session for the request (an artifact's plan wins). */
static int open_model(const mrun_cli *c, mcrt **h)
{
    uint64_t longest = 0;
    size_t extra = c->score_cont ? c->n_cont : c->gp.max_new_tokens;
    if (c->score_labels) /* room for the longest label after the prompt */
        for (size_t j = extra = 0; j < c->labels.n; j++)
            extra = c->labels.len[j] > extra ? c->labels.len[j] : extra;
    for (size_t i = 0; i < c->in.n; i++)
        if (c->in.len[i] + extra > longest)
            longest = c->in.len[i] + extra;
    mcrt_options o = c->opts;
    o.want_batch = c->in.n > 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t)c->in.n;
    o.want_seq = longest;
    int rc = mcrt_open(c->model, &o, h);
    if (rc)
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(NULL));
    else if (!c->quiet)
        note_threads(c, *h);
    return rc;
}

/* --stop-string: one matcher per prompt, windows allocated here, fed
 * inside the model's steps (mcrt_gen_params.on_token). */
typedef struct stop_ctx {
    rt_stop_pieces *pieces;
    rt_stop_match *m;          /* [n] */
    char *win;                 /* [n][bytes] */
} stop_ctx;

static int on_token(void *ctx, uint64_t seq, const int32_t *ids, size_t n)
{
    return rt_stop_match_push(&((stop_ctx *)ctx)->m[seq], ids[n - 1]);
}

/* Set up sc for n prompts; returns 0, or 1 after a message. */
static int stop_setup(const mrun_cli *c, const rt_tokenizer *tok, size_t n,
                      stop_ctx *sc, mcrt_gen_params *gp)
{
    memset(sc, 0, sizeof *sc);
    if (c->n_stop_str == 0)
        return 0;
    mc_error e;
    mc_error_clear(&e);
    if (rt_stop_pieces_build(tok, &sc->pieces, &e) != MC_OK) {
        fprintf(stderr, "mrun: --stop-string: %s\n", e.message);
        return 1;
    }
    size_t w = rt_stop_match_bytes(sc->pieces, c->stop_str_len,
                                   c->n_stop_str);
    sc->m = mrun_xrealloc(NULL, n * sizeof *sc->m);
    sc->win = mrun_xrealloc(NULL, n * w);
    for (size_t i = 0; i < n; i++)
        rt_stop_match_init(&sc->m[i], sc->pieces, c->stop_str,
                           c->stop_str_len, c->n_stop_str, sc->win + i * w);
    gp->on_token = on_token;
    gp->on_token_ctx = sc;
    return 0;
}

/* Generation; results on stdout (for --json, the object's first key). */
static int run_generate(const mrun_cli *c, mcrt *h, const rt_tokenizer *tok)
{
    size_t n = c->in.n, M = c->gp.max_new_tokens;
    mcrt_gen_params gp = c->gp;
    stop_ctx sc;
    if (stop_setup(c, tok, n, &sc, &gp))
        return 1;
    mcrt_result *res = mrun_xrealloc(NULL, n * sizeof *res);
    int32_t *buf = mrun_xrealloc(NULL, (n * M > 0 ? n * M : 1) * sizeof *buf);
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].ids = buf + i * M;
    }
    int rc = mcrt_generate(h, (const int32_t *const *)c->in.ids, c->in.len, n,
                           &gp, res);
    if (c->json && !rc)
        printf("\"sequences\": [");
    for (size_t i = 0; !rc && i < n; i++) {
        size_t tl = 0;
        char *text = decode(tok, res[i].ids, res[i].n_ids, &tl);
        if (text && res[i].stop_reason == 3) /* cut before the stop string */
            tl = rt_stop_find(text, tl, c->stop_str, c->stop_str_len,
                              c->n_stop_str);
        mrun_print_sequence(c, i, &res[i], text, tl);
        free(text);
    }
    if (c->json && !rc)
        printf("], ");
    free(res);
    free(buf);
    free(sc.m);
    free(sc.win);
    rt_stop_pieces_free(sc.pieces);
    return rc;
}

/* Scoring; results as run_generate. */
static int run_score(const mrun_cli *c, mcrt *h)
{
    size_t n = c->in.n;
    int rc;
    float *lab = NULL, *per = NULL;
    float **per_ptr = NULL;
    double *sum = NULL;
    if (c->score_labels) {
        lab = mrun_xrealloc(NULL, n * c->labels.n * sizeof *lab);
        rc = mcrt_score_label_seqs(h, (const int32_t *const *)c->in.ids,
                                   c->in.len, n,
                                   (const int32_t *const *)c->labels.ids,
                                   c->labels.len, c->labels.n, lab,
                                   c->gp.truncate);
    } else {
        per = mrun_xrealloc(NULL, n * c->n_cont * sizeof *per);
        per_ptr = mrun_xrealloc(NULL, n * sizeof *per_ptr);
        sum = mrun_xrealloc(NULL, n * sizeof *sum);
        const int32_t **conts = mrun_xrealloc(NULL, n * sizeof *conts);
        size_t *cl = mrun_xrealloc(NULL, n * sizeof *cl);
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
        mrun_print_scores(c, n, lab, per_ptr, sum);
    free(lab);
    free(per);
    free(per_ptr);
    free(sum);
    return rc;
}

/* Open the model (and its tokenizer), run, report.  An artifact is opened
 * before encoding text (its tokenizer is inside it, and its plan does not
 * depend on the request); a Hugging Face model after, so that a plan-less
 * session is sized for the encoded request. */
static int run(mrun_cli *c)
{
    mcrt *h = NULL;
    mrun_report r;
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
        mrun_report_fill(&r, NULL, n_req, ost);
        mrun_report_finish(c, &r, 0);
        rt_tokenizer_free(tok);
        return 1;
    }
    /* --tokens-file ids against the model's vocabulary, with the file's
     * line and column (the session would name only "sequence i"); then,
     * every input being open, a --metrics path that is one of them (or a
     * device, a FIFO...): refused before running, not after. */
    mc_error ie;
    mc_error_clear(&ie);
    const char *bad = NULL;
    if (c->tokens_file) {
        mcrt_info in;
        fmt_ids *f = NULL;
        if (mcrt_get_info(h, &in) == 0 &&
            fmt_ids_load(c->tokens_file, in.vocab_size, &f, &ie) != MC_OK)
            bad = "--tokens-file";
        fmt_ids_free(f);
    }
    if (!bad && c->metrics_path &&
        rt_metrics_check_path(c->metrics_path, &ie) != MC_OK)
        bad = "--metrics";
    if (bad) {
        char buf[1400];
        fprintf(stderr, "mrun: %s: %s\n", bad,
                mc_error_format(&ie, buf, sizeof buf));
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
                (unsigned long long)in.params, mrun_plan_name(in.plan_source),
                in.max_batch, (unsigned long long)in.max_seq,
                in.prefill_chunk, in.threads,
                (unsigned long long)in.arena_bytes,
                (unsigned long long)in.kv_bytes, tok_from);
    }
    if (c->json)
        printf("{");
    rc = c->score_labels || c->score_cont ? run_score(c, h)
                                          : run_generate(c, h, tok);
    mrun_report_fill(&r, h, c->in.n, 0);
    if (rc)
        fprintf(stderr, "mrun: %s\n", mcrt_last_error(h));
    if (c->json)
        mrun_print_figures(&r, rc ? mcrt_last_error(h) : NULL);
    rc = rc ? 1 : 0;
    if (mrun_report_finish(c, &r, rc == 0))
        rc = 1;
    mcrt_close(h);
    rt_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv)
{
    fmt_mapguard_install();
    fmt_input_begin_run(); /* --metrics never replaces what this run reads */
    mrun_cli c;
    int rc = mrun_cli_parse(argc, argv, &c);
    if (rc < 0)
        rc = run(&c);
    mrun_cli_free(&c);
    return rc;
}

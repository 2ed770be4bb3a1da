/* cli_eval.c - `mcompile eval ARTIFACT --ref MODEL --tokens FILE [--json]`:
 * run the reference model and the compiled (quantized) one over the same
 * token sequences and report mean KLD, its 99th percentile, top-1
 * agreement and both perplexities (cmp_eval.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmp_cli.h"
#include "cmp_eval.h"
#include "kn_ops.h"
#include "mc_alloc.h"
#include "mc_parse.h"
#include "rt_artifact.h"
#include "rt_model.h"

/* Every option of `mcompile eval`. */
typedef struct eval_cli {
    const char *art, *ref, *tokens;
    uint64_t max_seqs;     /* 0: every sequence */
    int threads;           /* 0: every CPU */
    int json, quiet;
    int verbose;           /* -v: accepted, nothing more to say */
} eval_cli;

static const mc_opt eval_opts[] = {
    {.kind = MC_OPT_STR, .flags = "--ref", .value = "MODEL",
     .off = offsetof(eval_cli, ref),
     .help = "full-precision reference (HF directory or file)"},
    {.kind = MC_OPT_STR, .flags = "--tokens", .value = "FILE",
     .off = offsetof(eval_cli, tokens),
     .help = "token ids, one sequence per line"},
    {.kind = MC_OPT_U64, .flags = "--max-seqs", .value = "N",
     .off = offsetof(eval_cli, max_seqs), .ulo = 1, .uhi = 1u << 30,
     .help = "use only the first N sequences"},
    {.kind = MC_OPT_INT, .flags = "--threads", .value = "N",
     .off = offsetof(eval_cli, threads), .ulo = 1, .uhi = 256,
     .help = "worker threads (default: the CPUs this process may use)"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = offsetof(eval_cli, json),
     .help = "one JSON object on stdout: kld_mean, kld_p99, top1,\n"
             "ppl_ref, ppl, tokens"},
    {.kind = MC_OPT_SET, .flags = "-q", .off = offsetof(eval_cli, quiet),
     .help = "no progress"},
    {.kind = MC_OPT_SET, .flags = "-v", .off = offsetof(eval_cli, verbose),
     .help = "accepted for symmetry"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

const mc_opt_cmd cmp_cli_eval_cmd = {
    .name = "mcompile eval",
    .usage =
        "usage: mcompile eval ARTIFACT --ref MODEL --tokens FILE [options]\n\n"
        "Runs the reference model (a Hugging Face directory) and ARTIFACT (or\n"
        "any model mcompile can open) over the same token sequences and\n"
        "reports how far the quantized next-token distributions are from the\n"
        "reference ones.\n\n",
    .help_col = 18,
    .positional = "ARTIFACT",
    .positional_off = offsetof(eval_cli, art),
    .opts = eval_opts,
};

typedef struct prog {
    int on;
    double t0, last;
} prog;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_progress(void *ctx, size_t done, size_t total)
{
    prog *p = ctx;
    double t = now_s();
    if (!p->on || (t - p->last < 0.25 && done < total))
        return;
    p->last = t;
    double el = t - p->t0;
    double eta = done ? el / (double)done * (double)(total - done) : 0.0;
    fprintf(stderr, "\reval: %zu/%zu sequences, %.0f s, ETA %.0f s   ", done,
            total, el, eta);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

int cmp_cli_eval(int argc, char **argv)
{
    eval_cli ec;
    memset(&ec, 0, sizeof ec);
    int rc = cmp_cli_parse(&cmp_cli_eval_cmd, argc, argv, &ec);
    if (rc >= 0)
        return rc;
    if (!ec.art || !ec.ref || !ec.tokens)
        return cmp_cli_usage(&cmp_cli_eval_cmd,
                             "ARTIFACT, --ref and --tokens are required");
    const char *art = ec.art, *ref = ec.ref, *tokens = ec.tokens;
    int json = ec.json, quiet = ec.quiet, threads = ec.threads;
    mc_error e;
    char buf[2048];
    rt_model *mq = NULL, *mr = NULL;
    int32_t *tok = NULL;
    size_t *off = NULL, nseq = 0;
    kn_pool *pool = NULL;
    rc = 1;
    if (cmp_ids_load(tokens, &tok, &off, &nseq, &e) != MC_OK ||
        rt_model_open_hf(ref, &mr, &e) != MC_OK ||
        rt_model_open_ex(art, RT_ART_ROWS, &mq, &e) != MC_OK) {
        fprintf(stderr, "mcompile eval: %s\n", mc_error_format(&e, buf, sizeof buf));
        goto out;
    }
    if (ec.max_seqs > 0 && ec.max_seqs < nseq)
        nseq = (size_t)ec.max_seqs;
    pool = kn_pool_create(threads);
    prog p = {!quiet && isatty(2), now_s(), 0.0};
    cmp_eval_report r;
    if (cmp_eval_models(mr, mq, tok, off, nseq, pool, on_progress, &p, &r, &e) != MC_OK) {
        fprintf(stderr, "mcompile eval: %s\n", mc_error_format(&e, buf, sizeof buf));
        goto out;
    }
    if (json) {
        printf("{\"kld_mean\": %.6g, \"kld_p99\": %.6g, \"top1\": %.6g, "
               "\"ppl_ref\": %.6g, \"ppl\": %.6g, \"tokens\": %llu}\n",
               r.kld_mean, r.kld_p99, r.top1, r.ppl_ref, r.ppl,
               (unsigned long long)r.tokens);
    } else {
        printf("eval %s against %s: %llu positions in %zu sequences\n", art, ref,
               (unsigned long long)r.tokens, nseq);
        printf("  mean KLD     %.5f\n", r.kld_mean);
        printf("  KLD p99      %.5f\n", r.kld_p99);
        printf("  top-1        %.2f %%\n", 100.0 * r.top1);
        printf("  ppl (ref)    %.4f\n", r.ppl_ref);
        printf("  ppl          %.4f  (ratio %.4f)\n", r.ppl,
               r.ppl_ref > 0 ? r.ppl / r.ppl_ref : 0.0);
    }
    rc = 0;
out:
    kn_pool_free(pool);
    rt_model_free(mq);
    rt_model_free(mr);
    mc_free(tok);
    mc_free(off);
    return rc;
}

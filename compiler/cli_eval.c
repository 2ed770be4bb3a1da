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
#include "rt_model.h"

static void eval_usage(FILE *o)
{
    fprintf(o,
            "usage: mcompile eval ARTIFACT --ref MODEL --tokens FILE [options]\n\n"
            "Runs the reference model (a Hugging Face directory) and ARTIFACT (or\n"
            "any model mcompile can open) over the same token sequences and\n"
            "reports how far the quantized next-token distributions are from the\n"
            "reference ones.\n\n"
            "  --ref MODEL     full-precision reference (HF directory or file)\n"
            "  --tokens FILE   token ids, one sequence per line\n"
            "  --max-seqs N    use only the first N sequences\n"
            "  --threads N     worker threads (default: all CPUs)\n"
            "  --json          one JSON object on stdout: kld_mean, kld_p99, top1,\n"
            "                  ppl_ref, ppl, tokens\n"
            "  -q              no progress\n"
            "  --help          this text\n");
}

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
    const char *art = NULL, *ref = NULL, *tokens = NULL;
    int json = 0, quiet = 0, threads = 0;
    long max_seqs = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            eval_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "-q")) {
            quiet = 1;
        } else if (!strcmp(a, "-v")) {
            /* nothing more to say */
        } else if ((!strcmp(a, "--ref") || !strcmp(a, "--tokens") ||
                    !strcmp(a, "--max-seqs") || !strcmp(a, "--threads")) &&
                   i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(a, "--ref"))
                ref = v;
            else if (!strcmp(a, "--tokens"))
                tokens = v;
            else {
                char why[256];
                uint64_t n;
                if (mc_parse_u64(a, v, 1, !strcmp(a, "--threads") ? 256 : 1u << 30,
                                 &n, why, sizeof why)) {
                    fprintf(stderr, "mcompile eval: %s\n", why);
                    return 2;
                }
                if (!strcmp(a, "--max-seqs"))
                    max_seqs = (long)n;
                else
                    threads = (int)n;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "mcompile eval: unknown or incomplete option '%s'\n", a);
            eval_usage(stderr);
            return 2;
        } else if (!art) {
            art = a;
        } else {
            fprintf(stderr, "mcompile eval: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!art || !ref || !tokens) {
        fprintf(stderr, "mcompile eval: ARTIFACT, --ref and --tokens are required\n");
        eval_usage(stderr);
        return 2;
    }
    mc_error e;
    char buf[2048];
    rt_model *mq = NULL, *mr = NULL;
    int32_t *tok = NULL;
    size_t *off = NULL, nseq = 0;
    kn_pool *pool = NULL;
    int rc = 1;
    if (cmp_ids_load(tokens, &tok, &off, &nseq, &e) != MC_OK ||
        rt_model_open_hf(ref, &mr, &e) != MC_OK ||
        rt_model_open(art, &mq, &e) != MC_OK) {
        fprintf(stderr, "mcompile eval: %s\n", mc_error_format(&e, buf, sizeof buf));
        goto out;
    }
    if (max_seqs > 0 && (size_t)max_seqs < nseq)
        nseq = (size_t)max_seqs;
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

/* bench_prefill.c - prefill speed of one artifact at several prompt
 * lengths, the runtime half of scripts/bench-prefill-vs-llamacpp (which
 * runs it interleaved with llama-bench -p).  One session per length, KV
 * f16, the whole prompt in one step (prefill_chunk = the prompt length,
 * as llama-bench's single ubatch up to 512; longer prompts in steps of
 * 512), a 16-token warm-up first; tok/s is the session's own prefill
 * figure, best of --reps.  Prints one JSON line:
 *   {"pp128": tok/s, "pp512": ..., "pp2048": ..., "load": loadavg}
 *
 * usage: bench_prefill ARTIFACT [--threads N] [--reps N] [--lens a,b,...] [--cpu]
 * --cpu: prompt tokens per CPU-second of the process (all threads; the
 * step's one decoded token included, <1 % at 128 tokens) instead of the
 * session's wall-clock figure: with --threads 1, a busy machine's figure
 * close to a quiet one's, for A/B runs of two builds.
 * Errors on stderr; exit 1 on failure, 2 on usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"

static void fail(const char *what, const mc_error *e)
{
    char buf[1600];
    fprintf(stderr, "bench_prefill: %s: %s\n", what,
            e ? mc_error_format(e, buf, sizeof buf) : "failed");
    exit(1);
}

static int g_cpu; /* 1: tokens per CPU-second (--cpu) */

/* Prefill tok/s of one len-token prompt (one new token) in session s. */
static double prefill_rate(rt_session *s, const int32_t *ids, size_t len)
{
    int32_t out[1];
    rt_prompt pr = {ids, len};
    rt_gen_result res = {.ids = out};
    rt_gen_params gp = {.max_new_tokens = 1};
    mc_error e;
    rt_session_reset_stats(s);
    double c0 = bench_cpu_now();
    if (rt_session_generate(s, &pr, 1, &gp, &res, &e))
        fail("generate", &e);
    if (g_cpu)
        return (double)len / (bench_cpu_now() - c0);
    rt_session_stats st;
    rt_session_stats_get(s, &st);
    return (double)st.prefill_tokens / st.prefill_seconds;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_prefill ARTIFACT [--threads N] [--reps N] "
            "[--lens a,b,...] [--cpu]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int threads = 2, reps = 1;
    size_t lens[8] = {128, 512, 2048}, nl = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = (int)bench_arg_u64("--reps", argv[++i], 1, 1000000);
        } else if (!strcmp(argv[i], "--lens") && i + 1 < argc) {
            nl = 0;
            for (char *t = strtok(argv[++i], ","); t && nl < 8; t = strtok(NULL, ","))
                lens[nl++] = (size_t)atol(t);
        } else if (!strcmp(argv[i], "--cpu")) {
            g_cpu = 1;
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            return usage();
        }
    }
    if (!path || reps < 1 || nl == 0)
        return usage();
    for (size_t i = 0; i < nl; i++)
        if (lens[i] < 16)
            return usage();
    mc_error e;
    rt_model *m;
    if (rt_model_open_artifact(path, &m, &e))
        fail("open artifact", &e);
    uint32_t vocab = m->cfg.vocab_size;
    printf("{");
    for (size_t i = 0; i < nl; i++) {
        size_t len = lens[i];
        int32_t *ids = malloc(len * sizeof *ids);
        if (!ids)
            fail("out of memory", NULL);
        for (size_t k = 0; k < len; k++)
            ids[k] = (int32_t)((k * 104729u + 3) % vocab);
        rt_limits L = {.max_batch = 1, .max_seq = len + 1,
                       .prefill_chunk = len < 512 ? (uint32_t)len : 512,
                       .kv_type = KN_KV_F16, .threads = threads};
        rt_session *s;
        if (rt_session_create(m, &L, NULL, &s, &e))
            fail("session", &e);
        prefill_rate(s, ids, 16); /* warm-up, as llama-bench does */
        double best = 0.0;
        for (int r = 0; r < reps; r++) {
            double v = prefill_rate(s, ids, len);
            best = v > best ? v : best;
        }
        rt_session_free(s);
        free(ids);
        printf("\"pp%zu\": %.3f, ", len, best);
        fflush(stdout);
    }
    printf("\"load\": %.2f}\n", bench_loadavg());
    rt_model_free(m);
    return 0;
}

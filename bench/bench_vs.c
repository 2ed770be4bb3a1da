/* bench_vs.c - the runtime's half of scripts/bench-vs-llamacpp: one round
 * of the figures llama-bench and llama-batched-bench give for llama.cpp,
 * measured the same way on one artifact, printed as one JSON line:
 *
 *   load_s       rt_model_open_artifact, checksums verified (warm cache)
 *   pp128, pp512 prefill tok/s of one prompt of 128 / 512 tokens in one
 *                chunk (llama-bench -p 128,512: one ubatch of 512)
 *   tg1          decode tok/s at batch 1: a 1-token prompt, then --ntg
 *                new tokens (llama-bench -n from an empty context)
 *   tg8          decode tok/s of 8 sequences of 128-token prompts, --ntg
 *                new tokens each (llama-batched-bench -npp 128 -npl 8)
 *   tg1_cpu_ms, tg8_cpu_ms  process CPU ms per decoded token of tg1 / tg8
 *                (all threads, spinning included; tg8's prompts taken out
 *                by a second call that decodes 1 token; with --threads 1
 *                the cost of a token, little disturbed by a busy machine)
 *   read_gbs     multi-threaded read bandwidth measured right before tg1
 *                (the bound)
 *   weight_bytes matrix bytes a decode step reads
 *   wake_us      kn_pool_run of an empty job on every thread, mean of 20000
 *                back to back: what one parallel op pays to start and
 *                join its workers (a decode step runs ~7 per layer)
 *
 * usage: bench_vs ARTIFACT [--threads N] [--ntg N] [--only pp|tg1|tg8|tg|probe]
 *   --only: just those figures (the others print as 0), e.g. to profile
 *   decode with perf; tg = tg1 and tg8; probe: {"read_gbs": X} alone, the
 *   artifact not opened (the side-by-side runs it right before
 *   llama.cpp's batch-1 decode).
 * Progress and errors on stderr; exit 1 on failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"

static void die(const char *what, const mc_error *e)
{
    char buf[1600];
    fprintf(stderr, "bench_vs: %s: %s\n", what,
            e ? mc_error_format(e, buf, sizeof buf) : "failed");
    exit(1);
}

static void noop(void *ctx, int tid, int nth)
{
    (void)ctx, (void)tid, (void)nth;
}

/* Process CPU seconds, all threads: on a busy machine the wall clock
 * counts time the scheduler gave to others, CPU time far less so. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* tok/s of prefill (which = 0) or decode (1) of one generate call; *cpu_ms
 * (if not NULL): CPU milliseconds of the whole call per generated token. */
static double gen_rate(rt_session *s, uint32_t vocab, uint32_t batch,
                       size_t plen, uint32_t ndec, int which, double *cpu_ms)
{
    int32_t *ids = malloc(batch * plen * sizeof *ids);
    int32_t *outs = malloc(batch * (size_t)ndec * sizeof *outs);
    rt_prompt *pr = calloc(batch, sizeof *pr);
    rt_gen_result *res = calloc(batch, sizeof *res);
    if (!ids || !outs || !pr || !res)
        die("out of memory", NULL);
    for (uint32_t b = 0; b < batch; b++) {
        for (size_t i = 0; i < plen; i++)
            ids[b * plen + i] = (int32_t)((b * 7919u + i * 104729u + 3) % vocab);
        pr[b] = (rt_prompt){ids + b * plen, plen};
        res[b].ids = outs + (size_t)b * ndec;
    }
    rt_gen_params gp = {.max_new_tokens = ndec};
    mc_error e;
    rt_session_reset_stats(s);
    double c0 = cpu_now();
    if (rt_session_generate(s, pr, batch, &gp, res, &e))
        die("generate", &e);
    if (cpu_ms)
        *cpu_ms = (cpu_now() - c0) * 1e3 / ((double)batch * ndec);
    rt_session_stats st;
    rt_session_stats_get(s, &st);
    free(ids);
    free(outs);
    free(pr);
    free(res);
    return which ? st.decode_tokens / st.decode_seconds
                 : st.prefill_tokens / st.prefill_seconds;
}

/* GB/s read by `threads` threads (bench_bandwidth), on a pool of its
 * own, freed before it returns (its workers would spin beside the
 * session's). */
static double read_probe(int threads)
{
    kn_pool *pool = kn_pool_create(threads);
    if (!pool)
        die("thread pool", NULL);
    double bw = bench_bandwidth(pool, (size_t)512 << 20, 0);
    kn_pool_free(pool);
    return bw;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int threads = 2;
    uint32_t ntg = 32;
    int want_pp = 1, want_tg1 = 1, want_tg8 = 1, probe_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--ntg") && i + 1 < argc)
            ntg = (uint32_t)bench_arg_u64("--ntg", argv[++i], 1, 1u << 20);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *o = argv[++i];
            want_pp = !strcmp(o, "pp");
            want_tg1 = !strcmp(o, "tg1") || !strcmp(o, "tg");
            want_tg8 = !strcmp(o, "tg8") || !strcmp(o, "tg");
            probe_only = !strcmp(o, "probe");
        }
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_vs ARTIFACT [--threads N] [--ntg N] [--only pp|tg1|tg8|tg|probe]\n");
            return 2;
        }
    }
    if (!path || ntg == 0) {
        fprintf(stderr, "usage: bench_vs ARTIFACT [--threads N] [--ntg N] [--only pp|tg1|tg8|tg|probe]\n");
        return 2;
    }
    if (probe_only) { /* the read probe alone, the artifact not opened */
        printf("{\"read_gbs\": %.3f}\n", read_probe(threads));
        return 0;
    }
    mc_error e;
    rt_model *m = NULL;
    double load = 1e30;
    for (int r = 0; r < 3; r++) { /* best of 3: the first warms the cache */
        rt_model_free(m);
        double t0 = bench_now();
        if (rt_model_open_artifact(path, &m, &e))
            die("open artifact", &e);
        double dt = bench_now() - t0;
        load = dt < load ? dt : load;
    }
    kn_pool *pool = kn_pool_create(threads);
    if (!pool)
        die("thread pool", NULL);
    enum { NWAKE = 20000 };
    double t0 = bench_now();
    for (int i = 0; i < NWAKE; i++)
        kn_pool_run(pool, noop, NULL);
    double wake_us = (bench_now() - t0) / NWAKE * 1e6;
    kn_pool_free(pool);

    uint32_t vocab = m->cfg.vocab_size;
    rt_limits L1 = {.max_batch = 1, .max_seq = 512 + ntg, .prefill_chunk = 512,
                    .kv_type = KN_KV_F16, .threads = threads};
    rt_session *s;
    if (rt_session_create(m, &L1, NULL, &s, &e))
        die("session", &e);
    gen_rate(s, vocab, 1, 16, 2, 0, NULL); /* warm-up, as llama-bench does */
    double pp128 = !want_pp ? 0.0 : gen_rate(s, vocab, 1, 128, 1, 0, NULL);
    double pp512 = !want_pp ? 0.0 : gen_rate(s, vocab, 1, 512, 1, 0, NULL);
    double tg1_cpu = 0.0, tg8_cpu = 0.0;
    /* the probe right before batch-1 decode, the figure it bounds: this
     * host's read bandwidth moves between two phases within a minute,
     * so one taken before the prefills can miss the decode's */
    double bw = read_probe(threads);
    double tg1 = want_tg1 ? gen_rate(s, vocab, 1, 1, ntg, 1, &tg1_cpu) : 0.0;
    rt_session_free(s);
    double tg8 = 0.0;
    rt_limits L8 = {.max_batch = 8, .max_seq = 128 + ntg, .prefill_chunk = 512,
                    .kv_type = KN_KV_F16, .threads = threads};
    if (want_tg8) {
        if (rt_session_create(m, &L8, NULL, &s, &e))
            die("session", &e);
        /* the call's CPU time includes the prompts': subtract a call
         * that decodes one token only */
        double c1 = 0.0;
        gen_rate(s, vocab, 8, 128, 1, 1, &c1);
        tg8 = gen_rate(s, vocab, 8, 128, ntg, 1, &tg8_cpu);
        tg8_cpu = ntg > 1 ? (tg8_cpu * ntg - c1) / (ntg - 1) : tg8_cpu;
        rt_session_free(s);
    }
    printf("{\"load_s\": %.4f, \"pp128\": %.3f, \"pp512\": %.3f, \"tg1\": %.3f, "
           "\"tg8\": %.3f, \"tg1_cpu_ms\": %.3f, \"tg8_cpu_ms\": %.3f, \"read_gbs\": %.3f, \"wake_us\": %.3f, "
           "\"weight_bytes\": %llu}\n",
           load, pp128, pp512, tg1, tg8, tg1_cpu, tg8_cpu, bw, wake_us,
           (unsigned long long)m->weight_bytes);
    rt_model_free(m);
    return 0;
}

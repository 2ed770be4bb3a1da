/* bench_runtime.c - runtime throughput on a generated Llama of a realistic
 * shape (default: hidden 768, 12 layers, 12 heads, ffn 2048, vocab 32000,
 * untied: 134M parameters), in f32 and bf16.
 *
 * Reports prefill and decode tokens/s at batch 1 and batch 8, this
 * machine's memcpy bandwidth measured in the same run, and decode as a
 * fraction of the memory-bandwidth bound: a decode step must stream every
 * weight byte once (model.weight_bytes: all linears + lm_head), so steps/s
 * <= bandwidth / weight_bytes; batch 8 gets 8 tokens per step.
 *
 * The model is written to a temporary directory and deleted afterwards.
 * Usage: bench_runtime [--quick] [--threads N] [--json]
 *   --quick: a 4-layer model and shorter runs (smoke test). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "fmt_dtype.h"
#include "fmt_safetensors.h"
#include "rt_model.h"
#include "rt_session.h"

typedef struct shape {
    uint32_t hidden, layers, heads, ffn, vocab;
} shape;

static int gen_model(const char *dir, const shape *s, fmt_dtype dt)
{
    const bench_llama_config cfg = {
        .hidden = s->hidden, .ffn = s->ffn, .layers = s->layers,
        .heads = s->heads, .kv_heads = s->heads, .vocab = s->vocab,
        .max_pos = 2048, .tied = 0,
        .torch_dtype = dt == FMT_DT_BF16 ? "bfloat16" : "float32"};
    return bench_gen_llama(dir, &cfg, dt, 0x243F6A8885A308D3ull);
}

typedef struct result {
    double prefill_tok_s, decode_tok_s;
} result;

/* One generate call of `batch` prompts of `plen` tokens, `ndec` new
 * tokens each; rates from the session's prefill/decode split. */
static int run(const rt_model *m, int threads, uint32_t batch, size_t plen,
               uint32_t ndec, result *out)
{
    rt_limits L = {.max_batch = batch, .max_seq = plen + ndec,
                   .prefill_chunk = 256 > batch ? 256 : batch,
                   .kv_type = KN_KV_F32, .threads = threads};
    rt_session *s;
    mc_error e;
    char buf[1400];
    if (rt_session_create(m, &L, NULL, &s, &e)) {
        fprintf(stderr, "bench_runtime: %s\n",
                mc_error_format(&e, buf, sizeof buf));
        return -1;
    }
    int32_t *ids = malloc(batch * plen * sizeof *ids);
    int32_t *outs = malloc(batch * (size_t)ndec * sizeof *outs);
    rt_prompt *pr = calloc(batch, sizeof *pr);
    rt_gen_result *res = calloc(batch, sizeof *res);
    for (uint32_t b = 0; b < batch; b++) {
        for (size_t i = 0; i < plen; i++)
            ids[b * plen + i] = (int32_t)((b * 7919u + i * 104729u) %
                                          m->cfg.vocab_size);
        pr[b] = (rt_prompt){ids + b * plen, plen};
        res[b].ids = outs + (size_t)b * ndec;
    }
    rt_gen_params gp = {.max_new_tokens = ndec};
    int rc = rt_session_generate(s, pr, batch, &gp, res, &e) ? -1 : 0;
    rt_session_stats st;
    rt_session_stats_get(s, &st);
    out->prefill_tok_s = st.prefill_tokens / st.prefill_seconds;
    out->decode_tok_s = st.decode_tokens / st.decode_seconds;
    free(ids);
    free(outs);
    free(pr);
    free(res);
    rt_session_free(s);
    return rc;
}

int main(int argc, char **argv)
{
    int quick = 0, threads = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else {
            fprintf(stderr, "usage: bench_runtime [--quick] [--threads N] "
                            "[--json]\n");
            return 2;
        }
    }
    shape sh = {768, quick ? 4 : 12, 12, 2048, 32000};
    const size_t plen = quick ? 32 : 128;
    const uint32_t ndec = quick ? 8 : 24;
    kn_pool *pool = kn_pool_create(threads);
    threads = kn_pool_threads(pool);
    double copy_bw = bench_bandwidth(pool, (size_t)512 << 20, 1);
    double read_bw = bench_bandwidth(pool, (size_t)512 << 20, 0);
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/bench_runtime.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("bench_runtime: mkdtemp");
        return 1;
    }
    /* The load average says whether other work shared the machine (the
     * figures are only comparable on an idle one). */
    double load[1] = {-1.0};
    if (getloadavg(load, 1) < 1)
        load[0] = -1.0;
    if (!json)
        printf("bench_runtime: %d threads, memcpy %.2f GB/s, read %.2f GB/s "
               "(bytes moved once / s), load average %.2f\n", threads,
               copy_bw, read_bw, load[0]);
    else
        printf("{\"threads\": %d, \"copy_gb_s\": %.3f, \"read_gb_s\": %.3f, "
               "\"load_average\": %.2f, \"runs\": [", threads, copy_bw,
               read_bw, load[0]);
    const fmt_dtype dts[2] = {FMT_DT_F32, FMT_DT_BF16};
    int rc = 0;
    for (int d = 0; d < 2 && !rc; d++) {
        if (gen_model(dir, &sh, dts[d])) {
            fprintf(stderr, "bench_runtime: cannot write the model\n");
            rc = 1;
            break;
        }
        rt_model *m;
        mc_error e;
        if (rt_model_open_hf(dir, &m, &e)) {
            char buf[1400];
            fprintf(stderr, "bench_runtime: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
            rc = 1;
            break;
        }
        uint64_t params = rt_model_param_count(m);
        double wb = (double)m->weight_bytes;
        if (d > 0) {
            /* Measure again right before these runs (a shared machine's
             * bandwidth drifts); the bound uses the latest figure. */
            copy_bw = bench_bandwidth(pool, (size_t)512 << 20, 1);
            if (!json)
                printf("memcpy %.2f GB/s\n", copy_bw);
        }
        /* steps/s bound; batch b decodes b tokens per step */
        double bound = copy_bw * 1e9 / wb;
        const uint32_t batches[2] = {1, 8};
        for (int b = 0; b < 2 && !rc; b++) {
            result r;
            if (run(m, threads, batches[b], plen, ndec, &r)) {
                rc = 1;
                break;
            }
            double frac = r.decode_tok_s / batches[b] / bound;
            if (json)
                printf("%s{\"dtype\": \"%s\", \"copy_gb_s\": %.3f, "
                       "\"params\": %llu, "
                       "\"weight_bytes\": %.0f, \"batch\": %u, "
                       "\"prompt_tokens\": %zu, \"new_tokens\": %u, "
                       "\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, "
                       "\"decode_bound_tok_s\": %.2f, "
                       "\"decode_fraction_of_bound\": %.3f}",
                       d || b ? ", " : "", fmt_dtype_name(dts[d]), copy_bw,
                       (unsigned long long)params, wb, batches[b], plen, ndec,
                       r.prefill_tok_s, r.decode_tok_s, bound * batches[b],
                       frac);
            else
                printf("%-4s %4.0fM params, %6.1f MB weights/token | batch "
                       "%u: prefill %8.1f tok/s, decode %7.1f tok/s (bound "
                       "%7.1f tok/s at memcpy bw: %.0f%%)\n",
                       fmt_dtype_name(dts[d]), params / 1e6, wb / 1e6,
                       batches[b], r.prefill_tok_s, r.decode_tok_s,
                       bound * batches[b], 100.0 * frac);
            fflush(stdout);
        }
        rt_model_free(m);
    }
    kn_pool_free(pool);
    if (json)
        printf("]}\n");
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
    return rc;
}

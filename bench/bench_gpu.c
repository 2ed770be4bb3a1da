/* bench_gpu.c - the GPU session (runtime/rt_cuda.h) on a generated
 * Llama-shaped model of over 1B parameters (hidden 2048, 16 layers, 16
 * heads / 8 KV heads, ffn 8192, vocab 32000, untied: 1.14B), in f16 and
 * compiled to int8 and int4 (RTN, group 128) artifacts.
 *
 * Reports, in one table:
 *   - the device, its copy bandwidth (cudaMemcpy device to device, bytes
 *     read + written per second, measured in this run) and the measured
 *     reserve (context + cuBLAS handle);
 *   - per format and batch 1, 8, 32: decode tokens/s and its fraction of
 *     the bandwidth bound (a decode step streams every device weight byte
 *     at least once: steps/s <= bandwidth / weight bytes), prefill
 *     tokens/s (prompts of 256 tokens in chunks of 256 rows, cuBLAS);
 *   - device memory: the plan (weights + arena + cuBLAS workspace + gemm
 *     staging), what the one cudaMalloc took (cudaMemGetInfo before/after)
 *     and whether memory in use after 22 requests (varied batch, length,
 *     sampling) equals memory in use after load;
 *   - calibration seconds per layer: not measured (cmp_calib runs on the
 *     CPU; it has no device path).
 * Rows start with "| " so scripts/gpu-check can lift the table.
 *
 * Without a CUDA build or device: prints "no CUDA device: skipped", exit 0.
 * Usage: bench_gpu [--quick] [--keep DIR]
 *   --quick: 2 layers, vocab 4096 (smoke test, far below 1B). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "cmp_compile.h"
#include "cmp_plan.h"
#include "fmt_dtype.h"
#include "fmt_safetensors.h"
#include "rt_artifact.h"
#include "rt_cuda.h"
#include "rt_model.h"

#ifdef MC_HAVE_CUDA
#include <cuda_runtime_api.h>

typedef struct shape {
    uint32_t hidden, layers, heads, kv_heads, ffn, vocab;
} shape;

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint16_t g_table[65536]; /* random f16 values, |x| < 0.05 */

static uint64_t lcg(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return g_rng;
}

static void init_table(void)
{
    for (size_t i = 0; i < 65536; i++) {
        float u = (float)(lcg() >> 40) / 16777216.0f - 0.5f;
        g_table[i] = fmt_f32_to_f16(u * 0.1f);
    }
}

/* n f16 values: random from the table, or base + small noise (norms). */
static int write_tensor(fmt_st_writer *w, uint64_t n, int norm)
{
    enum { CH = 1 << 20 };
    static uint16_t buf[CH];
    mc_error e;
    for (uint64_t i = 0; i < n; i += CH) {
        size_t k = n - i < CH ? (size_t)(n - i) : CH;
        for (size_t j = 0; j < k; j++) {
            uint64_t r = lcg();
            buf[j] = norm ? fmt_f32_to_f16(1.0f + (float)((r >> 40) & 255) /
                                                      2560.0f)
                          : g_table[r >> 48];
        }
        if (fmt_st_writer_write(w, buf, k * 2, &e))
            return -1;
    }
    return 0;
}

static int gen_model(const char *dir, const shape *s)
{
    const bench_llama_config cfg = {
        .hidden = s->hidden, .ffn = s->ffn, .layers = s->layers,
        .heads = s->heads, .kv_heads = s->kv_heads, .vocab = s->vocab,
        .max_pos = 4096, .tied = 0, .torch_dtype = "float16"};
    fmt_st_writer *w = bench_start_llama(dir, &cfg);
    if (!w)
        return -1;
    mc_error e;
    const uint64_t H = s->hidden, F = s->ffn;
    const uint64_t KV = (uint64_t)s->kv_heads * (H / s->heads);
    size_t cap = 4 + 9 * (size_t)s->layers, n = 0;
    char (*names)[96] = calloc(cap, sizeof *names);
    uint64_t(*shp)[2] = calloc(cap, sizeof *shp);
    if (!names || !shp) {
        free(names);
        free(shp);
        fmt_st_writer_abort(w);
        return -1;
    }
    snprintf(names[n], 96, "model.embed_tokens.weight");
    shp[n][0] = s->vocab, shp[n][1] = H, n++;
    for (uint32_t l = 0; l < s->layers; l++) {
        const char *sub[] = {"self_attn.q_proj", "self_attn.k_proj",
                             "self_attn.v_proj", "self_attn.o_proj",
                             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        const uint64_t rows[] = {H, KV, KV, H, F, F, H};
        const uint64_t cols[] = {H, H, H, H, H, H, F};
        snprintf(names[n], 96, "model.layers.%u.input_layernorm.weight", l);
        shp[n][0] = H, shp[n][1] = 0, n++;
        snprintf(names[n], 96,
                 "model.layers.%u.post_attention_layernorm.weight", l);
        shp[n][0] = H, shp[n][1] = 0, n++;
        for (int k = 0; k < 7; k++) {
            snprintf(names[n], 96, "model.layers.%u.%s.weight", l, sub[k]);
            shp[n][0] = rows[k], shp[n][1] = cols[k], n++;
        }
    }
    snprintf(names[n], 96, "model.norm.weight");
    shp[n][0] = H, shp[n][1] = 0, n++;
    snprintf(names[n], 96, "lm_head.weight");
    shp[n][0] = s->vocab, shp[n][1] = H, n++;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = fmt_st_writer_add(w, names[i], FMT_DT_F16, shp[i][1] ? 2 : 1,
                               shp[i], &e) ? -1 : 0;
    if (!rc)
        rc = fmt_st_writer_begin_data(w, &e) ? -1 : 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = write_tensor(w, shp[i][0] * (shp[i][1] ? shp[i][1] : 1),
                          shp[i][1] == 0);
    free(names);
    free(shp);
    if (rc) {
        fmt_st_writer_abort(w);
        return -1;
    }
    return fmt_st_writer_finish(w, &e) ? -1 : 0;
}

#define PLEN 256
#define NDEC 64
#define GIB 1073741824.0

/* Device-to-device copy bandwidth: bytes read + written per second. */
static double copy_bandwidth(void)
{
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
        cudaFree(a);
        (void)cudaGetLastError();
        return 0.0;
    }
    cudaMemset(a, 1, n);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice); /* first touch */
    cudaDeviceSynchronize();
    const int reps = 20;
    double t0 = bench_now();
    for (int i = 0; i < reps; i++)
        cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double dt = bench_now() - t0;
    cudaFree(a);
    cudaFree(b);
    return cudaGetLastError() == cudaSuccess && dt > 0
               ? 2.0 * (double)n * reps / dt
               : 0.0;
}

static uint64_t used_now(void)
{
    uint64_t f = 0, t = 0;
    if (rt_cuda_mem_info(0, &f, &t, NULL))
        return 0;
    return t - f;
}

typedef struct run_result {
    double decode_tok_s, prefill_tok_s, frac;
    uint64_t plan_total, weights, arena, alloc_delta, used_load, used_after;
    int ok;
} run_result;

static int run_batch(const rt_model *m, uint32_t batch, double bw,
                     run_result *r)
{
    memset(r, 0, sizeof *r);
    rt_limits L = {.max_batch = batch, .max_seq = PLEN + NDEC,
                   .prefill_chunk = 256, .kv_type = KN_KV_F32,
                   .threads = 1};
    rt_session *s;
    mc_error e;
    char buf[1600];
    if (rt_cuda_session_create(m, &L, NULL, NULL, &s, &e)) {
        fprintf(stderr, "bench_gpu: %s\n", mc_error_format(&e, buf, sizeof buf));
        return -1;
    }
    const rt_cuda_plan *p = rt_cuda_session_plan(s);
    rt_cuda_mem mem;
    rt_cuda_session_memory(s, &mem);
    r->plan_total = p->total_bytes;
    r->weights = p->weights_bytes;
    r->arena = p->arena_bytes;
    r->alloc_delta = mem.alloc_delta_bytes;
    r->used_load = used_now();
    const uint32_t V = m->cfg.vocab_size;
    int32_t *ids = malloc(sizeof(int32_t) * PLEN * batch);
    int32_t *out = malloc(sizeof(int32_t) * NDEC * batch);
    rt_prompt *pr = calloc(batch, sizeof *pr);
    rt_gen_result *res = calloc(batch, sizeof *res);
    int rc = -1;
    if (!ids || !out || !pr || !res)
        goto done;
    for (uint32_t i = 0; i < batch; i++) {
        for (int t = 0; t < PLEN; t++)
            ids[i * PLEN + t] = (int32_t)((1 + 7919u * i + 104729u * t) % V);
        pr[i].ids = ids + (size_t)i * PLEN;
        pr[i].n = PLEN;
        res[i].ids = out + (size_t)i * NDEC;
    }
    rt_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new_tokens = 2; /* untimed first request */
    if (rt_session_generate(s, pr, batch, &gp, res, &e))
        goto fail;
    rt_session_reset_stats(s);
    gp.max_new_tokens = NDEC;
    if (rt_session_generate(s, pr, batch, &gp, res, &e))
        goto fail;
    rt_session_stats st;
    rt_session_stats_get(s, &st);
    r->decode_tok_s = st.decode_seconds > 0
                          ? (double)st.decode_tokens / st.decode_seconds
                          : 0;
    r->prefill_tok_s = st.prefill_seconds > 0
                           ? (double)st.prefill_tokens / st.prefill_seconds
                           : 0;
    /* each step streams the weights once: bound = bw / weights steps/s */
    double steps_s = r->decode_tok_s / batch;
    r->frac = bw > 0 ? steps_s * (double)p->weights_bytes / bw : 0;
    /* many more requests of varied batch, length and sampling: device
     * memory in use must not move */
    for (int k = 0; k < 20; k++) {
        size_t n = 1 + (size_t)(k * 5) % batch;
        for (size_t i = 0; i < n; i++)
            pr[i].n = 1 + (size_t)(k * 37 + i * 11) % PLEN;
        memset(&gp, 0, sizeof gp);
        gp.max_new_tokens = 4;
        gp.seed = (uint64_t)k;
        if (k % 2)
            gp.sampler.temperature = 0.8f;
        if (rt_session_generate(s, pr, n, &gp, res, &e))
            goto fail;
    }
    r->used_after = used_now();
    r->ok = 1;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_gpu: %s\n", mc_error_format(&e, buf, sizeof buf));
done:
    free(ids);
    free(out);
    free(pr);
    free(res);
    rt_session_free(s);
    return rc;
}

static int compile_quant(const char *model, const char *out,
                         const char *quant)
{
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    o.model = model;
    o.out = out;
    cmp_plan_request_default(&o.req);
    mc_error e;
    char buf[1600];
    if (cmp_wpolicy_parse(quant, 0, &o.req.policy, &e)) {
        fprintf(stderr, "bench_gpu: %s\n", mc_error_format(&e, buf, sizeof buf));
        return -1;
    }
    o.req.target_bytes = 200ull << 30;
    o.req.max_batch = 32;
    o.req.max_seq = PLEN + NDEC;
    o.req.prefill_chunk = 256;
    o.req.kv_type = KN_KV_F32;
    o.req.device = CMP_DEV_CUDA;
    if (cmp_compile(&o, NULL, &e)) {
        fprintf(stderr, "bench_gpu: compile %s: %s\n", quant,
                mc_error_format(&e, buf, sizeof buf));
        return -1;
    }
    return 0;
}

static int bench(int quick, const char *keep)
{
    char name[256];
    uint64_t total = 0;
    if (rt_cuda_device_info(0, name, sizeof name, &total, NULL))
        snprintf(name, sizeof name, "?");
    rt_cuda_reserve rv;
    mc_error e;
    if (rt_cuda_measure_reserve(0, &rv, &e))
        memset(&rv, 0, sizeof rv);
    double bw = copy_bandwidth();
    printf("| device | %s, %.1f GiB |\n", name, total / GIB);
    printf("| copy bandwidth (D2D, read+write) | %.0f GB/s |\n", bw / 1e9);
    printf("| reserve measured (context + cuBLAS handle) | %.0f MiB "
           "(context %.0f MiB, cuBLAS %.0f MiB); plan default %.0f MiB |\n",
           rv.reserve_bytes / 1048576.0, rv.context_bytes / 1048576.0,
           rv.cublas_bytes / 1048576.0,
           (CMP_CUDA_CONTEXT_BYTES + CMP_CUBLAS_WORKSPACE_BYTES) / 1048576.0);
    fflush(stdout);

    shape sh = {2048, 16, 16, 8, 8192, 32000};
    if (quick)
        sh = (shape){512, 2, 8, 4, 1024, 4096};
    char dir[512];
    if (keep) {
        snprintf(dir, sizeof dir, "%s", keep);
    } else {
        if (bench_mkdtemp(dir, sizeof dir, "gpu") != 0) {
            perror("bench_gpu: mkdtemp");
            return 1;
        }
    }
    char hf[600], a8[600], a4[600];
    snprintf(hf, sizeof hf, "%s/f16", dir);
    snprintf(a8, sizeof a8, "%s/int8.mca", dir);
    snprintf(a4, sizeof a4, "%s/int4.mca", dir);
    printf("| calibration s/layer | not measured: cmp_calib runs on the CPU "
           "(no device path) |\n");
    double t0 = bench_now();
    init_table();
    char cfgp[700];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", hf);
    if (access(cfgp, R_OK) != 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", hf);
        if (system(cmd) != 0 || gen_model(hf, &sh)) {
            fprintf(stderr, "bench_gpu: cannot write the model in %s\n", hf);
            return 1;
        }
    }
    printf("| model written (f16 safetensors) | %.1f s |\n", bench_now() - t0);

    const char *fmts[3] = {"f16", "int8", "int4"};
    const char *paths[3] = {hf, a8, a4};
    const uint32_t batches[3] = {1, 8, 32};
    int failures = 0;
    printf("| format | params | batch | decode tok/s | of BW bound | "
           "prefill tok/s | plan MiB | cudaMalloc MiB | used flat |\n");
    fflush(stdout);
    for (int f = 0; f < 3; f++) {
        if (f > 0 && access(paths[f], R_OK) != 0) {
            t0 = bench_now();
            if (compile_quant(hf, paths[f], fmts[f])) {
                printf("| compile %s | failed |\n", fmts[f]);
                failures++;
                continue;
            }
            printf("| compile %s (RTN, CPU) | %.1f s |\n", fmts[f],
                   bench_now() - t0);
            fflush(stdout);
        }
        rt_model *m = NULL;
        char buf[1600];
        mc_status st = f == 0 ? rt_model_open_hf(paths[f], &m, &e)
                              : rt_model_open_artifact_ex(paths[f],
                                                          RT_ART_NO_VERIFY,
                                                          &m, &e);
        if (st) {
            fprintf(stderr, "bench_gpu: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
            failures++;
            continue;
        }
        double params = (double)rt_model_param_count(m);
        for (int b = 0; b < 3; b++) {
            run_result r;
            if (run_batch(m, batches[b], bw, &r)) {
                printf("| %s | %.2fB | %u | failed | | | | | |\n", fmts[f],
                       params / 1e9, batches[b]);
                failures++;
                continue;
            }
            int flat = r.used_after == r.used_load;
            int match = r.alloc_delta >= r.plan_total &&
                        r.alloc_delta - r.plan_total <
                            2 * RT_CUDA_ALLOC_GRANULARITY;
            printf("| %s | %.2fB | %u | %.0f | %.1f%% | %.0f | %.1f | %.1f%s "
                   "| %s |\n",
                   fmts[f], params / 1e9, batches[b], r.decode_tok_s,
                   100.0 * r.frac, r.prefill_tok_s,
                   r.plan_total / 1048576.0, r.alloc_delta / 1048576.0,
                   match ? " (= plan)" : " (DIFFERS)",
                   flat ? "yes" : "NO");
            if (!flat || !match)
                failures++;
            fflush(stdout);
        }
        rt_model_free(m);
    }
    if (!keep) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_gpu: could not remove %s\n", dir);
    }
    return failures ? 1 : 0;
}

#endif /* MC_HAVE_CUDA */

int main(int argc, char **argv)
{
    int quick = 0;
    const char *keep = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--keep") && i + 1 < argc)
            keep = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gpu [--quick] [--keep DIR]\n");
            return 2;
        }
    }
    int n = 0;
    rt_cuda_device_count(&n);
    if (n == 0) {
        printf("no CUDA device: skipped\n");
        return 0;
    }
#ifdef MC_HAVE_CUDA
    return bench(quick, keep);
#else
    (void)quick;
    (void)keep;
    printf("no CUDA device: skipped\n");
    return 0;
#endif
}

/* test_cuda_runtime.c - the GPU session (runtime/rt_cuda.h).
 *
 * Everywhere: the device plan is weights + arena + cuBLAS workspace + gemm
 * staging, and a session without a device (or without a CUDA build) is
 * refused with a status, never an abort.  With a GPU (skipped, saying so,
 * otherwise): stories260k compiled to an f32 artifact reproduces the 256
 * reference greedy ids; fixture models (f32, f16, bf16, biases, sliding
 * window, Qwen2, dynamic/yarn/llama3 RoPE, int8 and int4 artifacts) give
 * the CPU session's logits within 1e-4 (matvec path) and 1e-2 (cuBLAS f16
 * path) normalized error; device memory in use is flat over 50 requests
 * and the one allocation is the plan within the driver's 2 MiB
 * granularity; requests over the plan are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_artifact.h"
#include "rt_cuda.h"
#include "rt_model.h"
#include "rt_session.h"
#include "stories_ref.h"
#include "testutil.h"

#define NREF 257
#define NLOG 64
#define VOCAB 512

/* ---- helpers -------------------------------------------------------------- */

static int have_device(void)
{
    int n = 0;
    assert_int_equal(rt_cuda_device_count(&n), MC_OK);
    return n > 0;
}

/* stories260k: $MC_SHARED_DIR/models/stories260k when set (the device
 * machine gets a copy of the tree only), else ../shared. */
static const char *stories_dir(void)
{
    static char buf[1024];
    const char *env = getenv("MC_SHARED_DIR");
    if (env && *env) {
        snprintf(buf, sizeof buf, "%s/models/stories260k", env);
        char *cfg = tu_fmt("%s/config.json", buf);
        int ok = tu_exists(cfg);
        free(cfg);
        if (ok)
            return buf;
    }
    return tu_stories_dir();
}

/* The generated fixture model NAME (a Hugging Face directory under
 * MC_FIXTURE_DIR), opened; fails the test if it does not open. */
static rt_model *open_fixture(const char *name)
{
    rt_model *m = NULL;
    mc_error e;
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    assert_int_equal(rt_model_open_hf(dir, &m, &e), MC_OK);
    free(dir);
    return m;
}

/* mcompile MODEL into dir/name with extra options; the artifact path. */
static char *compile_artifact(const char *model, const char *dir,
                              const char *name, const char *opts)
{
    char *out = tu_fmt("%s/%s", dir, name);
    char *cmd = tu_fmt("\"%s/mcompile\" \"%s\" -o \"%s\" -q %s", MC_BIN_DIR,
                       model, out, opts);
    char *errs = NULL;
    int rc = tu_run(cmd, NULL, &errs);
    if (rc != 0)
        fail_msg("%s: exit %d: %s", cmd, rc, errs ? errs : "");
    free(errs);
    free(cmd);
    return out;
}

static uint64_t used_now(void)
{
    uint64_t f = 0, t = 0;
    mc_error e;
    assert_int_equal(rt_cuda_mem_info(0, &f, &t, &e), MC_OK);
    return t - f;
}

static rt_session *gpu_session(const rt_model *m, const rt_limits *L,
                                    const rt_layout *layout, int gemm)
{
    rt_cuda_options o;
    rt_cuda_options_default(&o);
    o.prefill_gemm = gemm;
    rt_session *s = NULL;
    mc_error e;
    mc_status st = rt_cuda_session_create(m, L, layout, &o, &s, &e);
    if (st) {
        char buf[2048];
        fail_msg("rt_cuda_session_create: %s", mc_error_format(&e, buf, sizeof buf));
    }
    return s;
}

/* ---- every build ------------------------------------------------------------ */

static void test_cuda_plan_is_weights_arena_workspace_and_staging(void **state)
{
    (void)state;
    rt_model *m = open_fixture("llama");
    mc_error e;
    rt_limits L = {.max_batch = 4, .max_seq = 64, .prefill_chunk = 64,
                   .kv_type = KN_KV_F32, .threads = 1};
    rt_layout lay;
    assert_int_equal(rt_layout_build(&m->cfg, &L, &lay, &e), MC_OK);
    rt_cuda_plan p;
    assert_int_equal(rt_cuda_plan_for(m, &lay, NULL, &p, &e), MC_OK);
    /* matrices the device reads: layers + lm_head (the untied embedding
     * stays on the host), plus f32 norms */
    uint64_t want = 0;
    const fmt_model_config *c = &m->cfg;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const kn_block_weights *w = &m->layers[l].w;
        const kn_matrix *mats[7] = {&w->wq, &w->wk, &w->wv, &w->wo,
                                    &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++)
            want += kn_wformat_data_bytes(mats[i]->fmt, mats[i]->rows,
                                          mats[i]->cols);
        want += 2ull * c->hidden_size * 4;
    }
    want += (uint64_t)c->hidden_size * 4;
    want += kn_wformat_data_bytes(m->lm_head.fmt, m->lm_head.rows,
                                  m->lm_head.cols);
    assert_true(p.weights_bytes >= want);
    /* 256-byte alignment of at most 3 parts per tensor */
    assert_true(p.weights_bytes - want <= 256ull * 3 * (9 * c->num_layers + 2));
    assert_int_equal(p.arena_bytes, lay.arena_bytes);
    assert_int_equal(p.cublas_workspace_bytes, RT_CUDA_CUBLAS_WORKSPACE_BYTES);
    assert_true(p.gemm_staging_bytes > 0); /* chunk 64 >= 33: cuBLAS path */
    assert_int_equal(rt_cuda_staging_for(&m->cfg, &L, NULL),
                     p.gemm_staging_bytes); /* the planner's figure */
    assert_true(p.arena_off >= p.weights_bytes);
    assert_true(p.cublas_off >= p.arena_off + p.arena_bytes);
    assert_true(p.gemm_off >= p.cublas_off + p.cublas_workspace_bytes);
    assert_true(p.total_bytes >= p.gemm_off + p.gemm_staging_bytes);
    assert_true(p.total_bytes - (p.weights_bytes + p.arena_bytes +
                                 p.cublas_workspace_bytes +
                                 p.gemm_staging_bytes) < 4 * 256);
    /* matvec only: no staging */
    rt_cuda_options o;
    rt_cuda_options_default(&o);
    o.prefill_gemm = 0;
    rt_cuda_plan q;
    assert_int_equal(rt_cuda_plan_for(m, &lay, &o, &q, &e), MC_OK);
    assert_int_equal(q.gemm_staging_bytes, 0);
    assert_int_equal(q.weights_bytes, p.weights_bytes);
    rt_model_free(m);
}

static void test_cuda_session_without_device_is_refused_with_status(void **state)
{
    (void)state;
    if (have_device()) {
        printf("[  INFO    ] a CUDA device is present: the refusal path is "
               "not reachable here\n");
        return;
    }
    rt_model *m = open_fixture("llama");
    mc_error e;
    rt_limits L = {.max_batch = 1, .max_seq = 16, .prefill_chunk = 16,
                   .kv_type = KN_KV_F32, .threads = 1};
    rt_session *s = (rt_session *)1;
    assert_int_equal(rt_cuda_session_create(m, &L, NULL, NULL, &s, &e),
                     MC_ERR_UNSUPPORTED);
    assert_null(s);
    assert_true(strstr(e.message, "CUDA") != NULL);
    printf("refused: %s\n", e.message);
    rt_session_free(NULL);
    rt_model_free(m);
}

/* ---- with a GPU ------------------------------------------------------------- */

static void on_logits(void *ctx, size_t seq, size_t step, const float *lg,
                      uint32_t vocab)
{
    if (seq == 0 && vocab == VOCAB)
        tu_logit_capture_row(ctx, step, lg);
}

static void test_cuda_stories_artifact_reproduces_reference_greedy_ids(
    void **state)
{
    (void)state;
    TU_SKIP_IF(!have_device(), "no CUDA device");
    const char *sd = stories_dir();
    TU_SKIP_IF(!sd, "stories260k not found (set MC_SHARED_DIR)");
    int32_t ref[NREF];
    assert_int_equal(tu_stories_ref_ids(sd, ref, NREF), NREF);
    float *ref_lg = tu_stories_ref_logits(sd, (size_t)NLOG * VOCAB);
    assert_non_null(ref_lg);
    char *tmp = tu_mkdtemp("cuda-stories");
    char *art = compile_artifact(sd, tmp, "stories.mca",
                                 "--target 4GiB --quant f32 --kv f32 "
                                 "--max-batch 1 --max-seq 512 "
                                 "--prefill-chunk 16 --device cuda");
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_artifact(art, &m, &e), MC_OK);
    assert_true(m->has_plan);
    /* the artifact's own plan, matvec path (f32 exact) */
    rt_session *s = gpu_session(m, &m->plan.layout.limits, &m->plan.layout, 0);
    tu_logit_capture cap = {.rows = calloc(NLOG * VOCAB, sizeof(float)),
                            .max_rows = NLOG, .vocab = VOCAB};
    int32_t out[256];
    rt_gen_params gp = {.max_new_tokens = 256, .on_logits = on_logits,
                        .on_logits_ctx = &cap};
    rt_prompt pr = {.ids = ref, .n = 1};
    rt_gen_result res = {.ids = out};
    assert_int_equal(rt_session_generate(s, &pr, 1, &gp, &res, &e),
                     MC_OK);
    assert_int_equal(res.n, 256);
    int mism = 0;
    for (int i = 0; i < 256; i++)
        if (out[i] != ref[i + 1] && mism++ == 0)
            printf("first mismatch at %d: %d, reference %d\n", i, out[i],
                   ref[i + 1]);
    assert_int_equal(mism, 0);
    assert_int_equal(cap.got, NLOG);
    double ne = tu_norm_err(cap.rows, ref_lg, (size_t)NLOG * VOCAB), worst = 0;
    for (size_t i = 0; i < (size_t)NLOG * VOCAB; i++)
        if (fabs((double)cap.rows[i] - ref_lg[i]) > worst)
            worst = fabs((double)cap.rows[i] - ref_lg[i]);
    printf("stories260k on the GPU: 256/256 greedy ids; decode logits "
           "normalized error %.3g, max abs %.3g\n", ne, worst);
    assert_true(ne < 1e-4);
    /* greedy without on_logits: the device argmax path */
    rt_gen_params g2 = {.max_new_tokens = 256};
    assert_int_equal(rt_session_generate(s, &pr, 1, &g2, &res, &e),
                     MC_OK);
    assert_int_equal(res.n, 256);
    assert_memory_equal(out, ref + 1, 256 * sizeof(int32_t));
    rt_session_free(s);

    /* prefill of 64 rows through cuBLAS (f16 inputs) */
    rt_limits L = {.max_batch = 1, .max_seq = 512, .prefill_chunk = 64,
                   .kv_type = KN_KV_F32, .threads = 1};
    s = gpu_session(m, &L, NULL, 1);
    float *lg = calloc((size_t)NLOG * VOCAB, sizeof(float));
    rt_prompt p64 = {.ids = ref, .n = NLOG};
    float *outs[1] = {lg};
    assert_int_equal(rt_session_logits(s, &p64, 1, outs, &e), MC_OK);
    ne = tu_norm_err(lg, ref_lg, (size_t)NLOG * VOCAB);
    printf("stories260k prefill 64 rows via cuBLAS: normalized error %.3g\n",
           ne);
    assert_true(ne < 1e-2);
    rt_session_free(s);
    free(lg);
    free(cap.rows);
    free(ref_lg);
    rt_model_free(m);
    tu_rmtree(tmp);
    free(tmp);
    free(art);
}

/* GPU vs CPU logits of three prompts (lengths 5, 40, 64) batched. */
static void compare_model(const char *what, rt_model *m)
{
    rt_limits L = {.max_batch = 4, .max_seq = 64, .prefill_chunk = 64,
                   .kv_type = KN_KV_F32, .threads = 2};
    const uint32_t V = m->cfg.vocab_size;
    const size_t lens[3] = {5, 40, 64};
    int32_t ids[3][64];
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 64; t++)
            ids[i][t] = (int32_t)((7 + 31 * i + 13 * t + t * t) % V);
    rt_prompt pr[3];
    float *cpu[3], *gpu[3];
    for (int i = 0; i < 3; i++) {
        pr[i].ids = ids[i];
        pr[i].n = lens[i];
        cpu[i] = calloc(lens[i] * V, sizeof(float));
        gpu[i] = calloc(lens[i] * V, sizeof(float));
    }
    mc_error e;
    rt_session *cs;
    assert_int_equal(rt_session_create(m, &L, NULL, &cs, &e), MC_OK);
    assert_int_equal(rt_session_logits(cs, pr, 3, cpu, &e), MC_OK);
    rt_session_free(cs);
    for (int gemm = 0; gemm <= 1; gemm++) {
        rt_session *s = gpu_session(m, &L, NULL, gemm);
        assert_int_equal(rt_session_logits(s, pr, 3, gpu, &e), MC_OK);
        double worst = 0;
        for (int i = 0; i < 3; i++) {
            double ne = tu_norm_err(gpu[i], cpu[i], lens[i] * V);
            if (ne > worst)
                worst = ne;
        }
        printf("%-14s %-7s normalized error vs CPU %.3g\n", what,
               gemm ? "cuBLAS" : "matvec", worst);
        if (worst >= (gemm ? 1e-2 : 1e-4))
            fail_msg("%s (%s path): normalized error %.3g", what,
                     gemm ? "cuBLAS" : "matvec", worst);
        rt_session_free(s);
    }
    for (int i = 0; i < 3; i++) {
        free(cpu[i]);
        free(gpu[i]);
    }
}

static void test_cuda_fixture_logits_match_cpu_session(void **state)
{
    (void)state;
    TU_SKIP_IF(!have_device(), "no CUDA device");
    const char *names[] = {"llama", "llama-f16", "llama-bf16", "llama-bias",
                           "mistral", "qwen2", "llama-dynamic", "llama-yarn",
                           "llama3-rope", "llama-linear"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        rt_model *m = open_fixture(names[i]);
        compare_model(names[i], m);
        rt_model_free(m);
    }
    /* quantized artifacts: int8, int4 (group 32 and the ragged 128) and
     * int4-sym; qwen2 is tied: its int8 embedding is the output layer
     * (looked up on the host, multiplied on the device) */
    char *tmp = tu_mkdtemp("cuda-quant");
    const char *quants[] = {"--quant int8", "--quant int4 --group 32",
                            "--quant int4", "--quant int4-sym --group 32",
                            "--quant int8"};
    for (int q = 0; q < 5; q++) {
        char *src = tu_fmt("%s/%s", MC_FIXTURE_DIR, q < 4 ? "llama" : "qwen2");
        char *opts = tu_fmt("--target 1GiB %s --kv f32 --max-batch 4 "
                            "--max-seq 64 --prefill-chunk 64", quants[q]);
        char *name = tu_fmt("q%d.mca", q);
        char *art = compile_artifact(src, tmp, name, opts);
        rt_model *m = NULL;
        mc_error e;
        assert_int_equal(rt_model_open_artifact(art, &m, &e), MC_OK);
        assert_true(q < 4 || m->embed.fmt == KN_W_Q8);
        compare_model(q < 4 ? quants[q] + 8 : "qwen2 int8", m);
        rt_model_free(m);
        free(art);
        free(name);
        free(opts);
        free(src);
    }
    tu_rmtree(tmp);
    free(tmp);
}

static void test_cuda_memory_is_flat_and_equals_plan(void **state)
{
    (void)state;
    TU_SKIP_IF(!have_device(), "no CUDA device");
    rt_model *m = open_fixture("llama");
    mc_error e;
    rt_limits L = {.max_batch = 8, .max_seq = 128, .prefill_chunk = 64,
                   .kv_type = KN_KV_F32, .threads = 1};
    rt_session *s = gpu_session(m, &L, NULL, 1);
    const rt_cuda_plan *p = rt_cuda_session_plan(s);
    rt_cuda_mem mem;
    rt_cuda_session_memory(s, &mem);
    uint64_t after_load = used_now();
    printf("plan: weights %llu + arena %llu + cuBLAS %llu + staging %llu = "
           "%llu bytes; cudaMalloc grew used by %llu; load/warm-up growth "
           "%lld; used after load %llu (device %llu)\n",
           (unsigned long long)p->weights_bytes,
           (unsigned long long)p->arena_bytes,
           (unsigned long long)p->cublas_workspace_bytes,
           (unsigned long long)p->gemm_staging_bytes,
           (unsigned long long)p->total_bytes,
           (unsigned long long)mem.alloc_delta_bytes,
           (long long)mem.load_growth_bytes,
           (unsigned long long)after_load,
           (unsigned long long)mem.device_total_bytes);
    /* The allocation is the plan rounded up to the 2 MiB granularity (one
     * more granule allowed for the driver's page tables of the block). */
    assert_true(mem.alloc_delta_bytes >= p->total_bytes);
    assert_true(mem.alloc_delta_bytes - p->total_bytes <
                2 * RT_CUDA_ALLOC_GRANULARITY);
    assert_int_equal(after_load, mem.used_after_load_bytes);

    const uint32_t V = m->cfg.vocab_size;
    int32_t ids[8][100], out[8][20];
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < 100; t++)
            ids[i][t] = (int32_t)((3 + 17 * i + 11 * t) % V);
    float *lg[8];
    for (int i = 0; i < 8; i++)
        lg[i] = calloc(100 * (size_t)V, sizeof(float));
    for (int r = 0; r < 50; r++) {
        size_t n = 1 + (size_t)r % 8;
        rt_prompt pr[8];
        rt_gen_result res[8];
        for (size_t i = 0; i < n; i++) {
            pr[i].ids = ids[i];
            pr[i].n = 1 + (size_t)(r * 7 + i * 13) % 100;
            res[i].ids = out[i];
        }
        if (r % 5 == 3) {
            float *o[8];
            for (size_t i = 0; i < n; i++)
                o[i] = lg[i];
            assert_int_equal(rt_session_logits(s, pr, n, o, &e), MC_OK);
        } else if (r % 5 == 4) {
            rt_score_item it[8];
            float cl[8][8], ll[8][2];
            int32_t labels[2] = {1, 2};
            for (size_t i = 0; i < n; i++) {
                if (pr[i].n > 100 - 8)
                    pr[i].n = 100 - 8;
                it[i] = (rt_score_item){.prompt = pr[i], .cont = ids[i] + 90,
                                        .n_cont = 8,
                                        .cont_logprobs = cl[i],
                                        .label_logprobs = ll[i]};
            }
            assert_int_equal(rt_session_score(s, it, n, labels, 2,
                                                   RT_TRUNC_NONE, &e), MC_OK);
        } else {
            rt_gen_params gp = {.max_new_tokens = 20, .seed = (uint64_t)r,
                                .truncate = RT_TRUNC_LEFT};
            if (r % 2)
                gp.sampler = (rt_sampler){.temperature = 0.8f, .top_k = 40,
                                          .top_p = 0.9f};
            assert_int_equal(rt_session_generate(s, pr, n, &gp, res, &e),
                             MC_OK);
        }
    }
    uint64_t after = used_now();
    printf("used after 50 requests %llu (after load %llu)\n",
           (unsigned long long)after, (unsigned long long)after_load);
    assert_int_equal(after, after_load);
    for (int i = 0; i < 8; i++)
        free(lg[i]);
    rt_session_free(s);
    rt_model_free(m);
}

static void test_cuda_request_over_the_plan_is_refused(void **state)
{
    (void)state;
    TU_SKIP_IF(!have_device(), "no CUDA device");
    rt_model *m = open_fixture("llama");
    mc_error e;
    rt_limits L = {.max_batch = 2, .max_seq = 32, .prefill_chunk = 32,
                   .kv_type = KN_KV_F32, .threads = 1};
    rt_session *s = gpu_session(m, &L, NULL, 1);
    int32_t ids[40] = {0}, out[3][8];
    rt_prompt pr[3] = {{ids, 4}, {ids, 4}, {ids, 4}};
    rt_gen_result res[3] = {{.ids = out[0]}, {.ids = out[1]}, {.ids = out[2]}};
    rt_gen_params gp = {.max_new_tokens = 8};
    /* three sequences over max_batch 2 */
    assert_int_equal(rt_session_generate(s, pr, 3, &gp, res, &e),
                     MC_ERR_PLAN);
    printf("refused: %s\n", e.message);
    /* 30 prompt tokens + 8 new over max_seq 32 */
    pr[0].n = 30;
    assert_int_equal(rt_session_generate(s, pr, 1, &gp, res, &e),
                     MC_ERR_PLAN);
    printf("refused: %s\n", e.message);
    /* the session still serves requests inside the plan */
    pr[0].n = 4;
    assert_int_equal(rt_session_generate(s, pr, 2, &gp, res, &e), MC_OK);
    assert_int_equal(res[0].n, 8);
    /* an f16 KV cache is refused with a status, not run wrongly */
    rt_limits L16 = L;
    L16.kv_type = KN_KV_F16;
    rt_session *s16 = (rt_session *)1;
    assert_int_equal(rt_cuda_session_create(m, &L16, NULL, NULL, &s16, &e),
                     MC_ERR_UNSUPPORTED);
    assert_null(s16);
    rt_session_free(s);
    rt_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_plan_is_weights_arena_workspace_and_staging),
        cmocka_unit_test(test_cuda_session_without_device_is_refused_with_status),
        cmocka_unit_test(test_cuda_stories_artifact_reproduces_reference_greedy_ids),
        cmocka_unit_test(test_cuda_fixture_logits_match_cpu_session),
        cmocka_unit_test(test_cuda_memory_is_flat_and_equals_plan),
        cmocka_unit_test(test_cuda_request_over_the_plan_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* bench_merge.c - merge time, CPU time and peak memory on a generated
 * model of a real model's shape.
 *
 *   bench_merge [--shape tinyllama|mistral7b] [--layers N] [--rank R]
 *               [--dir DIR [--reuse]] [--keep]
 *
 * Writes a bf16 checkpoint of the shape (default TinyLlama-1.1B: hidden
 * 2048, FFN 5632, 22 layers, 32/4 heads, vocab 32000, 2.05 GiB; or
 * Mistral-7B: hidden 4096, FFN 14336, 32 layers, 32/8 heads, 13.5 GiB) in
 * shards of at most 2 GiB, with a config.json and adapter_config.json
 * complete enough for transformers and peft to load them (the PEFT
 * comparison, scripts/merge-vs-peft, merges the same files), and a rank-R
 * (default 16) float32 LoRA adapter on every linear layer (all-linear:
 * q/k/v/o/gate/up/down).  Then merges it in a child process through the
 * library and prints wall seconds, CPU seconds, MB/s (model bytes / wall
 * seconds) and the child's peak RSS (ru_maxrss) as a fraction of the
 * model.  Files go to a new directory under $TMPDIR (or /tmp), removed at
 * the end, or to DIR (kept; --reuse merges files already there). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cmp_merge.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_safetensors.h"

typedef struct shape {
    const char *name, *model_type, *arch;
    unsigned hidden, ffn, layers, heads, kv_heads, vocab;
} shape;

static const shape SHAPES[] = {
    {"tinyllama", "llama", "LlamaForCausalLM", 2048, 5632, 22, 32, 4, 32000},
    {"mistral7b", "mistral", "MistralForCausalLM", 4096, 14336, 32, 32, 8,
     32000},
};

#define SHARD_MAX (2ull << 30)
static uint64_t rng = 0x243F6A8885A308D3ull;

/* Pseudo-random values of scale std-ish, no libm. */
static float draw(float scale)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)(rng >> 40) / 16777216.0f - 0.5f) * 2.0f * scale;
}

typedef struct tdesc {
    char name[128];
    uint64_t rows, cols;
} tdesc;

static int write_st(const char *path, const tdesc *t, size_t n, fmt_dtype dt,
                    float scale)
{
    fmt_st_writer *w;
    mc_error e;
    if (fmt_st_writer_create(path, &w, &e))
        goto fail;
    for (size_t i = 0; i < n; i++) {
        uint64_t shape[2] = {t[i].rows, t[i].cols};
        if (fmt_st_writer_add(w, t[i].name, dt, t[i].cols ? 2 : 1, shape, &e))
            goto fail_w;
    }
    if (fmt_st_writer_begin_data(w, &e))
        goto fail_w;
    enum { CH = 1 << 20 };
    static float f[CH];
    static uint16_t h[CH * 2];
    for (size_t i = 0; i < n; i++) {
        uint64_t k = t[i].rows * (t[i].cols ? t[i].cols : 1);
        for (uint64_t j = 0; j < k; j += CH) {
            size_t c = k - j < CH ? (size_t)(k - j) : CH;
            /* norms (1-D) near 1, weights small, as in a trained model */
            for (size_t q = 0; q < c; q++)
                f[q] = t[i].cols ? draw(scale) : 1.0f + draw(0.05f);
            fmt_from_f32(dt, f, h, c);
            if (fmt_st_writer_write(w, h, c * fmt_dtype_size(dt), &e))
                goto fail_w;
        }
    }
    if (fmt_st_writer_finish(w, &e))
        goto fail;
    return 0;
fail_w:
    fmt_st_writer_abort(w);
fail:;
    char buf[1024];
    fprintf(stderr, "bench_merge: %s\n", mc_error_format(&e, buf, sizeof buf));
    return 1;
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return 1;
    fputs(text, f);
    return fclose(f) != 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Model tensors of shape sh (nl layers) into t, adapter tensors into a;
 * returns the counts. */
static void describe(const shape *sh, unsigned nl, unsigned rank, tdesc *t,
                     size_t *nt, tdesc *a, size_t *na)
{
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj",
                                      "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",
                                      "mlp.down_proj"};
    uint64_t H = sh->hidden, F = sh->ffn;
    uint64_t KV = H / sh->heads * sh->kv_heads;
    const uint64_t outs[7] = {H, KV, KV, H, F, F, H};
    const uint64_t ins[7] = {H, H, H, H, H, H, F};
    size_t n = 0, m = 0;
    snprintf(t[n].name, sizeof t[n].name, "model.embed_tokens.weight");
    t[n].rows = sh->vocab;
    t[n++].cols = H;
    for (unsigned l = 0; l < nl; l++) {
        snprintf(t[n].name, sizeof t[n].name,
                 "model.layers.%u.input_layernorm.weight", l);
        t[n].rows = H;
        t[n++].cols = 0;
        for (size_t k = 0; k < 7; k++) {
            snprintf(t[n].name, sizeof t[n].name, "model.layers.%u.%s.weight",
                     l, lin[k]);
            t[n].rows = outs[k];
            t[n++].cols = ins[k];
            snprintf(a[m].name, sizeof a[m].name,
                     "base_model.model.model.layers.%u.%s.lora_A.weight", l,
                     lin[k]);
            a[m].rows = rank;
            a[m++].cols = ins[k];
            snprintf(a[m].name, sizeof a[m].name,
                     "base_model.model.model.layers.%u.%s.lora_B.weight", l,
                     lin[k]);
            a[m].rows = outs[k];
            a[m++].cols = rank;
        }
        snprintf(t[n].name, sizeof t[n].name,
                 "model.layers.%u.post_attention_layernorm.weight", l);
        t[n].rows = H;
        t[n++].cols = 0;
    }
    snprintf(t[n].name, sizeof t[n].name, "model.norm.weight");
    t[n].rows = H;
    t[n++].cols = 0;
    snprintf(t[n].name, sizeof t[n].name, "lm_head.weight");
    t[n].rows = sh->vocab;
    t[n++].cols = H;
    *nt = n;
    *na = m;
}

/* Write the model (shards of at most SHARD_MAX), configs and adapter. */
static int generate(const shape *sh, unsigned nl, unsigned rank,
                    const char *base, const char *ad)
{
    tdesc *t = calloc(9 * (size_t)nl + 4, sizeof *t);
    tdesc *a = calloc(14 * (size_t)nl + 4, sizeof *a);
    size_t *shard = calloc(9 * (size_t)nl + 4, sizeof *shard);
    if (!t || !a || !shard)
        return 1;
    size_t n, na;
    describe(sh, nl, rank, t, &n, a, &na);
    size_t ns = 1;
    uint64_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = t[i].rows * (t[i].cols ? t[i].cols : 1) * 2;
        if (cur && cur + b > SHARD_MAX) {
            ns++;
            cur = 0;
        }
        cur += b;
        shard[i] = ns;
    }
    char cfg[2048], p[1200];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", "
             "\"hidden_size\": %u, \"intermediate_size\": %u, "
             "\"num_hidden_layers\": %u, \"num_attention_heads\": %u, "
             "\"num_key_value_heads\": %u, \"vocab_size\": %u, "
             "\"hidden_act\": \"silu\", \"max_position_embeddings\": 2048, "
             "\"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
             "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
             "\"bos_token_id\": 1, \"eos_token_id\": 2}\n",
             sh->arch, sh->model_type, sh->hidden, sh->ffn, nl, sh->heads,
             sh->kv_heads, sh->vocab);
    static char idx[1 << 20];
    size_t il = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, "
                                                  "\"weight_map\": {");
    for (size_t i = 0; i < n; i++)
        il += (size_t)snprintf(idx + il, sizeof idx - il,
                               "%s\"%s\": \"model-%05zu-of-%05zu.safetensors\"",
                               i ? ", " : "", t[i].name, shard[i], ns);
    snprintf(idx + il, sizeof idx - il, "}}\n");
    int rc = 0;
    snprintf(p, sizeof p, "%s/config.json", base);
    rc |= write_text(p, cfg);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", base);
    rc |= write_text(p, idx);
    for (size_t s = 1, i0 = 0; s <= ns && !rc; s++) {
        size_t i1 = i0;
        while (i1 < n && shard[i1] == s)
            i1++;
        snprintf(p, sizeof p, "%s/model-%05zu-of-%05zu.safetensors", base, s,
                 ns);
        rc |= write_st(p, t + i0, i1 - i0, FMT_DT_BF16, 0.02f);
        i0 = i1;
    }
    snprintf(p, sizeof p, "%s/adapter_config.json", ad);
    char acfg[1024];
    snprintf(acfg, sizeof acfg,
             "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", "
             "\"r\": %u, \"lora_alpha\": %u, \"lora_dropout\": 0.0, "
             "\"bias\": \"none\", \"fan_in_fan_out\": false, "
             "\"inference_mode\": true, \"base_model_name_or_path\": null, "
             "\"target_modules\": [\"q_proj\", \"k_proj\", \"v_proj\", "
             "\"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]}\n",
             rank, 2 * rank);
    rc |= write_text(p, acfg);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
    rc |= write_st(p, a, na, FMT_DT_F32, 0.05f);
    free(t);
    free(a);
    free(shard);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned layers = 0, rank = 16;
    int keep = 0, reuse = 0;
    const shape *sh = &SHAPES[0];
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
            layers = (unsigned)bench_arg_u64("--layers", argv[++i], 1, 1024);
        else if (strcmp(argv[i], "--rank") == 0 && i + 1 < argc)
            rank = (unsigned)bench_arg_u64("--rank", argv[++i], 1, 65536);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            sh = NULL;
            for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
                if (strcmp(v, SHAPES[k].name) == 0)
                    sh = &SHAPES[k];
            if (!sh) {
                fprintf(stderr, "bench_merge: unknown shape %s\n", v);
                return 2;
            }
        } else if (strcmp(argv[i], "--keep") == 0)
            keep = 1;
        else if (strcmp(argv[i], "--reuse") == 0)
            reuse = 1;
        else {
            fprintf(stderr, "usage: bench_merge [--shape tinyllama|mistral7b] "
                            "[--layers N] [--rank R] [--dir DIR [--reuse]] "
                            "[--keep]\n");
            return 2;
        }
    }
    if (!layers)
        layers = sh->layers;
    if (layers > 128 || rank < 1 || rank > 256)
        return 2;
    char root[512];
    if (dir) {
        snprintf(root, sizeof root, "%s", dir);
        mkdir(root, 0755);
        keep = 1;
    } else {
        if (bench_mkdtemp(root, sizeof root, "merge") != 0) {
            perror("mkdtemp");
            return 1;
        }
    }
    char base[600], ad[600], out[600];
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(ad, sizeof ad, "%s/adapter", root);
    snprintf(out, sizeof out, "%s/out", root);
    int rc = 0;
    char probe[700];
    snprintf(probe, sizeof probe, "%s/adapter_model.safetensors", ad);
    if (!(reuse && exists(probe))) {
        mkdir(base, 0755);
        mkdir(ad, 0755);
        fprintf(stderr, "bench_merge: generating %s x %u layers in %s ...\n",
                sh->name, layers, root);
        rc = generate(sh, layers, rank, base, ad);
    }
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0)
        rc = 1;
    uint64_t model_bytes = 0;
    fmt_model *m = NULL;
    mc_error e;
    if (!rc && fmt_model_open(base, &m, &e) == MC_OK)
        model_bytes = fmt_model_total_bytes(m);
    fmt_model_close(m);
    double t0 = now();
    pid_t pid = rc ? -1 : fork();
    if (pid == 0) {
        fmt_model *bm = NULL;
        cmp_merge *mg = NULL;
        cmp_adapter_spec s = {ad, 1.0};
        cmp_merge_report r;
        char buf[1024];
        if (fmt_model_open(base, &bm, &e) || cmp_merge_open(bm, &s, 1, &mg, &e) ||
            cmp_merge_write(mg, out, FMT_DT_INVALID, &r, &e)) {
            fprintf(stderr, "bench_merge: %s\n",
                    mc_error_format(&e, buf, sizeof buf));
            _exit(1);
        }
        fprintf(stderr, "bench_merge: %zu of %zu tensors touched, max |delta| "
                        "%.3g\n", r.tensors_touched, r.tensors,
                r.max_abs_delta);
        cmp_merge_close(mg);
        fmt_model_close(bm);
        _exit(0);
    }
    int status = 1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    double secs = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double peak = (double)ru.ru_maxrss * 1024.0;
    double usr = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec;
    double sys = (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        printf("merge: model %.3f GiB (bf16, %s shape, %u layers, rank %u "
               "all-linear)\n", (double)model_bytes / 1073741824.0, sh->name,
               layers, rank);
        printf("seconds      %.2f\n", secs);
        printf("cpu seconds  %.2f (user %.2f, system %.2f)\n", usr + sys, usr,
               sys);
        printf("MB/s         %.1f\n", (double)model_bytes / 1e6 / secs);
        printf("peak RSS     %.1f MiB = %.3f of the model size\n",
               peak / 1048576.0, peak / (double)model_bytes);
    } else {
        rc = 1;
    }
    if (!keep) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_merge: could not remove %s\n", root);
    } else {
        fprintf(stderr, "bench_merge: kept %s\n", root);
    }
    return rc ? 1 : 0;
}

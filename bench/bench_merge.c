/* bench_merge.c - merge throughput and memory on a generated model of at
 * least 1 GiB.
 *
 *   bench_merge [--layers N] [--rank R] [--keep]
 *
 * Writes, under $TMPDIR (or /tmp), a bf16 Llama-shaped checkpoint (hidden
 * 4096, FFN 8192, vocab 32000, N layers, default 3: about 1.2 GiB) in two
 * shards plus a rank-R LoRA adapter on q/v/gate/up/down of every layer,
 * then merges it in a child process through the library and prints wall
 * seconds, MB/s (model bytes / seconds) and the child's peak RSS
 * (getrusage ru_maxrss) as a fraction of the model size.  Everything is
 * removed at the end unless --keep. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmp_merge.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_safetensors.h"

#define HIDDEN 4096u
#define FFN 8192u
#define VOCAB 32000u

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
            for (size_t q = 0; q < c; q++)
                f[q] = draw(scale);
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

int main(int argc, char **argv)
{
    unsigned layers = 3, rank = 8;
    int keep = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
            layers = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--rank") == 0 && i + 1 < argc)
            rank = (unsigned)atoi(argv[++i]);
        else if (strcmp(argv[i], "--keep") == 0)
            keep = 1;
        else {
            fprintf(stderr, "usage: bench_merge [--layers N] [--rank R] "
                            "[--keep]\n");
            return 2;
        }
    }
    if (layers < 1 || layers > 64 || rank < 1 || rank > 256)
        return 2;
    const char *tmpenv = getenv("TMPDIR");
    char root[512];
    snprintf(root, sizeof root, "%s/mc-bench-merge-XXXXXX",
             tmpenv && *tmpenv ? tmpenv : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    char base[600], ad[600], out[600], p[700];
    snprintf(base, sizeof base, "%s/base", root);
    snprintf(ad, sizeof ad, "%s/adapter", root);
    snprintf(out, sizeof out, "%s/out", root);
    mkdir(base, 0755);
    mkdir(ad, 0755);
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.k_proj",
                                      "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",
                                      "mlp.down_proj"};
    tdesc *t = calloc(16 * layers + 4, sizeof *t);
    tdesc *a = calloc(16 * layers + 4, sizeof *a);
    size_t n = 0, na = 0;
    /* Shard 1: embeddings; shard 2: the layers, norm and lm_head. */
    snprintf(t[n].name, sizeof t[n].name, "model.embed_tokens.weight");
    t[n].rows = VOCAB;
    t[n++].cols = HIDDEN;
    size_t first2 = n;
    for (unsigned l = 0; l < layers; l++) {
        snprintf(t[n].name, sizeof t[n].name,
                 "model.layers.%u.input_layernorm.weight", l);
        t[n].rows = HIDDEN;
        t[n++].cols = 0;
        for (size_t k = 0; k < 7; k++) {
            uint64_t o = k >= 4 && k < 6 ? FFN : HIDDEN;
            uint64_t in = k == 6 ? FFN : HIDDEN;
            snprintf(t[n].name, sizeof t[n].name, "model.layers.%u.%s.weight",
                     l, lin[k]);
            t[n].rows = o;
            t[n++].cols = in;
            if (k == 1 || k == 3)
                continue; /* adapter on q, v, gate, up, down */
            snprintf(a[na].name, sizeof a[na].name,
                     "base_model.model.model.layers.%u.%s.lora_A.weight", l,
                     lin[k]);
            a[na].rows = rank;
            a[na++].cols = in;
            snprintf(a[na].name, sizeof a[na].name,
                     "base_model.model.model.layers.%u.%s.lora_B.weight", l,
                     lin[k]);
            a[na].rows = o;
            a[na++].cols = rank;
        }
    }
    snprintf(t[n].name, sizeof t[n].name, "model.norm.weight");
    t[n].rows = HIDDEN;
    t[n++].cols = 0;
    snprintf(t[n].name, sizeof t[n].name, "lm_head.weight");
    t[n].rows = VOCAB;
    t[n++].cols = HIDDEN;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"llama\", \"hidden_size\": %u, "
             "\"intermediate_size\": %u, \"num_hidden_layers\": %u, "
             "\"num_attention_heads\": 32, \"vocab_size\": %u, "
             "\"torch_dtype\": \"bfloat16\"}\n", HIDDEN, FFN, layers, VOCAB);
    char idx[1 << 16];
    size_t il = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, "
                                                  "\"weight_map\": {");
    for (size_t i = 0; i < n; i++)
        il += (size_t)snprintf(idx + il, sizeof idx - il, "%s\"%s\": "
                               "\"model-0000%d-of-00002.safetensors\"",
                               i ? ", " : "", t[i].name, i < first2 ? 1 : 2);
    snprintf(idx + il, sizeof idx - il, "}}\n");
    fprintf(stderr, "bench_merge: generating in %s ...\n", root);
    int rc = 0;
    snprintf(p, sizeof p, "%s/config.json", base);
    rc |= write_text(p, cfg);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", base);
    rc |= write_text(p, idx);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", base);
    rc |= write_st(p, t, first2, FMT_DT_BF16, 0.5f);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", base);
    rc |= write_st(p, t + first2, n - first2, FMT_DT_BF16, 0.05f);
    snprintf(p, sizeof p, "%s/adapter_config.json", ad);
    char acfg[256];
    snprintf(acfg, sizeof acfg, "{\"peft_type\": \"LORA\", \"r\": %u, "
                                "\"lora_alpha\": %u, \"target_modules\": "
                                "[\"q_proj\", \"v_proj\", \"gate_proj\", "
                                "\"up_proj\", \"down_proj\"]}\n", rank, 2 * rank);
    rc |= write_text(p, acfg);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", ad);
    rc |= write_st(p, a, na, FMT_DT_F32, 0.05f);
    free(t);
    free(a);
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
    if (pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        printf("merge: model %.3f GiB (bf16, %u layers, rank %u)\n",
               (double)model_bytes / 1073741824.0, layers, rank);
        printf("seconds      %.2f\n", secs);
        printf("MB/s         %.1f\n", (double)model_bytes / 1e6 / secs);
        printf("peak RSS     %.1f MiB = %.3f of the model size\n",
               peak / 1048576.0, peak / (double)model_bytes);
    } else {
        rc = 1;
    }
    if (!keep) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_merge: could not remove %s\n", root);
    } else {
        fprintf(stderr, "bench_merge: kept %s\n", root);
    }
    return rc ? 1 : 0;
}

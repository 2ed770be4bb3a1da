/*
 * bench_util.h - timing and memory-bandwidth helpers for the benchmark
 * programs (header-only: only benchmarks use them, the library never does).
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fmt_dtype.h"
#include "mc_parse.h"
#include "fmt_safetensors.h"
#include "kn_ops.h"

/* A benchmark's integer option, parsed as strictly as the two programs'
 * own (formats/mc_parse.h): a bad or out-of-range value is a usage error
 * (exit 2) instead of atoi's silent 0. */
static inline uint64_t bench_arg_u64(const char *flag, const char *s,
                                     uint64_t lo, uint64_t hi)
{
    uint64_t v = 0;
    char why[256];
    if (mc_parse_u64(flag, s, lo, hi, &v, why, sizeof why) != 0) {
        fprintf(stderr, "%s\n", why);
        exit(2);
    }
    return v;
}

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a loaded machine a
 * thread is descheduled for long stretches, and wall time says more about
 * the neighbours than about the code. */
static inline double bench_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_bw_ctx {
    const uint8_t *src;   /* [bytes] */
    uint8_t *dst;         /* [bytes] for copies; NULL for read-only */
    size_t bytes;
    uint64_t sink[64];    /* per-thread results, keeps reads alive */
} bench_bw_ctx;

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static inline uint64_t
bench_read_avx2(const uint8_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    uint64_t r = (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
    for (; i < n; i++)
        r += p[i];
    return r;
}
#endif

static inline uint64_t bench_read_scalar(const uint8_t *p, size_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0, w[4];
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        memcpy(w, p + i, 32);
        a ^= w[0], b ^= w[1], c ^= w[2], d ^= w[3];
    }
    for (; i < n; i++)
        a += p[i];
    return a ^ b ^ c ^ d;
}

static inline void bench_bw_task(void *v, int tid, int nth)
{
    bench_bw_ctx *c = (bench_bw_ctx *)v;
    size_t per = (c->bytes / (size_t)nth) & ~(size_t)4095;
    size_t off = per * (size_t)tid;
    size_t n = tid == nth - 1 ? c->bytes - off : per;
    if (c->dst) {
        memcpy(c->dst + off, c->src + off, n);
        return;
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        c->sink[tid & 63] ^= bench_read_avx2(c->src + off, n);
        return;
    }
#endif
    c->sink[tid & 63] ^= bench_read_scalar(c->src + off, n);
}

/* Best-of-5 bandwidth in GB/s (1e9 bytes/s) of reading (copy = 0) or
 * memcpy'ing (copy = 1; counts bytes copied, each read once and written
 * once) a buffer of `bytes` split over the pool's threads.  Use a buffer
 * well above the last-level cache.  Returns 0 if allocation fails. */
static inline double bench_bandwidth(kn_pool *p, size_t bytes, int copy)
{
    bench_bw_ctx c;
    memset(&c, 0, sizeof c);
    uint8_t *src = (uint8_t *)malloc(bytes);
    uint8_t *dst = copy ? (uint8_t *)malloc(bytes) : NULL;
    if (!src || (copy && !dst)) {
        free(src);
        free(dst);
        return 0.0;
    }
    memset(src, 1, bytes);
    if (dst)
        memset(dst, 0, bytes);
    c.src = src;
    c.dst = dst;
    c.bytes = bytes;
    double best = 1e30;
    for (int it = 0; it < 5; it++) {
        double t0 = bench_now();
        kn_pool_run(p, bench_bw_task, &c);
        double dt = bench_now() - t0;
        best = dt < best ? dt : best;
    }
    free(src);
    free(dst);
    return (double)bytes / best / 1e9;
}

/* The 1-minute load average (/proc/loadavg), -1 if unknown: printed next
 * to every timing, since figures taken on a busy machine are not
 * comparable. */
static inline double bench_loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* Multi-threaded read bandwidth (GB/s) of this machine. */
static inline double kn_measure_copy_bandwidth(kn_pool *p, size_t bytes)
{
    return bench_bandwidth(p, bytes, 0);
}

/* The config.json of a generated Llama-architecture checkpoint (the
 * benches write their models rather than ship them). */
typedef struct bench_llama_config {
    uint32_t hidden, ffn, layers, heads, kv_heads, vocab; /* the shape */
    uint32_t max_pos;         /* max_position_embeddings */
    int tied;                 /* tie_word_embeddings */
    const char *torch_dtype;  /* "float32", "float16" or "bfloat16" */
} bench_llama_config;

/* Writes dir/config.json for c (RMSNorm eps 1e-5, RoPE theta 10000, SiLU,
 * BOS 1, EOS 2).  Returns 0, or -1 with errno from fopen when the file
 * cannot be created. */
static inline int bench_write_llama_config(const char *dir,
                                           const bench_llama_config *c)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
            "\"llama\", \"hidden_size\": %u, \"intermediate_size\": %u, "
            "\"num_hidden_layers\": %u, \"num_attention_heads\": %u, "
            "\"num_key_value_heads\": %u, \"vocab_size\": %u, "
            "\"max_position_embeddings\": %u, \"rms_norm_eps\": 1e-5, "
            "\"rope_theta\": 10000.0, \"hidden_act\": \"silu\", "
            "\"tie_word_embeddings\": %s, \"torch_dtype\": \"%s\", "
            "\"bos_token_id\": 1, \"eos_token_id\": 2}\n",
            c->hidden, c->ffn, c->layers, c->heads, c->kv_heads, c->vocab,
            c->max_pos, c->tied ? "true" : "false", c->torch_dtype);
    fclose(f);
    return 0;
}

/* Writes dir/config.json for c and starts dir/model.safetensors.  Returns
 * the writer (the caller adds the tensors and finishes or aborts it), or
 * NULL when either file cannot be created. */
static inline fmt_st_writer *bench_start_llama(const char *dir,
                                               const bench_llama_config *c)
{
    if (bench_write_llama_config(dir, c))
        return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fmt_st_writer *w;
    mc_error e;
    return fmt_st_writer_create(path, &w, &e) ? NULL : w;
}

/* Values of generated tensors: a 64-bit LCG, uniform in base +- scale. */
static inline float bench_rnd(uint64_t *state, float base, float scale)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return base + ((float)(*state >> 40) / 16777216.0f - 0.5f) * 2.0f * scale;
}

/* Stream one tensor of n random elements (base +- scale) as dt (F32 or
 * BF16).  0, or -1 when the writer fails. */
static inline int bench_write_random(fmt_st_writer *w, fmt_dtype dt, uint64_t n,
                                     float base, float scale, uint64_t *state)
{
    enum { CH = 1 << 16 };
    static float buf[CH];
    static uint16_t half[CH];
    mc_error e;
    for (uint64_t i = 0; i < n; i += CH) {
        size_t k = n - i < CH ? (size_t)(n - i) : CH;
        for (size_t j = 0; j < k; j++)
            buf[j] = bench_rnd(state, base, scale);
        const void *p = buf;
        size_t nb = k * 4;
        if (dt == FMT_DT_BF16) {
            for (size_t j = 0; j < k; j++)
                half[j] = fmt_f32_to_bf16(buf[j]);
            p = half;
            nb = k * 2;
        }
        if (fmt_st_writer_write(w, p, nb, &e))
            return -1;
    }
    return 0;
}

/* A whole random Llama checkpoint of shape c in dir (config.json and
 * model.safetensors; dt F32 or BF16; head_dim hidden / heads; weights
 * +-0.05, norms 1 +- 0.1, embeddings +-0.5).  0, or -1. */
static inline int bench_gen_llama(const char *dir, const bench_llama_config *c,
                                  fmt_dtype dt, uint64_t seed)
{
    fmt_st_writer *w = bench_start_llama(dir, c);
    if (!w)
        return -1;
    mc_error e;
    typedef struct bench_t {
        char name[96];
        uint64_t r, c;
        float base, scale;
    } bench_t;
    size_t cap = 4 + 9 * (size_t)c->layers, n = 0;
    bench_t *ts = calloc(cap, sizeof *ts);
    if (!ts) {
        fmt_st_writer_abort(w);
        return -1;
    }
    const uint64_t H = c->hidden, F = c->ffn;
    const uint64_t KV = (uint64_t)c->kv_heads * (H / c->heads);
    snprintf(ts[n].name, 96, "model.embed_tokens.weight");
    ts[n].r = c->vocab, ts[n].c = H, ts[n].scale = 0.5f, n++;
    for (uint32_t l = 0; l < c->layers; l++) {
        static const char *const sub[] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
            "mlp.down_proj"};
        const uint64_t rows[] = {H, KV, KV, H, F, F, H};
        const uint64_t cols[] = {H, H, H, H, H, H, F};
        snprintf(ts[n].name, 96, "model.layers.%u.input_layernorm.weight", l);
        ts[n].r = H, ts[n].base = 1.0f, ts[n].scale = 0.1f, n++;
        snprintf(ts[n].name, 96, "model.layers.%u.post_attention_layernorm.weight", l);
        ts[n].r = H, ts[n].base = 1.0f, ts[n].scale = 0.1f, n++;
        for (int k = 0; k < 7; k++) {
            snprintf(ts[n].name, 96, "model.layers.%u.%s.weight", l, sub[k]);
            ts[n].r = rows[k], ts[n].c = cols[k], ts[n].scale = 0.05f, n++;
        }
    }
    snprintf(ts[n].name, 96, "model.norm.weight");
    ts[n].r = H, ts[n].base = 1.0f, ts[n].scale = 0.1f, n++;
    if (!c->tied) { /* a tied model's output layer is its embedding */
        snprintf(ts[n].name, 96, "lm_head.weight");
        ts[n].r = c->vocab, ts[n].c = H, ts[n].scale = 0.05f, n++;
    }
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t shp[2] = {ts[i].r, ts[i].c};
        rc = fmt_st_writer_add(w, ts[i].name, dt, ts[i].c ? 2 : 1, shp, &e) ? -1 : 0;
    }
    if (!rc)
        rc = fmt_st_writer_begin_data(w, &e) ? -1 : 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = bench_write_random(w, dt, ts[i].r * (ts[i].c ? ts[i].c : 1),
                                ts[i].base, ts[i].scale, &seed);
    free(ts);
    if (rc) {
        fmt_st_writer_abort(w);
        return -1;
    }
    return fmt_st_writer_finish(w, &e) ? -1 : 0;
}

/* ---- child processes and scratch folders -------------------------------- */

/* What bench_run_child measured of the child. */
typedef struct bench_child {
    double wall;   /* seconds from fork to reaping */
    double cpu;    /* the child's user + system seconds: a busy machine
                      disturbs it less than wall time */
    long rss_kib;  /* its peak RSS (ru_maxrss) */
} bench_child;

/* Run argv (argv[0] a path) with stdout to out_path and stderr to
 * err_path (each NULL: inherited).  Returns the exit code, or -1 when it
 * could not start or did not exit; *res (may be NULL) gets the figures. */
static inline int bench_run_child(char *const argv[], const char *out_path,
                                  const char *err_path, bench_child *res)
{
    fflush(NULL);
    double t0 = bench_now();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if ((out_path && !freopen(out_path, "w", stdout)) ||
            (err_path && !freopen(err_path, "w", stderr)))
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) < 0)
        return -1;
    if (res) {
        res->wall = bench_now() - t0;
        res->cpu = (double)ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec +
                   (double)ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec;
        res->rss_kib = ru.ru_maxrss;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A fresh folder $TMPDIR/mc-bench-TAG-XXXXXX (/tmp without TMPDIR) into
 * buf[n].  Returns 0, or -1 (errno set; buf unspecified). */
static inline int bench_mkdtemp(char *buf, size_t n, const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    int k = snprintf(buf, n, "%s/mc-bench-%s-XXXXXX",
                     tmp && *tmp ? tmp : "/tmp", tag);
    if (k < 0 || (size_t)k >= n)
        return -1;
    return mkdtemp(buf) ? 0 : -1;
}

/* The folder holding mcompile and mrun for a benchmark that runs them:
 * `bin` when given (--bin DIR), else the build tree the benchmark sits in
 * (build/bench/bench_x -> build), into buf[n].  Both programs must be
 * there and executable: a benchmark started from a tree where they were
 * not built says so and returns NULL, instead of failing every run
 * without a reason. */
static inline const char *bench_programs_dir(const char *name,
                                             const char *bin, char *buf,
                                             size_t n)
{
    if (!bin) {
        ssize_t k = readlink("/proc/self/exe", buf, n - 1);
        if (k <= 0) {
            fprintf(stderr, "%s: cannot read /proc/self/exe: %s\n", name,
                    strerror(errno));
            return NULL;
        }
        buf[k] = '\0';
        for (int up = 0; up < 2; up++) {
            char *s = strrchr(buf, '/');
            if (s)
                *s = '\0';
        }
        bin = buf;
    }
    static const char *const progs[] = {"mcompile", "mrun"};
    for (size_t i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", bin, progs[i]);
        if (access(path, X_OK) != 0) {
            fprintf(stderr, "%s: %s is not there or not executable (%s): "
                    "build the mcompile and mrun targets in that tree, or "
                    "give --bin DIR\n", name, path, strerror(errno));
            return NULL;
        }
    }
    return bin;
}

#endif /* BENCH_UTIL_H */

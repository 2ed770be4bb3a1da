/* bench_e2e.c - end-to-end figures of the compile -> artifact -> run path
 * that the kernel, merge and runtime benches do not give, on a generated
 * model with the shape of SmolLM-135M (Llama architecture: hidden 576,
 * 30 layers, 9 heads / 3 KV heads, FFN 1536, vocab 49152, tied
 * embeddings; 135M parameters, 540 MB in float32):
 *
 *   rtn      RTN quantization MB/s (float32 bytes in per second) of the
 *            library (cmp_quant_matrix) on a 4096 x 4096 matrix, int8/int4
 *   compile  `mcompile MODEL --quant Q` wall seconds and source MB/s for
 *            f32, f16, int8, int4 and f16 with --compress; the plan's total
 *   load     artifact open time (rt_model_open_artifact, checksums
 *            verified, warm page cache), compressed and not
 *   calib    GPTQ int4 calibration seconds per layer (cmp_calib_run)
 *   runtime  prefill and decode tokens/s at batch 1 and 8 for every
 *            artifact, and decode as a fraction of the bandwidth bound
 *            (read bandwidth measured in this run / weight bytes read per
 *            step), arena high water vs the arena
 *   peak     planned bytes (the compiler's plan total) vs the measured
 *            peak RSS of a process that fills the plan (batch = max_batch,
 *            context near max_seq): this program re-run with --peak, and
 *            mrun when it can run the artifact
 *
 * Each timed figure is the median of --runs runs (default 3).
 * usage: bench_e2e [--bin DIR] [--runs N] [--threads N] [--quick] [--json]
 *   --bin DIR   where mcompile and mrun are (default: this program's
 *               directory/..).  Output: one JSON object on stdout
 *               (progress on stderr); scripts/bench makes the table.
 *   --quick     a 4-layer model, shorter runs (smoke test)
 * The model and artifacts live in a temp dir, removed at the end. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "cmp_calib.h"
#include "cmp_quant.h"
#include "fmt_safetensors.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"

typedef struct shape {
    uint32_t hidden, layers, heads, kv_heads, ffn, vocab;
} shape;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static float rnd(float scale)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((float)(g_rng >> 40) / 16777216.0f - 0.5f) * 2.0f * scale;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die_err(const char *what, const mc_error *e)
{
    char buf[1600];
    fprintf(stderr, "bench_e2e: %s: %s\n", what,
            mc_error_format(e, buf, sizeof buf));
    exit(1);
}

/* ---- the model ---------------------------------------------------------- */

static void stream(fmt_st_writer *w, uint64_t n, float base, float scale);

static void gen_model(const char *dir, const shape *s)
{
    const bench_llama_config cfg = {
        .hidden = s->hidden, .ffn = s->ffn, .layers = s->layers,
        .heads = s->heads, .kv_heads = s->kv_heads, .vocab = s->vocab,
        .max_pos = 2048, .tied = 1, .torch_dtype = "float32"};
    if (bench_write_llama_config(dir, &cfg)) {
        /* what perror(dir/config.json) printed */
        fprintf(stderr, "%s/config.json: %s\n", dir, strerror(errno));
        exit(1);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fmt_st_writer *w;
    mc_error e;
    if (fmt_st_writer_create(path, &w, &e))
        die_err("create model", &e);
    const uint64_t H = s->hidden, F = s->ffn, kv = H / s->heads * s->kv_heads;
    const char *sub[] = {"self_attn.q_proj", "self_attn.k_proj",
                         "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const uint64_t rows[] = {H, kv, kv, H, F, F, H};
    const uint64_t cols[] = {H, H, H, H, H, H, F};
    /* two passes: declare every tensor, then stream the values */
    for (int pass = 0; pass < 2; pass++) {
        char nm[128];
#define T(r, c, base, sc)                                                      \
    do {                                                                       \
        uint64_t shp[2] = {r, c};                                              \
        if (pass == 0 &&                                                       \
            fmt_st_writer_add(w, nm, FMT_DT_F32, c ? 2 : 1, shp, &e))          \
            die_err("add tensor", &e);                                         \
        if (pass == 1)                                                         \
            stream(w, (r) * ((c) ? (c) : 1), base, sc);                        \
    } while (0)
        snprintf(nm, sizeof nm, "model.embed_tokens.weight");
        T(s->vocab, H, 0.0f, 0.5f);
        for (uint32_t l = 0; l < s->layers; l++) {
            snprintf(nm, sizeof nm, "model.layers.%u.input_layernorm.weight",
                     l);
            T(H, 0, 1.0f, 0.1f);
            snprintf(nm, sizeof nm,
                     "model.layers.%u.post_attention_layernorm.weight", l);
            T(H, 0, 1.0f, 0.1f);
            for (int k = 0; k < 7; k++) {
                snprintf(nm, sizeof nm, "model.layers.%u.%s.weight", l,
                         sub[k]);
                T(rows[k], cols[k], 0.0f, 0.05f);
            }
        }
        snprintf(nm, sizeof nm, "model.norm.weight");
        T(H, 0, 1.0f, 0.1f);
#undef T
        if (pass == 0 && fmt_st_writer_begin_data(w, &e))
            die_err("model header", &e);
    }
    if (fmt_st_writer_finish(w, &e))
        die_err("finish model", &e);
}

/* (used by gen_model's T) values base + noise, n of them, as f32 */
static void stream(fmt_st_writer *w, uint64_t n, float base, float scale)
{
    enum { CH = 1 << 16 };
    static float buf[CH];
    mc_error e;
    for (uint64_t i = 0; i < n; i += CH) {
        size_t k = n - i < CH ? (size_t)(n - i) : CH;
        for (size_t j = 0; j < k; j++)
            buf[j] = base + rnd(scale);
        if (fmt_st_writer_write(w, buf, k * 4, &e))
            die_err("write model", &e);
    }
}

/* 1-minute load average: figures taken on a busy machine say so. */
/* ---- child processes ---------------------------------------------------- */

/* Run argv (stdout captured into *out when out != NULL, malloc'ed), wait;
 * returns the exit status (-1 if it died) and the child's peak RSS. */
static int run_child(char *const argv[], char **out, uint64_t *peak_rss,
                     double *secs)
{
    int fd[2] = {-1, -1};
    if (out && pipe(fd) != 0)
        return -1;
    double t0 = bench_now();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (out) {
            dup2(fd[1], 1);
            close(fd[0]);
            close(fd[1]);
        }
        execv(argv[0], argv);
        fprintf(stderr, "bench_e2e: cannot run %s: %s\n", argv[0],
                strerror(errno));
        _exit(127);
    }
    size_t n = 0, cap = 0;
    char *b = NULL;
    if (out) {
        close(fd[1]);
        for (;;) {
            if (cap - n < 4096) {
                cap = cap ? 2 * cap : 65536;
                b = realloc(b, cap);
            }
            ssize_t r = read(fd[0], b + n, cap - n - 1);
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        close(fd[0]);
        b[n] = '\0';
        *out = b;
    }
    int st = 0;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid)
        return -1;
    if (secs)
        *secs = bench_now() - t0;
    if (peak_rss)
        *peak_rss = (uint64_t)ru.ru_maxrss * 1024u;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- measurements ------------------------------------------------------- */

static void bench_rtn(json_t *root, int runs, uint32_t dim)
{
    float *w = malloc((size_t)dim * dim * sizeof *w);
    for (size_t i = 0; i < (size_t)dim * dim; i++)
        w[i] = rnd(0.05f);
    const kn_wformat fmts[2] = {KN_W_Q8, KN_W_Q4};
    const char *names[2] = {"int8", "int4"};
    json_t *arr = json_array();
    for (int f = 0; f < 2; f++) {
        cmp_qbuf q = {fmts[f], dim, dim, f ? 128u : 0u, NULL, NULL, NULL};
        q.data = malloc(kn_wformat_data_bytes(q.fmt, dim, dim));
        q.scales = malloc(kn_wformat_scale_bytes(q.fmt, dim, dim, q.group));
        size_t zb = kn_wformat_zero_bytes(q.fmt, dim, dim, q.group);
        q.zeros = zb ? malloc(zb) : NULL;
        double t[16];
        mc_error e;
        for (int r = 0; r < runs; r++) {
            double t0 = bench_now();
            if (cmp_quant_matrix(w, NULL, &q, &e))
                die_err("quantize", &e);
            t[r] = bench_now() - t0;
        }
        double s = median(t, runs);
        json_t *o = json_pack("{s:s, s:i, s:f, s:f}", "quant", names[f],
                              "dim", (json_int_t)dim, "seconds", s, "mb_s",
                              (double)dim * dim * 4 / 1e6 / s);
        json_array_append_new(arr, o);
        free(q.data);
        free(q.scales);
        free(q.zeros);
    }
    free(w);
    json_object_set_new(root, "rtn", arr);
}

typedef struct art {
    const char *name;    /* f32, f16, int8, int4, f16+zstd */
    const char *quant;
    int compress;
    char path[4200];
    uint64_t planned;    /* plan total_bytes */
    uint64_t file_bytes;
} art;

static void bench_compile(json_t *root, const char *bin, const char *dir,
                          const char *model, art *a, int na, int threads,
                          double model_bytes)
{
    json_t *arr = json_array();
    char mc[4200], th[16];
    snprintf(mc, sizeof mc, "%s/mcompile", bin);
    snprintf(th, sizeof th, "%d", threads);
    for (int i = 0; i < na; i++) {
        snprintf(a[i].path, sizeof a[i].path, "%s/%s.mca", dir, a[i].name);
        char *argv[] = {mc, (char *)model, "--target", "4GiB", "--quant",
                        (char *)a[i].quant, "--max-batch", "8", "--max-seq",
                        "128", "--threads", th, "-o", a[i].path, "--json",
                        a[i].compress ? "--compress" : NULL, NULL};
        char *out = NULL;
        double secs = 0;
        int rc = run_child(argv, &out, NULL, &secs);
        json_error_t je;
        json_t *j = rc == 0 ? json_loads(out, 0, &je) : NULL;
        if (!j) {
            fprintf(stderr, "bench_e2e: %s --quant %s failed (exit %d):\n%s\n",
                    mc, a[i].quant, rc, out ? out : "");
            exit(1);
        }
        json_t *plan = json_object_get(j, "plan");
        a[i].planned = (uint64_t)json_integer_value(
            json_object_get(plan, "total_bytes"));
        a[i].file_bytes = (uint64_t)json_integer_value(
            json_object_get(j, "file_bytes"));
        json_array_append_new(
            arr, json_pack("{s:s, s:b, s:f, s:f, s:I, s:I}", "artifact",
                           a[i].name, "compressed", a[i].compress, "seconds",
                           secs, "src_mb_s", model_bytes / 1e6 / secs,
                           "file_bytes", (json_int_t)a[i].file_bytes,
                           "planned_bytes", (json_int_t)a[i].planned));
        json_decref(j);
        free(out);
    }
    json_object_set_new(root, "compile", arr);
}

static void bench_load(json_t *root, const art *a, int na, int runs)
{
    json_t *arr = json_array();
    for (int i = 0; i < na; i++) {
        double t[16];
        for (int r = 0; r < runs; r++) {
            rt_model *m;
            mc_error e;
            double t0 = bench_now();
            if (rt_model_open_artifact(a[i].path, &m, &e))
                die_err("open artifact", &e);
            t[r] = bench_now() - t0;
            rt_model_free(m);
        }
        double s = median(t, runs);
        json_array_append_new(
            arr, json_pack("{s:s, s:b, s:f, s:I}", "artifact", a[i].name,
                           "compressed", a[i].compress, "seconds", s,
                           "file_bytes", (json_int_t)a[i].file_bytes));
    }
    json_object_set_new(root, "load", arr);
}

static void bench_calib(json_t *root, const char *model_dir, int threads,
                        size_t nseq, size_t len)
{
    rt_model *m;
    mc_error e;
    if (rt_model_open_hf(model_dir, &m, &e))
        die_err("open model", &e);
    int32_t *tok = malloc(nseq * len * sizeof *tok);
    size_t *off = malloc((nseq + 1) * sizeof *off);
    for (size_t i = 0; i < nseq * len; i++)
        tok[i] = (int32_t)((i * 2654435761u) % m->cfg.vocab_size);
    for (size_t i = 0; i <= nseq; i++)
        off[i] = i * len;
    kn_pool *pool = kn_pool_create(threads);
    cmp_calib_opts o = {.fmt = KN_W_Q4, .group = 128, .method = CMP_QM_GPTQ,
                        .pool = pool};
    cmp_calib_result *r = NULL;
    double t0 = bench_now();
    if (cmp_calib_run(m, tok, off, nseq, &o, &r, &e))
        die_err("calibrate", &e);
    double total = bench_now() - t0;
    double *ls = malloc(r->layers * sizeof *ls);
    memcpy(ls, r->layer_seconds, r->layers * sizeof *ls);
    double med = median(ls, (int)r->layers);
    json_object_set_new(
        root, "calib",
        json_pack("{s:s, s:s, s:i, s:I, s:f, s:f}", "method", "gptq", "quant",
                  "int4", "layers", (json_int_t)r->layers, "tokens",
                  (json_int_t)(nseq * len), "seconds_per_layer", med,
                  "seconds_total", total));
    free(ls);
    cmp_calib_result_free(r);
    kn_pool_free(pool);
    free(tok);
    free(off);
    rt_model_free(m);
}

/* One generate of `batch` prompts of plen tokens + ndec new tokens. */
static void gen_once(rt_session *s, uint32_t vocab, uint32_t batch,
                     size_t plen, uint32_t ndec)
{
    int32_t *ids = malloc(batch * plen * sizeof *ids);
    int32_t *outs = malloc(batch * (size_t)(ndec ? ndec : 1) * sizeof *outs);
    rt_prompt *pr = calloc(batch, sizeof *pr);
    rt_gen_result *res = calloc(batch, sizeof *res);
    for (uint32_t b = 0; b < batch; b++) {
        for (size_t i = 0; i < plen; i++)
            ids[b * plen + i] = (int32_t)((b * 7919u + i * 104729u + 3) %
                                          vocab);
        pr[b] = (rt_prompt){ids + b * plen, plen};
        res[b].ids = outs + (size_t)b * ndec;
    }
    rt_gen_params gp = {.max_new_tokens = ndec};
    mc_error e;
    if (rt_session_generate(s, pr, batch, &gp, res, &e))
        die_err("generate", &e);
    free(ids);
    free(outs);
    free(pr);
    free(res);
}

static void bench_runtime(json_t *root, const art *a, int na, int runs,
                          int threads, double read_bw, size_t plen,
                          uint32_t ndec)
{
    json_t *arr = json_array();
    for (int i = 0; i < na; i++) {
        if (a[i].compress)
            continue; /* same weights as the uncompressed one once loaded */
        rt_model *m;
        mc_error e;
        if (rt_model_open_artifact(a[i].path, &m, &e))
            die_err("open artifact", &e);
        double wb = (double)m->weight_bytes;
        /* A decode step reads every weight byte once (and writes next to
         * nothing): steps/s <= read bandwidth / weight bytes. */
        double bound = read_bw * 1e9 / wb;
        const uint32_t batches[2] = {1, 8};
        for (int b = 0; b < 2; b++) {
            rt_limits L = {.max_batch = batches[b], .max_seq = plen + ndec,
                           .prefill_chunk = 256, .kv_type = KN_KV_F16,
                           .threads = threads};
            rt_session *s;
            if (rt_session_create(m, &L, NULL, &s, &e))
                die_err("session", &e);
            double pf[16], dc[16];
            for (int r = 0; r < runs; r++) {
                rt_session_reset_stats(s);
                gen_once(s, m->cfg.vocab_size, batches[b], plen, ndec);
                rt_session_stats st;
                rt_session_stats_get(s, &st);
                pf[r] = st.prefill_tokens / st.prefill_seconds;
                dc[r] = st.decode_tokens / st.decode_seconds;
            }
            double p = median(pf, runs), d = median(dc, runs);
            json_array_append_new(
                arr,
                json_pack("{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:I, s:I}",
                          "artifact", a[i].name, "batch", batches[b],
                          "prefill_tok_s", p, "decode_tok_s", d,
                          "decode_bound_tok_s", bound * batches[b],
                          "decode_fraction_of_bound",
                          d / batches[b] / bound, "weight_bytes", wb,
                          "arena_bytes",
                          (json_int_t)rt_session_layout(s)->arena_bytes,
                          "arena_high_water_bytes",
                          (json_int_t)rt_session_arena_high_water(s)));
            rt_session_free(s);
            fprintf(stderr, "bench_e2e: runtime %s batch %u: prefill %.1f "
                    "decode %.1f tok/s\n", a[i].name, batches[b], p, d);
        }
        rt_model_free(m);
    }
    json_object_set_new(root, "runtime", arr);
}

/* Peak RSS of this program image (VmHWM).  A child's getrusage
 * ru_maxrss is no good here: Linux keeps in it the peak of the image
 * before exec(), i.e. of this big parent that forked it. */
static uint64_t vm_hwm(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kib * 1024u;
}

/* --spawn CMD...: run CMD (stdout to /dev/null) from this small fresh
 * process and print "exit_status peak_rss_bytes": the child forked from
 * here inherits a small peak, so wait4's ru_maxrss is CMD's own. */
static int spawn_child(char **argv)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid)
        return 1;
    printf("%d %llu\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
           (unsigned long long)ru.ru_maxrss * 1024u);
    return 0;
}

/* --peak ART: fill the artifact's plan (max_batch sequences, context near
 * max_seq) in this process and exit; the parent reads our peak RSS. */
static int peak_child(const char *path, int threads)
{
    rt_model *m;
    mc_error e;
    if (rt_model_open_artifact(path, &m, &e))
        die_err("open artifact", &e);
    rt_limits L = m->plan.layout.limits;
    if (threads)
        L.threads = threads;
    rt_session *s;
    if (rt_session_create(m, &L, &m->plan.layout, &s, &e))
        die_err("session", &e);
    uint32_t ndec = 8;
    size_t plen = L.max_seq - ndec;
    gen_once(s, m->cfg.vocab_size, L.max_batch, plen, ndec);
    printf("%llu %llu %llu\n",
           (unsigned long long)rt_session_arena_high_water(s),
           (unsigned long long)rt_session_layout(s)->arena_bytes,
           (unsigned long long)vm_hwm());
    rt_session_free(s);
    rt_model_free(m);
    return 0;
}

static void bench_peak(json_t *root, const char *self, const char *bin,
                       const char *dir, const art *a, int na, int threads)
{
    json_t *arr = json_array();
    char th[16], mr[4200], ids[4200];
    snprintf(th, sizeof th, "%d", threads);
    snprintf(mr, sizeof mr, "%s/mrun", bin);
    /* 8 prompts of 120 ids for mrun: the plan's batch x (128 - 8) */
    snprintf(ids, sizeof ids, "%s/prompts.ids", dir);
    FILE *f = fopen(ids, "w");
    for (int b = 0; f && b < 8; b++)
        for (int i = 0; i < 120; i++)
            fprintf(f, "%d%c", (b * 7919 + i * 104729 + 3) % 1000,
                    i == 119 ? '\n' : ' ');
    if (f)
        fclose(f);
    for (int i = 0; i < na; i++) {
        if (a[i].compress)
            continue;
        char *argv[] = {(char *)self, "--peak", (char *)a[i].path,
                        "--threads", th, NULL};
        char *out = NULL;
        uint64_t rss = 0, rss_mrun = 0;
        if (run_child(argv, &out, &rss, NULL) != 0) {
            fprintf(stderr, "bench_e2e: --peak %s failed\n", a[i].name);
            exit(1);
        }
        unsigned long long hw = 0, arena = 0, hwm = 0;
        if (sscanf(out, "%llu %llu %llu", &hw, &arena, &hwm) != 3) {
            fprintf(stderr, "bench_e2e: --peak %s: bad output\n", a[i].name);
            exit(1);
        }
        rss = hwm;
        free(out);
        char *margv[] = {(char *)self, "--spawn", mr, (char *)a[i].path,
                         "--tokens-file", ids, "--max-new-tokens", "8",
                         "--threads", th, "-q", NULL};
        out = NULL;
        int mrc = -1;
        unsigned long long mrss = 0;
        if (run_child(margv, &out, NULL, NULL) != 0 ||
            sscanf(out, "%d %llu", &mrc, &mrss) != 2)
            mrc = -1;
        rss_mrun = mrss;
        free(out);
        json_t *o = json_pack(
            "{s:s, s:I, s:I, s:f, s:I, s:I}", "artifact", a[i].name,
            "planned_bytes", (json_int_t)a[i].planned, "peak_rss_bytes",
            (json_int_t)rss, "peak_over_planned",
            a[i].planned ? (double)rss / (double)a[i].planned : 0.0,
            "arena_bytes", (json_int_t)arena, "arena_high_water_bytes",
            (json_int_t)hw);
        if (mrc == 0)
            json_object_set_new(o, "mrun_peak_rss_bytes",
                                json_integer((json_int_t)rss_mrun));
        else
            json_object_set_new(o, "mrun_peak_rss_bytes", json_null());
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "peak", arr);
}

int main(int argc, char **argv)
{
    int runs = 3, threads = 0, quick = 0;
    const char *bin = NULL, *peak = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            quick = 1;
        else if (!strcmp(a, "--json"))
            ; /* the output is always JSON; accepted for symmetry */
        else if (!strcmp(a, "--runs") && v)
            runs = (int)bench_arg_u64("--runs", argv[++i], 1, 1000);
        else if (!strcmp(a, "--threads") && v)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(a, "--bin") && v)
            bin = argv[++i];
        else if (!strcmp(a, "--peak") && v)
            peak = argv[++i];
        else if (!strcmp(a, "--spawn") && v)
            return spawn_child(argv + i + 1);
        else {
            fprintf(stderr, "usage: bench_e2e [--bin DIR] [--runs N] "
                            "[--threads N] [--quick] [--json]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 15)
        runs = 3;
    if (peak)
        return peak_child(peak, threads);
    char self[4096], bindir[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        perror("bench_e2e: /proc/self/exe");
        return 1;
    }
    self[sl] = '\0';
    if (!(bin = bench_programs_dir("bench_e2e", bin, bindir, sizeof bindir)))
        return 1;
    kn_pool *pool = kn_pool_create(threads);
    threads = kn_pool_threads(pool);
    double copy_bw = bench_bandwidth(pool, (size_t)512 << 20, 1);
    double read_bw = bench_bandwidth(pool, (size_t)512 << 20, 0);
    kn_pool_free(pool);
    shape sh = {576, quick ? 4 : 30, 9, 3, 1536, 49152};
    const char *tmp = getenv("TMPDIR");
    char dir[1024], model[1100];
    snprintf(dir, sizeof dir, "%s/bench_e2e.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("bench_e2e: mkdtemp");
        return 1;
    }
    snprintf(model, sizeof model, "%s/model", dir);
    mkdir(model, 0755);
    json_t *root = json_object();
    json_object_set_new(
        root, "model",
        json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i}", "shape",
                  "SmolLM-135M (llama)", "hidden", sh.hidden, "layers",
                  sh.layers, "heads", sh.heads, "kv_heads", sh.kv_heads,
                  "ffn", sh.ffn, "vocab", sh.vocab));
    json_object_set_new(root, "threads", json_integer(threads));
    json_object_set_new(root, "loadavg_start", json_real(bench_loadavg()));
    json_object_set_new(root, "runs", json_integer(runs));
    json_object_set_new(root, "copy_gb_s", json_real(copy_bw));
    json_object_set_new(root, "read_gb_s", json_real(read_bw));
    fprintf(stderr, "bench_e2e: %d threads, memcpy %.2f GB/s, read %.2f "
            "GB/s; generating the model in %s\n", threads, copy_bw, read_bw,
            dir);
    gen_model(model, &sh);
    char st[4300];
    snprintf(st, sizeof st, "%s/model.safetensors", model);
    FILE *mf = fopen(st, "rb");
    fseek(mf, 0, SEEK_END);
    double model_bytes = (double)ftell(mf);
    fclose(mf);
    json_object_set_new(root, "model_bytes", json_real(model_bytes));

    json_t *secs = json_object();
    double t0 = bench_now();
#define SECTION(name, call)                                                    \
    do {                                                                       \
        fprintf(stderr, "bench_e2e: %s\n", name);                              \
        call;                                                                  \
        json_object_set_new(secs, name, json_real(bench_now() - t0));          \
        t0 = bench_now();                                                      \
    } while (0)
    art a[5] = {{"f32", "f32", 0, "", 0, 0}, {"f16", "f16", 0, "", 0, 0},
                {"int8", "int8", 0, "", 0, 0}, {"int4", "int4", 0, "", 0, 0},
                {"f16+zstd", "f16", 1, "", 0, 0}};
    SECTION("rtn", bench_rtn(root, runs, quick ? 1024 : 4096));
    SECTION("compile",
            bench_compile(root, bin, dir, model, a, 5, threads, model_bytes));
    SECTION("load", bench_load(root, a, 5, runs));
    /* Calibration time is per layer, and GPTQ on these widths takes
     * tens of seconds a layer: a 2-layer model of the same shape gives it. */
    char cmodel[1200];
    snprintf(cmodel, sizeof cmodel, "%s/calib-model", dir);
    mkdir(cmodel, 0755);
    shape csh = sh;
    csh.layers = 2;
    SECTION("calib", (gen_model(cmodel, &csh),
                      bench_calib(root, cmodel, threads, 4,
                                  quick ? 32 : 128)));
    const size_t plen = quick ? 32 : 64;
    const uint32_t ndec = quick ? 8 : 16;
    json_object_set_new(root, "prompt_tokens", json_integer((json_int_t)plen));
    json_object_set_new(root, "new_tokens", json_integer(ndec));
    json_object_set_new(root, "plan_batch", json_integer(8));
    json_object_set_new(root, "plan_seq", json_integer(128));
    SECTION("runtime", bench_runtime(root, a, 5, runs, threads, read_bw,
                                     plen, ndec));
    SECTION("peak", bench_peak(root, self, bin, dir, a, 5, threads));
#undef SECTION
    json_object_set_new(root, "section_seconds", secs);
    json_object_set_new(root, "loadavg_end", json_real(bench_loadavg()));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    printf("%s\n", text); /* scripts/bench makes the table of it */
    free(text);
    json_decref(root);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_e2e: could not remove %s\n", dir);
    return 0;
}

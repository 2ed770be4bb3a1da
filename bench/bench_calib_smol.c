/* bench_calib_smol.c - the calibrated compile of issue 17 end to end: a
 * generated model of the SmolLM2-135M shape (Llama: 30 layers, hidden 576,
 * FFN 1536, 9 / 3 heads, vocab 49152, tied, float32; random weights),
 * random calibration sequences, `mcompile MODEL --quant Q --calib FILE
 * [ARGS]` run as a child (wall seconds, CPU seconds, peak RSS), then
 * `mcompile eval` of the artifact on separate held-out sequences (KLD,
 * top-1).  Random weights and tokens: the KLD compares methods and
 * settings with each other, not with a trained model's.
 *
 * With --shape mistral7b the model is Mistral-7B's shape instead (hidden
 * 4096, FFN 14336, 32 / 8 heads, vocab 32000, untied, bfloat16 on disk):
 * issue 17's 7B-shape compile with K of its 32 layers.  The bench then
 * also prints the plan mcompile printed before it started (its --json
 * calibration.plan), the measured peak RSS against it, the time per
 * layer and the extrapolation to 32 layers, and skips the eval unless
 * --eval 1.
 *
 * usage: bench_calib_smol [--dir DIR] [--tokens N] [--seq L] [--layers K] [--tag NAME]
 *                         [--quant int8|int4] [--threads N]
 *                         [--shape smol|mistral7b] [--eval 0|1] [-- ARGS...]
 *   --dir DIR    where the model and token files live (kept between runs;
 *                default build/smol-bench relative to the current dir)
 *   --tokens N   calibration tokens (default 32768), in sequences of L
 *                (default 512); the eval set is 8 other sequences of L
 *   --layers K   layers of the generated model (default 30)
 *   --tag NAME   name the run's files NAME.mca, NAME.json, NAME-eval.json
 *                (default out.mca, out.json, eval.json: overwritten by
 *                the next run), so the runs of an A/B all stay
 *   ARGS         more mcompile options (--method, --group 128, -v ...)
 * Prints the figures of the run, the load average, the calibration's
 * phases in wall and CPU seconds (mcompile's calibration.phase_seconds and
 * phase_cpu_seconds), and the plan's estimate per phase against the CPU
 * seconds over the threads (the estimate is time on cores of its own). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "kn_cpus.h"

static int write_ids(const char *path, size_t nseq, size_t len, uint32_t vocab,
                     uint64_t seed)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (size_t s = 0; s < nseq; s++) {
        for (size_t t = 0; t < len; t++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            fprintf(f, "%s%u", t ? " " : "", (uint32_t)((seed >> 33) % vocab));
        }
        fputc('\n', f);
    }
    return fclose(f);
}

/* Run argv with stdout to out_path; wall, CPU (user + sys) and peak RSS. */
static int run(char **argv, const char *out_path, double *wall, double *cpu,
               long *rss_kib)
{
    bench_child c = {0, 0, 0};
    int rc = bench_run_child(argv, out_path, NULL, &c);
    *wall = c.wall;
    *cpu = c.cpu;
    *rss_kib = c.rss_kib;
    return rc;
}

/* The number after "key": in path, after "section": when section is not
 * NULL (the JSON is mcompile's, keys inside an object are unique). */
static double json_num_in(const char *path, const char *section,
                          const char *key)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[1 << 16];
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char pat[64];
    const char *from = buf;
    if (section) {
        snprintf(pat, sizeof pat, "\"%s\":", section);
        from = strstr(buf, pat);
        if (!from)
            return -1;
    }
    snprintf(pat, sizeof pat, "\"%s\":", key);
    s = strstr(from, pat);
    return s ? atof(s + strlen(pat)) : -1;
}

static double json_num(const char *path, const char *key)
{
    return json_num_in(path, NULL, key);
}

/* The plan mcompile printed before it started against what the run
 * measured, and the run extrapolated to Mistral-7B's 32 layers: time by
 * the per-layer calibration (forward, statistics, factorization and
 * search over K), memory by the per-layer parts of the plan (the source's
 * float16 block and its int4 spill grow with the layers; states,
 * statistics and work do not). */
static void print_plan_check(const char *out, uint32_t layers, double wall,
                             long rss_kib)
{
    double plan = json_num_in(out, "plan", "peak_rss_bytes");
    double src = json_num_in(out, "plan", "source_bytes");
    double spill = json_num_in(out, "plan", "spill_bytes");
    double est = json_num_in(out, "plan", "seconds");
    double lay = 0.0;
    static const char *const ph[4] = {"forward", "statistics", "factorization",
                                      "search"};
    for (int p = 0; p < 4; p++)
        lay += json_num_in(out, "phase_seconds", ph[p]);
    lay /= layers;
    /* a layer's bfloat16 linears: 4096 x (4096 + 2 x 1024 + 4096) + 3 x
     * 4096 x 14336 parameters */
    double per_src = 2.0 * (4096.0 * (4096 + 2048 + 4096) + 3.0 * 4096 * 14336);
    double embeds = src - layers * per_src; /* embed and lm_head */
    /* its int4 result in the spill file: half a byte a weight, a float16
     * scale and a byte zero per group of 128 (the rest of the spill, the
     * ends, does not grow) */
    double per_spill = per_src / 2.0 * (0.5 + 3.0 / 128.0);
    /* the plan is the larger of two phases (cmp_calib_plan.c).  The
     * layers' does not grow with depth: the source's pages leave with each
     * finished block, so it holds the embeddings and one block.  The
     * ends' grows by the spill mapping, a layer's int4 result a layer. */
    double program = json_num_in(out, "plan", "program_bytes");
    double layers_phase = json_num_in(out, "plan", "alloc_peak_bytes") +
                          json_num_in(out, "plan", "source_layers_bytes") + program;
    double ends32 = json_num_in(out, "plan", "alloc_ends_peak_bytes") +
                    json_num_in(out, "plan", "source_ends_bytes") + spill +
                    (32.0 - layers) * per_spill + program;
    double rss32 = layers_phase > ends32 ? layers_phase : ends32;
    printf("  plan before start: peak RSS %.1f MiB, time ~%.0f s | measured "
           "peak RSS %.1f MiB (%s the plan), wall %.1f s\n", plan / 1048576.0,
           est, rss_kib / 1024.0,
           rss_kib * 1024.0 <= plan ? "within" : "OVER", wall);
    printf("  per layer %.1f s; 32 layers: ~%.0f s (%.1f h), planned peak RSS "
           "~%.1f GiB (source %.1f GiB, %.1f GiB of it resident during the "
           "layers; spill %.1f GiB)\n", lay,
           wall + (32.0 - layers) * lay, (wall + (32.0 - layers) * lay) / 3600.0,
           rss32 / 1073741824.0, (embeds + 32.0 * per_src) / 1073741824.0,
           json_num_in(out, "plan", "source_layers_bytes") / 1073741824.0,
           (spill + (32.0 - layers) * per_spill) / 1073741824.0);
}

int main(int argc, char **argv)
{
    const char *dir = "build/smol-bench", *quant = "int8", *tag = NULL;
    size_t tokens = 32768, len = 512;
    uint32_t layers = 30;
    int threads = 0, extra = argc, m7 = 0, do_eval = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            extra = i + 1;
            break;
        }
        if (!v) {
            fprintf(stderr, "bench_calib_smol: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--dir")) dir = v;
        else if (!strcmp(a, "--tokens")) tokens = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--seq")) len = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--layers")) layers = (uint32_t)atoi(v);
        else if (!strcmp(a, "--quant")) quant = v;
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--shape")) m7 = !strcmp(v, "mistral7b");
        else if (!strcmp(a, "--eval")) do_eval = atoi(v);
        else if (!strcmp(a, "--tag")) {
            if (!*v || strchr(v, '/')) {
                fprintf(stderr, "bench_calib_smol: --tag needs a file name "
                                "without '/'\n");
                return 2;
            }
            tag = v;
        }
        else {
            fprintf(stderr, "bench_calib_smol: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (do_eval < 0)
        do_eval = !m7;
    uint32_t vocab = m7 ? 32000 : 49152;
    char model[2048], calib[4200], eval[4200], art[4200], out[4200], mc[4200];
    snprintf(model, sizeof model, "%.1900s/%smodel-%u", dir, m7 ? "m7-" : "",
             layers);
    snprintf(calib, sizeof calib, "%s/calib-%zu-%zu.ids", dir, tokens, len);
    snprintf(eval, sizeof eval, "%s/eval-%zu.ids", dir, len);
    snprintf(art, sizeof art, "%s/%.200s.mca", dir, tag ? tag : "out");
    snprintf(out, sizeof out, "%s/%.200s.json", dir, tag ? tag : "out");
    /* mcompile beside this program's directory (build/bench/..) */
    ssize_t k = readlink("/proc/self/exe", mc, sizeof mc - 32);
    if (k <= 0)
        return 1;
    mc[k] = 0;
    char *slash = strrchr(mc, '/');
    snprintf(slash, 32, "/../mcompile");
    mkdir(dir, 0755);
    char cfg[4300];
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    if (access(cfg, R_OK) != 0) {
        mkdir(model, 0755);
        bench_llama_config c = {.hidden = 576, .ffn = 1536, .layers = layers,
                                .heads = 9, .kv_heads = 3, .vocab = 49152,
                                .max_pos = 2048, .tied = 1,
                                .torch_dtype = "float32"};
        bench_llama_config c7 = {.hidden = 4096, .ffn = 14336, .layers = layers,
                                 .heads = 32, .kv_heads = 8, .vocab = 32000,
                                 .max_pos = 8192, .tied = 0,
                                 .torch_dtype = "bfloat16"};
        fprintf(stderr, "generating %s\n", model);
        if (bench_gen_llama(model, m7 ? &c7 : &c, m7 ? FMT_DT_BF16 : FMT_DT_F32,
                            17)) {
            fprintf(stderr, "bench_calib_smol: cannot write %s: %s\n", model,
                    strerror(errno));
            return 1;
        }
    }
    if (access(calib, R_OK) != 0 &&
        write_ids(calib, (tokens + len - 1) / len, len, vocab, 1))
        return 1;
    if (access(eval, R_OK) != 0 && write_ids(eval, 8, len, vocab, 99))
        return 1;
    char th[16];
    snprintf(th, sizeof th, "%d", threads);
    char *av[64];
    int n = 0;
    av[n++] = mc;
    av[n++] = model;
    av[n++] = "--target";
    av[n++] = m7 ? "64GiB" : "8GiB";
    av[n++] = "--quant";
    av[n++] = (char *)quant;
    av[n++] = "--calib";
    av[n++] = calib;
    av[n++] = "--heldout";
    av[n++] = "0";
    av[n++] = "--json";
    av[n++] = "-o";
    av[n++] = art;
    if (threads) {
        av[n++] = "--threads";
        av[n++] = th;
    }
    for (int i = extra; i < argc && n < 60; i++)
        av[n++] = argv[i];
    av[n] = NULL;
    double wall, cpu;
    long rss;
    unlink(art);
    int rc = run(av, out, &wall, &cpu, &rss);
    if (rc != 0) {
        fprintf(stderr, "bench_calib_smol: mcompile failed (%d), see %s\n", rc, out);
        return 1;
    }
    char ev[4200];
    snprintf(ev, sizeof ev, "%s/%.200s%s", dir, tag ? tag : "",
             tag ? "-eval.json" : "eval.json");
    char *ea[] = {mc, "eval", art, "--ref", model, "--tokens", eval, "--json", NULL};
    double ew, ec;
    long er;
    if (do_eval && run(ea, ev, &ew, &ec, &er) != 0) {
        fprintf(stderr, "bench_calib_smol: eval failed, see %s\n", ev);
        return 1;
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    if (!do_eval)
        unlink(ev); /* no stale figures */
    printf("%s %s layers %u tokens %zu:", m7 ? "mistral7b" : "smol", quant, layers, tokens);
    for (int i = extra; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n  compile wall %.1f s  cpu %.1f s  peak RSS %.1f MiB  artifact "
           "%.1f MB  | eval kld %.6g top1 %.4f  | load %.2f %.2f %.2f\n",
           wall, cpu, rss / 1024.0, json_num(out, "file_bytes") / 1e6,
           json_num(ev, "kld_mean"), json_num(ev, "top1"), load[0], load[1],
           load[2]);
    static const char *const ph[5] = {"forward", "statistics", "factorization",
                                      "search", "ends"};
    printf("  phases wall / CPU s:");
    for (int p = 0; p < 5; p++)
        printf(" %s %.1f / %.1f", ph[p], json_num_in(out, "phase_seconds", ph[p]),
               json_num_in(out, "phase_cpu_seconds", ph[p]));
    printf("\n");
    /* the plan's estimate (seconds on cores of its own) against each
     * phase's CPU seconds over the threads that ran it */
    double nth = threads > 0 ? threads : (double)kn_cpu_count();
    printf("  estimate / (CPU s / %.0f threads), rate %.1f G/s:", nth,
           json_num_in(out, "plan", "rate_madds_per_s") / 1e9);
    for (int p = 0; p < 4; p++) {
        double e = json_num_in(out, "plan", ph[p]);
        double m = json_num_in(out, "phase_cpu_seconds", ph[p]) / nth;
        printf(" %s %.2f / %.2f (%.2fx)", ph[p], e, m, m > 0.0 ? e / m : 0.0);
    }
    printf("\n");
    if (m7)
        print_plan_check(out, layers, wall, rss);
    return 0;
}

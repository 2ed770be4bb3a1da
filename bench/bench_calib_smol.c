/* bench_calib_smol.c - the calibrated compile of issue 17 end to end: a
 * generated model of the SmolLM2-135M shape (Llama: 30 layers, hidden 576,
 * FFN 1536, 9 / 3 heads, vocab 49152, tied, float32; random weights),
 * random calibration sequences, `mcompile MODEL --quant Q --calib FILE
 * [ARGS]` run as a child (wall seconds, CPU seconds, peak RSS), then
 * `mcompile eval` of the artifact on separate held-out sequences (KLD,
 * top-1).  Random weights and tokens: the KLD compares methods and
 * settings with each other, not with a trained model's.
 *
 * usage: bench_calib_smol [--dir DIR] [--tokens N] [--seq L] [--layers K]
 *                         [--quant int8|int4] [--threads N] [-- ARGS...]
 *   --dir DIR    where the model and token files live (kept between runs;
 *                default build/smol-bench relative to the current dir)
 *   --tokens N   calibration tokens (default 32768), in sequences of L
 *                (default 512); the eval set is 8 other sequences of L
 *   --layers K   layers of the generated model (default 30)
 *   ARGS         more mcompile options (--method, --group 128, -v ...)
 * Prints the figures of the run, the load average, and the calibration's
 * phases in wall and CPU seconds (mcompile's calibration.phase_seconds and
 * phase_cpu_seconds). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

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

int main(int argc, char **argv)
{
    const char *dir = "build/smol-bench", *quant = "int8";
    size_t tokens = 32768, len = 512;
    uint32_t layers = 30;
    int threads = 0, extra = argc;
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
        else {
            fprintf(stderr, "bench_calib_smol: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    char model[2048], calib[4200], eval[4200], art[4200], out[4200], mc[4200];
    snprintf(model, sizeof model, "%.1900s/model-%u", dir, layers);
    snprintf(calib, sizeof calib, "%s/calib-%zu-%zu.ids", dir, tokens, len);
    snprintf(eval, sizeof eval, "%s/eval-%zu.ids", dir, len);
    snprintf(art, sizeof art, "%s/out.mca", dir);
    snprintf(out, sizeof out, "%s/out.json", dir);
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
        fprintf(stderr, "generating %s\n", model);
        if (bench_gen_llama(model, &c, FMT_DT_F32, 17)) {
            fprintf(stderr, "bench_calib_smol: cannot write %s: %s\n", model,
                    strerror(errno));
            return 1;
        }
    }
    if (access(calib, R_OK) != 0 &&
        write_ids(calib, (tokens + len - 1) / len, len, 49152, 1))
        return 1;
    if (access(eval, R_OK) != 0 && write_ids(eval, 8, len, 49152, 99))
        return 1;
    char th[16];
    snprintf(th, sizeof th, "%d", threads);
    char *av[64];
    int n = 0;
    av[n++] = mc;
    av[n++] = model;
    av[n++] = "--target";
    av[n++] = "8GiB";
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
    snprintf(ev, sizeof ev, "%s/eval.json", dir);
    char *ea[] = {mc, "eval", art, "--ref", model, "--tokens", eval, "--json", NULL};
    double ew, ec;
    long er;
    if (run(ea, ev, &ew, &ec, &er) != 0) {
        fprintf(stderr, "bench_calib_smol: eval failed, see %s\n", ev);
        return 1;
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    printf("smol %s layers %u tokens %zu:", quant, layers, tokens);
    for (int i = extra; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n  compile wall %.1f s  cpu %.1f s  peak RSS %.1f MiB  artifact "
           "%.1f MB  | eval kld %.5f top1 %.4f  | load %.2f %.2f %.2f\n",
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
    return 0;
}

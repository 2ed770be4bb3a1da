/* bench_report.c - the table and the JSON of scripts/bench.
 *
 * usage: bench_report RAW_DIR OUT.json [DATE]
 *
 * Reads what scripts/bench collected in RAW_DIR:
 *   e2e.json        bench_e2e (rtn, compile, load, calib, runtime, peak)
 *   merge-*.txt     bench_merge runs (text; the median is taken)
 *   runtime.json    bench_runtime --json (Hugging Face directory, f32/bf16)
 *   kernels.txt     bench_kernels output (kept verbatim in the JSON)
 *   quant.txt       bench_quant output (printed and kept verbatim)
 *   arena.txt       bench_arena output (kept verbatim; scripts/bench
 *                   prints its table)
 *   batch.txt       bench_batch output (kept verbatim; scripts/bench
 *                   prints its table)
 * and prints one table on stdout and writes everything, with the medians,
 * the machine (CPU model, cores, memory) and the date, to OUT.json.
 * A missing input is reported in the table as "not run", not an error. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

static char *slurp(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *b = malloc(cap);
    while ((r = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2)
            b = realloc(b, cap *= 2);
    }
    fclose(f);
    b[n] = '\0';
    return b;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double med(double *v, int n)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The number after `key` on a line of text, or -1. */
static double after(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

/* bench_merge runs: median MB/s, seconds, peak RSS fraction. */
static json_t *merge_runs(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    double mbs[32], secs[32], frac[32], rss[32], gib = 0;
    int n = 0;
    struct dirent *e;
    json_t *raw = json_array();
    while ((e = readdir(d)) != NULL && n < 32) {
        if (strncmp(e->d_name, "merge-", 6) != 0)
            continue;
        char *t = slurp(dir, e->d_name);
        if (!t)
            continue;
        double m = after(t, "MB/s");
        const char *pr = strstr(t, "peak RSS");
        if (m > 0 && pr) {
            mbs[n] = m;
            secs[n] = after(t, "seconds");
            rss[n] = strtod(pr + 8, NULL);
            const char *eq = strchr(pr, '=');
            frac[n] = eq ? strtod(eq + 1, NULL) : -1;
            gib = after(t, "merge: model");
            n++;
        }
        json_array_append_new(raw, json_string(t));
        free(t);
    }
    closedir(d);
    if (n == 0) {
        json_decref(raw);
        return NULL;
    }
    return json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:o}", "runs", n,
                     "model_gib", gib, "mb_s", med(mbs, n), "seconds",
                     med(secs, n), "peak_rss_mib", med(rss, n),
                     "peak_rss_over_model", med(frac, n), "raw", raw);
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v ? json_number_value(v) : 0.0;
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "?";
}

/* One row of the RUN table: the weights' name, then batch, prefill and
 * decode tokens/s, the bandwidth bound and decode's fraction of it, from
 * a runtime result v. */
static void print_run_row(const char *weights, json_t *v)
{
    printf("  %-8s %5d %14.1f %13.1f %13.1f %8.0f%%\n", weights,
           (int)num(v, "batch"), num(v, "prefill_tok_s"),
           num(v, "decode_tok_s"), num(v, "decode_bound_tok_s"),
           100 * num(v, "decode_fraction_of_bound"));
}

static json_t *machine(void)
{
    char model[256] = "unknown";
    long cores = 0;
    double mem_gib = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = '\0';
        }
        if (!strncmp(line, "processor", 9))
            cores++;
    }
    if (f)
        fclose(f);
    f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "MemTotal:", 9))
            mem_gib = strtod(line + 9, NULL) / MIB;
    if (f)
        fclose(f);
    return json_pack("{s:s, s:i, s:f}", "cpu", model, "cpus", (int)cores,
                     "memory_gib", mem_gib);
}

static void table(json_t *all)
{
    const char *qt = json_string_value(json_object_get(all, "quant_text"));
    json_t *e2e = json_object_get(all, "e2e");
    json_t *mach = json_object_get(all, "machine");
    printf("mcompile benchmarks, %s\n", str(all, "date"));
    printf("machine: %s, %d CPUs, %.1f GiB", str(mach, "cpu"),
           (int)num(mach, "cpus"), num(mach, "memory_gib"));
    if (e2e)
        printf("; %d threads, memcpy %.2f GB/s, read %.2f GB/s (this run), "
               "load avg %.1f -> %.1f", (int)num(e2e, "threads"),
               num(e2e, "copy_gb_s"), num(e2e, "read_gb_s"),
               num(e2e, "loadavg_start"), num(e2e, "loadavg_end"));
    printf("\n\n");

    json_t *mg = json_object_get(all, "merge");
    printf("MERGE  bench_merge: bf16 TinyLlama-1.1B shape (hidden 2048, FFN "
           "5632, 22 layers), rank-16 all-linear LoRA\n");
    if (mg)
        printf("  %-40s %10.1f MB/s    (%.2f GiB in %.1f s; median of %d)\n"
               "  %-40s %10.3f         (%.0f MiB)\n", "merge throughput",
               num(mg, "mb_s"), num(mg, "model_gib"), num(mg, "seconds"),
               (int)num(mg, "runs"), "peak RSS / model size",
               num(mg, "peak_rss_over_model"), num(mg, "peak_rss_mib"));
    else
        printf("  not run\n");
    if (!e2e) {
        printf("\n(bench_e2e not run: no quantization, load, runtime or "
               "memory figures)\n");
        return;
    }
    json_t *mo = json_object_get(e2e, "model");
    int runs = (int)num(e2e, "runs");
    printf("\nQUANTIZE  model: %s shape, %d layers, hidden %d, heads %d/%d, "
           "FFN %d, vocab %d (%.0f MB f32)\n", str(mo, "shape"),
           (int)num(mo, "layers"), (int)num(mo, "hidden"),
           (int)num(mo, "heads"), (int)num(mo, "kv_heads"),
           (int)num(mo, "ffn"), (int)num(mo, "vocab"),
           num(e2e, "model_bytes") / 1e6);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(e2e, "rtn"), i, v)
    {
        char l[128];
        snprintf(l, sizeof l, "RTN %s (library, %dx%d f32)", str(v, "quant"),
                 (int)num(v, "dim"), (int)num(v, "dim"));
        printf("  %-40s %10.1f MB/s    (median of %d)\n", l, num(v, "mb_s"),
               runs);
    }
    json_array_foreach(json_object_get(e2e, "compile"), i, v)
    {
        char l[128];
        snprintf(l, sizeof l, "mcompile MODEL --quant %s%s",
                 json_is_true(json_object_get(v, "compressed")) ? "f16"
                                                               : str(v, "artifact"),
                 json_is_true(json_object_get(v, "compressed")) ? " --compress"
                                                               : "");
        printf("  %-40s %10.1f MB/s    (%.1f s, artifact %.0f MB)\n", l,
               num(v, "src_mb_s"), num(v, "seconds"),
               num(v, "file_bytes") / 1e6);
    }
    json_t *c = json_object_get(e2e, "calib");
    if (c)
    {
        char l[128];
        snprintf(l, sizeof l, "calibration %s %s, %d tokens",
                 str(c, "method"), str(c, "quant"), (int)num(c, "tokens"));
        printf("  %-40s %10.2f s/layer (median of %d layers; %.1f s in "
               "all)\n", l, num(c, "seconds_per_layer"),
               (int)num(c, "layers"), num(c, "seconds_total"));
    }

    printf("\nLOAD  artifact open, checksums verified, warm page cache "
           "(median of %d)\n", runs);
    json_array_foreach(json_object_get(e2e, "load"), i, v)
        printf("  %-10s %-6s %8.0f MB %23.3f s\n", str(v, "artifact"),
               json_is_true(json_object_get(v, "compressed")) ? "zstd"
                                                             : "raw",
               num(v, "file_bytes") / 1e6, num(v, "seconds"));

    printf("\nRUN  prompt %d, %d new tokens, KV f16; bound = read "
           "bandwidth / weight bytes per step (median of %d)\n",
           (int)num(e2e, "prompt_tokens"), (int)num(e2e, "new_tokens"), runs);
    printf("  %-8s %5s %14s %13s %13s %9s\n", "weights", "batch",
           "prefill tok/s", "decode tok/s", "bound tok/s", "of bound");
    json_array_foreach(json_object_get(e2e, "runtime"), i, v)
        print_run_row(str(v, "artifact"), v);
    json_t *hf = json_object_get(all, "runtime_hf");
    if (hf) {
        printf("  bench_runtime (Hugging Face dir, %.0fM params, prompt 128, "
               "24 new):\n", 0.0 + num(json_array_get(json_object_get(hf,
                                                                  "runs"),
                                                       0),
                                       "params") / 1e6);
        json_array_foreach(json_object_get(hf, "runs"), i, v)
            print_run_row(str(v, "dtype"), v);
    }

    printf("\nMEMORY  planned (compiler's plan total) vs measured peak RSS "
           "of a process filling the plan (batch %d x context %d)\n",
           (int)num(e2e, "plan_batch"), (int)num(e2e, "plan_seq"));
    printf("  %-8s %12s %13s %13s %17s %13s\n", "weights", "planned MiB",
           "peak RSS MiB", "peak/planned", "arena hw / arena", "mrun peak MiB");
    json_array_foreach(json_object_get(e2e, "peak"), i, v) {
        char mr[32] = "n/a";
        json_t *m = json_object_get(v, "mrun_peak_rss_bytes");
        if (json_is_integer(m))
            snprintf(mr, sizeof mr, "%.1f", json_number_value(m) / MIB);
        printf("  %-8s %12.1f %13.1f %13.3f %17.3f %13s\n",
               str(v, "artifact"), num(v, "planned_bytes") / MIB,
               num(v, "peak_rss_bytes") / MIB, num(v, "peak_over_planned"),
               num(v, "arena_bytes") > 0
                   ? num(v, "arena_high_water_bytes") / num(v, "arena_bytes")
                   : 0.0,
               mr);
    }
    if (qt)
        printf("\nbench_quant:\n%s", qt);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_report RAW_DIR OUT.json [DATE]\n");
        return 2;
    }
    const char *dir = argv[1];
    json_t *all = json_object();
    json_object_set_new(all, "date", json_string(argc > 3 ? argv[3] : ""));
    json_object_set_new(all, "machine", machine());
    json_t *m = merge_runs(dir);
    if (m)
        json_object_set_new(all, "merge", m);
    const char *js[][2] = {{"e2e.json", "e2e"}, {"runtime.json", "runtime_hf"}};
    for (int k = 0; k < 2; k++) {
        char *t = slurp(dir, js[k][0]);
        json_error_t je;
        json_t *j = t ? json_loads(t, 0, &je) : NULL;
        if (t && !j)
            fprintf(stderr, "bench_report: %s/%s: %s (line %d)\n", dir,
                    js[k][0], je.text, je.line);
        if (j)
            json_object_set_new(all, js[k][1], j);
        free(t);
    }
    const char *texts[][2] = {{"kernels.txt", "kernels_text"},
                              {"quant.txt", "quant_text"},
                              {"batch.txt", "batch_text"},
                              {"arena.txt", "arena_text"}};
    for (int k = 0; k < 4; k++) {
        char *t = slurp(dir, texts[k][0]);
        if (t)
            json_object_set_new(all, texts[k][1], json_string(t));
        free(t);
    }
    table(all);
    if (json_dump_file(all, argv[2], JSON_INDENT(2) | JSON_REAL_PRECISION(6))) {
        fprintf(stderr, "bench_report: cannot write %s\n", argv[2]);
        json_decref(all);
        return 1;
    }
    json_decref(all);
    return 0;
}

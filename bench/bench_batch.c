/* bench_batch.c - the dataset job (mrun --input/--output) scheduled with
 * continuous batching vs in waves (--schedule waves: a wave of max_batch
 * requests waits for its longest, as mrun ran prompt lists before), on a
 * generated model of the SmolLM-135M shape compiled to int8.
 *
 * Workload: N prompts (default 1000) of 16-512 tokens, lengths drawn from
 * a long-tailed distribution (log-normal, median 48, clipped), each with
 * 1-64 new tokens (uniform), EOS ignored so every run does the same work.
 * For max_batch 8 and 32 (artifact compiled with --max-batch B --max-seq
 * 576), each schedule is run as a separate mrun process; reported:
 * requests/s, tokens/s (prompt + generated tokens per wall second),
 * generated tokens/s, mrun's overhead per line (wall time outside the
 * model's steps and the 2-second syncs / lines), the seconds in those
 * syncs (output fdatasync + atomic --metrics rewrite), peak RSS vs the plan (from mrun --metrics), and
 * the speed-up continuous / waves (goal >= 1.5).  Both schedules must
 * write byte-identical outputs (checked).
 *
 * The plan column is the job's (mrun's planned bytes: the artifact's
 * total + the job's buffers, rt_plan.h rt_job_budget); "session MiB" is
 * the artifact's total alone.
 *
 * usage: bench_batch [--bin DIR] [--n N] [--threads N] [--quick]
 *                    [--batch B] [--pad BYTES]
 *   --bin DIR  where mcompile and mrun are (default: this program's
 *              directory/..); --quick: a 4-layer model and 120 prompts;
 *   --batch B  only max_batch B (default: 8 and 32);
 *   --pad BYTES  every line also carries a "pad" text of BYTES bytes
 *              (ignored by mrun): long lines for the job's budget.
 * Output: a table on stdout, then one JSON line ("bench_batch": {...}).
 * The model and artifacts live in a temp dir, removed at the end. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "kn_cpus.h"
#include "rt_plan.h"

/* Run argv with stderr to err_path (may be NULL); returns the exit code,
 * -1 if it did not exit.  *cpu (may be NULL): the child's user + system
 * seconds, a figure that a busy machine disturbs less than wall time. */
static int run(char *const argv[], const char *err_path, double *cpu)
{
    bench_child c;
    int rc = bench_run_child(argv, NULL, err_path, &c);
    if (cpu && rc != -1)
        *cpu = c.cpu;
    return rc;
}

/* A Prometheus sample of the metrics file (0 if absent). */
static double metric(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    char line[512];
    double v = 0;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ' ')
            v = strtod(line + n + 1, NULL);
    if (f)
        fclose(f);
    return v;
}

/* The job file: n lines; *tokens gets prompt + new tokens in all. */
static void write_job(const char *path, size_t n, uint32_t vocab,
                      size_t pad, uint64_t *prompt_tokens,
                      uint64_t *new_tokens)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    uint64_t s = 0x2545F4914F6CDD1Dull;
    *prompt_tokens = *new_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        /* log-normal: median 48, sigma 1 (Box-Muller from two uniforms) */
        double u1 = (bench_rnd(&s, 0.5f, 0.5f) + 1e-6) / (1 + 2e-6);
        double u2 = bench_rnd(&s, 0.5f, 0.5f);
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        long len = lround(48.0 * exp(z));
        len = len < 16 ? 16 : len > 512 ? 512 : len;
        int mx = 1 + (int)(bench_rnd(&s, 0.5f, 0.5f) * 64.0f);
        mx = mx > 64 ? 64 : mx;
        fprintf(f, "{\"id\": %zu, \"max_new_tokens\": %d, ", i, mx);
        if (pad) {
            fputs("\"pad\": \"", f);
            for (size_t k = 0; k < pad; k++)
                fputc('a' + (int)(k % 26), f);
            fputs("\", ", f);
        }
        fputs("\"ids\": [1", f);
        for (long k = 1; k < len; k++)
            fprintf(f, ",%u",
                    3 + (unsigned)(bench_rnd(&s, 0.5f, 0.5f) * (vocab - 4)));
        fputs("]}\n", f);
        *prompt_tokens += (uint64_t)len;
        *new_tokens += (uint64_t)mx;
    }
    fclose(f);
}

typedef struct result {
    double secs, cpu, overhead_ms, sync_s, peak_rss, planned;
} result;

static result run_job(const char *bin, const char *art, const char *dir,
                      const char *sched, const char *job, const char *th,
                      const char *out)
{
    char mr[4200], met[4200], err[4200];
    snprintf(mr, sizeof mr, "%s/mrun", bin);
    snprintf(met, sizeof met, "%s/m.prom", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    unlink(out);
    char *argv[] = {mr,         (char *)art, "--input", (char *)job,
                    "--output", (char *)out, "--metrics", met,
                    "--schedule", (char *)sched, "--threads", (char *)th,
                    "--ignore-eos", NULL};
    double t0 = bench_now();
    double cpu = 0;
    int rc = run(argv, err, &cpu);
    result r = {.secs = bench_now() - t0, .cpu = cpu};
    if (rc != 0) {
        fprintf(stderr, "bench_batch: mrun --schedule %s failed (exit %d), "
                "see %s\n", sched, rc, err);
        exit(1);
    }
    FILE *f = fopen(err, "r");
    char line[2048];
    while (f && fgets(line, sizeof line, f)) {
        char *p = strstr(line, "overhead ");
        if (p)
            r.overhead_ms = strtod(p + 9, NULL);
        if ((p = strstr(line, "(+ ")))
            r.sync_s = strtod(p + 3, NULL);
    }
    if (f)
        fclose(f);
    r.peak_rss = metric(met, "mcompile_peak_rss_bytes");
    r.planned = metric(met, "mcompile_planned_bytes");
    return r;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    char x[65536], y[65536];
    while (same) {
        na = fread(x, 1, sizeof x, fa);
        nb = fread(y, 1, sizeof y, fb);
        same = na == nb && !memcmp(x, y, na);
        if (na == 0)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

int main(int argc, char **argv)
{
    const char *bin = NULL;
    size_t n = 1000;
    int quick = 0, threads = 0;
    uint32_t only = 0;
    size_t pad = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--bin") && i + 1 < argc)
            bin = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            only = (uint32_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--pad") && i + 1 < argc)
            pad = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_batch [--bin DIR] [--n N] "
                    "[--threads N] [--quick] [--batch B] [--pad BYTES]\n");
            return 2;
        }
    }
    if (quick && n == 1000)
        n = 120;
    char bindir[4096];
    if (!(bin = bench_programs_dir("bench_batch", bin, bindir, sizeof bindir)))
        return 1;
    char th[16];
    snprintf(th, sizeof th, "%d",
             threads > 0 ? threads : kn_cpu_count());
    char dir[1024], model[1100], job[1100], out_c[1100], out_w[1100];
    if (bench_mkdtemp(dir, sizeof dir, "batch") != 0) {
        perror("bench_batch: a scratch folder under $TMPDIR or /tmp");
        return 1;
    }
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(job, sizeof job, "%s/job.jsonl", dir);
    snprintf(out_c, sizeof out_c, "%s/continuous.jsonl", dir);
    snprintf(out_w, sizeof out_w, "%s/waves.jsonl", dir);
    mkdir(model, 0755);
    const bench_llama_config cfg = {
        .hidden = 576, .ffn = 1536, .layers = quick ? 4 : 30, .heads = 9,
        .kv_heads = 3, .vocab = 49152, .max_pos = 2048, .tied = 1,
        .torch_dtype = "float32"};
    fprintf(stderr, "bench_batch: generating the model in %s\n", dir);
    if (bench_gen_llama(model, &cfg, FMT_DT_F32, 0x9E3779B97F4A7C15ull)) {
        fprintf(stderr, "bench_batch: cannot write the model\n");
        return 1;
    }
    uint64_t ptok, ntok;
    write_job(job, n, cfg.vocab, pad, &ptok, &ntok);
    rt_job_budget jb; /* mrun's defaults at the artifacts' max_seq */
    if (rt_plan_job_budget(RT_JOB_DEFAULT_LINE_BYTES, RT_JOB_DEFAULT_HOLD_BYTES,
                           576, &jb, NULL) != MC_OK)
        return 1;
    char padded[64] = "";
    if (pad)
        snprintf(padded, sizeof padded, ", lines padded by %zu bytes", pad);
    printf("JOB  %zu prompts: %llu prompt tokens (16-512, median 48, "
           "log-normal), %llu new tokens (1-64)%s; SmolLM-135M shape, %u "
           "layers, int8; %s threads; job buffers %.1f MiB; load average "
           "%.2f at start\n",
           n, (unsigned long long)ptok, (unsigned long long)ntok, padded,
           cfg.layers, th, jb.total_bytes / 1048576.0, bench_loadavg());
    printf("%-6s %-10s %8s %8s %10s %12s %12s %13s %7s %9s %9s %11s\n",
           "batch", "schedule", "seconds", "cpu s", "requests/s", "tokens/s",
           "new tok/s", "overhead ms", "sync s", "peak MiB", "plan MiB",
           "session MiB");
    const uint32_t batches[2] = {8, 32};
    double speedup[2] = {0, 0}, cpu_speedup[2] = {0, 0};
    int identical = 1, runs = 0;
    char json[2048];
    size_t jn = (size_t)snprintf(json, sizeof json,
                                 "{\"bench_batch\": {\"prompts\": %zu, "
                                 "\"prompt_tokens\": %llu, \"new_tokens\": "
                                 "%llu, \"runs\": [",
                                 n, (unsigned long long)ptok,
                                 (unsigned long long)ntok);
    for (int b = 0; b < 2; b++) {
        if (only && batches[b] != only)
            continue;
        char art[1200], mb[16], mc[4200];
        snprintf(art, sizeof art, "%s/b%u.mca", dir, batches[b]);
        snprintf(mb, sizeof mb, "%u", batches[b]);
        snprintf(mc, sizeof mc, "%s/mcompile", bin);
        char *cargv[] = {mc, model, "--target", "8GiB", "--quant", "int8",
                         "--max-batch", mb, "--max-seq", "576", "--threads",
                         th, "-o", art, "-q", NULL};
        if (run(cargv, NULL, NULL) != 0) {
            fprintf(stderr, "bench_batch: mcompile failed\n");
            return 1;
        }
        result r[2];
        const char *sched[2] = {"waves", "continuous"};
        for (int k = 0; k < 2; k++) {
            r[k] = run_job(bin, art, dir, sched[k], job, th,
                           k ? out_c : out_w);
            printf("%-6u %-10s %8.2f %8.2f %10.2f %12.1f %12.1f %13.3f %7.2f "
                   "%9.2f %9.2f %11.2f%s\n",
                   batches[b], sched[k], r[k].secs, r[k].cpu, n / r[k].secs,
                   (ptok + ntok) / r[k].secs, ntok / r[k].secs,
                   r[k].overhead_ms, r[k].sync_s, r[k].peak_rss / 1048576.0,
                   r[k].planned / 1048576.0,
                   (r[k].planned - (double)jb.total_bytes) / 1048576.0,
                   r[k].peak_rss <= r[k].planned ? "" : "  OVER PLAN");
            jn += (size_t)snprintf(
                json + jn, sizeof json - jn,
                "%s{\"max_batch\": %u, \"schedule\": \"%s\", \"seconds\": "
                "%.3f, \"cpu_seconds\": %.3f, \"overhead_ms\": %.3f, \"sync_seconds\": %.3f, "
                "\"peak_rss_bytes\": %.0f, "
                "\"planned_bytes\": %.0f}",
                runs++ ? ", " : "", batches[b], sched[k], r[k].secs, r[k].cpu,
                r[k].overhead_ms, r[k].sync_s, r[k].peak_rss, r[k].planned);
        }
        speedup[b] = r[0].secs / r[1].secs;
        cpu_speedup[b] = r[0].cpu / r[1].cpu;
        identical &= same_file(out_c, out_w);
    }
    printf("SPEEDUP continuous / waves: %.2fx at max_batch 8, %.2fx at "
           "max_batch 32 (goal >= 1.5x); by CPU seconds %.2fx and %.2fx; "
           "outputs byte-identical: %s; load average %.2f at the end\n",
           speedup[0], speedup[1], cpu_speedup[0], cpu_speedup[1],
           identical ? "yes" : "NO", bench_loadavg());
    printf("%s], \"speedup_b8\": %.3f, \"speedup_b32\": %.3f, "
           "\"identical\": %s}}\n",
           json, speedup[0], speedup[1], identical ? "true" : "false");
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0)
        fprintf(stderr, "bench_batch: could not remove %s\n", dir);
    return identical ? 0 : 1;
}

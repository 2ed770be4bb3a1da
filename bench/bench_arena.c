/* bench_arena.c - how much of the planned memory a run really uses, at
 * each corner of the plan, for every weight format (issue 15 part 5).
 *
 * For two generated models (the stories260k shape and a 4-layer slice of
 * the SmolLM-135M shape; --quick: the first only) and each --quant of
 * f32, f16, bf16, int8, int4, an artifact is compiled for each corner and
 * run once by mrun --json with a workload that reaches that corner's
 * limits (every slot filled to max_seq, so the KV cache is written whole):
 *
 *   batch x ctx  B 8, S 128, chunk 256: 8 prompts of 64, 64 new tokens
 *   prefill      B 2, S 128, chunk 256: 2 prompts of 127 (one full chunk),
 *                1 new token
 *   decode       B 8, S 128, chunk 8 (a decode-sized plan): 8 prompts of
 *                1 token, 127 new tokens sampled at temperature 1 with
 *                top-k vocab - 1, the sampler's worst case (its index
 *                scratch of vocab entries is what the plan holds for
 *                sampling; the probabilities overwrite the logits row)
 *   (decode greedy  the same greedily: the index scratch is not written,
 *                so vocab x 4 bytes stay unwritten; printed for the
 *                record, left out of the means and minima)
 *   score all    B 4, S 128, chunk 64: --score-continuation of 64 tokens
 *                after 64 (logits of every continuation row)
 *   score last   B 4, S 128, chunk 64: --score-labels after 127 tokens
 *                (logits of the last row only)
 *
 * Reported per run: arena bytes, touched / arena (bytes really written:
 * mrun's arena_touched_bytes, a canary count; goal >= 0.97), high water /
 * arena (never above 1), peak RSS / planned (planned = weights + arena +
 * reserve; goal 0.97-1.0); then per format the mean and min of each.
 * The canary undercounts written bytes by about 1/256 (a written byte
 * that happens to equal the canary), so touched / arena is a lower bound.
 *
 * usage: bench_arena [--bin DIR] [--threads N] [--quick] [--quants LIST]
 *                    [--shapes LIST]
 *   --bin DIR  where mcompile and mrun are (default: this program's
 *              directory/..); --quants f32,int8: only those formats;
 *              --shapes 0,1: only those models (--quick: 0).  Output: a table on stdout, then one JSON
 *              line ("bench_arena": {...}).  Temp files are removed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "bench_util.h"

typedef struct corner {
    const char *name;
    uint32_t batch, seq, chunk;
    uint32_t prompt;          /* tokens per prompt */
    uint32_t new_tokens;      /* generate; 0: score */
    int score_all;            /* 1: --score-continuation; 0: --score-labels */
    int sample;               /* 1: temperature 1, top-k vocab - 1 */
    int in_goal;              /* 0: printed, left out of mean and min */
} corner;

static const corner g_corners[] = {
    {"batch x ctx", 8, 128, 256, 64, 64, 0, 0, 1},
    {"prefill", 2, 128, 256, 127, 1, 0, 0, 1},
    {"decode", 8, 128, 8, 1, 127, 0, 1, 1},
    {"score all", 4, 128, 64, 64, 0, 1, 0, 1},
    {"score last", 4, 128, 64, 127, 0, 0, 0, 1},
    {"dec greedy", 8, 128, 8, 1, 127, 0, 0, 0},
};
#define N_CORNERS (sizeof g_corners / sizeof g_corners[0])

static const char *const g_quants[] = {"f32", "f16", "bf16", "int8", "int4"};
#define N_QUANTS 5

/* ids "a b c ..." of n tokens below vocab (never 0-2: BOS/EOS). */
static void ids(char *buf, size_t cap, uint32_t n, uint32_t vocab,
                uint32_t salt)
{
    size_t len = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && len + 12 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%u ",
                                3 + (i * 7 + salt * 13) % (vocab - 3));
}

/* 1 if name is one of the comma-separated items of list. */
static int in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* Run a shell command, its stdout into out (cap bytes); 0 on exit 0. */
static int sh(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = out ? fread(out, 1, cap - 1, p) : 0;
    if (out)
        out[n] = '\0';
    return pclose(p) == 0 ? 0 : -1;
}

typedef struct figures {
    double touched, hw, rss;  /* ratios */
    uint64_t arena;
} figures;

static int run_corner(const char *bin, const char *dir, const char *model,
                      uint32_t vocab, const char *quant, const corner *c,
                      int threads, figures *f)
{
    static char cmd[1 << 16], out[1 << 20], p[4096], cont[4096];
    char art[1200];
    snprintf(art, sizeof art, "%s/a.mca", dir);
    snprintf(cmd, sizeof cmd,
             "'%s/mcompile' '%s' --target 8GiB --quant %s --max-batch %u "
             "--max-seq %u --prefill-chunk %u --threads %d -q -o '%s' "
             ">/dev/null", bin, model, quant, c->batch, c->seq, c->chunk,
             threads, art);
    if (sh(cmd, NULL, 0))
        return -1;
    size_t len = (size_t)snprintf(cmd, sizeof cmd, "'%s/mrun' '%s' --json "
                                  "--threads %d", bin, art, threads);
    for (uint32_t b = 0; b < c->batch; b++) {
        ids(p, sizeof p, c->prompt, vocab, b);
        len += (size_t)snprintf(cmd + len, sizeof cmd - len,
                                " --tokens '%s'", p);
    }
    if (c->new_tokens && c->sample)
        snprintf(cmd + len, sizeof cmd - len,
                 " --max-new-tokens %u --ignore-eos --temperature 1 "
                 "--top-k %u --seed 7 2>/dev/null", c->new_tokens, vocab - 1);
    else if (c->new_tokens)
        snprintf(cmd + len, sizeof cmd - len,
                 " --max-new-tokens %u --ignore-eos 2>/dev/null",
                 c->new_tokens);
    else if (c->score_all) {
        ids(cont, sizeof cont, c->seq - c->prompt, vocab, 99);
        snprintf(cmd + len, sizeof cmd - len,
                 " --score-continuation '%s' 2>/dev/null", cont);
    } else {
        snprintf(cmd + len, sizeof cmd - len,
                 " --score-labels '5 6 7' 2>/dev/null");
    }
    if (sh(cmd, out, sizeof out))
        return -1;
    json_t *j = json_loads(out, 0, NULL);
    if (!j)
        return -1;
#define GET(k) ((double)json_integer_value(json_object_get(j, k)))
    double arena = GET("arena_bytes");
    f->arena = (uint64_t)arena;
    f->touched = GET("arena_touched_bytes") / arena;
    f->hw = GET("arena_high_water_bytes") / arena;
    f->rss = GET("peak_rss_bytes") / GET("planned_bytes");
#undef GET
    json_decref(j);
    unlink(art);
    return 0;
}

int main(int argc, char **argv)
{
    const char *bin = NULL;
    int threads = 2, quick = 0;
    const char *quants = NULL, *shapes_sel = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bin") && i + 1 < argc)
            bin = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 64);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--quants") && i + 1 < argc)
            quants = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc)
            shapes_sel = argv[++i];
        else {
            fprintf(stderr, "usage: bench_arena [--bin DIR] [--threads N] "
                    "[--quick] [--quants LIST] [--shapes LIST]\n");
            return 2;
        }
    }
    static char bindir[4096];
    if (!(bin = bench_programs_dir("bench_arena", bin, bindir, sizeof bindir)))
        return 1;
    char dir[1024], model[1100];
    if (bench_mkdtemp(dir, sizeof dir, "arena") != 0) {
        fprintf(stderr, "bench_arena: cannot make a scratch folder under "
                "$TMPDIR or /tmp: %s\n", strerror(errno));
        return 1;
    }
    const struct {
        const char *name;
        bench_llama_config cfg;
    } shapes[2] = {
        {"stories260k shape", {.hidden = 64, .ffn = 172, .layers = 5,
                               .heads = 8, .kv_heads = 4, .vocab = 512,
                               .max_pos = 512, .tied = 1,
                               .torch_dtype = "float32"}},
        {"SmolLM-135M shape, 4 layers",
         {.hidden = 576, .ffn = 1536, .layers = 4, .heads = 9, .kv_heads = 3,
          .vocab = 49152, .max_pos = 2048, .tied = 1,
          .torch_dtype = "float32"}},
    };
    printf("ARENA  touched/arena (goal >= 0.97), high water/arena (<= 1), "
           "peak RSS/planned (goal 0.97-1.0); %d threads; load average "
           "%.2f at start\n", threads, bench_loadavg());
    printf("%-28s %-5s %-11s %10s %8s %8s %8s\n", "model", "quant", "corner",
           "arena B", "touched", "hw", "rss");
    json_t *all = json_array();
    double gmin_t = 1e9, gmin_r = 1e9, gmax_r = 0, gsum_t = 0;
    int gn = 0, failed = 0;
    for (int s = 0; s < (quick ? 1 : 2); s++) {
        char sn[8];
        snprintf(sn, sizeof sn, "%d", s);
        if (shapes_sel && !in_list(shapes_sel, sn))
            continue;
        snprintf(model, sizeof model, "%s/m%d", dir, s);
        mkdir(model, 0755);
        if (bench_gen_llama(model, &shapes[s].cfg, FMT_DT_F32, 7 + s)) {
            fprintf(stderr, "bench_arena: cannot write the model\n");
            return 1;
        }
        for (int q = 0; q < N_QUANTS; q++) {
            if (quants && !in_list(quants, g_quants[q]))
                continue;
            double st = 0, sr = 0, mt = 1e9, mr = 1e9, xr = 0, xh = 0;
            int n = 0;
            for (size_t k = 0; k < N_CORNERS; k++) {
                figures f;
                if (run_corner(bin, dir, model, shapes[s].cfg.vocab,
                               g_quants[q], &g_corners[k], threads, &f)) {
                    fprintf(stderr, "bench_arena: %s %s %s failed\n",
                            shapes[s].name, g_quants[q], g_corners[k].name);
                    failed++;
                    continue;
                }
                printf("%-28s %-5s %-11s %10llu %8.4f %8.4f %8.4f%s\n",
                       shapes[s].name, g_quants[q], g_corners[k].name,
                       (unsigned long long)f.arena, f.touched, f.hw, f.rss,
                       g_corners[k].in_goal ? "" : "   (not in the goal)");
                fflush(stdout);
                if (!g_corners[k].in_goal)
                    continue;
                st += f.touched, sr += f.rss, n++;
                mt = f.touched < mt ? f.touched : mt;
                mr = f.rss < mr ? f.rss : mr;
                xr = f.rss > xr ? f.rss : xr;
                xh = f.hw > xh ? f.hw : xh;
            }
            if (!n)
                continue;
            printf("%-28s %-5s %-11s %10s %8.4f %8s %8.4f   (min touched "
                   "%.4f, rss %.4f-%.4f, max hw %.4f)\n", shapes[s].name,
                   g_quants[q], "mean", "", st / n, "", sr / n, mt, mr, xr,
                   xh);
            json_array_append_new(all, json_pack(
                "{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:f}", "model",
                shapes[s].name, "quant", g_quants[q], "touched_mean", st / n,
                "touched_min", mt, "rss_mean", sr / n, "rss_min", mr,
                "rss_max", xr, "hw_max", xh));
            gsum_t += st, gn += n;
            gmin_t = mt < gmin_t ? mt : gmin_t;
            gmin_r = mr < gmin_r ? mr : gmin_r;
            gmax_r = xr > gmax_r ? xr : gmax_r;
        }
    }
    printf("ALL  touched/arena mean %.4f min %.4f (goal >= 0.97); peak "
           "RSS/planned %.4f-%.4f (goal 0.97-1.0); %d runs failed\n",
           gn ? gsum_t / gn : 0.0, gmin_t, gmin_r, gmax_r, failed);
    json_t *top = json_pack("{s:{s:o, s:f, s:f, s:f, s:f, s:i}}",
                            "bench_arena", "formats", all, "touched_mean",
                            gn ? gsum_t / gn : 0.0, "touched_min", gmin_t,
                            "rss_min", gmin_r, "rss_max", gmax_r, "failed",
                            failed);
    char *js = json_dumps(top, JSON_COMPACT);
    if (js)
        printf("%s\n", js);
    free(js);
    json_decref(top);
    char rm[1200];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    if (system(rm) != 0)
        fprintf(stderr, "bench_arena: could not remove %s\n", dir);
    return failed ? 1 : 0;
}

/* cli_compile.c - `mcompile MODEL --target SIZE [-o OUT.mca] ...`: merge,
 * convert, plan and emit an artifact (cmp_compile.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cmp_cli.h"
#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"
#include "mc_parse.h"

#define GIB 1073741824.0
#define MAX_ADAPTERS 64

static void compile_usage(FILE *out)
{
    fprintf(out,
        "usage: mcompile MODEL --target SIZE [-o OUT.mca] [options]\n"
        "  MODEL            Hugging Face directory (or .safetensors / index.json)\n"
        "  --target SIZE    memory available: 24GiB, 24G, 1.5GiB, 512MiB, bytes\n"
        "  -o OUT.mca       output (default: MODEL's name + .mca, here)\n"
        "  --lora DIR[:W]   merge a PEFT LoRA adapter with weight W (default 1);\n"
        "                   repeatable; merged in memory, never written to disk\n"
        "  --quant Q        f32 | f16 | bf16 | int8 | int4 | auto (default f16);\n"
        "                   auto picks int4 / int8 / f16 per linear layer to\n"
        "                   fit --target (needs --calib, --max-batch, --max-seq)\n"
        "  --group G        int4 group size 32 | 64 | 128 (default 128)\n"
        "  --calib FILE     calibration data: token ids (one sequence per line) or\n"
        "                   plain text, tokenized with the tokenizer.json beside\n"
        "                   MODEL and cut into sequences of up to 512 tokens\n"
        "  --heldout N      calibration sequences kept out for the quality\n"
        "                   summary (default a tenth; 0: calibrate on all)\n"
        "  --calib-device cpu|cuda  where the calibration statistics are\n"
        "                   summed (default cpu; cuda: cuBLAS in double)\n"
        "  --calib-memory SIZE  memory budget of the calibration (default 75%%\n"
        "                   of RAM); over it, the widest inputs keep lean\n"
        "                   statistics (no GPTAQ there)\n"
        "  --method M       rtn | awq | gptq | gptaq | best | best-all (default\n"
        "                   best with --calib: gptaq, and awq+gptaq or act-order\n"
        "                   only where a cheap proxy says they can win; best-all\n"
        "                   tries every method on every group; without --calib,\n"
        "                   plain round-to-nearest)\n"
        "  --lm-head F      output layer f32 | f16 | bf16 | int8 when it is not\n"
        "                   the embedding (default: int8 for an untied model with\n"
        "                   int8/int4 linears; one untied by the rotation: f32\n"
        "                   from an f32 checkpoint, else the embedding's format)\n"
        "  --no-rotate      with --calib, do not rotate the model first (the\n"
        "                   default rotates the residual stream and value heads\n"
        "                   by Hadamard matrices: same function, less error;\n"
        "                   a tied model then stores a float lm_head too)\n"
        "  --max-batch B, --max-seq T, --prefill-chunk C, --threads N\n"
        "                   limits of the plan (defaults: see mcompile plan)\n"
        "  --kv f16|int8|f32  KV cache type (default f16)\n"
        "  --device cpu|cuda, --reserve SIZE   device reserve\n"
        "  --compress       zstd every section (level 3; --zstd-level N)\n"
        "  --json           one JSON object on stdout\n"
        "  -q, -v           quieter / print the whole plan (and with --calib,\n"
        "                   the time of each phase; --json has them too)\n"
        "exit: 0 ok, 1 failure (or the plan does not fit), 2 usage\n");
}

typedef struct calib_prog {
    int on;          /* stderr is a terminal and not -q */
    double last;     /* last print, seconds */
} calib_prog;

/* "13.49 GiB", "4.6 MiB", "386.3 KiB": readable at every model size. */
static const char *human_size(uint64_t b, char *buf, size_t n)
{
    if (b >= (1ull << 30))
        snprintf(buf, n, "%.2f GiB", (double)b / GIB);
    else if (b >= (1ull << 20))
        snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else
        snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
    return buf;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Calibration progress with an ETA, on a terminal only, a few per second. */
static void on_calib_progress(void *ctx, const cmp_calib_progress *p)
{
    calib_prog *c = ctx;
    double t = mono_s();
    if (!c->on || (t - c->last < 0.25 && p->layer < p->layers))
        return;
    c->last = t;
    fprintf(stderr, "\rcalibrating: layer %u/%u, %.0f s, ETA %.0f s   ",
            p->layer, p->layers, p->elapsed_s, p->eta_s);
    if (p->layer == p->layers)
        fputc('\n', stderr);
}

/* The per-layer table (cmp_calib_table_row) and the summary lines. */
static void print_calib(FILE *out, const cmp_compile_report *rep, int verbose)
{
    const cmp_calib_result *r = rep->calib;
    size_t n = (size_t)r->layers * CMP_LIN_COUNT, nf[4] = {0};
    double e = 0.0, erq = 0.0;
    for (size_t i = 0; i < n; i++) {
        kn_wformat f = r->t[i].fmt;
        nf[f == KN_W_Q4 || f == KN_W_Q4S ? 0 : f == KN_W_Q8 ? 1 : 2]++;
        e += r->t[i].err;
        erq += r->t[i].err_rtn;
    }
    {
        char row[256];
        fprintf(out, "%s\n", cmp_calib_table_header());
        for (size_t i = 0; i < n; i++)
            fprintf(out, "%s\n",
                    cmp_calib_table_row(&r->t[i], rep->calib_group, row,
                                        sizeof row));
    }
    fprintf(out, "calibrated %zu linears on %zu tokens (%zu sequences, %zu "
            "held out): int4 %zu, int8 %zu, float %zu; mean error %.5f "
            "(rtn %.5f)\n", n, r->calib_tokens, rep->calib_seqs,
            rep->heldout_seqs, nf[0], nf[1], nf[2], n ? e / n : 0.0,
            n ? erq / n : 0.0);
    {
        /* what the calibration planned to hold (cmp_calib_memory) */
        const cmp_calib_mem *mm = &r->mem;
        static const char *const tap[4] = {"q/k/v", "o_proj", "gate/up",
                                           "down_proj"};
        char lean[64] = "";
        for (int p = 0; p < 4; p++)
            if (mm->lean & (1u << p))
                snprintf(lean + strlen(lean), sizeof lean - strlen(lean),
                         "%s%s", lean[0] ? ", " : "", tap[p]);
        fprintf(out, "calibration memory: planned peak %.1f MiB (at %s), "
                "spilled %.1f MiB to disk; lean statistics: %s\n",
                mm->peak / 1048576.0, mm->phase ? mm->phase : "-",
                mm->spill / 1048576.0, lean[0] ? lean : "none");
        if (mm->device)
            fprintf(out, "calibration device memory: statistics %.1f MiB (at %s)\n",
                    mm->device / 1048576.0, mm->device_phase ? mm->device_phase : "-");
    }
    if (r->rotated)
        fprintf(out, "rotated: residual stream (Hadamard blocks of %u), value "
                "heads (%u)\n", r->rot_block, r->rot_head_block);
    if (r->has_heldout)
        fprintf(out, "held out: KLD mean %.5f p99 %.5f, top-1 %.2f%%, "
                "perplexity %.3f (reference %.3f) on %llu tokens\n",
                r->heldout.kld_mean, r->heldout.kld_p99,
                100.0 * r->heldout.top1, r->heldout.ppl, r->heldout.ppl_ref,
                (unsigned long long)r->heldout.tokens);
    if (verbose) {
        const cmp_calib_times *t = &r->times;
        fprintf(out, "calibration time: %.1f s: forward %.1f s, statistics "
                "%.1f s, factorization %.1f s, search %.1f s, ends %.1f s; "
                "write %.1f s\n", rep->calib_seconds, t->forward, t->stats,
                t->factor, t->search, t->ends, rep->write_seconds);
    }
}

/* "<name>.mca" in the current directory, name being the model's real last
 * component: "." or "../x/" name the directory they resolve to, not a
 * hidden "..mca". */
static char *default_out(const char *model)
{
    char buf[PATH_MAX > 4096 ? PATH_MAX : 4096];
    if (!realpath(model, buf))
        snprintf(buf, sizeof buf, "%s", model);
    if (strcmp(buf, "/") == 0)
        snprintf(buf, sizeof buf, "model"); /* the root has no name */
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *b = strrchr(buf, '/');
    b = b ? b + 1 : buf;
    char out[4200];
    snprintf(out, sizeof out, "%s.mca", b);
    return mc_strdup(out);
}

int cmp_cli_compile(int argc, char **argv)
{
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    cmp_adapter_spec ads[MAX_ADAPTERS];
    char *dirs[MAX_ADAPTERS];
    size_t nads = 0;
    int json = 0, quiet = 0, verbose = 0, rc = 2;
    char *out_owned = NULL;
    int method_set = 0, no_rotate = 0, lm_head_set = 0, calib_device_set = 0;
    kn_wformat lm_head_fmt = KN_W_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            compile_usage(stdout);
            rc = 0;
            goto done;
        }
        if (strcmp(a, "--json") == 0) { json = 1; continue; }
        if (strcmp(a, "-q") == 0) { quiet = 1; continue; }
        if (strcmp(a, "-v") == 0) { verbose = 1; continue; }
        if (strcmp(a, "--compress") == 0) { o.compress = 1; continue; }
        if (strcmp(a, "--no-rotate") == 0) { no_rotate = 1; continue; }
        if (a[0] == '-') {
            if (i + 1 >= argc) {
                fprintf(stderr, "mcompile: %s needs a value\n", a);
                goto done;
            }
            const char *v = argv[++i];
            if (strcmp(a, "-o") == 0) {
                o.out = v;
            } else if (strcmp(a, "--lora") == 0) {
                if (nads == MAX_ADAPTERS) {
                    fprintf(stderr, "mcompile: at most %d adapters\n",
                            MAX_ADAPTERS);
                    goto done;
                }
                char why[256];
                if (cmp_cli_parse_lora(v, &dirs[nads], &ads[nads].weight, why,
                                       sizeof why) != 0) {
                    fprintf(stderr, "mcompile: %s\n", why);
                    goto done;
                }
                ads[nads].dir = dirs[nads];
                nads++;
            } else if (strcmp(a, "--calib") == 0) {
                o.calib = v;
            } else if (strcmp(a, "--calib-device") == 0) {
                if (strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
                    fprintf(stderr, "mcompile: --calib-device must be cpu or "
                            "cuda (got '%s')\n", v);
                    goto done;
                }
                o.calib_gpu = strcmp(v, "cuda") == 0;
                calib_device_set = 1;
            } else if (strcmp(a, "--calib-memory") == 0) {
                if (cmp_parse_size(v, &o.calib_memory) != 0 || o.calib_memory == 0) {
                    fprintf(stderr, "mcompile: --calib-memory must be a size "
                            "such as 20GiB (got '%s')\n", v);
                    goto done;
                }
            } else if (strcmp(a, "--heldout") == 0) {
                char why[256];
                uint64_t h;
                if (mc_parse_u64(a, v, 0, 1u << 30, &h, why, sizeof why)) {
                    fprintf(stderr, "mcompile: %s\n", why);
                    goto done;
                }
                o.heldout = h ? (long)h : -1; /* 0 asks for none */
            } else if (strcmp(a, "--lm-head") == 0) {
                static const struct { const char *n; kn_wformat f; } lh[] = {
                    {"f32", KN_W_F32}, {"f16", KN_W_F16}, {"bf16", KN_W_BF16},
                    {"int8", KN_W_Q8}};
                lm_head_set = 0;
                for (size_t k = 0; k < sizeof lh / sizeof lh[0]; k++)
                    if (strcmp(v, lh[k].n) == 0) {
                        lm_head_fmt = lh[k].f;
                        lm_head_set = 1;
                    }
                if (!lm_head_set) {
                    fprintf(stderr, "mcompile: --lm-head must be f32, f16, "
                            "bf16 or int8 (got '%s')\n", v);
                    goto done;
                }
            } else if (strcmp(a, "--method") == 0) {
                if (cmp_qmethod_parse(v, &o.method) != 0) {
                    fprintf(stderr, "mcompile: --method must be rtn, awq, "
                            "gptq, gptaq, best or best-all (got '%s')\n", v);
                    goto done;
                }
                method_set = 1;
            } else if (strcmp(a, "--quant") == 0 && strcmp(v, "auto") == 0) {
                mc_error e;
                /* int4 is what auto starts from; the group may follow */
                cmp_wpolicy_parse("int4", o.req.policy.group, &o.req.policy,
                                  &e);
                o.quant_auto = 1;
            } else if (strcmp(a, "--zstd-level") == 0) {
                char why[256];
                uint64_t l;
                if (mc_parse_u64(a, v, 1, 19, &l, why, sizeof why)) {
                    fprintf(stderr, "mcompile: %s\n", why);
                    goto done;
                }
                o.zstd_level = (int)l;
            } else {
                char why[256];
                int r = cmp_plan_parse_option(&o.req, a, v, why, sizeof why);
                if (r == 0) {
                    fprintf(stderr, "mcompile: unknown option %s\n", a);
                    compile_usage(stderr);
                    goto done;
                }
                if (r < 0) {
                    fprintf(stderr, "mcompile: %s\n", why);
                    goto done;
                }
                if (strcmp(a, "--quant") == 0)
                    o.quant_auto = 0;
            }
            continue;
        }
        if (o.model) {
            fprintf(stderr, "mcompile: unknown command or second model '%s' "
                    "(see mcompile --help)\n", a);
            goto done;
        }
        o.model = a;
    }
    if (!o.model || o.req.target_bytes == 0) {
        fprintf(stderr, "mcompile: need MODEL and --target SIZE\n");
        compile_usage(stderr);
        goto done;
    }
    if (o.quant_auto && !o.calib) {
        fprintf(stderr, "mcompile: --quant auto measures each layer on "
                "calibration ids: add --calib FILE\n");
        goto done;
    }
    if (o.quant_auto && (!o.req.max_batch || !o.req.max_seq)) {
        fprintf(stderr, "mcompile: --quant auto needs --max-batch and "
                "--max-seq (the budget is weights + KV cache + activations)\n");
        goto done;
    }
    if (o.calib && !o.quant_auto && o.req.policy.linear != KN_W_Q8 &&
        o.req.policy.linear != KN_W_Q4) {
        fprintf(stderr, "mcompile: --calib quantizes the linear layers: use "
                "it with --quant int8, int4 or auto\n");
        goto done;
    }
    if (method_set && !o.calib) {
        fprintf(stderr, "mcompile: --method needs --calib FILE (without "
                "calibration ids, compile rounds to nearest)\n");
        goto done;
    }
    if ((o.calib_memory || calib_device_set) && !o.calib) {
        fprintf(stderr, "mcompile: --calib-memory and --calib-device need "
                "--calib FILE\n");
        goto done;
    }
    if (o.heldout && !o.calib) {
        fprintf(stderr, "mcompile: --heldout needs --calib FILE\n");
        goto done;
    }
    o.rotate = o.calib && !no_rotate;
    o.req.policy.lm_head_set = lm_head_set;
    o.req.policy.lm_head_fmt = lm_head_fmt;
    if (o.calib && !method_set)
        o.method = CMP_QM_BEST;
    calib_prog cp = {!quiet && !json && isatty(2), 0.0};
    o.progress = on_calib_progress;
    o.progress_ctx = &cp;
    o.threads = 0; /* every CPU: kernels give the same bits on any count */
    if (!o.out)
        o.out = out_owned = default_out(o.model);
    struct stat st;
    if (o.out && stat(o.out, &st) == 0 && !fmt_art_is_artifact(o.out)) {
        fprintf(stderr, "mcompile: refusing to overwrite '%s': it exists and "
                "is not an mcompile artifact (an input?)\n", o.out);
        rc = 1;
        goto done;
    }
    o.adapters = ads;
    o.n_adapters = nads;
    cmp_compile_report rep;
    mc_error err;
    mc_error_clear(&err);
    double t0 = mono_s();
    mc_status s = cmp_compile(&o, &rep, &err);
    double seconds = mono_s() - t0;
    rc = s == MC_OK ? 0 : 1;
    if (s == MC_ERR_PLAN && rep.plan.total_bytes) {
        char bd[256];
        if (!quiet && !json)
            cmp_cli_print_plan(stderr, &rep.cfg, &rep.plan);
        fprintf(stderr, "mcompile: batch %u x context %llu does not fit: %s\n",
                rep.plan.limits.max_batch,
                (unsigned long long)rep.plan.limits.max_seq,
                cmp_plan_breakdown(&rep.plan, bd, sizeof bd));
    } else if (s != MC_OK) {
        char buf[1600];
        fprintf(stderr, "mcompile: %s\n", mc_error_format(&err, buf, sizeof buf));
    }
    if (json) {
        json_t *j = json_object();
        if (s == MC_OK && rep.calib) {
            const cmp_calib_result *r = rep.calib;
            json_t *c = json_pack("{s:s, s:I, s:I, s:I}", "method",
                                  cmp_qmethod_name(o.method), "tokens",
                                  (json_int_t)r->calib_tokens, "sequences",
                                  (json_int_t)rep.calib_seqs,
                                  "heldout_sequences",
                                  (json_int_t)rep.heldout_seqs);
            if (c && r->has_heldout)
                json_object_set_new(c, "heldout_kld_mean",
                                    json_real(r->heldout.kld_mean));
            if (c)
                json_object_set_new(c, "rotated", json_boolean(r->rotated));
            if (c)
                json_object_set_new(
                    c, "phase_seconds",
                    json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "total",
                              rep.calib_seconds, "forward", r->times.forward,
                              "statistics", r->times.stats, "factorization",
                              r->times.factor, "search", r->times.search,
                              "ends", r->times.ends, "write",
                              rep.write_seconds));
            json_object_set_new(j, "calibration", c);
        }
        json_object_set_new(j, "ok", json_boolean(s == MC_OK));
        json_object_set_new(j, "status", json_integer(s));
        json_object_set_new(j, "output", json_string(o.out));
        json_object_set_new(j, "file_bytes", json_integer((json_int_t)rep.file_bytes));
        json_object_set_new(j, "tensors", json_integer((json_int_t)rep.tensors));
        json_object_set_new(j, "weights_bytes",
                            json_integer((json_int_t)rep.weights_bytes));
        json_object_set_new(
            j, "part_bytes",
            json_pack("{s:I, s:I, s:I, s:I, s:s}", "embeddings",
                      (json_int_t)rep.part_bytes[CMP_PART_EMBED], "lm_head",
                      (json_int_t)rep.part_bytes[CMP_PART_LM_HEAD], "linears",
                      (json_int_t)rep.part_bytes[CMP_PART_LINEARS], "other",
                      (json_int_t)rep.part_bytes[CMP_PART_OTHER], "lm_head_format",
                      rep.lm_head_tied ? "tied" : cmp_wformat_name(rep.lm_head_fmt)));
        json_object_set_new(j, "tokenizer", json_boolean(rep.tokenizer));
        json_object_set_new(j, "adapters", json_integer((json_int_t)rep.adapters));
        json_object_set_new(j, "seconds", json_real(seconds));
        if (rep.plan.total_bytes)
            json_object_set_new(j, "plan", cmp_plan_to_json(&rep.plan));
        char *t = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (t)
            printf("%s\n", t);
        mc_free(t);
        json_decref(j);
    } else if (s == MC_OK && !quiet) {
        if (verbose)
            cmp_cli_print_plan(stdout, &rep.cfg, &rep.plan);
        if (rep.calib)
            print_calib(stdout, &rep, verbose);
        char hw[32], ht[32], hg[32];
        printf("wrote %s: %zu tensors, weights %s (%llu bytes), file "
               "%llu bytes%s%s; plan batch %u x context %llu, arena %llu "
               "bytes, total %s of %s; %.2f s\n", o.out, rep.tensors,
               human_size(rep.weights_bytes, hw, sizeof hw),
               (unsigned long long)rep.weights_bytes,
               (unsigned long long)rep.file_bytes,
               rep.tokenizer ? ", tokenizer" : "",
               o.compress ? ", zstd" : "", rep.plan.limits.max_batch,
               (unsigned long long)rep.plan.limits.max_seq,
               (unsigned long long)rep.plan.arena_bytes,
               human_size(rep.plan.total_bytes, ht, sizeof ht),
               human_size(rep.plan.target_bytes, hg, sizeof hg), seconds);
        char he[32], hl[32], hn[32], ho[32];
        printf("weights by part: embeddings %s, output layer %s (%s), linears "
               "%s, norms and biases %s\n",
               human_size(rep.part_bytes[CMP_PART_EMBED], he, sizeof he),
               human_size(rep.part_bytes[CMP_PART_LM_HEAD], hl, sizeof hl),
               rep.lm_head_tied ? "tied: the embeddings"
                                : cmp_wformat_name(rep.lm_head_fmt),
               human_size(rep.part_bytes[CMP_PART_LINEARS], hn, sizeof hn),
               human_size(rep.part_bytes[CMP_PART_OTHER], ho, sizeof ho));
    }
    cmp_compile_report_release(&rep);
done:
    for (size_t i = 0; i < nads; i++)
        free(dirs[i]); /* cmp_cli_parse_lora: strdup */
    mc_free(out_owned);
    return rc;
}

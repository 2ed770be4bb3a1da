/* cli_compile.c - `mcompile MODEL --target SIZE [-o OUT.mca] ...`: merge,
 * convert, plan and emit an artifact (cmp_compile.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cmp_cli.h"
#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"

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
        "  --quant Q        f32 | f16 | bf16 | int8 | int4 (default f16)\n"
        "  --group G        int4 group size 32 | 64 | 128 (default 128)\n"
        "  --max-batch B, --max-seq T, --prefill-chunk C, --threads N\n"
        "                   limits of the plan (defaults: see mcompile plan)\n"
        "  --kv f16|int8|f32  KV cache type (default f16)\n"
        "  --device cpu|cuda, --reserve SIZE   device reserve\n"
        "  --compress       zstd every section (level 3; --zstd-level N)\n"
        "  --json           one JSON object on stdout\n"
        "  -q, -v           quieter / print the whole plan\n"
        "exit: 0 ok, 1 failure (or the plan does not fit), 2 usage\n");
}

static int parse_lora(const char *arg, cmp_adapter_spec *a, char **dir_out)
{
    char *dir = mc_strdup(arg);
    if (!dir)
        return -1;
    a->weight = 1.0;
    char *colon = strrchr(dir, ':');
    if (colon && colon[1]) {
        char *end;
        double w = strtod(colon + 1, &end);
        if (*end == '\0') {
            *colon = '\0';
            a->weight = w;
        }
    }
    a->dir = dir;
    *dir_out = dir;
    return 0;
}

static char *default_out(const char *model)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", model);
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
                if (parse_lora(v, &ads[nads], &dirs[nads]) != 0) {
                    fprintf(stderr, "mcompile: out of memory\n");
                    rc = 1;
                    goto done;
                }
                nads++;
            } else if (strcmp(a, "--zstd-level") == 0) {
                o.zstd_level = atoi(v);
                if (o.zstd_level < 1 || o.zstd_level > 19) {
                    fprintf(stderr, "mcompile: --zstd-level must be 1..19\n");
                    goto done;
                }
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
    mc_status s = cmp_compile(&o, &rep, &err);
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
        json_object_set_new(j, "ok", json_boolean(s == MC_OK));
        json_object_set_new(j, "status", json_integer(s));
        json_object_set_new(j, "output", json_string(o.out));
        json_object_set_new(j, "file_bytes", json_integer((json_int_t)rep.file_bytes));
        json_object_set_new(j, "tensors", json_integer((json_int_t)rep.tensors));
        json_object_set_new(j, "weights_bytes",
                            json_integer((json_int_t)rep.weights_bytes));
        json_object_set_new(j, "tokenizer", json_boolean(rep.tokenizer));
        json_object_set_new(j, "adapters", json_integer((json_int_t)rep.adapters));
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
        printf("wrote %s: %zu tensors, weights %.2f GiB (%llu bytes), file "
               "%llu bytes%s%s; plan batch %u x context %llu, arena %llu "
               "bytes, total %.2f GiB of %.2f GiB\n", o.out, rep.tensors,
               rep.weights_bytes / GIB, (unsigned long long)rep.weights_bytes,
               (unsigned long long)rep.file_bytes,
               rep.tokenizer ? ", tokenizer" : "",
               o.compress ? ", zstd" : "", rep.plan.limits.max_batch,
               (unsigned long long)rep.plan.limits.max_seq,
               (unsigned long long)rep.plan.arena_bytes,
               rep.plan.total_bytes / GIB, rep.plan.target_bytes / GIB);
    }
done:
    for (size_t i = 0; i < nads; i++)
        mc_free(dirs[i]);
    mc_free(out_owned);
    return rc;
}

/* cli_inspect.c - `mcompile inspect ARTIFACT [--verify] [--json]`: the
 * manifest and plan of an artifact; --verify checks every checksum. */
#include <stdio.h>
#include <string.h>

#include "cmp_cli.h"
#include "fmt_artifact.h"
#include "mc_alloc.h"
#include "rt_artifact.h"

/* Decompressed zstd bytes past which --verify skips the load check. */
#define INSPECT_LOAD_ZSTD_MAX ((uint64_t)1 << 30)

#define GIB 1073741824.0

/* Every option of `mcompile inspect`. */
typedef struct inspect_cli {
    const char *path;      /* ARTIFACT */
    int verify, json;
    int quiet_verbose;     /* -q, -v: accepted, nothing to change */
} inspect_cli;

static const mc_opt inspect_opts[] = {
    {.kind = MC_OPT_SET, .flags = "--verify",
     .off = offsetof(inspect_cli, verify),
     .help = "check every section's checksum, then open it\n"
             "as mrun does"},
    {.kind = MC_OPT_SET, .flags = "--json", .off = offsetof(inspect_cli, json),
     .help = "one JSON object on stdout"},
    {.kind = MC_OPT_SET, .flags = "-q, -v",
     .off = offsetof(inspect_cli, quiet_verbose),
     .help = "accepted for symmetry (the report is the output)"},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "this text"},
    {.kind = MC_OPT_END},
};

const mc_opt_cmd cmp_cli_inspect_cmd = {
    .name = "mcompile inspect",
    .usage = "usage: mcompile inspect ARTIFACT [--verify] [--json]\n"
             "  Shows the manifest (config, tensors, plan, provenance).\n"
             "  Every open checks magic, version, header/manifest/table\n"
             "  checksums and the section table; --verify also checks every\n"
             "  section's checksum (and decompresses zstd sections), then\n"
             "  opens it as mrun does (config, tensors, plan).\n",
    .footer = "exit: 0 ok, 1 damaged or unreadable, 2 usage\n",
    .positional = "ARTIFACT",
    .positional_off = offsetof(inspect_cli, path),
    .opts = inspect_opts,
};

static long long geti(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static const char *gets(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "?";
}

/* The manifest's "calibration" object (cmp_compile.h), when there is one:
 * what the quality figures of `mcompile eval` came from. */
static void print_calibration(const json_t *cal)
{
    if (!json_is_object(cal))
        return;
    printf("calibration: method %s, %lld tokens in %lld sequences (%lld held "
           "out), ids xxh3 %s\n", gets(cal, "method"), geti(cal, "tokens"),
           geti(cal, "sequences"), geti(cal, "heldout_sequences"),
           gets(cal, "ids_xxh3"));
    /* named only when bfloat16 (cmp_compile.c): older artifacts and
     * --calib-stats f32 summed float products */
    printf("  statistics: %s products\n",
           json_is_string(json_object_get(cal, "statistics")) ? gets(cal, "statistics")
                                                             : "float");
    /* likewise the quantized pass's products (--calib-forward) */
    printf("  quantized pass: %s products\n",
           json_is_string(json_object_get(cal, "forward")) ? gets(cal, "forward")
                                                          : "float");
    /* and the full-precision weights' (--calib-full-pass) */
    printf("  full-precision pass: %s products\n",
           json_is_string(json_object_get(cal, "full_pass")) ? gets(cal, "full_pass")
                                                            : "float");
    /* GPTQ's codes unrefined (--calib-refine off) are named; an
     * artifact without the key was refined or had no GPTQ */
    if (json_is_false(json_object_get(cal, "refine")))
        printf("  GPTQ codes: unrefined (no scale refit or code descent)\n");
    const json_t *rot = json_object_get(cal, "rotation");
    if (json_is_object(rot))
        printf("  rotated: Hadamard blocks of %lld (value heads %lld), seed "
               "%s\n", geti(rot, "block"), geti(rot, "head_block"),
               gets(rot, "seed"));
    const json_t *h = json_object_get(cal, "heldout");
    if (json_is_object(h))
        printf("  held out: KLD mean %.5f p99 %.5f, top-1 %.2f%%, perplexity "
               "%.3f (reference %.3f) on %lld tokens\n",
               json_number_value(json_object_get(h, "kld_mean")),
               json_number_value(json_object_get(h, "kld_p99")),
               100.0 * json_number_value(json_object_get(h, "top1")),
               json_number_value(json_object_get(h, "ppl")),
               json_number_value(json_object_get(h, "ppl_ref")),
               geti(h, "tokens"));
}

static void print_human(const char *path, const fmt_art *a)
{
    const json_t *m = fmt_art_manifest(a);
    const json_t *c = json_object_get(m, "config");
    const json_t *p = json_object_get(m, "plan");
    const json_t *pv = json_object_get(m, "provenance");
    size_t mlen;
    fmt_art_manifest_text(a, &mlen);
    size_t nz = 0;
    for (size_t i = 0; i < fmt_art_section_count(a); i++)
        nz += fmt_art_section_at(a, i)->codec == FMT_ART_CODEC_ZSTD;
    printf("artifact: %s, %llu bytes, version %u, manifest %zu bytes, %zu "
           "sections (%zu zstd)\n", path,
           (unsigned long long)fmt_art_file_bytes(a), FMT_ART_VERSION, mlen,
           fmt_art_section_count(a), nz);
    printf("model: %s, %lld layers, hidden %lld, heads %lld/%lld, vocab %lld, "
           "max_position %lld\n", gets(c, "model_type"),
           geti(c, "num_hidden_layers"), geti(c, "hidden_size"),
           geti(c, "num_attention_heads"), geti(c, "num_key_value_heads"),
           geti(c, "vocab_size"), geti(c, "max_position_embeddings"));
    uint64_t by[FMT_ART_NFORMATS] = {0};
    for (size_t i = 0; i < fmt_art_tensor_count(a); i++) {
        const fmt_art_tensor *t = fmt_art_tensor_at(a, i);
        by[t->fmt] += t->data.bytes + t->scales.bytes + t->zeros.bytes;
    }
    printf("tensors: %zu (quant %s);", fmt_art_tensor_count(a),
           gets(p, "quant"));
    for (int k = 0; k < FMT_ART_NFORMATS; k++)
        if (by[k])
            printf(" %s %llu bytes", fmt_art_wformat_name((fmt_art_wformat)k),
                   (unsigned long long)by[k]);
    printf("\n");
    printf("plan: batch %lld x context %lld, prefill chunk %lld, threads "
           "%lld, KV %s, device %s\n", geti(p, "max_batch"),
           geti(p, "max_seq"), geti(p, "prefill_chunk"), geti(p, "threads"),
           gets(p, "kv_type"), gets(p, "device"));
    printf("  weights %.3f GiB, KV %.3f GiB, activations %.3f GiB, reserve "
           "%.3f GiB: total %.3f GiB of target %.3f GiB\n",
           geti(p, "weights_bytes") / GIB, geti(p, "kv_bytes") / GIB,
           geti(p, "activation_bytes") / GIB, geti(p, "reserve_bytes") / GIB,
           geti(p, "total_bytes") / GIB, geti(p, "target_bytes") / GIB);
    printf("  arena %lld bytes:\n", geti(p, "arena_bytes"));
    const json_t *bufs = json_object_get(p, "buffers");
    for (size_t i = 0; i < json_array_size(bufs); i++) {
        const json_t *b = json_array_get(bufs, i);
        if (geti(b, "bytes") > 0)
            printf("    %-14s offset %12lld  bytes %12lld\n", gets(b, "name"),
                   geti(b, "offset"), geti(b, "bytes"));
    }
    printf("provenance: %s, model %s\n", gets(pv, "compiler"),
           gets(pv, "model"));
    const json_t *in = json_object_get(pv, "inputs");
    for (size_t i = 0; i < json_array_size(in); i++) {
        const json_t *f = json_array_get(in, i);
        printf("  input %-32s xxh3 %s  %lld bytes\n", gets(f, "file"),
               gets(f, "xxh3"), geti(f, "bytes"));
    }
    const json_t *ad = json_object_get(pv, "adapters");
    for (size_t i = 0; i < json_array_size(ad); i++)
        printf("  adapter %s (weight %g)\n", gets(json_array_get(ad, i), "name"),
               json_number_value(json_object_get(json_array_get(ad, i),
                                                 "weight")));
    printf("tokenizer: %s\n",
           fmt_art_find_section(a, "tokenizer") != (size_t)-1 ? "embedded"
                                                              : "none");
    print_calibration(json_object_get(m, "calibration"));
}

int cmp_cli_inspect(int argc, char **argv)
{
    inspect_cli ic;
    memset(&ic, 0, sizeof ic);
    int rc = cmp_cli_parse(&cmp_cli_inspect_cmd, argc, argv, &ic);
    if (rc >= 0)
        return rc;
    if (!ic.path)
        return cmp_cli_usage(&cmp_cli_inspect_cmd, "no ARTIFACT");
    const char *path = ic.path;
    int verify = ic.verify, json = ic.json;
    fmt_art *a = NULL;
    mc_error err;
    mc_error_clear(&err);
    char buf[1600];
    mc_status st = fmt_art_open(path, &a, &err);
    if (st != MC_OK) {
        if (json)
            printf("{\"ok\": false, \"status\": %d, \"error\": \"%s\"}\n", st,
                   mc_status_str(st));
        fprintf(stderr, "mcompile inspect: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return 1;
    }
    size_t bad = 0;
    mc_status vs = verify ? fmt_art_verify(a, &bad, &err) : MC_OK;
    /* Checksums can be redone by anyone: --verify also opens the artifact
     * as mrun does (config, tensor table against it, plan against this
     * runtime's layout), so "OK" means mrun will load it. */
    mc_status ls = MC_OK;
    mc_error lerr;
    mc_error_clear(&lerr);
    /* The loader holds zstd sections decompressed in memory (mapped raw
     * ones cost nothing): past INSPECT_LOAD_ZSTD_MAX that would make a
     * check fail for want of memory on a machine that only inspects. */
    uint64_t zbytes = 0;
    for (size_t i = 0; i < fmt_art_section_count(a); i++)
        if (fmt_art_section_at(a, i)->codec == FMT_ART_CODEC_ZSTD)
            zbytes += fmt_art_section_at(a, i)->raw_bytes;
    int load_check = verify && zbytes <= INSPECT_LOAD_ZSTD_MAX;
    if (load_check && vs == MC_OK) {
        rt_model *m = NULL;
        ls = rt_model_open_artifact_ex(path, RT_ART_NO_VERIFY | RT_ART_ROWS, &m,
                                       &lerr);
        rt_model_free(m);
    }
    if (json) {
        json_t *o = json_object();
        json_object_set_new(o, "ok", json_boolean(vs == MC_OK && ls == MC_OK));
        json_object_set_new(o, "file_bytes",
                            json_integer((json_int_t)fmt_art_file_bytes(a)));
        json_object_set_new(o, "version", json_integer(FMT_ART_VERSION));
        json_object_set_new(o, "sections",
                            json_integer((json_int_t)fmt_art_section_count(a)));
        json_object_set_new(o, "verified",
                            verify ? json_boolean(vs == MC_OK && ls == MC_OK)
                                   : json_null());
        json_object_set_new(o, "manifest",
                            json_deep_copy(fmt_art_manifest(a)));
        char *t = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (t)
            printf("%s\n", t);
        mc_free(t);
        json_decref(o);
    } else {
        print_human(path, a);
        if (verify && vs == MC_OK && ls == MC_OK && load_check)
            printf("verify: all %zu sections OK; the runtime loads it "
                   "(config, tensors, plan)\n", fmt_art_section_count(a));
        else if (verify && vs == MC_OK)
            printf("verify: all %zu sections OK; the runtime's load check "
                   "skipped (%.1f GiB of zstd sections would be held "
                   "decompressed; mrun checks at load)\n",
                   fmt_art_section_count(a), (double)zbytes / (1u << 30));
    }
    if (vs != MC_OK)
        fprintf(stderr, "mcompile inspect: verify failed at section %zu: %s\n",
                bad, mc_error_format(&err, buf, sizeof buf));
    else if (ls != MC_OK)
        fprintf(stderr, "mcompile inspect: verify: the checksums match, but "
                "the runtime refuses it: %s\n",
                mc_error_format(&lerr, buf, sizeof buf));
    fmt_art_close(a);
    return vs == MC_OK && ls == MC_OK ? 0 : 1;
}

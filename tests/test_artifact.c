/* test_artifact.c - the artifact writer and reader: round trip, byte
 * identity, zstd sections decompress to the same bytes, writer contract
 * errors, and a real compile of the fixtures/stories260k loaded as an
 * rt_model. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "fmt_model.h"
#include "rt_artifact.h"
#include "rt_session.h"
#include "testutil.h"
#include "tok_fixture.h"

/* Whole file as bytes (the text helper stops at a NUL). */
static uint8_t *read_bin(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

enum { BLOB = 10000 };

/* Section contents: a f32 [4][8] tensor, a q8 [3][5] tensor (data 15 bytes,
 * scales at 64), a compressible blob and an empty section. */
static void fill(uint8_t *a, uint8_t *b, uint8_t *c)
{
    for (int i = 0; i < 32; i++) {
        float v = (float)i * 0.25f - 3.0f;
        memcpy(a + 4 * i, &v, 4);
    }
    memset(b, 0, 76);
    for (int i = 0; i < 15; i++)
        b[i] = (uint8_t)(i * 7);
    for (int i = 0; i < 3; i++) {
        float s = 0.01f * (float)(i + 1);
        memcpy(b + 64 + 4 * i, &s, 4);
    }
    for (int i = 0; i < BLOB; i++)
        c[i] = (uint8_t)("hello artifact "[i % 15]);
}

static json_t *manifest(void)
{
    return json_pack(
        "{s:{s:s}, s:{s:i}, s:{s:s}, s:[{s:s, s:s, s:[i,i], s:i, s:i, "
        "s:[i,i], s:[i,i], s:[i,i]}, {s:s, s:s, s:[i,i], s:i, s:i, s:[i,i], "
        "s:[i,i], s:[i,i]}]}",
        "config", "model_type", "test", "plan", "max_batch", 1, "provenance",
        "compiler", "test", "tensors", "name", "a", "format", "f32", "shape",
        4, 8, "group", 0, "section", 0, "data", 0, 128, "scales", 0, 0,
        "zeros", 0, 0, "name", "b", "format", "q8", "shape", 3, 5, "group", 0,
        "section", 1, "data", 0, 15, "scales", 64, 12, "zeros", 0, 0);
}

/* Write the test artifact to path; chunk = bytes per write call (spanning
 * section boundaries). */
static void write_art(const char *path, fmt_art_codec codec, size_t chunk)
{
    static uint8_t a[128], b[76], c[BLOB];
    fill(a, b, c);
    size_t total = sizeof a + sizeof b + sizeof c;
    uint8_t *all = malloc(total);
    memcpy(all, a, sizeof a);
    memcpy(all + sizeof a, b, sizeof b);
    memcpy(all + sizeof a + sizeof b, c, sizeof c);
    fmt_art_writer *w;
    mc_error err;
    assert_int_equal(fmt_art_writer_create(path, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "a", "tensor", sizeof a,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "b", "tensor", sizeof b,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "blob", "blob", sizeof c,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "empty", "blob", 0, codec,
                                                &err), MC_OK);
    json_t *m = manifest();
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    json_decref(m);
    for (size_t off = 0; off < total; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        assert_int_equal(fmt_art_writer_write(w, all + off, n, &err), MC_OK);
    }
    assert_int_equal(fmt_art_writer_finish(w, &err), MC_OK);
    free(all);
}

static void check_contents(const char *path, int zstd)
{
    static uint8_t a[128], b[76], c[BLOB];
    fill(a, b, c);
    fmt_art *art;
    mc_error err;
    assert_int_equal(fmt_art_open(path, &art, &err), MC_OK);
    assert_int_equal(fmt_art_section_count(art), 4);
    assert_int_equal(fmt_art_tensor_count(art), 2);
    assert_int_equal(fmt_art_verify(art, NULL, &err), MC_OK);
    const uint8_t *want[4] = {a, b, c, NULL};
    size_t len[4] = {sizeof a, sizeof b, sizeof c, 0};
    for (size_t i = 0; i < 4; i++) {
        const fmt_art_section *s = fmt_art_section_at(art, i);
        assert_int_equal(s->raw_bytes, len[i]);
        assert_int_equal(s->offset % FMT_ART_ALIGN, 0);
        assert_int_equal(s->codec, zstd ? FMT_ART_CODEC_ZSTD : FMT_ART_CODEC_RAW);
        uint8_t *got = malloc(len[i] + 1);
        assert_int_equal(fmt_art_section_read(art, i, got, len[i], 1, &err),
                         MC_OK);
        if (len[i])
            assert_memory_equal(got, want[i], len[i]);
        free(got);
    }
    const fmt_art_tensor *t = fmt_art_find_tensor(art, "b");
    assert_non_null(t);
    assert_string_equal(t->format, "q8");
    assert_int_equal(t->rows, 3);
    assert_int_equal(t->cols, 5);
    assert_int_equal(t->scales.off, 64);
    assert_int_equal(fmt_art_find_section(art, "blob"), 2);
    if (zstd)
        assert_true(fmt_art_section_at(art, 2)->stored_bytes < BLOB / 4);
    fmt_art_close(art);
}

static void test_artifact_round_trip_raw_and_zstd(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("art");
    char *p1 = tu_fmt("%s/raw.mca", dir), *p2 = tu_fmt("%s/z.mca", dir);
    write_art(p1, FMT_ART_CODEC_RAW, 7);
    write_art(p2, FMT_ART_CODEC_ZSTD, 1000);
    check_contents(p1, 0);
    check_contents(p2, 1);
    assert_true(fmt_art_is_artifact(p1));
    tu_rmtree(dir);
    free(p1);
    free(p2);
    free(dir);
}

static void test_artifact_output_is_byte_identical(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("art");
    for (int codec = 0; codec < 2; codec++) {
        char *p1 = tu_fmt("%s/1.mca", dir), *p2 = tu_fmt("%s/2.mca", dir);
        write_art(p1, (fmt_art_codec)codec, 4096);
        write_art(p2, (fmt_art_codec)codec, 13); /* other write pattern */
        size_t n1, n2;
        uint8_t *b1 = read_bin(p1, &n1), *b2 = read_bin(p2, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(b1, b2, n1);
        free(b1);
        free(b2);
        free(p1);
        free(p2);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_artifact_writer_refuses_short_and_long_data(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("art");
    char *p = tu_fmt("%s/x.mca", dir);
    fmt_art_writer *w;
    mc_error err;
    uint8_t buf[64] = {0};
    json_t *m = json_pack("{s:{}, s:{}, s:{}, s:[]}", "config", "plan",
                          "provenance", "tensors");
    /* short */
    assert_int_equal(fmt_art_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "s", "blob", 64,
                                                FMT_ART_CODEC_RAW, &err), MC_OK);
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, buf, 10, &err), MC_OK);
    assert_int_not_equal(fmt_art_writer_finish(w, &err), MC_OK);
    assert_false(tu_exists(p));
    assert_int_equal(tu_count_entries(dir), 0); /* no temp left */
    /* long */
    assert_int_equal(fmt_art_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "s", "blob", 8,
                                                FMT_ART_CODEC_RAW, &err), MC_OK);
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    assert_int_not_equal(fmt_art_writer_write(w, buf, 9, &err), MC_OK);
    fmt_art_writer_abort(w);
    assert_int_equal(tu_count_entries(dir), 0);
    /* duplicate section */
    assert_int_equal(fmt_art_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "s", "blob", 8,
                                                FMT_ART_CODEC_RAW, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "s", "blob", 8,
                                                FMT_ART_CODEC_RAW, &err),
                     MC_ERR_INVALID_ARG);
    fmt_art_writer_abort(w);
    json_decref(m);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_artifact_rejects_bad_manifest_schema(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("art");
    char *p = tu_fmt("%s/x.mca", dir);
    /* a tensor whose part runs past its section */
    fmt_art_writer *w;
    mc_error err;
    uint8_t buf[16] = {0};
    json_t *m = json_pack("{s:{}, s:{}, s:{}, s:[{s:s, s:s, s:[i], s:i, s:i, "
                          "s:[i,i], s:[i,i], s:[i,i]}]}", "config", "plan",
                          "provenance", "tensors", "name", "t", "format", "f32",
                          "shape", 8, "group", 0, "section", 0, "data", 0, 32,
                          "scales", 0, 0, "zeros", 0, 0);
    assert_int_equal(fmt_art_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "t", "tensor", 16,
                                                FMT_ART_CODEC_RAW, &err), MC_OK);
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, buf, 16, &err), MC_OK);
    assert_int_equal(fmt_art_writer_finish(w, &err), MC_OK);
    fmt_art *a = NULL;
    assert_int_equal(fmt_art_open(p, &a, &err), MC_ERR_FORMAT);
    assert_null(a);
    assert_non_null(strstr(err.message, "outside its section"));
    json_decref(m);
    /* two tensors with one name */
    m = json_pack("{s:{}, s:{}, s:{}, s:[{s:s, s:s, s:[i], s:i, s:i, s:[i,i], "
                  "s:[i,i], s:[i,i]}, {s:s, s:s, s:[i], s:i, s:i, s:[i,i], "
                  "s:[i,i], s:[i,i]}]}", "config", "plan", "provenance",
                  "tensors", "name", "t", "format", "f32", "shape", 4, "group",
                  0, "section", 0, "data", 0, 16, "scales", 0, 0, "zeros", 0, 0,
                  "name", "t", "format", "f32", "shape", 4, "group", 0,
                  "section", 0, "data", 0, 16, "scales", 0, 0, "zeros", 0, 0);
    assert_int_equal(fmt_art_writer_create(p, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "t", "tensor", 16,
                                                FMT_ART_CODEC_RAW, &err), MC_OK);
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, buf, 16, &err), MC_OK);
    assert_int_equal(fmt_art_writer_finish(w, &err), MC_OK);
    assert_int_equal(fmt_art_open(p, &a, &err), MC_ERR_FORMAT);
    assert_non_null(strstr(err.message, "duplicate tensor 't'"));
    json_decref(m);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* Compile a model at quant, raw and compressed: both load as rt_models with
 * byte-identical weights; the output is byte-identical across runs. */
static void compile_pair(const char *model, const char *quant)
{
    char *dir = tu_mkdtemp("artc");
    char *p1 = tu_fmt("%s/a.mca", dir), *p2 = tu_fmt("%s/b.mca", dir),
         *p3 = tu_fmt("%s/c.mca", dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse(quant, 32, &o.req.policy, NULL), MC_OK);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 2;
    o.req.max_seq = 64;
    o.model = model;
    mc_error err;
    cmp_compile_report rep;
    o.out = p1;
    assert_int_equal(cmp_compile(&o, &rep, &err), MC_OK);
    o.out = p3;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    o.out = p2;
    o.compress = 1;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    size_t n1, n3;
    uint8_t *b1 = read_bin(p1, &n1), *b3 = read_bin(p3, &n3);
    assert_int_equal(n1, n3);
    assert_memory_equal(b1, b3, n1);
    free(b1);
    free(b3);

    rt_model *m1 = NULL, *m2 = NULL;
    /* both in rows: the raw file's int8 and int4-sym matrices would be
     * copied into panels at open on an AVX-512 CPU, the compressed one's
     * not (test_pack16 has the panels' logits) */
    setenv("MC_NO_REPACK", "1", 1);
    assert_int_equal(rt_model_open_artifact(p1, &m1, &err), MC_OK);
    assert_int_equal(rt_model_open_artifact(p2, &m2, &err), MC_OK);
    unsetenv("MC_NO_REPACK");
    assert_true(m1->has_plan && m2->has_plan);
    assert_int_equal(m1->plan.layout.arena_bytes, rep.plan.arena_bytes);
    assert_int_equal(m1->plan.layout.limits.max_batch, 2);
    assert_int_equal(m1->plan.layout.limits.max_seq, 64);
    const kn_matrix *e1 = &m1->embed, *e2 = &m2->embed;
    assert_int_equal(e1->fmt, e2->fmt);
    assert_memory_equal(e1->data, e2->data,
                        kn_wformat_data_bytes(e1->fmt, e1->rows, e1->cols));
    for (uint32_t l = 0; l < m1->cfg.num_layers; l++) {
        const kn_matrix *a = &m1->layers[l].w.w_down, *b = &m2->layers[l].w.w_down;
        assert_int_equal(a->fmt, b->fmt);
        assert_memory_equal(a->data, b->data,
                            kn_wformat_data_bytes(a->fmt, a->rows, a->cols));
        uint64_t sb = kn_wformat_scale_bytes(a->fmt, a->rows, a->cols, a->group);
        if (sb)
            assert_memory_equal(a->scales, b->scales, sb);
        assert_memory_equal(m1->layers[l].w.attn_norm, m2->layers[l].w.attn_norm,
                            m1->cfg.hidden_size * sizeof(float));
    }
    /* f32: the embedding is the checkpoint's bytes */
    if (strcmp(quant, "f32") == 0) {
        fmt_model *fm;
        assert_int_equal(fmt_model_open(model, &fm, &err), MC_OK);
        const fmt_st_tensor *t = fmt_model_find(fm, "model.embed_tokens.weight",
                                                NULL);
        assert_non_null(t);
        if (t->dtype == FMT_DT_F32)
            assert_memory_equal(t->data, e1->data, t->nbytes);
        fmt_model_close(fm);
    }
    rt_model_free(m1);
    rt_model_free(m2);
    tu_rmtree(dir);
    free(p1);
    free(p2);
    free(p3);
    free(dir);
}

static void test_artifact_compressed_and_raw_compiles_load_identical(void **s)
{
    (void)s;
    static const char *const q[] = {"f32", "f16", "bf16", "int8", "int4"};
    static const char *const fx[] = {"llama", "mistral", "qwen2",
                                     "llama-bias"};
    for (size_t f = 0; f < 4; f++)
        for (size_t i = 0; i < 5; i++) {
            char *m = tu_fmt("%s/%s", MC_FIXTURE_DIR, fx[f]);
            compile_pair(m, q[i]);
            free(m);
        }
    const char *st = tu_stories_dir();
    if (!st) {
        printf("[  SKIP    ] stories260k absent: fixtures only\n");
        return;
    }
    compile_pair(st, "f32");
    compile_pair(st, "int4");
}

/* stories260k compiled at f32, run from the artifact on its stored plan:
 * the 256 greedy ids of the reference (the library path mrun uses). */
static void test_artifact_stories_f32_reproduces_reference_greedy(void **s)
{
    (void)s;
    const char *st = tu_stories_dir();
    TU_SKIP_IF(!st, "stories260k not in ../shared: end-to-end skipped");
    char *dir = tu_mkdtemp("arts");
    char *art = tu_fmt("%s/s.mca", dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse("f32", 0, &o.req.policy, NULL), MC_OK);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 1;
    o.req.max_seq = 257;
    o.req.kv_type = KN_KV_F32;
    o.req.threads = 1;
    o.model = st;
    o.out = art;
    o.compress = 1;
    mc_error err;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_artifact(art, &m, &err), MC_OK);
    rt_session *sess = NULL;
    assert_int_equal(rt_session_create(m, &m->plan.layout.limits, &m->plan.layout,
                                       &sess, &err), MC_OK);
    int32_t bos = 1, out[256];
    rt_prompt pr = {&bos, 1};
    rt_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new_tokens = 256;
    rt_gen_result res;
    memset(&res, 0, sizeof res);
    res.ids = out;
    assert_int_equal(rt_session_generate(sess, &pr, 1, &gp, &res, &err), MC_OK);
    assert_int_equal(res.n, 256);
    char *refp = tu_fmt("%s/reference/greedy_from_bos.ids", st);
    char *txt = tu_read_file(refp, NULL);
    assert_non_null(txt);
    char *p = txt;
    assert_int_equal(strtol(p, &p, 10), 1);
    for (int i = 0; i < 256; i++) {
        long want = strtol(p, &p, 10);
        if (out[i] != want)
            fail_msg("step %d: artifact run gives %d, reference %ld", i,
                     out[i], want);
    }
    printf("stories260k f32 artifact: 256/256 greedy ids match; arena %llu "
           "bytes, high water %llu\n",
           (unsigned long long)rt_session_layout(sess)->arena_bytes,
           (unsigned long long)rt_session_arena_high_water(sess));
    free(txt);
    free(refp);
    rt_session_free(sess);
    rt_model_free(m);
    tu_rmtree(dir);
    free(art);
    free(dir);
}

/* --lora merges in memory: the artifact's tensors equal those of the
 * model merged to disk by cmp_merge_write and then compiled. */
static void test_artifact_lora_compile_equals_merge_then_compile(void **s)
{
    (void)s;
    static const char *const cases[][2] = {{"qwen2", "qwen2-lm-head"},
                                           {"llama", "llama-dora"},
                                           {"mistral", "mistral-plain"}};
    char *dir = tu_mkdtemp("artl");
    for (size_t c = 0; c < 3; c++) {
        char *base = tu_fmt("%s/%s", MC_FIXTURE_DIR, cases[c][0]);
        char *ad = tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR, cases[c][1]);
        char *merged = tu_fmt("%s/merged%zu", dir, c);
        char *a1 = tu_fmt("%s/l%zu.mca", dir, c), *a2 = tu_fmt("%s/m%zu.mca", dir, c);
        cmp_adapter_spec spec[2] = {{ad, 1.0}, {ad, 0.5}};
        mc_error err;
        fmt_model *fm;
        cmp_merge *mg;
        assert_int_equal(fmt_model_open(base, &fm, &err), MC_OK);
        assert_int_equal(cmp_merge_open(fm, spec, 2, &mg, &err), MC_OK);
        assert_int_equal(cmp_merge_write(mg, merged, FMT_DT_INVALID, NULL, &err),
                         MC_OK);
        cmp_merge_close(mg);
        fmt_model_close(fm);
        cmp_compile_opts o;
        memset(&o, 0, sizeof o);
        cmp_plan_request_default(&o.req);
        assert_int_equal(cmp_wpolicy_parse(c == 1 ? "int4" : "f32", 32,
                                           &o.req.policy, NULL), MC_OK);
        o.req.target_bytes = 1ull << 30;
        o.model = base;
        o.out = a1;
        o.adapters = spec;
        o.n_adapters = 2;
        assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
        o.model = merged;
        o.out = a2;
        o.adapters = NULL;
        o.n_adapters = 0;
        assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
        fmt_art *x, *y;
        assert_int_equal(fmt_art_open(a1, &x, &err), MC_OK);
        assert_int_equal(fmt_art_open(a2, &y, &err), MC_OK);
        assert_int_equal(fmt_art_section_count(x), fmt_art_section_count(y));
        for (size_t i = 0; i < fmt_art_section_count(x); i++) {
            const fmt_art_section *sx = fmt_art_section_at(x, i);
            const fmt_art_section *sy = fmt_art_section_at(y, i);
            assert_string_equal(sx->name, sy->name);
            assert_int_equal(sx->raw_bytes, sy->raw_bytes);
            if (sx->raw_xxh3 != sy->raw_xxh3)
                fail_msg("%s: tensor %s differs between --lora and merge",
                         cases[c][0], sx->name);
        }
        /* provenance records the adapters and their weights */
        json_t *ads = json_object_get(json_object_get(fmt_art_manifest(x),
                                                      "provenance"), "adapters");
        assert_int_equal(json_array_size(ads), 2);
        fmt_art_close(x);
        fmt_art_close(y);
        free(base);
        free(ad);
        free(merged);
        free(a1);
        free(a2);
    }
    tu_rmtree(dir);
    free(dir);
}

/* tokenizer.json beside the model is embedded as section "tokenizer" and
 * handed back by the runtime loader; its checksum is in the provenance.
 * One whose ids do not fit config.json's vocab_size (the real Mistral
 * tokenizer beside the 256-id fixture) is refused, naming both. */
static void test_artifact_embeds_tokenizer(void **s)
{
    (void)s;
    char *dir = tu_mkdtemp("artt");
    char *mdir = tu_fmt("%s/model", dir);
    char *tokp = tu_fmt("%s/tokenizer.json", mdir);
    char *cmd = tu_fmt("mkdir -p '%s' && ln -s '%s/llama/config.json' "
                       "'%s/llama/model.safetensors' '%s'", mdir, MC_FIXTURE_DIR,
                       MC_FIXTURE_DIR, mdir);
    assert_int_equal(system(cmd), 0);
    char *art = tu_fmt("%s/t.mca", dir);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    o.req.target_bytes = 1ull << 30;
    o.model = mdir;
    o.out = art;
    o.compress = 1;
    mc_error err;
    char *mistral = tu_fmt("%s/tokenizers/mistral-7b-instruct-v0.1/"
                           "tokenizer.json", MC_SHARED_DIR);
    if (tu_exists(mistral)) {
        char *ln = tu_fmt("ln -s '%s' '%s'", mistral, tokp);
        assert_int_equal(system(ln), 0);
        free(ln);
        assert_int_equal(cmp_compile(&o, NULL, &err), MC_ERR_SHAPE);
        assert_non_null(strstr(err.file, "tokenizer.json"));
        assert_non_null(strstr(err.message, "vocab_size is 256"));
        assert_false(tu_exists(art));
        assert_int_equal(unlink(tokp), 0);
    } else {
        print_message("[  SKIP    ] the Mistral tokenizer case: no "
                      "../shared/tokenizers\n");
    }
    free(mistral);
    tu_tiny_tokenizer_write(tokp);
    cmp_compile_report rep;
    assert_int_equal(cmp_compile(&o, &rep, &err), MC_OK);
    assert_true(rep.tokenizer);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_artifact(art, &m, &err), MC_OK);
    size_t n = 0, want_n;
    const char *t = rt_artifact_tokenizer(m, &n);
    uint8_t *want = read_bin(tokp, &want_n);
    assert_non_null(t);
    assert_int_equal(n, want_n);
    assert_memory_equal(t, want, n);
    fmt_art *a;
    assert_int_equal(fmt_art_open(art, &a, &err), MC_OK);
    const json_t *in = json_object_get(json_object_get(fmt_art_manifest(a),
                                                       "provenance"), "inputs");
    int found = 0;
    for (size_t i = 0; i < json_array_size(in); i++)
        found |= !strcmp(json_string_value(json_object_get(
                             json_array_get(in, i), "file")), "tokenizer.json");
    assert_true(found);
    fmt_art_close(a);
    rt_model_free(m);
    free(want);
    tu_rmtree(dir);
    free(art);
    free(cmd);
    free(mdir);
    free(dir);
    free(tokp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_artifact_round_trip_raw_and_zstd),
        cmocka_unit_test(test_artifact_output_is_byte_identical),
        cmocka_unit_test(test_artifact_writer_refuses_short_and_long_data),
        cmocka_unit_test(test_artifact_rejects_bad_manifest_schema),
        cmocka_unit_test(test_artifact_compressed_and_raw_compiles_load_identical),
        cmocka_unit_test(test_artifact_stories_f32_reproduces_reference_greedy),
        cmocka_unit_test(test_artifact_lora_compile_equals_merge_then_compile),
        cmocka_unit_test(test_artifact_embeds_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

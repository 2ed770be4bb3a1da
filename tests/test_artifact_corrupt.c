/* test_artifact_corrupt.c - damaged artifacts are rejected: every bit flip
 * anywhere in the file by open + verify, header/manifest/table/trailer
 * damage by the cheap checks of every open, every truncation and extension
 * on open, and section damage by the runtime loader before use. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "rt_artifact.h"
#include "testutil.h"

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

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A small artifact: two tensors and a compressible blob. */
static void write_synthetic(const char *path, fmt_art_codec codec)
{
    uint8_t a[256], b[76], c[6000];
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = (uint8_t)(i * 13 + 1);
    for (size_t i = 0; i < sizeof b; i++)
        b[i] = (uint8_t)(i * 5 + 3);
    for (size_t i = 0; i < sizeof c; i++)
        c[i] = (uint8_t)("corruption "[i % 11]);
    json_t *m = json_pack(
        "{s:{s:s}, s:{s:i}, s:{s:s}, s:[{s:s, s:s, s:[i,i], s:i, s:i, "
        "s:[i,i], s:[i,i], s:[i,i]}, {s:s, s:s, s:[i,i], s:i, s:i, s:[i,i], "
        "s:[i,i], s:[i,i]}]}",
        "config", "model_type", "test", "plan", "max_batch", 1, "provenance",
        "compiler", "test", "tensors", "name", "a", "format", "f32", "shape",
        8, 8, "group", 0, "section", 0, "data", 0, 256, "scales", 0, 0,
        "zeros", 0, 0, "name", "b", "format", "q8", "shape", 3, 5, "group", 0,
        "section", 1, "data", 0, 15, "scales", 64, 12, "zeros", 0, 0);
    fmt_art_writer *w;
    mc_error err;
    assert_int_equal(fmt_art_writer_create(path, &w, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "a", "tensor", sizeof a,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "b", "tensor", sizeof b,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_add_section(w, "blob", "blob", sizeof c,
                                                codec, &err), MC_OK);
    assert_int_equal(fmt_art_writer_begin(w, m, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, a, sizeof a, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, b, sizeof b, &err), MC_OK);
    assert_int_equal(fmt_art_writer_write(w, c, sizeof c, &err), MC_OK);
    assert_int_equal(fmt_art_writer_finish(w, &err), MC_OK);
    json_decref(m);
}

/* 1 if buf (n bytes) is rejected by open or verify; *cheap set when the
 * plain open already rejected it. */
static int rejected(const uint8_t *buf, size_t n, int *cheap)
{
    fmt_art *a = NULL;
    mc_error err;
    *cheap = 0;
    if (fmt_art_open_memory(buf, n, "flip", &a, &err) != MC_OK) {
        *cheap = 1;
        return 1;
    }
    mc_status st = fmt_art_verify(a, NULL, &err);
    fmt_art_close(a);
    return st != MC_OK;
}

typedef struct flip_stats {
    size_t flipped, detected, detected_on_open;
} flip_stats;

/* nflips flips spread evenly over the file (one per stride, random bit and
 * position inside the stride), plus one flip in every byte of the header,
 * manifest, table and trailer. */
static void flip_file(const char *path, size_t nflips, flip_stats *fs)
{
    size_t n;
    uint8_t *orig = read_bin(path, &n);
    assert_non_null(orig);
    uint8_t *buf = malloc(n);
    fmt_art *a;
    mc_error err;
    assert_int_equal(fmt_art_open_memory(orig, n, path, &a, &err), MC_OK);
    size_t mlen;
    fmt_art_manifest_text(a, &mlen);
    size_t meta_end = FMT_ART_HEADER_BYTES + mlen;
    size_t tab = n - FMT_ART_TRAILER_BYTES -
                 FMT_ART_ENTRY_BYTES * fmt_art_section_count(a);
    fmt_art_close(a);
    uint64_t seed = 12345;
    size_t stride = n / nflips ? n / nflips : 1;
    int cheap;
    for (size_t k = 0; k < nflips; k++) {
        size_t pos = (k * stride + rng(&seed) % stride) % n;
        memcpy(buf, orig, n);
        buf[pos] ^= (uint8_t)(1u << (rng(&seed) % 8));
        fs->flipped++;
        if (rejected(buf, n, &cheap))
            fs->detected++;
        else
            fail_msg("flip at byte %zu of %s not detected", pos, path);
        fs->detected_on_open += cheap;
    }
    /* Header, manifest, section table and trailer: a plain open catches
     * them (no section checksum needed). */
    for (size_t pos = 0; pos < n; pos++) {
        if (!(pos < meta_end || pos >= tab))
            continue;
        memcpy(buf, orig, n);
        buf[pos] ^= (uint8_t)(1u << (rng(&seed) % 8));
        fs->flipped++;
        fmt_art *x = NULL;
        if (fmt_art_open_memory(buf, n, "flip", &x, &err) == MC_OK) {
            fmt_art_close(x);
            fail_msg("header/manifest/table flip at byte %zu not detected by "
                     "a plain open", pos);
        }
        fs->detected++;
        fs->detected_on_open++;
    }
    free(buf);
    free(orig);
}

static char *compiled_fixture(const char *dir, const char *name, int compress)
{
    char *out = tu_fmt("%s/%s%s.mca", dir, name, compress ? "-z" : "");
    char *model = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse("int4", 32, &o.req.policy, NULL), MC_OK);
    o.req.target_bytes = 1ull << 30;
    o.req.max_batch = 2;
    o.req.max_seq = 32;
    o.model = model;
    o.out = out;
    o.compress = compress;
    mc_error err;
    assert_int_equal(cmp_compile(&o, NULL, &err), MC_OK);
    free(model);
    return out;
}

static void test_artifact_bit_flips_all_detected(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("corrupt");
    char *p[4] = {tu_fmt("%s/raw.mca", dir), tu_fmt("%s/z.mca", dir),
                  compiled_fixture(dir, "qwen2", 0),
                  compiled_fixture(dir, "mistral", 1)};
    write_synthetic(p[0], FMT_ART_CODEC_RAW);
    write_synthetic(p[1], FMT_ART_CODEC_ZSTD);
    flip_stats fs = {0};
    for (int i = 0; i < 4; i++)
        flip_file(p[i], 600, &fs);
    printf("bit flips: %zu flipped, %zu detected (%zu by the cheap open "
           "checks, %zu by verify)\n", fs.flipped, fs.detected,
           fs.detected_on_open, fs.detected - fs.detected_on_open);
    assert_true(fs.flipped >= 1000);
    assert_int_equal(fs.detected, fs.flipped);
    for (int i = 0; i < 4; i++)
        free(p[i]);
    tu_rmtree(dir);
    free(dir);
}

static void test_artifact_truncations_and_extensions_rejected_on_open(void **s)
{
    (void)s;
    char *dir = tu_mkdtemp("corrupt");
    char *p = tu_fmt("%s/z.mca", dir);
    write_synthetic(p, FMT_ART_CODEC_ZSTD);
    size_t n;
    uint8_t *orig = read_bin(p, &n);
    size_t checked = 0;
    for (size_t len = 0; len < n; len += (len < 256 || n - len < 256) ? 1 : 61) {
        fmt_art *a = NULL;
        mc_error err;
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, orig, len);
        assert_int_not_equal(fmt_art_open_memory(cut, len, "cut", &a, &err),
                             MC_OK);
        assert_null(a);
        free(cut);
        checked++;
    }
    uint8_t *ext = malloc(n + 64);
    memcpy(ext, orig, n);
    memset(ext + n, 0, 64);
    for (size_t extra = 1; extra <= 64; extra++) {
        fmt_art *a = NULL;
        assert_int_not_equal(fmt_art_open_memory(ext, n + extra, "ext", &a,
                                                 NULL), MC_OK);
    }
    printf("truncations rejected: %zu of %zu lengths tried\n", checked,
           checked);
    /* A truncated file on disk is rejected by the runtime loader too. */
    assert_int_equal(tu_write_file(p, orig, n - 1), 0);
    rt_model *m = NULL;
    mc_error err;
    assert_int_not_equal(rt_model_open_artifact(p, &m, &err), MC_OK);
    assert_null(m);
    free(ext);
    free(orig);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* The runtime loader checks every section before use (default), and the
 * header/manifest even when asked not to verify sections. */
static void test_runtime_loader_rejects_damage_before_use(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("corrupt");
    char *p = compiled_fixture(dir, "llama", 0);
    size_t n;
    uint8_t *orig = read_bin(p, &n);
    fmt_art *a;
    mc_error err;
    assert_int_equal(fmt_art_open_memory(orig, n, p, &a, &err), MC_OK);
    uint64_t sec_off = fmt_art_section_at(a, 3)->offset;
    fmt_art_close(a);
    char *bad = tu_fmt("%s/bad.mca", dir);
    uint8_t *buf = malloc(n);
    rt_model *m = NULL;
    /* section byte */
    memcpy(buf, orig, n);
    buf[sec_off + 5] ^= 0x10;
    assert_int_equal(tu_write_file(bad, buf, n), 0);
    assert_int_equal(rt_model_open_artifact(bad, &m, &err), MC_ERR_CHECKSUM);
    assert_null(m);
    assert_non_null(strstr(err.message, "checksum"));
    /* ...which a no-verify load does not look at */
    assert_int_equal(rt_model_open_artifact_ex(bad, RT_ART_NO_VERIFY, &m, &err),
                     MC_OK);
    rt_model_free(m);
    m = NULL;
    /* header and manifest bytes: refused even without verify */
    size_t where[] = {3, 9, 30, 70, 200};
    for (size_t i = 0; i < sizeof where / sizeof where[0]; i++) {
        memcpy(buf, orig, n);
        buf[where[i]] ^= 0x01;
        assert_int_equal(tu_write_file(bad, buf, n), 0);
        assert_int_not_equal(rt_model_open_artifact_ex(bad, RT_ART_NO_VERIFY,
                                                       &m, &err), MC_OK);
        assert_null(m);
    }
    free(buf);
    free(orig);
    free(bad);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* An int4 zero is a 4-bit code; one above 15 (a writer's bug, or a file
 * made to look valid) is refused at open even without the checksum pass:
 * the integer kernels hold q - zero in a signed byte. */
static void test_runtime_loader_rejects_int4_zero_above_15(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("corrupt");
    char *p = compiled_fixture(dir, "llama", 0);
    size_t n;
    uint8_t *buf = read_bin(p, &n);
    fmt_art *a;
    mc_error err;
    assert_int_equal(fmt_art_open_memory(buf, n, p, &a, &err), MC_OK);
    const char *name = "model.layers.0.self_attn.q_proj.weight";
    const fmt_art_tensor *t = fmt_art_find_tensor(a, name);
    assert_non_null(t);
    assert_true(t->zeros.bytes > 0); /* the fixture's int4 is asymmetric */
    size_t at = (size_t)(fmt_art_section_at(a, t->section)->offset +
                         t->zeros.off + t->zeros.bytes - 1);
    fmt_art_close(a);
    buf[at] = 16;
    char *bad = tu_fmt("%s/bad.mca", dir);
    assert_int_equal(tu_write_file(bad, buf, n), 0);
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_artifact_ex(bad, RT_ART_NO_VERIFY, &m, &err),
                     MC_ERR_FORMAT);
    assert_null(m);
    assert_non_null(strstr(err.message, "int4 zero 16"));
    assert_string_equal(err.field, name);
    buf[at] = 15; /* the largest legal code opens */
    assert_int_equal(tu_write_file(bad, buf, n), 0);
    assert_int_equal(rt_model_open_artifact_ex(bad, RT_ART_NO_VERIFY, &m, &err),
                     MC_OK);
    rt_model_free(m);
    free(buf);
    free(bad);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_artifact_bit_flips_all_detected),
        cmocka_unit_test(test_artifact_truncations_and_extensions_rejected_on_open),
        cmocka_unit_test(test_runtime_loader_rejects_damage_before_use),
        cmocka_unit_test(test_runtime_loader_rejects_int4_zero_above_15),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

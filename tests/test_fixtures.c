/*
 * test_fixtures.c - the generated fixture models (fixtures/gen_fixtures.c):
 * deterministic to the byte, loadable by the product's readers, shaped as
 * their config.json says, and numerically alive (logits not flat).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_config.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "ref_forward.h"
#include "testutil.h"

typedef struct expect {
    const char *dir;
    const char *model_type;
    uint32_t hidden, ffn, layers, heads, kv_heads, head_dim, vocab;
    int tied, qkv_bias, o_bias, mlp_bias;
    fmt_dtype dtype;
    fmt_rope_type rope;
    uint32_t window;          /* sliding window of the last layer */
    int shards;               /* 1 = model.safetensors */
} expect;

static const expect FIXTURES[] = {
    {"llama", "llama", 64, 160, 4, 8, 2, 8, 256, 0, 0, 0, 0, FMT_DT_F32,
     FMT_ROPE_DEFAULT, 0, 1},
    {"llama-bf16", "llama", 64, 160, 4, 8, 2, 8, 256, 0, 0, 0, 0, FMT_DT_BF16,
     FMT_ROPE_DEFAULT, 0, 1},
    {"llama-f16", "llama", 64, 160, 4, 8, 2, 8, 256, 0, 0, 0, 0, FMT_DT_F16,
     FMT_ROPE_DEFAULT, 0, 1},
    {"llama-sharded", "llama", 64, 160, 4, 8, 2, 8, 256, 0, 0, 0, 0,
     FMT_DT_F32, FMT_ROPE_DEFAULT, 0, 3},
    {"llama-bias", "llama", 64, 160, 4, 8, 2, 8, 256, 0, 1, 1, 1, FMT_DT_F32,
     FMT_ROPE_DEFAULT, 0, 1},
    {"mistral", "mistral", 64, 128, 3, 4, 2, 16, 256, 0, 0, 0, 0, FMT_DT_F32,
     FMT_ROPE_DEFAULT, 16, 1},
    {"qwen2", "qwen2", 64, 128, 3, 4, 2, 16, 256, 1, 1, 0, 0, FMT_DT_F32,
     FMT_ROPE_DEFAULT, 12, 1},
    {"llama3-rope", "llama", 64, 128, 2, 4, 4, 16, 256, 0, 0, 0, 0,
     FMT_DT_F32, FMT_ROPE_LLAMA3, 0, 1},
    {"llama-yarn", "llama", 64, 128, 2, 4, 4, 16, 256, 0, 0, 0, 0, FMT_DT_F32,
     FMT_ROPE_YARN, 0, 1},
    {"llama-linear", "llama", 64, 128, 2, 4, 4, 16, 256, 0, 0, 0, 0,
     FMT_DT_F32, FMT_ROPE_LINEAR, 0, 1},
    {"llama-dynamic", "llama", 64, 128, 2, 4, 4, 16, 256, 0, 0, 0, 0,
     FMT_DT_F32, FMT_ROPE_DYNAMIC, 0, 1},
};
#define N_FIXTURES (sizeof FIXTURES / sizeof FIXTURES[0])

/* ---- byte-for-byte tree comparison ------------------------------------- */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted entry names of dir (excluding . and ..); *n gets the count. */
static char **list_dir(const char *dir, size_t *n)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t cap = 16;
    char **names = malloc(cap * sizeof *names);
    assert_non_null(names);
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (*n == cap) {
            cap *= 2;
            names = realloc(names, cap * sizeof *names);
            assert_non_null(names);
        }
        names[(*n)++] = tu_fmt("%s", e->d_name);
    }
    closedir(d);
    qsort(names, *n, sizeof *names, cmp_names);
    return names;
}

static unsigned char *read_bin(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long sz = ftell(f);
    assert_true(sz >= 0);
    rewind(f);
    unsigned char *buf = malloc((size_t)sz + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *len = (size_t)sz;
    return buf;
}

/* Assert trees a and b hold the same names and byte-identical files;
 * returns the number of files compared. */
static size_t assert_same_tree(const char *a, const char *b)
{
    size_t na, nb, files = 0;
    char **la = list_dir(a, &na), **lb = list_dir(b, &nb);
    if (na != nb)
        printf("%s has %zu entries, %s has %zu\n", a, na, b, nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
        assert_string_equal(la[i], lb[i]);
        char *pa = tu_fmt("%s/%s", a, la[i]), *pb = tu_fmt("%s/%s", b, lb[i]);
        struct stat sa, sb;
        assert_int_equal(stat(pa, &sa), 0);
        assert_int_equal(stat(pb, &sb), 0);
        assert_int_equal(S_ISDIR(sa.st_mode), S_ISDIR(sb.st_mode));
        if (S_ISDIR(sa.st_mode)) {
            files += assert_same_tree(pa, pb);
        } else {
            size_t la_len, lb_len;
            unsigned char *da = read_bin(pa, &la_len), *db = read_bin(pb, &lb_len);
            if (la_len != lb_len || memcmp(da, db, la_len))
                printf("differs: %s\n", pa);
            assert_int_equal(la_len, lb_len);
            assert_memory_equal(da, db, la_len);
            free(da);
            free(db);
            files++;
        }
        free(pa);
        free(pb);
        free(la[i]);
        free(lb[i]);
    }
    free(la);
    free(lb);
    return files;
}

static void test_fixtures_are_byte_identical_across_runs(void **state)
{
    (void)state;
    char *d1 = tu_mkdtemp("fix1"), *d2 = tu_mkdtemp("fix2");
    /* a nested, not yet existing output dir: the generator creates it */
    char *o1 = tu_fmt("%s/out", d1), *o2 = tu_fmt("%s/out", d2);
    char *c1 = tu_fmt("'%s/gen_fixtures' '%s'", MC_BIN_DIR, o1);
    char *c2 = tu_fmt("'%s/gen_fixtures' '%s'", MC_BIN_DIR, o2);
    /* system(), not tu_run: the generator's stderr goes straight to the
     * test log, and nothing is captured that could hide a failure. */
    int rc = system(c1);
    if (rc)
        printf("%s failed: status %d\n", c1, rc);
    assert_int_equal(rc, 0);
    assert_int_equal(system(c2), 0);
    size_t files = assert_same_tree(o1, o2);
    assert_true(files >= 2 * N_FIXTURES);
    /* every fixture the tests rely on is there */
    for (size_t i = 0; i < N_FIXTURES; i++) {
        char *cfg = tu_fmt("%s/%s/config.json", o1, FIXTURES[i].dir);
        assert_true(tu_exists(cfg));
        free(cfg);
    }
    tu_rmtree(d1);
    tu_rmtree(d2);
    free(o1);
    free(o2);
    free(c1);
    free(c2);
    free(d1);
    free(d2);
}

/* ---- shapes ------------------------------------------------------------ */

/* Assert tensor name exists with shape [rows] (cols 0) or [rows, cols]
 * and dtype dt; count it. */
static void expect_tensor(const fmt_model *m, const char *name, uint64_t rows,
                          uint64_t cols, fmt_dtype dt, size_t *count)
{
    const fmt_st_tensor *t = fmt_model_find(m, name, NULL);
    if (!t)
        printf("missing tensor %s\n", name);
    assert_non_null(t);
    assert_int_equal(t->ndim, cols ? 2 : 1);
    assert_int_equal(t->shape[0], rows);
    if (cols)
        assert_int_equal(t->shape[1], cols);
    assert_int_equal(t->dtype, dt);
    (*count)++;
}

static void check_fixture(const expect *x)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, x->dir);
    fmt_model *m = NULL;
    mc_error err;
    char buf[2048];
    mc_status st = fmt_model_open(dir, &m, &err);
    if (st != MC_OK)
        printf("%s: %s\n", dir, mc_error_format(&err, buf, sizeof buf));
    assert_int_equal(st, MC_OK);
    fmt_model_config c;
    st = fmt_config_load(fmt_model_config_path(m), &c, &err);
    if (st != MC_OK)
        printf("%s: %s\n", dir, mc_error_format(&err, buf, sizeof buf));
    assert_int_equal(st, MC_OK);

    assert_string_equal(c.model_type, x->model_type);
    assert_int_equal(c.hidden_size, x->hidden);
    assert_int_equal(c.intermediate_size, x->ffn);
    assert_int_equal(c.num_layers, x->layers);
    assert_int_equal(c.num_heads, x->heads);
    assert_int_equal(c.num_kv_heads, x->kv_heads);
    assert_int_equal(c.head_dim, x->head_dim);
    assert_int_equal(c.vocab_size, x->vocab);
    assert_int_equal(c.tie_word_embeddings, x->tied);
    assert_int_equal(c.qkv_bias, x->qkv_bias);
    assert_int_equal(c.o_bias, x->o_bias);
    assert_int_equal(c.mlp_bias, x->mlp_bias);
    assert_int_equal(c.torch_dtype, x->dtype);
    assert_int_equal(c.rope.type, x->rope);
    assert_int_equal(fmt_config_layer_window(&c, c.num_layers - 1), x->window);
    assert_int_equal(fmt_model_is_sharded(m), x->shards > 1);
    assert_int_equal(fmt_model_shard_count(m), (size_t)x->shards);

    uint64_t h = c.hidden_size, f = c.intermediate_size;
    uint64_t q = fmt_config_q_dim(&c), kv = fmt_config_kv_dim(&c);
    fmt_dtype dt = x->dtype;
    size_t n = 0;
    expect_tensor(m, "model.embed_tokens.weight", c.vocab_size, h, dt, &n);
    for (uint32_t l = 0; l < c.num_layers; l++) {
        static const char *lin[] = {"self_attn.q_proj", "self_attn.k_proj",
                                    "self_attn.v_proj", "self_attn.o_proj",
                                    "mlp.gate_proj", "mlp.up_proj",
                                    "mlp.down_proj"};
        const uint64_t out[] = {q, kv, kv, h, f, f, h};
        const uint64_t in[] = {h, h, h, q, h, h, f};
        const int bias[] = {c.qkv_bias, c.qkv_bias, c.qkv_bias, c.o_bias,
                            c.mlp_bias, c.mlp_bias, c.mlp_bias};
        char name[128];
        for (size_t j = 0; j < 7; j++) {
            snprintf(name, sizeof name, "model.layers.%u.%s.weight", l, lin[j]);
            expect_tensor(m, name, out[j], in[j], dt, &n);
            snprintf(name, sizeof name, "model.layers.%u.%s.bias", l, lin[j]);
            if (bias[j])
                expect_tensor(m, name, out[j], 0, dt, &n);
            else
                assert_null(fmt_model_find(m, name, NULL));
        }
        snprintf(name, sizeof name, "model.layers.%u.input_layernorm.weight",
                 l);
        expect_tensor(m, name, h, 0, dt, &n);
        snprintf(name, sizeof name,
                 "model.layers.%u.post_attention_layernorm.weight", l);
        expect_tensor(m, name, h, 0, dt, &n);
    }
    expect_tensor(m, "model.norm.weight", h, 0, dt, &n);
    if (c.tie_word_embeddings)
        assert_null(fmt_model_find(m, "lm_head.weight", NULL));
    else
        expect_tensor(m, "lm_head.weight", c.vocab_size, h, dt, &n);
    /* nothing else in the files */
    assert_int_equal(fmt_model_tensor_count(m), n);
    fmt_model_close(m);
    free(dir);
}

static void test_fixtures_have_the_shapes_their_configs_say(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_FIXTURES; i++)
        check_fixture(&FIXTURES[i]);
}

static void test_fixture_configs_carry_rope_and_window_settings(void **state)
{
    (void)state;
    fmt_model_config c;
    char *p = tu_fmt("%s/qwen2/config.json", MC_FIXTURE_DIR);
    assert_int_equal(fmt_config_load(p, &c, NULL), MC_OK);
    free(p);
    /* qwen2: window only on layers >= max_window_layers (1) */
    assert_int_equal(fmt_config_layer_window(&c, 0), 0);
    assert_int_equal(fmt_config_layer_window(&c, 1), 12);
    assert_int_equal(fmt_config_layer_window(&c, 2), 12);

    p = tu_fmt("%s/llama3-rope/config.json", MC_FIXTURE_DIR);
    assert_int_equal(fmt_config_load(p, &c, NULL), MC_OK);
    free(p);
    assert_true(c.rope.factor == 8.0 && c.rope.low_freq_factor == 1.0 &&
                c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_pos, 64);
    assert_int_equal(c.max_position_embeddings, 512);

    p = tu_fmt("%s/llama-yarn/config.json", MC_FIXTURE_DIR);
    assert_int_equal(fmt_config_load(p, &c, NULL), MC_OK);
    free(p);
    assert_true(c.rope.factor == 4.0);
    assert_int_equal(c.rope.original_max_pos, 64);

    p = tu_fmt("%s/llama-linear/config.json", MC_FIXTURE_DIR);
    assert_int_equal(fmt_config_load(p, &c, NULL), MC_OK);
    free(p);
    assert_true(c.rope.factor == 2.0);

    p = tu_fmt("%s/llama-dynamic/config.json", MC_FIXTURE_DIR);
    assert_int_equal(fmt_config_load(p, &c, NULL), MC_OK);
    free(p);
    assert_true(c.rope.factor == 2.0);
    assert_int_equal(c.max_position_embeddings, 64);
}

/* llama-sharded holds llama's bytes; llama-bf16/-f16 hold llama's values
 * rounded once (RNE), so tests can compare dtypes on equal weights. */
static void test_fixture_variants_share_llama_weights(void **state)
{
    (void)state;
    fmt_model *base = NULL, *sh = NULL, *bf = NULL, *hf = NULL;
    char *p0 = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    char *p1 = tu_fmt("%s/llama-sharded", MC_FIXTURE_DIR);
    char *p2 = tu_fmt("%s/llama-bf16", MC_FIXTURE_DIR);
    char *p3 = tu_fmt("%s/llama-f16", MC_FIXTURE_DIR);
    assert_int_equal(fmt_model_open(p0, &base, NULL), MC_OK);
    assert_int_equal(fmt_model_open(p1, &sh, NULL), MC_OK);
    assert_int_equal(fmt_model_open(p2, &bf, NULL), MC_OK);
    assert_int_equal(fmt_model_open(p3, &hf, NULL), MC_OK);
    size_t n = fmt_model_tensor_count(base);
    assert_int_equal(fmt_model_tensor_count(sh), n);
    for (size_t i = 0; i < n; i++) {
        const fmt_st_tensor *t = fmt_model_tensor(base, i, NULL);
        const fmt_st_tensor *ts = fmt_model_find(sh, t->name, NULL);
        const fmt_st_tensor *tb = fmt_model_find(bf, t->name, NULL);
        const fmt_st_tensor *th = fmt_model_find(hf, t->name, NULL);
        assert_non_null(ts);
        assert_non_null(tb);
        assert_non_null(th);
        assert_int_equal(ts->nbytes, t->nbytes);
        assert_memory_equal(ts->data, t->data, t->nbytes);
        const unsigned char *src = t->data, *b = tb->data, *hh = th->data;
        for (uint64_t k = 0; k < t->nelem; k++) {
            float v;
            uint16_t wb, wh;
            memcpy(&v, src + 4 * k, 4);
            memcpy(&wb, b + 2 * k, 2);
            memcpy(&wh, hh + 2 * k, 2);
            assert_int_equal(wb, fmt_f32_to_bf16(v));
            assert_int_equal(wh, fmt_f32_to_f16(v));
        }
    }
    fmt_model_close(base);
    fmt_model_close(sh);
    fmt_model_close(bf);
    fmt_model_close(hf);
    free(p0);
    free(p1);
    free(p2);
    free(p3);
}

/* Random weights can give near-uniform outputs, which would let a broken
 * kernel pass a top-1 or KL test.  Every fixture must give peaked,
 * position-dependent logits. */
static void test_fixture_logits_are_not_flat(void **state)
{
    (void)state;
    for (size_t fi = 0; fi < N_FIXTURES; fi++) {
        char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, FIXTURES[fi].dir);
        tu_ref_model *m = tu_ref_load(dir);
        assert_non_null(m);
        const size_t n = 24, v = tu_ref_vocab(m);
        int32_t ids[24];
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)((i * 89 + 1) % v);
        double *lg = malloc(n * v * sizeof *lg);
        assert_non_null(lg);
        tu_ref_forward(m, ids, n, lg);
        size_t distinct_argmax = 0;
        size_t prev = (size_t)-1;
        double min_std = 1e9, max_p = 0.0;
        for (size_t t = 0; t < n; t++) {
            const double *r = lg + t * v;
            double mean = 0, var = 0, mx = -INFINITY, z = 0;
            for (size_t i = 0; i < v; i++) {
                assert_true(isfinite(r[i]));
                mean += r[i];
                if (r[i] > mx)
                    mx = r[i];
            }
            mean /= (double)v;
            for (size_t i = 0; i < v; i++) {
                var += (r[i] - mean) * (r[i] - mean);
                z += exp(r[i] - mx);
            }
            double sd = sqrt(var / (double)v);
            if (sd < min_std)
                min_std = sd;
            if (1.0 / z > max_p)
                max_p = 1.0 / z;
            size_t a = tu_ref_argmax(r, v);
            distinct_argmax += a != prev;
            prev = a;
        }
        printf("%-14s logit std >= %.2f, top prob <= %.3f, %zu argmax "
               "changes over %zu positions\n",
               FIXTURES[fi].dir, min_std, max_p, distinct_argmax, n);
        assert_true(min_std > 0.5);   /* not flat */
        assert_true(max_p < 0.999);   /* not one-hot either */
        assert_true(distinct_argmax > n / 4);
        free(lg);
        tu_ref_free(m);
        free(dir);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_are_byte_identical_across_runs),
        cmocka_unit_test(test_fixtures_have_the_shapes_their_configs_say),
        cmocka_unit_test(test_fixture_configs_carry_rope_and_window_settings),
        cmocka_unit_test(test_fixture_variants_share_llama_weights),
        cmocka_unit_test(test_fixture_logits_are_not_flat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

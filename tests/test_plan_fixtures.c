/* test_plan_fixtures.c - the planner against the generated fixtures: the
 * tensors it plans are exactly the checkpoint's (names and shapes), its
 * weight bytes equal arithmetic done from the safetensors shapes alone,
 * the compiled artifact holds exactly the planned bytes, and KV bytes per
 * token match 2 x layers x kv_heads x head_dim x element size. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "fmt_model.h"
#include "mc_alloc.h"
#include "testutil.h"

static const char *const QUANTS[] = {"f32", "f16", "bf16", "int8", "int4",
                                     "int4-sym"};
#define NQUANTS (sizeof QUANTS / sizeof QUANTS[0])

/* Bytes of one checkpoint tensor under the documented policy, from its name
 * and safetensors shape only (and whether the model is tied: its
 * embedding is then the output layer, int8 per row with int8/int4). */
static uint64_t policy_bytes(const fmt_st_tensor *t, const char *quant,
                             uint32_t g, int tied)
{
    int q8 = !strcmp(quant, "int8"), q4 = !strncmp(quant, "int4", 4);
    int zero = !strcmp(quant, "int4"); /* int4-sym: no zero per group */
    uint64_t n = t->nelem;
    if (t->ndim == 1) /* norms and biases: f32 */
        return 4 * n;
    uint64_t rows = t->shape[0], cols = t->shape[1];
    int embed = strstr(t->name, "embed_tokens") != NULL;
    int head = strstr(t->name, "lm_head") != NULL;
    uint64_t fbytes = !strcmp(quant, "f32") ? 4 : 2;
    if (embed && tied && (q8 || q4))
        return n + 4 * rows;
    if (embed || (head && !q8 && !q4))
        return fbytes * n;
    if (head || q8)
        return n + 4 * rows;
    if (q4) {
        uint64_t groups = (cols + g - 1) / g;
        return rows * ((cols + 1) / 2) + rows * groups * (2 + zero);
    }
    return fbytes * n;
}

static void check_fixture(const char *name, size_t *checked)
{
    char *dir = tu_fmt("%s/%s", MC_FIXTURE_DIR, name);
    char *cfgp = tu_fmt("%s/config.json", dir);
    if (!tu_exists(cfgp)) {
        free(cfgp);
        free(dir);
        return;
    }
    fmt_model_config cfg;
    mc_error err;
    assert_int_equal(fmt_config_load(cfgp, &cfg, &err), MC_OK);
    fmt_model *fm;
    assert_int_equal(fmt_model_open(dir, &fm, &err), MC_OK);
    char *tmp = tu_mkdtemp("planfx");
    char *art = tu_fmt("%s/a.mca", tmp);
    for (size_t qi = 0; qi < NQUANTS; qi++) {
        const uint32_t g = 64;
        cmp_plan_request r;
        cmp_plan_request_default(&r);
        assert_int_equal(cmp_wpolicy_parse(QUANTS[qi], g, &r.policy, NULL),
                         MC_OK);
        cmp_tensor_plan *tp;
        size_t nt;
        assert_int_equal(cmp_plan_tensors(&cfg, &r.policy, &tp, &nt, &err),
                         MC_OK);
        /* same tensor set as the checkpoint */
        assert_int_equal(nt, fmt_model_tensor_count(fm));
        uint64_t expect = 0;
        for (size_t i = 0; i < nt; i++) {
            const fmt_st_tensor *t = fmt_model_find(fm, tp[i].name, NULL);
            if (!t)
                fail_msg("%s: planned tensor %s not in the checkpoint", name,
                         tp[i].name);
            assert_int_equal(t->ndim, tp[i].ndim);
            assert_int_equal(t->shape[0], tp[i].ndim == 2 ? tp[i].rows
                                                          : tp[i].cols);
            expect += policy_bytes(t, QUANTS[qi], g,
                                   cfg.tie_word_embeddings);
        }
        assert_int_equal(cmp_plan_weight_bytes(tp, nt), expect);
        mc_free(tp);

        /* compile: the artifact holds exactly the planned bytes */
        cmp_compile_opts o;
        memset(&o, 0, sizeof o);
        o.req = r;
        o.req.target_bytes = 1ull << 30;
        o.req.max_batch = 2;
        o.req.max_seq = 16;
        o.model = dir;
        o.out = art;
        cmp_compile_report rep;
        assert_int_equal(cmp_compile(&o, &rep, &err), MC_OK);
        assert_int_equal(rep.weights_bytes, expect);
        assert_int_equal(rep.plan.weights_bytes, expect);
        fmt_art *a;
        assert_int_equal(fmt_art_open(art, &a, &err), MC_OK);
        uint64_t in_file = 0;
        for (size_t i = 0; i < fmt_art_tensor_count(a); i++) {
            const fmt_art_tensor *t = fmt_art_tensor_at(a, i);
            in_file += t->data.bytes + t->scales.bytes + t->zeros.bytes;
        }
        assert_int_equal(in_file, expect);
        fmt_art_close(a);

        /* KV per token */
        uint64_t eb = 2;
        assert_int_equal(rep.plan.kv_bytes_per_token,
                         2ull * cfg.num_layers * cfg.num_kv_heads *
                             cfg.head_dim * eb);
        (*checked)++;
    }
    fmt_model_close(fm);
    tu_rmtree(tmp);
    free(tmp);
    free(art);
    free(cfgp);
    free(dir);
}

static void test_plan_matches_every_fixture(void **state)
{
    (void)state;
    DIR *d = opendir(MC_FIXTURE_DIR);
    assert_non_null(d);
    struct dirent *e;
    char *names[64];
    size_t n = 0;
    while ((e = readdir(d)) && n < 64)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    size_t checked = 0;
    for (size_t i = 0; i < n; i++) {
        check_fixture(names[i], &checked);
        free(names[i]);
    }
    printf("fixture plans checked: %zu (model x quant)\n", checked);
    assert_true(checked >= 5 * 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_matches_every_fixture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

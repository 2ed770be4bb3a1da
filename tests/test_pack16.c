/* test_pack16.c - int4-sym and int8 matrices in 16-row panels (kn_pack16.h): the
 * packing round-trips; every entry point that takes a panel matrix gives
 * the row layout's bits (the integer product at decode and prefill sizes,
 * 1-3 threads, AVX-512 and the scalar fallback; the float path; the row
 * lookup); and an artifact opened with panels (the CPU runtime's default
 * on an AVX-512 CPU) gives the same logits as with MC_NO_REPACK=1, while
 * a zstd-compressed one stays in rows. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_pack16.h"
#include "kn_qdot.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"
#include "tmat.h"

static tu_rng g_rng = {0x9e3779b97f4a7c15ull};

/* A panel copy of t's matrix (malloc'ed, 64-byte aligned) in *p. */
static void *pack(const tu_tmat *t, kn_matrix *p)
{
    assert_true(kn_pack16_ok(&t->m));
    uint64_t n = kn_pack16_bytes(&t->m);
    assert_true(n == kn_wformat_data_bytes(t->m.fmt, t->m.rows, t->m.cols) +
                         kn_wformat_scale_bytes(t->m.fmt, t->m.rows, t->m.cols,
                                                t->m.group));
    void *buf = aligned_alloc(64, (size_t)(n + 63) / 64 * 64);
    assert_non_null(buf);
    kn_pack16(&t->m, buf, p);
    assert_int_equal(p->layout, KN_LAYOUT_P16);
    assert_null(p->scales);
    return buf;
}

static const uint32_t k_shapes[][3] = { /* rows, cols, group */
    {16, 32, 32}, {48, 96, 32}, {64, 576, 32}, {32, 192, 64},
    {80, 256, 128}, {16, 160, 128}, {32, 1536, 32},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

/* The formats that pack, and shape s's matrix of format f (Q8: no group). */
static const kn_wformat k_fmts[] = {KN_W_Q4S, KN_W_Q8};
static tu_tmat make_shape(kn_wformat f, size_t s)
{
    return tu_tmat_make(&g_rng, f, k_shapes[s][0], k_shapes[s][1],
                        f == KN_W_Q8 ? 0 : k_shapes[s][2]);
}

static void test_pack16_round_trips_and_refuses_what_it_cannot_hold(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2 * N_SHAPES; i++) {
        tu_tmat t = make_shape(k_fmts[i / N_SHAPES], i % N_SHAPES);
        kn_matrix p;
        void *buf = pack(&t, &p);
        uint64_t db = kn_wformat_data_bytes(p.fmt, p.rows, p.cols);
        uint64_t sb = kn_wformat_scale_bytes(p.fmt, p.rows, p.cols, p.group);
        uint8_t *back = malloc((size_t)(db + sb));
        assert_non_null(back);
        kn_unpack16(&p, back, back + db);
        assert_memory_equal(back, t.data, (size_t)db);
        assert_memory_equal(back + db, t.scales, (size_t)sb);
        assert_false(kn_pack16_ok(&p)); /* already panels */
        free(back);
        free(buf);
        tu_tmat_free(&t);
    }
    const uint32_t no[][3] = {{40, 64, 32}, {16, 100, 32}, {16, 64, 48}};
    for (size_t s = 0; s < sizeof no / sizeof no[0]; s++) {
        tu_tmat t = tu_tmat_make(&g_rng, KN_W_Q4S, no[s][0], no[s][1], no[s][2]);
        assert_false(kn_pack16_ok(&t.m));
        tu_tmat_free(&t);
        if (no[s][2] != 32)
            continue; /* a group Q8 does not have */
        t = tu_tmat_make(&g_rng, KN_W_Q8, no[s][0], no[s][1], 0);
        assert_false(kn_pack16_ok(&t.m));
        tu_tmat_free(&t);
    }
    tu_tmat a = tu_tmat_make(&g_rng, KN_W_Q4, 16, 64, 32);
    assert_false(kn_pack16_ok(&a.m)); /* int4 with zeros: rows only */
    tu_tmat_free(&a);
}

/* kn_matmul_q on the panels against the reference on the rows, for the
 * decode sizes (T <= 8: the panel kernel), the GEMM's (T > 8: panels
 * filled without a transpose), 1-3 threads, with and without bias. */
static void check_product(const tu_tmat *t, const kn_matrix *p, kn_pool *pool)
{
    static const size_t Ts[] = {1, 2, 3, 5, 8, 9, 13, 64, 131};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        size_t T = Ts[i];
        uint32_t R = t->m.rows, C = t->m.cols;
        float *x = malloc(T * C * sizeof(float));
        const kn_qact_kind kind = kn_qact_kind_of(&t->m);
        void *xq = malloc((size_t)kn_qact_bytes(kind, T, C));
        float *y = malloc(T * R * sizeof(float)), *r = malloc(T * R * sizeof(float));
        float *bias = malloc(R * sizeof(float));
        assert_true(x && xq && y && r && bias);
        tu_rng_fill(&g_rng, x, T * C, 2.0f);
        tu_rng_fill(&g_rng, bias, R, 1.0f);
        kn_ref_qact_quantize(kind, x, T, C, xq);
        for (int b = 0; b < 2; b++) {
            for (size_t k = 0; k < T * R; k++)
                y[k] = NAN; /* every output written */
            kn_ref_matmul_q(&t->m, xq, T, r, b ? bias : NULL);
            kn_matmul_q(pool, p, xq, T, y, b ? bias : NULL);
            if (memcmp(y, r, T * R * sizeof(float)) != 0)
                fail_msg("%s %ux%u g%u T=%zu threads=%d avx512=%d scalar=%d: "
                         "panels differ from the row layout",
                         kn_wformat_name(t->m.fmt), R, C, t->m.group, T, kn_pool_threads(pool),
                         kn_cpu_has_avx512(), kn_force_scalar());
        }
        free(x);
        free(xq);
        free(y);
        free(r);
        free(bias);
    }
}

static void test_pack16_product_bit_identical_to_row_layout(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) {
        kn_set_no_avx512(mode == 1);   /* 1: the scalar fallback for panels */
        kn_set_force_scalar(mode == 2);
        for (int th = 1; th <= 3; th++) {
            kn_pool *pool = kn_pool_create(th);
            assert_non_null(pool);
            for (size_t i = 0; i < 2 * N_SHAPES; i++) {
                tu_tmat t = make_shape(k_fmts[i / N_SHAPES], i % N_SHAPES);
                kn_matrix p;
                void *buf = pack(&t, &p);
                check_product(&t, &p, pool);
                free(buf);
                tu_tmat_free(&t);
            }
            kn_pool_free(pool);
        }
    }
}

/* The float path (kn_matmul: the scalar rows for panels) and the row
 * lookup (kn_matrix_row) read the same weights as the row layout. */
static void test_pack16_float_path_and_row_lookup_match(void **state)
{
    (void)state;
    for (int f = 0; f < 2; f++) {
    tu_tmat t = tu_tmat_make(&g_rng, k_fmts[f], 48, 320, k_fmts[f] == KN_W_Q8 ? 0 : 64);
    kn_matrix p;
    void *buf = pack(&t, &p);
    float *a = malloc(320 * sizeof(float)), *b = malloc(320 * sizeof(float));
    assert_true(a && b);
    for (uint32_t r = 0; r < 48; r++) {
        kn_matrix_row(&t.m, r, a);
        kn_matrix_row(&p, r, b);
        assert_memory_equal(a, b, 320 * sizeof(float));
    }
    const size_t T = 3;
    float *x = malloc(T * 320 * sizeof(float));
    float *y = malloc(T * 48 * sizeof(float)), *z = malloc(T * 48 * sizeof(float));
    assert_true(x && y && z);
    tu_rng_fill(&g_rng, x, T * 320, 1.0f);
    kn_set_force_scalar(1); /* the rows' scalar path: the panels' only one */
    kn_matmul(NULL, &t.m, x, T, y, NULL);
    kn_set_force_scalar(0);
    kn_matmul(NULL, &p, x, T, z, NULL);
    assert_memory_equal(y, z, T * 48 * sizeof(float));
    free(a);
    free(b);
    free(x);
    free(y);
    free(z);
    free(buf);
    tu_tmat_free(&t);
    }
}

/* The llama fixture compiled with `quant` (e.g. "int4-sym --group 32")
 * and `extra` options into dir/name; the path is malloc'ed.  Fails the
 * test if mcompile does. */
static char *compile_fixture(const char *dir, const char *name, const char *quant,
                             const char *extra)
{
    char *art = tu_fmt("%s/%s", dir, name);
    char *cmd = tu_fmt("%s/mcompile %s/llama --target 64MiB --quant %s %s -o %s -q",
                       MC_BIN_DIR, MC_FIXTURE_DIR, quant, extra, art);
    char *out, *err;
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(cmd);
    free(out);
    free(err);
    return art;
}

/* The fixture compiled with `quant`, opened in panels and in rows
 * (MC_NO_REPACK=1): the same logits at the decode kernels' and the
 * GEMM's prompt chunks. */
static void check_artifact(const char *dir, const char *name, const char *quant)
{
    char *art = compile_fixture(dir, name, quant, "");
    enum { N = 40 };
    int32_t ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)(tu_rng_u32(&g_rng) % 256);
    rt_model *pm, *rm;
    mc_error e;
    assert_int_equal(rt_model_open_artifact(art, &pm, &e), MC_OK);
    int packed = pm->layers[0].w.wq.layout == KN_LAYOUT_P16;
    printf("llama fixture %s: %s\n", quant,
           packed ? "opened in 16-row panels"
                  : "opened in rows (no AVX-512 VNNI here: the panels' "
                    "logits are not compared)");
    assert_int_equal(packed, kn_cpu_has_avx512());
    setenv("MC_NO_REPACK", "1", 1);
    assert_int_equal(rt_model_open_artifact(art, &rm, &e), MC_OK);
    unsetenv("MC_NO_REPACK");
    assert_int_equal(rm->layers[0].w.wq.layout, KN_LAYOUT_ROWS);
    /* the float path's callers (`mcompile eval`) ask for rows */
    rt_model *fm;
    assert_int_equal(rt_model_open_artifact_ex(art, RT_ART_ROWS, &fm, &e), MC_OK);
    assert_int_equal(fm->layers[0].w.wq.layout, KN_LAYOUT_ROWS);
    assert_int_equal(fm->embed.layout, KN_LAYOUT_ROWS);
    rt_model_free(fm);
    uint32_t V = pm->cfg.vocab_size;
    for (int c = 0; c < 2; c++) {
        uint32_t chunk = c ? 64 : 4;
        /* 4: the decode kernels; 64: the GEMM */
        float *a = tu_prompt_logits(pm, ids, N, chunk);
        float *b = tu_prompt_logits(rm, ids, N, chunk);
        assert_memory_equal(a, b, (size_t)N * V * sizeof(float));
        free(a);
        free(b);
    }
    rt_model_free(pm);
    rt_model_free(rm);
    free(art);
}

static void test_pack16_artifact_logits_match_row_layout(void **state)
{
    (void)state;
    char *tmp = tu_mkdtemp("pack16");
    check_artifact(tmp, "s.mca", "int4-sym --group 32");
    check_artifact(tmp, "q8.mca", "int8");
    /* zstd sections live on the heap, which cannot be given back piece by
     * piece: those matrices stay in rows (the weights held once) */
    char *zart = compile_fixture(tmp, "z.mca", "int4-sym --group 32", "--compress");
    rt_model *zm;
    mc_error e;
    assert_int_equal(rt_model_open_artifact(zart, &zm, &e), MC_OK);
    assert_int_equal(zm->layers[0].w.wq.layout, KN_LAYOUT_ROWS);
    rt_model_free(zm);
    free(zart);
    tu_rmtree(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_pack16_round_trips_and_refuses_what_it_cannot_hold, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_pack16_product_bit_identical_to_row_layout, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_pack16_float_path_and_row_lookup_match, tu_reset_kernel_switches),
        cmocka_unit_test_teardown(test_pack16_artifact_logits_match_row_layout, tu_reset_kernel_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_cuda_ops.c - every CUDA op of kernels/cuda/kn_cuda.h against the CPU
 * reference of kn_ops.h by normalized error.  Skips (saying so) when built
 * without CUDA or when no device is present; the argument checks, which
 * never reach the driver, run whenever CUDA is built. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_ops.h"
#include "testutil.h"

#ifdef MC_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kn_cuda.h"

static tu_rng g_rng = {0x853c49e6748fea9bull};

static void skip_without_device(void)
{
    int n = 0;
    assert_int_equal(kn_cuda_device_count(&n), MC_OK);
    TU_SKIP_IF(n == 0, "no CUDA device");
}

/* Device copy of n bytes of host (NULL host: uninitialized). */
static void *up(const void *host, size_t n)
{
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, n ? n : 1), cudaSuccess);
    if (host && n)
        assert_int_equal(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}
static void down(void *host, const void *dev, size_t n)
{
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

static void test_cuda_rmsnorm_matches_cpu_reference(void **state)
{
    (void)state;
    skip_without_device();
    size_t T = 3, n = 1001;
    float *x = malloc(T * n * 4), *w = malloc(n * 4), *r = malloc(T * n * 4),
          *o = malloc(T * n * 4);
    tu_rng_fill(&g_rng, x, T * n, 2.0f);
    tu_rng_fill(&g_rng, w, n, 1.0f);
    kn_ref_rmsnorm(r, x, w, T, n, 1e-6f);
    float *dx = up(x, T * n * 4), *dw = up(w, n * 4);
    assert_int_equal(kn_cuda_rmsnorm(dx, dx, dw, T, n, 1e-6f, NULL), MC_OK);
    down(o, dx, T * n * 4);
    assert_true(tu_norm_err(o, r, T * n) < 1e-5);
    cudaFree(dx), cudaFree(dw);
    free(x), free(w), free(r), free(o);
}

static void test_cuda_rope_matches_cpu_reference(void **state)
{
    (void)state;
    skip_without_device();
    uint32_t hd = 128, nh = 4;
    size_t T = 5, n = T * nh * hd;
    float inv[64], sc;
    kn_rope_init(4, 500000.0, 8.0, 1.0, 4.0, 8192, 0, 0, 0, hd, 0, inv, &sc);
    kn_rope r = { hd, inv, sc };
    int64_t pos[5] = { 0, 1, 100, 8191, 70000 };
    float *x = malloc(n * 4), *ref = malloc(n * 4), *o = malloc(n * 4);
    tu_rng_fill(&g_rng, x, n, 1.0f);
    memcpy(ref, x, n * 4);
    kn_ref_rope_apply(&r, ref, T, nh, pos);
    float *dx = up(x, n * 4), *dinv = up(inv, sizeof inv);
    int64_t *dpos = up(pos, sizeof pos);
    assert_int_equal(kn_cuda_rope_apply(dx, dinv, sc, hd, T, nh, dpos, NULL), MC_OK);
    down(o, dx, n * 4);
    assert_true(tu_norm_err(o, ref, n) < 1e-5);
    cudaFree(dx), cudaFree(dinv), cudaFree(dpos);
    free(x), free(ref), free(o);
}

static void test_cuda_silu_mul_and_softmax_match_cpu_reference(void **state)
{
    (void)state;
    skip_without_device();
    size_t n = 32003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *r = malloc(n * 4), *o = malloc(n * 4);
    tu_rng_fill(&g_rng, g, n, 10.0f);
    tu_rng_fill(&g_rng, u, n, 1.0f);
    memcpy(r, g, n * 4);
    kn_ref_silu_mul(r, u, n);
    float *dg = up(g, n * 4), *du = up(u, n * 4);
    assert_int_equal(kn_cuda_silu_mul(dg, du, n, NULL), MC_OK);
    down(o, dg, n * 4);
    assert_true(tu_norm_err(o, r, n) < 1e-5);
    /* softmax: two rows of n/2 (CPU kn_softmax per row) */
    size_t h = n / 2;
    memcpy(r, g, n * 4);
    kn_set_force_scalar(1);
    kn_softmax(r, h);
    kn_softmax(r + h, h);
    kn_set_force_scalar(0);
    assert_int_equal(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(kn_cuda_softmax(dg, 2, h, NULL), MC_OK);
    down(o, dg, 2 * h * 4);
    assert_true(tu_norm_err(o, r, 2 * h) < 1e-5);
    cudaFree(dg), cudaFree(du);
    free(g), free(u), free(r), free(o);
}

static void test_cuda_argmax_matches_cpu_first_of_ties(void **state)
{
    (void)state;
    skip_without_device();
    size_t n = 50000;
    float *x = malloc(n * 4);
    tu_rng_fill(&g_rng, x, n, 5.0f);
    x[777] = 9.0f;
    x[40000] = 9.0f; /* tie: the first wins */
    float *dx = up(x, n * 4);
    uint32_t *di = up(NULL, 4), idx = 0;
    assert_int_equal(kn_cuda_argmax(dx, n, di, NULL), MC_OK);
    down(&idx, di, 4);
    assert_int_equal(idx, kn_argmax(x, n));
    assert_int_equal(idx, 777);
    cudaFree(dx), cudaFree(di);
    free(x);
}

/* A random matrix of format f on the host and its device twin. */
typedef struct cmat {
    kn_matrix h, d;
    void *hd, *hs, *hz;
} cmat;

static cmat cmat_make(kn_wformat f, uint32_t rows, uint32_t cols, uint32_t g)
{
    cmat m;
    memset(&m, 0, sizeof m);
    size_t db = kn_wformat_data_bytes(f, rows, cols);
    size_t sb = kn_wformat_scale_bytes(f, rows, cols, g);
    size_t zb = kn_wformat_zero_bytes(f, rows, cols, g);
    m.hd = malloc(db);
    m.hs = sb ? malloc(sb) : NULL;
    m.hz = zb ? malloc(zb) : NULL;
    size_t n = (size_t)rows * cols;
    switch (f) {
    case KN_W_F32: tu_rng_fill(&g_rng, m.hd, n, 1.0f); break;
    case KN_W_F16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)m.hd)[i] = fmt_f32_to_f16(tu_rng_f(&g_rng));
        break;
    case KN_W_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)m.hd)[i] = fmt_f32_to_bf16(tu_rng_f(&g_rng));
        break;
    case KN_W_Q8:
        for (size_t i = 0; i < n; i++)
            ((int8_t *)m.hd)[i] = (int8_t)((int)(tu_rng_u32(&g_rng) % 255) - 127);
        for (uint32_t r = 0; r < rows; r++)
            ((float *)m.hs)[r] = 0.01f;
        break;
    default: {
        uint64_t rb = kn_q4_row_bytes(cols);
        for (size_t i = 0; i < db; i++)
            ((uint8_t *)m.hd)[i] = (uint8_t)tu_rng_u32(&g_rng);
        if (cols & 1)
            for (uint32_t r = 0; r < rows; r++)
                ((uint8_t *)m.hd)[r * rb + rb - 1] &= 0x0f;
        for (size_t i = 0; i < sb / 2; i++)
            ((uint16_t *)m.hs)[i] = fmt_f32_to_f16(0.02f + 0.03f * (tu_rng_f(&g_rng) + 1.0f));
        for (size_t i = 0; i < zb; i++)
            ((uint8_t *)m.hz)[i] = (uint8_t)(tu_rng_u32(&g_rng) % 16);
        break;
    }
    }
    kn_matrix k = { f, rows, cols, m.hd, m.hs, m.hz,
                    (f == KN_W_Q4 || f == KN_W_Q4S) ? g : 0, KN_LAYOUT_ROWS };
    m.h = k;
    m.d = k;
    m.d.data = up(m.hd, db);
    m.d.scales = sb ? up(m.hs, sb) : NULL;
    m.d.zeros = zb ? up(m.hz, zb) : NULL;
    return m;
}

static void cmat_free(cmat *m)
{
    cudaFree((void *)m->d.data);
    cudaFree((void *)m->d.scales);
    cudaFree((void *)m->d.zeros);
    free(m->hd), free(m->hs), free(m->hz);
}

static void check_cuda_matmul(kn_wformat f, uint32_t rows, uint32_t cols,
                              uint32_t g, size_t T, int gemm, double tol)
{
    cmat m = cmat_make(f, rows, cols, g);
    float *x = malloc(T * cols * 4), *b = malloc(rows * 4);
    float *r = malloc(T * rows * 4), *o = malloc(T * rows * 4);
    tu_rng_fill(&g_rng, x, T * cols, 1.0f);
    tu_rng_fill(&g_rng, b, rows, 1.0f);
    kn_ref_matmul(&m.h, x, T, r, b);
    float *dx = up(x, T * cols * 4), *db = up(b, rows * 4), *dy = up(NULL, T * rows * 4);
    if (gemm) {
        cublasHandle_t blas = NULL;
        assert_int_equal(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
        uint64_t wb = kn_cuda_gemm_work_bytes(&m.h, T);
        void *work = up(NULL, wb);
        assert_int_equal(kn_cuda_gemm((kn_cublas)blas, &m.d, dx, T, dy, db, work, wb, NULL), MC_OK);
        down(o, dy, T * rows * 4);
        cudaFree(work);
        cublasDestroy(blas);
    } else {
        assert_int_equal(kn_cuda_matvec(&m.d, dx, T, dy, db, NULL), MC_OK);
        down(o, dy, T * rows * 4);
    }
    double e = tu_norm_err(o, r, T * rows);
    if (!(e < tol))
        fprintf(stderr, "%s fmt %d %ux%u g%u T=%zu: %g\n", gemm ? "gemm" : "matvec",
                f, rows, cols, g, T, e);
    assert_true(e < tol);
    cudaFree(dx), cudaFree(db), cudaFree(dy);
    free(x), free(b), free(r), free(o);
    cmat_free(&m);
}

static void test_cuda_matvec_matches_cpu_reference_all_formats(void **state)
{
    (void)state;
    skip_without_device();
    static const size_t Ts[] = { 1, 3, 8 };
    for (int f = 0; f < KN_W_COUNT_; f++)
        for (int ti = 0; ti < 3; ti++) {
            check_cuda_matmul((kn_wformat)f, 37, 172, 32, Ts[ti], 0, 1e-5);
            check_cuda_matmul((kn_wformat)f, 64, 171, 64, Ts[ti], 0, 1e-5);
            check_cuda_matmul((kn_wformat)f, 5, 1000, 128, Ts[ti], 0, 1e-5);
        }
}

static void test_cuda_gemm_matches_cpu_reference_all_formats(void **state)
{
    (void)state;
    skip_without_device();
    /* f16 inputs: error of f16 rounding of W and X, ~1e-3 */
    for (int f = 0; f < KN_W_COUNT_; f++) {
        check_cuda_matmul((kn_wformat)f, 96, 172, 32, 17, 1, 3e-3);
        check_cuda_matmul((kn_wformat)f, 130, 257, 128, 64, 1, 3e-3);
    }
}

static void check_cuda_attention(kn_kvtype type, uint32_t nh, uint32_t nkv,
                                 uint32_t hd, uint64_t cap, uint64_t window,
                                 int64_t pos0, size_t T)
{
    size_t w = (size_t)nkv * hd, es = type == KN_KV_F32 ? 4 : type == KN_KV_F16 ? 2 : 1;
    kn_kv kv = { type, nkv, hd, cap, malloc(cap * w * es), malloc(cap * w * es),
                 type == KN_KV_I8 ? malloc(cap * nkv * 4) : NULL,
                 type == KN_KV_I8 ? malloc(cap * nkv * 4) : NULL };
    float *k = malloc(w * 4), *v = malloc(w * 4);
    for (int64_t p = 0; p < pos0 + (int64_t)T; p++) {
        tu_rng_fill(&g_rng, k, w, 2.0f);
        tu_rng_fill(&g_rng, v, w, 1.0f);
        kn_kv_store(&kv, p, k, v);
    }
    size_t qn = T * nh * hd;
    float *q = malloc(qn * 4), *r = malloc(qn * 4), *o = malloc(qn * 4);
    float *scr = malloc(kn_attention_scratch_floats(1, pos0 + T, hd) * 4);
    tu_rng_fill(&g_rng, q, qn, 1.0f);
    kn_ref_attention(&kv, q, T, nh, pos0, window, r, scr);
    kn_kv dkv = kv;
    dkv.k = up(kv.k, cap * w * es);
    dkv.v = up(kv.v, cap * w * es);
    if (type == KN_KV_I8) {
        dkv.k_scale = up(kv.k_scale, cap * nkv * 4);
        dkv.v_scale = up(kv.v_scale, cap * nkv * 4);
    }
    float *dq = up(q, qn * 4), *dout = up(NULL, qn * 4);
    assert_int_equal(kn_cuda_attention(&dkv, dq, T, nh, pos0, window, dout, NULL), MC_OK);
    down(o, dout, qn * 4);
    double e = tu_norm_err(o, r, qn);
    if (!(e < 1e-5))
        fprintf(stderr, "cuda attention type %d: %g\n", type, e);
    assert_true(e < 1e-5);
    cudaFree(dkv.k), cudaFree(dkv.v), cudaFree(dkv.k_scale), cudaFree(dkv.v_scale);
    cudaFree(dq), cudaFree(dout);
    free(kv.k), free(kv.v), free(kv.k_scale), free(kv.v_scale);
    free(k), free(v), free(q), free(r), free(o), free(scr);
}

static void test_cuda_attention_matches_cpu_reference(void **state)
{
    (void)state;
    skip_without_device();
    check_cuda_attention(KN_KV_F32, 8, 2, 64, 64, 0, 0, 17);   /* prefill, GQA */
    check_cuda_attention(KN_KV_F32, 4, 4, 13, 64, 0, 30, 1);   /* odd head_dim */
    check_cuda_attention(KN_KV_F16, 4, 2, 128, 10, 8, 20, 3);  /* window, ring */
    check_cuda_attention(KN_KV_I8, 4, 1, 256, 64, 0, 40, 5);   /* MQA, I8 */
}

static void test_cuda_entries_reject_bad_arguments(void **state)
{
    (void)state;
    /* None of these reach the driver, so they run without a device. */
    int n = -1;
    assert_int_equal(kn_cuda_device_count(&n), MC_OK);
    assert_true(n >= 0);
    assert_int_equal(kn_cuda_device_count(NULL), MC_ERR_INVALID_ARG);
    float dummy[4];
    kn_matrix m = { KN_W_Q4, 4, 4, dummy, dummy, NULL, 0, KN_LAYOUT_ROWS };
    assert_int_equal(kn_cuda_matvec(&m, dummy, 1, dummy, NULL, NULL),
                     MC_ERR_INVALID_ARG); /* group 0 */
    m.group = 32;
    assert_int_equal(kn_cuda_matvec(&m, dummy, KN_CUDA_MATVEC_MAX_T + 1, dummy,
                                    NULL, NULL), MC_ERR_INVALID_ARG);
    kn_kv kv = { KN_KV_F32, 2, KN_CUDA_ATT_MAX_HEAD_DIM + 1, 4, dummy, dummy,
                 NULL, NULL };
    assert_int_equal(kn_cuda_attention(&kv, dummy, 1, 2, 0, 0, dummy, NULL),
                     MC_ERR_INVALID_ARG);
    kv.head_dim = 4;
    assert_int_equal(kn_cuda_attention(&kv, dummy, 1, 3, 0, 0, dummy, NULL),
                     MC_ERR_INVALID_ARG); /* 3 heads over 2 KV heads */
    assert_int_equal(kn_cuda_argmax(dummy, 0, NULL, NULL), MC_ERR_INVALID_ARG);
    assert_int_equal(kn_cuda_gemm(NULL, &m, dummy, 1, dummy, NULL, dummy, 0, NULL),
                     MC_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_entries_reject_bad_arguments),
        cmocka_unit_test(test_cuda_rmsnorm_matches_cpu_reference),
        cmocka_unit_test(test_cuda_rope_matches_cpu_reference),
        cmocka_unit_test(test_cuda_silu_mul_and_softmax_match_cpu_reference),
        cmocka_unit_test(test_cuda_argmax_matches_cpu_first_of_ties),
        cmocka_unit_test(test_cuda_matvec_matches_cpu_reference_all_formats),
        cmocka_unit_test(test_cuda_gemm_matches_cpu_reference_all_formats),
        cmocka_unit_test(test_cuda_attention_matches_cpu_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* !MC_HAVE_CUDA */

static void test_cuda_ops_skipped_without_cuda_build(void **state)
{
    (void)state;
    TU_SKIP_IF(1, "built without CUDA (MC_HAVE_CUDA undefined): no CUDA device");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_ops_skipped_without_cuda_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif

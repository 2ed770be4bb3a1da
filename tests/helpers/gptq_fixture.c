/* gptq_fixture.c - see gptq_fixture.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gptq_fixture.h"

static uint64_t rs = 0xfeed1234;
float tu_gq_urand(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) & 0xFFFFFF) / 16777216.0f;
}
float tu_gq_nrand(void)
{
    float u = tu_gq_urand() + 1e-7f, v = tu_gq_urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

void tu_gq_qm_init(tu_gq_qm *m, kn_wformat f, uint32_t rows, uint32_t cols,
                   uint32_t group)
{
    memset(m, 0, sizeof *m);
    m->data = calloc(1, kn_wformat_data_bytes(f, rows, cols));
    m->scales = calloc(1, kn_wformat_scale_bytes(f, rows, cols, group));
    size_t zb = kn_wformat_zero_bytes(f, rows, cols, group);
    m->zeros = zb ? calloc(1, zb) : NULL;
    m->b = (cmp_qbuf){f, rows, cols, f == KN_W_Q8 ? 0 : group, m->data,
                      m->scales, m->zeros};
}
void tu_gq_qm_free(tu_gq_qm *m)
{
    free(m->data);
    free(m->scales);
    free(m->zeros);
}

float *tu_gq_correlated_inputs(size_t T, uint32_t cols)
{
    float *M = malloc((size_t)cols * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)cols * cols; i++)
        M[i] = tu_gq_nrand() / sqrtf((float)cols);
    for (uint32_t i = 0; i < cols; i++)
        M[i * cols + i] += 1.0f;
    float *X = malloc(T * cols * sizeof(float));
    float *z = malloc(cols * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        for (uint32_t i = 0; i < cols; i++)
            z[i] = tu_gq_nrand();
        for (uint32_t j = 0; j < cols; j++) {
            double s = 0.0;
            for (uint32_t i = 0; i < cols; i++)
                s += z[i] * M[i * cols + j];
            X[t * cols + j] = (float)s * (1.0f + 3.0f * (float)(j % 7 == 0));
        }
    }
    free(M);
    free(z);
    return X;
}

float *tu_gq_rand_w(uint32_t rows, uint32_t cols)
{
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = tu_gq_nrand() * 0.05f;
    return w;
}

void tu_gq_hessian_of(cmp_hessian *h, const float *X, size_t T, uint32_t cols)
{
    assert_int_equal(cmp_hessian_init(h, cols, NULL), MC_OK);
    cmp_hessian_add(h, X, T);
}

/* kn_qdot.c - integer dot products (see kn_qdot.h): the switch, the
 * activation quantization, the scalar reference of the canonical
 * arithmetic, and the dispatching entry point. */
#include "kn_qdot.h"
#include "kn_steal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kn_gemm.h"
#include "kn_internal.h"

static atomic_int g_float_dot = -1; /* -1: not read from the environment yet */

int kn_float_dot(void)
{
    int v = atomic_load_explicit(&g_float_dot, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("MC_FLOAT_DOT");
        v = e && *e && *e != '0';
        atomic_store_explicit(&g_float_dot, v, memory_order_relaxed);
    }
    return v;
}

void kn_set_float_dot(int on)
{
    atomic_store(&g_float_dot, on ? 1 : 0);
}

int kn_qdot_supported(const kn_matrix *W)
{
    switch (W->fmt) {
    case KN_W_Q8: return 1;
    case KN_W_Q4: case KN_W_Q4S:
        /* a power of two: the AVX2 kernels find a block's group by a
         * shift (a group of 96 passed here once and got wrong scales) */
        return W->group >= KN_QK && (W->group & (W->group - 1)) == 0;
    default: return 0;
    }
}

/* ---- activations ------------------------------------------------------------ */

void kn_qact_block(const float *x, uint32_t n, int i16, void *q, float *d)
{
    float qmax = i16 ? 32767.0f : 127.0f;
    float amax = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float db = amax / qmax, id = db != 0.0f ? 1.0f / db : 0.0f;
    for (uint32_t i = 0; i < KN_QK; i++) {
        float v = i < n ? nearbyintf(x[i] * id) : 0.0f;
        /* Non-finite inputs give the most negative code, as
         * _mm256_cvtps_epi32 and the saturating packs do. */
        int qi = v >= -qmax && v <= qmax ? (int)v : -(int)qmax - 1;
        if (i16)
            ((int16_t *)q)[i] = (int16_t)qi;
        else /* nibble order (kn_qdot.h): even columns, then odd ones */
            ((int8_t *)q)[kn_qact_i8_pos(i)] = (int8_t)qi;
    }
    *d = db;
}

/* Bytes of the integers of one block. */
static size_t qblock_bytes(kn_qact_kind k)
{
    return k == KN_QACT_I16 ? 2 * KN_QK : KN_QK;
}

/* Rows [t0, t1) of kn_qact_quantize's T-row buffer. */
static void qact_rows(kn_qact_kind k, const float *X, size_t T, uint32_t cols,
                      void *buf, size_t t0, size_t t1, int avx2)
{
    uint32_t nb = kn_qact_blocks(cols);
    size_t qb = qblock_bytes(k);
    uint8_t *q = buf;
    float *d = (float *)(q + T * nb * qb);
    for (size_t t = t0; t < t1; t++) {
        if (avx2) {
            kn_avx2_qact_quantize_row(X + t * cols, cols, k == KN_QACT_I16,
                                      q + t * nb * qb, d + t * nb);
            continue;
        }
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t c0 = b * KN_QK, n = cols - c0 < KN_QK ? cols - c0 : KN_QK;
            kn_qact_block(X + t * cols + c0, n, k == KN_QACT_I16,
                          q + (t * nb + b) * qb, d + t * nb + b);
        }
    }
}

void kn_ref_qact_quantize(kn_qact_kind k, const float *X, size_t T,
                          uint32_t cols, void *buf)
{
    qact_rows(k, X, T, cols, buf, 0, T, 0);
}

void kn_qact_quantize(kn_qact_kind k, const float *X, size_t T, uint32_t cols,
                      void *buf)
{
    qact_rows(k, X, T, cols, buf, 0, T, !kn_force_scalar() && kn_cpu_has_avx2());
}

typedef struct qact_job {
    kn_qact_kind k;
    const float *X;
    size_t T;
    uint32_t cols;
    void *buf;
    int avx2;
} qact_job;

static void qact_job_rows(void *c, size_t t0, size_t t1)
{
    const qact_job *j = c;
    qact_rows(j->k, j->X, j->T, j->cols, j->buf, t0, t1, j->avx2);
}

void kn_qact_quantize_pool(kn_pool *pool, kn_qact_kind k, const float *X,
                           size_t T, uint32_t cols, void *buf)
{
    qact_job j = {k, X, T, cols, buf, !kn_force_scalar() && kn_cpu_has_avx2()};
    kn_pool_rows(pool, T, kn_pool_min_values() / (cols ? cols : 1) + 1,
                 qact_job_rows, &j);
}

/* ---- the product ------------------------------------------------------------- */

/* W[r] . one quantized row (qrow: [nb * 32] of its kind, drow: [nb]),
 * canonical arithmetic (block sums), without the bias. */
static float qdot_one(const kn_matrix *W, uint32_t r, const uint8_t *qrow,
                      const float *drow)
{
    uint32_t nb = kn_qact_blocks(W->cols);
    size_t qb = qblock_bytes(kn_qact_kind_of(W));
    float acc = 0.0f;
    for (uint32_t b = 0; b < nb; b++) {
        int32_t lane[8], ib = 0;
        kn_qdot_lanes(W, r, b, qrow + b * qb, lane);
        for (int l = 0; l < 8; l++)
            ib += lane[l]; /* exact: |ib| < 2^27 */
        acc = fmaf((float)ib, kn_qdot_scale(W, r, b, drow[b]), acc);
    }
    return W->fmt == KN_W_Q8 ? acc * kn_q8_scale(W, r) : acc;
}

void kn_ref_matmul_q(const kn_matrix *W, const void *Xq, size_t T, float *Y,
                     const float *bias)
{
    uint32_t nb = kn_qact_blocks(W->cols);
    size_t qb = qblock_bytes(kn_qact_kind_of(W));
    const uint8_t *q = Xq;
    const float *d = (const float *)(q + T * nb * qb);
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = 0; r < W->rows; r++)
            Y[t * W->rows + r] = (bias ? bias[r] : 0.0f) +
                                 qdot_one(W, r, q + t * nb * qb, d + t * nb);
}

typedef struct kn_mq_ctx {
    const kn_matrix *W;
    const uint8_t *q;     /* [T][nb * 32] of the matrix's kind */
    const float *d;       /* [T][nb] */
    size_t T;
    float *Y;             /* [T][rows] */
    const float *bias;    /* [rows] or NULL */
    int avx2;
    int avx512;
    kn_steal *steal;      /* decode: rows shared with stealing (kn_steal.h);
                             NULL: kn_task_rows' static shares */
} kn_mq_ctx;

void kn_ref_matmul_q_rows(const kn_matrix *W, const uint8_t *xq,
                          const float *xd, size_t T, float *Y, uint32_t r0,
                          uint32_t r1)
{
    uint32_t nb = kn_qact_blocks(W->cols);
    size_t qb = qblock_bytes(kn_qact_kind_of(W));
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = r0; r < r1; r++)
            Y[t * W->rows + r] += qdot_one(W, r, xq + t * nb * qb, xd + t * nb);
}

/* Rows [r0, r1) of c's product (Y there holds bias or 0). */
static void mq_rows(const kn_mq_ctx *c, uint32_t r0, uint32_t r1)
{
    if (c->avx512 && c->T > KN_GEMM_MIN_T)
        kn_avx512_gemm_q_rows(c->W, c->q, c->d, c->T, c->Y, r0, r1);
    else if (c->avx512 && kn_avx512_matmul_q_dec_ok(c->W, c->T))
        kn_avx512_matmul_q_dec(c->W, c->q, c->d, c->T, c->Y, r0, r1);
    else if (c->W->layout != KN_LAYOUT_ROWS) /* panels: AVX-512 or scalar */
        kn_ref_matmul_q_rows(c->W, c->q, c->d, c->T, c->Y, r0, r1);
    else if (c->avx2 && c->T > KN_GEMM_MIN_T)
        kn_gemm_q_rows(c->W, c->q, c->d, c->T, c->Y, r0, r1);
    else if (c->avx2)
        kn_avx2_matmul_q_rows(c->W, c->q, c->d, c->T, c->Y, r0, r1);
    else
        kn_ref_matmul_q_rows(c->W, c->q, c->d, c->T, c->Y, r0, r1);
}

static void mq_task(void *vctx, int tid, int nth)
{
    const kn_mq_ctx *c = vctx;
    uint32_t r0, r1;
    for (int it = 0; kn_rows_next(c->steal, tid, nth, &it, c->Y, c->T, c->W->rows,
                                  c->bias, &r0, &r1);)
        mq_rows(c, r0, r1);
}

/* Same threshold as kn_matmul: below it one thread does the product. */
#define KN_QDOT_PARALLEL_MIN_WORK (1u << 17)

typedef struct kn_mq_multi_ctx {
    int n;
    kn_mq_ctx c[KN_MATMUL_MULTI_MAX];
} kn_mq_multi_ctx;

static void mq_multi_task(void *vctx, int tid, int nth)
{
    const kn_mq_multi_ctx *m = vctx;
    for (int i = 0; i < m->n; i++)
        mq_task((void *)&m->c[i], tid, nth);
}

void kn_matmul_q_multi(kn_pool *p, int n, const kn_matrix *const W[],
                       const void *Xq, size_t T, float *const Y[],
                       const float *const B[])
{
    int avx2 = !kn_force_scalar() && kn_cpu_has_avx2();
    /* KN_MATMUL_MULTI_MAX matrices a job; more take more jobs */
    for (int i0 = 0; i0 < n; i0 += KN_MATMUL_MULTI_MAX) {
        kn_mq_multi_ctx m = {0, {{0}}};
        kn_steal st[KN_MATMUL_MULTI_MAX];
        uint64_t work = 0;
        for (int i = i0; i < n && i < i0 + KN_MATMUL_MULTI_MAX; i++) {
            if (T == 0 || W[i]->rows == 0)
                continue;
            uint32_t nb = kn_qact_blocks(W[i]->cols);
            size_t qb = qblock_bytes(kn_qact_kind_of(W[i]));
            kn_mq_ctx c = { W[i], Xq, (const float *)((const uint8_t *)Xq + T * nb * qb),
                            T, Y[i], B[i], avx2, avx2 && kn_cpu_has_avx512(), NULL };
            m.c[m.n++] = c;
            work += (uint64_t)W[i]->rows * W[i]->cols * T;
        }
        if (m.n == 0)
            continue;
        /* same threshold as kn_matmul: below it one thread does the work */
        kn_pool *use = work < KN_QDOT_PARALLEL_MIN_WORK ? NULL : p;
        /* decode: as kn_matmul_multi, rows claimed as the threads go */
        for (int i = 0; i < m.n; i++)
            m.c[i].steal = kn_steal_for(&st[i], m.c[i].W->rows, T, use);
        (m.c[0].steal ? kn_pool_run_shared : kn_pool_run)(use, mq_multi_task, &m);
    }
}

void kn_matmul_q(kn_pool *p, const kn_matrix *W, const void *Xq, size_t T,
                 float *Y, const float *bias)
{
    kn_matmul_q_multi(p, 1, &W, Xq, T, &Y, &bias);
}

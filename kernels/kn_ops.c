/* kn_ops.c - the dispatching entry points of kn_ops.h: split work over the
 * pool, pick AVX2 when the CPU has it and kn_force_scalar() is off, else
 * run the portable scalar code below (float accumulation, like the AVX2
 * path, but no intrinsics). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kn_gemm.h"
#include "kn_internal.h"
#include "kn_ops.h"
#include "kn_steal.h"

static int use_avx2(void)
{
    return !kn_force_scalar() && kn_cpu_has_avx2();
}

/* ---- matmul ------------------------------------------------------------------ */

typedef struct kn_mm_ctx {
    const kn_matrix *W;
    const float *X;       /* [T][cols] */
    size_t T;
    float *Y;             /* [T][rows] */
    const float *bias;    /* [rows] or NULL */
    int avx2;
    int avx512;           /* the prefill GEMM may use AVX-512 */
    int dec512;           /* the 2-8-token decode may use AVX-512 */
    kn_steal *steal;      /* decode: rows shared with stealing; NULL:
                             kn_task_rows' static shares */
} kn_mm_ctx;

/* Scalar rows [r0, r1): dequantize 256 columns at a time, then dot them
 * with every token. */
static void mm_scalar_rows(const kn_matrix *W, const float *X, size_t T,
                           float *Y, uint32_t r0, uint32_t r1)
{
    float buf[256];
    for (uint32_t r = r0; r < r1; r++) {
        for (uint32_t c0 = 0; c0 < W->cols; c0 += 256) {
            uint32_t n = W->cols - c0 < 256 ? W->cols - c0 : 256;
            kn_dequant_span(W, r, c0, n, buf);
            for (size_t t = 0; t < T; t++) {
                const float *x = X + t * W->cols + c0;
                float s = 0.0f;
                for (uint32_t i = 0; i < n; i++)
                    s += buf[i] * x[i];
                Y[t * W->rows + r] += s;
            }
        }
    }
}

/* Rows [r0, r1) of c's product (Y there holds bias or 0). */
static void mm_rows(const kn_mm_ctx *c, uint32_t r0, uint32_t r1)
{
    if (c->avx512 && c->T > KN_GEMM_MIN_T)
        kn_gemm_rows_avx512(c->W, c->X, c->T, c->Y, r0, r1);
    else if (c->avx2 && c->T > KN_GEMM_MIN_T)
        kn_gemm_rows(c->W, c->X, c->T, c->Y, r0, r1);
    else if (c->dec512 && c->T >= 2)
        kn_dec_rows_avx512(c->W, c->X, c->T, c->Y, r0, r1);
    else if (c->avx2)
        kn_avx2_matmul_rows(c->W, c->X, c->T, c->Y, r0, r1);
    else
        mm_scalar_rows(c->W, c->X, c->T, c->Y, r0, r1);
}

static void mm_task(void *vctx, int tid, int nth)
{
    const kn_mm_ctx *c = vctx;
    uint32_t r0, r1;
    for (int it = 0; kn_rows_next(c->steal, tid, nth, &it, c->Y, c->T, c->W->rows,
                                  c->bias, &r0, &r1);)
        mm_rows(c, r0, r1);
}

/* Multiply-adds below which an op runs on the calling thread alone. */
#define KN_PARALLEL_MIN_WORK (1u << 17)

/* n products in one job: each thread takes its share of every matrix. */
typedef struct kn_mm_multi_ctx {
    int n;
    kn_mm_ctx c[KN_MATMUL_MULTI_MAX];
} kn_mm_multi_ctx;

static void mm_multi_task(void *vctx, int tid, int nth)
{
    kn_mm_multi_ctx *m = vctx;
    for (int i = 0; i < m->n; i++)
        mm_task(&m->c[i], tid, nth);
}

void kn_matmul_multi(kn_pool *p, int n, const kn_matrix *const W[],
                     const float *X, size_t T, float *const Y[],
                     const float *const B[])
{
    /* KN_MATMUL_MULTI_MAX matrices a job; more take more jobs */
    for (int i0 = 0; i0 < n; i0 += KN_MATMUL_MULTI_MAX) {
        kn_mm_multi_ctx m = {0, {{0}}};
        kn_steal st[KN_MATMUL_MULTI_MAX];
        uint64_t work = 0;
        for (int i = i0; i < n && i < i0 + KN_MATMUL_MULTI_MAX; i++) {
            if (T == 0 || W[i]->rows == 0)
                continue;
            kn_mm_ctx c = { W[i], X, T, Y[i], B[i],
                            use_avx2() && kn_avx2_matmul_supported(W[i]), 0, 0, NULL };
            c.avx512 = c.avx2 && kn_cpu_has_avx512();
            c.dec512 = c.avx512 && kn_dec_avx512_supported(W[i]);
            m.c[m.n++] = c;
            work += (uint64_t)W[i]->rows * W[i]->cols * T;
        }
        if (m.n == 0)
            continue;
        /* Small products are not worth waking the workers for: a wake-up
         * costs microseconds, and far more when the machine is busy and a
         * worker has been descheduled.  2^17 multiply-adds take ~20-40 us
         * on one core. */
        kn_pool *use = work < KN_PARALLEL_MIN_WORK ? NULL : p;
        /* decode: rows claimed as the threads go (kn_steal.h), so a
         * thread another process holds off its CPU does not hold the step */
        for (int i = 0; i < m.n; i++)
            m.c[i].steal = kn_steal_for(&st[i], m.c[i].W->rows, T, use);
        (m.c[0].steal ? kn_pool_run_shared : kn_pool_run)(use, mm_multi_task, &m);
    }
}

void kn_matmul(kn_pool *p, const kn_matrix *W, const float *X, size_t T,
               float *Y, const float *bias)
{
    kn_matmul_multi(p, 1, &W, X, T, &Y, &bias);
}

/* ---- elementwise ------------------------------------------------------------- */

void kn_rmsnorm(float *out, const float *x, const float *w, size_t T,
                size_t n, float eps)
{
    int v = use_avx2();
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        if (v) {
            kn_avx2_rmsnorm_row(o, xr, w, n, eps);
            continue;
        }
        double ss = 0.0;
        for (size_t i = 0; i < n; i++)
            ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (size_t i = 0; i < n; i++)
            o[i] = xr[i] * inv * w[i];
    }
}

void kn_silu_mul(float *gate, const float *up, size_t n)
{
    if (use_avx2()) {
        kn_avx2_silu_mul(gate, up, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void kn_add(float *y, const float *x, size_t n)
{
    if (use_avx2()) {
        kn_avx2_add(y, x, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void kn_softmax(float *x, size_t n)
{
    if (n == 0)
        return;
    if (use_avx2()) {
        kn_avx2_softmax(x, n);
        return;
    }
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++)
        x[i] *= inv;
}

float kn_logsumexp(const float *x, size_t n)
{
    if (n == 0)
        return -INFINITY;
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    if (isinf(mx))
        return mx; /* all -inf, or a +inf present */
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    return (float)(mx + log(sum));
}

size_t kn_argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ---- KV cache ------------------------------------------------------------------ */

uint64_t kn_kv_slot_bytes(kn_kvtype type, uint32_t n_kv_heads,
                          uint32_t head_dim)
{
    uint64_t n = (uint64_t)n_kv_heads * head_dim;
    switch (type) {
    case KN_KV_F32: return 2 * n * 4;
    case KN_KV_F16: return 2 * n * 2;
    case KN_KV_I8: return 2 * n + 2 * (uint64_t)n_kv_heads * 4;
    default: return 0;
    }
}

static void kv_store_one(const kn_kv *kv, void *base, float *scale,
                         uint64_t slot, const float *x)
{
    size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    switch (kv->type) {
    case KN_KV_F32:
        memcpy((float *)base + slot * w, x, w * sizeof(float));
        break;
    case KN_KV_F16:
        if (use_avx2()) /* a prefill stores its rows on one thread */
            kn_avx2_f32_to_f16((uint16_t *)base + slot * w, x, w);
        else
            fmt_from_f32(FMT_DT_F16, x, (uint16_t *)base + slot * w, w);
        break;
    case KN_KV_I8:
        for (uint32_t h = 0; h < kv->n_kv_heads; h++) {
            const float *xh = x + (size_t)h * kv->head_dim;
            int8_t *qh = (int8_t *)base + slot * w + (size_t)h * kv->head_dim;
            float mx = 0.0f;
            for (uint32_t d = 0; d < kv->head_dim; d++)
                mx = fabsf(xh[d]) > mx ? fabsf(xh[d]) : mx;
            float s = mx / 127.0f;
            float inv = s > 0.0f ? 1.0f / s : 0.0f;
            for (uint32_t d = 0; d < kv->head_dim; d++) {
                float v = nearbyintf(xh[d] * inv);
                qh[d] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
            }
            scale[slot * kv->n_kv_heads + h] = s;
        }
        break;
    }
}

void kn_kv_store(kn_kv *kv, int64_t pos, const float *k, const float *v)
{
    uint64_t slot = (uint64_t)pos % kv->cap;
    kv_store_one(kv, kv->k, kv->k_scale, slot, k);
    kv_store_one(kv, kv->v, kv->v_scale, slot, v);
}

/* ---- attention ------------------------------------------------------------------ */

uint64_t kn_attention_scratch_floats(int nthreads, uint64_t max_ctx,
                                     uint32_t head_dim)
{
    if (nthreads < 1)
        nthreads = 1;
    return (uint64_t)nthreads * kn_attn_thread_floats(max_ctx, head_dim);
}

typedef struct kn_att_ctx {
    const kn_kv *kv;
    const float *q;       /* [T][n_heads][head_dim] */
    size_t T;
    uint32_t n_heads;
    int64_t pos0;
    uint64_t window;
    float *out;           /* [T][n_heads][head_dim] */
    float *scratch;       /* [nthreads][stride] */
    uint64_t stride;      /* floats of scratch per thread */
    uint64_t nctx_r;      /* score row length rounded to 16 */
    int avx2;
    int avx512;           /* the tiles may run kn_avx512_attend_block */
    atomic_size_t next;   /* the next item to claim (kn_pool_run_shared) */
} kn_att_ctx;

static void attend_scalar(const kn_kv *kv, const float *q, int64_t p,
                          uint64_t window, uint32_t kvh, float *out, float *sc)
{
    uint32_t hd = kv->head_dim;
    int64_t first = kn_attn_first(p, window);
    size_t n = (size_t)(p - first + 1);
    float root = sqrtf((float)hd); /* divide, as the AVX2 path does */
    float mx = -INFINITY;
    for (size_t j = 0; j < n; j++) {
        uint64_t slot = (uint64_t)(first + (int64_t)j) % kv->cap;
        float s = 0.0f;
        for (uint32_t d = 0; d < hd; d++)
            s += q[d] * kn_kv_at(kv, kv->k, kv->k_scale, slot, kvh, d);
        sc[j] = s / root;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    for (uint32_t d = 0; d < hd; d++)
        out[d] = 0.0f;
    for (size_t j = 0; j < n; j++) {
        uint64_t slot = (uint64_t)(first + (int64_t)j) % kv->cap;
        float pj = sc[j] / sum;
        for (uint32_t d = 0; d < hd; d++)
            out[d] += pj * kn_kv_at(kv, kv->v, kv->v_scale, slot, kvh, d);
    }
}

/* Items are claimed one at a time in ascending order, so any subset of the
 * threads does them all (kn_pool_run_shared); each item's result does not
 * depend on the thread that computes it. */
static void att_task(void *vctx, int tid, int nth)
{
    (void)nth;
    kn_att_ctx *c = vctx;
    uint32_t hd = c->kv->head_dim;
    uint32_t grp = c->n_heads / c->kv->n_kv_heads;
    if (c->avx2) {
        /* Tiles of (KV head, tokens), claimed in order: later tokens of a
         * causal prefill attend more positions, so the load evens out. */
        size_t tq = KN_FA_M / grp, ntile = (c->T + tq - 1) / tq;
        size_t nitem = ntile * c->kv->n_kv_heads;
        for (size_t i; (i = atomic_fetch_add(&c->next, 1)) < nitem;) {
            size_t t0 = (i / c->kv->n_kv_heads) * tq;
            size_t tn = c->T - t0 < tq ? c->T - t0 : tq;
            kn_avx2_attend_tile(c->kv, c->q, t0, tn, c->n_heads,
                                (uint32_t)(i % c->kv->n_kv_heads), c->pos0,
                                c->window, c->out, c->avx512);
        }
        return;
    }
    float *sc = c->scratch + (size_t)tid * c->stride;
    size_t npairs = c->T * c->n_heads;
    /* (token, head) pairs claimed in order, as the tiles above */
    for (size_t i; (i = atomic_fetch_add(&c->next, 1)) < npairs;) {
        size_t t = i / c->n_heads;
        uint32_t h = (uint32_t)(i % c->n_heads);
        int64_t p = c->pos0 + (int64_t)t;
        attend_scalar(c->kv, c->q + i * hd, p, c->window, h / grp,
                      c->out + i * hd, sc);
    }
}

void kn_attention(kn_pool *p, const kn_kv *kv, const float *q, size_t T,
                  uint32_t n_heads, int64_t pos0, uint64_t window,
                  float *out, float *scratch)
{
    if (T == 0 || n_heads == 0)
        return;
    /* Longest score row of this call: the last token's. */
    uint64_t nctx = (uint64_t)pos0 + T;
    if (window && nctx > window)
        nctx = window;
    kn_att_ctx c = { kv, q, T, n_heads, pos0, window, out, scratch,
                     kn_attn_thread_floats(nctx, kv->head_dim),
                     (nctx + 15) & ~(uint64_t)15,
                     use_avx2() && kn_avx2_attn_tiled_ok(kv, n_heads), 0, 0 };
    c.avx512 = c.avx2 && kn_cpu_has_avx512();
    /* Same rule as kn_matmul: roughly T x heads x context x head_dim x 2
     * multiply-adds. */
    if (T * n_heads < 2 ||
        (uint64_t)T * n_heads * nctx * kv->head_dim * 2 < KN_PARALLEL_MIN_WORK)
        p = NULL;
    kn_pool_run_shared(p, att_task, &c);
}

/* kn_gemm_bf16.c - kn_gemm_bf16.h's dispatch, threads, activation packing,
 * the scalar path and the reference. */
#include "kn_gemm_bf16.h"

#include <float.h>
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define BF16_MXCSR 1
#endif

#include "kn_internal.h"

enum { PATH_SCALAR, PATH_AVX2, PATH_AVX512F, PATH_BF16 };

static int path_now(void)
{
    if (kn_force_scalar() || !kn_cpu_has_avx2())
        return PATH_SCALAR;
    if (kn_cpu_has_avx512bf16())
        return PATH_BF16;
    return kn_cpu_has_avx512() ? PATH_AVX512F : PATH_AVX2;
}

int kn_bf16_dot_supported(const kn_matrix *W)
{
    if (W->fmt == KN_W_Q8 || W->fmt == KN_W_F32)
        return W->cols > 0 && W->layout == KN_LAYOUT_ROWS;
    if (W->fmt != KN_W_Q4 && W->fmt != KN_W_Q4S)
        return 0;
    return W->cols > 0 && W->layout == KN_LAYOUT_ROWS && W->group >= 32 &&
           W->group % 32 == 0 && KN_BF16_KC % W->group == 0;
}

/* x rounded to bfloat16 (kn_bf16_bits), as the float it stands for. */
static inline float round_bf16(float x)
{
    uint32_t u = kn_bf16_bits(x) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float kn_bf16_weight(const kn_matrix *W, uint32_t r, uint32_t c)
{
    if (W->fmt == KN_W_F32)
        return round_bf16(((const float *)W->data)[(size_t)r * W->cols + c]);
    if (W->fmt == KN_W_Q8)
        return ((const int8_t *)W->data)[(size_t)r * W->cols + c];
    uint8_t b = kn_q4_byte(W, r, c / 2);
    int q = (c & 1) ? (b >> 4) : (b & 15);
    if (W->fmt == KN_W_Q4S)
        return (float)(q - KN_Q4_ZERO_SYM);
    return (float)q - (float)W->zeros[(size_t)r * kn_q4_ngroups(W->cols, W->group) + c / W->group];
}

float kn_bf16_scale(const kn_matrix *W, uint32_t r, uint32_t c)
{
    if (W->fmt == KN_W_F32)
        return 1.0f;
    if (W->fmt == KN_W_Q8)
        return ((const float *)W->scales)[r];
    return fmt_f16_to_f32(kn_q4_scale_bits(W, r, c / W->group));
}

/* FTZ / DAZ by hand: a value below FLT_MIN becomes signed zero. */
static inline float ftz(float v)
{
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

/* One output element from the activations xr of its token (rounded to
 * bfloat16 here; rounding is idempotent, so packed rows pass through
 * unchanged): the arithmetic of kn_gemm_bf16.h with the flushes by hand. */
static float element(const kn_matrix *W, uint32_t r, const float *xr, float y)
{
    uint32_t bc = kn_bf16_block_cols(W);
    y = ftz(y);
    for (uint32_t c0 = 0; c0 < W->cols; c0 += bc) {
        uint32_t c1 = W->cols - c0 < bc ? W->cols : c0 + bc;
        float s = 0.0f;
        for (uint32_t c = c0; c < c1; c += 2) {
            if (c + 1 < c1)
                s = ftz(s + kn_bf16_weight(W, r, c + 1) * round_bf16(xr[c + 1]));
            s = ftz(s + kn_bf16_weight(W, r, c) * round_bf16(xr[c]));
        }
        y = ftz(fmaf(kn_bf16_scale(W, r, c0), s, y));
    }
    return y;
}

void kn_ref_matmul_bf16(const kn_matrix *W, const float *X, size_t T,
                        float *Y, const float *bias)
{
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = 0; r < W->rows; r++)
            Y[t * W->rows + r] = element(W, r, X + t * W->cols,
                                         bias ? bias[r] : 0.0f);
}

uint64_t kn_bf16_act_bytes(size_t T, uint32_t cols)
{
    uint64_t per = path_now() == PATH_BF16 ? 2 : 4;
    return (uint64_t)T * kn_bf16_act_stride(cols) * per;
}

void kn_bf16_act_pack(const float *X, size_t T, uint32_t cols, void *xb)
{
    size_t stride = kn_bf16_act_stride(cols);
    if (path_now() == PATH_BF16) {
        uint16_t *w = xb;
        for (size_t t = 0; t < T; t++) {
            kn_avx512_bf16_row(X + t * cols, cols, w + t * stride);
            if (cols & 1u)
                w[t * stride + cols] = 0;
        }
        return;
    }
    float *f = xb;
    for (size_t t = 0; t < T; t++) {
        const float *x = X + t * cols;
        float *o = f + t * stride;
        for (uint32_t c = 0; c < cols; c++) {
            uint32_t u = kn_bf16_bits(x[c]) << 16;
            memcpy(&o[c], &u, sizeof u);
        }
        if (cols & 1u)
            o[cols] = 0.0f;
    }
}

typedef struct bf16_ctx {
    const kn_matrix *W;
    const void *xb;
    size_t T;
    float *Y;
    const float *bias;
    int path;
} bf16_ctx;

static void scalar_rows(const bf16_ctx *c, uint32_t r0, uint32_t r1)
{
    const kn_matrix *W = c->W;
    size_t stride = kn_bf16_act_stride(W->cols);
    const float *xf = c->xb;
    for (size_t t = 0; t < c->T; t++)
        for (uint32_t r = r0; r < r1; r++) {
            float *y = &c->Y[t * W->rows + r];
            *y = element(W, r, xf + t * stride, *y);
        }
}

/* The vector paths: panels of rows, spans of KN_BF16_KC columns, tiles
 * of tokens.  A panel's span is packed once for all T tokens. */
static void vector_rows(const bf16_ctx *c, uint32_t r0, uint32_t r1)
{
    const kn_matrix *W = c->W;
    const int bf = c->path == PATH_BF16;
    const uint32_t pr = bf ? 32 : 16;
    const size_t nt_max = bf                          ? KN_BF16_NT512
                          : c->path == PATH_AVX512F ? KN_BF16_NT512F
                                                    : KN_BF16_NT2;
    /* words (bf16 path) or floats per token row */
    const size_t xstride = bf ? kn_bf16_act_stride(W->cols) / 2
                              : kn_bf16_act_stride(W->cols);
    _Alignas(64) uint32_t wbuf[KN_BF16_KC / 2 * 32];
    _Alignas(64) float sbuf[KN_BF16_KC / 32 * 32];
    kn_bf16_panel P = {wbuf, sbuf, 0, kn_bf16_block_cols(W) / 2};
    for (uint32_t p0 = r0; p0 < r1; p0 += pr) {
        uint32_t nr = r1 - p0 < pr ? r1 - p0 : pr;
        for (uint32_t c0 = 0; c0 < W->cols; c0 += KN_BF16_KC) {
            uint32_t span = W->cols - c0 < KN_BF16_KC ? W->cols - c0 : KN_BF16_KC;
            P.pairs = (span + 1) / 2;
            if (bf)
                kn_avx512bf16_gemm_pack(W, p0, nr, c0, span, wbuf, sbuf);
            else
                kn_avx2_gemm_bf16_pack(W, p0, nr, c0, span, (float *)(void *)wbuf,
                                       sbuf);
            for (size_t t = 0; t < c->T; t += nt_max) {
                size_t nt = c->T - t < nt_max ? c->T - t : nt_max;
                float *Y = c->Y + t * W->rows + p0;
                if (bf)
                    kn_avx512bf16_gemm_tile(&P, (const uint32_t *)c->xb + t * xstride + c0 / 2,
                                            xstride, nt, Y, W->rows, nr);
                else if (c->path == PATH_AVX512F)
                    kn_avx512_gemm_bf16_emu_tile(&P, (const float *)c->xb + t * xstride + c0,
                                                 xstride, nt, Y, W->rows, nr);
                else
                    kn_avx2_gemm_bf16_tile(&P, (const float *)c->xb + t * xstride + c0,
                                           xstride, nt, Y, W->rows, nr);
            }
        }
    }
}

static void bf16_task(void *vctx, int tid, int nth)
{
    const bf16_ctx *c = vctx;
    uint32_t r0, r1;
    if (!kn_task_rows(c->Y, c->T, c->W->rows, c->bias, tid, nth, &r0, &r1))
        return;
    if (c->path == PATH_SCALAR) {
        scalar_rows(c, r0, r1);
        return;
    }
#ifdef BF16_MXCSR
    /* vdpbf16ps flushes subnormal operands and results whatever MXCSR
     * says; the FMAs of both paths do the same under FTZ and DAZ */
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
#endif
    vector_rows(c, r0, r1);
#ifdef BF16_MXCSR
    _mm_setcsr(csr);
#endif
}

typedef struct bf16_multi {
    int n;
    bf16_ctx c[KN_MATMUL_MULTI_MAX];
} bf16_multi;

static void multi_task(void *vctx, int tid, int nth)
{
    bf16_multi *m = vctx;
    for (int i = 0; i < m->n; i++)
        bf16_task(&m->c[i], tid, nth);
}

/* kn_ops.c's threshold: smaller products run on the calling thread. */
#define BF16_PARALLEL_MIN_WORK (1u << 17)

void kn_matmul_bf16_multi(kn_pool *p, int n, const kn_matrix *const W[],
                          const void *xb, size_t T, float *const Y[],
                          const float *const B[])
{
    int path = path_now();
    for (int i0 = 0; i0 < n; i0 += KN_MATMUL_MULTI_MAX) {
        bf16_multi m = {0, {{0}}};
        uint64_t work = 0;
        for (int i = i0; i < n && i < i0 + KN_MATMUL_MULTI_MAX; i++) {
            if (T == 0 || W[i]->rows == 0)
                continue;
            bf16_ctx c = {W[i], xb, T, Y[i], B[i], path};
            m.c[m.n++] = c;
            work += (uint64_t)W[i]->rows * W[i]->cols * T;
        }
        if (m.n)
            kn_pool_run(work < BF16_PARALLEL_MIN_WORK ? NULL : p, multi_task, &m);
    }
}

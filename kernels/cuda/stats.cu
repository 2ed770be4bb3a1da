/* stats.cu - calibration statistics on the GPU (kn_cuda.h): X^T X and the
 * cross term as FLOAT cuBLAS products over chunks of KN_STATS_CHUNK tokens,
 * each chunk's float sums added to double sums (the CPU design of
 * kernels/kn_gram.h): a consumer card computes doubles at 1/32-1/64 of its
 * float rate, and the error stays that of one chunk-long float dot
 * product however many tokens are summed.  Row-major [i][j] of a cols x
 * cols sum is column-major element (j, i): Hq row-major upper is cuBLAS's
 * LOWER triangle of Xq_c Xq_c^T (Xq_c: the row-major [T][cols] X read as a
 * column-major cols x T matrix), and C = Xf^T Xq row-major is Xq_c Xf_c^T
 * column-major. */
#include <cublas_v2.h>
#include <stdlib.h>

#include "kn_cuda_common.cuh"
#include "kn_stats_bytes.h"

struct kn_cuda_stats {
    uint32_t cols;
    size_t max_T;
    int full;
    int bf16;                /* inputs rounded to bfloat16 on upload */
    cublasHandle_t blas;
    double *hq, *hf, *c;     /* [cols][cols] double sums */
    float *part;             /* one chunk's float product, a panel of
                                KN_STATS_PANEL columns (kn_stats_bytes.h) */
    float *xq, *xf;          /* [max_T][cols] the uploaded chunks (float) */
    size_t tf;               /* tokens in xf (from the last add_f) */
};

static uint64_t sq_bytes(uint32_t cols)
{
    return (uint64_t)cols * cols * sizeof(double);
}

extern "C" uint64_t kn_cuda_stats_device_bytes(uint32_t cols, size_t max_T,
                                               int full)
{
    return kn_stats_device_bytes(cols, max_T, full);
}

/* One panel's float product into the double sum: part is the column-major
 * rows x ncols block (ld rows) at (row0, col0) of the n x n column-major
 * sum; lower 1 adds only its elements on or below the diagonal (row >=
 * col: the triangle that is kept). */
__global__ void kn_stats_accumulate_kernel(double *sum, const float *part,
                                           uint32_t n, uint32_t row0,
                                           uint32_t col0, uint32_t rows,
                                           uint32_t ncols, int lower)
{
    size_t total = (size_t)rows * ncols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t row = row0 + e % rows, col = col0 + e / rows;
        if (!lower || row >= col)
            sum[col * n + row] += (double)part[e];
    }
}

/* x[e] rounded to bfloat16 in place, as kn_gram.c's bf16_bits rounds on
 * the CPU: to nearest even, subnormals to signed zero, NaN kept quiet. */
__global__ void kn_stats_bf16_kernel(float *x, size_t n)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        uint32_t u = __float_as_uint(x[e]), mag = u & 0x7fffffffu;
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        if (mag < 0x00800000u)
            r = u & 0x80000000u;
        else if (mag > 0x7f800000u)
            r = (u | 0x00400000u) & 0xffff0000u;
        x[e] = __uint_as_float(r);
    }
}

static unsigned stats_grid(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 ? 65535 : b ? b : 1);
}

extern "C" void kn_cuda_stats_free(kn_cuda_stats *s)
{
    if (!s)
        return;
    cudaFree(s->hq);
    cudaFree(s->hf);
    cudaFree(s->c);
    cudaFree(s->part);
    cudaFree(s->xq);
    cudaFree(s->xf);
    if (s->blas)
        cublasDestroy(s->blas);
    free(s);
}

static mc_status zeroed(void **p, uint64_t bytes)
{
    if (cudaMalloc(p, (size_t)bytes) != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        return MC_ERR_CUDA;
    }
    return cudaMemset(*p, 0, (size_t)bytes) == cudaSuccess ? MC_OK : MC_ERR_CUDA;
}

extern "C" mc_status kn_cuda_stats_create(uint32_t cols, size_t max_T,
                                          int full, int bf16, kn_cuda_stats **out)
{
    *out = NULL;
    if (cols == 0 || max_T == 0 || cols > 0x7fffffffu || max_T > 0x7fffffffu)
        return MC_ERR_INVALID_ARG;
    kn_cuda_stats *s = (kn_cuda_stats *)calloc(1, sizeof *s);
    if (!s)
        return MC_ERR_NOMEM;
    s->cols = cols;
    s->max_T = max_T;
    s->full = full;
    s->bf16 = bf16;
    uint64_t x = (uint64_t)max_T * cols * sizeof(float);
    uint64_t part = kn_stats_part_bytes(cols);
    mc_status st = cublasCreate(&s->blas) == CUBLAS_STATUS_SUCCESS ? MC_OK : MC_ERR_CUDA;
    if (st != MC_OK)
        s->blas = NULL;
    if (st == MC_OK)
        st = zeroed((void **)&s->hq, sq_bytes(cols));
    if (st == MC_OK)
        st = zeroed((void **)&s->part, part);
    if (st == MC_OK)
        st = zeroed((void **)&s->xq, x);
    if (st == MC_OK && full)
        st = zeroed((void **)&s->hf, sq_bytes(cols));
    if (st == MC_OK && full)
        st = zeroed((void **)&s->c, sq_bytes(cols));
    if (st == MC_OK && full)
        st = zeroed((void **)&s->xf, x);
    if (st != MC_OK) {
        kn_cuda_stats_free(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

static mc_status upload(kn_cuda_stats *s, const float *x, size_t T, float *dst)
{
    size_t n = T * s->cols;
    if (cudaMemcpy(dst, x, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
        return MC_ERR_CUDA;
    if (!s->bf16)
        return MC_OK;
    kn_stats_bf16_kernel<<<stats_grid(n), 256>>>(dst, n);
    return kn_cuda_launched();
}

/* Add the panel in part (rows x ncols at (row0, col0)) to sum. */
static mc_status fold(kn_cuda_stats *s, double *sum, uint32_t row0, uint32_t col0,
                      uint32_t rows, uint32_t ncols, int lower)
{
    kn_stats_accumulate_kernel<<<stats_grid((size_t)rows * ncols), 256>>>(
        sum, s->part, s->cols, row0, col0, rows, ncols, lower);
    return kn_cuda_launched();
}

/* H += X^T X for X (device float, T rows), chunk by chunk and in panels of
 * KN_STATS_PANEL columns: panel [c0, c1) is the float product of rows c0..
 * (the lower trapezoid, column-major, i.e. the row-major upper triangle
 * and what lies beside it) with its own columns. */
static mc_status syrk(kn_cuda_stats *s, const float *X, size_t T, double *H)
{
    const float one = 1.0f, zero = 0.0f;
    uint32_t n = s->cols;
    for (size_t t0 = 0; t0 < T; t0 += KN_STATS_CHUNK) {
        int k = (int)(T - t0 < KN_STATS_CHUNK ? T - t0 : KN_STATS_CHUNK);
        const float *Xc = X + t0 * n;
        for (uint32_t c0 = 0; c0 < n; c0 += KN_STATS_PANEL) {
            uint32_t nc = n - c0 < KN_STATS_PANEL ? n - c0 : KN_STATS_PANEL;
            uint32_t rows = n - c0;
            if (cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)rows, (int)nc, k,
                            &one, Xc + c0, (int)n, Xc + c0, (int)n, &zero, s->part,
                            (int)rows) != CUBLAS_STATUS_SUCCESS)
                return MC_ERR_CUDA;
            mc_status st = fold(s, H, c0, c0, rows, nc, 1);
            if (st != MC_OK)
                return st;
        }
    }
    return MC_OK;
}

/* C += Xf^T Xq (row-major; column-major Xq_c Xf_c^T), chunk by chunk, in
 * panels of KN_STATS_PANEL column-major columns. */
static mc_status cross(kn_cuda_stats *s, size_t T)
{
    const float one = 1.0f, zero = 0.0f;
    uint32_t n = s->cols;
    for (size_t t0 = 0; t0 < T; t0 += KN_STATS_CHUNK) {
        int k = (int)(T - t0 < KN_STATS_CHUNK ? T - t0 : KN_STATS_CHUNK);
        for (uint32_t c0 = 0; c0 < n; c0 += KN_STATS_PANEL) {
            uint32_t nc = n - c0 < KN_STATS_PANEL ? n - c0 : KN_STATS_PANEL;
            if (cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)n, (int)nc, k,
                            &one, s->xq + t0 * n, (int)n, s->xf + t0 * n + c0,
                            (int)n, &zero, s->part, (int)n) != CUBLAS_STATUS_SUCCESS)
                return MC_ERR_CUDA;
            mc_status st = fold(s, s->c, 0, c0, n, nc, 0);
            if (st != MC_OK)
                return st;
        }
    }
    return MC_OK;
}

extern "C" mc_status kn_cuda_stats_add_f(kn_cuda_stats *s, const float *xf,
                                         size_t T)
{
    if (!s || !s->full || T > s->max_T)
        return MC_ERR_INVALID_ARG;
    if (T == 0)
        return MC_OK;
    mc_status st = upload(s, xf, T, s->xf);
    if (st == MC_OK)
        st = syrk(s, s->xf, T, s->hf);
    s->tf = st == MC_OK ? T : 0;
    return st;
}

extern "C" mc_status kn_cuda_stats_add_q(kn_cuda_stats *s, const float *xq,
                                         size_t T)
{
    if (!s || T > s->max_T || (s->full && T != s->tf))
        return MC_ERR_INVALID_ARG;
    if (T == 0)
        return MC_OK;
    mc_status st = upload(s, xq, T, s->xq);
    if (st == MC_OK)
        st = syrk(s, s->xq, T, s->hq);
    if (st == MC_OK && s->full)
        st = cross(s, T);
    return st;
}

extern "C" mc_status kn_cuda_stats_read_rows(kn_cuda_stats *s,
                                             kn_stats_which which,
                                             uint32_t row0, uint32_t nrows,
                                             double *out)
{
    if (!s || !out || (uint64_t)row0 + nrows > s->cols)
        return MC_ERR_INVALID_ARG;
    const double *src = which == KN_STATS_HQ ? s->hq
                      : which == KN_STATS_HF ? s->hf : s->c;
    if (!src)
        return MC_ERR_INVALID_ARG;
    if (cudaDeviceSynchronize() != cudaSuccess)
        return MC_ERR_CUDA;
    return cudaMemcpy(out, src + (size_t)row0 * s->cols,
                      (size_t)nrows * s->cols * sizeof(double),
                      cudaMemcpyDeviceToHost) == cudaSuccess
               ? MC_OK : MC_ERR_CUDA;
}

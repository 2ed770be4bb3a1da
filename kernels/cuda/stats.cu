/* stats.cu - calibration statistics on the GPU (kn_cuda.h): X^T X and the
 * cross term in double with cuBLAS.  Row-major [i][j] of a cols x cols sum
 * is column-major element (j, i): Hq row-major upper is cuBLAS's LOWER
 * triangle of Xq_c Xq_c^T (Xq_c: the row-major [T][cols] X read as a
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
    cublasHandle_t blas;
    double *hq, *hf, *c;     /* [cols][cols] */
    double *xq, *xf;         /* [max_T][cols] double copies */
    float *stage;            /* [max_T][cols] the upload */
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

__global__ void kn_f32_to_f64_kernel(const float *x, double *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = (double)x[i];
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
    cudaFree(s->xq);
    cudaFree(s->xf);
    cudaFree(s->stage);
    if (s->blas)
        cublasDestroy(s->blas);
    free(s);
}

static mc_status zeroed(double **p, uint64_t bytes)
{
    if (cudaMalloc((void **)p, (size_t)bytes) != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError();
        return MC_ERR_CUDA;
    }
    return cudaMemset(*p, 0, (size_t)bytes) == cudaSuccess ? MC_OK : MC_ERR_CUDA;
}

extern "C" mc_status kn_cuda_stats_create(uint32_t cols, size_t max_T,
                                          int full, kn_cuda_stats **out)
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
    uint64_t x = (uint64_t)max_T * cols;
    mc_status st = cublasCreate(&s->blas) == CUBLAS_STATUS_SUCCESS ? MC_OK : MC_ERR_CUDA;
    if (st != MC_OK)
        s->blas = NULL;
    if (st == MC_OK)
        st = zeroed(&s->hq, sq_bytes(cols));
    if (st == MC_OK)
        st = zeroed(&s->xq, x * sizeof(double));
    if (st == MC_OK && full)
        st = zeroed(&s->hf, sq_bytes(cols));
    if (st == MC_OK && full)
        st = zeroed(&s->c, sq_bytes(cols));
    if (st == MC_OK && full)
        st = zeroed(&s->xf, x * sizeof(double));
    if (st == MC_OK &&
        cudaMalloc((void **)&s->stage, (size_t)(x * sizeof(float))) != cudaSuccess) {
        s->stage = NULL;
        (void)cudaGetLastError();
        st = MC_ERR_CUDA;
    }
    if (st != MC_OK) {
        kn_cuda_stats_free(s);
        return st;
    }
    *out = s;
    return MC_OK;
}

/* Upload T rows of host x into dst (double, on the device). */
static mc_status upload(kn_cuda_stats *s, const float *x, size_t T, double *dst)
{
    size_t n = T * s->cols;
    if (cudaMemcpy(s->stage, x, n * sizeof(float), cudaMemcpyHostToDevice) !=
        cudaSuccess)
        return MC_ERR_CUDA;
    kn_f32_to_f64_kernel<<<stats_grid(n), 256>>>(s->stage, dst, n);
    return kn_cuda_launched();
}

/* H += X^T X for X (device double, T rows) into H's row-major upper. */
static mc_status syrk(kn_cuda_stats *s, const double *X, size_t T, double *H)
{
    const double one = 1.0;
    int n = (int)s->cols, k = (int)T;
    return cublasDsyrk(s->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, n, k, &one,
                       X, n, &one, H, n) == CUBLAS_STATUS_SUCCESS
               ? MC_OK : MC_ERR_CUDA;
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
    if (st == MC_OK && s->full) {
        const double one = 1.0;
        int n = (int)s->cols, k = (int)T;
        if (cublasDgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, n, n, k, &one, s->xq, n,
                        s->xf, n, &one, s->c, n) != CUBLAS_STATUS_SUCCESS)
            st = MC_ERR_CUDA;
    }
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

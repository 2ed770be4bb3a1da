/* gemm.cu - prefill matmul on the GPU: dequantize W (any format) to f16
 * and convert X to f16 in the caller's workspace, then one cublasGemmEx
 * with f32 accumulation.  Row-major Y[T][rows] = X[T][cols] W^T is, in
 * cuBLAS's column-major terms, C(rows x T) = op_T(A: cols x rows) * B(cols
 * x T), with A = W and B = X as stored. */
#include <cublas_v2.h>

#include "kn_cuda_common.cuh"

__global__ void kn_dequant_f16_kernel(const kn_matrix W, __half *out)
{
    size_t n = (size_t)W.rows * W.cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(kn_dev_w_at(W, (uint32_t)(i / W.cols),
                                             (uint32_t)(i % W.cols)));
}

__global__ void kn_f32_to_f16_kernel(const float *x, __half *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

__global__ void kn_fill_bias_kernel(float *Y, const float *bias, uint32_t rows,
                                    size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        Y[i] = bias ? bias[i % rows] : 0.0f;
}

static unsigned kn_grid(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 ? 65535 : b ? b : 1);
}

extern "C" uint64_t kn_cuda_gemm_work_bytes(const kn_matrix *W, size_t T)
{
    uint64_t a = ((uint64_t)W->rows * W->cols * 2 + 255) & ~(uint64_t)255;
    return a + (uint64_t)T * W->cols * 2;
}

static mc_status kn_gemm_launch(cublasHandle_t h, const kn_matrix *W,
                                const float *X, size_t T, float *Y,
                                const float *bias, void *work,
                                uint64_t work_bytes, cudaStream_t st)
{
    if (!h || !W || !X || !Y || !work || W->fmt >= KN_W_COUNT_)
        return MC_ERR_INVALID_ARG;
    if ((W->fmt == KN_W_Q4 || W->fmt == KN_W_Q4S) && W->group == 0)
        return MC_ERR_INVALID_ARG;
    if (T == 0 || W->rows == 0)
        return MC_OK;
    if (work_bytes < kn_cuda_gemm_work_bytes(W, T) || T > 0x7fffffff ||
        W->cols > 0x7fffffff || W->rows > 0x7fffffff)
        return MC_ERR_INVALID_ARG;
    __half *wh = (__half *)work;
    __half *xh = (__half *)((char *)work +
                            (((uint64_t)W->rows * W->cols * 2 + 255) & ~(uint64_t)255));
    size_t nw = (size_t)W->rows * W->cols, nx = T * W->cols, ny = T * W->rows;
    kn_dequant_f16_kernel<<<kn_grid(nw), 256, 0, st>>>(*W, wh);
    kn_f32_to_f16_kernel<<<kn_grid(nx), 256, 0, st>>>(X, xh, nx);
    kn_fill_bias_kernel<<<kn_grid(ny), 256, 0, st>>>(Y, bias, W->rows, ny);
    if (kn_cuda_launched() != MC_OK)
        return MC_ERR_CUDA;
    /* cublasSetStream resets the handle's workspace to cuBLAS's own pool
     * (documented), which would undo the arena slice given with
     * cublasSetWorkspace: only switch streams when the stream differs. */
    cudaStream_t cur = NULL;
    if (cublasGetStream(h, &cur) != CUBLAS_STATUS_SUCCESS)
        return MC_ERR_CUDA;
    if (cur != st && cublasSetStream(h, st) != CUBLAS_STATUS_SUCCESS)
        return MC_ERR_CUDA;
    const float alpha = 1.0f, beta = 1.0f; /* Y holds the bias */
    cublasStatus_t cs = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows,
                                     (int)T, (int)W->cols, &alpha, wh,
                                     CUDA_R_16F, (int)W->cols, xh, CUDA_R_16F,
                                     (int)W->cols, &beta, Y, CUDA_R_32F,
                                     (int)W->rows, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    return cs == CUBLAS_STATUS_SUCCESS ? MC_OK : MC_ERR_CUDA;
}

extern "C" mc_status kn_cuda_gemm(kn_cublas blas, const kn_matrix *W,
                                  const float *X, size_t T, float *Y,
                                  const float *bias, void *work,
                                  uint64_t work_bytes, kn_cuda_stream s)
{
    return kn_gemm_launch((cublasHandle_t)blas, W, X, T, Y, bias, work,
                          work_bytes, kn_cu_stream(s));
}

/* rmsnorm.cu - kn_rmsnorm on the GPU: one block per row. */
#include "kn_cuda_common.cuh"

#define KN_RMS_THREADS 256

__global__ void kn_rmsnorm_kernel(float *out, const float *x, const float *w,
                                  size_t n, float eps)
{
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * n;
    float *o = out + blockIdx.x * n;
    float ss = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = kn_block_sum(ss, red);
    float inv = rsqrtf(ss / (float)n + eps);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        o[i] = xr[i] * inv * w[i];
}

static mc_status kn_rmsnorm_launch(float *out, const float *x, const float *w,
                                   size_t T, size_t n, float eps,
                                   cudaStream_t st)
{
    if (T == 0 || n == 0)
        return MC_OK;
    if (T > 0x7fffffffu || !out || !x || !w)
        return MC_ERR_INVALID_ARG;
    kn_rmsnorm_kernel<<<(unsigned)T, KN_RMS_THREADS, 0, st>>>(out, x, w, n, eps);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_rmsnorm(float *out, const float *x,
                                     const float *w, size_t T, size_t n,
                                     float eps, kn_cuda_stream s)
{
    return kn_rmsnorm_launch(out, x, w, T, n, eps, kn_cu_stream(s));
}

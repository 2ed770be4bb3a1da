/* softmax.cu - kn_softmax on the GPU: one block per row. */
#include "kn_cuda_common.cuh"

__global__ void kn_softmax_kernel(float *x, size_t n)
{
    __shared__ float red[32];
    float *r = x + blockIdx.x * n;
    float mx = -INFINITY;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        mx = fmaxf(mx, r[i]);
    mx = kn_block_max(mx, red);
    float sum = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(r[i] - mx);
        r[i] = e;
        sum += e;
    }
    sum = kn_block_sum(sum, red);
    float inv = 1.0f / sum;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x)
        r[i] *= inv;
}

static mc_status kn_softmax_launch(float *x, size_t rows, size_t n,
                                   cudaStream_t st)
{
    if (rows == 0 || n == 0)
        return MC_OK;
    if (rows > 0x7fffffffu || !x)
        return MC_ERR_INVALID_ARG;
    kn_softmax_kernel<<<(unsigned)rows, 256, 0, st>>>(x, n);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_softmax(float *x, size_t rows, size_t n,
                                     kn_cuda_stream s)
{
    return kn_softmax_launch(x, rows, n, kn_cu_stream(s));
}

/* sampling.cu - greedy sampling on the GPU: argmax of the logits (first
 * index on ties), one block of 1024 threads. */
#include "kn_cuda_common.cuh"

#define KN_ARGMAX_THREADS 1024

__global__ void kn_argmax_kernel(const float *x, uint32_t n, uint32_t *out)
{
    __shared__ float bv[KN_ARGMAX_THREADS];
    __shared__ uint32_t bi[KN_ARGMAX_THREADS];
    float best = -INFINITY;
    uint32_t bidx = 0xffffffffu;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        if (bidx == 0xffffffffu || x[i] > best) { /* ascending i: first wins */
            best = x[i];
            bidx = i;
        }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = bidx;
    __syncthreads();
    for (uint32_t s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float v = bv[threadIdx.x + s];
            uint32_t j = bi[threadIdx.x + s];
            uint32_t k = bi[threadIdx.x];
            /* larger value wins; equal values: smaller index */
            if (j != 0xffffffffu &&
                (k == 0xffffffffu || v > bv[threadIdx.x] ||
                 (v == bv[threadIdx.x] && j < k))) {
                bv[threadIdx.x] = v;
                bi[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *out = bi[0] == 0xffffffffu ? 0 : bi[0];
}

static mc_status kn_argmax_launch(const float *x, size_t n, uint32_t *out,
                                  cudaStream_t st)
{
    if (!x || !out || n == 0 || n >= 0xffffffffu)
        return MC_ERR_INVALID_ARG;
    kn_argmax_kernel<<<1, KN_ARGMAX_THREADS, 0, st>>>(x, (uint32_t)n, out);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_argmax(const float *x, size_t n,
                                    uint32_t *out_idx, kn_cuda_stream s)
{
    return kn_argmax_launch(x, n, out_idx, kn_cu_stream(s));
}

extern "C" mc_status kn_cuda_device_count(int *n)
{
    int c = 0;
    if (!n)
        return MC_ERR_INVALID_ARG;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c = 0; /* no driver or no device: not an error */
    }
    *n = c;
    return MC_OK;
}

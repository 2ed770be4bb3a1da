/* silu_mul.cu - kn_silu_mul on the GPU (elementwise, grid-stride). */
#include "kn_cuda_common.cuh"

__global__ void kn_silu_mul_kernel(float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static mc_status kn_silu_mul_launch(float *gate, const float *up, size_t n,
                                    cudaStream_t st)
{
    if (n == 0)
        return MC_OK;
    if (!gate || !up)
        return MC_ERR_INVALID_ARG;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535)
        blocks = 65535;
    kn_silu_mul_kernel<<<(unsigned)blocks, 256, 0, st>>>(gate, up, n);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_silu_mul(float *gate, const float *up, size_t n,
                                      kn_cuda_stream s)
{
    return kn_silu_mul_launch(gate, up, n, kn_cu_stream(s));
}

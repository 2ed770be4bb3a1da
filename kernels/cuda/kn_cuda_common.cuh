/* kn_cuda_common.cuh - helpers shared by the .cu files (not installed). */
#ifndef KN_CUDA_COMMON_CUH
#define KN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kn_cuda.h"

/* Status of the launch just made (clears CUDA's last-error slot). */
static inline mc_status kn_cuda_launched(void)
{
    return cudaGetLastError() == cudaSuccess ? MC_OK : MC_ERR_CUDA;
}

static inline cudaStream_t kn_cu_stream(kn_cuda_stream s)
{
    return (cudaStream_t)s;
}

/* Sum over a warp; every lane gets the result. */
__device__ __forceinline__ float kn_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kn_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum (blockDim.x a multiple of 32, <= 1024); all threads get
 * it.  red: __shared__ float[32]. */
__device__ __forceinline__ float kn_block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = kn_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? red[lane] : 0.0f;
    return kn_warp_sum(v);
}

__device__ __forceinline__ float kn_block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = kn_warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = lane < nw ? red[lane] : -INFINITY;
    return kn_warp_max(v);
}

/* W[r][c] as float, exactly as kn_quant.h defines each format. */
__device__ __forceinline__ float kn_dev_w_at(const kn_matrix W, uint32_t r,
                                             uint32_t c)
{
    size_t i = (size_t)r * W.cols + c;
    switch (W.fmt) {
    case KN_W_F32: return ((const float *)W.data)[i];
    case KN_W_F16:
        return __half2float(__ushort_as_half(((const unsigned short *)W.data)[i]));
    case KN_W_BF16:
        return __uint_as_float((unsigned)((const unsigned short *)W.data)[i] << 16);
    case KN_W_Q8:
        return ((const float *)W.scales)[r] * (float)((const int8_t *)W.data)[i];
    default: {
        uint32_t ng = kn_q4_ngroups(W.cols, W.group);
        const uint8_t *row = (const uint8_t *)W.data + (size_t)r * kn_q4_row_bytes(W.cols);
        uint8_t b = row[c / 2];
        int q = (c & 1) ? (b >> 4) : (b & 15);
        size_t gi = (size_t)r * ng + c / W.group;
        int z = W.fmt == KN_W_Q4 ? W.zeros[gi] : KN_Q4_ZERO_SYM;
        float s = __half2float(__ushort_as_half(((const unsigned short *)W.scales)[gi]));
        return (float)(q - z) * s;
    }
    }
}

#endif /* KN_CUDA_COMMON_CUH */

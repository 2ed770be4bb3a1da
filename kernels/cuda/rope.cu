/* rope.cu - kn_rope_apply on the GPU: one block per (token, head), one
 * thread per rotated pair (i, i + head_dim/2). */
#include "kn_cuda_common.cuh"

__global__ void kn_rope_kernel(float *x, const float *inv_freq, float scale,
                               uint32_t head_dim, uint32_t nheads,
                               const int64_t *pos)
{
    uint32_t half = head_dim / 2;
    size_t th = blockIdx.x; /* t * nheads + h */
    size_t t = th / nheads;
    float *v = x + th * head_dim;
    for (uint32_t i = threadIdx.x; i < half; i += blockDim.x) {
        /* the angle as a float32 product, like HF and the CPU kernels */
        float ang = (float)pos[t] * inv_freq[i];
        float c = (float)cos((double)ang) * scale;
        float s = (float)sin((double)ang) * scale;
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

static mc_status kn_rope_launch(float *x, const float *inv_freq, float scale,
                                uint32_t head_dim, size_t T, uint32_t nheads,
                                const int64_t *pos, cudaStream_t st)
{
    size_t blocks = T * nheads;
    if (blocks == 0 || head_dim < 2)
        return MC_OK;
    if (blocks > 0x7fffffffu || !x || !inv_freq || !pos)
        return MC_ERR_INVALID_ARG;
    unsigned threads = head_dim / 2 < 128 ? ((head_dim / 2 + 31) / 32) * 32 : 128;
    kn_rope_kernel<<<(unsigned)blocks, threads, 0, st>>>(x, inv_freq, scale,
                                                         head_dim, nheads, pos);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_rope_apply(float *x, const float *inv_freq,
                                        float attn_scale, uint32_t head_dim,
                                        size_t T, uint32_t nheads,
                                        const int64_t *pos, kn_cuda_stream s)
{
    return kn_rope_launch(x, inv_freq, attn_scale, head_dim, T, nheads, pos,
                          kn_cu_stream(s));
}

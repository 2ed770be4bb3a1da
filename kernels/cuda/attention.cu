/* attention.cu - causal GQA attention over a device KV ring (F32, F16 or
 * I8 with per-slot per-head scales) with an online softmax, so it needs no
 * score scratch: one block per (token, head); each warp walks every
 * KN_ATT_WARPS-th attended position keeping (max, sum, acc[head_dim]), lane
 * l holding dimensions l, l+32, ...; the warps' states are merged at the
 * end. */
#include "kn_cuda_common.cuh"

#define KN_ATT_WARPS 4
#define KN_ATT_PER_LANE (KN_CUDA_ATT_MAX_HEAD_DIM / 32)

__device__ __forceinline__ float kn_kv_dev(const void *base, int type, size_t i)
{
    switch (type) {
    case KN_KV_F32: return ((const float *)base)[i];
    case KN_KV_F16:
        return __half2float(__ushort_as_half(((const unsigned short *)base)[i]));
    default: return (float)((const int8_t *)base)[i];
    }
}

__global__ void kn_attention_kernel(const kn_kv kv, const float *q,
                                    uint32_t n_heads, int64_t pos0,
                                    uint64_t window, float *out)
{
    __shared__ float sm_m[KN_ATT_WARPS], sm_l[KN_ATT_WARPS];
    __shared__ float sm_acc[KN_ATT_WARPS][KN_CUDA_ATT_MAX_HEAD_DIM];
    uint32_t hd = kv.head_dim;
    size_t th = blockIdx.x; /* t * n_heads + h */
    size_t t = th / n_heads;
    uint32_t h = (uint32_t)(th % n_heads);
    uint32_t kvh = h / (n_heads / kv.n_kv_heads);
    int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    int type = kv.type;
    const float *qh = q + th * hd;
    float qv[KN_ATT_PER_LANE], acc[KN_ATT_PER_LANE];
#pragma unroll
    for (int k = 0; k < KN_ATT_PER_LANE; k++) {
        uint32_t d = lane + 32 * k;
        qv[k] = d < hd ? qh[d] : 0.0f;
        acc[k] = 0.0f;
    }
    int64_t p = pos0 + (int64_t)t;
    int64_t first = (window == 0 || (uint64_t)p < window) ? 0 : p - (int64_t)window + 1;
    float scale = rsqrtf((float)hd);
    size_t slot_w = (size_t)kv.n_kv_heads * hd;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = first + wi; j <= p; j += KN_ATT_WARPS) {
        uint64_t slot = (uint64_t)j % kv.cap;
        size_t base = slot * slot_w + (size_t)kvh * hd;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < KN_ATT_PER_LANE; k++) {
            uint32_t d = lane + 32 * k;
            if (d < hd)
                s += qv[k] * kn_kv_dev(kv.k, type, base + d);
        }
        s = kn_warp_sum(s);
        float vs = 1.0f;
        if (type == KN_KV_I8) {
            s *= kv.k_scale[slot * kv.n_kv_heads + kvh];
            vs = kv.v_scale[slot * kv.n_kv_heads + kvh];
        }
        s *= scale;
        float mn = fmaxf(m, s);
        float corr = expf(m - mn); /* 0 on the first position */
        float e = expf(s - mn);
        l = l * corr + e;
#pragma unroll
        for (int k = 0; k < KN_ATT_PER_LANE; k++) {
            uint32_t d = lane + 32 * k;
            float v = d < hd ? kn_kv_dev(kv.v, type, base + d) : 0.0f;
            acc[k] = acc[k] * corr + e * vs * v;
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[wi] = m;
        sm_l[wi] = l;
    }
#pragma unroll
    for (int k = 0; k < KN_ATT_PER_LANE; k++) {
        uint32_t d = lane + 32 * k;
        if (d < hd)
            sm_acc[wi][d] = acc[k];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < KN_ATT_WARPS; w++)
        M = fmaxf(M, sm_m[w]);
    float L = 0.0f;
    for (int w = 0; w < KN_ATT_WARPS; w++)
        L += sm_m[w] == -INFINITY ? 0.0f : sm_l[w] * expf(sm_m[w] - M);
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < KN_ATT_WARPS; w++)
            if (sm_m[w] != -INFINITY)
                o += sm_acc[w][d] * expf(sm_m[w] - M);
        out[th * hd + d] = o / L;
    }
}

static mc_status kn_attention_launch(const kn_kv *kv, const float *q,
                                     size_t T, uint32_t n_heads, int64_t pos0,
                                     uint64_t window, float *out,
                                     cudaStream_t st)
{
    if (!kv || !q || !out || kv->head_dim == 0 ||
        kv->head_dim > KN_CUDA_ATT_MAX_HEAD_DIM || kv->n_kv_heads == 0 ||
        kv->cap == 0 || n_heads % kv->n_kv_heads != 0 || pos0 < 0 ||
        (kv->type == KN_KV_I8 && (!kv->k_scale || !kv->v_scale)))
        return MC_ERR_INVALID_ARG;
    size_t blocks = T * n_heads;
    if (blocks == 0)
        return MC_OK;
    if (blocks > 0x7fffffffu)
        return MC_ERR_INVALID_ARG;
    kn_attention_kernel<<<(unsigned)blocks, 32 * KN_ATT_WARPS, 0, st>>>(
        *kv, q, n_heads, pos0, window, out);
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_attention(const kn_kv *kv, const float *q,
                                       size_t T, uint32_t n_heads,
                                       int64_t pos0, uint64_t window,
                                       float *out, kn_cuda_stream s)
{
    return kn_attention_launch(kv, q, T, n_heads, pos0, window, out,
                               kn_cu_stream(s));
}

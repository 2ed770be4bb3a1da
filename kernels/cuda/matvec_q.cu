/* matvec_q.cu - decode matmul on the GPU for every weight format (int8 and
 * int4 dequantized on the fly): one warp per output row, each lane walks a
 * strided slice of the columns and keeps one partial sum per token. */
#include "kn_cuda_common.cuh"

#define KN_MV_WARPS 4

template <int T>
__global__ void kn_matvec_kernel(const kn_matrix W, const float *X, float *Y,
                                 const float *bias)
{
    uint32_t r = blockIdx.x * KN_MV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= W.rows)
        return;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        acc[t] = 0.0f;
    if (W.fmt == KN_W_Q4 || W.fmt == KN_W_Q4S) {
        /* one byte (two weights) per lane per step */
        uint64_t rb = kn_q4_row_bytes(W.cols);
        for (uint32_t b = lane; b < rb; b += 32) {
            uint32_t c = 2 * b;
            float w0 = kn_dev_w_at(W, r, c);
            float w1 = c + 1 < W.cols ? kn_dev_w_at(W, r, c + 1) : 0.0f;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const float *x = X + (size_t)t * W.cols;
                acc[t] += w0 * x[c] + (c + 1 < W.cols ? w1 * x[c + 1] : 0.0f);
            }
        }
    } else {
        for (uint32_t c = lane; c < W.cols; c += 32) {
            float w = kn_dev_w_at(W, r, c);
#pragma unroll
            for (int t = 0; t < T; t++)
                acc[t] += w * X[(size_t)t * W.cols + c];
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) {
        float v = kn_warp_sum(acc[t]);
        if (lane == 0)
            Y[(size_t)t * W.rows + r] = v + (bias ? bias[r] : 0.0f);
    }
}

template <int T>
static void kn_matvec_launch_t(const kn_matrix &W, const float *X, float *Y,
                               const float *bias, cudaStream_t st)
{
    unsigned blocks = (W.rows + KN_MV_WARPS - 1) / KN_MV_WARPS;
    kn_matvec_kernel<T><<<blocks, 32 * KN_MV_WARPS, 0, st>>>(W, X, Y, bias);
}

static mc_status kn_matvec_launch(const kn_matrix *W, const float *X,
                                  size_t T, float *Y, const float *bias,
                                  cudaStream_t st)
{
    if (!W || !X || !Y || T > KN_CUDA_MATVEC_MAX_T || W->fmt >= KN_W_COUNT_)
        return MC_ERR_INVALID_ARG;
    if ((W->fmt == KN_W_Q4 || W->fmt == KN_W_Q4S) && W->group == 0)
        return MC_ERR_INVALID_ARG;
    if (T == 0 || W->rows == 0)
        return MC_OK;
    switch (T) {
    case 1: kn_matvec_launch_t<1>(*W, X, Y, bias, st); break;
    case 2: kn_matvec_launch_t<2>(*W, X, Y, bias, st); break;
    case 3: kn_matvec_launch_t<3>(*W, X, Y, bias, st); break;
    case 4: kn_matvec_launch_t<4>(*W, X, Y, bias, st); break;
    case 5: kn_matvec_launch_t<5>(*W, X, Y, bias, st); break;
    case 6: kn_matvec_launch_t<6>(*W, X, Y, bias, st); break;
    case 7: kn_matvec_launch_t<7>(*W, X, Y, bias, st); break;
    default: kn_matvec_launch_t<8>(*W, X, Y, bias, st); break;
    }
    return kn_cuda_launched();
}

extern "C" mc_status kn_cuda_matvec(const kn_matrix *W, const float *X,
                                    size_t T, float *Y, const float *bias,
                                    kn_cuda_stream s)
{
    return kn_matvec_launch(W, X, T, Y, bias, kn_cu_stream(s));
}

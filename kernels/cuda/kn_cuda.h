/*
 * kn_cuda.h - CUDA versions of the kernels in kn_ops.h (built only when
 * nvcc is found; MC_HAVE_CUDA is then defined for everything linking
 * mc_cuda).
 *
 * Every entry takes DEVICE pointers for tensors (the kn_matrix / kn_kv
 * structs themselves are host structs whose data pointers are device
 * pointers), enqueues work on `stream` (NULL = legacy default stream) and
 * returns without synchronizing.  Each returns MC_OK, MC_ERR_INVALID_ARG
 * (shape outside what the kernel supports, stated per entry) or
 * MC_ERR_CUDA (a launch or cuBLAS call failed); none aborts or prints.
 * Results match the CPU references of kn_ops.h to float32 rounding, except
 * kn_cuda_gemm which multiplies in f16 (f32 accumulation).
 */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kn_ops.h"
#include "mc_error.h"

/* Same type as cudaStream_t / cublasHandle_t, without their headers. */
typedef struct CUstream_st *kn_cuda_stream;
typedef struct cublasContext *kn_cublas;

/* 1 once cuBLAS has been loaded: kn_cublas_lazy.c loads it at the first
 * cuBLAS call of the process (0 before that, or when loading failed). */
int kn_cublas_loaded(void);

/* Number of usable CUDA devices in *n (0 when there is no driver or
 * device; that is MC_OK, not an error). */
mc_status kn_cuda_device_count(int *n);

/* kn_rmsnorm: out, x [T][n]; w [n].  out may equal x. */
mc_status kn_cuda_rmsnorm(float *out, const float *x, const float *w,
                          size_t T, size_t n, float eps, kn_cuda_stream s);

/* kn_rope_apply: x [T][nheads][head_dim] in place, pos [T] (device),
 * inv_freq [head_dim/2] (device). */
mc_status kn_cuda_rope_apply(float *x, const float *inv_freq,
                             float attn_scale, uint32_t head_dim, size_t T,
                             uint32_t nheads, const int64_t *pos,
                             kn_cuda_stream s);

/* kn_silu_mul: gate [n] in place, up [n]. */
mc_status kn_cuda_silu_mul(float *gate, const float *up, size_t n,
                           kn_cuda_stream s);

/* kn_softmax over each of `rows` rows of n values, in place. */
mc_status kn_cuda_softmax(float *x, size_t rows, size_t n, kn_cuda_stream s);

/* kn_argmax: *out_idx (device u32) = index of the largest of x[n] (first
 * on ties).  n < 2^32. */
mc_status kn_cuda_argmax(const float *x, size_t n, uint32_t *out_idx,
                         kn_cuda_stream s);

/* kn_matmul for decode: Y [T][rows] = X [T][cols] W^T (+ bias), any weight
 * format, T <= KN_CUDA_MATVEC_MAX_T (else MC_ERR_INVALID_ARG: use gemm). */
#define KN_CUDA_MATVEC_MAX_T 8
mc_status kn_cuda_matvec(const kn_matrix *W, const float *X, size_t T,
                         float *Y, const float *bias, kn_cuda_stream s);

/* kn_matmul for prefill: W dequantized to f16 and X converted to f16 in
 * `work` (device, at least kn_cuda_gemm_work_bytes), then cublasGemmEx with
 * f32 accumulation on `blas` (whose stream is set to s). */
uint64_t kn_cuda_gemm_work_bytes(const kn_matrix *W, size_t T);
mc_status kn_cuda_gemm(kn_cublas blas, const kn_matrix *W, const float *X,
                       size_t T, float *Y, const float *bias, void *work,
                       uint64_t work_bytes, kn_cuda_stream s);

/* kn_attention with the KV cache on the device (kv's pointers device
 * pointers); q, out [T][n_heads][head_dim]; head_dim <=
 * KN_CUDA_ATT_MAX_HEAD_DIM.  Needs no scratch (online softmax). */
#define KN_CUDA_ATT_MAX_HEAD_DIM 256
mc_status kn_cuda_attention(const kn_kv *kv, const float *q, size_t T,
                            uint32_t n_heads, int64_t pos0, uint64_t window,
                            float *out, kn_cuda_stream s);

/* ---- calibration statistics ------------------------------------------
 * Device-side sums for one linear input of width `cols` (cmp_calib.h):
 *   Hq += Xq^T Xq,  and with `full`:  Hf += Xf^T Xf,  C += Xf^T Xq
 * (C[i][j] = sum_t xf[t][i] xq[t][j]), X row-major [T][cols] float32 from
 * HOST memory, converted to double on the device; the sums are double,
 * full row-major matrices (Hq, Hf symmetric; only their upper triangles,
 * j >= i, are guaranteed).  The same sums as cmp_hessian_add and the CPU
 * cross term, up to summation order (cuBLAS Dsyrk / Dgemm).
 * kn_cuda_stats_add_f stores X as this token chunk's x_f (and adds it to
 * Hf); kn_cuda_stats_add_q adds Xq to Hq and, with full, Xf^T Xq with the
 * x_f stored by the last add_f (same T).  Calls run on the legacy default
 * stream and return when the sums are updated. */
typedef struct kn_cuda_stats kn_cuda_stats;
typedef enum { KN_STATS_HQ = 0, KN_STATS_HF = 1, KN_STATS_C = 2 } kn_stats_which;
/* Device bytes kn_cuda_stats_create allocates. */
uint64_t kn_cuda_stats_device_bytes(uint32_t cols, size_t max_T, int full);
/* bf16: each uploaded input is rounded to bfloat16 first (kn_bf16_round's
 * rounding: the products of kn_gram_tri_bf16, exact in float).
 * MC_ERR_CUDA (no device, out of device memory, cuBLAS), MC_ERR_NOMEM,
 * MC_ERR_INVALID_ARG (cols or max_T 0, or over 2^31). */
mc_status kn_cuda_stats_create(uint32_t cols, size_t max_T, int full, int bf16,
                               kn_cuda_stats **out);
mc_status kn_cuda_stats_add_f(kn_cuda_stats *s, const float *xf, size_t T);
mc_status kn_cuda_stats_add_q(kn_cuda_stats *s, const float *xq, size_t T);
/* Copy rows [row0, row0 + nrows) of one sum into host out [nrows][cols]. */
mc_status kn_cuda_stats_read_rows(kn_cuda_stats *s, kn_stats_which which,
                                  uint32_t row0, uint32_t nrows, double *out);
void kn_cuda_stats_free(kn_cuda_stats *s); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif

#endif /* KN_CUDA_H */

/*
 * rt_cuda_internal.h - the CUDA backend's context, shared by rt_cuda.c
 * (create, device memory, weights, warm-up) and rt_cuda_step.c (the
 * forward pass: upload, blocks, head).  Not installed; CUDA builds only.
 */
#ifndef RT_CUDA_INTERNAL_H
#define RT_CUDA_INTERNAL_H

#ifdef MC_CUDA_MODULE

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kn_block.h"
#include "kn_cuda.h"
#include "rt_cuda.h"
#include "rt_backend.h"

/* The CUDA backend of rt_backend.h: its context. */
typedef struct rt_cu_backend {
    const rt_model *m;         /* borrowed; host views (embedding lookup) */
    rt_layout layout;
    rt_cuda_options opt;
    rt_cuda_plan plan;
    rt_cuda_mem mem;

    /* device objects, created at create, released at free */
    cudaStream_t stream;
    cublasHandle_t blas;
    uint8_t *dev;              /* the one cudaMalloc, plan.total_bytes */

    /* device views (pointers into dev) */
    rt_layer *layers;          /* [num_layers] weights on the device */
    const float *final_norm;   /* [hidden] */
    kn_matrix lm_head;         /* [vocab][hidden] */
    kn_kv *kv;                 /* [num_layers][max_batch] KV views */
    void *gemm_work;           /* plan.gemm_work_bytes */
    float *gemm_y;             /* f32 Y tile after gemm_work */
    int64_t *d_pos;            /* [chunk] */
    float *d_x, *d_hx, *d_logits;
    uint32_t *d_tok;           /* [max_batch] argmax results (INDEX buf) */
    float *d_rope;             /* [head_dim/2] default inv_freq */
    float *d_rope_slot;        /* [max_batch][head_dim/2] dynamic NTK */
    kn_block_scratch sc;       /* xb q k v att hb hb2 (attn unused) */

    /* host tables (mc_malloc'ed at create) */
    rt_step_tables tab;        /* lent to the scheduler: ids pos segs rows
                                  index slot_rope (rt_backend.h) */
    float *x_host;             /* [chunk][hidden] embedding rows */
    float *logits_host;        /* [max_batch][vocab] */
    int32_t *tok_host;         /* [max_batch] device argmax results */
    float *rope_host;          /* [head_dim/2] default inv_freq */
    float rope_scale;          /* default attn_scale */
    float *slot_inv;           /* [max_batch][head_dim/2] dynamic NTK */
} rt_cu_backend;

/* Record a CUDA runtime failure (op named) and return MC_ERR_CUDA. */
mc_status rt_cu_fail(mc_error *err, const char *op, cudaError_t e);
/* Same for a kernel entry's status (st != MC_OK). */
mc_status rt_cu_fail_kn(mc_error *err, const char *op, mc_status st);
/* Same for a cuBLAS call. */
mc_status rt_cu_blas_fail(mc_error *err, const char *op, cublasStatus_t b);

/* The module's entries behind rt_cuda_module.h (rt_cuda.c). */
mc_status rt_cum_session_create(const rt_model *model, const rt_limits *lim,
                                const rt_layout *layout,
                                const rt_cuda_options *o, rt_session **out,
                                mc_error *err);
const rt_cuda_plan *rt_cum_session_plan(const rt_session *s);
void rt_cum_session_memory(const rt_session *s, rt_cuda_mem *out);

/* Y[T][rows] = X[T][cols] W^T (+ bias) on the session's stream; t_cap =
 * rows the X and Y buffers have (gemm pads T up to a power of two <=
 * t_cap). */
mc_status rt_cu_matmul(rt_cu_backend *s, const kn_matrix *W,
                       const float *X, size_t T, float *Y, const float *bias,
                       size_t t_cap, mc_error *err);

/* Free the backend context (rt_backend_i.free; NULL is a no-op). */
void rt_cu_free(void *ctx);

/* The backend's function table (rt_cuda_step.c). */
extern const rt_backend_i rt_cu_backend_i;

#endif /* MC_CUDA_MODULE */
#endif /* RT_CUDA_INTERNAL_H */

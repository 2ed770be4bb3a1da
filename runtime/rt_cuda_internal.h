/*
 * rt_cuda_internal.h - the GPU session's struct, shared by rt_cuda.c
 * (create, device memory, weights, warm-up) and rt_cuda_step.c (the step
 * loop and the request entry points).  Not installed; CUDA builds only.
 */
#ifndef RT_CUDA_INTERNAL_H
#define RT_CUDA_INTERNAL_H

#ifdef MC_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kn_block.h"
#include "kn_cuda.h"
#include "rt_cuda.h"
#include "rt_request.h"
#include "rt_sample.h"

typedef enum rt_cuda_mode {
    RT_CU_GENERATE = 0,
    RT_CU_SCORE = 1,
    RT_CU_LOGITS = 2,
} rt_cuda_mode;


struct rt_cuda_session {
    const rt_model *m;         /* borrowed; host views (embedding lookup) */
    rt_layout layout;
    rt_cuda_options opt;
    rt_cuda_plan plan;
    rt_cuda_mem mem;
    int broken;                /* a CUDA call failed: refuse further work */

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
    rt_seq *seq;          /* [max_batch] */
    int32_t *ids;              /* [chunk] */
    int64_t *pos;              /* [chunk] */
    int32_t *rows;             /* [chunk][2] (row, sequence) */
    kn_block_segment *segs;    /* [max_batch] (kv unused: per layer) */
    size_t *seg_seq;           /* [max_batch] */
    float *x_host;             /* [chunk][hidden] embedding rows */
    float *logits_host;        /* [max_batch][vocab] */
    float *probs;              /* [vocab] sampler scratch */
    int32_t *index;            /* [vocab] sampler scratch */
    uint32_t *tok_host;        /* [max_batch] */
    float *rope_host;          /* [head_dim/2] default inv_freq */
    float rope_scale;          /* default attn_scale */
    float *slot_inv;           /* [max_batch][head_dim/2] dynamic NTK */
    float *slot_scale;         /* [max_batch] */
    int dynamic_rope;

    /* the current call */
    rt_cuda_mode mode;
    const rt_gen_params *gp;
    rt_gen_result *gres;
    rt_score_item *items;
    const int32_t *labels;
    size_t n_labels;
    float *const *logits_out;
    rt_session_stats stats;
};

/* Record a CUDA runtime failure (op named) and return MC_ERR_CUDA. */
mc_status rt_cu_fail(mc_error *err, const char *op, cudaError_t e);
/* Same for a kernel entry's status (st != MC_OK). */
mc_status rt_cu_fail_kn(mc_error *err, const char *op, mc_status st);

/* Y[T][rows] = X[T][cols] W^T (+ bias) on the session's stream; t_cap =
 * rows the X and Y buffers have (gemm pads T up to a power of two <=
 * t_cap). */
mc_status rt_cu_matmul(rt_cuda_session *s, const kn_matrix *W,
                       const float *X, size_t T, float *Y, const float *bias,
                       size_t t_cap, mc_error *err);

/* Run the session's calls until every sequence of the current call (n of
 * them, already set up in s->seq) is done. */
mc_status rt_cu_run_calls(rt_cuda_session *s, size_t n, mc_error *err);

#endif /* MC_HAVE_CUDA */
#endif /* RT_CUDA_INTERNAL_H */

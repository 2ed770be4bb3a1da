/*
 * rt_cuda.h - the CUDA backend (rt_backend.h) and its device queries: a
 * session on an NVIDIA GPU is an rt_session (the one scheduler, same
 * requests, sampler and refusals as on the CPU) whose forward pass runs
 * the CUDA kernels of kernels/cuda/kn_cuda.h.
 *
 * Memory: ONE cudaMalloc at create, never another device allocation:
 *
 *   dev                                                    total_bytes
 *   +-------------------+--------------------+-----------+-------------+
 *   | weights           | arena              | cuBLAS    | gemm        |
 *   | (every matrix the | (rt_layout offsets:| workspace | staging     |
 *   | device reads, as  |  KV cache, step    | (cublas-  | (f16 W tile,|
 *   | stored; norms and |  buffers: exactly  |  Set-     |  f16 X,     |
 *   | biases f32)       |  the CPU layout)   | Workspace)|  f32 Y tile)|
 *   +-------------------+--------------------+-----------+-------------+
 *   each region starts 256-byte aligned; each weight part too.
 *
 * The untied embedding table stays on the host: a step looks its rows up
 * in the host mapping (kn_matrix_row) and uploads T x hidden floats.  So the
 * device weights are the plan's weights minus an untied embed_tokens (a
 * tied one is the lm_head and is on the device).
 *
 * The context, the stream and the cuBLAS handle are created before the
 * allocation; create then runs every kernel shape a request can use once
 * (warm-up), so lazily loaded kernel modules are loaded at create and
 * device memory in use does not grow afterwards (rt_cuda_session_memory
 * reports what create measured with cudaMemGetInfo).
 *
 * Numerics: steps of T <= 8 rows (decode) use kn_cuda_matvec (f32
 * accumulation, results match the CPU session to float rounding: ~1e-5
 * relative for f32 weights); steps of >= gemm_min_rows rows use
 * kn_cuda_gemm (cuBLAS, inputs rounded to f16: ~1e-3 relative), with T
 * padded to a power of two (fixed shapes: the warm-up covers them).
 * Rows in between use the matvec kernel 8 rows at a time.
 *
 * Supported: every weight format of kn_quant.h, biases, sliding windows,
 * every RoPE type (dynamic NTK tables are uploaded per step), KV type f32.
 * f16/int8 KV and head_dim > KN_CUDA_ATT_MAX_HEAD_DIM are refused with
 * MC_ERR_UNSUPPORTED (the CUDA kernels have no KV store for them yet).
 * No calibration tap.  Not thread-safe: one call at a time per session.
 *
 * Built without CUDA (MC_HAVE_CUDA undefined), every function that needs
 * the device returns MC_ERR_UNSUPPORTED ("built without CUDA") and
 * rt_cuda_device_count reports 0 devices; rt_cuda_plan_for (arithmetic
 * only) works in every build.
 */
#ifndef RT_CUDA_H
#define RT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"
#include "rt_layout.h"
#include "rt_model.h"
#include "rt_session.h"

/* cuBLAS workspace handed over with cublasSetWorkspace (NVIDIA's
 * recommendation for Hopper); equal to CMP_CUBLAS_WORKSPACE_BYTES of
 * compiler/cmp_plan.h. */
#define RT_CUDA_CUBLAS_WORKSPACE_BYTES (32ull << 20)
/* Largest f16 copy of a weight matrix the prefill gemm dequantizes at
 * once; larger matrices go through row tiles of at most this size. */
#define RT_CUDA_GEMM_TILE_BYTES (64ull << 20)
/* cudaMalloc rounds to this granularity (large allocations). */
#define RT_CUDA_ALLOC_GRANULARITY (2ull << 20)

typedef struct rt_cuda_options {
    int device;               /* CUDA device ordinal (default 0) */
    int prefill_gemm;         /* 1 (default): steps of >= gemm_min_rows rows
                                 use cuBLAS; 0: matvec only (f32 exact) */
    uint32_t gemm_min_rows;   /* default 33: batch-32 decode stays on the
                                 matvec kernel (4 passes), prefill chunks
                                 go to cuBLAS */
    int warm_up;              /* 1 (default): run every shape at create */
} rt_cuda_options;

void rt_cuda_options_default(rt_cuda_options *o);

/* Device bytes of a session: the one allocation. */
typedef struct rt_cuda_plan {
    uint64_t weights_bytes;   /* matrices the device reads + f32 norms and
                                 biases, each part 256-aligned */
    uint64_t arena_bytes;     /* layout.arena_bytes */
    uint64_t cublas_workspace_bytes; /* RT_CUDA_CUBLAS_WORKSPACE_BYTES */
    uint64_t gemm_staging_bytes;     /* 0 when prefill_gemm is off */
    uint64_t weights_off, arena_off, cublas_off, gemm_off; /* in the block */
    uint64_t gemm_work_bytes; /* f16 W tile + f16 X part of the staging */
    uint64_t total_bytes;     /* the cudaMalloc size */
} rt_cuda_plan;

/* The device bytes a session of model m with layout would allocate under
 * options o (NULL = defaults).  Pure arithmetic; any build. */
mc_status rt_cuda_plan_for(const rt_model *m, const rt_layout *layout,
                           const rt_cuda_options *o, rt_cuda_plan *out,
                           mc_error *err);

/* The gemm staging bytes of rt_cuda_plan_for from the config alone (for
 * the memory planner: staging depends on the matrix shapes, the chunk and
 * max_batch, not on the formats).  o NULL = defaults. */
uint64_t rt_cuda_staging_for(const fmt_model_config *cfg,
                             const rt_limits *lim, const rt_cuda_options *o);

/* Number of usable CUDA devices (0 without driver, device or CUDA build;
 * that is MC_OK). */
mc_status rt_cuda_device_count(int *n);

/* Device name and memory ("NVIDIA H200", bytes).  name may be NULL. */
mc_status rt_cuda_device_info(int device, char *name, size_t name_len,
                              uint64_t *total_bytes, mc_error *err);

/* cudaMemGetInfo on device: free and total bytes right now. */
mc_status rt_cuda_mem_info(int device, uint64_t *free_bytes,
                           uint64_t *total_bytes, mc_error *err);

/* What the device takes outside our allocations, measured with
 * cudaMemGetInfo: after cudaFree(0) (the context; the "before" of a
 * context cannot be read in-process, so it is total - free, which counts
 * other processes' memory too: run on an otherwise idle device) and the
 * growth from cublasCreate.  Call it in a process that holds no session
 * yet.  reserve_bytes is what a plan should reserve for device. */
typedef struct rt_cuda_reserve {
    uint64_t device_total_bytes;
    uint64_t context_bytes;   /* in use after cudaFree(0) */
    uint64_t cublas_bytes;    /* growth after cublasCreate + stream */
    uint64_t reserve_bytes;   /* context + cublas */
} rt_cuda_reserve;
mc_status rt_cuda_measure_reserve(int device, rt_cuda_reserve *out,
                                  mc_error *err);

/* Create a session on the GPU for model (borrowed; must outlive the
 * session) under lim: the one scheduler of rt_session.h (rt_sched.c) over
 * the CUDA backend (rt_backend.h), so every rt_session_* call works on
 * it (requests, continuous batching, stats; the arena canary functions
 * return 0 and the tap is ignored).  layout as rt_session_create (NULL:
 * built from lim; a stored plan must match exactly).  o NULL = defaults.
 * Errors: MC_ERR_UNSUPPORTED (no CUDA build or device, KV type, head_dim),
 * MC_ERR_NOMEM (the device has less free memory than the plan: the
 * message gives both), MC_ERR_CUDA (a CUDA/cuBLAS call failed, named),
 * MC_ERR_PLAN (layout).  A failed CUDA call during a request returns
 * MC_ERR_CUDA and leaves the session unusable (every later call returns
 * MC_ERR_CUDA).  Free with rt_session_free. */
mc_status rt_cuda_session_create(const rt_model *model, const rt_limits *lim,
                                 const rt_layout *layout,
                                 const rt_cuda_options *o,
                                 rt_session **out, mc_error *err);

/* The device plan of a CUDA session; NULL for a session on another
 * backend. */
const rt_cuda_plan *rt_cuda_session_plan(const rt_session *s);

/* cudaMemGetInfo readings taken by create. */
typedef struct rt_cuda_mem {
    uint64_t device_total_bytes;
    uint64_t used_before_bytes;  /* after context, stream, cuBLAS handle */
    uint64_t alloc_delta_bytes;  /* growth of used over the one cudaMalloc */
    int64_t load_growth_bytes;   /* growth over weight upload + warm-up
                                    (lazy library loads; 0 expected) */
    uint64_t used_after_load_bytes;
} rt_cuda_mem;
/* What create measured (zeros for a session on another backend). */
void rt_cuda_session_memory(const rt_session *s, rt_cuda_mem *out);

#endif /* RT_CUDA_H */

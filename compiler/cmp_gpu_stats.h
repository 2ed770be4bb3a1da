/*
 * cmp_gpu_stats.h - the calibration's statistics accumulated on a CUDA GPU
 * (kernels/cuda/stats.cu: cuBLAS Dsyrk/Dgemm in double) instead of by
 * cmp_hessian_add and the CPU cross term.  Same sums up to summation
 * order; the forward passes and the quantization stay on the CPU.
 *
 * Why: collecting Hq, Hf and C costs O(tokens x width^2) per input group,
 * the calibration's largest term for wide models (28672 x 28672 per token
 * for a 70B down_proj); a GPU does it at hundreds of GFLOP/s in double.
 *
 * In a build without CUDA, or without a device, cmp_gpu_stats_available()
 * is 0 and create returns MC_ERR_UNSUPPORTED.
 */
#ifndef CMP_GPU_STATS_H
#define CMP_GPU_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_gptq.h"
#include "mc_error.h"

typedef struct cmp_gpu_stats cmp_gpu_stats;

/* 1 when built with CUDA and a device is present. */
int cmp_gpu_stats_available(void);

/* Accumulators for one input of width cols, sequences of up to max_T
 * tokens; full: also Hf and C; bf16: the inputs rounded to bfloat16 as
 * cmp_hessian's bf16 sums round them.  MC_ERR_UNSUPPORTED (no CUDA or
 * device), MC_ERR_CUDA (device memory, cuBLAS), MC_ERR_NOMEM. */
mc_status cmp_gpu_stats_create(uint32_t cols, size_t max_T, int full, int bf16,
                               cmp_gpu_stats **out, mc_error *err);
/* pass 0: x is the sequence's x_f (Hf; kept for C); pass 1: x_q (Hq, and
 * C with the x_f of the same sequence).  x [T][cols] host floats. */
mc_status cmp_gpu_stats_add(cmp_gpu_stats *g, int pass, const float *x,
                            size_t T);
/* Copy the sums into the host statistics: hq (and hf when full, both
 * packed as cmp_gptq.h keeps them) and c [cols][cols] (when full); the
 * token counts (hq->n, hf->n) are the caller's.  A host row buffer of 64
 * rows is allocated for the copy.  MC_ERR_CUDA, MC_ERR_NOMEM. */
mc_status cmp_gpu_stats_read(cmp_gpu_stats *g, cmp_hessian *hq,
                             cmp_hessian *hf, double *c, mc_error *err);
/* Host bytes cmp_gpu_stats_read allocates. */
uint64_t cmp_gpu_stats_read_bytes(uint32_t cols);
void cmp_gpu_stats_free(cmp_gpu_stats *g); /* NULL is a no-op */

/* Device memory free now (device 0) in *free_bytes.  MC_ERR_CUDA,
 * MC_ERR_UNSUPPORTED (no CUDA in this build). */
mc_status cmp_gpu_stats_device_free(uint64_t *free_bytes, mc_error *err);
/* Device memory the statistics leave to the CUDA context and cuBLAS's
 * workspace: cmp_calib_run asks for the planned device bytes plus this. */
#define CMP_GPU_STATS_MARGIN ((uint64_t)256 << 20)

#endif /* CMP_GPU_STATS_H */

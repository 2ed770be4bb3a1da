/* rt_cuda_dev.c - the CUDA module's device queries (rt_cuda.h: device
 * count, name, memory, the measured reserve) and the table the runtime
 * loads it by (rt_cuda_module.h). */
#include "rt_cuda_module.h"

#ifdef MC_CUDA_MODULE

#include <stdio.h>
#include <string.h>

#include "rt_cuda_internal.h"

static mc_status dev_count(int *n)
{
    return kn_cuda_device_count(n);
}

static mc_status dev_info(int device, char *name, size_t name_len,
                        uint64_t *total_bytes, mc_error *err)
{
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "cudaGetDeviceProperties", e);
    if (name && name_len)
        snprintf(name, name_len, "%s", p.name);
    if (total_bytes)
        *total_bytes = p.totalGlobalMem;
    return MC_OK;
}

static mc_status mem_info(int device, uint64_t *free_bytes,
                          uint64_t *total_bytes, mc_error *err)
{
    size_t f = 0, t = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "cudaMemGetInfo", e);
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
    return MC_OK;
}

static mc_status measure_reserve(int device, rt_cuda_reserve *out,
                                 mc_error *err)
{
    memset(out, 0, sizeof *out);
    int n = 0;
    kn_cuda_device_count(&n);
    if (device < 0 || device >= n)
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
                       "no CUDA device %d (%d present)", device, n);
    size_t f0 = 0, f1 = 0, t = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaFree(0); /* creates the context */
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&f0, &t);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "context creation", e);
    cudaStream_t st = NULL;
    cublasHandle_t h = NULL;
    e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "cudaStreamCreate", e);
    cublasStatus_t b = cublasCreate(&h);
    if (b == CUBLAS_STATUS_SUCCESS)
        b = cublasSetStream(h, st);
    if (b == CUBLAS_STATUS_SUCCESS) {
        e = cudaMemGetInfo(&f1, &t);
        if (e != cudaSuccess)
            f1 = f0;
    }
    if (h)
        cublasDestroy(h);
    cudaStreamDestroy(st);
    if (b != CUBLAS_STATUS_SUCCESS)
        return rt_cu_blas_fail(err, "cublasCreate", b);
    out->device_total_bytes = t;
    out->context_bytes = t - f0;
    out->cublas_bytes = f0 > f1 ? f0 - f1 : 0;
    out->reserve_bytes = out->context_bytes + out->cublas_bytes;
    return MC_OK;
}

static const rt_cuda_module module = {
    .abi = RT_CUDA_MODULE_ABI,
    .session_bytes = (uint32_t)sizeof(rt_session_stats),
    .device_count = dev_count,
    .device_info = dev_info,
    .mem_info = mem_info,
    .measure_reserve = measure_reserve,
    .session_create = rt_cum_session_create,
    .session_plan = rt_cum_session_plan,
    .session_memory = rt_cum_session_memory,
};

const rt_cuda_module *rt_cuda_module_table(void)
{
    return &module;
}

#endif /* MC_CUDA_MODULE */

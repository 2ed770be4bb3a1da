/*
 * rt_cuda_module.h - how the runtime reaches the CUDA backend without
 * linking CUDA: the backend (rt_cuda.c, rt_cuda_step.c, rt_cuda_dev.c and
 * the kernels) is built as a loadable module, libmc_cuda_backend.so, that
 * rt_cuda_load.c opens with dlopen on the first rt_cuda_* call.
 *
 * Why: linking cudart and cuBLAS into mrun maps them at start-up and costs
 * ~217 MB of resident memory in every run, on the CPU too (measured:
 * `mrun --help` 2.1 MB -> 219 MB), which breaks the plan's promise that
 * the process stays within weights + arena + reserve.  As a module, the
 * libraries are loaded only when a CUDA session or query is asked for.
 *
 * The module's undefined symbols (rt_session_create_backend, rt_layout_*,
 * kn_* host ops, mc_*) resolve against the program that loads it: programs
 * are linked with exported symbols (CMAKE_ENABLE_EXPORTS).  Search order:
 * $MC_CUDA_BACKEND, the build's path (MC_CUDA_MODULE_PATH), then
 * <program dir>/libmc_cuda_backend.so and <program dir>/../lib/.
 */
#ifndef RT_CUDA_MODULE_H
#define RT_CUDA_MODULE_H

#include "rt_cuda.h"

/* Bumped whenever this table or a struct it passes changes. */
#define RT_CUDA_MODULE_ABI 1u
#define RT_CUDA_MODULE_SYMBOL "rt_cuda_module_table"

typedef struct rt_cuda_module {
    uint32_t abi;              /* RT_CUDA_MODULE_ABI */
    uint32_t session_bytes;    /* sizeof(rt_session_stats): a cheap check
                                  that both sides see the same structs */
    mc_status (*device_count)(int *n);
    mc_status (*device_info)(int device, char *name, size_t name_len,
                             uint64_t *total_bytes, mc_error *err);
    mc_status (*mem_info)(int device, uint64_t *free_bytes,
                          uint64_t *total_bytes, mc_error *err);
    mc_status (*measure_reserve)(int device, rt_cuda_reserve *out,
                                 mc_error *err);
    mc_status (*session_create)(const rt_model *model, const rt_limits *lim,
                                const rt_layout *layout,
                                const rt_cuda_options *o, rt_session **out,
                                mc_error *err);
    const rt_cuda_plan *(*session_plan)(const rt_session *s);
    void (*session_memory)(const rt_session *s, rt_cuda_mem *out);
} rt_cuda_module;

/* Exported by the module. */
const rt_cuda_module *rt_cuda_module_table(void);

#endif /* RT_CUDA_MODULE_H */

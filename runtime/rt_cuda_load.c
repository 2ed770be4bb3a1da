/* rt_cuda_load.c - the rt_cuda.h entries the runtime links: each opens the
 * CUDA module (rt_cuda_module.h) on first use and forwards to it.  In a
 * build without CUDA (MC_HAVE_CUDA undefined), or when the module cannot
 * be opened, every entry that needs the device returns MC_ERR_UNSUPPORTED
 * with the reason, and rt_cuda_device_count reports 0 devices.  The plan
 * arithmetic (rt_cuda_plan_for, rt_cuda_staging_for) is in rt_cuda.c and
 * works in every build. */
#include "rt_cuda_module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MC_HAVE_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#endif

/* Why the module is not there (filled once; "" while it is). */
static char load_error[512];

#ifdef MC_HAVE_CUDA
static const rt_cuda_module *loaded;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* dlopen path; 1 on success (sets loaded), else the reason is appended. */
static int try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        size_t n = strlen(load_error);
        snprintf(load_error + n, sizeof load_error - n, "%s%s",
                 n ? "; " : "", why ? why : path);
        return 0;
    }
    const rt_cuda_module *(*get)(void) =
        (const rt_cuda_module *(*)(void))dlsym(h, RT_CUDA_MODULE_SYMBOL);
    const rt_cuda_module *m = get ? get() : NULL;
    if (!m || m->abi != RT_CUDA_MODULE_ABI ||
        m->session_bytes != sizeof(rt_session_stats)) {
        snprintf(load_error, sizeof load_error,
                 "%s is not this build's CUDA module (ABI %u, expected %u)",
                 path, m ? m->abi : 0u, RT_CUDA_MODULE_ABI);
        dlclose(h);
        return 0;
    }
    loaded = m; /* kept open for the life of the process */
    return 1;
}

static void load_module(void)
{
    const char *env = getenv("MC_CUDA_BACKEND");
    if (env && *env) {
        try_open(env);
        return; /* asked for this one: no fallback */
    }
#ifdef MC_CUDA_MODULE_PATH
    if (access(MC_CUDA_MODULE_PATH, R_OK) == 0 && try_open(MC_CUDA_MODULE_PATH))
        return;
#endif
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            const char *rel[] = {"/libmc_cuda_backend.so",
                                 "/../lib/libmc_cuda_backend.so"};
            char path[PATH_MAX + 64];
            for (size_t i = 0; i < 2; i++) {
                snprintf(path, sizeof path, "%s%s", exe, rel[i]);
                if (access(path, R_OK) == 0 && try_open(path))
                    return;
            }
        }
    }
    if (!load_error[0])
        snprintf(load_error, sizeof load_error,
                 "libmc_cuda_backend.so not found (set MC_CUDA_BACKEND to "
                 "its path)");
}
#endif

/* The module, or NULL with err set (MC_ERR_UNSUPPORTED). */
static const rt_cuda_module *module(mc_error *err)
{
#ifdef MC_HAVE_CUDA
    pthread_once(&load_once, load_module);
    if (loaded)
        return loaded;
    mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
            "the CUDA backend cannot be loaded: %s", load_error);
#else
    (void)load_error;
    mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
            "built without CUDA (configure with -DMC_CUDA=ON on a machine "
            "with nvcc)");
#endif
    return NULL;
}

mc_status rt_cuda_device_count(int *n)
{
    const rt_cuda_module *m = module(NULL);
    if (m)
        return m->device_count(n);
    if (n)
        *n = 0;
    return MC_OK;
}

mc_status rt_cuda_device_info(int device, char *name, size_t name_len,
                              uint64_t *total_bytes, mc_error *err)
{
    const rt_cuda_module *m = module(err);
    if (m)
        return m->device_info(device, name, name_len, total_bytes, err);
    if (name && name_len)
        name[0] = '\0';
    if (total_bytes)
        *total_bytes = 0;
    return MC_ERR_UNSUPPORTED;
}

mc_status rt_cuda_mem_info(int device, uint64_t *free_bytes,
                           uint64_t *total_bytes, mc_error *err)
{
    const rt_cuda_module *m = module(err);
    if (m)
        return m->mem_info(device, free_bytes, total_bytes, err);
    if (free_bytes)
        *free_bytes = 0;
    if (total_bytes)
        *total_bytes = 0;
    return MC_ERR_UNSUPPORTED;
}

mc_status rt_cuda_measure_reserve(int device, rt_cuda_reserve *out,
                                  mc_error *err)
{
    const rt_cuda_module *m = module(err);
    if (m)
        return m->measure_reserve(device, out, err);
    if (out)
        memset(out, 0, sizeof *out);
    return MC_ERR_UNSUPPORTED;
}

mc_status rt_cuda_session_create(const rt_model *model, const rt_limits *lim,
                                 const rt_layout *layout,
                                 const rt_cuda_options *o,
                                 rt_session **out, mc_error *err)
{
    if (out)
        *out = NULL;
    const rt_cuda_module *m = module(err);
    return m ? m->session_create(model, lim, layout, o, out, err)
             : MC_ERR_UNSUPPORTED;
}

const rt_cuda_plan *rt_cuda_session_plan(const rt_session *s)
{
#ifdef MC_HAVE_CUDA
    return loaded && s ? loaded->session_plan(s) : NULL;
#else
    (void)s;
    return NULL;
#endif
}

void rt_cuda_session_memory(const rt_session *s, rt_cuda_mem *out)
{
#ifdef MC_HAVE_CUDA
    if (loaded && s) {
        loaded->session_memory(s, out);
        return;
    }
#endif
    (void)s;
    memset(out, 0, sizeof *out);
}

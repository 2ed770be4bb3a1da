/* rt_cuda_absent.c - the GPU session API in a build without CUDA: every
 * entry that needs the device returns MC_ERR_UNSUPPORTED ("built without
 * CUDA"), rt_cuda_device_count reports 0 devices (see rt_cuda.h).  The plan
 * arithmetic (rt_cuda_plan_for, rt_cuda_staging_for) is in rt_cuda.c and
 * works in every build. */
#include "rt_cuda.h"

#include <string.h>

#ifndef MC_HAVE_CUDA

static mc_status no_cuda(mc_error *err)
{
    return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
                   "built without CUDA (configure with -DMC_CUDA=ON on a "
                   "machine with nvcc)");
}

mc_status rt_cuda_device_count(int *n)
{
    if (n)
        *n = 0;
    return MC_OK;
}

mc_status rt_cuda_device_info(int device, char *name, size_t name_len,
                              uint64_t *total_bytes, mc_error *err)
{
    (void)device;
    if (name && name_len)
        name[0] = '\0';
    if (total_bytes)
        *total_bytes = 0;
    return no_cuda(err);
}

mc_status rt_cuda_mem_info(int device, uint64_t *free_bytes,
                           uint64_t *total_bytes, mc_error *err)
{
    (void)device;
    if (free_bytes)
        *free_bytes = 0;
    if (total_bytes)
        *total_bytes = 0;
    return no_cuda(err);
}

mc_status rt_cuda_measure_reserve(int device, rt_cuda_reserve *out,
                                  mc_error *err)
{
    (void)device;
    if (out)
        memset(out, 0, sizeof *out);
    return no_cuda(err);
}

mc_status rt_cuda_session_create(const rt_model *model, const rt_limits *lim,
                                 const rt_layout *layout,
                                 const rt_cuda_options *o,
                                 rt_cuda_session **out, mc_error *err)
{
    (void)model;
    (void)lim;
    (void)layout;
    (void)o;
    if (out)
        *out = NULL;
    return no_cuda(err);
}

void rt_cuda_session_free(rt_cuda_session *s)
{
    (void)s;
}

const rt_layout *rt_cuda_session_layout(const rt_cuda_session *s)
{
    (void)s;
    return NULL;
}

const rt_cuda_plan *rt_cuda_session_plan(const rt_cuda_session *s)
{
    (void)s;
    return NULL;
}

void rt_cuda_session_memory(const rt_cuda_session *s, rt_cuda_mem *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
}

mc_status rt_cuda_session_generate(rt_cuda_session *s,
                                   const rt_prompt *prompts, size_t n,
                                   const rt_gen_params *p,
                                   rt_gen_result *res, mc_error *err)
{
    (void)s;
    (void)prompts;
    (void)n;
    (void)p;
    (void)res;
    return no_cuda(err);
}

mc_status rt_cuda_session_score(rt_cuda_session *s, rt_score_item *items,
                                size_t n, const int32_t *labels,
                                size_t n_labels, rt_truncate truncate,
                                mc_error *err)
{
    (void)s;
    (void)items;
    (void)n;
    (void)labels;
    (void)n_labels;
    (void)truncate;
    return no_cuda(err);
}

mc_status rt_cuda_session_logits(rt_cuda_session *s,
                                 const rt_prompt *prompts, size_t n,
                                 float *const *out, mc_error *err)
{
    (void)s;
    (void)prompts;
    (void)n;
    (void)out;
    return no_cuda(err);
}

void rt_cuda_session_stats_get(const rt_cuda_session *s,
                               rt_session_stats *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
}

void rt_cuda_session_reset_stats(rt_cuda_session *s)
{
    (void)s;
}

#endif /* !MC_HAVE_CUDA */

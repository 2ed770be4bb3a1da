/* cmp_gpu_stats.c - calibration statistics on the GPU (cmp_gpu_stats.h). */
#include "cmp_gpu_stats.h"

#include <string.h>

#include "mc_alloc.h"

#ifdef MC_HAVE_CUDA
#include "kn_cuda.h"
#include "rt_cuda.h"
#endif

enum { READ_ROWS = 64 };

uint64_t cmp_gpu_stats_read_bytes(uint32_t cols)
{
    return (uint64_t)READ_ROWS * cols * sizeof(double);
}

#ifdef MC_HAVE_CUDA

struct cmp_gpu_stats {
    kn_cuda_stats *k;
    uint32_t cols;
    int full;
};

int cmp_gpu_stats_available(void)
{
    int n = 0;
    return kn_cuda_device_count(&n) == MC_OK && n > 0;
}

mc_status cmp_gpu_stats_create(uint32_t cols, size_t max_T, int full, int bf16,
                               cmp_gpu_stats **out, mc_error *err)
{
    *out = NULL;
    if (!cmp_gpu_stats_available())
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                       "no CUDA device for the calibration statistics");
    cmp_gpu_stats *g = mc_calloc(1, sizeof *g);
    if (!g)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "GPU statistics");
    g->cols = cols;
    g->full = full;
    mc_status st = kn_cuda_stats_create(cols, max_T, full, bf16, &g->k);
    if (st != MC_OK) {
        mc_free(g);
        return mc_fail(err, st, NULL, "--calib-device", -1,
                       "cannot set up GPU statistics for a %u-wide input "
                       "(%llu bytes of device memory)", cols,
                       (unsigned long long)kn_cuda_stats_device_bytes(cols, max_T, full));
    }
    *out = g;
    return MC_OK;
}

mc_status cmp_gpu_stats_add(cmp_gpu_stats *g, int pass, const float *x,
                            size_t T)
{
    return pass == 0 ? kn_cuda_stats_add_f(g->k, x, T)
                     : kn_cuda_stats_add_q(g->k, x, T);
}

/* Rows of a symmetric device sum into the packed upper triangle of h. */
static mc_status read_packed(cmp_gpu_stats *g, kn_stats_which w,
                             cmp_hessian *h, double *buf)
{
    uint32_t n = g->cols;
    for (uint32_t r0 = 0; r0 < n; r0 += READ_ROWS) {
        uint32_t nr = n - r0 < READ_ROWS ? n - r0 : READ_ROWS;
        mc_status st = kn_cuda_stats_read_rows(g->k, w, r0, nr, buf);
        if (st != MC_OK)
            return st;
        for (uint32_t r = 0; r < nr; r++) {
            uint32_t i = r0 + r;
            memcpy(h->h + cmp_hessian_row_offset(n, i), buf + (size_t)r * n + i,
                   (size_t)(n - i) * sizeof(double));
        }
    }
    return MC_OK;
}

mc_status cmp_gpu_stats_read(cmp_gpu_stats *g, cmp_hessian *hq,
                             cmp_hessian *hf, double *c, mc_error *err)
{
    double *buf = mc_malloc((size_t)cmp_gpu_stats_read_bytes(g->cols));
    if (!buf)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "GPU statistics read");
    mc_status st = read_packed(g, KN_STATS_HQ, hq, buf);
    if (st == MC_OK && g->full)
        st = read_packed(g, KN_STATS_HF, hf, buf);
    if (st == MC_OK && g->full)
        st = kn_cuda_stats_read_rows(g->k, KN_STATS_C, 0, g->cols, c);
    mc_free(buf);
    if (st != MC_OK)
        return mc_fail(err, st, NULL, "--calib-device", -1,
                       "reading the GPU statistics back failed");
    return MC_OK;
}

void cmp_gpu_stats_free(cmp_gpu_stats *g)
{
    if (!g)
        return;
    kn_cuda_stats_free(g->k);
    mc_free(g);
}

mc_status cmp_gpu_stats_device_free(uint64_t *free_bytes, mc_error *err)
{
    return rt_cuda_mem_info(0, free_bytes, NULL, err);
}

#else /* no CUDA in this build */

int cmp_gpu_stats_available(void)
{
    return 0;
}

mc_status cmp_gpu_stats_create(uint32_t cols, size_t max_T, int full, int bf16,
                               cmp_gpu_stats **out, mc_error *err)
{
    (void)cols;
    (void)max_T;
    (void)full;
    (void)bf16;
    *out = NULL;
    return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                   "built without CUDA (configure with -DMC_CUDA=ON on a "
                   "machine with nvcc)");
}

mc_status cmp_gpu_stats_add(cmp_gpu_stats *g, int pass, const float *x,
                            size_t T)
{
    (void)g;
    (void)pass;
    (void)x;
    (void)T;
    return MC_ERR_UNSUPPORTED;
}

mc_status cmp_gpu_stats_read(cmp_gpu_stats *g, cmp_hessian *hq,
                             cmp_hessian *hf, double *c, mc_error *err)
{
    (void)g;
    (void)hq;
    (void)hf;
    (void)c;
    return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                   "built without CUDA");
}

void cmp_gpu_stats_free(cmp_gpu_stats *g)
{
    (void)g;
}

mc_status cmp_gpu_stats_device_free(uint64_t *free_bytes, mc_error *err)
{
    *free_bytes = 0;
    return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "--calib-device", -1,
                   "built without CUDA");
}

#endif

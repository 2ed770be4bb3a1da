/*
 * kn_stats_bytes.h - device memory of the calibration statistics on a GPU
 * (kn_cuda.h, kn_cuda_stats_*), as plain arithmetic that C and CUDA share:
 * the CUDA code allocates by it, and the calibration's memory plan
 * (cmp_calib_mem.c) adds it up in builds with or without CUDA.
 */
#ifndef KN_STATS_BYTES_H
#define KN_STATS_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Device bytes of one input's sums, width cols, chunks of up to max_T
 * tokens: Hq (and with full Hf and C), [cols][cols] doubles each; the
 * chunk in double (with full also the stored x_f); a float staging copy. */
static inline uint64_t kn_stats_device_bytes(uint32_t cols, size_t max_T,
                                             int full)
{
    uint64_t sq = (uint64_t)cols * cols * sizeof(double);
    uint64_t x = (uint64_t)max_T * cols;
    return sq * (full ? 3 : 1) + x * sizeof(double) * (full ? 2 : 1) +
           x * sizeof(float);
}

#endif /* KN_STATS_BYTES_H */

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

/* Tokens per float product on the device before it is added to the double
 * sums: the CPU's float chunk (KN_GRAM_FC, kn_gram.h; kn_gram.c asserts
 * they agree), so both paths carry the same error bound. */
#define KN_STATS_CHUNK 128

/* Columns of the float product per cuBLAS call: its buffer is cols x
 * KN_STATS_PANEL floats, not cols^2 (3 GiB at a 70B's 28,672-wide FFN),
 * and each call is still a large GEMM. */
#define KN_STATS_PANEL 2048u

/* Bytes of the float product buffer for a cols-wide input. */
static inline uint64_t kn_stats_part_bytes(uint32_t cols)
{
    uint64_t p = cols < KN_STATS_PANEL ? cols : KN_STATS_PANEL;
    return (uint64_t)cols * p * sizeof(float);
}

/* Device bytes of one input's sums, width cols, chunks of up to max_T
 * tokens: Hq (and with full Hf and C), [cols][cols] doubles each; the
 * float product of one KN_STATS_CHUNK-token piece and KN_STATS_PANEL
 * columns (before it is added to the double sums); the uploaded chunk in
 * float (with full also the stored x_f). */
static inline uint64_t kn_stats_device_bytes(uint32_t cols, size_t max_T,
                                             int full)
{
    uint64_t sq = (uint64_t)cols * cols * sizeof(double);
    uint64_t x = (uint64_t)max_T * cols;
    return sq * (full ? 3 : 1) + kn_stats_part_bytes(cols) +
           x * sizeof(float) * (full ? 2 : 1);
}

#endif /* KN_STATS_BYTES_H */

/*
 * kn_quant.h - weight and KV-cache quantization layouts, shared by C and
 * CUDA (include from .cu files too: plain C, no intrinsics).
 *
 * int8 per output channel (KN_W_Q8), symmetric:
 *   w[r][c] = scale[r] * q[r][c],  q int8 in [-127, 127]
 *   data:   int8  [rows][cols]           row-major
 *   scales: float [rows]
 *
 * int4 in groups of g along the input dimension (KN_W_Q4 asymmetric,
 * KN_W_Q4S symmetric), g in {32, 64, 128}; ngroups = ceil(cols / g), the
 * last group of a row may be shorter (ragged rows such as 172 are legal):
 *   w[r][c] = scale[r][c/g] * (q[r][c] - zero[r][c/g]),  q in [0, 15]
 *   data:   u8 [rows][(cols + 1) / 2]    element c of a row is in byte c/2,
 *           low nibble for even c, high nibble for odd c; a row with odd
 *           cols has its last high nibble 0
 *   scales: u16 (IEEE half bits) [rows][ngroups]
 *   zeros:  u8  [rows][ngroups], 0..15 (KN_W_Q4); absent for KN_W_Q4S,
 *           whose zero is 8 (q - 8 in [-8, 7])
 *
 * int4 symmetric in 16-row panels (KN_W_Q4S with kn_matrix.layout =
 * KN_LAYOUT_P16; never in a file: the CPU runtime builds it at load, see
 * kn_pack16.h).  Needs rows % 16 == 0, cols % 32 == 0, g a power of two
 * >= 32; nb = cols / 32 blocks, bpg = g / 32 blocks per group.  The same
 * bytes as the row layout's data + scales, in one array: panel P (rows
 * 16P .. 16P+15) is kn_p16_panel_bytes(cols, g) bytes at P * that; in a
 * panel, per group j in order: the 16 rows' u16 scales of group j (32
 * bytes), then the group's blocks b (up to bpg, the last group may have
 * fewer), 256 bytes each: for m < 4, for row i < 16, the row layout's
 * bytes 16b + 4m .. 16b + 4m + 3 of row 16P + i (nibbles as above).  So
 * a 512-bit load is 16 rows x 4 code bytes, and decode reads one stream.
 *
 * int8 in 16-row panels (KN_W_Q8 with layout KN_LAYOUT_P16; also built at
 * load only).  Needs rows % 16 == 0, cols % 32 == 0; nb = cols / 32.  The
 * same bytes as data + scales: panel P (rows 16P .. 16P+15) is
 * kn_p16_q8_panel_bytes(cols) bytes at P * that: the 16 rows' f32 scales
 * (64 bytes), then per block b, 512 bytes: for pair k < 16, for row i <
 * 16, the row layout's bytes 32b + 2k, 32b + 2k + 1 of row 16P + i.  So
 * a 256-bit load sign-extended to 16-bit is 16 rows x 2 columns, the
 * dword of two int16 activations that vpdpwssd multiplies.
 *
 * int8 KV cache (KN_KV_I8): per token and per KV head, symmetric:
 *   x[h][d] = scale[h] * q[h][d], scale = max|x[h][:]| / 127 (f32).
 */
#ifndef KN_QUANT_H
#define KN_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum kn_wformat {
    KN_W_F32 = 0,
    KN_W_F16 = 1,
    KN_W_BF16 = 2,
    KN_W_Q8 = 3,  /* int8 per row, f32 scale per row */
    KN_W_Q4 = 4,  /* int4 groups, f16 scale + u8 zero per group */
    KN_W_Q4S = 5, /* int4 groups, f16 scale per group, zero 8 */
    KN_W_COUNT_
} kn_wformat;

typedef enum kn_kvtype {
    KN_KV_F32 = 0,
    KN_KV_F16 = 1,
    KN_KV_I8 = 2,
} kn_kvtype;

#define KN_Q4_ZERO_SYM 8

/* The one name table of each enum (kn_names.c): the artifact's tensor
 * "format" strings and the plan's "kv_type", also the CLI values of --kv.
 * Names: "f32" "f16" "bf16" "q8" "q4" "q4s"; "f32" "f16" "int8" (a parse
 * also takes "i8").  name() returns "?" for a value out of range; parse()
 * returns 0 and sets *out, or -1 for an unknown name (or NULL). */
const char *kn_wformat_name(kn_wformat f);
int kn_wformat_parse(const char *s, kn_wformat *out);
const char *kn_kvtype_name(kn_kvtype t);
int kn_kvtype_parse(const char *s, kn_kvtype *out);

/* The inline helpers below are callable from CUDA device code too. */
#ifdef __CUDACC__
#define KN_HOST_DEVICE __host__ __device__
#else
#define KN_HOST_DEVICE
#endif
#ifdef __cplusplus
#define KN_STATIC_ASSERT static_assert
#else
#define KN_STATIC_ASSERT _Static_assert
#endif

KN_HOST_DEVICE static inline uint32_t kn_q4_ngroups(uint32_t cols, uint32_t group)
{
    return (cols + group - 1) / group;
}
KN_HOST_DEVICE static inline uint64_t kn_q4_row_bytes(uint32_t cols)
{
    return ((uint64_t)cols + 1) / 2;
}

/* Bytes of each part of a rows x cols matrix in format f (group for Q4).
 * Returns 0 for a part the format does not have. */
KN_HOST_DEVICE static inline uint64_t kn_wformat_data_bytes(kn_wformat f, uint32_t rows,
                                             uint32_t cols)
{
    uint64_t n = (uint64_t)rows * cols;
    switch (f) {
    case KN_W_F32: return n * 4;
    case KN_W_F16: case KN_W_BF16: return n * 2;
    case KN_W_Q8: return n;
    case KN_W_Q4: case KN_W_Q4S: return (uint64_t)rows * kn_q4_row_bytes(cols);
    default: return 0;
    }
}
KN_HOST_DEVICE static inline uint64_t kn_wformat_scale_bytes(kn_wformat f, uint32_t rows,
                                              uint32_t cols, uint32_t group)
{
    switch (f) {
    case KN_W_Q8: return (uint64_t)rows * 4;
    case KN_W_Q4: case KN_W_Q4S:
        return (uint64_t)rows * kn_q4_ngroups(cols, group) * 2;
    default: return 0;
    }
}
/* KN_LAYOUT_P16 (above): bytes of one 16-row panel; the offset in a panel
 * of group j's scales and of block b's 256 bytes. */
KN_HOST_DEVICE static inline uint64_t kn_p16_panel_bytes(uint32_t cols, uint32_t group)
{
    return (uint64_t)kn_q4_ngroups(cols, group) * 32 + (uint64_t)(cols / 32) * 256;
}
KN_HOST_DEVICE static inline uint64_t kn_p16_scale_off(uint32_t j, uint32_t group)
{
    return (uint64_t)j * (32 + (uint64_t)(group / 32) * 256);
}
KN_HOST_DEVICE static inline uint64_t kn_p16_block_off(uint32_t b, uint32_t group)
{
    return (uint64_t)(b / (group / 32) + 1) * 32 + (uint64_t)b * 256;
}

/* KN_W_Q8 in KN_LAYOUT_P16 (above): bytes of one panel; the offset in a
 * panel of block b's 512 bytes (the scales are at 0). */
KN_HOST_DEVICE static inline uint64_t kn_p16_q8_panel_bytes(uint32_t cols)
{
    return 64 + (uint64_t)cols * 16;
}
KN_HOST_DEVICE static inline uint64_t kn_p16_q8_block_off(uint32_t b)
{
    return 64 + (uint64_t)b * 512;
}

KN_HOST_DEVICE static inline uint64_t kn_wformat_zero_bytes(kn_wformat f, uint32_t rows,
                                             uint32_t cols, uint32_t group)
{
    return f == KN_W_Q4 ? (uint64_t)rows * kn_q4_ngroups(cols, group) : 0;
}

KN_STATIC_ASSERT(sizeof(uint16_t) == 2, "f16 scales are 2 bytes");
KN_STATIC_ASSERT(KN_W_COUNT_ == 6, "update the layout table above");

#endif /* KN_QUANT_H */

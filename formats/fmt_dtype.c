/* fmt_dtype.c - dtype names, sizes and f16/bf16 conversions (RNE). */
#include "fmt_dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[FMT_DT_COUNT_] = {
    [FMT_DT_INVALID] = {"INVALID", 0}, [FMT_DT_F32] = {"F32", 4},
    [FMT_DT_F16] = {"F16", 2},         [FMT_DT_BF16] = {"BF16", 2},
    [FMT_DT_I8] = {"I8", 1},           [FMT_DT_U8] = {"U8", 1},
    [FMT_DT_I32] = {"I32", 4},         [FMT_DT_F64] = {"F64", 8},
    [FMT_DT_I64] = {"I64", 8},         [FMT_DT_I16] = {"I16", 2},
    [FMT_DT_U16] = {"U16", 2},         [FMT_DT_U32] = {"U32", 4},
    [FMT_DT_U64] = {"U64", 8},         [FMT_DT_BOOL] = {"BOOL", 1},
    [FMT_DT_F8_E4M3] = {"F8_E4M3", 1}, [FMT_DT_F8_E5M2] = {"F8_E5M2", 1},
};

fmt_dtype fmt_dtype_from_name(const char *name)
{
    if (!name)
        return FMT_DT_INVALID;
    for (int i = 1; i < FMT_DT_COUNT_; i++)
        if (strcmp(dtype_table[i].name, name) == 0)
            return (fmt_dtype)i;
    return FMT_DT_INVALID;
}

const char *fmt_dtype_name(fmt_dtype dt)
{
    if ((unsigned)dt >= FMT_DT_COUNT_)
        return "INVALID";
    return dtype_table[dt].name;
}

size_t fmt_dtype_size(fmt_dtype dt)
{
    if ((unsigned)dt >= FMT_DT_COUNT_)
        return 0;
    return dtype_table[dt].size;
}

int fmt_dtype_is_float(fmt_dtype dt)
{
    return dt == FMT_DT_F32 || dt == FMT_DT_F16 || dt == FMT_DT_BF16;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float fmt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* subnormal: value = mant * 2^-24 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t fmt_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    if (absx >= 0x477ff000u) /* >= 65520: rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below 2^-14: subnormal or zero in f16 */
        if (absx < 0x33000000u) /* < 2^-25: rounds to zero */
            return sign;
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        int shift = (int)(126 - e); /* 14..24 in this range */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias and round 13 mantissa bits away, ties to even */
    uint32_t r = absx - 0x38000000u; /* exponent 127 -> 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

float fmt_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}

uint16_t fmt_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

int fmt_to_f32(fmt_dtype dt, const void *src, float *dst, size_t n)
{
    const unsigned char *p = src;
    switch (dt) {
    case FMT_DT_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case FMT_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = fmt_f16_to_f32(h);
        }
        return 0;
    case FMT_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = fmt_bf16_to_f32(h);
        }
        return 0;
    default:
        return -1;
    }
}

int fmt_from_f32(fmt_dtype dt, const float *src, void *dst, size_t n)
{
    unsigned char *p = dst;
    switch (dt) {
    case FMT_DT_F32:
        memcpy(dst, src, n * 4);
        return 0;
    case FMT_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = fmt_f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    case FMT_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = fmt_f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
        return 0;
    default:
        return -1;
    }
}

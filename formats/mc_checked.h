/*
 * mc_checked.h - overflow-checked size arithmetic for every size, offset and
 * count that comes from a file.  Each returns 1 on success (result stored)
 * and 0 on overflow (result untouched).  Bounds checks are written as
 * `off <= size && n <= size - off`, never `off + n <= size`.
 */
#ifndef MC_CHECKED_H
#define MC_CHECKED_H

#include <stddef.h>
#include <stdint.h>

static inline int mc_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > UINT64_MAX - a)
        return 0;
    *out = a + b;
    return 1;
}

static inline int mc_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static inline int mc_add_size(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return 0;
    *out = a + b;
    return 1;
}

static inline int mc_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* 1 if [off, off+n) lies inside [0, size). */
static inline int mc_range_ok(uint64_t off, uint64_t n, uint64_t size)
{
    return off <= size && n <= size - off;
}

/* Round x up to a multiple of align (a power of two); 0 on overflow. */
static inline int mc_align_up_u64(uint64_t x, uint64_t align, uint64_t *out)
{
    uint64_t t;
    if (!mc_add_u64(x, align - 1, &t))
        return 0;
    *out = t & ~(align - 1);
    return 1;
}

#endif /* MC_CHECKED_H */

/* tmat.c - see tmat.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "fmt_dtype.h"
#include "tmat.h"

tu_tmat tu_tmat_make(tu_rng *rng, kn_wformat f, uint32_t rows, uint32_t cols,
                     uint32_t group)
{
    tu_tmat t = { 0 };
    t.m.fmt = f;
    t.m.rows = rows;
    t.m.cols = cols;
    t.m.group = (f == KN_W_Q4 || f == KN_W_Q4S) ? group : 0;
    size_t n = (size_t)rows * cols;
    size_t db = (size_t)kn_wformat_data_bytes(f, rows, cols);
    size_t sb = (size_t)kn_wformat_scale_bytes(f, rows, cols, group);
    size_t zb = (size_t)kn_wformat_zero_bytes(f, rows, cols, group);
    t.data = malloc(db ? db : 1);
    t.scales = sb ? malloc(sb) : NULL;
    t.zeros = zb ? malloc(zb) : NULL;
    assert_non_null(t.data);
    switch (f) {
    case KN_W_F32:
        for (size_t i = 0; i < n; i++)
            ((float *)t.data)[i] = tu_rng_f(rng);
        break;
    case KN_W_F16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)t.data)[i] = fmt_f32_to_f16(tu_rng_f(rng));
        break;
    case KN_W_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)t.data)[i] = fmt_f32_to_bf16(tu_rng_f(rng));
        break;
    case KN_W_Q8:
        for (size_t i = 0; i < n; i++)
            ((int8_t *)t.data)[i] = (int8_t)((int)(tu_rng_u32(rng) % 255) - 127);
        for (uint32_t r = 0; r < rows; r++)
            ((float *)t.scales)[r] = 0.005f + 0.01f * (tu_rng_f(rng) + 1.0f);
        break;
    default: {
        uint64_t rb = kn_q4_row_bytes(cols);
        for (size_t i = 0; i < db; i++)
            ((uint8_t *)t.data)[i] = (uint8_t)tu_rng_u32(rng);
        if (cols & 1) /* the unused last high nibble is 0 */
            for (uint32_t r = 0; r < rows; r++)
                ((uint8_t *)t.data)[r * rb + rb - 1] &= 0x0f;
        for (size_t i = 0; i < sb / 2; i++)
            ((uint16_t *)t.scales)[i] = fmt_f32_to_f16(0.01f + 0.05f * (tu_rng_f(rng) + 1.0f));
        for (size_t i = 0; i < zb; i++)
            t.zeros[i] = (uint8_t)(tu_rng_u32(rng) % 16);
        break;
    }
    }
    t.m.data = t.data;
    t.m.scales = t.scales;
    t.m.zeros = t.zeros;
    return t;
}

void tu_tmat_free(tu_tmat *t)
{
    free(t->data);
    free(t->scales);
    free(t->zeros);
}


/* kn_gemm_pf.h - software prefetch of the next weight panel, shared by
 * the prefill GEMMs (kn_gemm_avx2.c, kn_gemm_avx512.c).  Include only from
 * kernel files built with SSE (every x86-64 build) and kn_internal.h. */
#ifndef KN_GEMM_PF_H
#define KN_GEMM_PF_H

#include <immintrin.h>
#include <stdint.h>

#include "kn_internal.h"

/* The lines of the next weight panel (rows [r, r + R), the bytes of
 * columns [c0, c0 + n)), prefetched a few at a time while the current
 * panel is multiplied: rows of a few hundred bytes to a KiB never let the
 * hardware prefetcher get going, and the dequantization would otherwise
 * wait on memory once per panel. */
typedef struct kn_wpf {
    size_t stride;       /* bytes between rows */
    uint32_t lines;      /* cache lines per row */
    uint32_t total;      /* lines of the panel (0: nothing to prefetch) */
    uint32_t next;       /* lines prefetched so far */
    uint32_t line;       /* the next one: line `line` of the block in */
    const uint8_t *row;  /* this row (no division in the loop) */
} kn_wpf;

static inline kn_wpf wpf_make(const kn_matrix *W, uint32_t r, int R,
                              uint32_t c0, uint32_t n)
{
    kn_wpf p = { 0 };
    size_t rb, b0, nb;
    switch (W->fmt) {
    case KN_W_F32: rb = (size_t)W->cols * 4, b0 = (size_t)c0 * 4, nb = (size_t)n * 4; break;
    case KN_W_F16: case KN_W_BF16:
        rb = (size_t)W->cols * 2, b0 = (size_t)c0 * 2, nb = (size_t)n * 2; break;
    case KN_W_Q8: rb = W->cols, b0 = c0, nb = n; break;
    default:
        rb = (size_t)kn_q4_row_bytes(W->cols), b0 = c0 / 2, nb = (n + 1) / 2; break;
    }
    if (R <= 0)
        return p;
    p.row = (const uint8_t *)W->data + (size_t)r * rb + b0;
    p.stride = rb;
    p.lines = (uint32_t)((nb + 63) / 64) + 1; /* +1: the block need not start a line */
    p.total = p.lines * (uint32_t)R;
    return p;
}

__attribute__((always_inline)) static inline void wpf_some(kn_wpf *p, uint32_t k)
{
    for (uint32_t j = 0; j < k && p->next < p->total; j++, p->next++) {
        /* integer arithmetic: the last line may reach past the matrix
         * (a prefetch never faults; a pointer past the object is UB) */
        _mm_prefetch((const char *)((uintptr_t)p->row + (uintptr_t)p->line * 64),
                     _MM_HINT_T0);
        if (++p->line == p->lines && p->next + 1 < p->total) {
            p->line = 0;
            p->row += p->stride; /* never past the panel's last row */
        }
    }
}

#endif /* KN_GEMM_PF_H */

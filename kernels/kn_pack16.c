/* kn_pack16.c - the row layout to 16-row panels and back (kn_pack16.h). */
#include "kn_pack16.h"

#include <string.h>

int kn_q4s_pack16_ok(const kn_matrix *W)
{
    return W->fmt == KN_W_Q4S && W->layout == KN_LAYOUT_ROWS && W->rows > 0 &&
           W->rows % 16 == 0 && W->cols % 32 == 0 && W->group >= 32 &&
           (W->group & (W->group - 1)) == 0;
}

uint64_t kn_q4s_pack16_bytes(const kn_matrix *W)
{
    return (uint64_t)(W->rows / 16) * kn_p16_panel_bytes(W->cols, W->group);
}

void kn_q4s_pack16(const kn_matrix *W, void *dst, kn_matrix *out)
{
    const uint32_t nb = W->cols / 32, ng = kn_q4_ngroups(W->cols, W->group);
    const uint64_t rb = kn_q4_row_bytes(W->cols), pb = kn_p16_panel_bytes(W->cols, W->group);
    const uint8_t *src = W->data;
    const uint16_t *sc = W->scales;
    for (uint32_t p = 0; p < W->rows / 16; p++) {
        uint8_t *panel = (uint8_t *)dst + (size_t)p * pb;
        for (uint32_t j = 0; j < ng; j++) {
            uint8_t *s = panel + kn_p16_scale_off(j, W->group);
            for (uint32_t i = 0; i < 16; i++)
                memcpy(s + 2 * i, sc + (size_t)(16 * p + i) * ng + j, 2);
        }
        for (uint32_t b = 0; b < nb; b++) {
            uint8_t *o = panel + kn_p16_block_off(b, W->group);
            for (uint32_t i = 0; i < 16; i++) {
                const uint8_t *row = src + (size_t)(16 * p + i) * rb + (size_t)b * 16;
                for (uint32_t m = 0; m < 4; m++)
                    memcpy(o + m * 64 + i * 4, row + 4 * m, 4);
            }
        }
    }
    kn_matrix v = *W;
    v.data = dst;
    v.scales = NULL;
    v.layout = KN_LAYOUT_P16;
    *out = v;
}

void kn_q4s_unpack16(const kn_matrix *W, void *data, void *scales)
{
    const uint32_t ng = kn_q4_ngroups(W->cols, W->group);
    const uint64_t rb = kn_q4_row_bytes(W->cols), pb = kn_p16_panel_bytes(W->cols, W->group);
    for (uint32_t p = 0; p < W->rows / 16; p++) {
        const uint8_t *panel = (const uint8_t *)W->data + (size_t)p * pb;
        for (uint32_t j = 0; j < ng; j++)
            for (uint32_t i = 0; i < 16; i++)
                memcpy((uint16_t *)scales + (size_t)(16 * p + i) * ng + j,
                       panel + kn_p16_scale_off(j, W->group) + 2 * i, 2);
        for (uint32_t b = 0; b < W->cols / 32; b++) {
            const uint8_t *o = panel + kn_p16_block_off(b, W->group);
            for (uint32_t i = 0; i < 16; i++)
                for (uint32_t m = 0; m < 4; m++)
                    memcpy((uint8_t *)data + (size_t)(16 * p + i) * rb + (size_t)b * 16 + 4 * m,
                           o + m * 64 + i * 4, 4);
        }
    }
}

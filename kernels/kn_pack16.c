/* kn_pack16.c - the row layout to 16-row panels and back (kn_pack16.h). */
#include "kn_pack16.h"

#include <string.h>

int kn_pack16_ok(const kn_matrix *W)
{
    if (W->layout != KN_LAYOUT_ROWS || W->rows == 0 || W->rows % 16 || W->cols % 32)
        return 0;
    if (W->fmt == KN_W_Q8)
        return 1;
    return W->fmt == KN_W_Q4S && W->group >= 32 && (W->group & (W->group - 1)) == 0;
}

uint64_t kn_pack16_panel_bytes(const kn_matrix *W)
{
    return W->fmt == KN_W_Q8 ? kn_p16_q8_panel_bytes(W->cols)
                             : kn_p16_panel_bytes(W->cols, W->group);
}

uint64_t kn_pack16_bytes(const kn_matrix *W)
{
    return (uint64_t)(W->rows / 16) * kn_pack16_panel_bytes(W);
}

/* Copies between row r's bytes and a panel's, one direction or the other:
 * to_panel 1 packs, 0 unpacks. */
static void copy_q8(uint8_t *panel, uint8_t *data, float *scales, uint32_t p,
                    uint32_t cols, int to_panel)
{
    for (uint32_t i = 0; i < 16; i++) {
        float *s = scales + 16 * (size_t)p + i;
        if (to_panel)
            memcpy(panel + 4 * i, s, 4);
        else
            memcpy(s, panel + 4 * i, 4);
        uint8_t *row = data + (size_t)(16 * p + i) * cols;
        for (uint32_t b = 0; b < cols / 32; b++)
            for (uint32_t k = 0; k < 16; k++) {
                uint8_t *o = panel + kn_p16_q8_block_off(b) + 32 * k + 2 * i;
                if (to_panel)
                    memcpy(o, row + 32 * b + 2 * k, 2);
                else
                    memcpy(row + 32 * b + 2 * k, o, 2);
            }
    }
}

static void copy_q4s(uint8_t *panel, uint8_t *data, uint16_t *scales,
                     uint32_t p, uint32_t cols, uint32_t group, int to_panel)
{
    const uint32_t ng = kn_q4_ngroups(cols, group);
    const uint64_t rb = kn_q4_row_bytes(cols);
    for (uint32_t j = 0; j < ng; j++)
        for (uint32_t i = 0; i < 16; i++) {
            uint8_t *o = panel + kn_p16_scale_off(j, group) + 2 * i;
            uint16_t *s = scales + (size_t)(16 * p + i) * ng + j;
            if (to_panel)
                memcpy(o, s, 2);
            else
                memcpy(s, o, 2);
        }
    for (uint32_t b = 0; b < cols / 32; b++) {
        uint8_t *o = panel + kn_p16_block_off(b, group);
        for (uint32_t i = 0; i < 16; i++) {
            uint8_t *row = data + (size_t)(16 * p + i) * rb + (size_t)b * 16;
            for (uint32_t m = 0; m < 4; m++) {
                if (to_panel)
                    memcpy(o + m * 64 + i * 4, row + 4 * m, 4);
                else
                    memcpy(row + 4 * m, o + m * 64 + i * 4, 4);
            }
        }
    }
}

void kn_pack16(const kn_matrix *W, void *dst, kn_matrix *out)
{
    const uint64_t pb = kn_pack16_panel_bytes(W);
    /* the source is only read: to_panel never writes through data/scales */
    uint8_t *data = (uint8_t *)(uintptr_t)W->data;
    void *scales = (void *)(uintptr_t)W->scales;
    for (uint32_t p = 0; p < W->rows / 16; p++) {
        uint8_t *panel = (uint8_t *)dst + (size_t)p * pb;
        if (W->fmt == KN_W_Q8)
            copy_q8(panel, data, scales, p, W->cols, 1);
        else
            copy_q4s(panel, data, scales, p, W->cols, W->group, 1);
    }
    kn_matrix v = *W;
    v.data = dst;
    v.scales = NULL;
    v.layout = KN_LAYOUT_P16;
    *out = v;
}

void kn_unpack16(const kn_matrix *W, void *data, void *scales)
{
    const uint64_t pb = kn_pack16_panel_bytes(W);
    for (uint32_t p = 0; p < W->rows / 16; p++) {
        uint8_t *panel = (uint8_t *)(uintptr_t)W->data + (size_t)p * pb;
        if (W->fmt == KN_W_Q8)
            copy_q8(panel, data, scales, p, W->cols, 0);
        else
            copy_q4s(panel, data, scales, p, W->cols, W->group, 0);
    }
}

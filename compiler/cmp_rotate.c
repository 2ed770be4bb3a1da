/* cmp_rotate.c - randomized Hadamard rotations (see cmp_rotate.h). */
#include "cmp_rotate.h"

#include <math.h>
#include <string.h>

#include "mc_alloc.h"

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t pow2_block(uint32_t n)
{
    return n ? n & (~n + 1u) : 0; /* lowest set bit */
}

static mc_status signs(float **out, uint32_t n, uint64_t *state, mc_error *err)
{
    *out = mc_malloc_array(n, sizeof(float));
    if (!*out)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "rotation signs");
    for (uint32_t i = 0; i < n; i++)
        (*out)[i] = (splitmix64(state) >> 63) ? -1.0f : 1.0f;
    return MC_OK;
}

int cmp_rotation_applies(uint32_t hidden)
{
    return pow2_block(hidden) >= CMP_ROT_MIN_BLOCK;
}

mc_status cmp_rotation_init(cmp_rotation *r, uint32_t hidden,
                            uint32_t head_dim, uint64_t seed, mc_error *err)
{
    memset(r, 0, sizeof *r);
    uint32_t b = pow2_block(hidden);
    if (b < CMP_ROT_MIN_BLOCK)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "hidden_size", -1,
                       "hidden size %u has no power-of-two block of at "
                       "least %u to rotate", hidden, CMP_ROT_MIN_BLOCK);
    r->hidden = hidden;
    r->block = b;
    r->head_dim = head_dim;
    r->seed = seed;
    uint64_t state = seed;
    mc_status st = signs(&r->sign, hidden, &state, err);
    if (st == MC_OK && head_dim >= 4 && pow2_block(head_dim) == head_dim) {
        r->head_block = head_dim;
        st = signs(&r->head_sign, head_dim, &state, err);
    }
    if (st != MC_OK)
        cmp_rotation_free(r);
    return st;
}

void cmp_rotation_free(cmp_rotation *r)
{
    if (!r)
        return;
    mc_free(r->sign);
    mc_free(r->head_sign);
    memset(r, 0, sizeof *r);
}

/* x <- blockdiag(H_b / sqrt(b)) diag(sign) x over n floats. */
static void hadamard(float *x, uint32_t n, uint32_t b, const float *sign)
{
    for (uint32_t i = 0; i < n; i++)
        x[i] *= sign[i];
    float norm = (float)(1.0 / sqrt((double)b));
    for (uint32_t o = 0; o < n; o += b) {
        float *v = x + o;
        for (uint32_t h = 1; h < b; h <<= 1)
            for (uint32_t i = 0; i < b; i += h << 1)
                for (uint32_t j = i; j < i + h; j++) {
                    float a = v[j], c = v[j + h];
                    v[j] = a + c;
                    v[j + h] = a - c;
                }
        for (uint32_t i = 0; i < b; i++)
            v[i] *= norm;
    }
}

void cmp_rotate_hidden(const cmp_rotation *r, float *x)
{
    hadamard(x, r->hidden, r->block, r->sign);
}

void cmp_rotate_head(const cmp_rotation *r, float *x)
{
    if (r->head_block)
        hadamard(x, r->head_dim, r->head_block, r->head_sign);
}

void cmp_rotate_input_rows(const cmp_rotation *r, float *w, uint32_t rows,
                           const float *gamma)
{
    for (uint32_t i = 0; i < rows; i++) {
        float *row = w + (size_t)i * r->hidden;
        if (gamma)
            for (uint32_t j = 0; j < r->hidden; j++)
                row[j] *= gamma[j];
        cmp_rotate_hidden(r, row);
    }
}

void cmp_rotate_output_cols(const cmp_rotation *r, float *w, uint32_t cols,
                            float *bias, float *tmp)
{
    uint32_t rows = r->hidden;
    for (uint32_t j = 0; j < cols; j++) {
        for (uint32_t i = 0; i < rows; i++)
            tmp[i] = w[(size_t)i * cols + j];
        cmp_rotate_hidden(r, tmp);
        for (uint32_t i = 0; i < rows; i++)
            w[(size_t)i * cols + j] = tmp[i];
    }
    if (bias)
        cmp_rotate_hidden(r, bias);
}

void cmp_rotate_v_rows(const cmp_rotation *r, float *w, uint32_t rows,
                       uint32_t cols, float *bias, float *tmp)
{
    uint32_t hd = r->head_dim;
    if (!r->head_block || rows % hd)
        return;
    for (uint32_t h = 0; h < rows; h += hd) {
        for (uint32_t j = 0; j < cols; j++) {
            for (uint32_t i = 0; i < hd; i++)
                tmp[i] = w[(size_t)(h + i) * cols + j];
            cmp_rotate_head(r, tmp);
            for (uint32_t i = 0; i < hd; i++)
                w[(size_t)(h + i) * cols + j] = tmp[i];
        }
        if (bias)
            cmp_rotate_head(r, bias + h);
    }
}

void cmp_rotate_o_cols(const cmp_rotation *r, float *w, uint32_t rows,
                       uint32_t cols)
{
    uint32_t hd = r->head_dim;
    if (!r->head_block || cols % hd)
        return;
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t h = 0; h < cols; h += hd)
            cmp_rotate_head(r, w + (size_t)i * cols + h);
}

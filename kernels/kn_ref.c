/* kn_ref.c - plain scalar references of the ops in kn_ops.h: obvious loops,
 * double accumulation.  Tests compare the optimized entry points with these;
 * nothing here is meant to be fast. */
#include <math.h>
#include <string.h>

#include "kn_internal.h"
#include "kn_ops.h"

void kn_dequant_span(const kn_matrix *W, uint32_t r, uint32_t c0, uint32_t n,
                     float *out)
{
    switch (W->fmt) {
    case KN_W_F32:
        memcpy(out, (const float *)W->data + (size_t)r * W->cols + c0,
               (size_t)n * sizeof(float));
        return;
    case KN_W_F16: {
        const uint16_t *s = (const uint16_t *)W->data + (size_t)r * W->cols + c0;
        for (uint32_t i = 0; i < n; i++)
            out[i] = fmt_f16_to_f32(s[i]);
        return;
    }
    case KN_W_BF16: {
        const uint16_t *s = (const uint16_t *)W->data + (size_t)r * W->cols + c0;
        for (uint32_t i = 0; i < n; i++)
            out[i] = fmt_bf16_to_f32(s[i]);
        return;
    }
    case KN_W_Q8: {
        if (W->layout == KN_LAYOUT_P16) {
            const float sc = kn_q8_scale(W, r);
            for (uint32_t i = 0; i < n; i++)
                out[i] = sc * (float)kn_q8_code(W, r, c0 + i);
            return;
        }
        const int8_t *s = (const int8_t *)W->data + (size_t)r * W->cols + c0;
        float sc = ((const float *)W->scales)[r];
        for (uint32_t i = 0; i < n; i++)
            out[i] = sc * (float)s[i];
        return;
    }
    default:
        for (uint32_t i = 0; i < n; i++)
            out[i] = kn_w_at(W, r, c0 + i);
        return;
    }
}

void kn_matrix_row(const kn_matrix *W, uint32_t r, float *out)
{
    kn_dequant_span(W, r, 0, W->cols, out);
}

void kn_ref_matmul(const kn_matrix *W, const float *X, size_t T, float *Y,
                   const float *bias)
{
    for (size_t t = 0; t < T; t++) {
        const float *x = X + t * W->cols;
        for (uint32_t r = 0; r < W->rows; r++) {
            double acc = bias ? bias[r] : 0.0;
            for (uint32_t c = 0; c < W->cols; c++)
                acc += (double)kn_w_at(W, r, c) * x[c];
            Y[t * W->rows + r] = (float)acc;
        }
    }
}

void kn_ref_rmsnorm(float *out, const float *x, const float *w, size_t T,
                    size_t n, float eps)
{
    for (size_t t = 0; t < T; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0;
        for (size_t i = 0; i < n; i++)
            ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
        for (size_t i = 0; i < n; i++)
            o[i] = (float)((double)xr[i] * inv * w[i]);
    }
}

void kn_ref_silu_mul(float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        gate[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
}

void kn_ref_rope_apply(const kn_rope *r, float *x, size_t T, uint32_t nheads,
                       const int64_t *pos)
{
    uint32_t hd = r->head_dim, half = hd / 2;
    for (size_t t = 0; t < T; t++) {
        for (uint32_t i = 0; i < half; i++) {
            /* HF forms the angle as a float32 product (position x inv_freq)
             * and then takes cos/sin; do the same so long contexts agree. */
            float ang = (float)pos[t] * r->inv_freq[i];
            double c = cos((double)ang) * r->attn_scale;
            double s = sin((double)ang) * r->attn_scale;
            for (uint32_t h = 0; h < nheads; h++) {
                float *v = x + (t * nheads + h) * hd;
                double a = v[i], b = v[i + half];
                v[i] = (float)(a * c - b * s);
                v[i + half] = (float)(b * c + a * s);
            }
        }
    }
}

void kn_ref_attention(const kn_kv *kv, const float *q, size_t T,
                      uint32_t n_heads, int64_t pos0, uint64_t window,
                      float *out, float *scratch)
{
    uint32_t hd = kv->head_dim;
    uint32_t grp = n_heads / kv->n_kv_heads;
    double scale = 1.0 / sqrt((double)hd);
    for (size_t t = 0; t < T; t++) {
        int64_t p = pos0 + (int64_t)t;
        int64_t first = kn_attn_first(p, window);
        size_t n = (size_t)(p - first + 1);
        for (uint32_t h = 0; h < n_heads; h++) {
            const float *qh = q + (t * n_heads + h) * hd;
            float *oh = out + (t * n_heads + h) * hd;
            uint32_t kh = h / grp;
            double mx = -INFINITY;
            for (size_t j = 0; j < n; j++) {
                uint64_t slot = (uint64_t)(first + (int64_t)j) % kv->cap;
                double s = 0.0;
                for (uint32_t d = 0; d < hd; d++)
                    s += (double)qh[d] * kn_kv_at(kv, kv->k, kv->k_scale, slot, kh, d);
                s *= scale;
                scratch[j] = (float)s;
                if (s > mx)
                    mx = s;
            }
            double sum = 0.0;
            for (size_t j = 0; j < n; j++) {
                double e = exp((double)scratch[j] - mx);
                scratch[j] = (float)e;
                sum += e;
            }
            for (uint32_t d = 0; d < hd; d++) {
                double acc = 0.0;
                for (size_t j = 0; j < n; j++) {
                    uint64_t slot = (uint64_t)(first + (int64_t)j) % kv->cap;
                    acc += (double)scratch[j] *
                           kn_kv_at(kv, kv->v, kv->v_scale, slot, kh, d);
                }
                oh[d] = (float)(acc / sum);
            }
        }
    }
}

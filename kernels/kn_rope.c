/* kn_rope.c - rotary position embedding: the inverse frequencies of each HF
 * rope type (transformers' modeling_rope_utils._compute_*_parameters,
 * computed here in double and rounded once to float) and the rotation
 * itself in the rotate_half layout. */
#include <math.h>

#include "kn_ops.h"

#define KN_PI 3.14159265358979323846

/* yarn: the dimension (of d) whose wavelength makes num_rot turns over
 * max_pos positions. */
static double yarn_corr_dim(double num_rot, double d, double base,
                            double max_pos)
{
    return d * log(max_pos / (num_rot * 2.0 * KN_PI)) / (2.0 * log(base));
}

static double yarn_get_mscale(double scale)
{
    return scale <= 1.0 ? 1.0 : 0.1 * log(scale) + 1.0;
}

void kn_rope_init(int rope_type, double theta, double factor,
                  double low_freq_factor, double high_freq_factor,
                  uint64_t original_max_pos, double beta_fast,
                  double beta_slow, double attention_factor,
                  uint32_t head_dim, uint64_t seq_len, float *inv_freq,
                  float *attn_scale)
{
    uint32_t half = head_dim / 2;
    double d = head_dim;
    double base = theta;
    *attn_scale = 1.0f;
    if (factor <= 0.0)
        factor = 1.0;

    if (rope_type == 2 /* dynamic */ && original_max_pos > 0 && head_dim > 2 &&
        seq_len > original_max_pos) {
        double s = factor * (double)seq_len / (double)original_max_pos - (factor - 1.0);
        base = theta * pow(s, d / (d - 2.0));
    }

    double lo = 0.0, hi = 0.0;
    if (rope_type == 3 /* yarn */) {
        if (beta_fast <= 0.0)
            beta_fast = 32.0;
        if (beta_slow <= 0.0)
            beta_slow = 1.0;
        double mp = original_max_pos ? (double)original_max_pos : 1.0;
        lo = floor(yarn_corr_dim(beta_fast, d, theta, mp));
        hi = ceil(yarn_corr_dim(beta_slow, d, theta, mp));
        if (lo < 0.0)
            lo = 0.0;
        if (hi > d - 1.0)
            hi = d - 1.0;
        if (lo == hi)
            hi += 0.001;
        *attn_scale = (float)(attention_factor > 0.0 ? attention_factor
                                                     : yarn_get_mscale(factor));
    }

    for (uint32_t i = 0; i < half; i++) {
        /* torch: base ** (arange(0, d, 2) / d) */
        double f = 1.0 / pow(base, (2.0 * i) / d);
        switch (rope_type) {
        case 1: /* linear */
            f /= factor;
            break;
        case 3: { /* yarn: blend interpolation and extrapolation */
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            double extra = 1.0 - ramp; /* inv_freq_extrapolation_factor */
            f = (f / factor) * (1.0 - extra) + f * extra;
            break;
        }
        case 4: { /* llama3 */
            double orig = (double)original_max_pos;
            double low_wl = orig / low_freq_factor;
            double high_wl = orig / high_freq_factor;
            double wl = 2.0 * KN_PI / f;
            if (wl > low_wl) {
                f /= factor;
            } else if (!(wl < high_wl)) {
                double sm = (orig / wl - low_freq_factor) /
                            (high_freq_factor - low_freq_factor);
                f = (1.0 - sm) * f / factor + sm * f;
            }
            break;
        }
        default: /* default, dynamic (base already grown) */
            break;
        }
        inv_freq[i] = (float)f;
    }
}

void kn_rope_apply(const kn_rope *r, float *x, size_t T, uint32_t nheads,
                   const int64_t *pos)
{
    uint32_t hd = r->head_dim, half = hd / 2;
    float cs[64], sn[64];
    for (size_t t = 0; t < T; t++) {
        /* cos/sin once per (token, frequency), applied to every head. */
        for (uint32_t i0 = 0; i0 < half; i0 += 64) {
            uint32_t n = half - i0 < 64 ? half - i0 : 64;
            for (uint32_t i = 0; i < n; i++) {
                float ang = (float)pos[t] * r->inv_freq[i0 + i];
                cs[i] = (float)cos((double)ang) * r->attn_scale;
                sn[i] = (float)sin((double)ang) * r->attn_scale;
            }
            for (uint32_t h = 0; h < nheads; h++) {
                float *a = x + (t * nheads + h) * hd + i0;
                float *b = a + half;
                for (uint32_t i = 0; i < n; i++) {
                    float va = a[i], vb = b[i];
                    a[i] = va * cs[i] - vb * sn[i];
                    b[i] = vb * cs[i] + va * sn[i];
                }
            }
        }
    }
}

/*
 * kn_rtn.h - the inner loops of plain round-to-nearest quantization
 * (compiler/cmp_quant.c decides the parameters; these apply them), fast
 * enough that quantizing a checkpoint runs near memory speed.
 *
 * Every entry gives bitwise the results of the plain loops in kn_rtn.c
 * (kn_ref_*), which are cmp_quant_code's arithmetic: q = nearbyintf(x /
 * scale) (float32 division, round to nearest even), clamped to the
 * format's range (+ zero for int4).  The AVX2 path uses the same IEEE
 * division and rounding, so an artifact does not depend on the CPU that
 * compiled it.  The AVX2 bodies run when kn_cpu_has_avx2() and not
 * kn_force_scalar().  Nothing allocates.
 */
#ifndef KN_RTN_H
#define KN_RTN_H

#include <stddef.h>
#include <stdint.h>

/* Source element types of kn_rtn_to_f32 (as stored in safetensors). */
enum { KN_RTN_F32 = 0, KN_RTN_F16 = 1, KN_RTN_BF16 = 2 };

/* out[n] = src[n] (type KN_RTN_*) widened to float32 (exact).  Returns 1,
 * or 0 when a value is NaN or infinite (out is then partly written). */
int kn_rtn_to_f32(const void *src, int type, size_t n, float *out);
int kn_ref_rtn_to_f32(const void *src, int type, size_t n, float *out);

/* *mn = min(+0, x...), *mx = max(+0, x...), where a zero result is +0
 * (what a loop starting at +0 with strict comparisons gives).  x finite. */
void kn_rtn_range(const float *x, size_t n, float *mn, float *mx);
void kn_ref_rtn_range(const float *x, size_t n, float *mn, float *mx);

/* int8 codes q[n] = clamp(nearbyintf(x / scale), -127, 127); scale != 0. */
void kn_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q);
void kn_ref_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q);

/* int4 codes clamp(nearbyintf(x / scale) + zero, 0, 15) of x[n], packed
 * two per byte (even index low nibble) into out[(n + 1) / 2]; with n odd
 * the last high nibble is 0.  scale != 0, zero in 0..15. */
void kn_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                     uint8_t *out);
void kn_ref_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                         uint8_t *out);

/* A row of KN_W_Q4 (asymmetric int4) RTN over ng whole groups of g
 * columns (x[ng * g]): per group, its range as kn_rtn_range, then the
 * parameters cmp_quant.h gives Q4 (s = (mx - mn) / 15 clamped to +-65504
 * and rounded to f16; zero = clamp(nearbyintf(-mn / s), 0, 15) when s > 0,
 * else 0) into scales[ng] (f16 bits) and zeros[ng], and the codes as
 * kn_rtn_codes_q4 (all `zero` when s is 0) into out[ng * g / 2].  g even.
 * The reference restates cmp_quant's rule; test_rtn holds both to
 * cmp_quant_matrix bit for bit. */
void kn_rtn_q4_row(const float *x, uint32_t ng, uint32_t g, uint16_t *scales,
                   uint8_t *zeros, uint8_t *out);
void kn_ref_rtn_q4_row(const float *x, uint32_t ng, uint32_t g,
                       uint16_t *scales, uint8_t *zeros, uint8_t *out);

/* A row of KN_W_Q4S (symmetric int4, zero KN_Q4_ZERO_SYM = 8) RTN over ng
 * whole groups of g columns (x[ng * g]): per group, its range as
 * kn_rtn_range and the signed value of largest magnitude `ext` (mx if mx >
 * -mn, mn if -mn > mx, +0 if both are 0, else the first x with |x| == mx:
 * cmp_quant_choose's scan), then the parameter cmp_quant.h gives Q4S (s =
 * ext / -8 clamped to +-65504 and rounded to f16) into scales[ng] (f16
 * bits; ext = 0 gives -0, 0x8000), and the codes as kn_rtn_codes_q4 with
 * zero 8 (all 8, bytes 0x88, when s is 0) into out[ng * g / 2].  g even.
 * The reference restates cmp_quant's rule; test_rtn holds both to
 * cmp_quant_matrix bit for bit. */
void kn_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g, uint16_t *scales,
                    uint8_t *out);
void kn_ref_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g,
                        uint16_t *scales, uint8_t *out);

/* The weighted error of n values under the parameters (scale, zero;
 * q8: int8, else int4 with that zero): sum of imp[i] (1 when imp is
 * NULL) * d_i * d_i, d_i = (double)x[i] - (double)(the value of x[i]'s
 * code), the code as kn_rtn_codes_* give it (scale 0: every code is the
 * zero, every value 0), the value as cmp_quant_value (Q8: scale * q;
 * int4: (q - zero) * scale, in float).  The sum runs in KN_RTN_ERR_LANES
 * double chains, element i in chain i % 8 (each term (imp * d) * d, each
 * multiply and add rounded on its own), then ((c0 + c1) + (c2 + c3)) +
 * ((c4 + c5) + (c6 + c7)): one chain's latency bound 8 adds wide, the
 * same bits on every path.  cmp_quant's choice of parameters calls it
 * some 20 times per row or group. */
#define KN_RTN_ERR_LANES 8
double kn_rtn_err(const float *x, const float *imp, size_t n, int q8,
                  float scale, int zero);
double kn_ref_rtn_err(const float *x, const float *imp, size_t n, int q8,
                      float scale, int zero);

/* AVX2 bodies (kn_rtn_avx2.c); call only when kn_cpu_has_avx2().  Each
 * handles the whole n (its tail with the plain loop). */
int kn_avx2_rtn_to_f32(const void *src, int type, size_t n, float *out);
void kn_avx2_rtn_range(const float *x, size_t n, float *mn, float *mx);
void kn_avx2_rtn_codes_q8(const float *x, size_t n, float scale, int8_t *q);
void kn_avx2_rtn_codes_q4(const float *x, size_t n, float scale, int zero,
                          uint8_t *out);
void kn_avx2_rtn_q4_row(const float *x, uint32_t ng, uint32_t g,
                        uint16_t *scales, uint8_t *zeros, uint8_t *out);
void kn_avx2_rtn_q4s_row(const float *x, uint32_t ng, uint32_t g,
                         uint16_t *scales, uint8_t *out);
/* kn_rtn_err's chains over the first n8 = n - n % 8 values into c[8]
 * (added to c). */
void kn_avx2_rtn_err(const float *x, const float *imp, size_t n8, int q8,
                     float scale, int zero, double c[KN_RTN_ERR_LANES]);

#endif /* KN_RTN_H */

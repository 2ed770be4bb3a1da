/*
 * cmp_quant.h - round-to-nearest weight quantization into the kn_quant.h
 * layouts, with an optional importance-weighted scale search.
 *
 * Input: a float32 weight matrix [rows = out_features][cols = in_features]
 * as in nn.Linear.  Output: the caller's buffers, sized exactly by
 * kn_wformat_data_bytes / kn_wformat_scale_bytes / kn_wformat_zero_bytes
 * (kn_quant.h is the contract; nothing here invents a layout):
 *   KN_W_Q8   one f32 scale per row, q in [-127, 127], w = scale * q
 *   KN_W_Q4   per group of g columns (g = 32, 64, 128; the last group of a
 *             row may be shorter): f16 scale, u8 zero in [0, 15],
 *             w = scale * (q - zero), q in [0, 15]
 *   KN_W_Q4S  as Q4 with zero fixed at 8 (symmetric)
 *
 * Plain RTN (importance == NULL): Q8 scale = max|w| / 127 (rounded up to
 * an f16 value for b->q8scale CMP_Q8_F16); Q4 takes the
 * group's range widened to include 0 (so zero is a valid code), scale =
 * (max - min) / 15, zero = round(-min / scale); Q4S follows llama.cpp's
 * Q4_0: scale = (the value of largest magnitude) / -8, so that extreme
 * lands exactly on code 0 and all 16 codes are used (the stored scale may
 * therefore be negative; w = scale * (q - 8) holds either way).  Every scale is rounded to its
 * stored precision (f16 for Q4/Q4S) BEFORE the codes are chosen, so the
 * stored matrix dequantizes to exactly what the error estimates measured.
 *
 * Importance search (importance != NULL, per input column, e.g. the
 * "imatrix" mean of x_j^2 over calibration tokens): for each row (Q8) or
 * group (Q4/Q4S) try a grid of shrunk ranges and keep the one minimizing
 * sum_j imp_j (w_j - deq(q_j))^2, then refit the scale by weighted least
 * squares for the chosen codes if that lowers the error further.
 *
 * Nothing here allocates except cmp_quant_matrix's optional checks; no
 * function prints.
 */
#ifndef CMP_QUANT_H
#define CMP_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kn_ops.h"
#include "kn_quant.h"
#include "mc_error.h"

/* Parameters of one Q4 group or one Q8 row, as stored (scale already
 * rounded to its stored precision). */
typedef struct cmp_qparam {
    float scale;  /* 0 means every value is 0; negative only for Q4S */
    int zero;     /* Q4: 0..15; Q4S: 8; Q8: 0 */
} cmp_qparam;

/* How a Q8 row's f32 scale is chosen (Q4/Q4S scales are f16 anyway). */
typedef enum cmp_q8scale {
    CMP_Q8_PLAIN = 0, /* max|w| / 127 as float32 computes it */
    CMP_Q8_F16 = 1,   /* max|w| / 127 rounded UP to the next f16 value, so
                         that an f16 holds it exactly and no code passes
                         127 (a tied embedding: GGUF's Q8_0 block scale is
                         an f16, so its export is then bit-exact).  A zero
                         row keeps 0; a tiny one an f16 subnormal (its
                         error grows by at most 2^-25, absolute); a scale
                         above f16's 65504 keeps the plain f32 value (the
                         export says that row is not exact). */
    CMP_Q8_F16_MSE = 2, /* f16 values too: of the scales the row's range
                           shrunk by 0..20 % gives (each rounded up as
                           CMP_Q8_F16), then a least-squares refit (to the
                           nearest f16), the one of least squared error */
} cmp_q8scale;

/* The mode of a tied model's Q8 embedding (the compiler's writer and the
 * calibration's held-out view agree through it).  F16_MSE lowers each
 * row's squared error but not the model's: stories260k int8 RTN KLD
 * 0.0476 against F16's 0.0472, int4 g32 2.2222 against 2.2240
 * (docs/quantization.md). */
#define CMP_Q8_EMBED CMP_Q8_F16

/* A quantized matrix being written: the caller's buffers in the kn_quant.h
 * layout (borrowed).  zeros is NULL unless fmt is KN_W_Q4. */
typedef struct cmp_qbuf {
    kn_wformat fmt;     /* KN_W_Q8, KN_W_Q4 or KN_W_Q4S */
    uint32_t rows;      /* out_features */
    uint32_t cols;      /* in_features */
    uint32_t group;     /* Q4/Q4S: 32, 64 or 128; Q8: 0 */
    void *data;         /* kn_wformat_data_bytes(fmt, rows, cols) */
    void *scales;       /* kn_wformat_scale_bytes(...) */
    uint8_t *zeros;     /* kn_wformat_zero_bytes(...), Q4 only */
    cmp_q8scale q8scale; /* Q8 only; 0 (plain) in a {..} initializer that
                            stops at zeros */
} cmp_qbuf;

/* The Q8 scale mode chooses for a row of largest magnitude a (>= 0). */
float cmp_quant_q8_scale(cmp_q8scale mode, float a);
/* 1 if s is a Q8 scale an f16 holds exactly (the test GGUF's Q8_0 export
 * makes of each row). */
int cmp_quant_f16_exact(float s);

/* 1 if fmt is a quantized format this module writes (Q8, Q4, Q4S). */
int cmp_quant_is_quantized(kn_wformat fmt);
/* Check fmt/group/rows/cols and the buffer pointers of b.  Returns MC_OK or
 * MC_ERR_INVALID_ARG with err naming the problem. */
mc_status cmp_qbuf_check(const cmp_qbuf *b, mc_error *err);
/* Columns per parameter set: group for Q4/Q4S, cols for Q8. */
uint32_t cmp_qbuf_span(const cmp_qbuf *b);
/* Parameter sets per row: ceil(cols / group) for Q4/Q4S, 1 for Q8. */
uint32_t cmp_qbuf_nparams(const cmp_qbuf *b);

/* Choose the parameters for n values x (one Q4 group or one Q8 row).
 * imp: per-value importance (n, >= 0) or NULL for plain RTN.  Returns the
 * parameters with the scale rounded to its stored precision. */
cmp_qparam cmp_quant_choose(kn_wformat fmt, const float *x, const float *imp,
                            size_t n);
/* The code of x under p (clamped to the format's range). */
int cmp_quant_code(kn_wformat fmt, cmp_qparam p, float x);
/* The value code q stands for under p, computed exactly as kn_ops
 * dequantizes it (float32 product). */
float cmp_quant_value(kn_wformat fmt, cmp_qparam p, int q);

/* Store parameter set g (group index; 0 for Q8) of row r, and code q of
 * element (r, c).  No range checks beyond the format's (callers index
 * inside rows x cols). */
void cmp_qbuf_set_param(cmp_qbuf *b, uint32_t r, uint32_t g, cmp_qparam p);
cmp_qparam cmp_qbuf_get_param(const cmp_qbuf *b, uint32_t r, uint32_t g);
void cmp_qbuf_set_code(cmp_qbuf *b, uint32_t r, uint32_t c, int q);
int cmp_qbuf_get_code(const cmp_qbuf *b, uint32_t r, uint32_t c);
/* A read-only kn_matrix view of b (for kn_matmul). */
kn_matrix cmp_qbuf_matrix(const cmp_qbuf *b);

/* Quantize w [rows][cols] into b (RTN, or importance-searched when imp,
 * [cols], is non-NULL).  Returns MC_ERR_INVALID_ARG for a bad buffer,
 * MC_ERR_NONFINITE (field = "row R col C") for a NaN/Inf weight. */
mc_status cmp_quant_matrix(const float *w, const float *imp, cmp_qbuf *b,
                           mc_error *err);
/* Plain RTN (as cmp_quant_matrix with imp NULL) of rows [r0, r1) of a
 * source matrix src [rows][cols] stored as type (KN_RTN_F32/F16/BF16 of
 * kn_rtn.h), each row widened into row [cols] (the caller's scratch)
 * first: b's bytes for those rows are bitwise cmp_quant_matrix's on the
 * widened matrix, whatever b held before.  Rows are independent, so
 * disjoint ranges may run on different threads.  b must pass
 * cmp_qbuf_check.  Returns 1, or 0 at the first row holding a NaN or an
 * infinity (nothing reported: cmp_quant_matrix names the element). */
int cmp_quant_rtn_rows(const void *src, int type, cmp_qbuf *b, uint32_t r0,
                       uint32_t r1, float *row);

/* Dequantize b into out [rows][cols] (float32, exactly kn_ops' values). */
void cmp_dequant_matrix(const cmp_qbuf *b, float *out);

/* Quantize-dequantize ("fake quantize") w [rows][cols] into out (may equal
 * w) with plain RTN (imp NULL) or the importance search, without the stored
 * layout: out gets exactly the values the stored matrix would dequantize
 * to.  group is ignored for Q8.  Non-finite inputs give unspecified values
 * (callers check first). */
void cmp_quant_fake(kn_wformat fmt, uint32_t group, const float *w,
                    const float *imp, uint32_t rows, uint32_t cols,
                    float *out);

/* Importance-weighted squared error sum_r sum_c imp_c (w - deq)^2 between
 * w [rows][cols] and b (imp NULL = unweighted).  Double accumulation. */
double cmp_quant_weighted_error(const float *w, const float *imp,
                                const cmp_qbuf *b);

#endif /* CMP_QUANT_H */

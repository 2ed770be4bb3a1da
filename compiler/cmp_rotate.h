/*
 * cmp_rotate.h - orthogonal rotations that leave a Llama-family model's
 * function unchanged but make its weights easier to quantize (the offline
 * part of QuaRot / SpinQuant: rotate the residual stream and the value
 * heads by randomized Hadamard matrices).
 *
 * Why: a per-row int8/int4 scale is set by the row's largest |w|, and the
 * error a weight column causes grows with its input's magnitude.  Trained
 * models have a few large input channels (and matching weight columns);
 * an orthogonal mixing spreads them over every channel, so rows become
 * near-Gaussian and the same bits cover them with less error.
 *
 * Residual stream (R1, hidden x hidden): every hidden state x becomes
 * x' = M x.  RMSNorm commutes with M only without its weight, so each norm
 * weight gamma is first folded into the linears that read it:
 *   embed rows        e'  = M e
 *   q/k/v, gate/up    W'  = W diag(gamma) M^T   (rows: w' = M (gamma . w))
 *   o, down (+bias)   W'  = M W                 (columns rotated)
 *   lm_head           L'  = L diag(gamma_final) M^T
 * and every norm weight becomes 1.  A tied model gets an untied lm_head.
 * Value heads (R2, head_dim x head_dim): each v head's outputs become R2 v
 * (v_proj rows and bias per head), so each attention output head is R2 o_h
 * and o_proj's columns of every query head are multiplied by R2^T (each
 * row's head segment u becomes R2 u).  RoPE is not involved (q/k outputs
 * are untouched), so the head rotation is valid under GQA too.
 *
 * M = H_b D / sqrt(b) applied blockwise: D a fixed pseudo-random diagonal
 * of signs (a seed), H_b the Sylvester Hadamard matrix of b = the largest
 * power of two dividing the width (hidden 5120 -> 5 blocks of 1024).
 * Applying it is a fast Walsh-Hadamard transform: O(n log b) per vector.
 */
#ifndef CMP_ROTATE_H
#define CMP_ROTATE_H

#include <stdint.h>

#include "mc_error.h"

/* Smallest Hadamard block worth using: narrower blocks barely mix. */
#define CMP_ROT_MIN_BLOCK 16u

typedef struct cmp_rotation {
    uint32_t hidden;     /* residual width */
    uint32_t block;      /* Hadamard block of the residual rotation */
    uint32_t head_dim;   /* value head width */
    uint32_t head_block; /* Hadamard block of the head rotation; 0 = none */
    uint64_t seed;       /* of the sign diagonals */
    float *sign;         /* [hidden] +-1 (owned) */
    float *head_sign;    /* [head_dim] +-1 (owned), NULL when head_block 0 */
} cmp_rotation;

/* Set up the rotations for a model of this hidden width and head width.
 * MC_ERR_INVALID_ARG when hidden has no power-of-two block of at least
 * CMP_ROT_MIN_BLOCK (the caller then calibrates unrotated); the head
 * rotation is left out (head_block 0) when head_dim is not a power of two
 * of at least 4.  MC_ERR_NOMEM.  Release with cmp_rotation_free. */
mc_status cmp_rotation_init(cmp_rotation *r, uint32_t hidden,
                            uint32_t head_dim, uint64_t seed, mc_error *err);
void cmp_rotation_free(cmp_rotation *r); /* NULL or zeroed is a no-op */
/* 1 when cmp_rotation_init accepts this hidden width. */
int cmp_rotation_applies(uint32_t hidden);

/* x <- M x, x has r->hidden floats. */
void cmp_rotate_hidden(const cmp_rotation *r, float *x);
/* x <- R2 x, x has r->head_dim floats (no-op when head_block is 0). */
void cmp_rotate_head(const cmp_rotation *r, float *x);

/* The weight transforms above, in place on float32 [rows][cols] matrices.
 * gamma (may be NULL: ones) is the norm weight folded in.  tmp holds
 * max(rows, cols) floats. */
/* A linear reading the residual: each row w <- M (gamma . w); cols ==
 * hidden. */
void cmp_rotate_input_rows(const cmp_rotation *r, float *w, uint32_t rows,
                           const float *gamma);
/* A linear writing the residual: each column <- M column; rows == hidden;
 * bias (may be NULL) [rows] <- M bias. */
void cmp_rotate_output_cols(const cmp_rotation *r, float *w, uint32_t cols,
                            float *bias, float *tmp);
/* v_proj: each head's block of head_dim rows, column by column, <- R2 .;
 * bias (may be NULL) per head likewise. */
void cmp_rotate_v_rows(const cmp_rotation *r, float *w, uint32_t rows,
                       uint32_t cols, float *bias, float *tmp);
/* o_proj: each row's head segments (cols / head_dim of them) <- R2 .. */
void cmp_rotate_o_cols(const cmp_rotation *r, float *w, uint32_t rows,
                       uint32_t cols);

#endif /* CMP_ROTATE_H */

/* tmat.h - weight matrices with their own storage and random contents, in
 * every kn_wformat, for the kernel tests (test_kernels_quant, test_qdot). */
#ifndef TU_TMAT_H
#define TU_TMAT_H

#include "kn_ops.h"
#include "testutil.h"

/* A matrix with its own storage. */
typedef struct tu_tmat {
    kn_matrix m;
    void *data, *scales;
    uint8_t *zeros;
} tu_tmat;

/* rows x cols of format f (group for Q4/Q4S) with values drawn from rng:
 * floats in [-1, 1), Q8 codes in [-127, 127] with scales 0.005..0.025,
 * random int4 codes, f16 scales 0.01..0.11, zeros 0..15.  Fails the test
 * when out of memory; release with tu_tmat_free. */
tu_tmat tu_tmat_make(tu_rng *rng, kn_wformat f, uint32_t rows, uint32_t cols,
                     uint32_t group);
void tu_tmat_free(tu_tmat *t);

#endif /* TU_TMAT_H */

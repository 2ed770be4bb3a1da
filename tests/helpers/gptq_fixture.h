/* gptq_fixture.h - inputs for the GPTQ / descent tests (test_gptq.c,
 * test_gptq_work.c): a seeded random stream, correlated activations whose
 * Hessian has strong off-diagonal structure (as real activations do),
 * random weights, and a quantized matrix that owns its buffers.
 *
 * Include after <cmocka.h> (cmocka's rule; the helpers fail the test on
 * a library error). */
#ifndef TU_GPTQ_FIXTURE_H
#define TU_GPTQ_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "cmp_gptq.h"
#include "cmp_quant.h"

/* The next uniform float in [0, 1) / standard normal float of one stream
 * per process, seeded 0xfeed1234 (the order of draws is the test's). */
float tu_gq_urand(void);
float tu_gq_nrand(void);

/* A quantized matrix with its own storage; b views data/scales/zeros. */
typedef struct tu_gq_qm {
    cmp_qbuf b;
    void *data, *scales;
    uint8_t *zeros;
} tu_gq_qm;
/* rows x cols of format f, zero-filled (group ignored for Q8). */
void tu_gq_qm_init(tu_gq_qm *m, kn_wformat f, uint32_t rows, uint32_t cols,
                   uint32_t group);
void tu_gq_qm_free(tu_gq_qm *m);

/* T x cols inputs x = z M with a random mixing M plus per-channel scales
 * (every 7th channel 4x): new, the caller frees. */
float *tu_gq_correlated_inputs(size_t T, uint32_t cols);
/* rows x cols weights, normal with sd 0.05: new, the caller frees. */
float *tu_gq_rand_w(uint32_t rows, uint32_t cols);
/* h = the Hessian sum of X [T][cols] (a new accumulator; fails the test
 * when it cannot be made). */
void tu_gq_hessian_of(cmp_hessian *h, const float *X, size_t T, uint32_t cols);

#endif /* TU_GPTQ_FIXTURE_H */

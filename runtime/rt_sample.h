/*
 * rt_sample.h - choosing the next token from a row of logits.
 *
 * Greedy (temperature <= 0): argmax, first index on ties.  Otherwise:
 * p = softmax(logits / temperature); keep the top_k most probable (0 = all);
 * then the smallest set of most probable tokens whose mass reaches top_p
 * (>= 1 = all); renormalize; draw one uniform u in [0,1) from the
 * sequence's RNG and take the first token whose cumulative mass exceeds
 * u * total.  Candidates are ordered by probability, then by index, so the
 * result is a pure function of (logits, params, RNG state).  With neither
 * top-k nor top-p the walk is in index order (no sort needed).
 *
 * Each sequence has its own RNG seeded from (seed, sequence index): a
 * sequence samples the same tokens alone or in any batch, provided its
 * logits are the same.  No allocation: the probabilities overwrite the
 * logits row (the scheduler has used the row for everything else by then),
 * and the caller passes one vocab-sized index scratch (the session arena's
 * RT_BUF_INDEX), so a plan holds 4 x vocab bytes for sampling, not 8.
 */
#ifndef RT_SAMPLE_H
#define RT_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct rt_rng {
    uint64_t s;                /* splitmix64 state */
} rt_rng;

/* Seed for sequence seq_index of a request seeded with seed. */
void rt_rng_seed(rt_rng *r, uint64_t seed, uint64_t seq_index);
uint64_t rt_rng_next(rt_rng *r);
/* Uniform in [0, 1) with 53 bits. */
double rt_rng_uniform(rt_rng *r);

typedef struct rt_sampler {
    float temperature;         /* <= 0: greedy */
    uint32_t top_k;            /* 0: no limit */
    float top_p;               /* >= 1 (or <= 0): no limit */
} rt_sampler;

/* Next token from logits[vocab].  Greedy leaves the row as it is; any
 * other sampler overwrites it with the unnormalized probabilities (the
 * token is the same as with a separate copy).  idx: int32[vocab] scratch
 * (may be NULL for greedy).  Returns the token id. */
int32_t rt_sample(const rt_sampler *sp, float *logits, uint32_t vocab,
                  rt_rng *rng, int32_t *idx);

/* 1 if tok is one of stop[0..n). */
int rt_is_stop(int32_t tok, const int32_t *stop, size_t n);

/* log softmax(logits)[tok], computed stably in double. */
float rt_logprob(const float *logits, uint32_t vocab, int32_t tok);

#endif /* RT_SAMPLE_H */

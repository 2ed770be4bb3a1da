/* rt_sample.c - greedy / temperature / top-k / top-p sampling with a
 * per-sequence RNG (see rt_sample.h).  No allocation and no qsort (glibc's
 * may allocate): a heap does both the top-k selection and the sort; the
 * probabilities overwrite the logits row, so the only scratch is idx. */
#include "rt_sample.h"

#include <math.h>

void rt_rng_seed(rt_rng *r, uint64_t seed, uint64_t seq_index)
{
    /* Two mixing rounds so neighbouring (seed, index) pairs diverge. */
    r->s = seed ^ 0x9E3779B97F4A7C15ull;
    (void)rt_rng_next(r);
    r->s ^= seq_index * 0xD1B54A32D192ED03ull;
    (void)rt_rng_next(r);
}

uint64_t rt_rng_next(rt_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rt_rng_uniform(rt_rng *r)
{
    return (double)(rt_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int rt_is_stop(int32_t tok, const int32_t *stop, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (stop[i] == tok)
            return 1;
    return 0;
}

float rt_logprob(const float *logits, uint32_t vocab, int32_t tok)
{
    double mx = logits[0];
    for (uint32_t i = 1; i < vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double s = 0.0;
    for (uint32_t i = 0; i < vocab; i++)
        s += exp((double)logits[i] - mx);
    return (float)((double)logits[tok] - mx - log(s));
}

/* a ranks before b: higher probability, then lower index. */
static inline int before(const float *p, int32_t a, int32_t b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* Min-heap by rank ("worst" candidate at the root). */
static void sift_down(int32_t *h, size_t n, size_t i, const float *p)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(p, h[w], h[l]))
            w = l;
        if (r < n && before(p, h[w], h[r]))
            w = r;
        if (w == i)
            return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Sort h[0..n) best first: build the min-heap, then pop the worst to the
 * end repeatedly. */
static void heap_sort_best_first(int32_t *h, size_t n, const float *p)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(h, n, i, p);
    for (size_t end = n; end > 1; end--) {
        int32_t t = h[0];
        h[0] = h[end - 1];
        h[end - 1] = t;
        sift_down(h, end - 1, 0, p);
    }
}

int32_t rt_sample(const rt_sampler *sp, float *logits, uint32_t vocab,
                  rt_rng *rng, int32_t *idx)
{
    if (sp->temperature <= 0.0f || vocab == 1) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < vocab; i++)
            if (logits[i] > logits[best])
                best = i;
        return (int32_t)best;
    }
    float mx = logits[0];
    for (uint32_t i = 1; i < vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    const int use_k = sp->top_k > 0 && sp->top_k < vocab;
    const int use_p = sp->top_p > 0.0f && sp->top_p < 1.0f;
    /* The row becomes the unnormalized probabilities, in place: nothing
     * reads a logit again.  For top-p alone the maxima's indices go to
     * idx[0..n_max): top-p keeps them whatever the cutoff, and their
     * probability (exp 0 = 1) no longer tells them from a near-maximum
     * that rounded to 1. */
    float *probs = logits;
    const int mark_max = use_p && !use_k;
    const double inv_t = 1.0 / (double)sp->temperature;
    double total = 0.0;
    size_t n_max = 0;
    for (uint32_t i = 0; i < vocab; i++) {
        if (mark_max && logits[i] == mx)
            idx[n_max++] = (int32_t)i;
        probs[i] = (float)exp(((double)logits[i] - mx) * inv_t);
        total += probs[i];
    }
    const double u = rt_rng_uniform(rng);
    if (!use_k && !use_p) {
        /* Whole vocabulary in index order. */
        double target = u * total, cum = 0.0;
        for (uint32_t i = 0; i < vocab; i++) {
            cum += probs[i];
            if (cum > target)
                return (int32_t)i;
        }
        return (int32_t)(vocab - 1);
    }
    size_t n = 0;
    if (use_k) {
        size_t k = sp->top_k;
        for (uint32_t i = 0; i < vocab; i++) {
            if (n < k) {
                idx[n++] = (int32_t)i;
                if (n == k)
                    for (size_t j = k / 2; j-- > 0;)
                        sift_down(idx, k, j, probs);
            } else if (before(probs, (int32_t)i, idx[0])) {
                idx[0] = (int32_t)i;
                sift_down(idx, k, 0, probs);
            }
        }
    } else {
        /* A token with p < (1 - top_p) / (vocab - 1) of the mass can never
         * be inside the nucleus (llama2.c's argument): skip sorting it.
         * The maxima (p = 1) are always kept: a cutoff <= 1 keeps them;
         * above 1 (a tiny top_p), or NaN, nothing passes it, and they are
         * exactly idx[0..n_max). */
        double cutoff = (1.0 - sp->top_p) / (double)(vocab - 1) * total;
        if (!(cutoff <= 1.0))
            n = n_max;
        else
            for (uint32_t i = 0; i < vocab; i++)
                if ((double)probs[i] >= cutoff)
                    idx[n++] = (int32_t)i;
    }
    heap_sort_best_first(idx, n, probs);
    /* top-p is relative to what top-k kept (or to the whole vocabulary). */
    double base = total;
    if (use_k) {
        base = 0.0;
        for (size_t i = 0; i < n; i++)
            base += probs[idx[i]];
    }
    size_t m = n;
    if (use_p) {
        double need = (double)sp->top_p * base, cum = 0.0;
        for (size_t i = 0; i < n; i++) {
            cum += probs[idx[i]];
            if (cum >= need) {
                m = i + 1;
                break;
            }
        }
    }
    double kept = 0.0;
    for (size_t i = 0; i < m; i++)
        kept += probs[idx[i]];
    double target = u * kept, cum = 0.0;
    for (size_t i = 0; i < m; i++) {
        cum += probs[idx[i]];
        if (cum > target)
            return idx[i];
    }
    return idx[m - 1];
}

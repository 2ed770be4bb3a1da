/* test_kernels.c - the thread pool and the float32 ops of kn_ops.h (norms,
 * activations, softmax family, KV cache, attention) against their scalar
 * references and against naive double implementations written here. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "kn_lora.h"
#include "kn_ops.h"
#include "testutil.h"

static tu_rng g_rng = {0x243f6a8885a308d3ull};

/* Run body once with AVX2 (when present) and once forced scalar. */
#define FOR_BOTH_PATHS(s)                                                      \
    for (int s = kn_cpu_has_avx2() ? 0 : 1; s < 2; s++)

/* ---- pool --------------------------------------------------------------- */

typedef struct pool_ctx {
    atomic_int hits[8];
    atomic_int calls;
    int nth_seen;
} pool_ctx;

static void pool_fn(void *v, int tid, int nth)
{
    pool_ctx *c = v;
    atomic_fetch_add(&c->hits[tid], 1);
    atomic_fetch_add(&c->calls, 1);
    c->nth_seen = nth;
}

static void test_pool_runs_every_thread_once_per_call(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++) {
        kn_pool *p = kn_pool_create(n);
        assert_non_null(p);
        assert_int_equal(kn_pool_threads(p), n);
        pool_ctx c;
        memset(&c, 0, sizeof c);
        for (int it = 0; it < 2000; it++)
            kn_pool_run(p, pool_fn, &c);
        assert_int_equal(atomic_load(&c.calls), 2000 * n);
        for (int t = 0; t < n; t++)
            assert_int_equal(atomic_load(&c.hits[t]), 2000);
        assert_int_equal(c.nth_seen, n);
        kn_pool_free(p);
    }
}

/* A shared job: items claimed in order until none are left. */
typedef struct shared_ctx {
    atomic_int next;
    int n;
    atomic_int items[64];
    atomic_int tids; /* bit per thread that claimed an item */
} shared_ctx;

static void shared_fn(void *v, int tid, int nth)
{
    (void)nth;
    shared_ctx *c = v;
    for (int i; (i = atomic_fetch_add(&c->next, 1)) < c->n;) {
        atomic_fetch_add(&c->items[i], 1);
        atomic_fetch_or(&c->tids, 1 << tid);
    }
}

/* Shared jobs between ordinary ones: every item once per shared job, every
 * thread once per ordinary job, also when a worker that missed a shared job
 * (parked: 4 threads on one CPU) wakes into the next ones. */
static void test_pool_shared_jobs_do_every_item_once(void **state)
{
    (void)state;
    cpu_set_t saved, one;
    assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
    for (int pin = 0; pin < 2; pin++) {
        if (pin) {
            int first = 0;
            while (!CPU_ISSET(first, &saved))
                first++;
            CPU_ZERO(&one);
            CPU_SET(first, &one);
            assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
        }
        kn_pool *p = kn_pool_create(4);
        assert_non_null(p);
        pool_ctx c;
        memset(&c, 0, sizeof c);
        int alone = 0;
        for (int it = 0; it < 3000; it++) {
            shared_ctx s;
            memset(&s, 0, sizeof s);
            s.n = 1 + it % 64;
            kn_pool_run_shared(p, shared_fn, &s);
            for (int i = 0; i < 64; i++)
                assert_int_equal(atomic_load(&s.items[i]), i < s.n);
            alone += atomic_load(&s.tids) == 1;
            kn_pool_run(p, pool_fn, &c);
        }
        for (int t = 0; t < 4; t++)
            assert_int_equal(atomic_load(&c.hits[t]), 3000);
        print_message("shared jobs the caller did alone (%s): %d of 3000\n",
                      pin ? "4 threads on 1 CPU" : "4 threads", alone);
        kn_pool_run_shared(NULL, shared_fn, &(shared_ctx){.n = 3});
        kn_pool_free(p);
    }
    assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
}

typedef struct rows_ctx {
    atomic_int hits[5000];
    atomic_int calls;
} rows_ctx;

static void rows_fn(void *c, size_t u0, size_t u1)
{
    rows_ctx *r = c;
    assert_true(u0 < u1);
    atomic_fetch_add(&r->calls, 1);
    for (size_t u = u0; u < u1; u++)
        atomic_fetch_add(&r->hits[u], 1);
}

/* kn_pool_rows covers every unit exactly once, inline (one call) without
 * a pool, with one thread or under min_units, split otherwise. */
static void test_pool_rows_cover_every_unit_once(void **state)
{
    (void)state;
    static const size_t ns[] = {0, 1, 2, 7, 64, 1000, 4999};
    for (int th = 0; th <= 4; th++) {
        kn_pool *p = th ? kn_pool_create(th) : NULL;
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t min = 1; min <= 100; min *= 10) {
            rows_ctx *r = calloc(1, sizeof *r);
            assert_non_null(r);
            kn_pool_rows(p, ns[i], min, rows_fn, r);
            for (size_t u = 0; u < 5000; u++)
                assert_int_equal(atomic_load(&r->hits[u]), u < ns[i]);
            int calls = atomic_load(&r->calls);
            if (th < 2 || ns[i] < 2 || ns[i] < min)
                assert_int_equal(calls, ns[i] ? 1 : 0);
            else
                assert_true(calls >= 2);
            free(r);
        }
        kn_pool_free(p);
    }
}

static void test_pool_null_runs_inline_and_free_null_is_noop(void **state)
{
    (void)state;
    pool_ctx c;
    memset(&c, 0, sizeof c);
    kn_pool_run(NULL, pool_fn, &c);
    assert_int_equal(atomic_load(&c.hits[0]), 1);
    assert_int_equal(c.nth_seen, 1);
    assert_int_equal(kn_pool_threads(NULL), 1);
    kn_pool_free(NULL);
    kn_pool *p = kn_pool_create(0); /* one per online CPU */
    assert_non_null(p);
    assert_true(kn_pool_threads(p) >= 1);
    kn_pool_free(p);
}

static void test_force_scalar_switch_round_trips(void **state)
{
    (void)state;
    kn_set_force_scalar(1);
    assert_int_equal(kn_force_scalar(), 1);
    kn_set_force_scalar(0);
    assert_int_equal(kn_force_scalar(), 0);
}

/* ---- elementwise -------------------------------------------------------- */

static void test_rmsnorm_matches_reference_odd_sizes(void **state)
{
    (void)state;
    static const size_t ns[] = { 1, 7, 8, 17, 100, 4096 };
    FOR_BOTH_PATHS(s) {
        kn_set_force_scalar(s);
        for (size_t k = 0; k < 6; k++) {
            size_t n = ns[k], T = 3;
            float *x = malloc(T * n * 4), *w = malloc(n * 4);
            float *a = malloc(T * n * 4), *b = malloc(T * n * 4);
            tu_rng_fill(&g_rng, x, T * n, 3.0f);
            tu_rng_fill(&g_rng, w, n, 1.0f);
            kn_ref_rmsnorm(b, x, w, T, n, 1e-5f);
            kn_rmsnorm(a, x, w, T, n, 1e-5f);
            assert_true(tu_norm_err(a, b, T * n) < 1e-6);
            kn_rmsnorm(x, x, w, T, n, 1e-5f); /* in place */
            assert_true(tu_norm_err(x, b, T * n) < 1e-6);
            free(x), free(w), free(a), free(b);
        }
    }
    kn_set_force_scalar(0);
}

static void test_rmsnorm_known_answer(void **state)
{
    (void)state;
    float x[4] = { 1, 2, 3, 4 }, w[4] = { 1, 1, 2, 0.5f }, o[4];
    kn_rmsnorm(o, x, w, 1, 4, 0.0f);
    double inv = 1.0 / sqrt(30.0 / 4.0);
    assert_float_equal(o[0], 1 * inv, 1e-6);
    assert_float_equal(o[2], 6 * inv, 1e-6);
    assert_float_equal(o[3], 2 * inv, 1e-6);
}

static void test_silu_mul_matches_reference_incl_extremes(void **state)
{
    (void)state;
    size_t n = 1003;
    float *g = malloc(n * 4), *u = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
    tu_rng_fill(&g_rng, g, n, 12.0f);
    tu_rng_fill(&g_rng, u, n, 2.0f);
    g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f, g[3] = -87.0f;
    FOR_BOTH_PATHS(s) {
        kn_set_force_scalar(s);
        memcpy(a, g, n * 4);
        memcpy(b, g, n * 4);
        kn_ref_silu_mul(b, u, n);
        kn_silu_mul(a, u, n);
        assert_true(tu_norm_err(a, b, n) < 1e-6);
        assert_true(isfinite(a[0]) && fabsf(a[0]) < 1e-30f);
    }
    kn_set_force_scalar(0);
    free(g), free(u), free(a), free(b);
}

static void test_add_adds_elementwise(void **state)
{
    (void)state;
    float y[13], x[13];
    for (int i = 0; i < 13; i++)
        y[i] = (float)i, x[i] = 0.5f * (float)i;
    kn_add(y, x, 13);
    for (int i = 0; i < 13; i++)
        assert_true(y[i] == 1.5f * (float)i);
}

static void test_softmax_matches_double_and_sums_to_one(void **state)
{
    (void)state;
    static const size_t ns[] = { 1, 5, 8, 33, 32000 };
    FOR_BOTH_PATHS(s) {
        kn_set_force_scalar(s);
        for (int k = 0; k < 5; k++) {
            size_t n = ns[k];
            float *x = malloc(n * 4), *e = malloc(n * 4);
            tu_rng_fill(&g_rng, x, n, 20.0f);
            double mx = -INFINITY, sum = 0.0;
            for (size_t i = 0; i < n; i++)
                mx = x[i] > mx ? x[i] : mx;
            for (size_t i = 0; i < n; i++)
                sum += exp((double)x[i] - mx);
            for (size_t i = 0; i < n; i++)
                e[i] = (float)(exp((double)x[i] - mx) / sum);
            double lse = mx + log(sum);
            assert_float_equal(kn_logsumexp(x, n), lse, 1e-5 * fabs(lse) + 1e-6);
            kn_softmax(x, n);
            assert_true(tu_norm_err(x, e, n) < 1e-5);
            free(x), free(e);
        }
    }
    kn_set_force_scalar(0);
}

static void test_logsumexp_is_stable_for_large_values(void **state)
{
    (void)state;
    float x[3] = { 1000.0f, 1000.0f, -1e30f };
    assert_float_equal(kn_logsumexp(x, 3), 1000.0 + log(2.0), 1e-3);
    float y[2] = { -INFINITY, -INFINITY };
    assert_true(isinf(kn_logsumexp(y, 2)) && kn_logsumexp(y, 2) < 0);
}

static void test_argmax_returns_first_of_ties(void **state)
{
    (void)state;
    float x[6] = { -1, 3, 2, 3, -5, 3 };
    assert_int_equal(kn_argmax(x, 6), 1);
    assert_int_equal(kn_argmax(x, 1), 0);
    float y[3] = { -INFINITY, -2, -2 };
    assert_int_equal(kn_argmax(y, 3), 1);
}

/* ---- KV cache and attention --------------------------------------------- */

typedef struct tkv {
    kn_kv kv;
    float *kf, *vf; /* [npos][kvw] the unquantized values, for naive checks */
} tkv;

static tkv tkv_make(kn_kvtype type, uint32_t nkv, uint32_t hd, uint64_t cap,
                    int64_t npos)
{
    tkv t;
    memset(&t, 0, sizeof t);
    t.kv.type = type;
    t.kv.n_kv_heads = nkv;
    t.kv.head_dim = hd;
    t.kv.cap = cap;
    size_t w = (size_t)nkv * hd;
    size_t es = type == KN_KV_F32 ? 4 : type == KN_KV_F16 ? 2 : 1;
    t.kv.k = malloc(cap * w * es);
    t.kv.v = malloc(cap * w * es);
    if (type == KN_KV_I8) {
        t.kv.k_scale = malloc(cap * nkv * 4);
        t.kv.v_scale = malloc(cap * nkv * 4);
    }
    assert_int_equal(kn_kv_slot_bytes(type, nkv, hd),
                     2 * w * es + (type == KN_KV_I8 ? 2 * nkv * 4 : 0));
    t.kf = malloc((size_t)npos * w * 4);
    t.vf = malloc((size_t)npos * w * 4);
    tu_rng_fill(&g_rng, t.kf, (size_t)npos * w, 2.0f);
    tu_rng_fill(&g_rng, t.vf, (size_t)npos * w, 1.0f);
    for (int64_t p = 0; p < npos; p++)
        kn_kv_store(&t.kv, p, t.kf + p * w, t.vf + p * w);
    return t;
}

static void tkv_free(tkv *t)
{
    free(t->kv.k), free(t->kv.v), free(t->kv.k_scale), free(t->kv.v_scale);
    free(t->kf), free(t->vf);
}

/* Naive causal GQA attention in double over the unquantized K/V. */
static void naive_attention(const tkv *t, const float *q, size_t T,
                            uint32_t nh, int64_t pos0, uint64_t window,
                            float *out)
{
    uint32_t hd = t->kv.head_dim, nkv = t->kv.n_kv_heads;
    size_t w = (size_t)nkv * hd;
    for (size_t ti = 0; ti < T; ti++)
        for (uint32_t h = 0; h < nh; h++) {
            int64_t p = pos0 + (int64_t)ti;
            int64_t lo = window && (uint64_t)p >= window ? p - (int64_t)window + 1 : 0;
            uint32_t kh = h / (nh / nkv);
            const float *qh = q + (ti * nh + h) * hd;
            double sc[512], mx = -INFINITY, sum = 0.0;
            for (int64_t j = lo; j <= p; j++) {
                double s = 0.0;
                for (uint32_t d = 0; d < hd; d++)
                    s += (double)qh[d] * t->kf[j * w + kh * hd + d];
                sc[j - lo] = s / sqrt((double)hd);
                mx = sc[j - lo] > mx ? sc[j - lo] : mx;
            }
            for (int64_t j = lo; j <= p; j++)
                sum += (sc[j - lo] = exp(sc[j - lo] - mx));
            for (uint32_t d = 0; d < hd; d++) {
                double a = 0.0;
                for (int64_t j = lo; j <= p; j++)
                    a += sc[j - lo] * t->vf[j * w + kh * hd + d];
                out[(ti * nh + h) * hd + d] = (float)(a / sum);
            }
        }
}

typedef struct att_case {
    kn_kvtype type;
    uint32_t nh, nkv, hd;
    uint64_t cap, window;
    int64_t pos0;
    size_t T;
    double tol_naive; /* vs the naive double on unquantized K/V */
} att_case;

static void run_att_case(const att_case *c)
{
    int64_t npos = c->pos0 + (int64_t)c->T;
    tkv t = tkv_make(c->type, c->nkv, c->hd, c->cap, npos);
    size_t qn = c->T * c->nh * c->hd;
    float *q = malloc(qn * 4), *o = malloc(qn * 4), *r = malloc(qn * 4);
    float *nv = malloc(qn * 4);
    tu_rng_fill(&g_rng, q, qn, 1.0f);
    uint64_t maxctx = (uint64_t)npos;
    float *scr = malloc(kn_attention_scratch_floats(2, maxctx, c->hd) * 4);
    kn_pool *p2 = kn_pool_create(2);
    assert_true(q && o && r && nv && scr && p2);
    naive_attention(&t, q, c->T, c->nh, c->pos0, c->window, nv);
    kn_ref_attention(&t.kv, q, c->T, c->nh, c->pos0, c->window, r, scr);
    double en = tu_norm_err(r, nv, qn);
    if (!(en < c->tol_naive))
        fprintf(stderr, "ref vs naive type %d: %g\n", c->type, en);
    assert_true(en < c->tol_naive);
    FOR_BOTH_PATHS(s) {
        kn_set_force_scalar(s);
        for (int th = 0; th < 2; th++) {
            for (size_t i = 0; i < qn; i++)
                o[i] = NAN;
            kn_attention(th ? p2 : NULL, &t.kv, q, c->T, c->nh, c->pos0,
                         c->window, o, scr);
            double e = tu_norm_err(o, r, qn);
            if (!(e < 1e-5))
                fprintf(stderr, "attention type %d nh %u nkv %u hd %u T %zu "
                        "pos0 %lld win %llu cap %llu scalar %d thr %d: %g\n",
                        c->type, c->nh, c->nkv, c->hd, c->T, (long long)c->pos0,
                        (unsigned long long)c->window,
                        (unsigned long long)c->cap, s, th + 1, e);
            assert_true(e < 1e-5);
        }
    }
    kn_set_force_scalar(0);
    kn_pool_free(p2);
    free(q), free(o), free(r), free(nv), free(scr);
    tkv_free(&t);
}

static void test_attention_f32_matches_naive_causal_and_gqa(void **state)
{
    (void)state;
    const att_case cs[] = {
        { KN_KV_F32, 4, 4, 16, 64, 0, 0, 17, 1e-5 },   /* prefill from 0 */
        { KN_KV_F32, 8, 2, 64, 64, 0, 30, 1, 1e-5 },   /* decode, GQA 4:1 */
        { KN_KV_F32, 6, 3, 13, 64, 0, 5, 3, 1e-5 },    /* odd head_dim */
        { KN_KV_F32, 4, 1, 128, 100, 0, 60, 9, 1e-5 }, /* MQA */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_att_case(&cs[i]);
}

static void test_attention_sliding_window_and_ring_wrap(void **state)
{
    (void)state;
    /* cap 10, window 8: positions 13..22 live in the ring at the end; the
     * three new tokens attend 13..20, 14..21, 15..22. */
    const att_case cs[] = {
        { KN_KV_F32, 4, 2, 32, 10, 8, 20, 3, 1e-5 },
        { KN_KV_F32, 2, 1, 8, 5, 5, 37, 1, 1e-5 },  /* window = cap, decode */
        { KN_KV_F32, 4, 4, 24, 64, 4, 0, 12, 1e-5 }, /* window inside prefill */
        { KN_KV_F16, 4, 2, 32, 10, 8, 20, 3, 2e-3 },
        { KN_KV_I8, 4, 2, 32, 10, 8, 20, 3, 3e-2 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_att_case(&cs[i]);
}

static void test_attention_f16_and_i8_kv_match_reference(void **state)
{
    (void)state;
    const att_case cs[] = {
        { KN_KV_F16, 8, 2, 64, 64, 0, 40, 5, 2e-3 },
        { KN_KV_I8, 8, 2, 64, 64, 0, 40, 5, 3e-2 },
        { KN_KV_I8, 3, 3, 21, 32, 0, 0, 9, 3e-2 },
        { KN_KV_F16, 3, 1, 19, 32, 0, 7, 1, 2e-3 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        run_att_case(&cs[i]);
}

static void test_kv_store_i8_quantizes_per_head(void **state)
{
    (void)state;
    int8_t k[2][4], v[2][4];
    float ks[2], vs[2];
    kn_kv kv = { KN_KV_I8, 1, 4, 2, k, v, ks, vs };
    float kr[4] = { 1.0f, -0.5f, 0.25f, 0.0f }, vr[4] = { 0, 0, 0, 0 };
    kn_kv_store(&kv, 3, kr, vr); /* slot 1 */
    assert_float_equal(ks[1], 1.0f / 127.0f, 1e-9);
    assert_int_equal(k[1][0], 127);
    assert_int_equal(k[1][1], -64); /* -63.5 rounds to even */
    assert_int_equal(k[1][2], 32);  /* 31.75 */
    assert_true(vs[1] == 0.0f && v[1][0] == 0 && v[1][3] == 0);
}

/* An f16 KV cache stores fmt_f32_to_f16's bits on every path (the AVX2
 * one converts 8 at a time with F16C): ties to even at every exponent,
 * the subnormal range, overflow at 65520, signed zeros, Inf, NaN with any
 * payload (canonical 0x7e00 with its sign), and a sweep of every 4099th
 * bit pattern. */
static void test_kv_store_f16_is_fmt_f32_to_f16_bitwise(void **state)
{
    (void)state;
    enum { W = 40 }; /* 5 vectors of 8: both the vector loop and no tail */
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
        0xffc00001u, 0x7f800001u, 0xff812345u, 0x7fbfffffu, 0x477fefffu,
        0x477ff000u, 0x477fe000u, 0xc77ff000u, 0x38800000u, 0x387fffffu,
        0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u, 0x00000001u,
        0x80800000u, 0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u,
        0x38801000u, 0x38803000u, 0x35000000u, 0x35400000u, 0x35c00000u,
        0x7f7fffffu, 0xc7800000u,
    };
    uint16_t kc[2][W], vc[2][W];
    kn_kv kv = {KN_KV_F16, 1, W, 2, kc, vc, NULL, NULL};
    float x[W], zero[W] = {0};
    uint32_t next = 0;
    for (int pass = 0; pass < 2; pass++) {
        kn_set_force_scalar(pass); /* AVX2 (where present), then scalar */
        uint64_t sweep = 0;
        for (int round = 0; sweep < (1ull << 32); round++) {
            for (int i = 0; i < W; i++) {
                uint32_t b;
                if (round == 0 && i < (int)(sizeof special / sizeof special[0]))
                    b = special[i];
                else if (round < 40) /* halfway points at each exponent */
                    b = ((uint32_t)(round * 6 + i % 6) << 23) |
                        ((uint32_t)(i & 1) << 31) | 0x1000u | (uint32_t)(i * 0x2000u);
                else
                    b = (uint32_t)(sweep += 4099u * 7u);
                memcpy(&x[i], &b, 4);
            }
            kn_kv_store(&kv, next++, x, zero);
            const uint16_t *got = kc[(next - 1) % 2];
            for (int i = 0; i < W; i++)
                if (got[i] != fmt_f32_to_f16(x[i])) {
                    uint32_t b;
                    memcpy(&b, &x[i], 4);
                    kn_set_force_scalar(0);
                    fail_msg("pass %d: 0x%08x stored 0x%04x, want 0x%04x", pass,
                             b, got[i], fmt_f32_to_f16(x[i]));
                }
        }
    }
    kn_set_force_scalar(0);
}

/* The merge's delta product: the AVX-512 and AVX2 paths equal the scalar
 * reference bit for bit (same summation order, no fused multiply-add) for
 * every shape edge (rows not a multiple of 4, columns not a multiple of
 * 16, 8 or 4, a column tail across a 256-column block, rank 1), and all
 * equal a plain double sum in k order. */
static void test_lora_rows_avx2_equals_reference_bitwise(void **state)
{
    (void)state;
    static const size_t shapes[][3] = {
        {1, 1, 1},     {4, 8, 16},   {5, 13, 3},   {9, 67, 8},
        {3, 4, 1},     {8, 1029, 16}, {7, 16, 2},  {6, 271, 5},
        {2, 9, 16},    {11, 530, 4}, {1, 17, 7},   {16, 2048, 16},
    };
    for (size_t c = 0; c < 2 * sizeof shapes / sizeof shapes[0]; c++) {
        /* every shape twice: AVX-512 (where the CPU has it), then AVX2 */
        int no512 = c >= sizeof shapes / sizeof shapes[0];
        kn_set_no_avx512(no512);
        const size_t *sh = shapes[c % (sizeof shapes / sizeof shapes[0])];
        size_t nr = sh[0], cols = sh[1];
        uint32_t r = (uint32_t)sh[2];
        size_t ldo = cols + 3;
        double *L = malloc(nr * r * sizeof *L), *R = malloc(r * cols * sizeof *R);
        double *o1 = malloc(nr * ldo * sizeof *o1), *o2 = malloc(nr * ldo * sizeof *o2);
        assert_true(L && R && o1 && o2);
        for (size_t i = 0; i < nr * r; i++)
            L[i] = (double)tu_rng_f(&g_rng) * 0.3 + 1e-9 * tu_rng_f(&g_rng);
        for (size_t i = 0; i < r * cols; i++)
            R[i] = (double)tu_rng_f(&g_rng) / 7.0;
        memset(o1, 0x5a, nr * ldo * sizeof *o1);
        memset(o2, 0x5a, nr * ldo * sizeof *o2);
        kn_ref_lora_rows(L, R, r, cols, nr, o1, ldo);
        kn_set_force_scalar(0);
        kn_lora_rows(L, R, r, cols, nr, o2, ldo);
        for (size_t i = 0; i < nr; i++)
            for (size_t j = 0; j < cols; j++) {
                double want = 0;
                for (uint32_t k = 0; k < r; k++) {
                    double p = L[i * r + k] * R[k * cols + j];
                    want += p;
                }
                assert_memory_equal(&o1[i * ldo + j], &want, sizeof want);
                assert_memory_equal(&o2[i * ldo + j], &want, sizeof want);
            }
        /* the padding between rows is not written */
        if (nr > 1)
            assert_memory_equal(&o1[cols], &o2[cols], 3 * sizeof *o1);
        /* the fused add: out + coef * sum, as the reference */
        for (size_t i = 0; i < nr * ldo; i++)
            o1[i] = o2[i] = (double)tu_rng_f(&g_rng);
        kn_ref_lora_rows_add(L, R, r, cols, nr, -0.37, o1, ldo);
        kn_lora_rows_add(L, R, r, cols, nr, -0.37, o2, ldo);
        assert_memory_equal(o1, o2, nr * ldo * sizeof *o1);
        kn_set_no_avx512(0);
        free(L);
        free(R);
        free(o1);
        free(o2);
    }
}

/* The row finish: bf16 / f16 / f32 rounded once from the double (the
 * nearest representable value, ties to even, by brute force here), the
 * AVX2 path equal to the reference, the first out-of-range index found. */
static void test_lora_finish_rounds_once_and_finds_overflow(void **state)
{
    (void)state;
    enum { N = 203 };
    double d[N];
    float base[N];
    for (int i = 0; i < N; i++) {
        d[i] = (double)tu_rng_f(&g_rng) * (i % 7 == 0 ? 1e-3 : 3.0) +
               (double)tu_rng_f(&g_rng) * 1e-12;
        base[i] = (float)(d[i] * 0.5);
    }
    d[5] = 1.0 + 0x1p-8;            /* bf16 tie: stays 1.0 (even) */
    d[6] = 1.0 + 0x1p-8 + 0x1p-40;  /* just above the tie: rounds up */
    d[7] = 0x1p-130 * 1.75;         /* below bf16's normal range */
    d[8] = -0.0;
    d[9] = 3e-6;                    /* f16 subnormal */
    for (int type = 0; type < 3; type++) {
        uint16_t o1[N], o2[N];
        float f1[N], f2[N];
        void *out1 = type ? (void *)o1 : (void *)f1;
        void *out2 = type ? (void *)o2 : (void *)f2;
        double m1 = 0, m2 = 0;
        assert_int_equal(kn_ref_lora_finish(d, base, N, type, out1, &m1), N);
        kn_set_force_scalar(0);
        for (int no512 = 1; no512 >= 0; no512--) { /* AVX2, then AVX-512 */
            kn_set_no_avx512(no512);
            memset(out2, 0xa5, (size_t)N * (type ? 2 : 4));
            m2 = 0;
            assert_int_equal(kn_lora_finish(d, base, N, type, out2, &m2), N);
            assert_memory_equal(out1, out2, (size_t)N * (type ? 2 : 4));
            assert_true(m1 == m2 && m1 > 0);
            /* from an offset: groups of 8 no longer aligned to the array */
            double m3 = 0, m4 = 0;
            assert_int_equal(kn_ref_lora_finish(d + 3, base + 3, N - 3, type,
                                                out1, &m3), N - 3);
            assert_int_equal(kn_lora_finish(d + 3, base + 3, N - 3, type,
                                            out2, &m4), N - 3);
            assert_memory_equal(out1, out2, (size_t)(N - 3) * (type ? 2 : 4));
            assert_true(m3 == m4);
            assert_int_equal(kn_ref_lora_finish(d, base, N, type, out1, &m1), N);
        }
        kn_set_no_avx512(0);
        for (int i = 0; i < N; i++) {
            if (type == KN_LORA_F32) {
                assert_true(f1[i] == (float)d[i]);
                continue;
            }
            /* neighbours of the result are no closer (ties: even wins) */
            uint16_t h = o1[i];
            double v = type == KN_LORA_BF16 ? fmt_bf16_to_f32(h) : fmt_f16_to_f32(h);
            for (int dl = -1; dl <= 1; dl += 2) {
                uint16_t g = (uint16_t)(h + dl);
                double w = type == KN_LORA_BF16 ? fmt_bf16_to_f32(g) : fmt_f16_to_f32(g);
                if (!isfinite(w) || (d[i] == 0 && dl < 0))
                    continue;
                assert_true(fabs(w - d[i]) > fabs(v - d[i]) ||
                            (fabs(w - d[i]) == fabs(v - d[i]) && !(h & 1)));
            }
        }
        assert_int_equal(o1[5], type == KN_LORA_BF16 ? 0x3f80 : o1[5]);
        assert_int_equal(o1[6], type == KN_LORA_BF16 ? 0x3f81 : o1[6]);
    }
    for (int no512 = 0; no512 <= 1; no512++) {
        kn_set_no_avx512(no512);
        d[150] = 3.5e38; /* beyond float32 */
        uint16_t o[N];
        double m = 0;
        assert_int_equal(kn_lora_finish(d, base, N, KN_LORA_BF16, o, &m), 150);
        assert_int_equal(kn_ref_lora_finish(d, base, N, KN_LORA_BF16, o, &m), 150);
        d[150] = NAN;
        assert_int_equal(kn_lora_finish(d, base, N, KN_LORA_F32, (float[N]){0}, &m), 150);
        d[150] = 0.5;
        d[201] = -INFINITY; /* in the tail after the last group of 8 */
        assert_int_equal(kn_lora_finish(d, base, N, KN_LORA_BF16, o, &m), 201);
        d[201] = 0.25;
    }
    kn_set_no_avx512(0);
}

/* The fused form equals the plain product followed by the add. */
static void test_lora_rows_add_equals_rows_then_add(void **state)
{
    (void)state;
    size_t nr = 7, cols = 45;
    uint32_t r = 5;
    double L[7 * 5], R[5 * 45], o1[7 * 45], o2[7 * 45], o3[7 * 45], t[7 * 45];
    for (size_t i = 0; i < nr * r; i++)
        L[i] = tu_rng_f(&g_rng);
    for (size_t i = 0; i < r * cols; i++)
        R[i] = tu_rng_f(&g_rng);
    for (size_t i = 0; i < nr * cols; i++)
        o1[i] = o2[i] = o3[i] = tu_rng_f(&g_rng);
    kn_ref_lora_rows(L, R, r, cols, nr, t, cols);
    for (size_t i = 0; i < nr * cols; i++) {
        double c = 0.37 * t[i];
        o1[i] += c;
    }
    kn_ref_lora_rows_add(L, R, r, cols, nr, 0.37, o2, cols);
    kn_set_force_scalar(0);
    kn_lora_rows_add(L, R, r, cols, nr, 0.37, o3, cols);
    assert_memory_equal(o1, o2, sizeof o1);
    assert_memory_equal(o1, o3, sizeof o1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_thread_once_per_call),
        cmocka_unit_test(test_pool_shared_jobs_do_every_item_once),
        cmocka_unit_test(test_pool_rows_cover_every_unit_once),
        cmocka_unit_test(test_pool_null_runs_inline_and_free_null_is_noop),
        cmocka_unit_test(test_force_scalar_switch_round_trips),
        cmocka_unit_test(test_rmsnorm_matches_reference_odd_sizes),
        cmocka_unit_test(test_rmsnorm_known_answer),
        cmocka_unit_test(test_silu_mul_matches_reference_incl_extremes),
        cmocka_unit_test(test_add_adds_elementwise),
        cmocka_unit_test(test_softmax_matches_double_and_sums_to_one),
        cmocka_unit_test(test_logsumexp_is_stable_for_large_values),
        cmocka_unit_test(test_argmax_returns_first_of_ties),
        cmocka_unit_test(test_attention_f32_matches_naive_causal_and_gqa),
        cmocka_unit_test(test_attention_sliding_window_and_ring_wrap),
        cmocka_unit_test(test_attention_f16_and_i8_kv_match_reference),
        cmocka_unit_test(test_kv_store_i8_quantizes_per_head),
        cmocka_unit_test(test_kv_store_f16_is_fmt_f32_to_f16_bitwise),
        cmocka_unit_test(test_lora_rows_avx2_equals_reference_bitwise),
        cmocka_unit_test(test_lora_finish_rounds_once_and_finds_overflow),
        cmocka_unit_test(test_lora_rows_add_equals_rows_then_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

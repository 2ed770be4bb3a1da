/* kn_gram.c - blocked Gram sums (see kn_gram.h): packing, the threads, the
 * scalar tile and the double references. */
#include "kn_gram.h"
#include "kn_internal.h"
#include "kn_stats_bytes.h"

#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

_Static_assert(KN_GRAM_FC == KN_STATS_CHUNK,
               "the GPU's float chunk is the CPU's (kn_stats_bytes.h)");
_Static_assert(KN_GRAM_KC % KN_GRAM_FC == 0,
               "a packed chunk holds whole float chunks");

/* Work (multiply-adds) below which a chunk stays on the calling thread:
 * about 50 us of one core.  Waking the pool costs microseconds on an idle
 * machine and up to a scheduler time slice on a loaded one, where
 * stories260k's 64-wide sums spent more time handing off than adding. */
#define GRAM_PAR_MIN ((size_t)1 << 21)

/* Column panels per group (compute): 8 B panels of 512 tokens, 256 KiB,
 * fit the L2 of one core (1 MiB on Zen 4, 2 MiB on Zen 5). */
#define GRAM_GROUP 8

/* GRAM_BF16: kn_avx512bf16_gram_tile on pair-packed panels (the bfloat16
 * sums only); the others run float tiles, in the bfloat16 sums on rounded
 * inputs with the tokens of each pair swapped. */
enum { GRAM_SCALAR, GRAM_AVX2, GRAM_AVX512, GRAM_BF16 };

static size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

uint64_t kn_gram_scratch_floats(uint32_t n)
{
    return kn_gram_rect_scratch_floats(n, n);
}

uint64_t kn_gram_rect_scratch_floats(uint32_t na, uint32_t nb)
{
    return ((uint64_t)ceil_div(na, KN_GRAM_MR) * KN_GRAM_MR +
            (uint64_t)ceil_div(nb, KN_GRAM_NR) * KN_GRAM_NR) * KN_GRAM_KC_BF16;
}

/* Start of packed row i of an n-wide triangle (cmp_hessian_row_offset). */
static size_t tri_row(size_t n, size_t i)
{
    return i * (2 * n + 1 - i) / 2;
}

/* The AVX2 tile's sums without it: float sums of KN_GRAM_FC tokens, each
 * added to the double tile (FMA only where the compiler contracts). */
static void tile_scalar(const float *ap, const float *bp, size_t m,
                        double out[KN_GRAM_MR * KN_GRAM_NR])
{
    for (size_t k = 0; k < KN_GRAM_MR * KN_GRAM_NR; k++)
        out[k] = 0.0;
    for (size_t t0 = 0; t0 < m; t0 += KN_GRAM_FC) {
        size_t t1 = m - t0 < KN_GRAM_FC ? m : t0 + KN_GRAM_FC;
        float f[KN_GRAM_MR * KN_GRAM_NR] = {0};
        for (size_t t = t0; t < t1; t++)
            for (size_t r = 0; r < KN_GRAM_MR; r++) {
                float a = ap[t * KN_GRAM_MR + r];
                for (size_t c = 0; c < KN_GRAM_NR; c++)
                    f[r * KN_GRAM_NR + c] += a * bp[t * KN_GRAM_NR + c];
            }
        for (size_t k = 0; k < KN_GRAM_MR * KN_GRAM_NR; k++)
            out[k] += f[k];
    }
}

typedef struct gram_job {
    double *out;         /* packed triangle (tri) or [na][n] (cross) */
    const float *a, *b;  /* the chunk's rows [m][na] and [m][n] (b == a,
                            na == n for tri) */
    size_t na, n, m;
    size_t mt;           /* rows of the packed panels: m, or m rounded up
                            to pairs (bfloat16) */
    size_t pe;           /* elements per panel row: tokens (KN_GRAM_KC or,
                            bfloat16, KN_GRAM_KC_BF16) or pairs */
    uint32_t *xpa, *xpb; /* GRAM_BF16: the chunk's rows of a and b as
                            pairs (convert), in the scratch past the
                            panels (they take half of it) */
    int tri;
    int bf16;            /* inputs rounded to bfloat16 (kn_gram_tri_bf16) */
    int path;            /* GRAM_SCALAR, GRAM_AVX2, GRAM_AVX512, GRAM_BF16 */
    float *ap, *bp;      /* packed panels (scratch) */
    size_t nbi, nbj;     /* row / column panels */
} gram_job;

/* Column panel jb's share: with tri, panel jb meets about jb + 1 row
 * panels, so thread k starts at nbj * sqrt(k / nth) (equal work). */
static size_t panel_split(const gram_job *j, int k, int nth)
{
    if (k >= nth)
        return j->nbj;
    double f = (double)k / nth;
    size_t s = (size_t)((double)j->nbj * (j->tri ? sqrt(f) : f));
    return s < j->nbj ? s : j->nbj;
}

/* Columns [c0, c0 + pw) of the chunk's m rows of x [m][n], token-major
 * into d [m][pw], zero past column n. */
static void pack_panel(const float *x, size_t n, size_t m, size_t c0,
                       size_t pw, float *d)
{
    size_t w = n - c0 < pw ? n - c0 : pw;
    /* full panels with a constant width: the copies become a few vector
     * moves instead of memcpy's loop for a length it does not know */
    if (w == KN_GRAM_NR && pw == KN_GRAM_NR) {
        for (size_t t = 0; t < m; t++)
            memcpy(d + t * KN_GRAM_NR, x + t * n + c0, KN_GRAM_NR * sizeof(float));
        return;
    }
    if (w == KN_GRAM_MR && pw == KN_GRAM_MR) {
        for (size_t t = 0; t < m; t++)
            memcpy(d + t * KN_GRAM_MR, x + t * n + c0, KN_GRAM_MR * sizeof(float));
        return;
    }
    for (size_t t = 0; t < m; t++) {
        memcpy(d + t * pw, x + t * n + c0, w * sizeof(float));
        for (size_t c = w; c < pw; c++)
            d[t * pw + c] = 0.0f;
    }
}

float kn_bf16_round(float x)
{
    uint32_t u = kn_bf16_bits(x) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* As pack_panel, for the native bfloat16 tile, from the chunk's pairs
 * xp [mt / 2][n] (convert below): columns [c0, c0 + pw), zero past n. */
static void pack_pairs(const uint32_t *xp, size_t n, size_t np, size_t c0,
                       size_t pw, uint32_t *d)
{
    size_t w = n - c0 < pw ? n - c0 : pw;
    for (size_t p = 0; p < np; p++) {
        memcpy(d + p * pw, xp + p * n + c0, w * sizeof(uint32_t));
        for (size_t c = w; c < pw; c++)
            d[p * pw + c] = 0;
    }
}

/* As pack_panel, for the float tiles' bfloat16 sums: the rounded inputs,
 * each pair's tokens swapped (row 2p holds token 2p + 1, zero past m), so
 * that a float chain adds them in vdpbf16ps's order. */
static void pack_swapped(const float *x, size_t n, size_t m, size_t c0,
                         size_t pw, float *d)
{
    size_t w = n - c0 < pw ? n - c0 : pw;
    for (size_t t = 0; t < m + (m & 1); t++) {
        size_t src = t ^ 1u;
        float *dt = d + t * pw;
        size_t c = 0;
        if (src < m)
            for (const float *r = x + src * n + c0; c < w; c++)
                dt[c] = kn_bf16_round(r[c]);
        for (; c < pw; c++)
            dt[c] = 0.0f;
    }
}

/* x: rows of n (A: j->na, B: j->n). */
static void pack_one(const gram_job *j, const float *x, const uint32_t *xp,
                     size_t n, size_t c0, size_t pw, float *d)
{
    if (!j->bf16)
        pack_panel(x, n, j->m, c0, pw, d);
    else if (j->path == GRAM_BF16)
        pack_pairs(xp, n, j->mt / 2, c0, pw, (uint32_t *)(void *)d);
    else if (j->path != GRAM_SCALAR)
        kn_avx2_gram_pack_swapped(x, n, j->m, c0, pw, d);
    else
        pack_swapped(x, n, j->m, c0, pw, d);
}

/* The native path's first step: thread tid's share of the chunk's token
 * pairs converted once into xpa (and xpb for a cross sum), [mt / 2][n],
 * so that the panels below are copies (a tri sum's A and B panels would
 * otherwise convert every input twice, the 6-wide A panels one lane in
 * three of a vector). */
static void convert(void *ctx, int tid, int nth)
{
    const gram_job *j = ctx;
    size_t np = j->mt / 2, n = j->n, na = j->na;
    for (size_t p = np * tid / nth; p < np * (tid + 1) / nth; p++) {
        int whole = 2 * p + 1 < j->m;
        kn_avx512_bf16_pairs(j->a + 2 * p * na, whole ? j->a + (2 * p + 1) * na : NULL,
                             na, j->xpa + p * na);
        if (!j->tri)
            kn_avx512_bf16_pairs(j->b + 2 * p * n,
                                 whole ? j->b + (2 * p + 1) * n : NULL, n,
                                 j->xpb + p * n);
    }
}

/* Thread tid's share of the A panels ([ib][t][MR]) and B panels
 * ([jb][t][NR]). */
static void pack(void *ctx, int tid, int nth)
{
    const gram_job *j = ctx;
    for (size_t ib = j->nbi * tid / nth; ib < j->nbi * (tid + 1) / nth; ib++)
        pack_one(j, j->a, j->xpa, j->na, ib * KN_GRAM_MR, KN_GRAM_MR,
                 j->ap + ib * KN_GRAM_MR * j->pe);
    for (size_t jb = j->nbj * tid / nth; jb < j->nbj * (tid + 1) / nth; jb++)
        pack_one(j, j->b, j->xpb, j->n, jb * KN_GRAM_NR, KN_GRAM_NR,
                 j->bp + jb * KN_GRAM_NR * j->pe);
}

/* Row i of the caller's sums indexed by column (tri: the packed upper
 * triangle's row, whose columns start at i), and the first column at or
 * after j0 that it holds. */
static inline double *sums_row(const gram_job *j, size_t i, size_t j0,
                               size_t *js)
{
    *js = j0;
    if (!j->tri)
        return j->out + i * j->n;
    if (*js < i)
        *js = i;
    return j->out + tri_row(j->n, i) - i;
}

/* Adds the tile's rows [i0, i0 + mr) x columns [j0, j1) (row stride ldt
 * doubles) to the caller's sums; tri: only the upper triangle. */
static void add_tile(const gram_job *j, const double *tile, size_t ldt,
                     size_t i0, size_t mr, size_t j0, size_t j1)
{
    for (size_t r = 0; r < mr && i0 + r < j->na; r++) {
        size_t js;
        double *row = sums_row(j, i0 + r, j0, &js);
        const double *tr = tile + r * ldt - j0;
        for (size_t c = js; c < j1; c++)
            row[c] += tr[c];
    }
}

/* Prefetch the lines of the caller's sums that add_tile will add the
 * tile of rows [i0, i0 + mr) x columns [j0, j1) to.  A chunk's tiles
 * touch every line of h or c once, rows apart, and the calibration's
 * forward passes between its calls evict them: add_tile waited on each
 * line in turn (perf: its adds were 15 % of the statistics' CPU at the
 * SmolLM2 shape).  Issued before the tile, the loads overlap its
 * products (that share 2.0 % -> 1.5 % of the compile's CPU).  Inlined: GCC takes a function
 * that only prefetches for one without effects and drops its calls. */
static inline __attribute__((always_inline)) void prefetch_tile(
    const gram_job *j, size_t i0, size_t mr, size_t j0, size_t j1)
{
    for (size_t r = 0; r < mr && i0 + r < j->na; r++) {
        size_t js;
        const double *row = sums_row(j, i0 + r, j0, &js);
        for (size_t c = js; c < j1; c += 8)
            __builtin_prefetch(row + c, 0, 3);
        if (js < j1)
            __builtin_prefetch(row + j1 - 1, 0, 3);
    }
}

/* Thread tid's column panels, GRAM_GROUP at a time: for each row panel the
 * group's tiles, so that the group's B panels stay in L2, each A panel in
 * L1 across the group, and the sums are added along rows of h (GRAM_GROUP
 * * NR contiguous doubles per row) instead of down its columns.  The
 * AVX-512 tile covers two row panels and two column panels at a time. */
static void compute(void *ctx, int tid, int nth)
{
    const gram_job *j = ctx;
    size_t n = j->n;
    int wide = j->path == GRAM_AVX512 || j->path == GRAM_BF16;
    size_t step = wide ? 2 : 1;
    size_t ldt = wide ? KN_GRAM_TILE512_NC : KN_GRAM_NR;
#if defined(__x86_64__) || defined(__i386__)
    /* The float tiles' bfloat16 sums: vdpbf16ps flushes subnormal operands
     * and results (DAZ, FTZ); this thread's MXCSR does the same for them
     * (restored below: pool threads run other work). */
    unsigned csr = _mm_getcsr();
    if (j->bf16 && j->path != GRAM_BF16)
        _mm_setcsr(csr | 0x8040u);
#endif
    double tile[KN_GRAM_TILE512];
    size_t jend = panel_split(j, tid + 1, nth);
    for (size_t jg = panel_split(j, tid, nth); jg < jend; jg += GRAM_GROUP) {
        size_t jgend = jg + GRAM_GROUP < jend ? jg + GRAM_GROUP : jend;
        size_t jmax = jgend * KN_GRAM_NR < n ? jgend * KN_GRAM_NR : n;
        /* tri: only row panels that reach the upper triangle (i0 < j1) */
        size_t nbi = j->tri ? ceil_div(jmax, KN_GRAM_MR) : j->nbi;
        for (size_t ib = 0; ib < nbi; ib += step) {
            size_t i0 = ib * KN_GRAM_MR;
            const float *ap = j->ap + ib * KN_GRAM_MR * j->pe;
            for (size_t jb = jg; jb < jgend; jb += step) {
                size_t nb = jgend - jb < step ? jgend - jb : step;
                size_t j0 = jb * KN_GRAM_NR;
                size_t j1 = j0 + nb * KN_GRAM_NR < n ? j0 + nb * KN_GRAM_NR : n;
                if (j->tri && i0 >= j1)
                    continue;
                size_t na = nbi - ib < step ? nbi - ib : step;
                if (j->tri && na == 2 && i0 + KN_GRAM_MR >= j1)
                    na = 1; /* the second row panel is all below */
                const float *bp = j->bp + jb * KN_GRAM_NR * j->pe;
                prefetch_tile(j, i0, na * KN_GRAM_MR, j0, j1);
                if (j->path == GRAM_BF16)
                    kn_avx512bf16_gram_tile((const uint32_t *)(const void *)ap,
                                            (int)na,
                                            (const uint32_t *)(const void *)bp,
                                            (int)nb, j->mt / 2, j->pe, tile);
                else if (j->path == GRAM_AVX512)
                    kn_avx512_gram_tile(ap, (int)na, bp, (int)nb, j->mt, j->pe,
                                        tile);
                else if (j->path == GRAM_AVX2)
                    kn_avx2_gram_tile(ap, bp, j->mt, tile);
                else
                    tile_scalar(ap, bp, j->mt, tile);
                add_tile(j, tile, ldt, i0, na * KN_GRAM_MR, j0, j1);
            }
        }
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(csr);
#endif
}

static void gram(kn_pool *p, double *out, const float *a, uint32_t na,
                 const float *b, size_t T, uint32_t n, int tri, int bf16,
                 float *scratch)
{
    gram_job j;
    memset(&j, 0, sizeof j);
    j.out = out;
    j.na = na;
    j.n = n;
    j.tri = tri;
    j.bf16 = bf16;
    j.path = kn_force_scalar() || !kn_cpu_has_avx2() ? GRAM_SCALAR
             : bf16 && kn_cpu_has_avx512bf16()       ? GRAM_BF16
             : kn_cpu_has_avx512()                   ? GRAM_AVX512
                                                     : GRAM_AVX2;
    j.nbi = ceil_div(na, KN_GRAM_MR);
    j.nbj = ceil_div(n, KN_GRAM_NR);
    j.ap = scratch;
    size_t kc = bf16 ? KN_GRAM_KC_BF16 : KN_GRAM_KC;
    j.pe = j.path == GRAM_BF16 ? kc / 2 : kc;
    j.bp = scratch + j.nbi * KN_GRAM_MR * j.pe;
    if (j.path == GRAM_BF16) {
        /* the panels take (nbi MR + nbj NR) kc / 2 of the scratch's
         * (nbi MR + nbj NR) kc floats; the pairs need (na + n) kc / 2 */
        j.xpa = (uint32_t *)(void *)(j.bp + j.nbj * KN_GRAM_NR * j.pe);
        j.xpb = tri ? j.xpa : j.xpa + (size_t)na * (kc / 2);
    }
    for (size_t t0 = 0; t0 < T; t0 += kc) {
        j.m = T - t0 < kc ? T - t0 : kc;
        j.mt = bf16 ? j.m + (j.m & 1) : j.m;
        j.a = a + t0 * na;
        j.b = b + t0 * n;
        int par = p && kn_pool_threads(p) > 1 &&
                  (size_t)na * n * j.m / (tri ? 2 : 1) >= GRAM_PAR_MIN;
        if (par) {
            if (j.path == GRAM_BF16)
                kn_pool_run(p, convert, &j);
            kn_pool_run(p, pack, &j);
            kn_pool_run(p, compute, &j);
        } else {
            if (j.path == GRAM_BF16)
                convert(&j, 0, 1);
            pack(&j, 0, 1);
            compute(&j, 0, 1);
        }
    }
}

void kn_gram_tri(kn_pool *p, double *h, const float *x, size_t T, uint32_t n,
                 float *scratch)
{
    gram(p, h, x, n, x, T, n, 1, 0, scratch);
}

void kn_gram_cross(kn_pool *p, double *c, const float *a, const float *b,
                   size_t T, uint32_t n, float *scratch)
{
    gram(p, c, a, n, b, T, n, 0, 0, scratch);
}

void kn_gram_tri_bf16(kn_pool *p, double *h, const float *x, size_t T,
                      uint32_t n, float *scratch)
{
    gram(p, h, x, n, x, T, n, 1, 1, scratch);
}

void kn_gram_cross_bf16(kn_pool *p, double *c, const float *a, const float *b,
                        size_t T, uint32_t n, float *scratch)
{
    gram(p, c, a, n, b, T, n, 0, 1, scratch);
}

void kn_gram_cross_rect(kn_pool *p, double *c, const float *a, uint32_t na,
                        const float *b, uint32_t nb, size_t T, int bf16,
                        float *scratch)
{
    gram(p, c, a, na, b, T, nb, 0, bf16, scratch);
}

void kn_ref_gram_tri(double *h, const float *x, size_t T, uint32_t n)
{
    for (size_t i = 0; i < n; i++) {
        double *row = h + tri_row(n, i) - i;
        for (size_t jj = i; jj < n; jj++) {
            double s = 0.0;
            for (size_t t = 0; t < T; t++)
                s += (double)x[t * n + i] * (double)x[t * n + jj];
            row[jj] += s;
        }
    }
}

void kn_ref_gram_cross(double *c, const float *a, const float *b, size_t T,
                       uint32_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t jj = 0; jj < n; jj++) {
            double s = 0.0;
            for (size_t t = 0; t < T; t++)
                s += (double)a[t * n + i] * (double)b[t * n + jj];
            c[i * n + jj] += s;
        }
}

/* kn_lora_avx2.c - the LoRA delta product with AVX2 (contract in
 * kn_lora.h; compiled with -mavx2 -mfma -mf16c, called only when the CPU
 * has them).
 *
 * A 4-row x 8-column register tile: per k, two loads of R's row k and four
 * broadcasts of L feed eight independent multiply-add chains, so the
 * multiplier and adder ports stay busy instead of waiting on loads and
 * stores of the output.  Multiply and add stay separate instructions (no
 * FMA: the sum must equal the scalar reference bit for bit), hence the
 * fp-contract pragma: GCC would otherwise be free to fuse them in GNU
 * mode. */
#pragma GCC optimize("fp-contract=off")
#include <immintrin.h>

#include "kn_lora.h"

#define RB 4   /* rows per tile */
#define JB 256 /* columns per block of R kept in cache */

/* The tile's sums into o: stored, or (add) o + coef * sum. */
static inline void put(double *o, __m256d c, __m256d coef, int add)
{
    if (add)
        c = _mm256_add_pd(_mm256_loadu_pd(o), _mm256_mul_pd(coef, c));
    _mm256_storeu_pd(o, c);
}

/* Rows i0 .. i0+RB-1 (all present), columns [j, j + 8). */
static inline void tile4x8(const double *L, const double *R, uint32_t r,
                           size_t cols, size_t j, double *o0, double *o1,
                           double *o2, double *o3, __m256d coef, int add)
{
    __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
    __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
    __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
    __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
    for (uint32_t k = 0; k < r; k++) {
        const double *a = R + (size_t)k * cols + j;
        __m256d a0 = _mm256_loadu_pd(a), a1 = _mm256_loadu_pd(a + 4);
        __m256d b;
        b = _mm256_broadcast_sd(L + 0 * (size_t)r + k);
        c00 = _mm256_add_pd(c00, _mm256_mul_pd(b, a0));
        c01 = _mm256_add_pd(c01, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 1 * (size_t)r + k);
        c10 = _mm256_add_pd(c10, _mm256_mul_pd(b, a0));
        c11 = _mm256_add_pd(c11, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 2 * (size_t)r + k);
        c20 = _mm256_add_pd(c20, _mm256_mul_pd(b, a0));
        c21 = _mm256_add_pd(c21, _mm256_mul_pd(b, a1));
        b = _mm256_broadcast_sd(L + 3 * (size_t)r + k);
        c30 = _mm256_add_pd(c30, _mm256_mul_pd(b, a0));
        c31 = _mm256_add_pd(c31, _mm256_mul_pd(b, a1));
    }
    put(o0 + j, c00, coef, add);
    put(o0 + j + 4, c01, coef, add);
    put(o1 + j, c10, coef, add);
    put(o1 + j + 4, c11, coef, add);
    put(o2 + j, c20, coef, add);
    put(o2 + j + 4, c21, coef, add);
    put(o3 + j, c30, coef, add);
    put(o3 + j + 4, c31, coef, add);
}

/* One row, columns [j0, cols): 4-wide, then scalar, same order. */
static void row_tail(const double *Li, const double *R, uint32_t r,
                     size_t cols, size_t j0, double *o, double coef, int add)
{
    size_t j = j0;
    __m256d cv = _mm256_set1_pd(coef);
    for (; j + 4 <= cols; j += 4) {
        __m256d c = _mm256_setzero_pd();
        for (uint32_t k = 0; k < r; k++)
            c = _mm256_add_pd(c, _mm256_mul_pd(_mm256_broadcast_sd(Li + k),
                                               _mm256_loadu_pd(R + (size_t)k * cols + j)));
        put(o + j, c, cv, add);
    }
    for (; j < cols; j++) {
        double c = 0;
        for (uint32_t k = 0; k < r; k++) {
            double p = Li[k] * R[(size_t)k * cols + j];
            c += p;
        }
        if (add) {
            double t = coef * c;
            o[j] += t;
        } else {
            o[j] = c;
        }
    }
}

void kn_avx2_lora_rows(const double *L, const double *R, uint32_t r,
                       size_t cols, size_t nr, double coef, int add,
                       double *out, size_t ldo)
{
    size_t i = 0;
    size_t cols8 = cols & ~(size_t)7;
    __m256d cv = _mm256_set1_pd(coef);
    /* Column blocks outermost: a JB-column slice of R (r x JB doubles,
     * 32 KiB at rank 16) is reused by every row block from cache instead
     * of streaming all of R again per 4 rows (1.8 MB at width 14336). */
    size_t nr4 = nr - nr % RB;
    for (size_t jb = 0; jb < cols8; jb += JB) {
        size_t je = jb + JB < cols8 ? jb + JB : cols8;
        for (size_t ib = 0; ib < nr4; ib += RB) {
            const double *Li = L + ib * r;
            double *o0 = out + ib * ldo, *o1 = o0 + ldo, *o2 = o1 + ldo,
                   *o3 = o2 + ldo;
            for (size_t j = jb; j < je; j += 8)
                tile4x8(Li, R, r, cols, j, o0, o1, o2, o3, cv, add);
        }
    }
    for (; i + RB <= nr; i += RB) {
        const double *Li = L + i * r;
        for (int q = 0; q < RB && cols8 < cols; q++)
            row_tail(Li + (size_t)q * r, R, r, cols, cols8,
                     out + (i + q) * ldo, coef, add);
    }
    for (; i < nr; i++)
        row_tail(L + i * r, R, r, cols, 0, out + i * ldo, coef, add);
}

/* Four doubles at a time; a group with a value out of float range, or
 * (bf16) a non-zero value below bf16's normal range, goes to the scalar
 * reference, which handles both exactly. */
size_t kn_avx2_lora_finish(const double *d, const float *base, size_t n,
                           int type, void *out, double *maxd)
{
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffll));
    const __m256d fmax = _mm256_set1_pd(3.4028234663852886e38);
    const __m256d tiny = _mm256_set1_pd(0x1p-126);
    const __m256i half = _mm256_set1_epi64x(((int64_t)1 << 44) - 1);
    const __m256i one = _mm256_set1_epi64x(1);
    const __m256i keep = _mm256_set1_epi64x(~(((int64_t)1 << 45) - 1));
    __m256d mx = _mm256_set1_pd(*maxd);
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        __m256d x = _mm256_loadu_pd(d + j);
        __m256d ax = _mm256_and_pd(x, absmask);
        __m256d bad = _mm256_cmp_pd(ax, fmax, _CMP_NLE_UQ);
        if (type == KN_LORA_BF16)
            bad = _mm256_or_pd(bad, _mm256_and_pd(
                _mm256_cmp_pd(ax, tiny, _CMP_LT_OQ),
                _mm256_cmp_pd(ax, _mm256_setzero_pd(), _CMP_NEQ_OQ)));
        if (_mm256_movemask_pd(bad)) {
            double m;
            double lanes[4];
            _mm256_storeu_pd(lanes, mx);
            m = lanes[0];
            for (int q = 1; q < 4; q++)
                m = lanes[q] > m ? lanes[q] : m;
            size_t es = type == KN_LORA_F32 ? 4 : 2;
            size_t k = kn_ref_lora_finish(d + j, base + j, 4, type,
                                          (unsigned char *)out + j * es, &m);
            mx = _mm256_set1_pd(m);
            if (k < 4) {
                *maxd = m;
                return j + k;
            }
            continue;
        }
        __m128 f = _mm256_cvtpd_ps(x);
        __m256d dd = _mm256_and_pd(_mm256_sub_pd(_mm256_cvtps_pd(f),
                                                 _mm256_cvtps_pd(_mm_loadu_ps(base + j))),
                                   absmask);
        mx = _mm256_max_pd(mx, dd);
        if (type == KN_LORA_F32) {
            _mm_storeu_ps((float *)out + j, f);
            continue;
        }
        /* bf16: round the double's mantissa to 7 bits on its bits (to
         * nearest even; a carry into the exponent is right too), then the
         * float conversion is exact and bf16 is its top half */
        __m256i u = _mm256_castpd_si256(x);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi64(u, 45), one);
        u = _mm256_and_si256(_mm256_add_epi64(u, _mm256_add_epi64(half, lsb)),
                             keep);
        __m128i b = _mm_srli_epi32(_mm_castps_si128(
                                       _mm256_cvtpd_ps(_mm256_castsi256_pd(u))),
                                   16);
        b = _mm_packus_epi32(b, b);
        _mm_storel_epi64((__m128i *)((uint16_t *)out + j), b);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, mx);
    double m = lanes[0];
    for (int q = 1; q < 4; q++)
        m = lanes[q] > m ? lanes[q] : m;
    size_t es = type == KN_LORA_F32 ? 4 : 2;
    size_t k = kn_ref_lora_finish(d + j, base + j, n - j, type,
                                  (unsigned char *)out + j * es, &m);
    *maxd = m;
    return j + k;
}

/* bench_calib_search.c - the calibration's search phase at 7B widths
 * (issue 17): each search-phase function on one linear of K columns and R
 * rows, a synthetic Hessian (a random symmetric matrix with a dominant
 * diagonal: the cost does not depend on the values) and random weights
 * quantized by RTN, int4 g32 (--group G: int4 gG; 0: int8).  Times, in CPU seconds of the process:
 *   oerr     the output error tr(D H D^T) (cmp_hessian_output_error_par),
 *            and "oerr8", the eight-row passes it replaced (the reference
 *            cmp_hessian_output_error_terms over the pool's rows);
 *   cross    the cross term sum a^T C b against a full K x K matrix
 *            (cmp_qform_cross_par), and "cross8", the eight-row passes it
 *            replaced (cmp_lanes_dot_f over each row of C);
 *   refit    cmp_gptq_refit_scales, then a second refit of the same
 *            weights with H w kept from the first (cmp_refit_hw);
 *   descend  cmp_descend_codes (16 sweeps at most);
 *   awq      cmp_awq_search over the one linear, the coarse grid.
 * Checks that oerr == oerr8 and cross == cross8 bit for bit (exit 1 if
 * not).  Every cost is linear in R: the line "per 4096 rows" scales each
 * figure to a real 7B linear (Mistral-7B: q 4096 rows, down 4096 rows of
 * 14336 columns).
 * usage: bench_calib_search [--cols K] [--rows R] [--group G] [--threads N]
 *                           [--only oerr,cross,refit,descend,awq]
 * (defaults: K 4096, R 256, G 32, every CPU, all) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "cmp_awq.h"
#include "cmp_calib_internal.h"
#include "cmp_descend.h"
#include "cmp_gptq.h"
#include "cmp_lanes.h"
#include "cmp_par.h"
#include "cmp_qform.h"
#include "kn_ops.h"

typedef struct old_job {
    const cmp_hessian *h;
    const double *C;
    const float *a, *b;
    uint32_t n;
    double *d;     /* [threads][8 * n] */
    double *terms; /* [rows] */
} old_job;

/* The eight-row output error passes (e8dd680's cmp_hessian_output_error_par). */
static void old_oerr_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    const old_job *j = ctx;
    size_t at = (size_t)r0 * j->n;
    cmp_hessian_output_error_terms(j->h, j->a + at, j->b + at, r1 - r0,
                                   j->d + (size_t)slot * CMP_OERR_ROWS * j->n,
                                   j->terms + r0);
}

/* The eight-row cross term passes (e8dd680's cross_rows): one pass over C
 * per eight rows (a short tail one row at a time), each element a chain
 * over j ascending. */
static void old_cross_block(const old_job *j, uint32_t r, uint32_t nl, size_t sr)
{
    size_t n = j->n;
    double s[CMP_LANES] = {0};
    for (size_t i = 0; i < n; i++) {
        double t[CMP_LANES] = {0};
        cmp_lanes_dot_f(t, 1.0, j->C + i * n, j->b + (size_t)r * n, 1, sr, 0, n);
        for (uint32_t l = 0; l < nl; l++) {
            float ai = j->a[(size_t)(r + l) * n + i];
            if (ai != 0.0f)
                s[l] += ai * t[l];
        }
    }
    for (uint32_t l = 0; l < nl; l++)
        j->terms[r + l] = s[l];
}

static void old_cross_rows(void *ctx, uint32_t r0, uint32_t r1, int slot)
{
    (void)slot;
    const old_job *j = ctx;
    uint32_t r = r0;
    for (; r + CMP_LANES <= r1; r += CMP_LANES)
        old_cross_block(j, r, CMP_LANES, j->n);
    for (; r < r1; r++)
        old_cross_block(j, r, 1, 0);
}

static double old_total(kn_pool *p, old_job *j, uint32_t rows, cmp_par_fn fn)
{
    int T = cmp_par_threads(p);
    j->d = malloc((size_t)T * CMP_OERR_ROWS * j->n * sizeof(double));
    j->terms = malloc((size_t)rows * sizeof(double));
    if (!j->d || !j->terms)
        exit(1);
    cmp_par_rows(p, rows, CMP_LANES, fn, j);
    double total = 0.0;
    for (uint32_t r = 0; r < rows; r++)
        total += j->terms[r];
    free(j->d);
    free(j->terms);
    return total;
}

static int wanted(const char *only, const char *name)
{
    if (!only)
        return 1;
    size_t n = strlen(name);
    for (const char *s = only; (s = strstr(s, name)) != NULL; s += n)
        if ((s == only || s[-1] == ',') && (s[n] == ',' || s[n] == '\0'))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t K = 4096, R = 256, G = 32;
    int threads = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: bench_calib_search [--cols K] [--rows R] [--group G] [--threads N] "
                   "[--only oerr,cross,refit,descend,awq]\n");
            return 0;
        }
        if (i + 1 >= argc)
            goto usage;
        if (!strcmp(argv[i], "--cols"))
            K = (uint32_t)bench_arg_u64("--cols", argv[++i], 64, 65536);
        else if (!strcmp(argv[i], "--rows"))
            R = (uint32_t)bench_arg_u64("--rows", argv[++i], 8, 1u << 20);
        else if (!strcmp(argv[i], "--group"))
            G = (uint32_t)bench_arg_u64("--group", argv[++i], 0, 65536);
        else if (!strcmp(argv[i], "--threads"))
            threads = (int)bench_arg_u64("--threads", argv[++i], 1, 256);
        else if (!strcmp(argv[i], "--only"))
            only = argv[++i];
        else
            goto usage;
    }
    kn_wformat fmt = G ? KN_W_Q4 : KN_W_Q8;
    kn_pool *pool = kn_pool_create(threads);
    int nth = pool ? kn_pool_threads(pool) : 1;
    uint64_t rs = 29;
    cmp_hessian h;
    float *w = malloc((size_t)R * K * sizeof(float));
    float *deq = malloc((size_t)R * K * sizeof(float));
    float *xa = malloc((size_t)K * sizeof(float));
    cmp_qbuf q;
    if (!w || !deq || !xa || cmp_hessian_init(&h, K, NULL) != MC_OK ||
        cmp_calib_qbuf_alloc(&q, fmt, R, K, G) != MC_OK)
        return 1;
    for (uint32_t i = 0; i < K; i++) {
        double *row = h.h + cmp_hessian_row_offset(K, i);
        row[0] = 4.0 + bench_rnd(&rs, 0.0f, 1.0f);
        for (uint32_t j = i + 1; j < K; j++)
            row[j - i] = bench_rnd(&rs, 0.0f, 1.0f) / (double)K;
        xa[i] = 0.5f + fabsf(bench_rnd(&rs, 0.0f, 1.0f));
    }
    h.n = 1;
    for (size_t i = 0; i < (size_t)R * K; i++)
        w[i] = bench_rnd(&rs, 0.0f, 0.05f);
    if (cmp_quant_matrix(w, NULL, &q, NULL) != MC_OK)
        return 1;
    cmp_dequant_matrix(&q, deq);
    if (G)
        printf("bench_calib_search: K %u, R %u, int4 g%u, %d threads\n", K, R, G, nth);
    else
        printf("bench_calib_search: K %u, R %u, int8, %d threads\n", K, R, nth);
    int rc = 0;
    double scale = 4096.0 / R;
    { /* untimed: the pool's threads started and H read once */
        old_job j = {&h, NULL, w, deq, K, NULL, NULL};
        (void)old_total(pool, &j, 8, old_oerr_rows);
    }
    if (wanted(only, "oerr")) {
        old_job j = {&h, NULL, w, deq, K, NULL, NULL};
        double c0 = bench_cpu_now();
        double e_old = old_total(pool, &j, R, old_oerr_rows);
        double c1 = bench_cpu_now();
        double e_new = cmp_hessian_output_error_par(pool, &h, w, deq, R);
        double c2 = bench_cpu_now();
        rc |= e_old != e_new;
        printf("  oerr8 %8.3f s cpu  oerr %8.3f s cpu  x %.2f  same bits: %s | per 4096 rows "
               "%.1f s -> %.1f s\n", c1 - c0, c2 - c1, (c1 - c0) / (c2 - c1),
               e_old == e_new ? "yes" : "NO", (c1 - c0) * scale, (c2 - c1) * scale);
    }
    if (wanted(only, "cross")) {
        double *C = malloc((size_t)K * K * sizeof(double));
        if (!C)
            return 1;
        for (uint32_t i = 0; i < K; i++)
            for (uint32_t k = 0; k < K; k++)
                C[(size_t)i * K + k] = cmp_hessian_get(&h, i, k) *
                                       (1.0 + 0.01 * ((i + k) % 7));
        old_job j = {&h, C, w, deq, K, NULL, NULL};
        double c0 = bench_cpu_now();
        double e_old = old_total(pool, &j, R, old_cross_rows);
        double c1 = bench_cpu_now();
        double e_new = cmp_qform_cross_par(pool, C, K, w, deq, R);
        double c2 = bench_cpu_now();
        rc |= e_old != e_new;
        printf("  cross8 %7.3f s cpu  cross %7.3f s cpu  x %.2f  same bits: %s | per 4096 rows "
               "%.1f s -> %.1f s\n", c1 - c0, c2 - c1, (c1 - c0) / (c2 - c1),
               e_old == e_new ? "yes" : "NO", (c1 - c0) * scale, (c2 - c1) * scale);
        free(C);
    }
    if (wanted(only, "refit")) {
        cmp_refit_hw hc = {malloc(cmp_gptq_refit_hw_bytes(R, K)), 0};
        if (!hc.hw)
            return 1;
        double c0 = bench_cpu_now();
        mc_status st = cmp_gptq_refit_scales_cached(w, &h, &q, deq, &hc, pool, NULL);
        double c1 = bench_cpu_now();
        if (st == MC_OK)
            st = cmp_gptq_refit_scales_cached(w, &h, &q, deq, &hc, pool, NULL);
        double c2 = bench_cpu_now();
        rc |= st != MC_OK;
        printf("  refit   %7.3f s cpu, again with H w kept %7.3f s cpu | per 4096 rows "
               "%.1f s, %.1f s\n", c1 - c0, c2 - c1, (c1 - c0) * scale, (c2 - c1) * scale);
        free(hc.hw);
    }
    if (wanted(only, "descend")) {
        uint64_t moves = 0;
        double c0 = bench_cpu_now();
        mc_status st = cmp_descend_codes(w, &h, &q, deq, 0, &moves, pool, NULL);
        double c1 = bench_cpu_now();
        rc |= st != MC_OK;
        printf("  descend %7.3f s cpu (%llu moves) | per 4096 rows %.1f s\n", c1 - c0,
               (unsigned long long)moves, (c1 - c0) * scale);
    }
    if (wanted(only, "awq")) {
        cmp_awq_linear l = {w, R};
        cmp_awq_search_opts so = {pool, 1, 0};
        float *s = malloc((size_t)K * sizeof(float));
        double alpha = 0.0, e = 0.0;
        double c0 = bench_cpu_now();
        mc_status st = s ? cmp_awq_search(&h, xa, &l, 1, fmt, G, &so, s, &alpha,
                                          &e, NULL, NULL)
                         : MC_ERR_NOMEM;
        double c1 = bench_cpu_now();
        rc |= st != MC_OK;
        printf("  awq     %7.3f s cpu (alpha %.2f) | per 4096 rows %.1f s\n", c1 - c0,
               alpha, (c1 - c0) * scale);
        free(s);
    }
    double load[3] = {-1, -1, -1};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    printf("  load %.2f %.2f %.2f\n", load[0], load[1], load[2]);
    cmp_calib_qbuf_release(&q);
    cmp_hessian_free(&h);
    free(w);
    free(deq);
    free(xa);
    kn_pool_free(pool);
    return rc;
usage:
    fprintf(stderr, "usage: bench_calib_search [--cols K] [--rows R] [--group G] [--threads N] "
                    "[--only oerr,cross,refit,descend,awq]\n");
    return 2;
}

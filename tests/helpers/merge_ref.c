/* merge_ref.c - an independent double-precision merge, written from the
 * adapter files and PEFT's formulas (contract in merge_ref.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_dtype.h"
#include "fmt_safetensors.h"
#include "merge_ref.h"
#include "testutil.h"

/* ---- the independent reference ---------------------------------------- */

typedef struct ref_adapter {
    fmt_st_file *st;
    json_t *cfg;
    double weight;
} ref_adapter;

static double *to_double(const fmt_st_tensor *t)
{
    float *f = malloc((size_t)t->nelem * sizeof *f + 4);
    double *d = malloc((size_t)t->nelem * sizeof *d + 8);
    assert_true(f && d);
    assert_int_equal(fmt_to_f32(t->dtype, t->data, f, (size_t)t->nelem), 0);
    for (uint64_t i = 0; i < t->nelem; i++)
        d[i] = f[i];
    free(f);
    return d;
}

static const fmt_st_tensor *akey(const ref_adapter *a, const char *module,
                                 const char *part)
{
    char key[600];
    snprintf(key, sizeof key, "base_model.model.%s%s", module, part);
    return fmt_st_find(a->st, key);
}

static int ends_with_component(const char *s, const char *suffix)
{
    size_t ls = strlen(s), lx = strlen(suffix);
    return strcmp(s, suffix) == 0 ||
           (ls > lx && s[ls - lx - 1] == '.' && strcmp(s + ls - lx, suffix) == 0);
}

/* weight * alpha / r (or / sqrt(r)); r is the rank of A as stored. */
static double coef(const ref_adapter *a, const char *module, double r)
{
    double alpha = json_number_value(json_object_get(a->cfg, "lora_alpha"));
    json_t *ap = json_object_get(a->cfg, "alpha_pattern");
    const char *k;
    json_t *v;
    json_object_foreach(ap, k, v) {
        if (ends_with_component(module, k)) {
            alpha = json_number_value(v);
            break;
        }
    }
    int rs = json_is_true(json_object_get(a->cfg, "use_rslora"));
    return a->weight * alpha / (rs ? sqrt(r) : r);
}

/* Expected merged values (double) of tensor name into w (nelem). */
static void ref_tensor(const fmt_model *base, const ref_adapter *ads, size_t n,
                       const char *name, double **out, uint64_t *rows_out,
                       uint64_t *cols_out)
{
    const fmt_st_tensor *src = fmt_model_find(base, name, NULL);
    if (!src && strcmp(name, "lm_head.weight") == 0)
        src = fmt_model_find(base, "model.embed_tokens.weight", NULL);
    assert_non_null(src);
    double *w = to_double(src), *w0 = to_double(src);
    uint64_t rows = src->ndim == 2 ? src->shape[0] : 1;
    uint64_t cols = src->nelem / (rows ? rows : 1);
    char module[512];
    size_t ln = strlen(name);
    int is_bias = ln > 5 && strcmp(name + ln - 5, ".bias") == 0;
    snprintf(module, sizeof module, "%.*s", (int)(ln - (is_bias ? 5 : 7)), name);
    for (size_t k = 0; k < n; k++) {
        const ref_adapter *a = &ads[k];
        char key[600];
        snprintf(key, sizeof key, "base_model.model.%s", name);
        const fmt_st_tensor *rep = fmt_st_find(a->st, key);
        if (!rep)
            rep = akey(a, module, is_bias ? ".modules_to_save.default.bias"
                                          : ".modules_to_save.default.weight");
        if (!rep)
            rep = akey(a, module, is_bias ? ".base_layer.bias"
                                          : ".base_layer.weight");
        if (rep) {
            double *r = to_double(rep);
            memcpy(w, r, (size_t)src->nelem * sizeof *w);
            memcpy(w0, r, (size_t)src->nelem * sizeof *w0);
            free(r);
        }
        const fmt_st_tensor *A = akey(a, module, ".lora_A.weight");
        const fmt_st_tensor *B = akey(a, module, ".lora_B.weight");
        int emb = 0;
        if (!A) {
            A = akey(a, module, ".lora_embedding_A");
            B = akey(a, module, ".lora_embedding_B");
            emb = A != NULL;
        }
        if (is_bias) {
            const fmt_st_tensor *bb = akey(a, module, ".lora_B.bias");
            if (bb) {
                double *b = to_double(bb);
                double c = coef(a, module, (double)A->shape[0]);
                for (uint64_t j = 0; j < cols; j++)
                    w[j] += c * b[j];
                free(b);
            }
            continue;
        }
        if (!A)
            continue;
        uint64_t r = A->shape[0], in = A->shape[1], outf = B->shape[0];
        double *Ad = to_double(A), *Bd = to_double(B);
        double c = coef(a, module, (double)r);
        const fmt_st_tensor *mag = akey(a, module, ".lora_magnitude_vector");
        /* Full delta D = B @ A ([out, in]); stored transposed for
         * embeddings and for bases kept as [in, out] (fan_in_fan_out).
         * DoRA: c D kept apart in v (the norm is of W0 + c D). */
        int transposed = emb || !(rows == outf && cols == in);
        double *v = malloc((size_t)src->nelem * sizeof *v + 8);
        assert_non_null(v);
        for (uint64_t i = 0; i < rows; i++)
            for (uint64_t j = 0; j < cols; j++) {
                uint64_t o = transposed ? j : i, x = transposed ? i : j;
                double s = 0;
                for (uint64_t q = 0; q < r; q++)
                    s += Bd[o * r + q] * Ad[q * in + x];
                if (mag)
                    v[i * cols + j] = c * s;
                else
                    w[i * cols + j] += c * s;
            }
        if (mag) {
            double *m = to_double(mag);
            for (uint64_t f = 0; f < outf; f++) {
                double ss = 0;
                for (uint64_t x = 0; x < in; x++) {
                    uint64_t e = transposed ? x * cols + f : f * cols + x;
                    double ve = w0[e] + v[e];
                    ss += ve * ve;
                }
                double fac = m[f] / sqrt(ss);
                for (uint64_t x = 0; x < in; x++) {
                    uint64_t e = transposed ? x * cols + f : f * cols + x;
                    w[e] = (w[e] + v[e]) * fac;
                }
            }
            free(m);
        }
        free(v);
        free(Ad);
        free(Bd);
    }
    free(w0);
    *out = w;
    *rows_out = rows;
    *cols_out = cols;
}

/* x rounded once (nearest, ties to even) to dt, as its bit pattern. */
static uint32_t round_once(double x, fmt_dtype dt)
{
    if (dt == FMT_DT_F32) {
        float f = (float)x;
        uint32_t b;
        memcpy(&b, &f, 4);
        return b;
    }
    float f = (float)x;
    uint16_t c = dt == FMT_DT_BF16 ? fmt_f32_to_bf16(f) : fmt_f32_to_f16(f);
    uint16_t best = c;
    double bestd = INFINITY;
    for (int dlt = -1; dlt <= 1; dlt++) {
        uint16_t h = (uint16_t)(c + dlt);
        double v = dt == FMT_DT_BF16 ? fmt_bf16_to_f32(h) : fmt_f16_to_f32(h);
        double d = fabs(v - x);
        if (isfinite(v) && (d < bestd || (d == bestd && !(h & 1)))) {
            best = h;
            bestd = d;
        }
    }
    return best;
}

static int64_t ordered(uint32_t b, fmt_dtype dt)
{
    uint32_t sign = dt == FMT_DT_F32 ? 0x80000000u : 0x8000u;
    return (b & sign) ? -(int64_t)(b & ~sign) : (int64_t)b;
}

static uint32_t bits_at(const fmt_st_tensor *t, uint64_t i)
{
    if (t->dtype == FMT_DT_F32) {
        uint32_t b;
        memcpy(&b, (const char *)t->data + 4 * i, 4);
        return b;
    }
    uint16_t h;
    memcpy(&h, (const char *)t->data + 2 * i, 2);
    return h;
}

/* ---- driving the library ---------------------------------------------- */

char *fx(const char *rel)
{
    return tu_fmt("%s/%s", MC_FIXTURE_DIR, rel);
}

/* Merge adapters (dirs, weights) into base_dir, write with dtype, re-open
 * the output and check every tensor against the reference. */
void merge_and_check(const char *base_dir, const char *const *dirs,
                            const double *weights, size_t n, fmt_dtype dtype,
                            run *r)
{
    memset(r, 0, sizeof *r);
    fmt_model *base = NULL, *outm = NULL;
    mc_error e;
    char buf[2048];
    if (fmt_model_open(base_dir, &base, &e))
        fail_msg("%s", mc_error_format(&e, buf, sizeof buf));
    cmp_adapter_spec specs[8];
    ref_adapter ads[8];
    for (size_t k = 0; k < n; k++) {
        specs[k].dir = dirs[k];
        specs[k].weight = weights ? weights[k] : 1.0;
        char *p = tu_fmt("%s/adapter_model.safetensors", dirs[k]);
        assert_int_equal(fmt_st_open(p, &ads[k].st, &e), MC_OK);
        free(p);
        p = tu_fmt("%s/adapter_config.json", dirs[k]);
        ads[k].cfg = json_load_file(p, 0, NULL);
        assert_non_null(ads[k].cfg);
        free(p);
        ads[k].weight = specs[k].weight;
    }
    cmp_merge *m = NULL;
    if (cmp_merge_open(base, specs, n, &m, &e))
        fail_msg("open: %s", mc_error_format(&e, buf, sizeof buf));
    r->tmp = tu_mkdtemp("merge");
    r->out = tu_fmt("%s/out", r->tmp);
    if (cmp_merge_write(m, r->out, dtype, &r->rep, &e))
        fail_msg("write: %s", mc_error_format(&e, buf, sizeof buf));
    if (fmt_model_open(r->out, &outm, &e))
        fail_msg("reopen: %s", mc_error_format(&e, buf, sizeof buf));
    assert_int_equal(fmt_model_tensor_count(outm), cmp_merge_tensor_count(m));
    for (size_t i = 0; i < fmt_model_tensor_count(outm); i++) {
        const fmt_st_tensor *t = fmt_model_tensor(outm, i, NULL);
        if (!fmt_dtype_is_float(t->dtype))
            continue;
        double *w;
        uint64_t rows, cols;
        ref_tensor(base, ads, n, t->name, &w, &rows, &cols);
        const fmt_st_tensor *bt = fmt_model_find(base, t->name, NULL);
        int changed = bt == NULL;
        fmt_dtype want = dtype == FMT_DT_INVALID && bt ? bt->dtype
                         : dtype == FMT_DT_INVALID     ? t->dtype
                                                       : dtype;
        assert_int_equal(t->dtype, want);
        /* The library's float32 tensor source agrees too. */
        float *f = malloc((size_t)t->nelem * sizeof *f + 4);
        assert_int_equal(cmp_merge_tensor_f32(m, t->name, f, &e), MC_OK);
        for (uint64_t j = 0; j < t->nelem; j++) {
            uint32_t exp = round_once(w[j], t->dtype);
            uint32_t got = bits_at(t, j);
            double d = fabs((double)(ordered(exp, t->dtype) -
                                     ordered(got, t->dtype)));
            if (d > r->max_ulp)
                r->max_ulp = d;
            if (d > 0) /* rounded once from the exact value: 0 ulp */
                fail_msg("%s[%llu]: expected %.9g, got bits 0x%x (%g ulp)",
                         t->name, (unsigned long long)j, w[j], got, d);
            uint32_t fe = round_once(w[j], FMT_DT_F32), fg;
            memcpy(&fg, &f[j], 4);
            if (fabs((double)(ordered(fe, FMT_DT_F32) -
                              ordered(fg, FMT_DT_F32))) > 0)
                fail_msg("%s[%llu]: tensor_f32 %.9g, expected %.9g", t->name,
                         (unsigned long long)j, (double)f[j], w[j]);
            if (bt && !changed) {
                float b0;
                fmt_to_f32(bt->dtype,
                           (const char *)bt->data + j * fmt_dtype_size(bt->dtype),
                           &b0, 1);
                changed = (double)b0 != w[j];
            }
        }
        r->touched += changed;
        free(f);
        free(w);
    }
    fmt_model_close(outm);
    cmp_merge_close(m);
    fmt_model_close(base);
    for (size_t k = 0; k < n; k++) {
        fmt_st_close(ads[k].st);
        json_decref(ads[k].cfg);
    }
}

void run_free(run *r)
{
    tu_rmtree(r->tmp);
    free(r->tmp);
    free(r->out);
}

/* One fixture adapter on one fixture model. */
void check_one(const char *model, const char *adapter, fmt_dtype dt,
                      size_t min_touched, run *r)
{
    char *b = fx(model), *a = tu_fmt("%s/adapters/%s", MC_FIXTURE_DIR, adapter);
    const char *dirs[1] = {a};
    merge_and_check(b, dirs, NULL, 1, dt, r);
    print_message("  %s + %s: %zu tensors changed, max %.0f ulp\n", model,
                  adapter, r->touched, r->max_ulp);
    assert_true(r->touched >= min_touched);
    assert_int_equal(r->rep.tensors_touched, r->touched);
    free(b);
    free(a);
}


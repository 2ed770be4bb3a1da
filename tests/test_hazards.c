/* test_hazards.c - numerically hostile inputs: NaN/Inf weights, values that
 * overflow the output precision, denormal-heavy rows, zero rows, all-zero
 * int4 groups, extreme adapter values, dead and huge calibration
 * activations.  Each must give either a clear error (MC_ERR_NONFINITE
 * naming the tensor, nothing written) or a stated safe behaviour, never a
 * model whose outputs hold NaN.
 *
 * Stated behaviours checked here (docs/reliability.md repeats them):
 *   - a zero row / all-zero int4 group quantizes to scale 0 and
 *     dequantizes to exactly 0 (its logit is exactly 0);
 *   - denormal float32 weights (|w| < 2^-126) are preserved by f32, flushed
 *     to zero by f16 (below f16's range) and by int4 (its f16 scale rounds
 *     to 0); int8 (f32 scale) keeps them to its precision; the logits stay
 *     finite and the row's logit is below 1e-30 in magnitude either way;
 *   - dead calibration inputs (a channel always 0) and very large ones
 *     (x 1e4) calibrate to finite weights with every method.
 * The hazard models are written by the test with fmt_st_writer from the
 * llama fixture (its config.json copied), into a temp dir.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmp_calib.h"
#include "cmp_compile.h"
#include "cmp_merge.h"
#include "fmt_dtype.h"
#include "fmt_model.h"
#include "fmt_safetensors.h"
#include "mc_alloc.h"
#include "rt_artifact.h"
#include "rt_model.h"
#include "rt_session.h"
#include "testutil.h"

/* Scratch directories of the current test, removed by the teardown even
 * when a check fails half-way (tests that fail until a module gains its
 * check must not litter $TMPDIR on every CI run). */
#define HZ_MAX_TMP 8
static char *hz_dirs[HZ_MAX_TMP];

static char *hz_tmp(void)
{
    char *d = tu_mkdtemp("hz");
    for (int i = 0; i < HZ_MAX_TMP; i++)
        if (!hz_dirs[i]) {
            hz_dirs[i] = strdup(d);
            break;
        }
    return d;
}

static int hz_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < HZ_MAX_TMP; i++) {
        if (hz_dirs[i])
            tu_rmtree(hz_dirs[i]);
        free(hz_dirs[i]);
        hz_dirs[i] = NULL;
    }
    return 0;
}

/* ---- building hazard models ---------------------------------------------- */

/* Change tensor `name` (values v, shape rows x cols) in place. */
typedef void (*mutate_fn)(const char *name, float *v, uint64_t rows,
                          uint64_t cols, void *ctx);

static void copy_file(const char *from, const char *to)
{
    size_t n;
    char *b = tu_read_file(from, &n);
    assert_non_null(b);
    assert_int_equal(tu_write_file(to, b, n), 0);
    free(b);
}

/* Write fixture `src` (a llama-shaped F32/F16/BF16 model) as F32 into dir
 * with mutate applied to every tensor. */
static void make_model(const char *dir, const char *src, mutate_fn mutate,
                       void *ctx)
{
    char *sp = tu_fmt("%s/%s", MC_FIXTURE_DIR, src);
    fmt_model *m = NULL;
    mc_error e;
    assert_int_equal(fmt_model_open(sp, &m, &e), MC_OK);
    mkdir(dir, 0777);
    char *cfg_to = tu_fmt("%s/config.json", dir);
    copy_file(fmt_model_config_path(m), cfg_to);
    char *out = tu_fmt("%s/model.safetensors", dir);
    fmt_st_writer *w = NULL;
    assert_int_equal(fmt_st_writer_create(out, &w, &e), MC_OK);
    size_t nt = fmt_model_tensor_count(m);
    for (size_t i = 0; i < nt; i++) {
        const fmt_st_tensor *t = fmt_model_tensor(m, i, NULL);
        assert_int_equal(fmt_st_writer_add(w, t->name, FMT_DT_F32, t->ndim,
                                           t->shape, &e), MC_OK);
    }
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    for (size_t i = 0; i < nt; i++) {
        const fmt_st_tensor *t = fmt_model_tensor(m, i, NULL);
        float *v = malloc(t->nelem * sizeof(float) + 1);
        assert_int_equal(fmt_to_f32(t->dtype, t->data, v, (size_t)t->nelem), 0);
        uint64_t rows = t->ndim == 2 ? t->shape[0] : 1;
        uint64_t cols = t->ndim == 2 ? t->shape[1] : t->nelem;
        if (mutate)
            mutate(t->name, v, rows, cols, ctx);
        assert_int_equal(fmt_st_writer_write(w, v, t->nelem * sizeof(float),
                                             &e), MC_OK);
        free(v);
    }
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_OK);
    fmt_model_close(m);
    free(out);
    free(cfg_to);
    free(sp);
}

/* A hazard: which tensor, which rows/columns, what value. */
typedef struct hazard {
    const char *tensor;   /* exact name */
    uint64_t row0, nrows; /* rows to change */
    uint64_t col0, ncols; /* columns (ncols 0 = all) */
    float value;
    int scale;            /* 1: multiply instead of set */
} hazard;

static void apply_hazard(const char *name, float *v, uint64_t rows,
                         uint64_t cols, void *ctx)
{
    const hazard *h = ctx;
    if (strcmp(name, h->tensor) != 0)
        return;
    for (uint64_t r = h->row0; r < h->row0 + h->nrows && r < rows; r++) {
        uint64_t c1 = h->ncols ? h->col0 + h->ncols : cols;
        for (uint64_t c = h->col0; c < c1 && c < cols; c++) {
            if (h->scale)
                v[r * cols + c] *= h->value;
            else
                v[r * cols + c] = h->value;
        }
    }
}

static char *hazard_model(const char *tmp, const char *tag, const hazard *h)
{
    char *dir = tu_fmt("%s/%s", tmp, tag);
    make_model(dir, "llama", apply_hazard, (void *)h);
    return dir;
}

/* ---- compiling and running ------------------------------------------------ */

static mc_status compile(const char *model, const char *out, const char *quant,
                         const cmp_adapter_spec *ad, mc_error *e)
{
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    assert_int_equal(cmp_wpolicy_parse(quant, 32, &o.req.policy, NULL), MC_OK);
    o.req.target_bytes = 64ull << 20;
    o.req.max_batch = 1;
    o.req.max_seq = 32;
    o.model = model;
    o.out = out;
    if (ad) {
        o.adapters = ad;
        o.n_adapters = 1;
    }
    mc_error_clear(e);
    return cmp_compile(&o, NULL, e);
}

/* Logits of a short prompt at its last position (vocab floats, malloc'ed). */
static float *last_logits(const rt_model *m)
{
    rt_limits L = {.max_batch = 1, .max_seq = 32, .prefill_chunk = 8,
                   .kv_type = KN_KV_F32, .threads = 1};
    rt_session *s = NULL;
    mc_error e;
    assert_int_equal(rt_session_create(m, &L, NULL, &s, &e), MC_OK);
    int32_t ids[6] = {1, 5, 77, 200, 3, 9};
    rt_prompt p = {ids, 6};
    uint32_t V = m->cfg.vocab_size;
    float *all = malloc(6 * (size_t)V * sizeof(float));
    float *const outs[1] = {all};
    assert_int_equal(rt_session_logits(s, &p, 1, outs, &e), MC_OK);
    float *last = malloc(V * sizeof(float));
    memcpy(last, all + 5 * (size_t)V, V * sizeof(float));
    free(all);
    rt_session_free(s);
    return last;
}

static size_t count_nonfinite(const float *v, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += !isfinite(v[i]);
    return k;
}

/* Compile `model` at quant; expect MC_OK and finite logits, return them. */
static float *compile_and_run(const char *tmp, const char *model,
                              const char *quant)
{
    char *out = tu_fmt("%s/%s.mca", tmp, quant);
    mc_error e;
    mc_status st = compile(model, out, quant, NULL, &e);
    if (st != MC_OK) {
        char buf[1600];
        fail_msg("compile %s %s: %s", model, quant,
                 mc_error_format(&e, buf, sizeof buf));
    }
    rt_model *m = NULL;
    assert_int_equal(rt_model_open_artifact(out, &m, &e), MC_OK);
    float *lg = last_logits(m);
    size_t bad = count_nonfinite(lg, m->cfg.vocab_size);
    if (bad)
        fail_msg("%s at %s: %zu non-finite logits", model, quant, bad);
    rt_model_free(m);
    unlink(out);
    free(out);
    return lg;
}

/* Compile must refuse with MC_ERR_NONFINITE naming tensor, writing nothing. */
static void expect_refused(const char *tmp, const char *model,
                           const char *quant, const char *tensor)
{
    char *out = tu_fmt("%s/refused-%s.mca", tmp, quant);
    mc_error e;
    mc_status st = compile(model, out, quant, NULL, &e);
    char buf[1600];
    if (st != MC_ERR_NONFINITE)
        fail_msg("compile %s at %s: expected MC_ERR_NONFINITE naming %s, got "
                 "status %d (%s)%s", model, quant, tensor, (int)st,
                 mc_status_str(st),
                 st == MC_OK ? ": a non-finite model was written" : "");
    mc_error_format(&e, buf, sizeof buf);
    if (!strstr(buf, tensor))
        fail_msg("error does not name the tensor %s: %s", tensor, buf);
    if (!strstr(e.file, ".safetensors")) /* and the file it sits in */
        fail_msg("error does not name the file: %s", buf);
    assert_false(tu_exists(out));
    printf("  refused at %s: %s\n", quant, buf);
    free(out);
}

/* ---- tests ---------------------------------------------------------------- */

#define QPROJ "model.layers.1.self_attn.q_proj.weight"
#define LMHEAD "lm_head.weight"

static void test_hazard_nan_and_inf_weights_refused_by_quantizing_compile(
    void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    hazard nan_h = {QPROJ, 3, 1, 5, 1, NAN, 0};
    hazard inf_h = {QPROJ, 0, 1, 0, 1, INFINITY, 0};
    char *mn = hazard_model(tmp, "nan", &nan_h);
    char *mi = hazard_model(tmp, "inf", &inf_h);
    expect_refused(tmp, mn, "int8", QPROJ);
    expect_refused(tmp, mn, "int4", QPROJ);
    expect_refused(tmp, mi, "int8", QPROJ);
    expect_refused(tmp, mi, "int4", QPROJ);
    tu_rmtree(tmp);
    free(mn);
    free(mi);
    free(tmp);
}

static void test_hazard_nan_weights_refused_by_float_compile(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    hazard nan_h = {QPROJ, 3, 1, 5, 1, NAN, 0};
    char *mn = hazard_model(tmp, "nan", &nan_h);
    expect_refused(tmp, mn, "f16", QPROJ);
    expect_refused(tmp, mn, "f32", QPROJ);
    /* A norm weight is kept float32 at every quant: must be checked too. */
    hazard norm_h = {"model.layers.0.input_layernorm.weight", 0, 1, 7, 1, NAN, 0};
    char *mnorm = hazard_model(tmp, "nannorm", &norm_h);
    expect_refused(tmp, mnorm, "int8", "input_layernorm");
    tu_rmtree(tmp);
    free(mn);
    free(mnorm);
    free(tmp);
}

static void test_hazard_f16_overflow_refused_not_written_as_inf(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* 1e5 is finite in float32 but above float16's 65504. */
    hazard big = {"model.embed_tokens.weight", 10, 1, 0, 4, 1e5f, 0};
    char *mb = hazard_model(tmp, "big", &big);
    expect_refused(tmp, mb, "f16", "embed_tokens");
    /* int8 stores the embedding as f16 too (cmp_plan.h). */
    expect_refused(tmp, mb, "int8", "embed_tokens");
    /* f32 holds it: compiles, finite. */
    free(compile_and_run(tmp, mb, "f32"));
    tu_rmtree(tmp);
    free(mb);
    free(tmp);
}

static void test_hazard_zero_rows_and_zero_groups_dequantize_to_zero(
    void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* lm_head rows 40..41 zero: their logits must be exactly 0. */
    hazard zr = {LMHEAD, 40, 2, 0, 0, 0.0f, 0};
    char *mz = hazard_model(tmp, "zrow", &zr);
    const char *quants[] = {"f32", "f16", "bf16", "int8", "int4"};
    for (int q = 0; q < 5; q++) {
        float *lg = compile_and_run(tmp, mz, quants[q]);
        if (lg[40] != 0.0f || lg[41] != 0.0f)
            fail_msg("%s: zero rows give logits %g %g, not 0", quants[q],
                     (double)lg[40], (double)lg[41]);
        free(lg);
    }
    /* All-zero int4 groups: columns 0..31 and 96..127... of q_proj rows. */
    hazard zg = {QPROJ, 0, 64, 0, 32, 0.0f, 0};
    char *mg = hazard_model(tmp, "zgroup", &zg);
    free(compile_and_run(tmp, mg, "int4"));
    free(compile_and_run(tmp, mg, "int8"));
    printf("  zero rows: logit exactly 0 at f32/f16/bf16/int8/int4; zero "
           "int4 groups: finite\n");
    tu_rmtree(tmp);
    free(mz);
    free(mg);
    free(tmp);
}

static void test_hazard_denormal_rows_stay_finite(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* lm_head rows 50..57 and a block of q_proj: float32 denormals. */
    hazard dn = {LMHEAD, 50, 8, 0, 0, 3e-41f, 0};
    char *md = hazard_model(tmp, "denorm", &dn);
    const char *quants[] = {"f32", "f16", "bf16", "int8", "int4"};
    for (int q = 0; q < 5; q++) {
        float *lg = compile_and_run(tmp, md, quants[q]);
        for (int r = 50; r < 58; r++)
            if (!(fabsf(lg[r]) < 1e-30f))
                fail_msg("%s: denormal row %d gives logit %g", quants[q], r,
                         (double)lg[r]);
        printf("  denormal rows at %-4s: logit %g (%s)\n", quants[q],
               (double)lg[50], lg[50] == 0.0f ? "flushed to zero"
                                              : "preserved");
        free(lg);
    }
    tu_rmtree(tmp);
    free(md);
    free(tmp);
}

/* Running a Hugging Face checkpoint with NaN weights (the runtime maps
 * them, it does not scan them): the NaN logits must not turn silently into
 * tokens.  Either the open or the generate call reports MC_ERR_NONFINITE. */
static void test_hazard_runtime_nan_weights_not_silent(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    hazard nan_h = {QPROJ, 0, 8, 0, 0, NAN, 0};
    char *mn = hazard_model(tmp, "nan", &nan_h);
    rt_model *m = NULL;
    mc_error e;
    mc_status st = rt_model_open_hf(mn, &m, &e);
    if (st == MC_OK) {
        rt_limits L = {.max_batch = 1, .max_seq = 32, .prefill_chunk = 8,
                       .kv_type = KN_KV_F32, .threads = 1};
        rt_session *s = NULL;
        assert_int_equal(rt_session_create(m, &L, NULL, &s, &e), MC_OK);
        int32_t prompt[4] = {1, 5, 7, 9}, ids[8];
        rt_prompt p = {prompt, 4};
        rt_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_new_tokens = 8;
        rt_gen_result r;
        memset(&r, 0, sizeof r);
        r.ids = ids;
        st = rt_session_generate(s, &p, 1, &gp, &r, &e);
        rt_session_free(s);
        rt_model_free(m);
        if (st == MC_OK)
            fail_msg("generate on a model with NaN weights returned OK with "
                     "%zu tokens (first %d): a silent NaN model", r.n,
                     r.n ? ids[0] : -1);
    }
    assert_int_equal(st, MC_ERR_NONFINITE);
    tu_rmtree(tmp);
    free(mn);
    free(tmp);
}

/* ---- adapters ------------------------------------------------------------- */

/* Copy fixture adapter `src` into dir with every lora value set to v. */
static char *extreme_adapter(const char *tmp, const char *tag, float v)
{
    char *src = tu_fmt("%s/adapters/llama-plain", MC_FIXTURE_DIR);
    char *dir = tu_fmt("%s/%s", tmp, tag);
    mkdir(dir, 0777);
    char *a = tu_fmt("%s/adapter_config.json", src);
    char *b = tu_fmt("%s/adapter_config.json", dir);
    copy_file(a, b);
    free(a);
    free(b);
    char *sp = tu_fmt("%s/adapter_model.safetensors", src);
    char *dp = tu_fmt("%s/adapter_model.safetensors", dir);
    fmt_st_file *f = NULL;
    mc_error e;
    assert_int_equal(fmt_st_open(sp, &f, &e), MC_OK);
    fmt_st_writer *w = NULL;
    assert_int_equal(fmt_st_writer_create(dp, &w, &e), MC_OK);
    size_t n = fmt_st_count(f);
    for (size_t i = 0; i < n; i++) {
        const fmt_st_tensor *t = fmt_st_get(f, i);
        assert_int_equal(fmt_st_writer_add(w, t->name, FMT_DT_F32, t->ndim,
                                           t->shape, &e), MC_OK);
    }
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    for (size_t i = 0; i < n; i++) {
        const fmt_st_tensor *t = fmt_st_get(f, i);
        float *x = malloc(t->nelem * sizeof(float) + 1);
        for (uint64_t k = 0; k < t->nelem; k++)
            x[k] = (k % 3 == 1) ? -v : v;
        assert_int_equal(fmt_st_writer_write(w, x, t->nelem * sizeof(float),
                                             &e), MC_OK);
        free(x);
    }
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_OK);
    fmt_st_close(f);
    free(sp);
    free(dp);
    free(src);
    return dir;
}

static mc_status merge_to(const char *base, const char *adapter,
                          const char *out, fmt_dtype dt, mc_error *e)
{
    fmt_model *m = NULL;
    cmp_merge *mg = NULL;
    cmp_adapter_spec spec = {adapter, 1.0};
    mc_error_clear(e);
    mc_status st = fmt_model_open(base, &m, e);
    if (st == MC_OK)
        st = cmp_merge_open(m, &spec, 1, &mg, e);
    if (st == MC_OK)
        st = cmp_merge_write(mg, out, dt, NULL, e);
    cmp_merge_close(mg);
    fmt_model_close(m);
    return st;
}

static void test_hazard_extreme_adapter_overflow_refused(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    char *base = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    char *huge = extreme_adapter(tmp, "huge", 1e30f);
    char *out = tu_fmt("%s/merged", tmp);
    mc_error e;
    char buf[1600];
    /* 1e30 x 1e30: overflows float32 -> refused, nothing written. */
    mc_status st = merge_to(base, huge, out, FMT_DT_INVALID, &e);
    if (st != MC_ERR_NONFINITE)
        fail_msg("merge of a 1e30 adapter: expected MC_ERR_NONFINITE, got %d",
                 (int)st);
    assert_false(tu_exists(out));
    printf("  merge refused: %s\n", mc_error_format(&e, buf, sizeof buf));
    /* The compile path merges in memory: refused the same way. */
    cmp_adapter_spec spec = {huge, 1.0};
    char *art = tu_fmt("%s/m.mca", tmp);
    st = compile(base, art, "int8", &spec, &e);
    if (st != MC_ERR_NONFINITE)
        fail_msg("compile with a 1e30 adapter: expected MC_ERR_NONFINITE, got "
                 "%d", (int)st);
    assert_false(tu_exists(art));
    /* 100 x 100 x r: finite in float32 (kept), above float16 (refused). */
    char *big = extreme_adapter(tmp, "big", 100.0f);
    st = merge_to(base, big, out, FMT_DT_F16, &e);
    if (st != MC_ERR_NONFINITE)
        fail_msg("merge to f16 overflowing: expected MC_ERR_NONFINITE, got %d",
                 (int)st);
    assert_false(tu_exists(out));
    assert_int_equal(merge_to(base, big, out, FMT_DT_F32, &e), MC_OK);
    assert_true(tu_exists(out));
    /* NaN in an adapter: fmt_peft_open refuses it. */
    char *nan = extreme_adapter(tmp, "nan", NAN);
    char *out2 = tu_fmt("%s/merged2", tmp);
    st = merge_to(base, nan, out2, FMT_DT_INVALID, &e);
    assert_int_equal(st, MC_ERR_NONFINITE);
    assert_false(tu_exists(out2));
    tu_rmtree(tmp);
    free(base);
    free(huge);
    free(big);
    free(nan);
    free(out);
    free(out2);
    free(art);
    free(tmp);
}

static void test_hazard_merge_nan_base_refused(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* llama-plain adapts q_proj and v_proj (adapter_config.json). */
    hazard nan_h = {QPROJ, 2, 1, 0, 1, NAN, 0};
    char *mn = hazard_model(tmp, "nan", &nan_h);
    char *ad = tu_fmt("%s/adapters/llama-plain", MC_FIXTURE_DIR);
    char *out = tu_fmt("%s/merged", tmp);
    mc_error e;
    mc_status st = merge_to(mn, ad, out, FMT_DT_INVALID, &e);
    if (st != MC_ERR_NONFINITE)
        fail_msg("merge onto a NaN base tensor: expected MC_ERR_NONFINITE, "
                 "got %d", (int)st);
    assert_false(tu_exists(out));
    tu_rmtree(tmp);
    free(mn);
    free(ad);
    free(out);
    free(tmp);
}

/* Row blocks go to whichever thread is free (cmp_merge_math.c), so two
 * blocks with bad values may be met by two threads in either order: the
 * error still names the first bad value in row order, every time. */
static void test_hazard_merge_names_first_bad_row_whatever_the_threads(
    void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* q_proj is 64 x 64: NaN in rows 37..56 (row blocks 2 and 3) */
    hazard h = {QPROJ, 37, 20, 5, 3, NAN, 0};
    char *mn = hazard_model(tmp, "nan2", &h);
    char *ad = tu_fmt("%s/adapters/llama-plain", MC_FIXTURE_DIR);
    char *out = tu_fmt("%s/merged", tmp);
    for (int run = 0; run < 8; run++) {
        mc_error e;
        char buf[1600];
        assert_int_equal(merge_to(mn, ad, out, FMT_DT_INVALID, &e),
                         MC_ERR_NONFINITE);
        mc_error_format(&e, buf, sizeof buf);
        if (!strstr(buf, "row 37, column 5"))
            fail_msg("run %d: expected the first bad value at row 37, column "
                     "5: %s", run, buf);
        assert_false(tu_exists(out));
    }
    tu_rmtree(tmp);
    free(mn);
    free(ad);
    free(out);
    free(tmp);
}

/* ---- calibration ---------------------------------------------------------- */

static void calib_all_methods(const char *model, const char *label)
{
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(model, &m, &e), MC_OK);
    enum { NSEQ = 4, T = 24 };
    int32_t tok[NSEQ * T];
    size_t off[NSEQ + 1];
    uint64_t s = 99;
    for (size_t i = 0; i < NSEQ * T; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((s >> 33) % m->cfg.vocab_size);
    }
    for (size_t i = 0; i <= NSEQ; i++)
        off[i] = i * T;
    const cmp_qmethod ms[] = {CMP_QM_RTN, CMP_QM_GPTQ, CMP_QM_AWQ};
    for (int k = 0; k < 3; k++) {
        cmp_calib_opts o;
        memset(&o, 0, sizeof o);
        o.fmt = KN_W_Q4;
        o.group = 32;
        o.method = ms[k];
        cmp_calib_result *r = NULL;
        mc_status st = cmp_calib_run(m, tok, off, NSEQ, &o, &r, &e);
        if (st == MC_ERR_NONFINITE) {
            printf("  calib %s %s: refused: %s\n", label,
                   cmp_qmethod_name(ms[k]), e.message);
            continue;
        }
        if (st != MC_OK)
            fail_msg("calib %s %s: status %d: %s", label,
                     cmp_qmethod_name(ms[k]), (int)st, e.message);
        rt_model view;
        assert_int_equal(cmp_calib_view(m, r, &view, &e), MC_OK);
        float *lg = last_logits(&view);
        size_t bad = count_nonfinite(lg, m->cfg.vocab_size);
        if (bad)
            fail_msg("calib %s %s: %zu non-finite logits (a silent NaN "
                     "model)", label, cmp_qmethod_name(ms[k]), bad);
        double errsum = 0;
        for (size_t i = 0; i < (size_t)r->layers * CMP_LIN_COUNT; i++)
            errsum += r->t[i].err;
        printf("  calib %-12s %-5s: finite logits, summed error %g\n", label,
               cmp_qmethod_name(ms[k]), errsum);
        free(lg);
        cmp_calib_view_free(&view);
        cmp_calib_result_free(r);
    }
    rt_model_free(m);
}

static void test_hazard_calibration_dead_and_huge_activations(void **state)
{
    (void)state;
    char *tmp = hz_tmp();
    /* Dead inputs: 8 channels of every attention-norm weight are 0, so the
     * q/k/v inputs there are always 0 (zero-variance Hessian rows). */
    hazard dead = {"model.layers.0.input_layernorm.weight", 0, 1, 8, 8, 0.0f, 0};
    char *md = hazard_model(tmp, "dead", &dead);
    calib_all_methods(md, "dead-inputs");
    /* Huge activations: the MLP norm of layer 1 scaled by 1e4 on 4
     * channels, so gate/up see inputs ~1e4 larger there. */
    hazard huge = {"model.layers.1.post_attention_layernorm.weight", 0, 1, 0,
                   4, 1e4f, 1};
    char *mh = hazard_model(tmp, "hugeact", &huge);
    calib_all_methods(mh, "huge-acts");
    /* NaN weight: calibration must refuse, not produce a NaN model. */
    hazard nan_h = {QPROJ, 3, 1, 5, 1, NAN, 0};
    char *mn = hazard_model(tmp, "nan", &nan_h);
    rt_model *m = NULL;
    mc_error e;
    assert_int_equal(rt_model_open_hf(mn, &m, &e), MC_OK);
    int32_t tok[48];
    for (int i = 0; i < 48; i++)
        tok[i] = (int32_t)(i * 7 % 256);
    size_t off[3] = {0, 24, 48};
    cmp_calib_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = KN_W_Q8;
    o.method = CMP_QM_RTN;
    cmp_calib_result *r = NULL;
    mc_status st = cmp_calib_run(m, tok, off, 2, &o, &r, &e);
    if (st == MC_OK) {
        cmp_calib_result_free(r);
        fail_msg("calibration of a model with a NaN weight returned OK");
    }
    printf("  calib nan-weight: status %d: %s\n", (int)st, e.message);
    rt_model_free(m);
    tu_rmtree(tmp);
    free(md);
    free(mh);
    free(mn);
    free(tmp);
}

#define HZ_TEST(f) cmocka_unit_test_teardown(f, hz_teardown)

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    mc_alloc_install_jansson();
    const struct CMUnitTest tests[] = {
        HZ_TEST(test_hazard_nan_and_inf_weights_refused_by_quantizing_compile),
        HZ_TEST(test_hazard_nan_weights_refused_by_float_compile),
        HZ_TEST(test_hazard_f16_overflow_refused_not_written_as_inf),
        HZ_TEST(test_hazard_zero_rows_and_zero_groups_dequantize_to_zero),
        HZ_TEST(test_hazard_denormal_rows_stay_finite),
        HZ_TEST(test_hazard_runtime_nan_weights_not_silent),
        HZ_TEST(test_hazard_extreme_adapter_overflow_refused),
        HZ_TEST(test_hazard_merge_nan_base_refused),
        HZ_TEST(test_hazard_merge_names_first_bad_row_whatever_the_threads),
        HZ_TEST(test_hazard_calibration_dead_and_huge_activations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_plan_store.c - the stored plan's one owner (runtime/rt_plan.h):
 * what the compiler writes the runtime reads back unchanged; a stored plan
 * that disagrees with this runtime is refused naming the key; one name
 * table per enum; and the CPU reserve is the process's measured size. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cmp_plan.h"
#include "fmt_artifact.h"
#include "kn_quant.h"
#include "mc_alloc.h"
#include "rt_plan.h"
#include "testutil.h"

static fmt_model_config small_config(void)
{
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = FMT_ARCH_LLAMA;
    c.hidden_size = 64;
    c.intermediate_size = 172;
    c.num_layers = 5;
    c.num_heads = 8;
    c.num_kv_heads = 4;
    c.head_dim = 8;
    c.vocab_size = 512;
    c.max_position_embeddings = 512;
    c.rms_norm_eps = 1e-5;
    c.rope.theta = 10000;
    c.rope.factor = 1;
    return c;
}

static json_t *stored_json(const fmt_model_config *c, rt_plan *p)
{
    rt_limits L = {.max_batch = 3, .max_seq = 100, .prefill_chunk = 24,
                   .kv_type = KN_KV_I8, .threads = 2};
    assert_int_equal(rt_plan_make(c, &L, 123456, 4096, p, NULL), MC_OK);
    json_t *o = json_object();
    assert_int_equal(rt_plan_to_json(p, o), 0);
    return o;
}

static void test_plan_store_round_trips(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_plan p, back;
    json_t *o = stored_json(&c, &p);
    assert_int_equal(p.total_bytes, 123456 + p.layout.arena_bytes + 4096);
    mc_error e;
    assert_int_equal(rt_plan_from_json(o, &c, 123456, "x.mca", &back, &e),
                     MC_OK);
    assert_memory_equal(back.layout.buf, p.layout.buf, sizeof p.layout.buf);
    assert_int_equal(back.layout.arena_bytes, p.layout.arena_bytes);
    assert_int_equal(back.layout.limits.max_batch, 3);
    assert_int_equal(back.layout.limits.max_seq, 100);
    assert_int_equal(back.layout.limits.prefill_chunk, 24);
    assert_int_equal(back.layout.limits.threads, 2);
    assert_int_equal(back.layout.limits.kv_type, KN_KV_I8);
    assert_int_equal(back.weights_bytes, p.weights_bytes);
    assert_int_equal(back.reserve_bytes, p.reserve_bytes);
    assert_int_equal(back.total_bytes, p.total_bytes);
    assert_string_equal(json_string_value(json_object_get(o, "kv_type")),
                        "int8");
    json_decref(o);
}

/* Set key to an integer v in a copy of o and read it back. */
static mc_status read_with(const json_t *o, const char *key, json_int_t v,
                           const fmt_model_config *c, mc_error *e)
{
    json_t *d = json_deep_copy(o);
    json_object_set_new(d, key, json_integer(v));
    rt_plan p;
    mc_status st = rt_plan_from_json(d, c, 123456, "x.mca", &p, e);
    json_decref(d);
    return st;
}

static void test_plan_store_refuses_what_disagrees_naming_the_key(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_plan p;
    json_t *o = stored_json(&c, &p);
    mc_error e;
    /* a doctored total: the figures are recomputed */
    assert_int_equal(read_with(o, "total_bytes", (json_int_t)p.total_bytes - 1,
                               &c, &e), MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "total_bytes"));
    assert_int_equal(read_with(o, "weights_bytes", 1, &c, &e), MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "weights_bytes"));
    /* other limits give another layout than the stored buffers */
    assert_int_equal(read_with(o, "max_seq", 101, &c, &e), MC_ERR_PLAN);
    assert_non_null(strstr(e.message, "recompile"));
    assert_int_equal(read_with(o, "max_batch", 0, &c, &e), MC_ERR_FORMAT);
    /* a buffer moved */
    json_t *d = json_deep_copy(o);
    json_t *b = json_array_get(json_object_get(d, "buffers"), RT_BUF_LOGITS);
    json_object_set_new(b, "offset", json_integer(
        json_integer_value(json_object_get(b, "offset")) + 64));
    rt_plan q;
    assert_int_equal(rt_plan_from_json(d, &c, 123456, "x.mca", &q, &e),
                     MC_ERR_PLAN);
    /* an unknown KV type names the key */
    json_object_set_new(d, "kv_type", json_string("int9"));
    assert_int_equal(rt_plan_from_json(d, &c, 123456, "x.mca", &q, &e),
                     MC_ERR_FORMAT);
    assert_string_equal(e.field, "plan.kv_type");
    assert_string_equal(e.file, "x.mca");
    json_object_del(d, "reserve_bytes");
    json_object_set_new(d, "kv_type", json_string("int8"));
    assert_int_equal(rt_plan_from_json(d, &c, 123456, "x.mca", &q, &e),
                     MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "reserve_bytes"));
    json_decref(d);
    json_decref(o);
}

static void test_plan_store_session_layout_takes_the_stored_one(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    rt_plan p;
    json_t *o = stored_json(&c, &p);
    json_decref(o);
    rt_limits want = p.layout.limits;
    want.threads = 1; /* fewer threads than planned: runs with 1 */
    rt_layout got;
    mc_error e;
    assert_int_equal(rt_plan_session_layout(&c, &want, &p.layout, "x.mca",
                                            &got, &e), MC_OK);
    assert_int_equal(got.limits.threads, 1);
    assert_memory_equal(got.buf, p.layout.buf, sizeof got.buf);
    want.threads = 8; /* more: the stored scratch bounds it */
    assert_int_equal(rt_plan_session_layout(&c, &want, &p.layout, "x.mca",
                                            &got, &e), MC_OK);
    assert_int_equal(got.limits.threads, 2);
    want.max_seq = 50; /* other limits: refused with both */
    assert_int_equal(rt_plan_session_layout(&c, &want, &p.layout, "x.mca",
                                            &got, &e), MC_ERR_PLAN);
    assert_non_null(strstr(e.message, "max_seq 100"));
    assert_non_null(strstr(e.message, "max_seq 50"));
    /* no stored layout: the built one */
    assert_int_equal(rt_plan_session_layout(&c, &want, NULL, "x.mca", &got,
                                            &e), MC_OK);
    assert_int_equal(got.limits.max_seq, 50);
}

static void test_plan_store_one_name_table_per_enum(void **st)
{
    (void)st;
    for (int f = 0; f < KN_W_COUNT_; f++) {
        kn_wformat back;
        assert_int_equal(kn_wformat_parse(kn_wformat_name((kn_wformat)f),
                                          &back), 0);
        assert_int_equal(back, f);
        /* the artifact's table itself (formats/ owns the names) */
        assert_ptr_equal(kn_wformat_name((kn_wformat)f),
                         fmt_art_wformat_name((fmt_art_wformat)f));
    }
    assert_string_equal(kn_wformat_name(KN_W_Q4S), "q4s");
    fmt_art_wformat af;
    assert_int_equal(fmt_art_wformat_parse("q8", &af), 0);
    assert_int_equal(af, FMT_ART_Q8);
    assert_int_equal(fmt_art_wformat_parse("int4", &af), -1);
    kn_wformat wf;
    assert_int_equal(kn_wformat_parse("int8", &wf), -1);
    assert_int_equal(kn_wformat_parse(NULL, &wf), -1);
    assert_string_equal(kn_wformat_name(KN_W_COUNT_), "?");
    const kn_kvtype kv[] = {KN_KV_F32, KN_KV_F16, KN_KV_I8};
    for (size_t i = 0; i < 3; i++) {
        kn_kvtype back;
        assert_int_equal(kn_kvtype_parse(kn_kvtype_name(kv[i]), &back), 0);
        assert_int_equal(back, kv[i]);
    }
    kn_kvtype t;
    assert_int_equal(kn_kvtype_parse("i8", &t), 0);
    assert_int_equal(t, KN_KV_I8);
    assert_int_equal(kn_kvtype_parse("q8", &t), -1);
    assert_string_equal(kn_kvtype_name((kn_kvtype)7), "?");
    /* the planner's --kv (compiler/cli_opts.c) parses with
     * kn_kvtype_parse: test_cli_options checks its refusals */
}

/* The reserve grows with what the process holds: tensors' manifest
 * entries, worker threads, float norms, the tokenizer's tables. */
static void test_plan_store_cpu_reserve_counts_its_parts(void **st)
{
    (void)st;
    fmt_model_config c = small_config();
    uint64_t base = cmp_plan_cpu_reserve(&c, 0, 0, 0);
    assert_int_equal(base, CMP_CPU_BASE_BYTES + 4ull * (2 * 64 * 5 + 64));
    assert_int_equal(cmp_plan_cpu_reserve(&c, 10, 0, 0),
                     base + 10 * CMP_CPU_TENSOR_BYTES);
    assert_int_equal(cmp_plan_cpu_reserve(&c, 0, 16, 0),
                     base + 16 * CMP_CPU_THREAD_BYTES);
    assert_int_equal(cmp_plan_cpu_reserve(&c, 0, 0, 1000), base + 8000);
    c.qkv_bias = 1;
    assert_int_equal(cmp_plan_cpu_reserve(&c, 0, 0, 0),
                     base + 4ull * 5 * (64 + 2 * 32));
    assert_int_equal(cmp_plan_cpu_reserve(&c, 0, 0, UINT64_MAX / 2),
                     UINT64_MAX);
    /* the plan uses it on the CPU; --reserve and CUDA do not */
    cmp_plan_request r;
    cmp_plan_request_default(&r);
    r.target_bytes = 1ull << 30;
    r.max_batch = 1;
    r.max_seq = 64;
    r.tokenizer_bytes = 2000;
    r.threads = 3;
    cmp_plan p;
    c.qkv_bias = 0;
    assert_int_equal(cmp_plan_build(&c, &r, &p, NULL), MC_OK);
    cmp_tensor_plan *t;
    size_t nt;
    assert_int_equal(cmp_plan_tensors(&c, &r.policy, &t, &nt, NULL), MC_OK);
    /* page tails: each section's last 4 KiB page, less its bytes */
    uint64_t tails = 0;
    for (size_t i = 0; i < nt; i++)
        tails += t[i].section_bytes % 4096 ? 4096 - t[i].section_bytes % 4096
                                           : 0;
    assert_true(tails > 0); /* the norms (64 floats) end mid-page */
    assert_int_equal(cmp_plan_map_tail_bytes(t, nt), tails);
    mc_free(t);
    assert_int_equal(p.reserve_bytes,
                     cmp_plan_cpu_reserve(&c, nt, 3, 2000) + tails);
    assert_int_equal(p.total_bytes,
                     p.weights_bytes + p.arena_bytes + p.reserve_bytes);
}

/* Measured: mrun's peak RSS at the plan's corner stays within the plan
 * on every run, and the reserve leaves little unused against the largest
 * of three runs.  The stories260k plan is about 7 MiB, and identical runs
 * on one host differ by up to ~1.5 MB of process noise (5.7-7.2 MB seen
 * on a Zen 4 host in session 8; docs/plan.md), so a single run cannot
 * check both ends: each run must fit (the product's promise), and the
 * worst of three must reach 0.80 of the plan (a reserve a few MiB too
 * large still fails). */
static void test_plan_store_reserve_matches_the_measured_process(void **st)
{
    (void)st;
    TU_SKIP_IF(getenv("MC_UNDER_SANITIZER") != NULL,
               "sanitizer runtimes add shadow memory to the RSS");
    const char *model = tu_stories_dir();
    TU_SKIP_IF(model == NULL, "stories260k not found in ../shared/models");
    char *dir = tu_mkdtemp("planstore");
    char *art = tu_fmt("%s/s.mca", dir);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_bin(&out, &err, "mcompile",
                                "%s --target 1GiB --quant f32 --max-batch 4 "
                                "--max-seq 128 --threads 2 -q -o %s",
                                model, art), 0);
    char toks[1024] = "";
    for (int i = 0; i < 64; i++)
        snprintf(toks + strlen(toks), sizeof toks - strlen(toks), "%d ",
                 3 + (i * 7) % 300);
    double worst = 0.0, planned = 0.0;
    for (int run = 0; run < 3; run++) {
        assert_int_equal(tu_run_bin(&out, &err, "mrun",
                                    "%s --tokens '%s' --tokens '%s' --tokens '%s' "
                                    "--tokens '%s' --max-new-tokens 64 "
                                    "--ignore-eos --threads 2 --json",
                                    art, toks, toks, toks, toks), 0);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        double rss = (double)json_integer_value(json_object_get(j, "peak_rss_bytes"));
        planned = (double)json_integer_value(json_object_get(j, "planned_bytes"));
        printf("run %d: peak RSS %.0f of planned %.0f bytes (%.3f)\n", run, rss,
               planned, rss / planned);
        assert_true(rss <= planned);
        worst = rss > worst ? rss : worst;
        json_decref(j);
        free(out);
        free(err);
        out = err = NULL;
    }
    assert_true(worst >= 0.80 * planned);
    free(art);
    tu_rmtree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_store_round_trips),
        cmocka_unit_test(test_plan_store_refuses_what_disagrees_naming_the_key),
        cmocka_unit_test(test_plan_store_session_layout_takes_the_stored_one),
        cmocka_unit_test(test_plan_store_one_name_table_per_enum),
        cmocka_unit_test(test_plan_store_cpu_reserve_counts_its_parts),
        cmocka_unit_test(test_plan_store_reserve_matches_the_measured_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_compile_calib.c - `mcompile MODEL --quant int8|int4|int4-sym|auto
 * --calib FILE [--method M]`: the calibrated artifact opens, verifies and
 * runs; its manifest records each linear's method and errors (int4-sym
 * through every method); adapters are merged
 * before calibration; --quant auto fits its target with mixed formats; on
 * stories260k the calibrated int4 g32 artifact has a lower KLD than RTN;
 * a failed allocation anywhere in the calibrated compile is an error, never
 * a crash or a leak (ASan). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmp_compile.h"
#include "kn_cpus.h"
#include "mc_alloc.h"
#include "fmt_artifact.h"
#include "testutil.h"
#include "tok_fixture.h"

static char *g_dir;
static char *g_ids; /* 10 sequences of 24 ids < 256 */

static int setup(void **state)
{
    (void)state;
    g_dir = tu_mkdtemp("calib");
    g_ids = tu_fmt("%s/ids.txt", g_dir);
    char text[4096];
    size_t n = 0;
    uint32_t x = 12345;
    for (int s = 0; s < 10; s++) {
        for (int i = 0; i < 24; i++) {
            x = x * 1103515245u + 12345u;
            n += (size_t)snprintf(text + n, sizeof text - n, "%s%u",
                                  i ? " " : "", (x >> 16) % 256u);
        }
        text[n++] = '\n';
    }
    assert_int_equal(tu_write_file(g_ids, text, n), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmtree(g_dir);
    free(g_dir);
    free(g_ids);
    return 0;
}

/* `mcompile inspect ART --verify --json`: verified, returns the manifest. */
static json_t *inspect_manifest(const char *art)
{
    char *out = NULL, *cmd = tu_fmt("%s/mcompile inspect %s --verify --json",
                                    MC_BIN_DIR, art);
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_true(json_is_true(json_object_get(j, "verified")));
    json_t *m = json_incref(json_object_get(j, "manifest"));
    assert_non_null(m);
    json_decref(j);
    free(out);
    free(cmd);
    return m;
}

/* `mcompile eval ART --ref REF --tokens IDS --json`'s kld_mean. */
static double eval_kld(const char *art, const char *ref, const char *ids)
{
    char *out = NULL, *err = NULL;
    char *cmd = tu_fmt("%s/mcompile eval %s --ref %s --tokens %s --json",
                       MC_BIN_DIR, art, ref, ids);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("eval failed (%d): %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    double k = json_number_value(json_object_get(j, "kld_mean"));
    json_decref(j);
    free(out);
    free(err);
    free(cmd);
    return k;
}

static void compile_ok(const char *args)
{
    char *err = NULL, *cmd = tu_fmt("%s/mcompile %s -q", MC_BIN_DIR, args);
    int rc = tu_run(cmd, NULL, &err);
    if (rc != 0)
        fail_msg("mcompile %s failed (%d): %s", args, rc, err);
    free(err);
    free(cmd);
}

/* mcompile with args exits 1 (a failure, not a usage error) and its
 * message names need1 and, when given, need2. */
static void compile_fails(const char *args, const char *need1, const char *need2)
{
    char *err = NULL, *cmd = tu_fmt("%s/mcompile %s", MC_BIN_DIR, args);
    assert_int_equal(tu_run(cmd, NULL, &err), 1);
    assert_non_null(strstr(err, need1));
    if (need2)
        assert_non_null(strstr(err, need2));
    free(err);
    free(cmd);
}

/* The artifact art generates a few tokens with mrun. */
static void mrun_ok(const char *art)
{
    char *err = NULL;
    char *cmd = tu_fmt("%s/mrun %s --tokens 1 --max-new-tokens 4 -q",
                       MC_BIN_DIR, art);
    int rc = tu_run(cmd, NULL, &err);
    if (rc != 0)
        fail_msg("mrun %s failed (%d): %s", art, rc, err);
    free(err);
    free(cmd);
}

/* Every linear records method/err/err_rtn/alpha; returns how many linears
 * there are, and in counts how many have each format in fmts[] ("q4",
 * "q8", "f16", "q4s"). */
static size_t check_linears(const json_t *man, size_t counts[4])
{
    static const char *const fmts[4] = {"q4", "q8", "f16", "q4s"};
    const json_t *ts = json_object_get(man, "tensors");
    size_t n = 0, i;
    json_t *t;
    counts[0] = counts[1] = counts[2] = counts[3] = 0;
    json_array_foreach(ts, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!strstr(name, "_proj.weight"))
            continue;
        n++;
        assert_true(json_is_string(json_object_get(t, "method")));
        assert_true(json_is_number(json_object_get(t, "err")));
        assert_true(json_is_number(json_object_get(t, "err_rtn")));
        assert_true(json_is_number(json_object_get(t, "alpha")));
        double e = json_number_value(json_object_get(t, "err"));
        assert_true(e >= 0.0 && e < 1.0);
        const char *f = json_string_value(json_object_get(t, "format"));
        for (int k = 0; k < 4; k++)
            if (strcmp(f, fmts[k]) == 0)
                counts[k]++;
    }
    return n;
}

static void test_compile_calib_int8_fixtures_verify_run_and_record(void **state)
{
    (void)state;
    static const char *const models[] = {"llama", "qwen2"};
    for (size_t m = 0; m < 2; m++) {
        char *model = tu_fmt("%s/%s", MC_FIXTURE_DIR, models[m]);
        char *art = tu_fmt("%s/%s-c8.mca", g_dir, models[m]);
        char *args = tu_fmt("%s --target 64MiB --quant int8 --calib %s -o %s",
                            model, g_ids, art);
        compile_ok(args);
        json_t *man = inspect_manifest(art);
        size_t c[4];
        size_t n = check_linears(man, c);
        assert_true(n > 0);
        assert_int_equal(c[1], n); /* all int8 */
        const json_t *cal = json_object_get(man, "calibration");
        assert_non_null(cal);
        assert_string_equal(json_string_value(json_object_get(cal, "method")),
                            "best");
        assert_int_equal(json_integer_value(json_object_get(cal, "sequences")),
                         10);
        assert_int_equal(
            json_integer_value(json_object_get(cal, "heldout_sequences")), 1);
        assert_true(json_is_number(
            json_object_get(json_object_get(cal, "heldout"), "kld_mean")));
        json_decref(man);
        mrun_ok(art);
        free(args);
        free(art);
        free(model);
    }
    /* a named method is recorded as asked */
    char *art = tu_fmt("%s/llama-gptq.mca", g_dir);
    char *args = tu_fmt("%s/llama --target 64MiB --quant int4 --group 32 "
                        "--calib %s --method gptq -o %s", MC_FIXTURE_DIR,
                        g_ids, art);
    compile_ok(args);
    json_t *man = inspect_manifest(art);
    size_t c[4];
    size_t n4 = check_linears(man, c);
    assert_int_equal(n4, c[0]); /* all int4 */
    json_t *t = json_array_get(json_object_get(man, "tensors"), 2);
    assert_string_equal(json_string_value(json_object_get(t, "method")), "gptq");
    json_decref(man);
    free(args);
    free(art);
    /* symmetric int4 (--quant int4-sym) through every method: each linear
     * q4s at the asked group, its method recorded, the artifact runs */
    static const char *const methods[] = {"rtn", "awq", "gptq", "gptaq",
                                          "awq+gptq", "awq+gptaq", "best",
                                          "best-all"};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
        art = tu_fmt("%s/llama-sym.mca", g_dir);
        args = tu_fmt("%s/llama --target 64MiB --quant int4-sym --group 64 "
                      "--calib %s --method %s -o %s", MC_FIXTURE_DIR, g_ids,
                      methods[m], art);
        compile_ok(args);
        man = inspect_manifest(art);
        n4 = check_linears(man, c);
        assert_int_equal(c[3], n4); /* all q4s */
        assert_string_equal(json_string_value(json_object_get(
                                json_object_get(man, "plan"), "quant")),
                            "int4-sym");
        t = json_array_get(json_object_get(man, "tensors"), 2);
        assert_int_equal(json_integer_value(json_object_get(t, "group")), 64);
        if (strncmp(methods[m], "best", 4) != 0) /* best records its pick */
            assert_string_equal(
                json_string_value(json_object_get(t, "method")), methods[m]);
        json_decref(man);
        mrun_ok(art);
        free(args);
        free(art);
    }
}

/* Format of tensor name in a manifest, or NULL when it is absent. */
static const char *tensor_format(const json_t *man, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(man, "tensors"), i, t)
        if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0)
            return json_string_value(json_object_get(t, "format"));
    return NULL;
}

/* The held-out summary in man (art's manifest) measures the artifact
 * itself: `mcompile eval` of art over the held-out sequence (the last of
 * g_ids' 10) gives the same KLD. */
static void check_heldout_is_artifact(const char *art, const json_t *man,
                                      const char *model)
{
    size_t len = 0;
    char *text = tu_read_file(g_ids, &len);
    assert_non_null(text);
    const char *last = text + len - 1;
    while (last > text && last[-1] != '\n')
        last--;
    char *held = tu_fmt("%s/heldout.txt", g_dir);
    assert_int_equal(tu_write_file(held, last, (size_t)(text + len - last)), 0);
    double want = json_number_value(json_object_get(json_object_get(
        json_object_get(man, "calibration"), "heldout"), "kld_mean"));
    double got = eval_kld(art, model, held);
    print_message("%s: held-out KLD %.6g, eval of the artifact %.6g\n", art,
                  want, got);
    assert_true(want > 0 && fabs(got - want) <= 1e-5 * want);
    free(held);
    free(text);
}

/* --lm-head int4 / int4-sym: the output layer (a tied model's embedding,
 * or an untied lm_head) in int4 at the linears' group, written as the
 * plan says, run by mrun; the held-out summary measures the artifact as
 * stored (output layer, an untied model's int8 one included, and the
 * embedding rows, f16 or quantized, rotated or not): the same KLD as
 * `mcompile eval` of the artifact. */
static void test_compile_calib_int4_output_layer(void **state)
{
    (void)state;
    static const struct {
        const char *fixture, *args, *tensor, *fmt;
    } cases[] = {
        {"qwen2", "--quant int4-sym --group 32 --lm-head int4-sym --no-rotate",
         "model.embed_tokens.weight", "q4s"},
        {"qwen2", "--quant int8 --lm-head int4 --no-rotate",
         "model.embed_tokens.weight", "q4"},
        {"llama", "--quant int4 --group 64 --no-rotate", "lm_head.weight",
         "q8"},
        {"llama", "--quant int4-sym --group 32 --lm-head int4 --no-rotate",
         "lm_head.weight", "q4"},
        {"mistral", "--quant int8 --group 64 --lm-head int4-sym --no-rotate",
         "lm_head.weight", "q4s"},
        /* rotated: the tied model untied, its f16 embedding rows rounded */
        {"qwen2", "--quant int4-sym --group 32 --lm-head int4-sym",
         "lm_head.weight", "q4s"},
        {"llama", "--quant int4 --group 32", "model.embed_tokens.weight",
         "f16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *model = tu_fmt("%s/%s", MC_FIXTURE_DIR, cases[i].fixture);
        char *art = tu_fmt("%s/lm4-%zu.mca", g_dir, i);
        char *args = tu_fmt("%s --target 64MiB %s --calib %s -o %s",
                            model, cases[i].args, g_ids, art);
        compile_ok(args);
        json_t *man = inspect_manifest(art);
        assert_string_equal(tensor_format(man, cases[i].tensor), cases[i].fmt);
        check_heldout_is_artifact(art, man, model);
        mrun_ok(art);
        json_decref(man);
        free(args);
        free(art);
        free(model);
    }
}

/* With --calib the model is rotated (cmp_rotate.h): the manifest says so,
 * a tied model (qwen2) gets an untied lm_head, int8 like the linears (the
 * report's weights by part say so and add up), and the artifact still
 * computes the model; --no-rotate keeps it tied, with the embedding (its
 * output layer) in int8; --lm-head picks the output layer's format (f32:
 * the float one), and where the output layer is the embedding, the
 * embedding's (f16 keeps the checkpoint's float). */
static void test_compile_calib_rotation_unties_and_records(void **state)
{
    (void)state;
    char *model = tu_fmt("%s/qwen2", MC_FIXTURE_DIR);
    char *rot = tu_fmt("%s/qwen2-rot.mca", g_dir);
    char *plain = tu_fmt("%s/qwen2-norot.mca", g_dir);
    char *lm8 = tu_fmt("%s/qwen2-lm32.mca", g_dir);
    char *a1 = tu_fmt("%s --target 64MiB --quant int8 --calib %s -o %s", model,
                      g_ids, rot);
    char *a2 = tu_fmt("%s --target 64MiB --quant int8 --calib %s --no-rotate "
                      "-o %s", model, g_ids, plain);
    char *a3 = tu_fmt("%s --target 64MiB --quant int8 --calib %s --lm-head "
                      "f32 -o %s", model, g_ids, lm8);
    compile_ok(a1);
    compile_ok(a2);
    compile_ok(a3);
    json_t *m1 = inspect_manifest(rot), *m2 = inspect_manifest(plain),
           *m3 = inspect_manifest(lm8);
    const json_t *r1 = json_object_get(json_object_get(m1, "calibration"), "rotation");
    assert_true(json_is_object(r1));
    assert_int_equal(json_integer_value(json_object_get(r1, "block")), 64);
    assert_true(json_is_false(json_object_get(json_object_get(m1, "config"),
                                              "tie_word_embeddings")));
    assert_non_null(tensor_format(m1, "lm_head.weight"));
    /* quantized linears: the untied output layer in int8, not float */
    assert_string_equal(tensor_format(m1, "lm_head.weight"), "q8");
    assert_true(json_is_null(json_object_get(json_object_get(m2, "calibration"),
                                             "rotation")));
    assert_true(json_is_true(json_object_get(json_object_get(m2, "config"),
                                             "tie_word_embeddings")));
    assert_null(tensor_format(m2, "lm_head.weight"));
    assert_string_equal(tensor_format(m2, "model.embed_tokens.weight"), "q8");
    assert_string_equal(tensor_format(m1, "model.embed_tokens.weight"), "f16");
    /* the held-out summary of the tied model measures the artifact, int8
     * embedding included */
    check_heldout_is_artifact(plain, m2, model);
    assert_string_equal(tensor_format(m3, "lm_head.weight"), "f32");
    /* both compute the model: small KLD against the float fixture */
    double k1 = eval_kld(rot, model, g_ids), k2 = eval_kld(plain, model, g_ids);
    print_message("qwen2 int8 KLD: rotated %.3g, not rotated %.3g\n", k1, k2);
    assert_true(k1 < 0.01 && k2 < 0.01);
    /* inspect's human report says how the artifact was calibrated */
    char *iout = NULL, *icmd = tu_fmt("%s/mcompile inspect %s", MC_BIN_DIR, rot);
    assert_int_equal(tu_run(icmd, &iout, NULL), 0);
    assert_non_null(strstr(iout, "calibration: method best"));
    assert_non_null(strstr(iout, "rotated: Hadamard blocks of 64"));
    assert_non_null(strstr(iout, "held out: KLD mean"));
    free(iout);
    free(icmd);
    /* `mcompile plan --calibrated` plans exactly what was compiled */
    json_int_t totals[2];
    for (int k = 0; k < 2; k++) {
        char *out = NULL;
        char *c = k ? tu_fmt("%s/mcompile %s --json", MC_BIN_DIR, a1)
                    : tu_fmt("%s/mcompile plan %s --target 64MiB --quant int8 "
                             "--calibrated --json", MC_BIN_DIR, model);
        assert_int_equal(tu_run(c, &out, NULL), 0);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        json_t *p = k ? json_object_get(j, "plan") : j;
        totals[k] = json_integer_value(json_object_get(p, "total_bytes"));
        if (k) { /* the weights by part add up; the output layer is int8 */
            json_t *pb = json_object_get(j, "part_bytes");
            json_int_t sum = 0;
            static const char *const parts[4] = {"embeddings", "lm_head",
                                                 "linears", "other"};
            for (int i = 0; i < 4; i++) {
                json_int_t b = json_integer_value(json_object_get(pb, parts[i]));
                assert_true(b > 0);
                sum += b;
            }
            assert_int_equal(sum, json_integer_value(json_object_get(j, "weights_bytes")));
            assert_string_equal(json_string_value(json_object_get(pb, "lm_head_format")),
                                "q8");
        }
        json_decref(j);
        free(out);
        free(c);
    }
    assert_true(totals[0] > 0);
    assert_int_equal(totals[0], totals[1]);
    /* --lm-head on a tied model that stays tied: the embedding's format */
    char *keep = tu_fmt("%s/qwen2-f16embed.mca", g_dir);
    char *args = tu_fmt("%s --target 64MiB --quant int8 --lm-head f16 -o %s",
                        model, keep);
    compile_ok(args);
    json_t *m4 = inspect_manifest(keep);
    assert_null(tensor_format(m4, "lm_head.weight"));
    assert_string_equal(tensor_format(m4, "model.embed_tokens.weight"), "f16");
    /* `mcompile plan` takes --lm-head too (before or after --quant) and
     * plans what compile stores: the f16 embedding 256 x 64 x 2 bytes
     * against int8's 256 x 64 + 4 x 256 */
    json_int_t w2 = json_integer_value(json_object_get(
                   json_object_get(m2, "plan"), "weights_bytes")),
               w4 = json_integer_value(json_object_get(
                   json_object_get(m4, "plan"), "weights_bytes"));
    assert_int_equal(w4 - w2, 256 * 64 * 2 - (256 * 64 + 4 * 256));
    static const char *const orders[3] = {"--quant int8 --lm-head f16",
                                          "--lm-head f16 --quant int8",
                                          "--quant int8"};
    for (int k = 0; k < 3; k++) {
        char *out = NULL;
        char *c = tu_fmt("%s/mcompile plan %s --target 64MiB %s --json",
                         MC_BIN_DIR, model, orders[k]);
        assert_int_equal(tu_run(c, &out, NULL), 0);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j,
                                                            "weights_bytes")),
                         k < 2 ? w4 : w2);
        json_decref(j);
        free(out);
        free(c);
    }
    json_decref(m4);
    mrun_ok(keep);
    mrun_ok(plain);
    free(args);
    free(keep);
    json_decref(m1);
    json_decref(m2);
    json_decref(m3);
    free(a1);
    free(a2);
    free(a3);
    free(rot);
    free(plain);
    free(lm8);
    free(model);
}

/* `--calib` with a text file: tokenized with the tokenizer.json beside
 * the model (stories260k, vocab 512, linked into a temporary model
 * directory with a small tokenizer whose ids fit), calibrated, recorded;
 * without a tokenizer the same file is refused, naming it. */
static void test_compile_calib_text_file_through_tokenizer(void **state)
{
    (void)state;
    const char *stories = tu_stories_dir();
    TU_SKIP_IF(!stories, "stories260k absent under ../shared");
    char *dir = tu_fmt("%s/text-model", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *src = tu_fmt("%s/%s", stories, files[i]);
        char *dst = tu_fmt("%s/%s", dir, files[i]);
        assert_int_equal(symlink(src, dst), 0);
        free(src);
        free(dst);
    }
    char *text = tu_fmt("%s/stories.txt", g_dir);
    static const char *const words[8] = {"once", "upon", "a", "time",
                                         "there", "was", "little", "girl"};
    char body[8192];
    size_t n = 0;
    for (int d = 0; d < 12; d++) {
        for (int w = 0; w < 40; w++)
            n += (size_t)snprintf(body + n, sizeof body - n, "%s%s",
                                  w ? " " : "", words[(d * 7 + w) % 8]);
        n += (size_t)snprintf(body + n, sizeof body - n, ".\n\n");
    }
    assert_true(n < sizeof body);
    assert_int_equal(tu_write_file(text, body, n), 0);
    char *art = tu_fmt("%s/text.mca", g_dir);
    char *err = NULL;
    /* no tokenizer yet: refused, naming the file */
    char *cmd = tu_fmt("%s/mcompile %s --target 64MiB --quant int8 --calib %s "
                       "--method rtn -o %s -q", MC_BIN_DIR, dir, text, art);
    assert_int_equal(tu_run(cmd, NULL, &err), 1);
    assert_non_null(strstr(err, "stories.txt"));
    assert_non_null(strstr(err, "tokenizer.json"));
    free(err);
    char *tok = tu_fmt("%s/tokenizer.json", dir);
    char *json = tu_spm_tokenizer_json(1);
    assert_int_equal(tu_write_file(tok, json, strlen(json)), 0);
    compile_ok(strstr(cmd, dir));
    json_t *man = inspect_manifest(art);
    const json_t *cal = json_object_get(man, "calibration");
    /* 12 paragraphs of 40 words (+ BOS, "."), cut at 512 tokens */
    json_int_t seqs = json_integer_value(json_object_get(cal, "sequences"));
    json_int_t toks = json_integer_value(json_object_get(cal, "tokens"));
    print_message("text calibration: %lld sequences, %lld tokens calibrated\n",
                  (long long)seqs, (long long)toks);
    assert_true(seqs >= 4 && toks > 1000);
    json_decref(man);
    free(json);
    free(tok);
    free(cmd);
    free(art);
    free(text);
    free(dir);
}

/* The calibration quantizes the MERGED weights: the artifact matches the
 * merged model (small KLD) and not the base. */
static void test_compile_calib_with_lora_calibrates_merged_weights(void **state)
{
    (void)state;
    char *merged = tu_fmt("%s/merged", g_dir);
    char *cmd = tu_fmt("%s/mcompile merge %s/llama --lora %s/adapters/"
                       "llama-plain -o %s -q", MC_BIN_DIR, MC_FIXTURE_DIR,
                       MC_FIXTURE_DIR, merged);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    char *art = tu_fmt("%s/lora-c8.mca", g_dir);
    char *args = tu_fmt("%s/llama --lora %s/adapters/llama-plain --target "
                        "64MiB --quant int8 --calib %s -o %s", MC_FIXTURE_DIR,
                        MC_FIXTURE_DIR, g_ids, art);
    compile_ok(args);
    char *base = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    double k_merged = eval_kld(art, merged, g_ids);
    double k_base = eval_kld(art, base, g_ids);
    printf("lora int8 calibrated: KLD vs merged %.6f, vs base %.6f\n",
           k_merged, k_base);
    assert_true(k_merged < 0.01);
    assert_true(k_merged * 20 < k_base);
    free(base);
    free(args);
    free(art);
    free(cmd);
    free(merged);
}

static void test_compile_auto_fits_target_and_mixes_formats(void **state)
{
    (void)state;
    /* llama fixture at batch 1 x 64: int4 everywhere needs 324544 bytes,
     * int8 399808, f16 570304; 370000 forces a mix of int4 and int8. */
    static const uint64_t targets[] = {370000, 480000};
    for (size_t k = 0; k < 2; k++) {
        char *art = tu_fmt("%s/auto%zu.mca", g_dir, k);
        /* --reserve 0: the targets are sized for the weights alone */
        char *args = tu_fmt("%s/llama --target %llu --reserve 0 --quant auto "
                            "--group 32 --max-batch 1 --max-seq 64 --calib %s "
                            "-o %s",
                            MC_FIXTURE_DIR, (unsigned long long)targets[k],
                            g_ids, art);
        compile_ok(args);
        json_t *man = inspect_manifest(art);
        const json_t *plan = json_object_get(man, "plan");
        uint64_t total =
            (uint64_t)json_integer_value(json_object_get(plan, "total_bytes"));
        assert_true(total > 0 && total <= targets[k]);
        assert_string_equal(json_string_value(json_object_get(plan, "quant")),
                            "auto");
        /* the plan's weight bytes are the sections' parts, byte for byte */
        uint64_t sum = 0;
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(man, "tensors"), i, t) {
            static const char *const parts[] = {"data", "scales", "zeros"};
            for (int p = 0; p < 3; p++)
                sum += (uint64_t)json_integer_value(
                    json_array_get(json_object_get(t, parts[p]), 1));
        }
        assert_int_equal(sum, (uint64_t)json_integer_value(
                                  json_object_get(plan, "weights_bytes")));
        size_t c[4];
        size_t n = check_linears(man, c);
        int kinds = (c[0] > 0) + (c[1] > 0) + (c[2] > 0);
        printf("auto target %llu: q4 %zu, q8 %zu, f16 %zu of %zu; total %llu\n",
               (unsigned long long)targets[k], c[0], c[1], c[2], n,
               (unsigned long long)total);
        assert_true(kinds >= 2);
        assert_int_equal(c[0] + c[1] + c[2], n);
        json_decref(man);
        mrun_ok(art);
        free(args);
        free(art);
    }
    /* a target below int4 everywhere is refused */
    char *args = tu_fmt("%s/llama --target 250000 --reserve 0 --quant auto "
                        "--max-batch 1 --max-seq 64 --calib %s -o %s/x.mca",
                        MC_FIXTURE_DIR, g_ids, g_dir);
    compile_fails(args, "int4", NULL);
    free(args);
}

static void test_compile_calib_usage_errors_exit_2(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "--target 64MiB --quant auto --max-batch 1 --max-seq 64", /* no calib */
        "--target 64MiB --quant auto --calib IDS",     /* no batch / seq */
        "--target 64MiB --quant f16 --calib IDS",      /* nothing to quantize */
        "--target 64MiB --quant int8 --method gptq",   /* method, no calib */
        "--target 64MiB --quant int8 --calib IDS --method nope",
        "--target 64MiB --quant int8 --heldout 2",     /* heldout, no calib */
        "--target 64MiB --quant int8 --calib IDS --heldout -1",
        "--target 64MiB --quant int8 --calib IDS --heldout 2x",
        "--target 64MiB --quant int8 --calib IDS --calib-device tpu",
        "--target 64MiB --quant int8 --calib-device cpu",  /* no calib */
        "--target 64MiB --quant int8 --calib IDS --calib-memory lots",
        "--target 64MiB --quant int8 --calib-memory 1GiB", /* no calib */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char opts[256];
        const char *p = strstr(bad[i], "IDS");
        if (p)
            snprintf(opts, sizeof opts, "%.*s%s%s", (int)(p - bad[i]), bad[i],
                     g_ids, p + 3);
        else
            snprintf(opts, sizeof opts, "%s", bad[i]);
        char *cmd = tu_fmt("%s/mcompile %s/llama %s -o %s/u.mca", MC_BIN_DIR,
                           MC_FIXTURE_DIR, opts, g_dir);
        char *err = NULL;
        int rc = tu_run(cmd, NULL, &err);
        if (rc != 2)
            fail_msg("'%s' exited %d, not 2: %s", opts, rc, err);
        free(err);
        free(cmd);
    }
    /* more held out than there are sequences (10): refused */
    char *many = tu_fmt("%s/llama --target 64MiB --quant int8 --calib %s "
                        "--heldout 10 -o %s/u.mca", MC_FIXTURE_DIR, g_ids, g_dir);
    compile_fails(many, "--heldout", NULL);
    free(many);
    /* --heldout 0 calibrates on every sequence (no summary); 3 holds 3 */
    for (int h = 0; h <= 3; h += 3) {
        char *art = tu_fmt("%s/h%d.mca", g_dir, h);
        char *args = tu_fmt("%s/llama --target 64MiB --quant int8 --calib %s "
                            "--method rtn --heldout %d -o %s", MC_FIXTURE_DIR,
                            g_ids, h, art);
        compile_ok(args);
        json_t *man = inspect_manifest(art);
        const json_t *cal = json_object_get(man, "calibration");
        assert_int_equal(
            json_integer_value(json_object_get(cal, "heldout_sequences")), h);
        assert_int_equal(json_integer_value(json_object_get(cal, "tokens")),
                         (10 - h) * 24);
        assert_true((json_object_get(cal, "heldout") != NULL) == (h > 0));
        /* the provenance names the calibration file's bytes */
        uint64_t xx;
        assert_int_equal(fmt_art_file_xxh3(g_ids, &xx, NULL), MC_OK);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)xx);
        assert_string_equal(json_string_value(json_object_get(cal, "ids_xxh3")), hex);
        struct stat sb;
        assert_int_equal(stat(g_ids, &sb), 0);
        assert_int_equal(json_integer_value(json_object_get(cal, "ids_bytes")),
                         sb.st_size);
        json_decref(man);
        free(args);
        free(art);
    }
    /* a budget nothing fits: refused before any work, with the breakdown */
    char *tight = tu_fmt("%s/llama --target 64MiB --quant int8 --calib %s "
                         "--calib-memory 4KiB -o %s/u.mca", MC_FIXTURE_DIR, g_ids,
                         g_dir);
    compile_fails(tight, "calibration needs", "--calib-memory");
    free(tight);
    /* ids out of the vocabulary: a format error naming the file */
    char *ids = tu_fmt("%s/big.ids", g_dir);
    assert_int_equal(tu_write_file(ids, "1 2 300\n", 8), 0);
    char *args = tu_fmt("%s/llama --target 64MiB --quant int8 --calib %s "
                        "-o %s/u.mca", MC_FIXTURE_DIR, ids, g_dir);
    compile_fails(args, "big.ids", NULL);
    free(args);
    free(ids);
}

/* First n lines of src into dst. */
static void head_lines(const char *src, const char *dst, int n)
{
    char *s = tu_read_file(src, NULL);
    assert_non_null(s);
    char *p = s;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    size_t len = p ? (size_t)(p - s) : strlen(s);
    assert_int_equal(tu_write_file(dst, s, len), 0);
    free(s);
}

static void test_compile_calib_lowers_kld_on_stories_int4_g32(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k absent (../shared/models/stories260k)");
    TU_SKIP_IF(getenv("MC_UNDER_SANITIZER") != NULL,
               "stories260k calibration skipped under the sanitizer (time)");
    char *calib_src = tu_fmt("%s/reference/calib_64x256.ids", sd);
    char *eval_src = tu_fmt("%s/reference/eval_64x256.ids", sd);
    char *calib = tu_fmt("%s/calib9.ids", g_dir);
    char *eval = tu_fmt("%s/eval8.ids", g_dir);
    head_lines(calib_src, calib, 9); /* 8 calibrate, 1 held out */
    head_lines(eval_src, eval, 8);
    char *rtn = tu_fmt("%s/s-rtn.mca", g_dir);
    char *cal = tu_fmt("%s/s-cal.mca", g_dir);
    char *a1 = tu_fmt("%s --target 64MiB --quant int4 --group 32 -o %s", sd,
                      rtn);
    char *a2 = tu_fmt("%s --target 64MiB --quant int4 --group 32 --calib %s "
                      "-o %s", sd, calib, cal);
    compile_ok(a1);
    compile_ok(a2);
    double k_rtn = eval_kld(rtn, sd, eval), k_cal = eval_kld(cal, sd, eval);
    printf("stories260k int4 g32 KLD on 8 held-out sequences: rtn %.5f, "
           "calibrated %.5f\n", k_rtn, k_cal);
    assert_true(k_cal < k_rtn);
    free(a1);
    free(a2);
    free(rtn);
    free(cal);
    free(calib);
    free(eval);
    free(calib_src);
    free(eval_src);
}

/* In-process cmp_compile with calibration: mode 0 RTN of a merged LoRA,
 * 1 auto, 2 gptq with its RTN baseline on 8 rows of each linear
 * (cmp_calib_opts.baseline_rows). */
static mc_status compile_calib_inproc(int mode, const char *ids,
                                      const char *out)
{
    int use_auto = mode == 1;
    char *model = tu_fmt("%s/llama", MC_FIXTURE_DIR);
    char *ad = tu_fmt("%s/adapters/llama-plain", MC_FIXTURE_DIR);
    cmp_adapter_spec spec = {ad, 1.0};
    cmp_compile_opts o;
    memset(&o, 0, sizeof o);
    cmp_plan_request_default(&o.req);
    mc_status st = cmp_wpolicy_parse("int4", 32, &o.req.policy, NULL);
    o.req.max_batch = 1;
    o.req.max_seq = 64;
    o.req.target_bytes = use_auto ? 370000 : 64ull << 20;
    o.req.reserve_bytes = 0; /* the auto target is sized for weights alone */
    o.model = model;
    o.out = out;
    o.calib = ids;
    o.method = CMP_QM_RTN; /* the compile's own paths (stage, merge, auto,
                              emit) at a fraction of best's time */
    if (mode == 2) {
        o.method = CMP_QM_GPTQ;
        o.calib_baseline_rows = 8;
    }
    o.quant_auto = use_auto;
    o.rotate = 1; /* as the CLI does: the rotation's allocations too */
    o.threads = 1;
    if (mode == 0) {
        o.adapters = &spec;
        o.n_adapters = 1;
    }
    mc_error err;
    if (st == MC_OK)
        st = cmp_compile(&o, NULL, &err);
    free(ad);
    free(model);
    return st;
}

/* The manifest of a gptq compile with its RTN baseline on 8 rows
 * (compile_calib_inproc mode 2): every linear of more than 15 rows says
 * on how many rows its err_rtn was measured, the others do not. */
static void check_sampled_baselines(const char *art)
{
    json_t *man = inspect_manifest(art);
    const json_t *ts = json_object_get(man, "tensors");
    size_t i, sampled = 0;
    json_t *t;
    json_array_foreach(ts, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!strstr(name, "_proj.weight"))
            continue;
        json_int_t rows = json_integer_value(json_array_get(json_object_get(t, "shape"), 0));
        const json_t *n = json_object_get(t, "err_rtn_rows");
        assert_true(rows > 0);
        assert_int_equal(json_string_value(json_object_get(t, "method"))[0], 'g');
        if (rows < 16) {
            assert_null(n);
            continue;
        }
        json_int_t stride = rows / 8;
        assert_true(json_is_integer(n));
        assert_int_equal(json_integer_value(n), (rows + stride - 1) / stride);
        sampled++;
    }
    assert_true(sampled > 0);
    json_decref(man);
}

static void test_compile_calib_survives_every_failed_allocation(void **state)
{
    (void)state;
    char *ids = tu_fmt("%s/small.ids", g_dir);
    const char *txt = "1 5 9 200 17 3 44 81\n2 6 10 100 7 30 4 8\n"
                      "3 7 11 12 13 14 15 16\n";
    assert_int_equal(tu_write_file(ids, txt, strlen(txt)), 0);
    char *out = tu_fmt("%s/chaos.mca", g_dir);
    for (int mode = 0; mode < 3; mode++) {
        mc_alloc_fail_after(-1);
        mc_alloc_reset_count();
        assert_int_equal(compile_calib_inproc(mode, ids, out), MC_OK);
        uint64_t count = mc_alloc_count();
        assert_true(count > 10);
        printf("calibrated compile (mode %d): %llu allocations\n", mode,
               (unsigned long long)count);
        if (mode == 2)
            check_sampled_baselines(out);
        /* the first 8 (opening), then an even spread (time);
         * MC_FA_EXHAUSTIVE=1: every one */
        uint64_t points = getenv("MC_UNDER_SANITIZER") ? 24 : 48;
        uint64_t step = count > points ? count / points : 1;
        if (getenv("MC_FA_EXHAUSTIVE"))
            step = 1;
        for (uint64_t k = 0; k < count; k += k < 8 ? 1 : step) {
            mc_alloc_fail_after((long)k);
            mc_status st = compile_calib_inproc(mode, ids, out);
            int injected = mc_alloc_failure_injected();
            mc_alloc_fail_after(-1);
            if (injected && st == MC_OK)
                fail_msg("allocation %llu of %llu failed but compile "
                         "returned OK (mode %d)", (unsigned long long)k,
                         (unsigned long long)count, mode);
        }
    }
    free(out);
    free(ids);
}

/* --json reports each phase's seconds; they do not overlap, so they add
 * up to no more than the calibration's total.  best (the proxies) runs
 * fewer candidates than best-all and is recorded as asked. */
static void test_compile_calib_reports_phase_times(void **state)
{
    (void)state;
    static const char *const meth[2] = {"best", "best-all"};
    double total[2];
    for (int k = 0; k < 2; k++) {
        char *art = tu_fmt("%s/llama-%s.mca", g_dir, meth[k]);
        char *out = NULL, *err = NULL;
        /* int8: one GPTQ pass per candidate, the cheapest that times
         * every phase */
        char *cmd = tu_fmt("%s/mcompile %s/llama --target 64MiB --quant int8 "
                           "--calib %s --method %s --json -o %s",
                           MC_BIN_DIR, MC_FIXTURE_DIR, g_ids, meth[k], art);
        int rc = tu_run(cmd, &out, &err);
        if (rc != 0)
            fail_msg("%s failed (%d): %s", cmd, rc, err);
        json_t *j = json_loads(out, 0, NULL);
        assert_non_null(j);
        const json_t *cal = json_object_get(j, "calibration");
        assert_string_equal(json_string_value(json_object_get(cal, "method")),
                            meth[k]);
        const json_t *ph = json_object_get(cal, "phase_seconds");
        static const char *const parts[6] = {"forward", "statistics",
                                             "factorization", "search", "ends",
                                             "write"};
        double sum = 0.0;
        for (int p = 0; p < 6; p++) {
            const json_t *v = json_object_get(ph, parts[p]);
            assert_true(json_is_number(v));
            assert_true(json_number_value(v) >= 0.0);
            if (p < 5)
                sum += json_number_value(v);
        }
        total[k] = json_number_value(json_object_get(ph, "total"));
        assert_true(total[k] > 0.0);
        assert_true(sum <= total[k] * 1.001 + 1e-3);
        /* the quantization was timed: GPTQ-family candidates ran */
        assert_true(json_number_value(json_object_get(ph, "search")) > 0.0);
        assert_true(json_number_value(json_object_get(ph, "factorization")) > 0.0);
        /* the same phases in CPU seconds of all threads: the quantizing
         * used some, and no phase used more than its wall time on every
         * CPU (the default pool has one thread per CPU it may use) */
        const json_t *pc = json_object_get(cal, "phase_cpu_seconds");
        double cpu_sum = 0.0;
        for (int p = 0; p < 5; p++) {
            const json_t *v = json_object_get(pc, parts[p]);
            assert_true(json_is_number(v));
            assert_true(json_number_value(v) >= 0.0);
            cpu_sum += json_number_value(v);
        }
        assert_true(json_number_value(json_object_get(pc, "search")) > 0.0);
        assert_true(cpu_sum <= total[k] * (double)kn_cpu_count() * 1.05 + 0.05);
        json_t *man = inspect_manifest(art);
        assert_string_equal(json_string_value(json_object_get(
                                json_object_get(man, "calibration"), "method")),
                            meth[k]);
        json_decref(man);
        json_decref(j);
        free(out);
        free(err);
        free(cmd);
        free(art);
    }
    print_message("phase times: best %.3f s, best-all %.3f s\n", total[0],
                  total[1]);
}

/* Before calibrating, mcompile prints its plan on stderr (also with
 * --json, whose object repeats it): the peak RSS is the sum of its parts,
 * the source part is the fixture's float32 matrices, the estimate is
 * positive, and the child's measured peak RSS stays under the plan. */
static void test_compile_calib_prints_plan_before_start(void **state)
{
    (void)state;
    char *art = tu_fmt("%s/llama-plan.mca", g_dir), *out = NULL, *err = NULL;
    char *cmd = tu_fmt("%s/mcompile %s/llama --target 64MiB --quant int4 "
                       "--calib %s --json -o %s", MC_BIN_DIR, MC_FIXTURE_DIR,
                       g_ids, art);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0)
        fail_msg("%s failed (%d): %s", cmd, rc, err);
    assert_non_null(strstr(err, "calibration plan: peak RSS"));
    assert_non_null(strstr(err, "calibration plan: time ~"));
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    const json_t *p = json_object_get(json_object_get(j, "calibration"), "plan");
#define PLAN_I(k) ((uint64_t)json_integer_value(json_object_get(p, k)))
    uint64_t rss = PLAN_I("peak_rss_bytes");
    assert_true(PLAN_I("alloc_peak_bytes") > PLAN_I("states_bytes"));
    /* the larger of the layers' phase and the ends' (cmp_calib.h): the
     * spill is mapped at the ends, beside the ends' allocations only */
    assert_true(PLAN_I("alloc_ends_peak_bytes") > 0 &&
                PLAN_I("alloc_ends_peak_bytes") <= PLAN_I("alloc_peak_bytes"));
    uint64_t layers = PLAN_I("alloc_peak_bytes") + PLAN_I("source_layers_bytes") +
                      PLAN_I("program_bytes");
    uint64_t ends = PLAN_I("alloc_ends_peak_bytes") + PLAN_I("source_ends_bytes") +
                    PLAN_I("spill_bytes") + PLAN_I("program_bytes");
    assert_int_equal(rss, layers > ends ? layers : ends);
    assert_true(PLAN_I("source_layers_bytes") < PLAN_I("source_bytes"));
    /* the held-out evaluation (the default) runs with the layers: the ends
     * read only the embeddings and output layer, not the whole source */
    assert_true(PLAN_I("source_ends_bytes") < PLAN_I("source_bytes"));
    assert_true(json_is_number(json_object_get(json_object_get(j, "calibration"),
                                               "heldout_kld_mean")));
    /* the fixture: float32 embed + 2 layers' linears, tied */
    struct stat sb;
    char *st = tu_fmt("%s/llama/model.safetensors", MC_FIXTURE_DIR);
    assert_int_equal(stat(st, &sb), 0);
    assert_true(PLAN_I("source_bytes") > 0 &&
                PLAN_I("source_bytes") <= (uint64_t)sb.st_size);
#undef PLAN_I
    assert_true(json_number_value(json_object_get(p, "seconds")) > 0.0);
    assert_true(json_number_value(json_object_get(p, "rate_madds_per_s")) > 1e6);
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_CHILDREN, &ru), 0);
    print_message("plan peak RSS %.1f MiB, children's peak %.1f MiB\n",
                  rss / 1048576.0, ru.ru_maxrss / 1024.0);
    if (!getenv("MC_UNDER_SANITIZER")) /* shadow memory is not the plan's */
        assert_true((uint64_t)ru.ru_maxrss * 1024 <= rss);
    json_decref(j);
    free(st);
    free(out);
    free(err);
    free(cmd);
    free(art);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_calib_int8_fixtures_verify_run_and_record),
        cmocka_unit_test(test_compile_calib_reports_phase_times),
        cmocka_unit_test(test_compile_calib_prints_plan_before_start),
        cmocka_unit_test(test_compile_calib_with_lora_calibrates_merged_weights),
        cmocka_unit_test(test_compile_calib_rotation_unties_and_records),
        cmocka_unit_test(test_compile_calib_int4_output_layer),
        cmocka_unit_test(test_compile_calib_text_file_through_tokenizer),
        cmocka_unit_test(test_compile_auto_fits_target_and_mixes_formats),
        cmocka_unit_test(test_compile_calib_usage_errors_exit_2),
        cmocka_unit_test(test_compile_calib_survives_every_failed_allocation),
        cmocka_unit_test(test_compile_calib_lowers_kld_on_stories_int4_g32),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

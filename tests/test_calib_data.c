/*
 * test_calib_data.c - calibration files as token ids or text
 * (compiler/cmp_calib_data.h): the detection rule, ids read exactly as
 * fmt_ids_load reads them, text tokenized like the runtime tokenizer does
 * (paragraphs, BOS, cutting at max_seq, the short tail), where the
 * tokenizer is looked for, every error naming the file, allocation
 * failures, and the real Mistral tokenizer in ../shared (skipped when
 * absent).  No generated fixture model ships a tokenizer.json, so the
 * small tokenizers here are written into temporary model directories.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_calib_data.h"
#include "fmt_ids.h"
#include "mc_alloc.h"
#include "rt_tokenizer.h"
#include "testutil.h"
#include "tok_fixture.h"

#define MS "\xE2\x96\x81" /* U+2581, the SentencePiece space */

/* A temporary model directory holding tokenizer.json (with_bos 1 or 0),
 * or none (with_bos < 0).  Only tokenizer.json matters to the loader. */
static char *model_dir(int with_bos)
{
    char *dir = tu_mkdtemp("calibdata");
    if (with_bos >= 0) {
        char *json = tu_spm_tokenizer_json(with_bos);
        char *p = tu_fmt("%s/tokenizer.json", dir);
        assert_int_equal(tu_write_file(p, json, strlen(json)), 0);
        free(p);
        free(json);
    }
    return dir;
}

static char *write_in(const char *dir, const char *name, const char *text)
{
    char *p = tu_fmt("%s/%s", dir, name);
    assert_int_equal(tu_write_file(p, text, strlen(text)), 0);
    return p;
}

static rt_tokenizer *tokenizer_in(const char *dir)
{
    char *p = tu_fmt("%s/tokenizer.json", dir);
    rt_tokenizer *t = NULL;
    assert_int_equal(rt_tokenizer_load(p, &t, NULL), MC_OK);
    free(p);
    return t;
}

static fmt_ids *load_ok(const char *path, const char *model, uint32_t vocab,
                        uint32_t max_seq, int want_text)
{
    fmt_ids *f = NULL;
    int was_text = -1;
    mc_error e;
    mc_error_clear(&e);
    mc_status r = cmp_calib_data_load(path, model, vocab, max_seq, &f,
                                      &was_text, NULL, &e);
    if (r) {
        char buf[1600];
        print_error("%s\n", mc_error_format(&e, buf, sizeof buf));
    }
    assert_int_equal(r, MC_OK);
    assert_non_null(f);
    assert_int_equal(was_text, want_text);
    /* the layout fmt_ids_load returns */
    assert_true(f->n_seqs >= 1);
    assert_int_equal(f->offsets[0], 0);
    assert_int_equal(f->offsets[f->n_seqs], f->n_ids);
    for (size_t i = 0; i < f->n_seqs; i++)
        assert_true(f->offsets[i] < f->offsets[i + 1]);
    return f;
}

static mc_status load_err(const char *path, const char *model, uint32_t vocab,
                          mc_error *e)
{
    static fmt_ids sentinel;
    fmt_ids *f = &sentinel; /* must be reset to NULL */
    int was_text = -1;
    mc_error_clear(e);
    mc_status r = cmp_calib_data_load(path, model, vocab, 0, &f, &was_text, NULL, e);
    assert_int_not_equal(r, MC_OK);
    assert_null(f);
    assert_int_equal(r, e->status);
    return r;
}

static void expect_same_ids(const fmt_ids *a, const fmt_ids *b)
{
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->n_ids, b->n_ids);
    assert_memory_equal(a->offsets, b->offsets,
                        (a->n_seqs + 1) * sizeof *a->offsets);
    assert_memory_equal(a->ids, b->ids, a->n_ids * sizeof *a->ids);
}

/* What the text should become before cutting: [BOS] + encode(doc) per
 * paragraph, as the runtime tokenizer encodes it.  *n gets the count;
 * starts (if non-NULL, ndocs + 1 entries) where each paragraph begins. */
static int32_t *expected_stream_at(const rt_tokenizer *t,
                                   const char *const *docs, size_t ndocs,
                                   size_t *n, size_t *starts)
{
    int32_t bos = rt_tokenizer_bos(t);
    size_t cap = 16, len = 0;
    for (size_t i = 0; i < ndocs; i++)
        cap += strlen(docs[i]) * 4 + 32;
    int32_t *ids = malloc(cap * sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < ndocs; i++) {
        size_t k = 0;
        if (starts)
            starts[i] = len;
        if (bos >= 0)
            ids[len++] = bos;
        assert_int_equal(rt_tokenizer_encode(t, docs[i], strlen(docs[i]), 0,
                                             ids + len, cap - len, &k, NULL),
                         MC_OK);
        len += k;
    }
    if (starts)
        starts[ndocs] = len;
    *n = len;
    return ids;
}

static int32_t *expected_stream(const rt_tokenizer *t,
                                const char *const *docs, size_t ndocs,
                                size_t *n)
{
    return expected_stream_at(t, docs, ndocs, n, NULL);
}

/* f holds exactly want[0..n) cut at max_seq (no tail dropped). */
static void expect_cut(const fmt_ids *f, const int32_t *want, size_t n,
                       size_t max_seq)
{
    assert_int_equal(f->n_ids, n);
    assert_memory_equal(f->ids, want, n * sizeof *want);
    assert_int_equal(f->n_seqs, (n + max_seq - 1) / max_seq);
    for (size_t i = 0; i < f->n_seqs; i++)
        assert_int_equal(f->offsets[i], i * max_seq);
}

/* One paragraph of n 'a's: "▁" + n letters (+ BOS) ids. */
static char *word(size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    memset(s, 'a', n);
    s[n] = 0;
    return s;
}

/* ---- ids ----------------------------------------------------------------- */

static void test_calib_data_ids_file_matches_fmt_ids_load(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    const char *texts[] = {
        "1 2 3\n4\t5\n",
        "# calibration set\n\n  # indented comment x y z\n1 2\r\n \t \n3",
        "  007   2147483647  \n",
        "5",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        char *p = write_in(dir, "c.ids", texts[i]);
        fmt_ids *want = NULL, *got;
        assert_int_equal(fmt_ids_load(p, 0, &want, NULL), MC_OK);
        /* the tokenizer beside the model is not used for ids */
        got = load_ok(p, dir, 0, 4, 0);
        expect_same_ids(got, want);
        fmt_ids_free(got);
        /* ids need no model at all */
        got = load_ok(p, NULL, 0, 0, 0);
        expect_same_ids(got, want);
        fmt_ids_free(got);
        fmt_ids_free(want);
        free(p);
    }
    /* range errors are fmt_ids_load's, word for word */
    char *p = write_in(dir, "c.ids", "1 2\n3 400\n");
    mc_error e1, e2;
    fmt_ids *f = NULL;
    assert_int_equal(fmt_ids_load(p, 300, &f, &e1), MC_ERR_FORMAT);
    assert_int_equal(load_err(p, dir, 300, &e2), MC_ERR_FORMAT);
    assert_string_equal(e1.file, e2.file);
    assert_string_equal(e1.message, e2.message);
    assert_int_equal(e1.offset, e2.offset);
    /* so is an id too large for int32 (still ids, not text) */
    free(p);
    p = write_in(dir, "c.ids", "1 99999999999\n");
    assert_int_equal(fmt_ids_load(p, 0, &f, &e1), MC_ERR_FORMAT);
    assert_int_equal(load_err(p, dir, 0, &e2), MC_ERR_FORMAT);
    assert_string_equal(e1.message, e2.message);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_reads_stories260k_ids_as_ids(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k absent in ../shared/models");
    char *p = tu_fmt("%s/reference/greedy_from_bos.ids", sd);
    TU_SKIP_IF(!tu_exists(p), "stories260k has no reference ids");
    fmt_ids *want = NULL;
    assert_int_equal(fmt_ids_load(p, 512, &want, NULL), MC_OK);
    fmt_ids *got = load_ok(p, sd, 512, 0, 0);
    expect_same_ids(got, want);
    fmt_ids_free(got);
    fmt_ids_free(want);
    free(p);
}

/* ---- detection --------------------------------------------------------- */

static void test_calib_data_digits_with_a_word_are_text(void **state)
{
    (void)state;
    char *dir = model_dir(1), *bare = model_dir(-1);
    rt_tokenizer *t = tokenizer_in(dir);
    const char *const docs[] = {"12 34 x"};
    char *p = write_in(dir, "c.txt", "12 34 x\n");
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    size_t n;
    int32_t *want = expected_stream(t, docs, 1, &n);
    expect_cut(f, want, n, 512);
    assert_int_equal(f->ids[0], 1); /* BOS */
    free(want);
    fmt_ids_free(f);
    /* without a tokenizer the error says which line made it text */
    mc_error e;
    char *q = write_in(bare, "c.txt", "1 2 3\n# note\n12 34 x\n");
    assert_int_equal(load_err(q, bare, 0, &e), MC_ERR_NOT_FOUND);
    assert_non_null(strstr(e.message, "line 3 is not token ids"));
    assert_int_equal(e.offset, 13);
    free(q);
    /* a file of comments only is text too ("# ..." is a heading) */
    q = write_in(bare, "c.txt", "# Heading\n\n# another\n");
    assert_int_equal(load_err(q, bare, 0, &e), MC_ERR_NOT_FOUND);
    assert_non_null(strstr(e.message, "no line holds token ids"));
    free(q);
    /* a negative number, a sign or a comma is text */
    const char *texts[] = {"1 -2\n", "+1\n", "1,2\n", "1 2 #x\n", "1\f2\n"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        q = write_in(bare, "c.txt", texts[i]);
        assert_int_equal(load_err(q, bare, 0, &e), MC_ERR_NOT_FOUND);
        assert_non_null(strstr(e.message, "line 1 is not token ids"));
        free(q);
    }
    rt_tokenizer_free(t);
    free(p);
    tu_rmtree(dir);
    tu_rmtree(bare);
    free(dir);
    free(bare);
}

/* ---- text ---------------------------------------------------------------- */

static void test_calib_data_text_matches_runtime_tokenizer(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    rt_tokenizer *t = tokenizer_in(dir);
    assert_int_equal(rt_tokenizer_bos(t), 1);
    /* paragraphs at blank lines (one, several, blank-but-spaces, CRLF);
     * inner newlines stay; the last line's newline does not */
    const char *text = "\n\nhello world\nsecond line\n\n\n"
                       "  indented para\r\n \t\r\n"
                       "caf\xC3\xA9 \xF0\x9F\x98\x80 <s> x\r\n"
                       "\n"
                       "last";
    const char *const docs[] = {"hello world\nsecond line", "  indented para",
                                "caf\xC3\xA9 \xF0\x9F\x98\x80 <s> x", "last"};
    /* decoding drops one leading space (Metaspace "first" adds none when
     * the text starts with one, the Strip decoder removes one) */
    const char *const decoded[] = {docs[0], " indented para", docs[2],
                                   docs[3]};
    char *p = write_in(dir, "c.txt", text);
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, 100000, 1);
    size_t n, starts[5];
    int32_t *want = expected_stream_at(t, docs, 4, &n, starts);
    expect_cut(f, want, n, 100000);
    /* each paragraph is BOS + ids that decode back to it ("<s>" in the
     * text is the special token, so BOS ids alone do not mark paragraphs) */
    for (size_t d = 0; d < 4; d++) {
        assert_int_equal(f->ids[starts[d]], 1);
        char buf[256];
        size_t len;
        assert_int_equal(rt_tokenizer_decode(t, f->ids + starts[d] + 1,
                                             starts[d + 1] - starts[d] - 1, 0,
                                             buf, sizeof buf, &len),
                         MC_OK);
        assert_string_equal(buf, decoded[d]);
    }
    free(want);
    fmt_ids_free(f);
    rt_tokenizer_free(t);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_text_without_bos_adds_none(void **state)
{
    (void)state;
    char *dir = model_dir(0);
    rt_tokenizer *t = tokenizer_in(dir);
    assert_int_equal(rt_tokenizer_bos(t), -1);
    const char *const docs[] = {"abc", "de f"};
    char *p = write_in(dir, "c.txt", "abc\n\nde f\n");
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    size_t n;
    int32_t *want = expected_stream(t, docs, 2, &n);
    assert_int_equal(n, 4 + 5);
    expect_cut(f, want, n, 512);
    const int32_t literal[] = {TU_SPM_SPACE, TU_SPM_A + 0, TU_SPM_A + 1, TU_SPM_A + 2, TU_SPM_SPACE,
                               TU_SPM_A + 3, TU_SPM_A + 4, TU_SPM_SPACE, TU_SPM_A + 5};
    assert_memory_equal(f->ids, literal, sizeof literal);
    free(want);
    fmt_ids_free(f);
    /* a tokenizer_config.json beside it can name a BOS */
    char *cfg = write_in(dir, "tokenizer_config.json",
                         "{\"bos_token\": \"</s>\"}");
    f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    assert_int_equal(f->n_ids, 2 + 9);
    assert_int_equal(f->ids[0], 2);
    assert_int_equal(f->ids[5], 2);
    fmt_ids_free(f);
    free(cfg);
    rt_tokenizer_free(t);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_cuts_text_at_max_seq(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    rt_tokenizer *t = tokenizer_in(dir);
    /* 38 + 40 letters: BOS ▁ 38 a, BOS ▁ 40 a = 40 + 42 = 82 ids */
    char *w1 = word(38), *w2 = word(40);
    char *text = tu_fmt("%s\n\n%s\n", w1, w2);
    const char *const docs[] = {w1, w2};
    char *p = write_in(dir, "c.txt", text);
    size_t n;
    int32_t *want = expected_stream(t, docs, 2, &n);
    assert_int_equal(n, 82);
    const uint32_t seqs[] = {41, 82, 1000, 20}; /* tails 0, 0, alone; 2 */
    for (size_t i = 0; i < 3; i++) {
        fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, seqs[i], 1);
        expect_cut(f, want, n, seqs[i]);
        fmt_ids_free(f);
    }
    /* 82 = 4 x 20 + 2: the 2-token tail goes */
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, seqs[3], 1);
    expect_cut(f, want, 80, 20);
    fmt_ids_free(f);
    /* 82 = 2 x 33 + 16: a tail of exactly 16 stays */
    f = load_ok(p, dir, TU_SPM_VOCAB, 33, 1);
    expect_cut(f, want, 82, 33);
    assert_int_equal(f->n_seqs, 3);
    fmt_ids_free(f);
    /* 82 = 2 x 34 + 14: 14 goes; the sequence crossing the paragraph
     * boundary holds the second BOS in the middle */
    f = load_ok(p, dir, TU_SPM_VOCAB, 34, 1);
    expect_cut(f, want, 68, 34);
    assert_int_equal(f->ids[40], 1);
    fmt_ids_free(f);
    free(want);
    free(p);
    free(text);
    free(w1);
    free(w2);
    /* max_seq 0 is 512: 1200 letters -> 1202 ids = 512 + 512 + 178 */
    w1 = word(1200);
    p = write_in(dir, "c.txt", w1);
    const char *const one[] = {w1};
    want = expected_stream(t, one, 1, &n);
    assert_int_equal(n, 1202);
    f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    expect_cut(f, want, n, 512);
    assert_int_equal(f->n_seqs, 3);
    fmt_ids_free(f);
    free(want);
    free(p);
    free(w1);
    rt_tokenizer_free(t);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_keeps_a_short_text_when_alone(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    /* "ab" -> BOS ▁ a b: 4 ids, under 16, but the only sequence */
    char *p = write_in(dir, "c.txt", "ab\n");
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    assert_int_equal(f->n_seqs, 1);
    assert_int_equal(f->n_ids, 4);
    const int32_t want[] = {1, TU_SPM_SPACE, TU_SPM_A, TU_SPM_A + 1};
    assert_memory_equal(f->ids, want, sizeof want);
    fmt_ids_free(f);
    /* max_seq 3: one full piece of 3, the 1-id tail dropped */
    f = load_ok(p, dir, TU_SPM_VOCAB, 3, 1);
    assert_int_equal(f->n_seqs, 1);
    assert_int_equal(f->n_ids, 3);
    assert_memory_equal(f->ids, want, 3 * sizeof *want);
    fmt_ids_free(f);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_finds_tokenizer_for_each_model_path_form(
    void **state)
{
    (void)state;
    char *dir = model_dir(1);
    char *p = write_in(dir, "c.txt", "abc\n");
    char *st = write_in(dir, "model.safetensors", "");
    char *ix = write_in(dir, "model.safetensors.index.json", "{}");
    char *slash = tu_fmt("%s/", dir);
    const char *forms[] = {dir, slash, st, ix};
    for (size_t i = 0; i < 4; i++) {
        fmt_ids *f = load_ok(p, forms[i], TU_SPM_VOCAB, 0, 1);
        assert_int_equal(f->n_ids, 5);
        fmt_ids_free(f);
    }
    /* the directory of a file, not the file's own name */
    mc_error e;
    char *sub = tu_fmt("%s/sub", dir);
    char *in_sub = tu_fmt("%s/sub/model.safetensors", dir);
    assert_int_equal(load_err(p, in_sub, 0, &e), MC_ERR_NOT_FOUND);
    assert_non_null(strstr(e.message, sub));
    free(sub);
    free(in_sub);
    free(slash);
    free(st);
    free(ix);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

/* ---- errors -------------------------------------------------------------- */

static void test_calib_data_text_without_tokenizer_names_file(void **state)
{
    (void)state;
    char *dir = model_dir(-1);
    char *p = write_in(dir, "notes.txt", "Some calibration text.\n");
    mc_error e;
    assert_int_equal(load_err(p, dir, 1000, &e), MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.message, "tokenizer.json next to the model"));
    assert_non_null(strstr(e.message, "token ids"));
    char *tp = tu_fmt("%s/tokenizer.json", dir);
    assert_non_null(strstr(e.message, tp));
    free(tp);
    char buf[1600];
    assert_non_null(strstr(mc_error_format(&e, buf, sizeof buf), "notes.txt"));
    /* no model path at all */
    assert_int_equal(load_err(p, NULL, 1000, &e), MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.message, "tokenizer.json"));
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_reports_broken_tokenizer(void **state)
{
    (void)state;
    char *dir = model_dir(-1);
    char *tp = write_in(dir, "tokenizer.json", "{\"model\": 3}");
    char *p = write_in(dir, "c.txt", "abc\n");
    mc_error e;
    assert_int_equal(load_err(p, dir, 0, &e), MC_ERR_FORMAT);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.message, "tokenizer does not load"));
    assert_non_null(strstr(e.message, tp));
    free(tp);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_rejects_empty_files(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    const char *texts[] = {"", "\n", "  \n\t\r\n\n  "};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        char *p = write_in(dir, "c.txt", texts[i]);
        mc_error e;
        assert_int_equal(load_err(p, dir, 0, &e), MC_ERR_FORMAT);
        assert_string_equal(e.file, p);
        assert_non_null(strstr(e.message, "empty"));
        free(p);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_rejects_ids_outside_vocab_from_text(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    char *p = write_in(dir, "c.txt", "ab\n\nhello\n");
    mc_error e;
    /* ▁ is 259: a 259-token model cannot take this tokenizer's text */
    assert_int_equal(load_err(p, dir, 259, &e), MC_ERR_FORMAT);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.message, "line 1"));
    assert_non_null(strstr(e.message, "259"));
    assert_int_equal(e.offset, 0);
    /* the BOS is checked too */
    assert_int_equal(load_err(p, dir, 1, &e), MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "BOS"));
    /* 286 is enough (largest id 285) */
    fmt_ids *f = load_ok(p, dir, TU_SPM_VOCAB, 0, 1);
    fmt_ids_free(f);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_rejects_files_over_1_gib(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    char *p = tu_fmt("%s/big.txt", dir);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    /* sparse: no disk used */
    assert_int_equal(ftruncate(fileno(fp), (off_t)CMP_CALIB_DATA_MAX_BYTES + 1),
                     0);
    fclose(fp);
    mc_error e;
    assert_int_equal(load_err(p, dir, 0, &e), MC_ERR_UNSUPPORTED);
    assert_string_equal(e.file, p);
    assert_non_null(strstr(e.message, "1 GiB"));
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_rejects_nul_bytes_and_missing_files(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    char *p = tu_fmt("%s/c.bin", dir);
    assert_int_equal(tu_write_file(p, "abc\0def", 7), 0);
    mc_error e;
    assert_int_equal(load_err(p, dir, 0, &e), MC_ERR_FORMAT);
    assert_string_equal(e.file, p);
    assert_int_equal(e.offset, 3);
    assert_non_null(strstr(e.message, "NUL"));
    free(p);
    p = tu_fmt("%s/absent.txt", dir);
    assert_int_equal(load_err(p, dir, 0, &e), MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, p);
    free(p);
    assert_int_equal(load_err(dir, dir, 0, &e), MC_ERR_IO); /* a directory */
    fmt_ids *f = NULL;
    assert_int_equal(cmp_calib_data_load(NULL, dir, 0, 0, &f, NULL, NULL, &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(cmp_calib_data_load("x", dir, 0, 0, NULL, NULL, NULL, NULL),
                     MC_ERR_INVALID_ARG);
    tu_rmtree(dir);
    free(dir);
}

static void test_calib_data_survives_allocation_failures(void **state)
{
    (void)state;
    char *dir = model_dir(1);
    char *w = word(700);
    char *text = tu_fmt("abc de\n\n%s\n\nxyz \xC3\xA9\n", w);
    char *pt = write_in(dir, "c.txt", text);
    char *pi = write_in(dir, "c.ids", "1 2 3\n4 5\n");
    const char *paths[] = {pt, pi};
    for (int k = 0; k < 2; k++) {
        fmt_ids *want = load_ok(paths[k], dir, TU_SPM_VOCAB, 100, !k);
        int done = 0;
        for (long j = 0; !done && j < 100000; j++) {
            fmt_ids *f = NULL;
            mc_error e;
            mc_alloc_fail_after(j);
            mc_status r = cmp_calib_data_load(paths[k], dir, TU_SPM_VOCAB, 100, &f,
                                              NULL, NULL, &e);
            mc_alloc_fail_after(-1);
            if (r == MC_OK) {
                expect_same_ids(f, want);
                fmt_ids_free(f);
                done = 1;
                continue;
            }
            if (r != MC_ERR_NOMEM)
                print_error("fail_after(%ld): status %d: %s\n", j, r,
                            e.message);
            assert_int_equal(r, MC_ERR_NOMEM);
            assert_null(f);
            assert_string_equal(e.file, paths[k]);
        }
        assert_true(done);
        fmt_ids_free(want);
    }
    free(pt);
    free(pi);
    free(text);
    free(w);
    tu_rmtree(dir);
    free(dir);
}

/* ---- the real Mistral tokenizer ---------------------------------------- */

static void test_calib_data_mistral_text(void **state)
{
    (void)state;
    char *mdir = tu_fmt("%s/tokenizers/mistral-7b-instruct-v0.1", MC_SHARED_DIR);
    char *tp = tu_fmt("%s/tokenizer.json", mdir);
    int have = tu_exists(tp);
    free(tp);
    if (!have) {
        free(mdir);
        TU_SKIP_IF(1, "mistral-7b-instruct-v0.1/tokenizer.json absent in "
                      "../shared/tokenizers");
    }
    rt_tokenizer *t = tokenizer_in(mdir);
    assert_int_equal(rt_tokenizer_bos(t), 1);
    char *dir = tu_mkdtemp("calibdata");
    const char *const docs[] = {
        "Once upon a time, there was a little girl named Lily.\nShe liked "
        "to play outside.",
        "The quick brown fox jumps over the lazy dog.",
        "naïve café, 日本語の文章です。 emoji \xF0\x9F\x98\x80 done",
    };
    char *text = tu_fmt("%s\n\n%s\r\n\r\n\r\n%s\n", docs[0], docs[1], docs[2]);
    char *p = write_in(dir, "c.txt", text);
    size_t n;
    int32_t *want = expected_stream(t, docs, 3, &n);
    assert_int_equal(want[0], 1);
    /* the model path as a (nonexistent) weights file in that directory */
    char *model = tu_fmt("%s/model.safetensors", mdir);
    fmt_ids *f = load_ok(p, model, 32000, 0, 1);
    expect_cut(f, want, n, 512);
    fmt_ids_free(f);
    /* cut small: same stream, tail rule applied */
    f = load_ok(p, model, 32000, 16, 1);
    size_t keep = n % 16 ? n - n % 16 : n;
    expect_cut(f, want, keep, 16);
    fmt_ids_free(f);
    free(model);
    free(want);
    free(p);
    free(text);
    rt_tokenizer_free(t);
    tu_rmtree(dir);
    free(dir);
    free(mdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calib_data_ids_file_matches_fmt_ids_load),
        cmocka_unit_test(test_calib_data_reads_stories260k_ids_as_ids),
        cmocka_unit_test(test_calib_data_digits_with_a_word_are_text),
        cmocka_unit_test(test_calib_data_text_matches_runtime_tokenizer),
        cmocka_unit_test(test_calib_data_text_without_bos_adds_none),
        cmocka_unit_test(test_calib_data_cuts_text_at_max_seq),
        cmocka_unit_test(test_calib_data_keeps_a_short_text_when_alone),
        cmocka_unit_test(
            test_calib_data_finds_tokenizer_for_each_model_path_form),
        cmocka_unit_test(test_calib_data_text_without_tokenizer_names_file),
        cmocka_unit_test(test_calib_data_reports_broken_tokenizer),
        cmocka_unit_test(test_calib_data_rejects_empty_files),
        cmocka_unit_test(test_calib_data_rejects_ids_outside_vocab_from_text),
        cmocka_unit_test(test_calib_data_rejects_files_over_1_gib),
        cmocka_unit_test(test_calib_data_rejects_nul_bytes_and_missing_files),
        cmocka_unit_test(test_calib_data_survives_allocation_failures),
        cmocka_unit_test(test_calib_data_mistral_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

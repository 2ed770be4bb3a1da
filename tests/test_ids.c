/*
 * test_ids.c - token-id files (formats/fmt_ids.h): the grammar, every error
 * with its line/column/offset, allocation failures, and the stories260k
 * reference files in ../shared (skipped when absent).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_ids.h"
#include "mc_alloc.h"
#include "testutil.h"

static fmt_ids *parse_ok(const char *text, uint32_t vocab)
{
    fmt_ids *f = NULL;
    mc_error e;
    mc_status r = fmt_ids_parse(text, strlen(text), "t.ids", vocab, &f, &e);
    if (r) {
        char buf[1600];
        print_error("%s\n", mc_error_format(&e, buf, sizeof buf));
    }
    assert_int_equal(r, MC_OK);
    assert_non_null(f);
    return f;
}

static void expect_seq(const fmt_ids *f, size_t i, const int32_t *want,
                       size_t n)
{
    size_t len;
    const int32_t *ids = fmt_ids_seq(f, i, &len);
    assert_int_equal(len, n);
    assert_memory_equal(ids, want, n * sizeof *ids);
}
#define SEQ(f, i, ...)                                                         \
    do {                                                                       \
        const int32_t w_[] = {__VA_ARGS__};                                    \
        expect_seq(f, i, w_, sizeof w_ / sizeof *w_);                          \
    } while (0)

static void test_ids_parses_sequences_per_line(void **state)
{
    (void)state;
    fmt_ids *f = parse_ok("1 2 3\n4\t5\n", 0);
    assert_int_equal(f->n_seqs, 2);
    assert_int_equal(f->n_ids, 5);
    SEQ(f, 0, 1, 2, 3);
    SEQ(f, 1, 4, 5);
    assert_int_equal(f->offsets[2], 5);
    fmt_ids_free(f);
    /* no trailing newline, CRLF, surrounding blanks, runs of separators */
    f = parse_ok("  7  \t 8 \r\n9", 0);
    assert_int_equal(f->n_seqs, 2);
    SEQ(f, 0, 7, 8);
    SEQ(f, 1, 9);
    fmt_ids_free(f);
    /* leading zeros and the largest int32 */
    f = parse_ok("007 2147483647\n", 0);
    SEQ(f, 0, 7, 2147483647);
    fmt_ids_free(f);
    fmt_ids_free(NULL);
}

static void test_ids_skips_comments_and_blank_lines(void **state)
{
    (void)state;
    fmt_ids *f = parse_ok("# calibration set\n\n  # indented comment \x01\n"
                          "1 2\n \t \n3\n\n", 0);
    assert_int_equal(f->n_seqs, 2);
    SEQ(f, 0, 1, 2);
    SEQ(f, 1, 3);
    fmt_ids_free(f);
}

static void test_ids_checks_vocab_range(void **state)
{
    (void)state;
    fmt_ids *f = parse_ok("0 511\n", 512);
    fmt_ids_free(f);
    mc_error e;
    assert_int_equal(fmt_ids_parse("0 1\n2 512\n", 10, "v.ids", 512, &f, &e),
                     MC_ERR_FORMAT);
    assert_null(f);
    assert_int_equal(e.offset, 6);
    assert_non_null(strstr(e.message, "line 2, column 3"));
    assert_non_null(strstr(e.message, "512"));
    assert_string_equal(e.file, "v.ids");
}

static const struct bad_case {
    const char *text;
    size_t len;          /* 0: strlen */
    int64_t offset;      /* expected err.offset */
    const char *where;   /* expected in the message */
} BAD[] = {
    {"1 2 x\n", 0, 4, "line 1, column 5"},
    {"1 2\n3,4\n", 0, 5, "line 2, column 2"},
    {"-1\n", 0, 0, "line 1, column 1"},
    {"+1\n", 0, 0, "line 1, column 1"},
    {"1 2147483648\n", 0, 2, "larger than 2147483647"},
    {"99999999999999999999999\n", 0, 0, "larger than"},
    {"1 2 # trailing comment\n", 0, 4, "line 1, column 5"},
    {"1\r2\n", 0, 1, "line 1, column 2"},
    {"1 2\x00 3\n", 7, 3, "NUL"},
    {"# a\x00 comment\n1\n", 15, 3, "NUL"},
    {"1.5\n", 0, 1, "column 2"},
    {"", 0, 0, "no token ids"},
    {"\n\n# only comments\n", 0, 0, "no token ids"},
    {"1 2\n\xC3\xA9\n", 0, 4, "byte 0xC3"},
};

static void test_ids_rejects_malformed_text_with_position(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        fmt_ids *f = (fmt_ids *)1;
        mc_error e;
        size_t len = BAD[i].len ? BAD[i].len : strlen(BAD[i].text);
        mc_status r = fmt_ids_parse(BAD[i].text, len, "bad.ids", 0, &f, &e);
        if (r != MC_ERR_FORMAT || e.offset != BAD[i].offset ||
            !strstr(e.message, BAD[i].where))
            print_error("case %zu: status %d offset %lld message '%s'\n", i,
                        r, (long long)e.offset, e.message);
        assert_int_equal(r, MC_ERR_FORMAT);
        assert_null(f);
        assert_int_equal(e.offset, BAD[i].offset);
        assert_non_null(strstr(e.message, BAD[i].where));
        assert_string_equal(e.file, "bad.ids");
    }
}

static void test_ids_rejects_overlong_line(void **state)
{
    (void)state;
    size_t len = FMT_IDS_MAX_LINE + 2;
    char *text = malloc(len);
    assert_non_null(text);
    for (size_t i = 0; i < len; i += 2) {
        text[i] = '1';
        text[i + 1] = ' ';
    }
    fmt_ids *f;
    mc_error e;
    assert_int_equal(fmt_ids_parse(text, len, "long.ids", 0, &f, &e),
                     MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "longer than"));
    assert_int_equal(e.offset, (int64_t)FMT_IDS_MAX_LINE);
    free(text);
}

static void test_ids_survives_allocation_failures(void **state)
{
    (void)state;
    const char *text = "1 2 3\n4 5\n";
    int ok = 0;
    for (long k = 0; k < 100 && !ok; k++) {
        fmt_ids *f = NULL;
        mc_alloc_fail_after(k);
        mc_status r = fmt_ids_parse(text, strlen(text), NULL, 0, &f, NULL);
        mc_alloc_fail_after(-1);
        if (r == MC_OK) {
            SEQ(f, 1, 4, 5);
            fmt_ids_free(f);
            ok = 1;
        } else {
            assert_int_equal(r, MC_ERR_NOMEM);
            assert_null(f);
        }
    }
    assert_true(ok);
}

static void test_ids_load_reports_file_errors(void **state)
{
    (void)state;
    fmt_ids *f;
    mc_error e;
    assert_int_equal(fmt_ids_load("/nonexistent/x.ids", 0, &f, &e),
                     MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, "/nonexistent/x.ids");
    char *dir = tu_mkdtemp("ids");
    assert_int_equal(fmt_ids_load(dir, 0, &f, &e), MC_ERR_IO);
    char *path = tu_fmt("%s/a.ids", dir);
    assert_int_equal(tu_write_file(path, "5 6\n7 z\n", 8), 0);
    assert_int_equal(fmt_ids_load(path, 0, &f, &e), MC_ERR_FORMAT);
    assert_string_equal(e.file, path);
    assert_non_null(strstr(e.message, "line 2, column 3"));
    assert_int_equal(tu_write_file(path, "5 6\n7\n", 6), 0);
    assert_int_equal(fmt_ids_load(path, 8, &f, NULL), MC_OK);
    SEQ(f, 0, 5, 6);
    SEQ(f, 1, 7);
    fmt_ids_free(f);
    free(path);
    tu_rmtree(dir);
    free(dir);
}

static void test_ids_reads_stories260k_references(void **state)
{
    (void)state;
    const char *dir = tu_stories_dir();
    TU_SKIP_IF(!dir, "stories260k absent in ../shared/models");
    const char *names[] = {"calib_64x256.ids", "eval_64x256.ids"};
    for (int k = 0; k < 2; k++) {
        char *path = tu_fmt("%s/reference/%s", dir, names[k]);
        fmt_ids *f = NULL;
        mc_error e;
        assert_int_equal(fmt_ids_load(path, 512, &f, &e), MC_OK);
        assert_int_equal(f->n_seqs, 64);
        assert_int_equal(f->n_ids, 64 * 256);
        for (size_t i = 0; i < 64; i++) {
            size_t len;
            const int32_t *ids = fmt_ids_seq(f, i, &len);
            assert_int_equal(len, 256);
            assert_int_equal(ids[0], 1); /* each starts with BOS */
        }
        fmt_ids_free(f);
        /* vocab 300 is too small for these files */
        assert_int_equal(fmt_ids_load(path, 300, &f, &e), MC_ERR_FORMAT);
        assert_non_null(strstr(e.message, "line 1"));
        free(path);
    }
    char *path = tu_fmt("%s/reference/greedy_from_bos.ids", dir);
    fmt_ids *f = NULL;
    assert_int_equal(fmt_ids_load(path, 512, &f, NULL), MC_OK);
    assert_int_equal(f->n_seqs, 1);
    assert_int_equal(f->n_ids, 257);
    assert_int_equal(f->ids[0], 1);
    assert_int_equal(f->ids[1], 461);
    fmt_ids_free(f);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_parses_sequences_per_line),
        cmocka_unit_test(test_ids_skips_comments_and_blank_lines),
        cmocka_unit_test(test_ids_checks_vocab_range),
        cmocka_unit_test(test_ids_rejects_malformed_text_with_position),
        cmocka_unit_test(test_ids_rejects_overlong_line),
        cmocka_unit_test(test_ids_survives_allocation_failures),
        cmocka_unit_test(test_ids_load_reports_file_errors),
        cmocka_unit_test(test_ids_reads_stories260k_references),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

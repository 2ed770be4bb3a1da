/* test_safetensors.c - the safetensors reader's rules and the writer's
 * output (formats/fmt_safetensors.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_safetensors.h"
#include "invalid_cases.h"
#include "mc_alloc.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------ */

/* A safetensors image from header text and data bytes (header padded). */
static unsigned char *make_st(const char *json, const void *data, size_t dlen,
                              size_t *len)
{
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    *len = 8 + padded + dlen;
    unsigned char *buf = malloc(*len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    if (dlen)
        memcpy(buf + 8 + padded, data, dlen);
    return buf;
}

/* Open json+data from memory; returns the status, err filled. */
static mc_status open_json(const char *json, size_t dlen, mc_error *err)
{
    unsigned char zeros[64] = {0};
    assert_true(dlen <= sizeof zeros);
    size_t len;
    unsigned char *buf = make_st(json, zeros, dlen, &len);
    fmt_st_file *f = NULL;
    mc_error_clear(err);
    mc_status st = fmt_st_open_memory(buf, len, "mem.safetensors", &f, err);
    if (st == MC_OK)
        assert_non_null(f);
    else
        assert_null(f);
    fmt_st_close(f);
    free(buf);
    return st;
}

/* Write a small file: a [2,3] F32, b [2] BF16, s scalar U8. */
static void write_sample(const char *path, const char *extra_key)
{
    mc_error e;
    fmt_st_writer *w;
    assert_int_equal(fmt_st_writer_create(path, &w, &e), MC_OK);
    uint64_t sa[2] = {2, 3}, sb[1] = {2};
    assert_int_equal(fmt_st_writer_add(w, "a", FMT_DT_F32, 2, sa, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "b", FMT_DT_BF16, 1, sb, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "s", FMT_DT_U8, 0, NULL, &e), MC_OK);
    if (extra_key)
        assert_int_equal(fmt_st_writer_set_metadata(w, extra_key, "1", &e), MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[2] = {0x3f80, 0x4000};
    assert_int_equal(fmt_st_writer_write(w, a, 10, &e), MC_OK); /* split */
    assert_int_equal(fmt_st_writer_write(w, (char *)a + 10, 14, &e), MC_OK);
    assert_int_equal(fmt_st_writer_write(w, b, 4, &e), MC_OK);
    assert_int_equal(fmt_st_writer_write(w, "\x07", 1, &e), MC_OK);
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_OK);
}

static char *tmpdir_path(char **dir, const char *name)
{
    *dir = tu_mkdtemp("st");
    return tu_fmt("%s/%s", *dir, name);
}

/* ---- writer ------------------------------------------------------------- */

static void test_safetensors_writer_roundtrip(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    write_sample(p, "note");
    mc_error e;
    fmt_st_file *f;
    assert_int_equal(fmt_st_open(p, &f, &e), MC_OK);
    assert_int_equal(fmt_st_count(f), 3);
    const fmt_st_tensor *a = fmt_st_find(f, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, FMT_DT_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    float v[6];
    memcpy(v, a->data, 24);
    assert_true(v[0] == 1.0f && v[5] == 6.0f);
    const fmt_st_tensor *s = fmt_st_find(f, "s");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nelem, 1);
    assert_int_equal(*(const unsigned char *)s->data, 7);
    assert_string_equal(fmt_st_metadata(f, "note"), "1");
    assert_null(fmt_st_find(f, "missing"));
    fmt_st_close(f);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_output_is_byte_identical(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "x.safetensors");
    char *q = tu_fmt("%s/y.safetensors", dir);
    write_sample(p, NULL);
    write_sample(q, NULL);
    size_t n1, n2;
    char *a = tu_read_binary(p, &n1), *b = tu_read_binary(q, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
    free(q);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_pads_header_with_spaces_to_8(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    write_sample(p, "k");
    size_t len;
    unsigned char *buf = (unsigned char *)tu_read_binary(p, &len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | buf[i];
    assert_int_equal(n % 8, 0);
    assert_int_equal(buf[8], '{');
    size_t end = 8 + n;
    while (buf[end - 1] == ' ')
        end--;
    assert_int_equal(buf[end - 1], '}');
    assert_true(8 + n - end < 8);
    assert_int_equal(len, 8 + n + 24 + 4 + 1); /* no padding between tensors */
    free(buf);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_always_writes_format_pt(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    write_sample(p, NULL);
    mc_error e;
    fmt_st_file *f;
    assert_int_equal(fmt_st_open(p, &f, &e), MC_OK);
    assert_string_equal(fmt_st_metadata(f, "format"), "pt");
    assert_int_equal(fmt_st_metadata_count(f), 1);
    fmt_st_close(f);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_rejects_format_other_than_pt(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    mc_error e;
    fmt_st_writer *w;
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_set_metadata(w, "format", "np", &e),
                     MC_ERR_INVALID_ARG);
    assert_int_equal(fmt_st_writer_set_metadata(w, "format", "pt", &e), MC_OK);
    fmt_st_writer_abort(w);
    assert_int_equal(tu_count_entries(dir), 0);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_rejects_duplicate_name(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    mc_error e;
    fmt_st_writer *w;
    uint64_t s = 4;
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F32, 1, &s, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F16, 1, &s, &e),
                     MC_ERR_INVALID_ARG);
    assert_non_null(strstr(e.message, "declared twice"));
    fmt_st_writer_abort(w);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_rejects_overflowing_shape(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    mc_error e;
    fmt_st_writer *w;
    uint64_t s[2] = {UINT64_C(1) << 62, 8};
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F32, 2, s, &e),
                     MC_ERR_OVERFLOW);
    fmt_st_writer_abort(w);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_rejects_missing_bytes(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    mc_error e;
    fmt_st_writer *w;
    uint64_t s = 4;
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F32, 1, &s, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "y", FMT_DT_F32, 1, &s, &e), MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_write(w, "0123456789abcdef01", 18, &e), MC_OK);
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_ERR_INVALID_ARG);
    assert_string_equal(e.field, "y");
    assert_int_equal(tu_count_entries(dir), 0); /* no file, no temp */
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_rejects_write_past_declared(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    mc_error e;
    fmt_st_writer *w;
    uint64_t s = 1;
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F32, 1, &s, &e), MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_write(w, "012345", 5, &e), MC_ERR_INVALID_ARG);
    fmt_st_writer_abort(w);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_writer_abort_keeps_previous_file(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    assert_int_equal(tu_write_file(p, "old", 3), 0);
    mc_error e;
    fmt_st_writer *w;
    uint64_t s = 1;
    assert_int_equal(fmt_st_writer_create(p, &w, &e), MC_OK);
    assert_int_equal(fmt_st_writer_add(w, "x", FMT_DT_F32, 1, &s, &e), MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    fmt_st_writer_abort(w);
    size_t n;
    char *old = tu_read_binary(p, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(old, "old", 3);
    assert_int_equal(tu_count_entries(dir), 1);
    free(old);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

/* ---- reader ------------------------------------------------------------- */

static void test_safetensors_get_is_in_data_offset_order(void **state)
{
    (void)state;
    mc_error e;
    size_t len;
    unsigned char data[12] = {0};
    unsigned char *buf = make_st(
        "{\"late\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
        "\"early\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
        data, sizeof data, &len);
    fmt_st_file *f;
    assert_int_equal(fmt_st_open_memory(buf, len, "m", &f, &e), MC_OK);
    assert_string_equal(fmt_st_get(f, 0)->name, "early");
    assert_string_equal(fmt_st_get(f, 1)->name, "late");
    assert_null(fmt_st_get(f, 2));
    assert_int_equal(fmt_st_get(f, 1)->file_offset, len - 8);
    fmt_st_close(f);
    free(buf);
}

static void test_safetensors_accepts_empty_tensors_and_no_tensors(void **state)
{
    (void)state;
    mc_error e;
    assert_int_equal(open_json("{}", 0, &e), MC_OK);
    assert_int_equal(open_json("{\"__metadata__\":{}}", 0, &e), MC_OK);
    assert_int_equal(open_json("{\"e\":{\"dtype\":\"F16\",\"shape\":[0,5],"
                               "\"data_offsets\":[0,0]},\"s\":{\"dtype\":\"U8\","
                               "\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &e),
                     MC_OK);
}

static void test_safetensors_rejects_overlapping_offsets(void **state)
{
    (void)state;
    mc_error e;
    assert_int_equal(open_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                               "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\","
                               "\"shape\":[2],\"data_offsets\":[4,12]}}", 12, &e),
                     MC_ERR_FORMAT);
    assert_string_equal(e.field, "b");
    assert_non_null(strstr(e.message, "overlapping 'a'"));
}

static void test_safetensors_error_offset_points_at_bad_value(void **state)
{
    (void)state;
    mc_error e;
    const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],"
                       "\"data_offsets\":[0,4]}}";
    assert_int_equal(open_json(json, 4, &e), MC_ERR_FORMAT);
    assert_string_equal(e.field, "w");
    assert_string_equal(e.file, "mem.safetensors");
    size_t want = (size_t)(strstr(json, "[-1]") - json) + 8;
    assert_int_equal(e.offset, (int64_t)want);
}

static void test_safetensors_duplicate_key_is_named_with_offset(void **state)
{
    (void)state;
    mc_error e;
    const char *json = "{\"w\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":"
                       "[0,1]},\n\"w\":{\"dtype\":\"U8\",\"shape\":[],"
                       "\"data_offsets\":[0,1]}}";
    assert_int_equal(open_json(json, 1, &e), MC_ERR_FORMAT);
    assert_string_equal(e.field, "w");
    assert_int_equal(e.offset, (int64_t)(strstr(json, "\n") - json) + 1 + 8);
}

static void test_safetensors_invalid_json_reports_line_and_file_offset(void **state)
{
    (void)state;
    mc_error e;
    const char *json = "{\"w\":\n  nope}";
    assert_int_equal(open_json(json, 0, &e), MC_ERR_FORMAT);
    assert_non_null(strstr(e.message, "line 2"));
    assert_true(e.offset >= 8 + 6 && e.offset <= 8 + (int64_t)strlen(json));
}

static void test_safetensors_rejects_every_truncation(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    write_sample(p, NULL);
    size_t len;
    char *buf = tu_read_binary(p, &len);
    for (size_t cut = 0; cut < len; cut++) {
        fmt_st_file *f = (fmt_st_file *)1;
        mc_error e;
        assert_int_not_equal(fmt_st_open_memory(buf, cut, "cut", &f, &e), MC_OK);
        assert_null(f);
    }
    free(buf);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_open_reports_missing_file(void **state)
{
    (void)state;
    mc_error e;
    fmt_st_file *f;
    assert_int_equal(fmt_st_open("/nonexistent/x.safetensors", &f, &e),
                     MC_ERR_NOT_FOUND);
    assert_string_equal(e.file, "/nonexistent/x.safetensors");
}

static void check_st_case(const char *case_dir, const char *expect, void *ctx)
{
    (void)ctx;
    char *path = tu_case_file(case_dir, ".safetensors");
    assert_non_null(path);
    fmt_st_file *f = NULL;
    mc_error e;
    mc_status st = fmt_st_open(path, &f, &e);
    char msg[2048];
    mc_error_format(&e, msg, sizeof msg);
    if (st == MC_OK)
        fail_msg("%s opened but should fail with \"%s\"", path, expect);
    assert_null(f);
    assert_string_equal(e.file, path);
    tu_assert_case_error(case_dir, expect, msg);
    /* The memory reader must agree with the file reader. */
    size_t len;
    char *buf = tu_read_binary(path, &len);
    mc_error e2;
    assert_int_equal(fmt_st_open_memory(buf, len, path, &f, &e2), st);
    assert_string_equal(e2.message, e.message);
    assert_int_equal(e2.offset, e.offset);
    free(buf);
    free(path);
}

static void test_safetensors_invalid_cases_all_fail_with_message(void **state)
{
    (void)state;
    int n = tu_for_each_invalid_case("safetensors", check_st_case, NULL);
    assert_true(n >= 25);
}

/* Fail each allocation in turn: every path must fail cleanly (no leak,
 * no crash under ASan) and succeed once allocations are back. */
static void test_safetensors_survives_each_failed_allocation(void **state)
{
    (void)state;
    char *dir, *p = tmpdir_path(&dir, "m.safetensors");
    write_sample(p, "k");
    size_t len;
    char *buf = tu_read_binary(p, &len);
    for (long k = 0;; k++) {
        mc_alloc_fail_after(k);
        fmt_st_file *f = NULL;
        mc_error e;
        mc_status st = fmt_st_open_memory(buf, len, "m", &f, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_st_close(f);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
        assert_true(k < 10000);
    }
    for (long k = 0;; k++) {
        mc_alloc_fail_after(k);
        fmt_st_writer *w = NULL;
        mc_error e;
        uint64_t s = 3;
        mc_status st = fmt_st_writer_create(p, &w, &e);
        if (st == MC_OK)
            st = fmt_st_writer_add(w, "x", FMT_DT_U8, 1, &s, &e);
        if (st == MC_OK)
            st = fmt_st_writer_set_metadata(w, "m", "v", &e);
        if (st == MC_OK)
            st = fmt_st_writer_begin_data(w, &e);
        if (st == MC_OK)
            st = fmt_st_writer_write(w, "abc", 3, &e);
        if (st == MC_OK) {
            st = fmt_st_writer_finish(w, &e);
            w = NULL;
        }
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_st_writer_abort(w);
        assert_int_equal(tu_count_entries(dir), 1); /* no temp left */
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_not_equal(st, MC_OK);
        assert_true(k < 10000);
    }
    free(buf);
    tu_rmtree(dir);
    free(p);
    free(dir);
}

static void test_safetensors_reads_stories260k(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k not found in ../shared");
    char *p = tu_fmt("%s/model.safetensors", sd);
    fmt_st_file *f;
    mc_error e;
    char msg[2048];
    mc_status st = fmt_st_open(p, &f, &e);
    if (st != MC_OK)
        fail_msg("%s", mc_error_format(&e, msg, sizeof msg));
    assert_true(fmt_st_count(f) > 0);
    for (size_t i = 0; i < fmt_st_count(f); i++)
        assert_ptr_equal(fmt_st_find(f, fmt_st_get(f, i)->name), fmt_st_get(f, i));
    fmt_st_close(f);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_writer_roundtrip),
        cmocka_unit_test(test_safetensors_writer_output_is_byte_identical),
        cmocka_unit_test(test_safetensors_writer_pads_header_with_spaces_to_8),
        cmocka_unit_test(test_safetensors_writer_always_writes_format_pt),
        cmocka_unit_test(test_safetensors_writer_rejects_format_other_than_pt),
        cmocka_unit_test(test_safetensors_writer_rejects_duplicate_name),
        cmocka_unit_test(test_safetensors_writer_rejects_overflowing_shape),
        cmocka_unit_test(test_safetensors_writer_rejects_missing_bytes),
        cmocka_unit_test(test_safetensors_writer_rejects_write_past_declared),
        cmocka_unit_test(test_safetensors_writer_abort_keeps_previous_file),
        cmocka_unit_test(test_safetensors_get_is_in_data_offset_order),
        cmocka_unit_test(test_safetensors_accepts_empty_tensors_and_no_tensors),
        cmocka_unit_test(test_safetensors_rejects_overlapping_offsets),
        cmocka_unit_test(test_safetensors_error_offset_points_at_bad_value),
        cmocka_unit_test(test_safetensors_duplicate_key_is_named_with_offset),
        cmocka_unit_test(test_safetensors_invalid_json_reports_line_and_file_offset),
        cmocka_unit_test(test_safetensors_rejects_every_truncation),
        cmocka_unit_test(test_safetensors_open_reports_missing_file),
        cmocka_unit_test(test_safetensors_invalid_cases_all_fail_with_message),
        cmocka_unit_test(test_safetensors_survives_each_failed_allocation),
        cmocka_unit_test(test_safetensors_reads_stories260k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

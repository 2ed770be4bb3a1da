/* test_model_dir.c - opening checkpoints (directory, single file, sharded
 * index) and writing indexes (formats/fmt_model.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_model.h"
#include "invalid_cases.h"
#include "mc_alloc.h"
#include "testutil.h"

#define SH1 "model-00001-of-00002.safetensors"
#define SH2 "model-00002-of-00002.safetensors"

/* Write path with U8 tensors names[i] of lens[i] bytes (value i+1). */
static void write_st(const char *path, const char *const *names,
                     const uint64_t *lens, size_t n)
{
    mc_error e;
    fmt_st_writer *w;
    assert_int_equal(fmt_st_writer_create(path, &w, &e), MC_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(fmt_st_writer_add(w, names[i], FMT_DT_U8, 1, &lens[i], &e),
                         MC_OK);
    assert_int_equal(fmt_st_writer_begin_data(w, &e), MC_OK);
    for (size_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < lens[i]; k++) {
            unsigned char v = (unsigned char)(i + 1);
            assert_int_equal(fmt_st_writer_write(w, &v, 1, &e), MC_OK);
        }
    assert_int_equal(fmt_st_writer_finish(w, &e), MC_OK);
}

/* A sharded model: SH1 holds z (3 bytes) and a (2), SH2 holds m (5). */
static char *make_sharded(void)
{
    char *dir = tu_mkdtemp("model");
    char *p1 = tu_fmt("%s/%s", dir, SH1), *p2 = tu_fmt("%s/%s", dir, SH2);
    const char *n1[] = {"z", "a"}, *n2[] = {"m"};
    uint64_t l1[] = {3, 2}, l2[] = {5};
    write_st(p1, n1, l1, 2);
    write_st(p2, n2, l2, 1);
    const char *names[] = {"m", "z", "a"}, *shards[] = {SH2, SH1, SH1};
    mc_error e;
    assert_int_equal(fmt_model_write_index(dir, 10, names, shards, 3, &e), MC_OK);
    free(p1);
    free(p2);
    return dir;
}

static char *make_single(void)
{
    char *dir = tu_mkdtemp("model");
    char *p = tu_fmt("%s/model.safetensors", dir);
    const char *n[] = {"w"};
    uint64_t l[] = {4};
    write_st(p, n, l, 1);
    free(p);
    return dir;
}

static fmt_model *open_ok(const char *path)
{
    fmt_model *m = NULL;
    mc_error e;
    char msg[2048];
    if (fmt_model_open(path, &m, &e) != MC_OK)
        fail_msg("%s", mc_error_format(&e, msg, sizeof msg));
    return m;
}

static void test_model_opens_directory_with_single_file(void **state)
{
    (void)state;
    char *dir = make_single();
    fmt_model *m = open_ok(dir);
    assert_false(fmt_model_is_sharded(m));
    assert_int_equal(fmt_model_shard_count(m), 1);
    assert_string_equal(fmt_model_shard_name(m, 0), "model.safetensors");
    assert_int_equal(fmt_model_tensor_count(m), 1);
    assert_int_equal(fmt_model_total_bytes(m), 4);
    char *cfg = tu_fmt("%s/config.json", dir);
    assert_string_equal(fmt_model_config_path(m), cfg);
    assert_string_equal(fmt_model_dir(m), dir);
    free(cfg);
    fmt_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_opens_single_file_path(void **state)
{
    (void)state;
    char *dir = make_single();
    char *p = tu_fmt("%s/model.safetensors", dir);
    fmt_model *m = open_ok(p);
    assert_string_equal(fmt_model_dir(m), dir);
    assert_non_null(fmt_model_find(m, "w", NULL));
    fmt_model_close(m);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_opens_sharded_directory(void **state)
{
    (void)state;
    char *dir = make_sharded();
    fmt_model *m = open_ok(dir);
    assert_true(fmt_model_is_sharded(m));
    assert_int_equal(fmt_model_shard_count(m), 2);
    assert_string_equal(fmt_model_shard_name(m, 0), SH1);
    assert_string_equal(fmt_model_shard_name(m, 1), SH2);
    assert_int_equal(fmt_model_total_bytes(m), 10);
    fmt_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_opens_index_json_path(void **state)
{
    (void)state;
    char *dir = make_sharded();
    char *p = tu_fmt("%s/model.safetensors.index.json", dir);
    fmt_model *m = open_ok(p);
    assert_true(fmt_model_is_sharded(m));
    assert_string_equal(fmt_model_dir(m), dir);
    fmt_model_close(m);
    free(p);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_tensor_order_is_shard_then_data_offset(void **state)
{
    (void)state;
    char *dir = make_sharded();
    fmt_model *m = open_ok(dir);
    const char *want[] = {"z", "a", "m"};
    size_t want_shard[] = {0, 0, 1};
    assert_int_equal(fmt_model_tensor_count(m), 3);
    for (size_t i = 0; i < 3; i++) {
        size_t s = 99;
        assert_string_equal(fmt_model_tensor(m, i, &s)->name, want[i]);
        assert_int_equal(s, want_shard[i]);
    }
    assert_null(fmt_model_tensor(m, 3, NULL));
    fmt_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_find_reports_shard_and_data(void **state)
{
    (void)state;
    char *dir = make_sharded();
    fmt_model *m = open_ok(dir);
    size_t s = 99;
    const fmt_st_tensor *t = fmt_model_find(m, "m", &s);
    assert_non_null(t);
    assert_int_equal(s, 1);
    assert_int_equal(t->nbytes, 5);
    assert_int_equal(((const unsigned char *)t->data)[4], 1);
    assert_null(fmt_model_find(m, "nope", &s));
    fmt_model_close(m);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_rejects_dir_without_weights(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("model");
    fmt_model *m = (fmt_model *)1;
    mc_error e;
    assert_int_equal(fmt_model_open(dir, &m, &e), MC_ERR_NOT_FOUND);
    assert_null(m);
    assert_string_equal(e.file, dir);
    tu_rmtree(dir);
    free(dir);
}

static void test_model_write_index_is_sorted_and_deterministic(void **state)
{
    (void)state;
    char *d1 = tu_mkdtemp("ix"), *d2 = tu_mkdtemp("ix");
    const char *n1[] = {"b", "a", "c"}, *s1[] = {SH2, SH1, SH2};
    const char *n2[] = {"c", "b", "a"}, *s2[] = {SH2, SH2, SH1};
    mc_error e;
    assert_int_equal(fmt_model_write_index(d1, 7, n1, s1, 3, &e), MC_OK);
    assert_int_equal(fmt_model_write_index(d2, 7, n2, s2, 3, &e), MC_OK);
    char *p1 = tu_fmt("%s/model.safetensors.index.json", d1);
    char *p2 = tu_fmt("%s/model.safetensors.index.json", d2);
    size_t l1, l2;
    char *t1 = tu_read_binary(p1, &l1), *t2 = tu_read_binary(p2, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(t1, t2, l1);
    const char *a = strstr(t1, "\"a\""), *b = strstr(t1, "\"b\""), *c = strstr(t1, "\"c\"");
    assert_true(a && b && c && a < b && b < c);
    assert_non_null(strstr(t1, "\"total_size\": 7"));
    assert_int_equal(t1[l1 - 1], '\n');
    assert_int_equal(tu_count_entries(d1), 1); /* no temp left behind */
    free(t1);
    free(t2);
    free(p1);
    free(p2);
    tu_rmtree(d1);
    tu_rmtree(d2);
    free(d1);
    free(d2);
}

static void test_model_write_index_rejects_escaping_shard_name(void **state)
{
    (void)state;
    char *d = tu_mkdtemp("ix");
    const char *n[] = {"a"}, *s[] = {"../evil.safetensors"};
    mc_error e;
    assert_int_equal(fmt_model_write_index(d, 1, n, s, 1, &e), MC_ERR_INVALID_ARG);
    assert_int_equal(tu_count_entries(d), 0);
    tu_rmtree(d);
    free(d);
}

static void test_model_write_index_rejects_duplicate_tensor(void **state)
{
    (void)state;
    char *d = tu_mkdtemp("ix");
    const char *n[] = {"a", "b", "a"}, *s[] = {SH1, SH1, SH2};
    mc_error e;
    assert_int_equal(fmt_model_write_index(d, 1, n, s, 3, &e), MC_ERR_INVALID_ARG);
    assert_string_equal(e.field, "a");
    tu_rmtree(d);
    free(d);
}

static void test_model_parse_index_sorts_shards_and_tensors(void **state)
{
    (void)state;
    const char *text = "{\"metadata\":{\"total_size\":1.5e1},\"weight_map\":"
                       "{\"y\":\"" SH2 "\",\"x\":\"" SH1 "\",\"w\":\"" SH2 "\"}}";
    fmt_model_index *ix;
    mc_error e;
    assert_int_equal(fmt_model_parse_index(text, strlen(text), "i", &ix, &e), MC_OK);
    uint64_t total = 0;
    assert_true(fmt_model_index_total_size(ix, &total));
    assert_int_equal(total, 15);
    assert_int_equal(fmt_model_index_shard_count(ix), 2);
    assert_string_equal(fmt_model_index_shard_name(ix, 0), SH1);
    assert_int_equal(fmt_model_index_tensor_count(ix), 3);
    size_t s;
    assert_string_equal(fmt_model_index_tensor(ix, 0, &s), "w");
    assert_int_equal(s, 1);
    assert_string_equal(fmt_model_index_tensor(ix, 1, &s), "x");
    assert_int_equal(s, 0);
    assert_null(fmt_model_index_tensor(ix, 3, &s));
    fmt_model_index_free(ix);
}

static void test_model_shard_names_must_stay_in_dir(void **state)
{
    (void)state;
    assert_true(fmt_model_shard_name_ok(SH1));
    assert_false(fmt_model_shard_name_ok("../" SH1));
    assert_false(fmt_model_shard_name_ok("/abs/" SH1));
    assert_false(fmt_model_shard_name_ok("sub\\" SH1));
    assert_false(fmt_model_shard_name_ok(".."));
    assert_false(fmt_model_shard_name_ok(".safetensors"));
    assert_false(fmt_model_shard_name_ok("config.json"));
    assert_false(fmt_model_shard_name_ok(NULL));
}

static void check_index_case(const char *case_dir, const char *expect, void *ctx)
{
    (void)ctx;
    fmt_model *m = NULL;
    mc_error e;
    char msg[2048];
    mc_status st = fmt_model_open(case_dir, &m, &e);
    if (st == MC_OK)
        fail_msg("%s opened but should fail with \"%s\"", case_dir, expect);
    assert_null(m);
    tu_assert_case_error(case_dir, expect, mc_error_format(&e, msg, sizeof msg));
}

static void test_model_invalid_index_cases_all_fail_with_message(void **state)
{
    (void)state;
    int n = tu_for_each_invalid_case("index", check_index_case, NULL);
    assert_true(n >= 10);
}

static void test_model_survives_each_failed_allocation(void **state)
{
    (void)state;
    char *dir = make_sharded();
    for (long k = 0;; k++) {
        mc_alloc_fail_after(k);
        fmt_model *m = NULL;
        mc_error e;
        mc_status st = fmt_model_open(dir, &m, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        fmt_model_close(m);
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
        assert_true(k < 10000);
    }
    const char *n[] = {"a", "b"}, *s[] = {SH1, SH2};
    for (long k = 0;; k++) {
        mc_alloc_fail_after(k);
        mc_error e;
        mc_status st = fmt_model_write_index(dir, 10, n, s, 2, &e);
        int injected = mc_alloc_failure_injected();
        mc_alloc_fail_after(-1);
        assert_int_equal(tu_count_entries(dir), 3); /* no temp left */
        if (!injected) {
            assert_int_equal(st, MC_OK);
            break;
        }
        assert_int_equal(st, MC_ERR_NOMEM);
        assert_true(k < 10000);
    }
    tu_rmtree(dir);
    free(dir);
}

static void test_model_opens_stories260k(void **state)
{
    (void)state;
    const char *sd = tu_stories_dir();
    TU_SKIP_IF(!sd, "stories260k not found in ../shared");
    fmt_model *m = open_ok(sd);
    assert_true(fmt_model_tensor_count(m) > 0);
    assert_true(fmt_model_total_bytes(m) > 0);
    fmt_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_opens_directory_with_single_file),
        cmocka_unit_test(test_model_opens_single_file_path),
        cmocka_unit_test(test_model_opens_sharded_directory),
        cmocka_unit_test(test_model_opens_index_json_path),
        cmocka_unit_test(test_model_tensor_order_is_shard_then_data_offset),
        cmocka_unit_test(test_model_find_reports_shard_and_data),
        cmocka_unit_test(test_model_rejects_dir_without_weights),
        cmocka_unit_test(test_model_write_index_is_sorted_and_deterministic),
        cmocka_unit_test(test_model_write_index_rejects_escaping_shard_name),
        cmocka_unit_test(test_model_write_index_rejects_duplicate_tensor),
        cmocka_unit_test(test_model_parse_index_sorts_shards_and_tensors),
        cmocka_unit_test(test_model_shard_names_must_stay_in_dir),
        cmocka_unit_test(test_model_invalid_index_cases_all_fail_with_message),
        cmocka_unit_test(test_model_survives_each_failed_allocation),
        cmocka_unit_test(test_model_opens_stories260k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_gguf.c - the GGUF writer (formats/fmt_gguf.h) against the published
 * layout (ggml docs/gguf.md): the exact header bytes, every metadata type
 * read back by an independent reader (helpers/gguf_read.c), alignment and
 * zero padding, block sizes, and the invalid combinations refused by name
 * with nothing left at the output path. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "fmt_gguf.h"
#include "gguf_read.h"
#include "testutil.h"

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void test_gguf_header_bytes_follow_the_spec(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("gguf");
    char *path = tu_fmt("%s/a.gguf", dir);
    fmt_gguf_writer *w;
    mc_error err;
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_u32(w, "x.n", 0x01020304u, &err), MC_OK);
    uint64_t ne[2] = {4, 2};
    assert_int_equal(fmt_gguf_add_tensor(w, "t", FMT_GGUF_T_F32, 2, ne, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(fmt_gguf_write(w, v, sizeof v, &err), MC_OK);
    assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);

    size_t len;
    uint8_t *b = (uint8_t *)tu_read_file(path, &len);
    assert_non_null(b);
    /* magic, version 3, tensor_count 1, kv_count 1 */
    assert_memory_equal(b, "GGUF", 4);
    assert_int_equal(le(b + 4, 4), 3);
    assert_int_equal(le(b + 8, 8), 1);
    assert_int_equal(le(b + 16, 8), 1);
    /* key: u64 length 3, "x.n", u32 type 4 (UINT32), value */
    assert_int_equal(le(b + 24, 8), 3);
    assert_memory_equal(b + 32, "x.n", 3);
    assert_int_equal(le(b + 35, 4), 4);
    assert_int_equal(le(b + 39, 4), 0x01020304u);
    /* tensor info: name "t", n_dims 2, ne {4, 2}, type 0, offset 0 */
    assert_int_equal(le(b + 43, 8), 1);
    assert_int_equal(b[51], 't');
    assert_int_equal(le(b + 52, 4), 2);
    assert_int_equal(le(b + 56, 8), 4);
    assert_int_equal(le(b + 64, 8), 2);
    assert_int_equal(le(b + 72, 4), 0);
    assert_int_equal(le(b + 76, 8), 0);
    /* header ends at 84, padded with zeros to 96 (alignment 32) */
    for (size_t i = 84; i < 96; i++)
        assert_int_equal(b[i], 0);
    assert_int_equal(len, 96 + 32);
    assert_memory_equal(b + 96, v, sizeof v);
    free(b);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

static void test_gguf_every_metadata_type_reads_back(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("gguf");
    char *path = tu_fmt("%s/m.gguf", dir);
    fmt_gguf_writer *w;
    mc_error err;
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    int32_t ia[3] = {-1, 0, 7};
    float fa[2] = {0.5f, -2.0f};
    const char *sa[3] = {"a", "", "\xe2\x96\x81hi"};
    size_t sl[3] = {1, 0, 5};
    assert_int_equal(fmt_gguf_add_string(w, "general.architecture", "llama",
                                         5, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_u32(w, "u", 7, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_i32(w, "i", -5, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_u64(w, "q", 1ull << 40, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_f32(w, "f", 1e-5f, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_bool(w, "b", 1, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_array(w, "ia", FMT_GGUF_V_I32, ia, 3, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_add_array(w, "fa", FMT_GGUF_V_F32, fa, 2, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_add_string_array(w, "sa", sa, sl, 3, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);

    tg_file f;
    assert_int_equal(tg_open(path, &f), 0);
    assert_int_equal(f.nkv, 9);
    assert_int_equal(f.nt, 0);
    size_t n;
    const char *s = tg_kv_str(&f, "general.architecture", &n);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(tg_kv_u32(&f, "u"), 7);
    const tg_kv *k = tg_kv_find(&f, "i");
    assert_int_equal(k->type, FMT_GGUF_V_I32);
    assert_int_equal((int32_t)le(k->val, 4), -5);
    k = tg_kv_find(&f, "q");
    assert_int_equal(k->type, FMT_GGUF_V_U64);
    assert_true(le(k->val, 8) == 1ull << 40);
    assert_true(tg_kv_f32(&f, "f") == 1e-5f);
    k = tg_kv_find(&f, "b");
    assert_int_equal(k->type, FMT_GGUF_V_BOOL);
    assert_int_equal(k->val[0], 1);
    k = tg_kv_find(&f, "ia");
    assert_int_equal(k->type, FMT_GGUF_V_ARRAY);
    assert_int_equal(k->elem, FMT_GGUF_V_I32);
    assert_int_equal(k->n, 3);
    assert_memory_equal(k->val, ia, sizeof ia);
    k = tg_kv_find(&f, "fa");
    assert_int_equal(k->elem, FMT_GGUF_V_F32);
    assert_memory_equal(k->val, fa, sizeof fa);
    k = tg_kv_find(&f, "sa");
    assert_int_equal(k->elem, FMT_GGUF_V_STRING);
    assert_int_equal(k->n, 3);
    /* strings: u64 length + bytes, one after the other */
    assert_int_equal(le(k->val, 8), 1);
    assert_int_equal(k->val[8], 'a');
    assert_int_equal(le(k->val + 9, 8), 0);
    assert_int_equal(le(k->val + 17, 8), 5);
    assert_memory_equal(k->val + 25, "\xe2\x96\x81hi", 5);
    tg_close(&f);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

/* Q8_0, Q4_0, Q4_1 and Q5_0 blocks are sized as ggml-common.h says and
 * rows read back through the spec's dequantization. */
static void test_gguf_blocks_and_alignment(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("gguf");
    char *path = tu_fmt("%s/q.gguf", dir);
    fmt_gguf_writer *w;
    mc_error err;
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    assert_int_equal(fmt_gguf_set_alignment(w, 64, &err), MC_OK);
    uint64_t ne[2] = {64, 3};
    assert_int_equal(fmt_gguf_add_tensor(w, "q8", FMT_GGUF_T_Q8_0, 2, ne,
                                         &err), MC_OK);
    assert_int_equal(fmt_gguf_add_tensor(w, "q40", FMT_GGUF_T_Q4_0, 2, ne,
                                         &err), MC_OK);
    assert_int_equal(fmt_gguf_add_tensor(w, "q41", FMT_GGUF_T_Q4_1, 2, ne,
                                         &err), MC_OK);
    uint64_t ne1[1] = {5};
    assert_int_equal(fmt_gguf_add_tensor(w, "v", FMT_GGUF_T_F16, 1, ne1, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_add_tensor(w, "q50", FMT_GGUF_T_Q5_0, 2, ne,
                                         &err), MC_OK);
    assert_int_equal(fmt_gguf_tensor_bytes(w, 0), 3 * 2 * 34);
    assert_int_equal(fmt_gguf_tensor_bytes(w, 1), 3 * 2 * 18);
    assert_int_equal(fmt_gguf_tensor_bytes(w, 2), 3 * 2 * 20);
    assert_int_equal(fmt_gguf_tensor_bytes(w, 3), 10);
    assert_int_equal(fmt_gguf_tensor_bytes(w, 4), 3 * 2 * 22);
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    /* one block pattern repeated: d = 0.5 (f16 0x3800), m = -1 (0xBC00) */
    uint8_t q8[34], q40[18], q41[20];
    q8[0] = 0x00; q8[1] = 0x38;
    for (int j = 0; j < 32; j++)
        q8[2 + j] = (uint8_t)(int8_t)(j - 16);
    q40[0] = 0x00; q40[1] = 0x38;
    q41[0] = 0x00; q41[1] = 0x38; q41[2] = 0x00; q41[3] = 0xBC;
    for (int j = 0; j < 16; j++)
        q40[2 + j] = q41[4 + j] = (uint8_t)(j | (15 - j) << 4);
    for (int b = 0; b < 6; b++)
        assert_int_equal(fmt_gguf_write(w, q8, sizeof q8, &err), MC_OK);
    for (int b = 0; b < 6; b++)
        assert_int_equal(fmt_gguf_write(w, q40, sizeof q40, &err), MC_OK);
    for (int b = 0; b < 6; b++)
        assert_int_equal(fmt_gguf_write(w, q41, sizeof q41, &err), MC_OK);
    uint16_t h[5] = {0x3C00, 0x4000, 0, 0xBC00, 0x3800};
    assert_int_equal(fmt_gguf_write(w, h, sizeof h, &err), MC_OK);
    /* Q5_0, d = 0.5: block A has codes c_j = j (the fifth bit set in the
     * high half: qh = 0xFFFF0000), block B c_j = 31 - j (set in the low
     * half: qh = 0x0000FFFF); x = d (c - 16) */
    uint8_t q5a[22] = {0x00, 0x38, 0x00, 0x00, 0xFF, 0xFF};
    uint8_t q5b[22] = {0x00, 0x38, 0xFF, 0xFF, 0x00, 0x00};
    for (int j = 0; j < 16; j++) {
        q5a[6 + j] = (uint8_t)(j | j << 4);
        q5b[6 + j] = (uint8_t)((15 - j) | (15 - j) << 4);
    }
    for (int r = 0; r < 3; r++) {
        assert_int_equal(fmt_gguf_write(w, q5a, sizeof q5a, &err), MC_OK);
        assert_int_equal(fmt_gguf_write(w, q5b, sizeof q5b, &err), MC_OK);
    }
    assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);

    tg_file f;
    assert_int_equal(tg_open(path, &f), 0);
    assert_int_equal(f.align, 64);
    assert_int_equal(f.data_off % 64, 0);
    assert_int_equal(f.len % 64, 0); /* padded after the last tensor too */
    for (size_t i = 0; i < f.nt; i++)
        assert_int_equal(f.t[i].offset % 64, 0);
    const tg_tensor *t = tg_tensor_find(&f, "q8");
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 3);
    float row[64];
    assert_int_equal(tg_row_f32(t, 2, row), 0);
    assert_true(row[0] == -8.0f && row[31] == 7.5f && row[32] == -8.0f);
    assert_int_equal(tg_row_f32(tg_tensor_find(&f, "q40"), 1, row), 0);
    /* element 0: low nibble 0 -> 0.5*(0-8); element 16: high nibble 15 */
    assert_true(row[0] == -4.0f && row[16] == 3.5f && row[15] == 3.5f &&
                row[31] == -4.0f);
    assert_int_equal(tg_row_f32(tg_tensor_find(&f, "q41"), 0, row), 0);
    assert_true(row[0] == -1.0f && row[16] == 6.5f);
    assert_int_equal(tg_row_f32(tg_tensor_find(&f, "q50"), 2, row), 0);
    for (int j = 0; j < 32; j++) {
        assert_true(row[j] == 0.5f * (float)(j - 16));
        assert_true(row[32 + j] == 0.5f * (float)(15 - j));
    }
    assert_int_equal(tg_row_f32(tg_tensor_find(&f, "v"), 0, row), 0);
    assert_true(row[0] == 1.0f && row[1] == 2.0f && row[3] == -1.0f &&
                row[4] == 0.5f);
    /* the padding between tensors is zero */
    const tg_tensor *a = tg_tensor_find(&f, "q8");
    const tg_tensor *b = tg_tensor_find(&f, "q40");
    for (uint64_t i = a->offset + a->bytes; i < b->offset; i++)
        assert_int_equal(f.buf[f.data_off + i], 0);
    tg_close(&f);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

/* Each invalid combination is refused when made, naming the key or tensor;
 * a writer that is then aborted or finishes short leaves no file. */
static void test_gguf_refuses_invalid_combinations_by_name(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("gguf");
    char *path = tu_fmt("%s/bad.gguf", dir);
    fmt_gguf_writer *w;
    mc_error err;
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    uint64_t ne[2] = {172, 64};
    assert_int_equal(fmt_gguf_add_tensor(w, "blk.0.ffn_down.weight",
                                         FMT_GGUF_T_Q8_0, 2, ne, &err),
                     MC_ERR_SHAPE);
    assert_string_equal(err.field, "blk.0.ffn_down.weight");
    assert_non_null(strstr(err.message, "Q8_0"));
    assert_non_null(strstr(err.message, "172"));
    assert_int_equal(fmt_gguf_add_tensor(w, "x", FMT_GGUF_T_Q4_1, 2, ne,
                                         &err), MC_ERR_SHAPE);
    assert_int_equal(fmt_gguf_add_tensor(w, "x", (fmt_gguf_ttype)12, 2, ne,
                                         &err), MC_ERR_UNSUPPORTED);
    ne[0] = 64;
    assert_int_equal(fmt_gguf_add_tensor(w, "x", FMT_GGUF_T_F16, 2, ne, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_add_tensor(w, "x", FMT_GGUF_T_F32, 2, ne, &err),
                     MC_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "duplicate tensor name 'x'"));
    char long_name[80];
    memset(long_name, 'a', 64);
    long_name[64] = 0;
    assert_int_equal(fmt_gguf_add_tensor(w, long_name, FMT_GGUF_T_F32, 2, ne,
                                         &err), MC_ERR_INVALID_ARG);
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    assert_int_equal(fmt_gguf_add_tensor(w, "y", FMT_GGUF_T_F32, 5, ne5, &err),
                     MC_ERR_INVALID_ARG);
    uint64_t ne0[2] = {32, 0};
    assert_int_equal(fmt_gguf_add_tensor(w, "z", FMT_GGUF_T_F32, 2, ne0, &err),
                     MC_ERR_SHAPE);
    assert_int_equal(fmt_gguf_add_u32(w, "k", 1, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_f32(w, "k", 1, &err), MC_ERR_INVALID_ARG);
    assert_string_equal(err.field, "k");
    assert_non_null(strstr(err.message, "duplicate metadata key"));
    assert_int_equal(fmt_gguf_add_u32(w, "general.alignment", 64, &err),
                     MC_ERR_INVALID_ARG);
    assert_string_equal(err.field, "general.alignment");
    assert_int_equal(fmt_gguf_add_u32(w, "", 1, &err), MC_ERR_INVALID_ARG);
    assert_int_equal(fmt_gguf_add_array(w, "s", FMT_GGUF_V_STRING, "", 1,
                                        &err), MC_ERR_INVALID_ARG);
    /* the alignment must be a power of two, and set before tensors */
    assert_int_equal(fmt_gguf_set_alignment(w, 48, &err), MC_ERR_INVALID_ARG);
    assert_int_equal(fmt_gguf_set_alignment(w, 64, &err), MC_ERR_INVALID_ARG);
    assert_non_null(strstr(err.message, "before any tensor"));
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_u32(w, "late", 1, &err),
                     MC_ERR_INVALID_ARG);
    assert_string_equal(err.field, "late");
    assert_int_equal(fmt_gguf_add_tensor(w, "late", FMT_GGUF_T_F32, 2, ne,
                                         &err), MC_ERR_INVALID_ARG);
    uint8_t buf[64 * 64 * 2 + 1] = {0};
    assert_int_equal(fmt_gguf_write(w, buf, 100, &err), MC_OK);
    /* finishing short names the unfinished tensor and leaves no file */
    assert_int_equal(fmt_gguf_finish(w, &err), MC_ERR_INVALID_ARG);
    assert_string_equal(err.field, "x");
    assert_false(tu_exists(path));
    assert_int_equal(tu_count_entries(dir), 0);

    /* more bytes than declared */
    assert_int_equal(fmt_gguf_writer_create(path, &w, &err), MC_OK);
    assert_int_equal(fmt_gguf_add_tensor(w, "x", FMT_GGUF_T_F16, 2, ne, &err),
                     MC_OK);
    assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
    assert_int_equal(fmt_gguf_write(w, buf, sizeof buf, &err),
                     MC_ERR_INVALID_ARG);
    fmt_gguf_abort(w);
    assert_int_equal(tu_count_entries(dir), 0);
    fmt_gguf_abort(NULL);
    tu_rmtree(dir);
    free(path);
    free(dir);
}

/* Identical calls give identical bytes (no time, no paths). */
static void test_gguf_output_is_deterministic(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp("gguf");
    char *p[2] = {tu_fmt("%s/1.gguf", dir), tu_fmt("%s/2.gguf", dir)};
    for (int k = 0; k < 2; k++) {
        fmt_gguf_writer *w;
        mc_error err;
        assert_int_equal(fmt_gguf_writer_create(p[k], &w, &err), MC_OK);
        assert_int_equal(fmt_gguf_add_string(w, "a", "b", 1, &err), MC_OK);
        uint64_t ne[1] = {3};
        assert_int_equal(fmt_gguf_add_tensor(w, "t", FMT_GGUF_T_F32, 1, ne,
                                             &err), MC_OK);
        assert_int_equal(fmt_gguf_begin_data(w, &err), MC_OK);
        float v[3] = {1, 2, 3};
        assert_int_equal(fmt_gguf_write(w, v, sizeof v, &err), MC_OK);
        assert_int_equal(fmt_gguf_finish(w, &err), MC_OK);
    }
    size_t la, lb;
    char *a = tu_read_file(p[0], &la), *b = tu_read_file(p[1], &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    tu_rmtree(dir);
    free(p[0]);
    free(p[1]);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_header_bytes_follow_the_spec),
        cmocka_unit_test(test_gguf_every_metadata_type_reads_back),
        cmocka_unit_test(test_gguf_blocks_and_alignment),
        cmocka_unit_test(test_gguf_refuses_invalid_combinations_by_name),
        cmocka_unit_test(test_gguf_output_is_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

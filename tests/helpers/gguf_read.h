/*
 * gguf_read.h - an independent GGUF reader for the tests: it parses a file
 * the way ggml's gguf.cpp does (docs/gguf.md, version 3) and dequantizes
 * F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_0 rows from ggml's block definitions,
 * written from the specification rather than from formats/fmt_gguf.h, so a
 * test that round-trips through it checks the writer against the format
 * and not against itself.  Every length and offset is bounds-checked
 * (files are test outputs, but a broken writer must fail a test, not crash
 * it).
 */
#ifndef GGUF_READ_H
#define GGUF_READ_H

#include <stddef.h>
#include <stdint.h>

typedef struct tg_kv {
    char *key;              /* malloc'ed, NUL-terminated */
    uint32_t type;          /* GGUF value type (0..12) */
    uint32_t elem;          /* array element type (type 9 only) */
    uint64_t n;             /* array length (type 9 only) */
    const uint8_t *val;     /* first value byte (after type, elem and n) */
    uint64_t val_off;       /* its file offset */
} tg_kv;

typedef struct tg_tensor {
    char *name;             /* malloc'ed */
    uint32_t ndim;
    uint64_t ne[4];         /* ne[0] fastest */
    uint32_t type;          /* ggml type */
    uint64_t offset;        /* relative to the data section */
    uint64_t bytes;         /* from type and shape */
    const uint8_t *data;    /* view into buf */
} tg_tensor;

typedef struct tg_file {
    uint8_t *buf;           /* whole file, malloc'ed */
    size_t len;
    uint32_t version;
    uint32_t align;         /* general.alignment or 32 */
    uint64_t data_off;      /* file offset of the data section */
    size_t nkv, nt;
    tg_kv *kv;
    tg_tensor *t;
    char why[256];          /* reason tg_open failed */
} tg_file;

/* 0 on success; on failure -1 with f->why set (f is then closed). */
int tg_open(const char *path, tg_file *f);
void tg_close(tg_file *f);
const tg_kv *tg_kv_find(const tg_file *f, const char *key);
const tg_tensor *tg_tensor_find(const tg_file *f, const char *name);
/* Scalar getters (0 / "" when the key is absent or of another type). */
uint32_t tg_kv_u32(const tg_file *f, const char *key);
float tg_kv_f32(const tg_file *f, const char *key);
/* A string value: pointer into buf, length in *len. */
const char *tg_kv_str(const tg_file *f, const char *key, size_t *len);
/* Row r (of ne[1] rows of ne[0] elements) of a 1-D or 2-D tensor as floats
 * (out holds ne[0]); 0 on success, -1 for an unknown type. */
int tg_row_f32(const tg_tensor *t, uint64_t r, float *out);

#endif /* GGUF_READ_H */

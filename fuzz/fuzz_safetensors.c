/* fuzz_safetensors.c - the safetensors reader over arbitrary bytes.
 * Every input must either be rejected with a status and a message or
 * accepted with tensors whose views lie inside the input and tile the
 * data buffer; sanitizers catch everything else. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_st_file *f = NULL;
    mc_error err;
    mc_status st = fmt_st_open_memory(data, size, "fuzz.safetensors", &f, &err);
    if (st != MC_OK) {
        if (f || err.message[0] == '\0')
            abort(); /* a failure must say why and hand nothing out */
        return 0;
    }
    uint64_t expect = 0;
    for (size_t i = 0; i < fmt_st_count(f); i++) {
        const fmt_st_tensor *t = fmt_st_get(f, i);
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || (size_t)(p - data) > size - t->nbytes)
            abort();
        if (i == 0)
            expect = t->file_offset;
        if (t->file_offset != expect || fmt_st_find(f, t->name) != t)
            abort();
        expect += t->nbytes;
        volatile uint8_t sink = 0;
        for (uint64_t k = 0; k < t->nbytes; k++)
            sink ^= p[k]; /* touch every byte: ASan checks the bounds */
        (void)sink;
    }
    if (fmt_st_count(f) && expect != size)
        abort();
    for (size_t i = 0; i < fmt_st_metadata_count(f); i++) {
        const char *k, *v;
        if (!fmt_st_metadata_at(f, i, &k, &v) || strcmp(fmt_st_metadata(f, k), v))
            abort();
    }
    fmt_st_close(f);
    return 0;
}

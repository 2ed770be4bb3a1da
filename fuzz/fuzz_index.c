/* fuzz_index.c - model.safetensors.index.json parsing from memory
 * (fmt_model_parse_index: structure and shard names, no shard opened). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_model_index *ix = NULL;
    mc_error err;
    mc_status st = fmt_model_parse_index((const char *)data, size,
                                         "fuzz.index.json", &ix, &err);
    if (st != MC_OK) {
        if (ix || err.message[0] == '\0')
            abort();
        return 0;
    }
    size_t ns = fmt_model_index_shard_count(ix);
    for (size_t i = 0; i < ns; i++)
        if (!fmt_model_shard_name_ok(fmt_model_index_shard_name(ix, i)) ||
            (i > 0 && strcmp(fmt_model_index_shard_name(ix, i - 1),
                             fmt_model_index_shard_name(ix, i)) >= 0))
            abort(); /* shards: valid names, sorted, distinct */
    const char *prev = NULL;
    for (size_t i = 0; i < fmt_model_index_tensor_count(ix); i++) {
        size_t s = ns;
        const char *name = fmt_model_index_tensor(ix, i, &s);
        if (!name || s >= ns || (prev && strcmp(prev, name) >= 0))
            abort();
        prev = name;
    }
    fmt_model_index_free(ix);
    return 0;
}

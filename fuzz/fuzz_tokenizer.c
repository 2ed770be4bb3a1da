/* fuzz_tokenizer.c - tokenizer.json loader: any bytes must give MC_OK or an
 * error, never a crash or a leak.  A loaded tokenizer must then encode and
 * decode a fixed text, with every id inside [0, vocab_size). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rt_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rt_tokenizer *t = NULL;
    mc_error e;
    if (rt_tokenizer_load_memory(data, size, "fuzz", &t, &e) != MC_OK) {
        if (t)
            abort();
        return 0;
    }
    static const char text[] = "Hello world, h\xC3\xA9llo  \xE6\x97\xA5"
                               "\xF0\x9F\x98\x80 <s>x</s>\n\t12345 it's\xFF";
    int32_t ids[512];
    size_t n = 0;
    mc_status r = rt_tokenizer_encode(t, text, sizeof text - 1, 1, ids, 512,
                                      &n, &e);
    if (r == MC_OK) {
        size_t vs = rt_tokenizer_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (size_t)ids[i] >= vs)
                abort();
        char buf[4096];
        size_t len;
        r = rt_tokenizer_decode(t, ids, n, 0, buf, sizeof buf, &len);
        if (r == MC_OK && (len >= sizeof buf || strlen(buf) > len))
            abort();
    } else if (r != MC_ERR_INVALID_ARG && r != MC_ERR_NOMEM) {
        abort();
    }
    rt_tokenizer_free(t);
    return 0;
}

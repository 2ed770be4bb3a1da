/* fuzz_config.c - config.json parser: any bytes must give MC_OK or an
 * error, never a crash, a leak or an out-of-range field.  When parsing
 * succeeds, the serialized form must parse again to the same shape. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_config.h"
#include "mc_alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_model_config c, d;
    mc_error e;
    if (fmt_config_parse((const char *)data, size, "fuzz", &c, &e) != MC_OK)
        return 0;
    /* Invariants the rest of the project relies on. */
    if (c.hidden_size == 0 || c.num_heads == 0 || c.num_kv_heads == 0 ||
        c.num_heads % c.num_kv_heads || c.head_dim == 0 || c.head_dim % 2 ||
        c.vocab_size == 0 || c.num_layers == 0 || c.n_eos < 0 ||
        c.n_eos > FMT_MAX_EOS)
        abort();
    char *text = fmt_config_to_json(&c);
    if (!text)
        return 0; /* out of memory */
    if (fmt_config_parse(text, strlen(text), "fuzz-roundtrip", &d, &e) !=
            MC_OK ||
        d.hidden_size != c.hidden_size || d.head_dim != c.head_dim ||
        d.num_kv_heads != c.num_kv_heads || d.rope.type != c.rope.type ||
        d.sliding_window != c.sliding_window)
        abort();
    mc_free(text);
    return 0;
}

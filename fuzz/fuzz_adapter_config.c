/* fuzz_adapter_config.c - adapter_config.json parser: any bytes give MC_OK
 * or an error, never a crash or leak; a parsed config must answer module
 * selection and rank queries without failing. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_peft.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_peft_config c;
    mc_error e;
    if (fmt_peft_config_parse((const char *)data, size, "fuzz", &c, &e) !=
        MC_OK) {
        fmt_peft_config_free(&c);
        return 0;
    }
    static const char *const names[] = {
        "model.layers.0.self_attn.q_proj", "model.layers.13.mlp.down_proj",
        "lm_head", "model.embed_tokens", "q_proj", ""};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        uint32_t r = 0;
        double alpha = 0, s = 0;
        (void)fmt_peft_selects(&c, names[i], 1);
        fmt_peft_module_params(&c, names[i], &r, &alpha, &s);
        if (r == 0 || !(alpha > 0))
            abort(); /* parse guarantees r >= 1 and alpha > 0 */
    }
    fmt_peft_config_free(&c);
    return 0;
}

/* fuzz_export_tokenizer.c - tokenizer.json as GGUF tokenizer metadata
 * (compiler/cmp_export_tok.c): any bytes must give MC_OK or an error,
 * never a crash, a leak or an id outside the vocabulary.  The vocabulary
 * is fixed at 300 ids (the corpus' tokenizers use up to 271), so inputs
 * exercise both the accepted path and the out-of-range refusal.  The GGUF
 * is never committed: the writer's temp file is removed by abort. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmp_export.h"
#include "fmt_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = size % 2 ? FMT_ARCH_QWEN2 : FMT_ARCH_LLAMA;
    c.vocab_size = 300;
    c.bos_token_id = 1;
    c.eos_token_ids[0] = 2;
    c.n_eos = 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_export_tok_%d.gguf", (int)getpid());
    fmt_gguf_writer *w;
    mc_error e;
    if (fmt_gguf_writer_create(path, &w, &e) != MC_OK)
        return 0;
    char desc[64], note[512];
    if (cmp_export_gguf_tokenizer(w, (const char *)data, size, &c, "fuzz",
                                  desc, sizeof desc, note, sizeof note,
                                  &e) == MC_OK)
        fmt_gguf_begin_data(w, &e); /* serializes what was added */
    fmt_gguf_abort(w);
    return 0;
}

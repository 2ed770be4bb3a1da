/* fuzz_ids.c - token-id file parser: any bytes give MC_OK or MC_ERR_FORMAT,
 * never a crash or a leak; a parsed result is consistent (offsets rise to
 * n_ids, every sequence non-empty, every id in range). */
#include <stdint.h>
#include <stdlib.h>

#include "fmt_ids.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t vocabs[2] = {0, 512};
    for (int k = 0; k < 2; k++) {
        fmt_ids *f = NULL;
        mc_error e;
        mc_status r = fmt_ids_parse(data, size, "fuzz", vocabs[k], &f, &e);
        if (r != MC_OK) {
            if (f || (r != MC_ERR_FORMAT && r != MC_ERR_NOMEM) ||
                e.offset < 0 || (uint64_t)e.offset > size)
                abort();
            continue;
        }
        if (f->n_seqs == 0 || f->offsets[0] != 0 ||
            f->offsets[f->n_seqs] != f->n_ids)
            abort();
        for (size_t i = 0; i < f->n_seqs; i++)
            if (f->offsets[i + 1] <= f->offsets[i])
                abort();
        for (size_t i = 0; i < f->n_ids; i++)
            if (f->ids[i] < 0 || (vocabs[k] && (uint32_t)f->ids[i] >= vocabs[k]))
                abort();
        fmt_ids_free(f);
    }
    return 0;
}

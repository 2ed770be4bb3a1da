/* fuzz_artifact.c - the artifact reader (fmt_artifact.h) on arbitrary
 * bytes: the cheap open checks, the deep verify and every section read
 * (streaming zstd included) must reject or accept without crashing,
 * leaking or reading out of bounds.  Seeds: fuzz/corpus/artifact/ (tiny
 * artifacts: raw, zstd, no sections, a q8 tensor). */
#include <stdint.h>
#include <stdlib.h>

#include "fmt_artifact.h"
#include "mc_alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fmt_art *a = NULL;
    if (fmt_art_open_memory(data, size, "fuzz", &a, NULL) != MC_OK)
        return 0;
    (void)fmt_art_verify(a, NULL, NULL);
    for (size_t i = 0; i < fmt_art_section_count(a); i++) {
        const fmt_art_section *s = fmt_art_section_at(a, i);
        if (s->raw_bytes > (1u << 20))
            continue; /* a fuzzer-declared size; do not allocate it */
        void *buf = mc_malloc((size_t)s->raw_bytes + 1);
        if (buf)
            (void)fmt_art_section_read(a, i, buf, s->raw_bytes, 1, NULL);
        mc_free(buf);
    }
    for (size_t i = 0; i < fmt_art_tensor_count(a); i++)
        (void)fmt_art_find_tensor(a, fmt_art_tensor_at(a, i)->name);
    fmt_art_close(a);
    return 0;
}

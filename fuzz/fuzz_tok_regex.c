/* fuzz_tok_regex.c - the tokenizer's pattern layer (rt_tok_regex.c): any
 * pattern text must compile or be refused with a reason, never crash; a
 * compiled one must cut any text into spans that lie in order inside it,
 * under every Split behaviour, with and without invert.
 * Input: byte 0 picks the flavour (bit 0) and invert (bit 1); the pattern
 * runs to the first NUL; the text is the rest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mc_alloc.h"
#include "rt_tok_regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Spans must be in order, inside [0, n), and (but for raw) non-empty; raw
 * spans must cover the text exactly. */
static void check(const rt_tok_span *sp, size_t ns, size_t n, int raw)
{
    size_t at = 0;
    for (size_t i = 0; i < ns; i++) {
        if (sp[i].start > sp[i].end || sp[i].end > n || sp[i].start < at)
            abort();
        if (raw && sp[i].start != at)
            abort();
        if (!raw && sp[i].start == sp[i].end)
            abort();
        at = sp[i].end;
    }
    if (raw && at != n)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int flavour = data[0] & 1 ? RT_RE_PCRE : RT_RE_ONIG;
    int invert = (data[0] >> 1) & 1;
    const uint8_t *pat = data + 1;
    const uint8_t *nul = memchr(pat, 0, size - 1);
    size_t plen = nul ? (size_t)(nul - pat) : size - 1;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t n = (size_t)(data + size - text);
    rt_tok_re *re = NULL;
    char why[256];
    mc_status r = rt_tok_re_compile((const char *)pat, plen, flavour, &re, why,
                                    sizeof why);
    if (r) {
        if (re || (r != MC_ERR_UNSUPPORTED && r != MC_ERR_NOMEM) ||
            (r == MC_ERR_UNSUPPORTED && !why[0]))
            abort();
        return 0;
    }
    rt_tok_re_scratch *sc = rt_tok_re_scratch_new();
    if (!sc)
        abort();
    rt_tok_span *sp = NULL;
    size_t cap = 0;
    for (int beh = -1; beh <= RT_SPLIT_CONTIGUOUS; beh++) {
        for (int lit = 0; lit < 2; lit++) {
            size_t ns = 0;
            r = rt_tok_re_split(lit ? NULL : re, pat, plen, beh < 0 ? 0 : invert,
                                beh, sc, text, n, &sp, &ns, &cap);
            if (r == MC_OK)
                check(sp, ns, n, beh < 0);
            else if (r != MC_ERR_NOMEM && r != MC_ERR_INVALID_ARG)
                abort();
        }
    }
    mc_free(sp);
    rt_tok_re_scratch_free(sc);
    rt_tok_re_free(re);
    return 0;
}

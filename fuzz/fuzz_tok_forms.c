/* fuzz_tok_forms.c - any text through the ten tokenizer.json forms of
 * tests/data/tokenizer/ (every normalizer, pre-tokenizer, decoder and
 * added-token option; built with Hugging Face `tokenizers`): encode must
 * succeed with every id in range, and decode must give exactly the length
 * its size query promised. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const FORMS[] = {"smollm",     "gpt2",       "llama3",
                                    "qwen2",      "mistral",    "spm_legacy",
                                    "normalized", "splits",     "whitespace",
                                    "bert"};
#define N_FORMS (sizeof FORMS / sizeof *FORMS)
static rt_tokenizer *toks[N_FORMS];

static void load_forms(void)
{
    for (size_t k = 0; k < N_FORMS; k++) {
        char path[1024];
        mc_error e;
        snprintf(path, sizeof path, "%s/%s.json", MC_TOK_DATA, FORMS[k]);
        if (rt_tokenizer_load(path, &toks[k], &e) != MC_OK) {
            fprintf(stderr, "fuzz_tok_forms: %s: %s\n", path, e.message);
            abort();
        }
    }
}

static void cleanup(void)
{
    for (size_t k = 0; k < N_FORMS; k++)
        rt_tokenizer_free(toks[k]);
}

static void one(const rt_tokenizer *t, const char *text, size_t len,
                int special)
{
    size_t need = 0, n = 0;
    mc_error e;
    rt_tokenizer_encode(t, text, len, special, NULL, 0, &need, &e);
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    if (!ids || rt_tokenizer_encode(t, text, len, special, ids, need, &n, &e) ||
        n != need)
        abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= rt_tokenizer_vocab_size(t))
            abort();
    size_t dneed = 0, dlen = 0;
    rt_tokenizer_decode(t, ids, n, special, NULL, 0, &dneed);
    char *buf = malloc(dneed + 1);
    if (!buf || rt_tokenizer_decode(t, ids, n, special, buf, dneed + 1, &dlen) ||
        dlen != dneed)
        abort();
    free(buf);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!toks[0]) {
        load_forms();
        atexit(cleanup);
    }
    for (size_t k = 0; k < N_FORMS; k++)
        one(toks[k], (const char *)data, size, (int)(k & 1));
    return 0;
}

/* fuzz_calib_data.c - `mcompile --calib FILE` (cmp_calib_data_load) on
 * arbitrary bytes: the ids-or-text decision, the ids parser and the text
 * path (paragraphs, encoding with a fixed SentencePiece-style tokenizer,
 * BOS, cutting into sequences) must accept or reject without crashing or
 * leaking, and what they accept must keep the promises of
 * cmp_calib_data.h: at least one sequence, none empty, ids in range, text
 * sequences no longer than max_seq.  The tokenizer.json lives in a
 * per-process temporary model directory (removed at exit). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmp_calib_data.h"
#include "fuzz_tok_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64], g_tok[128], g_file[128];

static void cleanup(void)
{
    if (!g_dir[0])
        return;
    unlink(g_tok);
    unlink(g_file);
    rmdir(g_dir);
}

static void init(void)
{
    if (g_dir[0])
        return;
    snprintf(g_dir, sizeof g_dir, "/tmp/mc_fuzz_calib.XXXXXX");
    if (!mkdtemp(g_dir))
        abort();
    snprintf(g_tok, sizeof g_tok, "%s/tokenizer.json", g_dir);
    snprintf(g_file, sizeof g_file, "%s/calib.txt", g_dir);
    char *json = fuzz_spm_json("");
    FILE *f = fopen(g_tok, "wb");
    if (!f || fwrite(json, 1, strlen(json), f) != strlen(json) || fclose(f))
        abort();
    free(json);
    atexit(cleanup);
}

/* Load with one (vocab, max_seq) and check what is accepted. */
static void load_and_check(uint32_t vocab, uint32_t max_seq)
{
    fmt_ids *ids = NULL;
    int was_text = -1;
    mc_error e;
    if (cmp_calib_data_load(g_file, g_dir, vocab, max_seq, &ids, &was_text, NULL,
                            &e) != MC_OK) {
        if (ids || !e.message[0])
            abort(); /* an error leaves nothing and says something */
        return;
    }
    if (!ids || ids->n_seqs == 0 || ids->offsets[0] != 0 ||
        ids->offsets[ids->n_seqs] != ids->n_ids)
        abort();
    uint32_t cut = max_seq ? max_seq : CMP_CALIB_DATA_DEFAULT_SEQ;
    for (size_t s = 0; s < ids->n_seqs; s++) {
        size_t n = ids->offsets[s + 1] - ids->offsets[s];
        if (n == 0 || (was_text && n > cut))
            abort();
    }
    for (size_t i = 0; i < ids->n_ids; i++)
        if (ids->ids[i] < 0 || (vocab && (uint32_t)ids->ids[i] >= vocab))
            abort();
    fmt_ids_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    if (size > 1 << 16)
        return 0;
    FILE *f = fopen(g_file, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f))
        abort();
    load_and_check(0, 0);     /* no range check, 512-token sequences */
    load_and_check(271, 24);  /* the tokenizer's vocabulary, short cuts */
    load_and_check(16, 7);    /* a vocabulary the text does not fit */
    return 0;
}

/* fuzz_jsonl.c - a JSONL job line (rt_jsonl.h), with and without a
 * tokenizer: any bytes give MC_OK or MC_ERR_FORMAT (never a crash or a
 * leak); a parsed line is consistent (ids, labels, continuation in range
 * and counted), and its result line and an error line for it are valid
 * JSON that rt_jsonl_output_id reads back to the same id. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tok_json.h"
#include "rt_jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rt_tokenizer *g_tok;

static void check_id(const char *line, size_t len, const char *want,
                     int want_failed)
{
    char *id = NULL;
    int failed = -1;
    if (rt_jsonl_output_id(line, len, &id, &failed, NULL) != MC_OK ||
        strcmp(id, want) || failed != want_failed)
        abort();
    free(id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok) {
        char *spm = fuzz_spm_json("");
        if (rt_tokenizer_load_memory(spm, strlen(spm), "spm", &g_tok, NULL))
            abort();
        free(spm);
    }
    const rt_jsonl_defaults d = {.max_new_tokens = 4, .top_p = 1.0f,
                                 .add_special = 1};
    for (int k = 0; k < 2; k++) {
        rt_jsonl_req r;
        mc_error e;
        mc_status st = rt_jsonl_parse((const char *)data, size, 3, &d,
                                      k ? g_tok : NULL, &r, &e);
        if (st != MC_OK) {
            if ((st != MC_ERR_FORMAT && st != MC_ERR_NOMEM) || r.ids ||
                r.label_seq || r.label_len || r.label_json || r.cont || r.stop ||
                r.stop_str || r.stop_str_len)
                abort();
            rt_jsonl_req_free(&r);
            continue;
        }
        if (!r.id || (r.n_ids && !r.ids) || (r.n_cont && !r.cont) ||
            (r.n_labels && (!r.label_seq || !r.label_len || !r.label_json)) ||
            r.score != (r.n_labels || r.n_cont))
            abort();
        for (size_t i = 0; i < r.n_ids; i++)
            if (r.ids[i] < 0)
                abort();
        /* a label has at least one token, every token an id >= 0 */
        for (size_t i = 0; i < r.n_labels; i++) {
            if (!r.label_seq[i] || r.label_len[i] < 1 || !r.label_json[i])
                abort();
            for (size_t j = 0; j < r.label_len[i]; j++)
                if (r.label_seq[i][j] < 0)
                    abort();
        }
        for (size_t i = 0; i < r.n_stop_str; i++)
            if (!r.stop_str || !r.stop_str[i] || r.stop_str_len[i] < 1)
                abort();
        float *lp = calloc(r.n_labels + r.n_cont + 1, sizeof *lp);
        int32_t gen[2] = {1, 2};
        rt_jsonl_result res = {.prompt_tokens = r.n_ids, .gen_ids = gen,
                               .n_gen = 2, .text = (const char *)data,
                               .text_len = size < 64 ? size : 64,
                               .label_logprobs = lp,
                               .cont_logprobs = lp + r.n_labels};
        char *out;
        size_t len;
        if (rt_jsonl_format_result(&r, &res, &out, &len) != MC_OK ||
            out[len - 1] != '\n')
            abort();
        check_id(out, len - 1, r.id, 0);
        free(out);
        if (rt_jsonl_format_error(r.id, r.line, "fuzz \"error\"", 1, 2, &out,
                                  &len) != MC_OK)
            abort();
        check_id(out, len - 1, r.id, 1);
        free(out);
        free(lp);
        rt_jsonl_req_free(&r);
    }
    return 0;
}

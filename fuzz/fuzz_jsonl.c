/* fuzz_jsonl.c - a JSONL job line (rt_jsonl.h), with and without a
 * tokenizer: any bytes give MC_OK or MC_ERR_FORMAT (never a crash or a
 * leak); a parsed line is consistent (ids, labels, continuation in range
 * and counted), and its result line and an error line for it are valid
 * JSON that rt_jsonl_output_id reads back to the same id.  Parsed in the
 * job's scratch (rt_jsonl_parse_in) it gives the same request, or, when
 * the scratch is too small, an error; written through a 64-byte sink
 * (rt_jsonl_write_*), the same bytes as formatted. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_tok_json.h"
#include "rt_jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static rt_tokenizer *g_tok;

/* A sink that appends to a heap string. */
typedef struct acc {
    char *p;
    size_t n;
} acc;

static int acc_write(void *ctx, const char *p, size_t n)
{
    acc *a = ctx;
    char *q = realloc(a->p, a->n + n);
    if (!q)
        abort();
    memcpy(q + a->n, p, n);
    a->p = q;
    a->n += n;
    return 0;
}

/* out (len bytes) equals what the sink got; the sink is emptied. */
static void check_sink(acc *a, const char *out, size_t len)
{
    if (a->n != len || memcmp(a->p, out, len))
        abort();
    free(a->p);
    a->p = NULL;
    a->n = 0;
}

/* The same line parsed in a scratch (too small for big lines: 2 bytes
 * per byte) gives the same request as on the heap, or an error. */
static void check_scratch(const uint8_t *data, size_t size,
                          const rt_jsonl_defaults *d, const rt_jsonl_req *want,
                          mc_status want_st)
{
    rt_jsonl_scratch sc = {.cap = 2 * size + 4096};
    sc.buf = malloc(sc.cap);
    rt_jsonl_req r;
    mc_status st = rt_jsonl_parse_in((const char *)data, size, 3, d, g_tok,
                                     &sc, &r, NULL);
    if (st == MC_OK &&
        (want_st != MC_OK || strcmp(r.id, want->id) || r.n_ids != want->n_ids ||
         (r.n_ids && memcmp(r.ids, want->ids, r.n_ids * sizeof *r.ids)) ||
         r.n_labels != want->n_labels || r.n_cont != want->n_cont ||
         r.n_stop != want->n_stop || r.n_stop_str != want->n_stop_str ||
         rt_jsonl_req_bytes(&r) != rt_jsonl_req_bytes(want)))
        abort();
    if (st != MC_OK && want_st == MC_OK && !sc.exhausted)
        abort();
    rt_jsonl_req_free(&r);
    free(sc.buf);
}

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
        if (k)
            check_scratch(data, size, &d, &r, st);
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
        char sb[64];
        acc a = {0};
        rt_jsonl_sink sink = {sb, sizeof sb, acc_write, &a};
        if (rt_jsonl_write_result(&r, &res, &sink) != MC_OK)
            abort();
        check_sink(&a, out, len);
        free(out);
        if (rt_jsonl_format_error(r.id, r.line, "fuzz \"error\"", 1, 2, &out,
                                  &len) != MC_OK)
            abort();
        check_id(out, len - 1, r.id, 1);
        if (rt_jsonl_write_error(r.id, r.line, "fuzz \"error\"", 1, 2,
                                 &sink) != MC_OK)
            abort();
        check_sink(&a, out, len);
        free(out);
        free(lp);
        rt_jsonl_req_free(&r);
    }
    return 0;
}

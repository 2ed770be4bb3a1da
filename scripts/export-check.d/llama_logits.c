/* llama_logits.c - llama.cpp's side of scripts/export-check: load a GGUF,
 * run the prompt's ids with logits at every position, write them as
 * float32 [n][vocab], then print NGEN greedy ids (argmax, EOS ignored).
 * KV cache in f32 and flash attention off, like our runtime.
 *
 * usage: llama_logits MODEL.gguf "id id ..." NGEN LOGITS.f32
 *        llama_logits --tokenize MODEL.gguf TEXTS  (TEXTS: a file of
 *        texts, each a decimal byte count, a newline and that many bytes
 *        (texts may hold NUL bytes); for each, one line of ids, with
 *        BOS as the file's add_bos_token says and special tokens in the
 *        text recognised, as llama-server does with a prompt and as
 *        Hugging Face tokenizers' encode does) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static void quiet(enum ggml_log_level l, const char *t, void *u)
{
    (void)u;
    if (l >= GGML_LOG_LEVEL_WARN)
        fputs(t, stderr);
}

static int tokenize(const char *path, const char *texts)
{
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = 1;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) {
        fprintf(stderr, "llama.cpp could not load %s\n", path);
        return 1;
    }
    FILE *f = fopen(texts, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", texts);
        return 1;
    }
    static char text[1 << 16];
    static llama_token ids[1 << 16];
    size_t len;
    while (fscanf(f, "%zu", &len) == 1 && fgetc(f) == '\n') {
        if (len > sizeof text || fread(text, 1, len, f) != len) {
            fprintf(stderr, "%s: a text is cut short or too long\n", texts);
            return 1;
        }
        int n = llama_tokenize(llama_model_get_vocab(m), text, (int)len, ids,
                               1 << 16, 1, 1);
        if (n < 0)
            return 1;
        for (int i = 0; i < n; i++)
            printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
        if (n == 0)
            printf("\n");
    }
    fclose(f);
    llama_model_free(m);
    return 0;
}

/* One number of the command line: decimal digits only, in [0, hi]; the
 * script builds these arguments, so a bad one is its bug: exit 2.  (This
 * program links llama.cpp only, not formats/mc_parse.) */
static int arg_int(const char *what, const char *s, long hi)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s < '0' || *s > '9' || *end != '\0' || errno != 0 || v > hi) {
        fprintf(stderr, "llama_logits: %s: expected a number in [0, %ld], "
                "got '%s'\n", what, hi, s);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--tokenize") == 0) {
        llama_log_set(quiet, NULL);
        llama_backend_init();
        return tokenize(argv[2], argv[3]);
    }
    if (argc != 5) {
        fprintf(stderr, "usage: llama_logits MODEL.gguf IDS NGEN OUT.f32\n");
        return 2;
    }
    int ids[4096], n = 0, ngen = arg_int("NGEN", argv[3], 4096);
    for (char *p = strtok(argv[2], " "); p; p = strtok(NULL, " ")) {
        if (n == 4096) {
            fprintf(stderr, "llama_logits: IDS: expected at most 4096 ids\n");
            return 2;
        }
        ids[n++] = arg_int("IDS", p, INT32_MAX);
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) {
        fprintf(stderr, "llama.cpp could not load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n + ngen + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n + 16);
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) {
        fprintf(stderr, "llama.cpp could not make a context\n");
        return 1;
    }
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_init(n + 1, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    if (llama_decode(c, b)) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    FILE *f = fopen(argv[4], "wb");
    for (int i = 0; i < n; i++)
        fwrite(llama_get_logits_ith(c, i), sizeof(float), (size_t)V, f);
    fclose(f);
    int tok = argmax(llama_get_logits_ith(c, n - 1), V);
    for (int g = 0; g < ngen; g++) {
        printf("%d%c", tok, g + 1 < ngen ? ' ' : '\n');
        b.n_tokens = 1;
        b.token[0] = tok;
        b.pos[0] = n + g;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        if (llama_decode(c, b)) {
            fprintf(stderr, "llama_decode failed at step %d\n", g);
            return 1;
        }
        tok = argmax(llama_get_logits_ith(c, 0), V);
    }
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    return 0;
}

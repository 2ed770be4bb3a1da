/* mcrt_logits.c - our runtime's side of scripts/export-check: the same
 * outputs as llama_logits.c through the public API (runtime/mcrt.h):
 * logits at every prompt position as float32 [n][vocab], then NGEN greedy
 * ids with EOS ignored.
 *
 * usage: mcrt_logits MODEL "id id ..." NGEN LOGITS.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mcrt.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: mcrt_logits MODEL IDS NGEN OUT.f32\n");
        return 2;
    }
    int32_t ids[4096];
    size_t n = 0;
    uint32_t ngen = (uint32_t)atoi(argv[3]);
    for (char *p = strtok(argv[2], " "); p && n < 4096; p = strtok(NULL, " "))
        ids[n++] = atoi(p);
    mcrt_options o = {0};
    o.want_batch = 1;
    o.want_seq = n + ngen + 16;
    mcrt *h;
    if (mcrt_open(argv[1], &o, &h) != 0) {
        fprintf(stderr, "%s\n", mcrt_last_error(NULL));
        return 1;
    }
    mcrt_info info;
    mcrt_get_info(h, &info);
    float *lg = malloc(n * info.vocab_size * sizeof *lg);
    const int32_t *p[1] = {ids};
    size_t len[1] = {n};
    float *outs[1] = {lg};
    if (mcrt_logits(h, p, len, 1, outs) != 0) {
        fprintf(stderr, "%s\n", mcrt_last_error(h));
        return 1;
    }
    FILE *f = fopen(argv[4], "wb");
    fwrite(lg, sizeof *lg, n * info.vocab_size, f);
    fclose(f);
    int32_t *gen = malloc((ngen + 1) * sizeof *gen);
    mcrt_result r = {.ids = gen};
    mcrt_gen_params gp;
    mcrt_gen_params_default(&gp);
    gp.max_new_tokens = ngen;
    gp.temperature = 0;
    gp.use_model_eos = 0;
    if (mcrt_generate(h, p, len, 1, &gp, &r) != 0) {
        fprintf(stderr, "%s\n", mcrt_last_error(h));
        return 1;
    }
    for (size_t i = 0; i < r.n_ids; i++)
        printf("%d%c", gen[i], i + 1 < r.n_ids ? ' ' : '\n');
    free(gen);
    free(lg);
    mcrt_close(h);
    return 0;
}

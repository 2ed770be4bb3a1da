/* mcrt_logits.c - our runtime's side of scripts/export-check: the same
 * outputs as llama_logits.c through the public API (runtime/mcrt.h):
 * logits at every prompt position as float32 [n][vocab], then NGEN greedy
 * ids with EOS ignored.
 *
 * usage: mcrt_logits MODEL "id id ..." NGEN LOGITS.f32 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_parse.h"
#include "mcrt.h"

/* One number of the command line, strictly (formats/mc_parse.h); the
 * script builds these arguments, so a bad one is its bug: exit 2. */
static uint64_t arg_u64(const char *what, const char *s, uint64_t hi)
{
    uint64_t v = 0;
    char why[256];
    if (mc_parse_u64(what, s, 0, hi, &v, why, sizeof why) != 0) {
        fprintf(stderr, "mcrt_logits: %s\n", why);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: mcrt_logits MODEL IDS NGEN OUT.f32\n");
        return 2;
    }
    int32_t ids[4096];
    size_t n = 0;
    uint32_t ngen = (uint32_t)arg_u64("NGEN", argv[3], 4096);
    for (char *p = strtok(argv[2], " "); p; p = strtok(NULL, " ")) {
        if (n == 4096) {
            fprintf(stderr, "mcrt_logits: IDS: expected at most 4096 ids\n");
            return 2;
        }
        ids[n++] = (int32_t)arg_u64("IDS", p, INT32_MAX);
    }
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

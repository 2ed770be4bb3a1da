/*
 * bench_tokenizer.c - encode speed of the tokenizer on the ten tokenizer.json
 * forms of tests/data/tokenizer/: the corpus joined by newlines and repeated
 * to about 2 MB, encoded in one call; the median of 3 runs, in MB/s, and the
 * ratio to the baseline where there is one.
 *
 *   bench_tokenizer [DATA_DIR]     (default: tests/data/tokenizer)
 *
 * Baseline: this program built against the tokenizer of 6cbe577 (split
 * regexes hand-compiled, NFC taken as the identity; it loads 4 of the 10
 * forms, and its qwen2 ids differ on NFD text):
 *   mkdir -p /tmp/old && for f in $(git ls-tree --name-only 6cbe577 runtime/ |
 *     grep -E 'rt_tok|rt_tokenizer'); do git show 6cbe577:$f > /tmp/old/${f#runtime/};
 *     done && gcc -O2 -D_GNU_SOURCE -I/tmp/old -Iformats bench/bench_tokenizer.c
 *     /tmp/old/rt_*.c build/libmc_formats.a -ljansson -lzstd -lxxhash -lm
 *     -o /tmp/old/bench_old && /tmp/old/bench_old
 * The constants below are its MB/s on the development machine on
 * 2026-12-01, two runs interleaved with two of this one at load average
 * 18-20 on 2 shared cores (this one then: gpt2 2.15, llama3 2.35, qwen2
 * 1.58, spm_legacy 1.37).  The ratio means something only at the same
 * load: rerun both on a quiet machine.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_tokenizer.h"

static const struct {
    const char *name;
    double base_mb_s; /* 0: the baseline could not load it */
} FORMS[] = {{"smollm", 0},     {"gpt2", 1.96},     {"llama3", 1.88},
             {"qwen2", 1.97},    {"mistral", 0},     {"spm_legacy", 1.23},
             {"normalized", 0},  {"splits", 0},      {"whitespace", 0},
             {"bert", 0}};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "tests/data/tokenizer";
    char path[1024];
    snprintf(path, sizeof path, "%s/corpus.json", dir);
    json_error_t je;
    json_t *corpus = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!json_is_array(corpus)) {
        fprintf(stderr, "bench_tokenizer: %s: %s\n", path, je.text);
        return 1;
    }
    size_t one = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++)
        one += json_string_length(json_array_get(corpus, i)) + 1;
    size_t reps = (2u << 20) / (one ? one : 1) + 1, len = 0;
    char *text = malloc(reps * one + 1);
    if (!text)
        return 1;
    for (size_t r = 0; r < reps; r++)
        for (size_t i = 0; i < json_array_size(corpus); i++) {
            json_t *s = json_array_get(corpus, i);
            memcpy(text + len, json_string_value(s), json_string_length(s));
            len += json_string_length(s);
            text[len++] = '\n';
        }
    json_decref(corpus);
    printf("%-11s %10s %10s %8s %8s\n", "form", "MB", "ids", "MB/s",
           "vs base");
    for (size_t k = 0; k < sizeof FORMS / sizeof *FORMS; k++) {
        rt_tokenizer *t = NULL;
        mc_error e;
        snprintf(path, sizeof path, "%s/%s.json", dir, FORMS[k].name);
        if (rt_tokenizer_load(path, &t, &e)) {
            printf("%-11s (not loaded: %s)\n", FORMS[k].name, e.message);
            continue;
        }
        size_t need = 0, n = 0;
        rt_tokenizer_encode(t, text, len, 0, NULL, 0, &need, &e);
        int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
        double mbs[3];
        for (int run = 0; run < 3; run++) {
            double t0 = now();
            if (!ids || rt_tokenizer_encode(t, text, len, 0, ids, need, &n, &e))
                return 1;
            mbs[run] = (double)len / 1e6 / (now() - t0);
        }
        qsort(mbs, 3, sizeof *mbs, cmp_double);
        char ratio[32] = "-";
        if (FORMS[k].base_mb_s > 0)
            snprintf(ratio, sizeof ratio, "%.2fx", mbs[1] / FORMS[k].base_mb_s);
        printf("%-11s %10.2f %10zu %8.2f %8s\n", FORMS[k].name,
               (double)len / 1e6, n, mbs[1], ratio);
        free(ids);
        rt_tokenizer_free(t);
    }
    free(text);
    return 0;
}

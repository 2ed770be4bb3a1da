/* stories_ref.c - stories260k reference outputs (see stories_ref.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "stories_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int tu_stories_ref_ids(const char *dir, int32_t *ids, int max)
{
    char *p = tu_fmt("%s/reference/greedy_from_bos.ids", dir);
    char *text = tu_read_file(p, NULL);
    free(p);
    if (!text)
        return -1;
    int n = 0;
    char *s = text, *end;
    while (n < max) {
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        ids[n++] = (int32_t)v;
        s = end;
    }
    free(text);
    return n;
}

float *tu_stories_ref_logits(const char *dir, size_t n)
{
    /* Binary file: read with fread, not as text. */
    char *p = tu_fmt("%s/reference/greedy_logits_first64.f32", dir);
    FILE *f = fopen(p, "rb");
    free(p);
    if (!f)
        return NULL;
    float *v = malloc(n * sizeof(float));
    size_t got = v ? fread(v, sizeof(float), n, f) : 0;
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF) {
        free(v);
        return NULL;
    }
    return v;
}

void tu_logit_capture_row(tu_logit_capture *c, size_t step, const float *lg)
{
    if (step < c->max_rows) {
        memcpy(c->rows + step * c->vocab, lg, c->vocab * sizeof(float));
        c->got = step + 1;
    }
}

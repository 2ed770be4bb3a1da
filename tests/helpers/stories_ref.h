/*
 * stories_ref.h - the reference outputs that ship with stories260k
 * (<dir>/reference/), read by the tests that check a runtime against them.
 *
 *   greedy_from_bos.ids          text: BOS then the greedy ids, whitespace
 *                                separated
 *   greedy_logits_first64.f32    binary: float32 logits [64][vocab], host
 *                                byte order, nothing after them
 *
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h> and
 * <cmocka.h> (cmocka's rule), like testutil.h.
 */
#ifndef STORIES_REF_H
#define STORIES_REF_H

#include <stddef.h>
#include <stdint.h>

/* Reads up to max ids of dir/reference/greedy_from_bos.ids into ids.
 * Returns how many were read, or -1 if the file cannot be read. */
int tu_stories_ref_ids(const char *dir, int32_t *ids, int max);

/* Reads dir/reference/greedy_logits_first64.f32, which must hold exactly n
 * floats.  Returns them malloc'ed (the caller frees), or NULL if the file
 * is missing or not exactly n floats long. */
float *tu_stories_ref_logits(const char *dir, size_t n);

/* Logits rows captured from a generate call's on_logits callback. */
typedef struct tu_logit_capture {
    float *rows;     /* [max_rows][vocab], owned by the caller */
    size_t max_rows; /* rows kept; later steps are dropped */
    size_t vocab;    /* floats per row */
    size_t got;      /* 1 + the last step kept */
} tu_logit_capture;

/* Keeps the logits lg of decode step `step` in c when step < max_rows. */
void tu_logit_capture_row(tu_logit_capture *c, size_t step, const float *lg);

#endif /* STORIES_REF_H */

/*
 * rt_tok_pretok.c - the pre-tokenizers: Metaspace, ByteLevel and the cutting
 * ones (Split and those built on it: Digits, Whitespace, WhitespaceSplit,
 * Punctuation, BertPreTokenizer, CharDelimiterSplit), in any Sequence.
 *
 * A segment of text (between added tokens) becomes a list of pieces, each a
 * byte range of a work buffer.  Steps that change bytes (Metaspace,
 * ByteLevel's prefix space) write a new buffer; steps that only cut keep
 * the buffer and cut the pieces (rt_tok_re_split: Hugging Face's Split
 * behaviours).  Empty pieces are dropped, as Hugging Face drops empty
 * splits.  A piece keeps at_start (it begins at original offset 0, which
 * Metaspace's prepend_scheme "first" asks) only while it begins where its
 * parent began.
 */
#include <string.h>

#include "rt_tok_internal.h"

#define PIECES(b) ((rt_tok_piece *)(void *)(b)->p)
#define NPIECES(b) ((b)->len / sizeof(rt_tok_piece))

static int add_piece(rt_tok_buf *pb, size_t off, size_t len, int at_start)
{
    if (len == 0)
        return 1;
    rt_tok_piece p = {off, len, at_start};
    return rt_tok_buf_append(pb, &p, sizeof p);
}

static void swap(rt_tok_buf *a, rt_tok_buf *b)
{
    rt_tok_buf t = *a;
    *a = *b;
    *b = t;
}

/* One byte-changing step (Metaspace, ByteLevel's prefix) over every piece:
 * cur/pieces -> other/pieces2, then swapped back. */
static mc_status rewrite_step(const rt_tok_step *st, rt_tok_work *w)
{
    w->other.len = 0;
    w->pieces2.len = 0;
    size_t np = NPIECES(&w->pieces);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p = PIECES(&w->pieces)[k];
        const uint8_t *src = w->cur.p + p.off;
        size_t start = w->other.len;
        int ok = 1;
        if (st->kind == RT_PRE_METASPACE) {
            /* after replacing ' ', the piece starts with the replacement
             * iff it starts with ' ' or with the replacement already */
            int starts = src[0] == ' ' || (p.len >= st->a_len &&
                                           memcmp(src, st->a, st->a_len) == 0);
            int want = st->prepend == RT_PREPEND_ALWAYS ||
                       (st->prepend == RT_PREPEND_FIRST && p.at_start);
            if (want && !starts)
                ok = rt_tok_buf_append(&w->other, st->a, st->a_len);
            ok = ok && rt_tok_replace_into(&w->other, src, p.len,
                                           (const uint8_t *)" ", 1, st->a,
                                           st->a_len);
        } else { /* ByteLevel add_prefix_space */
            if (src[0] != ' ')
                ok = rt_tok_buf_append(&w->other, " ", 1);
            ok = ok && rt_tok_buf_append(&w->other, src, p.len);
        }
        if (!ok ||
            !add_piece(&w->pieces2, start, w->other.len - start, p.at_start))
            return MC_ERR_NOMEM;
    }
    swap(&w->cur, &w->other);
    swap(&w->pieces, &w->pieces2);
    return MC_OK;
}

/* Cut every piece by a pattern (re, or the literal lit when re is NULL). */
static mc_status split_step(const rt_tok_re *re, const uint8_t *lit,
                            size_t lit_len, int invert, int behaviour,
                            rt_tok_work *w)
{
    rt_tok_re_scratch *sc = NULL;
    if (re && !(sc = rt_tok_work_re(w)))
        return MC_ERR_NOMEM;
    w->pieces2.len = 0;
    size_t np = NPIECES(&w->pieces);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p = PIECES(&w->pieces)[k];
        w->n_spans = 0;
        mc_status r = rt_tok_re_split(re, lit, lit_len, invert, behaviour, sc,
                                      w->cur.p + p.off, p.len, &w->spans,
                                      &w->n_spans, &w->spans_cap);
        if (r)
            return r;
        for (size_t i = 0; i < w->n_spans; i++) {
            const rt_tok_span *sp = &w->spans[i];
            if (!add_piece(&w->pieces2, p.off + sp->start, sp->end - sp->start,
                           p.at_start && sp->start == 0))
                return MC_ERR_NOMEM;
        }
    }
    swap(&w->pieces, &w->pieces2);
    return MC_OK;
}

mc_status rt_tok_pretokenize(const rt_tokenizer *t, const uint8_t *text,
                             size_t n, int at_start, rt_tok_work *w)
{
    mc_status st = MC_OK;
    w->cur.len = 0;
    w->pieces.len = 0;
    if (!rt_tok_buf_append(&w->cur, text, n) ||
        !add_piece(&w->pieces, 0, n, at_start))
        return MC_ERR_NOMEM;
    for (size_t k = 0; k < t->n_pre && !st; k++) {
        const rt_tok_step *s = &t->pre[k];
        switch (s->kind) {
        case RT_PRE_SPLIT:
            st = split_step(s->re, s->a, s->a_len, s->invert, s->behaviour, w);
            break;
        case RT_PRE_METASPACE:
            st = rewrite_step(s, w);
            if (!st && s->split)
                st = split_step(NULL, s->a, s->a_len, 0, RT_SPLIT_MERGED_NEXT,
                                w);
            break;
        default: /* ByteLevel */
            if (s->add_prefix_space)
                st = rewrite_step(s, w);
            if (!st && s->use_regex)
                st = split_step(s->re, NULL, 0, 0, RT_SPLIT_ISOLATED, w);
        }
    }
    return st;
}

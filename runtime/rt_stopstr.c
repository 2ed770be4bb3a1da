/* rt_stopstr.c - stop strings matched token by token (see rt_stopstr.h). */
#include "rt_stopstr.h"

#include <stdlib.h>
#include <string.h>

struct rt_stop_pieces {
    size_t vocab;
    /* Token id's bytes as the first token with text of a sequence:
     * first[first_off[id] .. first_off[id + 1]); later in it: mid[...]. */
    char *first, *mid;
    size_t *first_off, *mid_off; /* [vocab + 1] */
    uint8_t *special;          /* [vocab] 1: skipped by the output's text */
    size_t max_piece;          /* longest piece, bytes */
    size_t heap_bytes;         /* what the tables hold (rt_stop_pieces_bytes) */
};

/* A growable byte array (table building only). */
typedef struct bytes {
    char *p;
    size_t n, cap;
} bytes;

static int bytes_put(bytes *b, const char *s, size_t n)
{
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (n > cap - b->n) {
            if (cap > SIZE_MAX / 2)
                return -1;
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

/* Decode ids[0..n) (specials skipped) into *buf (grown as needed).
 * Returns the length, or (size_t)-1 when the ids do not decode (an id
 * naming no token) or memory ran out (*nomem = 1). */
static size_t decode(const rt_tokenizer *tok, const int32_t *ids, size_t n,
                     char **buf, size_t *cap, int *nomem)
{
    size_t len = 0;
    mc_status st = rt_tokenizer_decode(tok, ids, n, 1, *buf, *cap, &len);
    if (st == MC_ERR_INVALID_ARG && len + 1 > *cap) {
        char *q = realloc(*buf, len + 1);
        if (!q) {
            *nomem = 1;
            return (size_t)-1;
        }
        *buf = q;
        *cap = len + 1;
        st = rt_tokenizer_decode(tok, ids, n, 1, *buf, *cap, &len);
    }
    if (st == MC_ERR_NOMEM)
        *nomem = 1;
    return st == MC_OK ? len : (size_t)-1;
}

void rt_stop_pieces_free(rt_stop_pieces *p)
{
    if (!p)
        return;
    free(p->first);
    free(p->mid);
    free(p->first_off);
    free(p->mid_off);
    free(p->special);
    free(p);
}

mc_status rt_stop_pieces_build(const rt_tokenizer *tok, rt_stop_pieces **out,
                               mc_error *err)
{
    *out = NULL;
    if (!tok)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "stop", -1,
                       "stop strings need a tokenizer (none is embedded in "
                       "the artifact or beside the model)");
    const size_t V = rt_tokenizer_vocab_size(tok);
    rt_stop_pieces *p = calloc(1, sizeof *p);
    bytes first = {0}, mid = {0};
    char *buf = malloc(256);
    size_t cap = 256;
    int nomem = !p || !buf;
    if (!nomem) {
        p->vocab = V;
        p->first_off = calloc(V + 1, sizeof *p->first_off);
        p->mid_off = calloc(V + 1, sizeof *p->mid_off);
        p->special = calloc(V ? V : 1, 1);
        nomem = !p->first_off || !p->mid_off || !p->special;
    }
    /* A reference token with text: a token's bytes after it are its
     * bytes later in any sequence.  Prefer one ASCII letter or digit. */
    int32_t ref = -1;
    for (size_t id = 0; !nomem && id < V && ref < 0; id++) {
        int32_t t = (int32_t)id;
        size_t n = rt_tokenizer_is_special(tok, t)
                       ? (size_t)-1
                       : decode(tok, &t, 1, &buf, &cap, &nomem);
        if (n == 1 && ((buf[0] >= 'a' && buf[0] <= 'z') ||
                       (buf[0] >= '0' && buf[0] <= '9')))
            ref = t;
    }
    size_t ref_len = 0;
    char ref_text[8] = "";
    if (ref >= 0 && !nomem) {
        ref_len = decode(tok, &ref, 1, &buf, &cap, &nomem);
        memcpy(ref_text, buf, ref_len);
    }
    for (size_t id = 0; !nomem && id < V; id++) {
        int32_t pair[2] = {ref, (int32_t)id};
        p->special[id] = (uint8_t)(rt_tokenizer_is_special(tok, pair[1]) != 0);
        size_t n = decode(tok, pair + 1, 1, &buf, &cap, &nomem);
        if (n == (size_t)-1)
            n = 0; /* names no token: no text */
        nomem |= bytes_put(&first, buf, n) != 0;
        p->first_off[id + 1] = first.n;
        if (n > p->max_piece)
            p->max_piece = n;
        if (ref >= 0) {
            size_t m = decode(tok, pair, 2, &buf, &cap, &nomem);
            if (m != (size_t)-1 && m >= ref_len &&
                !memcmp(buf, ref_text, ref_len)) {
                memmove(buf, buf + ref_len, m - ref_len);
                n = m - ref_len;
            } else { /* cannot tell: as if first */
                n = decode(tok, pair + 1, 1, &buf, &cap, &nomem);
                n = n == (size_t)-1 ? 0 : n;
            }
        }
        nomem |= bytes_put(&mid, buf, n) != 0;
        p->mid_off[id + 1] = mid.n;
        if (n > p->max_piece)
            p->max_piece = n;
    }
    free(buf);
    if (nomem) {
        free(first.p);
        free(mid.p);
        rt_stop_pieces_free(p);
        return mc_fail(err, MC_ERR_NOMEM, NULL, "stop", -1,
                       "the token text tables of stop strings");
    }
    p->first = first.p;
    p->mid = mid.p;
    p->heap_bytes = sizeof *p + first.cap + mid.cap +
                    2 * (V + 1) * sizeof *p->first_off + (V ? V : 1);
    *out = p;
    return MC_OK;
}

size_t rt_stop_pieces_bytes(const rt_stop_pieces *p)
{
    return p ? p->heap_bytes : 0;
}

size_t rt_stop_match_bytes(const rt_stop_pieces *p, const size_t *len,
                           size_t n)
{
    size_t longest = 1;
    for (size_t i = 0; i < n; i++)
        if (len[i] > longest)
            longest = len[i];
    return longest - 1 + p->max_piece + 1;
}

void rt_stop_match_init(rt_stop_match *m, const rt_stop_pieces *p,
                        const char *const *str, const size_t *len, size_t n,
                        char *win)
{
    size_t longest = 1;
    for (size_t i = 0; i < n; i++)
        if (len[i] > longest)
            longest = len[i];
    *m = (rt_stop_match){.pieces = p, .str = str, .len = len, .n = n,
                         .win = win, .keep = longest - 1};
}

int rt_stop_match_push(rt_stop_match *m, int32_t id)
{
    const rt_stop_pieces *p = m->pieces;
    if (id < 0 || (size_t)id >= p->vocab || p->special[id])
        return 0;
    const char *s = m->started ? p->mid + p->mid_off[id]
                               : p->first + p->first_off[id];
    size_t n = m->started ? p->mid_off[id + 1] - p->mid_off[id]
                          : p->first_off[id + 1] - p->first_off[id];
    m->started = 1;
    size_t old = m->used;
    memcpy(m->win + old, s, n);
    m->used += n;
    int hit = 0;
    /* Only matches that end in the new bytes: the others ended before. */
    for (size_t k = 0; k < m->n && !hit && n > 0; k++) {
        size_t L = m->len[k];
        if (L > m->used)
            continue;
        size_t lo = old + 1 > L ? old + 1 - L : 0;
        for (size_t at = lo; at + L <= m->used && !hit; at++)
            hit = !memcmp(m->win + at, m->str[k], L);
    }
    if (m->used > m->keep) {
        memmove(m->win, m->win + m->used - m->keep, m->keep);
        m->used = m->keep;
    }
    return hit;
}

size_t rt_stop_find(const char *text, size_t len, const char *const *str,
                    const size_t *slen, size_t n)
{
    size_t best = len;
    for (size_t k = 0; k < n; k++)
        for (size_t at = 0; slen[k] <= len && at + slen[k] <= len &&
                            at < best;
             at++)
            if (!memcmp(text + at, str[k], slen[k])) {
                best = at;
                break;
            }
    return best;
}

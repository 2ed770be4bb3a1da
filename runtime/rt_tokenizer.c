/*
 * rt_tokenizer.c - loading entry points, encode (added tokens, segments,
 * template) and decode (the decoder pipeline), accessors.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_file.h"
#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_tok_internal.h"
#include "rt_tok_unicode.h"

/* tokenizer.json files larger than this are refused (the largest real ones
 * are ~20 MB). */
#define RT_TOK_MAX_FILE ((size_t)1 << 30)

mc_status rt_tokenizer_load_memory(const void *data, size_t len,
                                   const char *name, rt_tokenizer **out,
                                   mc_error *err)
{
    if (!out || (!data && len))
        return mc_fail(err, MC_ERR_INVALID_ARG, name, NULL, -1,
                       "rt_tokenizer_load_memory: NULL argument");
    *out = NULL;
    rt_tokenizer *t = mc_calloc(1, sizeof *t);
    if (!t)
        return mc_fail(err, MC_ERR_NOMEM, name, NULL, -1,
                       "out of memory while loading the tokenizer");
    mc_status r =
        rt_tok_parse(t, data ? data : "", len, name ? name : "<memory>", err);
    if (r) {
        rt_tokenizer_free(t);
        return r;
    }
    *out = t;
    return MC_OK;
}


mc_status rt_tokenizer_load(const char *path, rt_tokenizer **out, mc_error *err)
{
    if (!path || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_tokenizer_load: NULL argument");
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    mc_status r = fmt_file_read(path, RT_TOK_MAX_FILE, "1 GiB", &data, &len, err);
    if (r)
        return r;
    rt_tokenizer *t;
    r = rt_tokenizer_load_memory(data, len, path, &t, err);
    mc_free(data);
    if (r)
        return r;
    /* tokenizer_config.json next to it names BOS/EOS when present */
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    static const char cfg_name[] = "tokenizer_config.json";
    char *cfg = mc_malloc(dir_len + sizeof cfg_name);
    if (!cfg) {
        rt_tokenizer_free(t);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    }
    memcpy(cfg, path, dir_len);
    memcpy(cfg + dir_len, cfg_name, sizeof cfg_name);
    struct stat st;
    if (stat(cfg, &st) == 0 && (r = rt_tok_read_config(t, cfg, err))) {
        mc_free(cfg);
        rt_tokenizer_free(t);
        return r;
    }
    mc_free(cfg);
    *out = t;
    return MC_OK;
}

void rt_tokenizer_free(rt_tokenizer *tok)
{
    if (!tok)
        return;
    rt_tok_free_internal(tok);
    mc_free(tok);
}

size_t rt_tokenizer_vocab_size(const rt_tokenizer *tok)
{
    return tok ? tok->vocab_size : 0;
}

int32_t rt_tokenizer_bos(const rt_tokenizer *tok)
{
    return tok ? tok->bos_id : -1;
}

int32_t rt_tokenizer_eos(const rt_tokenizer *tok)
{
    return tok ? tok->eos_id : -1;
}

int32_t rt_tokenizer_token_to_id(const rt_tokenizer *tok, const char *s,
                                 size_t len)
{
    if (!tok || (!s && len))
        return -1;
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->added[i].text, s, len) == 0)
            return tok->added[i].id;
    return rt_tok_vocab_find(tok, (const uint8_t *)(s ? s : ""), len);
}

const char *rt_tokenizer_id_to_token(const rt_tokenizer *tok, int32_t id,
                                     size_t *len)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->vocab_size || !tok->flags[id])
        return NULL;
    if (len)
        *len = tok->tok_len[id];
    return (const char *)tok->pool + tok->tok_off[id];
}

int rt_tokenizer_is_special(const rt_tokenizer *tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->vocab_size)
        return 0;
    return (tok->flags[id] & RT_TOK_F_SPECIAL) != 0;
}

/* ---- encode ---- */

typedef struct enc_work {
    rt_tok_buf out; /* int32 ids */
    rt_tok_buf cur, other, pieces, pieces2;
    rt_tok_bpe_work bpe;
} enc_work;

static mc_status encode_segment(const rt_tokenizer *t, enc_work *w,
                                const uint8_t *s, size_t n, int at_start)
{
    if (n == 0)
        return MC_OK;
    mc_status r = rt_tok_pretokenize(t, s, n, at_start, &w->cur, &w->other,
                                     &w->pieces, &w->pieces2);
    if (r)
        return r;
    size_t np = w->pieces.len / sizeof(rt_tok_piece);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p;
        memcpy(&p, w->pieces.p + k * sizeof p, sizeof p);
        const uint8_t *s = w->cur.p + p.off;
        size_t start = 0;
        if (t->chunk) {
            /* cut before a symbol run that follows another character */
            const uint8_t *sym = t->chunk_sym;
            size_t sl = t->chunk_sym_len;
            for (size_t i = 1; i + sl <= p.len; i++) {
                if (memcmp(s + i, sym, sl) != 0)
                    continue;
                if (i >= sl && memcmp(s + i - sl, sym, sl) == 0)
                    continue;
                if ((r = rt_tok_bpe_word(t, &w->bpe, s + start, i - start,
                                         &w->out)))
                    return r;
                start = i;
            }
        }
        if ((r = rt_tok_bpe_word(t, &w->bpe, s + start, p.len - start,
                                 &w->out)))
            return r;
    }
    return MC_OK;
}

static int is_ascii_space(uint8_t c)
{
    return c == ' ' || (c >= 0x09 && c <= 0x0D);
}

/* Longest added token at s[i..n), or NULL. */
static const rt_tok_added *match_added(const rt_tokenizer *t, const uint8_t *s,
                                       size_t n, size_t i)
{
    if (!t->added_first[s[i]])
        return NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        const rt_tok_added *a = &t->added[k];
        if (a->len <= n - i && a->text[0] == s[i] &&
            memcmp(a->text, s + i, a->len) == 0)
            return a;
    }
    return NULL;
}

static int emit_template(const rt_tokenizer *t, enc_work *w, int before)
{
    size_t i = 0;
    while (i < t->n_tmpl && t->tmpl[i] >= 0 && before)
        if (!rt_tok_buf_append(&w->out, &t->tmpl[i++], sizeof(int32_t)))
            return 0;
    if (before)
        return 1;
    while (i < t->n_tmpl && t->tmpl[i] >= 0)
        i++;
    for (i++; i < t->n_tmpl; i++)
        if (!rt_tok_buf_append(&w->out, &t->tmpl[i], sizeof(int32_t)))
            return 0;
    return 1;
}

mc_status rt_tokenizer_encode(const rt_tokenizer *tok, const char *text,
                              size_t len, int add_special, int32_t *ids,
                              size_t cap, size_t *n, mc_error *err)
{
    if (n)
        *n = 0;
    if (!tok || !n || (!text && len) || (!ids && cap))
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_tokenizer_encode: NULL argument");
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    enc_work w;
    memset(&w, 0, sizeof w);
    mc_status r = MC_OK;
    if (add_special && !emit_template(tok, &w, 1))
        r = MC_ERR_NOMEM;
    size_t seg = 0, i = 0;
    while (!r && i < len) {
        const rt_tok_added *a = match_added(tok, s, len, i);
        if (!a) {
            i++;
            continue;
        }
        size_t end = i;
        if (a->lstrip)
            while (end > seg && is_ascii_space(s[end - 1]))
                end--;
        r = encode_segment(tok, &w, s + seg, end - seg, seg == 0);
        if (!r && !rt_tok_buf_append(&w.out, &a->id, sizeof a->id))
            r = MC_ERR_NOMEM;
        i += a->len;
        if (a->rstrip)
            while (i < len && is_ascii_space(s[i]))
                i++;
        seg = i;
    }
    if (!r)
        r = encode_segment(tok, &w, s + seg, len - seg, seg == 0);
    if (!r && add_special && !emit_template(tok, &w, 0))
        r = MC_ERR_NOMEM;
    size_t count = w.out.len / sizeof(int32_t);
    if (!r) {
        *n = count;
        if (count > cap)
            r = mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                        "the text encodes to %zu ids, buffer holds %zu", count,
                        cap);
        else if (count)
            memcpy(ids, w.out.p, w.out.len);
    } else if (r == MC_ERR_NOMEM) {
        mc_fail(err, r, NULL, NULL, -1, "out of memory while encoding");
    } else {
        mc_fail(err, r, NULL, NULL, -1, "a pre-tokenized word is too long");
    }
    mc_free(w.out.p);
    mc_free(w.cur.p);
    mc_free(w.other.p);
    mc_free(w.pieces.p);
    mc_free(w.pieces2.p);
    rt_tok_bpe_work_free(&w.bpe);
    return r;
}

/* ---- decode ---- */

/* Token list during decoding: texts in bytes, spans (off, len) pairs. */
typedef struct tok_list {
    rt_tok_buf bytes;
    rt_tok_buf spans; /* size_t pairs */
} tok_list;

static int list_add(tok_list *l, const void *p, size_t n)
{
    size_t span[2] = {l->bytes.len, n};
    return rt_tok_buf_append(&l->bytes, p, n) &&
           rt_tok_buf_append(&l->spans, span, sizeof span);
}

static size_t list_count(const tok_list *l)
{
    return l->spans.len / (2 * sizeof(size_t));
}

static const uint8_t *list_get(const tok_list *l, size_t i, size_t *n)
{
    size_t span[2];
    memcpy(span, l->spans.p + i * sizeof span, sizeof span);
    *n = span[1];
    return l->bytes.p ? l->bytes.p + span[0] : (const uint8_t *)"";
}

/* "<0xHH>" -> byte value, or -1. */
static int byte_token(const uint8_t *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        int c = s[k], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Apply one decoder step: in -> out (out is cleared first). */
static int decode_step(const rt_tokenizer *t, const rt_tok_step *st,
                       const tok_list *in, tok_list *out)
{
    size_t cnt = list_count(in), n;
    out->bytes.len = out->spans.len = 0;
    if (st->kind == RT_DEC_FUSE) {
        return list_add(out, in->bytes.p ? in->bytes.p : (const uint8_t *)"",
                        in->bytes.len);
    }
    if (st->kind == RT_DEC_BYTEFALLBACK) {
        size_t start = 0;
        int in_group = 0;
        for (size_t i = 0; i < cnt; i++) {
            const uint8_t *s = list_get(in, i, &n);
            int b = byte_token(s, n);
            if (b >= 0) {
                if (!in_group) {
                    start = out->bytes.len;
                    in_group = 1;
                }
                uint8_t c = (uint8_t)b;
                if (!rt_tok_buf_append(&out->bytes, &c, 1))
                    return 0;
                continue;
            }
            if (in_group) {
                size_t span[2] = {start, out->bytes.len - start};
                if (!rt_tok_buf_append(&out->spans, span, sizeof span))
                    return 0;
                in_group = 0;
            }
            if (!list_add(out, s, n))
                return 0;
        }
        if (in_group) {
            size_t span[2] = {start, out->bytes.len - start};
            if (!rt_tok_buf_append(&out->spans, span, sizeof span))
                return 0;
        }
        return 1;
    }
    for (size_t i = 0; i < cnt; i++) {
        const uint8_t *s = list_get(in, i, &n);
        size_t start = out->bytes.len;
        int ok = 1;
        switch (st->kind) {
        case RT_DEC_REPLACE:
            ok = rt_tok_replace_into(&out->bytes, s, n, st->a, st->a_len, st->b,
                                     st->b_len);
            break;
        case RT_DEC_STRIP: {
            size_t b = 0, e = n;
            for (size_t k = 0; k < st->start && e - b >= st->a_len &&
                               memcmp(s + b, st->a, st->a_len) == 0;
                 k++)
                b += st->a_len;
            for (size_t k = 0; k < st->stop && e - b >= st->a_len &&
                               memcmp(s + e - st->a_len, st->a, st->a_len) == 0;
                 k++)
                e -= st->a_len;
            ok = rt_tok_buf_append(&out->bytes, s + b, e - b);
            break;
        }
        case RT_DEC_METASPACE: {
            int drop = i == 0 && st->prepend != RT_PREPEND_NEVER;
            size_t k = 0;
            while (ok && k < n) {
                if (n - k >= st->a_len &&
                    memcmp(s + k, st->a, st->a_len) == 0) {
                    if (!drop)
                        ok = rt_tok_buf_append(&out->bytes, " ", 1);
                    k += st->a_len;
                } else {
                    ok = rt_tok_buf_append(&out->bytes, s + k, 1);
                    k++;
                }
            }
            break;
        }
        case RT_DEC_BYTELEVEL: {
            /* every char must be in the byte-level alphabet, else the
             * token's own bytes (HF does the same) */
            ok = rt_tok_buf_reserve(&out->bytes, n);
            for (size_t k = 0; ok && k < n;) {
                uint32_t cp;
                k += rt_tok_utf8_next(s + k, n - k, &cp);
                if (cp >= 324 || t->bl_byte[cp] < 0) {
                    out->bytes.len = start;
                    ok = rt_tok_buf_append(&out->bytes, s, n);
                    break;
                }
                out->bytes.p[out->bytes.len++] = (uint8_t)t->bl_byte[cp];
            }
            break;
        }
        default:
            ok = rt_tok_buf_append(&out->bytes, s, n);
        }
        size_t span[2] = {start, out->bytes.len - start};
        if (!ok || !rt_tok_buf_append(&out->spans, span, sizeof span))
            return 0;
    }
    return 1;
}

mc_status rt_tokenizer_decode(const rt_tokenizer *tok, const int32_t *ids,
                              size_t n, int skip_special, char *buf, size_t cap,
                              size_t *len)
{
    if (len)
        *len = 0;
    if (buf && cap)
        buf[0] = '\0';
    if (!tok || !len || (!ids && n) || (!buf && cap))
        return MC_ERR_INVALID_ARG;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok->vocab_size ||
            !tok->flags[ids[i]])
            return MC_ERR_INVALID_ARG;
    tok_list a = {{0}}, b = {{0}};
    mc_status r = MC_OK;
    for (size_t i = 0; i < n && !r; i++) {
        if (skip_special && (tok->flags[ids[i]] & RT_TOK_F_SPECIAL))
            continue;
        /* no decoder: HF joins the tokens with spaces; the space goes
         * into the token's span so the final concatenation keeps it */
        size_t start = a.bytes.len;
        int sep = !tok->has_decoder && list_count(&a) > 0;
        size_t span[2];
        if ((sep && !rt_tok_buf_append(&a.bytes, " ", 1)) ||
            !rt_tok_buf_append(&a.bytes, tok->pool + tok->tok_off[ids[i]],
                               tok->tok_len[ids[i]]))
            r = MC_ERR_NOMEM;
        span[0] = start;
        span[1] = a.bytes.len - start;
        if (!r && !rt_tok_buf_append(&a.spans, span, sizeof span))
            r = MC_ERR_NOMEM;
    }
    for (size_t k = 0; k < tok->n_dec && !r; k++) {
        if (!decode_step(tok, &tok->dec[k], &a, &b)) {
            r = MC_ERR_NOMEM;
            break;
        }
        tok_list tmp = a;
        a = b;
        b = tmp;
    }
    if (!r) {
        /* the tokens' bytes are contiguous in order after every step */
        size_t total = 0, cnt = list_count(&a), m;
        for (size_t i = 0; i < cnt; i++) {
            list_get(&a, i, &m);
            total += m;
        }
        *len = total;
        if (total >= cap) {
            r = MC_ERR_INVALID_ARG;
        } else {
            size_t o = 0;
            for (size_t i = 0; i < cnt; i++) {
                const uint8_t *s = list_get(&a, i, &m);
                if (m)
                    memcpy(buf + o, s, m);
                o += m;
            }
            buf[o] = '\0';
        }
    }
    mc_free(a.bytes.p);
    mc_free(a.spans.p);
    mc_free(b.bytes.p);
    mc_free(b.spans.p);
    return r;
}

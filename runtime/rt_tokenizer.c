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

const uint8_t *rt_tok_text(const rt_tokenizer *t, int32_t id, size_t *len)
{
    if (t->flags[id] & RT_TOK_F_NORMALIZED)
        for (size_t i = 0; i < t->n_added; i++)
            if (t->added[i].id == id) {
                *len = t->added[i].nlen;
                return t->added[i].ntext;
            }
    *len = t->tok_len[id];
    return t->pool + t->tok_off[id];
}

const char *rt_tokenizer_id_to_token(const rt_tokenizer *tok, int32_t id,
                                     size_t *len)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->vocab_size || !tok->flags[id])
        return NULL;
    size_t n;
    const uint8_t *s = rt_tok_text(tok, id, &n);
    if (len)
        *len = n;
    return (const char *)s;
}

int rt_tokenizer_is_special(const rt_tokenizer *tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->vocab_size)
        return 0;
    return (tok->flags[id] & RT_TOK_F_SPECIAL) != 0;
}

/* ---- encode ---- */

typedef struct enc_work {
    rt_tok_buf out;         /* int32 ids */
    rt_tok_buf norm, ntmp;  /* a segment's normalized text */
    rt_tok_buf raw_spans, norm_spans; /* added_span arrays */
    rt_tok_work pre;        /* normalizer / pre-tokenizer scratch */
    rt_tok_bpe_work bpe;
} enc_work;

/* BPE over every piece of w->pre (the pre-tokenized segment). */
static mc_status encode_pieces(const rt_tokenizer *t, enc_work *w)
{
    mc_status r;
    size_t np = w->pre.pieces.len / sizeof(rt_tok_piece);
    for (size_t k = 0; k < np; k++) {
        rt_tok_piece p;
        memcpy(&p, w->pre.pieces.p + k * sizeof p, sizeof p);
        const uint8_t *s = w->pre.cur.p + p.off;
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

/* A stretch of a text: an added token (id >= 0) or text for the model. */
typedef struct added_span {
    size_t start, end; /* bytes */
    int32_t id;        /* -1: not an added token */
} added_span;

#define SPANS(b) ((const added_span *)(const void *)(b)->p)
#define NSPANS(b) ((b)->len / sizeof(added_span))

/* The character before s[i] (i > 0), decoded from its start. */
static uint32_t char_before(const uint8_t *s, size_t i)
{
    size_t k = i - 1, back = 0;
    while (k > 0 && back < 3 && (s[k] & 0xC0) == 0x80) {
        k--;
        back++;
    }
    uint32_t cp;
    if (rt_tok_utf8_next(s + k, i - k, &cp) != i - k)
        return RT_TOK_BAD_CP;
    return cp;
}

/* Rust regex \w on one character (single_word). */
static int is_word_char(const rt_tokenizer *t, uint32_t cp)
{
    uint8_t u[4];
    size_t n;
    rt_tok_span *sp = NULL;
    size_t ns = 0, cap = 0;
    if (cp == RT_TOK_BAD_CP || !t->word_re)
        return 0;
    n = rt_tok_utf8_put(cp, u);
    rt_tok_re_scratch *sc = rt_tok_re_scratch_new();
    int word = 0;
    if (sc && rt_tok_re_split(t->word_re, NULL, 0, 0, -1, sc, u, n, &sp, &ns,
                              &cap) == MC_OK)
        word = ns == 1 && sp[0].match;
    mc_free(sp);
    rt_tok_re_scratch_free(sc);
    return word;
}

/* Hugging Face's AddedVocabulary::find_matches over s[0..n) for one set of
 * added tokens (normalized or not): leftmost-longest matches, single_word
 * matches between non-word characters only, lstrip / rstrip taking the
 * White_Space beside the token.  Appends spans covering s to out. */
static int added_spans(const rt_tokenizer *t, int normalized, const uint8_t *s,
                       size_t n, rt_tok_buf *out)
{
    size_t pos = 0, start_offset = 0;
    out->len = 0;
    while (pos < n) {
        const rt_tok_added *a = NULL;
        size_t i = pos;
        for (; i < n && !a; i++) {
            if (!t->added_first[normalized][s[i]])
                continue;
            for (size_t k = 0; k < t->n_added && !a; k++) {
                const rt_tok_added *c = &t->added[k];
                const uint8_t *txt = normalized ? c->ntext : c->text;
                size_t len = normalized ? c->nlen : c->len;
                if (c->normalized == normalized && len && len <= n - i &&
                    txt[0] == s[i] && memcmp(txt, s + i, len) == 0)
                    a = c;
            }
        }
        if (!a)
            break;
        size_t start = i - 1, stop = start + (normalized ? a->nlen : a->len);
        pos = stop; /* the search goes on after the match, kept or not */
        if (a->single_word) {
            uint32_t cp;
            if ((start > 0 && is_word_char(t, char_before(s, start))) ||
                (stop < n && (rt_tok_utf8_next(s + stop, n - stop, &cp),
                              is_word_char(t, cp))))
                continue;
        }
        if (a->lstrip) {
            size_t b = start;
            while (b > start_offset) {
                uint32_t cp = char_before(s, b);
                uint8_t u[4];
                if (!rt_tok_is_space(cp))
                    break;
                b -= rt_tok_utf8_put(cp, u);
            }
            start = b;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = rt_tok_utf8_next(s + stop, n - stop, &cp);
                if (!rt_tok_is_space(cp))
                    break;
                stop += l;
            }
        }
        added_span gap = {start_offset, start, -1}, tok = {start, stop, a->id};
        if ((start_offset < start && !rt_tok_buf_append(out, &gap, sizeof gap)) ||
            !rt_tok_buf_append(out, &tok, sizeof tok))
            return 0;
        start_offset = stop;
        if (pos < stop)
            pos = stop;
    }
    added_span rest = {start_offset, n, -1};
    return start_offset >= n || rt_tok_buf_append(out, &rest, sizeof rest);
}

static int emit_id(enc_work *w, int32_t id)
{
    return rt_tok_buf_append(&w->out, &id, sizeof id);
}

/* Text between raw-matched added tokens: normalize, find the normalized
 * added tokens, pre-tokenize and BPE the rest. */
static mc_status encode_segment(const rt_tokenizer *t, enc_work *w,
                                const uint8_t *s, size_t n, int at_start)
{
    int lost = 0;
    mc_status r = rt_tok_normalize(t, s, n, &w->norm, &w->ntmp, &w->pre,
                                   &lost);
    if (r)
        return r;
    if (!added_spans(t, 1, w->norm.p, w->norm.len, &w->norm_spans))
        return MC_ERR_NOMEM;
    for (size_t k = 0; k < NSPANS(&w->norm_spans); k++) {
        added_span sp = SPANS(&w->norm_spans)[k];
        if (sp.id >= 0) {
            if (!emit_id(w, sp.id))
                return MC_ERR_NOMEM;
            continue;
        }
        r = rt_tok_pretokenize(t, w->norm.p + sp.start, sp.end - sp.start,
                               at_start && !lost && sp.start == 0, &w->pre);
        if (!r)
            r = encode_pieces(t, w);
        if (r)
            return r;
    }
    return MC_OK;
}

static int emit_template(const rt_tokenizer *t, enc_work *w, int before)
{
    size_t i = 0;
    while (i < t->n_tmpl && t->tmpl[i] >= 0 && before)
        if (!emit_id(w, t->tmpl[i++]))
            return 0;
    if (before)
        return 1;
    while (i < t->n_tmpl && t->tmpl[i] >= 0)
        i++;
    for (i++; i < t->n_tmpl; i++)
        if (!emit_id(w, t->tmpl[i]))
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
    if (!r && !added_spans(tok, 0, s, len, &w.raw_spans))
        r = MC_ERR_NOMEM;
    for (size_t k = 0; !r && k < NSPANS(&w.raw_spans); k++) {
        added_span sp = SPANS(&w.raw_spans)[k];
        if (sp.id >= 0)
            r = emit_id(&w, sp.id) ? MC_OK : MC_ERR_NOMEM;
        else
            r = encode_segment(tok, &w, s + sp.start, sp.end - sp.start,
                               sp.start == 0);
    }
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
    } else if (r == MC_ERR_OVERFLOW) {
        mc_fail(err, r, "tokenizer.json", "normalizer", -1,
                "the normalizer steps grow the text past %d x its length "
                "+ %d bytes; refusing such a tokenizer",
                RT_TOK_NORM_GROWTH, RT_TOK_NORM_SLACK);
    } else {
        mc_fail(err, r, NULL, NULL, -1,
                "a pre-tokenized word is too long, or a regex hit PCRE2's "
                "match limit");
    }
    mc_free(w.out.p);
    mc_free(w.norm.p);
    mc_free(w.ntmp.p);
    mc_free(w.raw_spans.p);
    mc_free(w.norm_spans.p);
    rt_tok_work_free(&w.pre);
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
                       rt_tok_work *w, const tok_list *in, tok_list *out)
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
            ok = rt_tok_replace_step(st, w, s, n, &out->bytes, NULL) == MC_OK;
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
    rt_tok_work w; /* regex Replace decoders */
    memset(&w, 0, sizeof w);
    mc_status r = MC_OK;
    for (size_t i = 0; i < n && !r; i++) {
        if (skip_special && (tok->flags[ids[i]] & RT_TOK_F_SPECIAL))
            continue;
        /* no decoder: HF joins the tokens with spaces; the space goes
         * into the token's span so the final concatenation keeps it */
        size_t start = a.bytes.len;
        int sep = !tok->has_decoder && list_count(&a) > 0;
        size_t span[2];
        size_t tl;
        const uint8_t *ts = rt_tok_text(tok, ids[i], &tl);
        if ((sep && !rt_tok_buf_append(&a.bytes, " ", 1)) ||
            !rt_tok_buf_append(&a.bytes, ts, tl))
            r = MC_ERR_NOMEM;
        span[0] = start;
        span[1] = a.bytes.len - start;
        if (!r && !rt_tok_buf_append(&a.spans, span, sizeof span))
            r = MC_ERR_NOMEM;
    }
    for (size_t k = 0; k < tok->n_dec && !r; k++) {
        if (!decode_step(tok, &tok->dec[k], &w, &a, &b)) {
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
    rt_tok_work_free(&w);
    return r;
}

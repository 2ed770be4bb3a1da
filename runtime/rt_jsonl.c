/* rt_jsonl.c - JSONL job lines: parse a request, format its result (see
 * rt_jsonl.h).  Input goes through jansson; output is written by hand so
 * that its bytes are fixed (key order, float format, UTF-8 repair). */
#include "rt_jsonl.h"
#include "rt_plan.h"
#include "rt_stopstr.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable output string ------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;                   /* an allocation (or a sink's write) failed:
                                  result is NULL */
    const rt_jsonl_sink *sink; /* fixed buffer p[cap], passed on when full */
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    while (b->sink && n > 0) {
        if (b->n == b->cap) {
            if (b->sink->write(b->sink->ctx, b->p, b->n) != 0) {
                b->oom = 1;
                return;
            }
            b->n = 0;
        }
        size_t k = b->cap - b->n < n ? b->cap - b->n : n;
        memcpy(b->p + b->n, s, k);
        b->n += k;
        s += k;
        n -= k;
    }
    if (b->sink)
        return;
    if (n + 1 > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 256;
        while (n + 1 > cap - b->n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        b->oom = 1; /* only short numbers go through here */
    else
        sb_put(b, tmp, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        k = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        k = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        k = 4, min = 0x10000;
    else
        return 0;
    if (n < k)
        return 0;
    unsigned cp = c & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

/* A JSON string of n bytes; invalid UTF-8 becomes U+FFFD (a token may end
 * inside a character), so the line is always valid JSON. */
static void sb_json_str(sbuf *b, const char *s, size_t n)
{
    sb_put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t k = utf8_len(u + i, n - i);
        if (k == 0) {
            sb_str(b, "\\ufffd");
            i++;
        } else if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
            i++;
        } else if (c < 0x20) {
            if (c == '\n')
                sb_str(b, "\\n");
            else if (c == '\t')
                sb_str(b, "\\t");
            else if (c == '\r')
                sb_str(b, "\\r");
            else
                sb_printf(b, "\\u%04x", c);
            i++;
        } else {
            sb_put(b, s + i, k);
            i += k;
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_float(sbuf *b, double v, int digits)
{
    if (isfinite(v))
        sb_printf(b, "%.*g", digits, v);
    else
        sb_str(b, "null");
}

/* A sink's sbuf: the fixed buffer, nothing written yet. */
static sbuf sb_sink(const rt_jsonl_sink *sink)
{
    return (sbuf){.p = sink->buf, .cap = sink->cap, .sink = sink};
}

/* The end of a sink's line: the rest of its bytes written. */
static mc_status sb_flush(sbuf *b)
{
    sb_put(b, "\n", 1);
    if (!b->oom && b->n && b->sink->write(b->sink->ctx, b->p, b->n) != 0)
        b->oom = 1;
    return b->oom ? MC_ERR_IO : MC_OK;
}

static mc_status sb_finish(sbuf *b, char **out, size_t *len)
{
    sb_put(b, "\n", 1);
    if (b->oom) {
        free(b->p);
        *out = NULL;
        *len = 0;
        return MC_ERR_NOMEM;
    }
    *out = b->p;
    *len = b->n;
    return MC_OK;
}

/* ---- parsing -------------------------------------------------------------- */

static char *dump_dup(const json_t *v);

int rt_jsonl_is_blank(const char *line, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
            return 0;
    return 1;
}

void rt_jsonl_req_free(rt_jsonl_req *r)
{
    if (!r)
        return;
    free(r->id);
    free(r->ids);
    free(r->stop);
    for (size_t i = 0; r->stop_str && i < r->n_stop_str; i++)
        free(r->stop_str[i]);
    free(r->stop_str);
    free(r->stop_str_len);
    for (size_t i = 0; i < r->n_labels; i++) {
        if (r->label_seq)
            free(r->label_seq[i]);
        if (r->label_json)
            free(r->label_json[i]);
    }
    free(r->label_seq);
    free(r->label_len);
    free(r->label_json);
    free(r->cont);
    memset(r, 0, sizeof *r);
}

size_t rt_jsonl_score_extra(const rt_jsonl_req *r)
{
    size_t m = r->n_cont;
    for (size_t i = 0; i < r->n_labels; i++)
        if (r->label_len[i] > m)
            m = r->label_len[i];
    return m;
}

static mc_status bad(mc_error *err, uint64_t line, const char *key,
                     const char *what)
{
    return mc_fail(err, MC_ERR_FORMAT, NULL, key, -1, "line %llu: \"%s\": %s",
                   (unsigned long long)line, key, what);
}

/* A JSON array of token ids into a new array. */
static mc_status id_array(const json_t *v, uint64_t line, const char *key,
                          int32_t **out, size_t *n, mc_error *err)
{
    *out = NULL;
    *n = 0;
    if (!json_is_array(v))
        return bad(err, line, key, "expected an array of token ids");
    size_t k = json_array_size(v);
    int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
    if (!ids)
        return mc_fail(err, MC_ERR_NOMEM, NULL, key, -1, "line %llu",
                       (unsigned long long)line);
    for (size_t i = 0; i < k; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > INT32_MAX) {
            free(ids);
            return mc_fail(err, MC_ERR_FORMAT, NULL, key, -1,
                           "line %llu: \"%s\"[%zu]: expected a token id "
                           "(an integer 0..%d)",
                           (unsigned long long)line, key, i, INT32_MAX);
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    *out = ids;
    *n = k;
    return MC_OK;
}

/* Encode text (add_special as asked) into a new array. */
static mc_status encode(const rt_tokenizer *tok, const char *text, size_t len,
                        int add_special, uint64_t line, const char *key,
                        int32_t **out, size_t *n, mc_error *err)
{
    *out = NULL;
    *n = 0;
    if (!tok)
        return bad(err, line, key,
                   "text needs a tokenizer (none is embedded in the "
                   "artifact or beside the model): give token ids");
    size_t need = 0;
    mc_error e;
    mc_error_clear(&e);
    rt_tokenizer_encode(tok, text, len, add_special, NULL, 0, &need, &e);
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    if (!ids)
        return mc_fail(err, MC_ERR_NOMEM, NULL, key, -1, "line %llu",
                       (unsigned long long)line);
    if (rt_tokenizer_encode(tok, text, len, add_special, ids, need, n, &e)) {
        free(ids);
        return mc_fail(err, e.status == MC_ERR_NOMEM ? MC_ERR_NOMEM
                                                     : MC_ERR_FORMAT,
                       NULL, key, -1, "line %llu: \"%s\": cannot encode: %s",
                       (unsigned long long)line, key, e.message);
    }
    *out = ids;
    return MC_OK;
}

/* "prompt" text or "ids"; "continuation" text or ids. */
static mc_status text_or_ids(const json_t *v, const rt_tokenizer *tok,
                             int add_special, uint64_t line, const char *key,
                             int32_t **out, size_t *n, mc_error *err)
{
    if (json_is_string(v))
        return encode(tok, json_string_value(v), json_string_length(v),
                      add_special, line, key, out, n, err);
    return id_array(v, line, key, out, n, err);
}

static mc_status get_labels(const json_t *v, const rt_tokenizer *tok,
                            rt_jsonl_req *r, mc_error *err)
{
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(err, r->line, "labels",
                   "expected a non-empty array of token ids, texts or "
                   "arrays of token ids");
    size_t k = json_array_size(v);
    r->label_seq = calloc(k, sizeof *r->label_seq);
    r->label_len = calloc(k, sizeof *r->label_len);
    r->label_json = calloc(k, sizeof *r->label_json);
    if (!r->label_seq || !r->label_len || !r->label_json)
        return mc_fail(err, MC_ERR_NOMEM, NULL, "labels", -1, "line %llu",
                       (unsigned long long)r->line);
    for (size_t i = 0; i < k; i++) {
        const json_t *e = json_array_get(v, i);
        r->n_labels = i + 1; /* label i freed from here on */
        mc_status st = MC_OK;
        if (json_is_integer(e) && json_integer_value(e) >= 0 &&
            json_integer_value(e) <= INT32_MAX) {
            if (!(r->label_seq[i] = malloc(sizeof *r->label_seq[i])))
                return mc_fail(err, MC_ERR_NOMEM, NULL, "labels", -1,
                               "line %llu", (unsigned long long)r->line);
            r->label_seq[i][0] = (int32_t)json_integer_value(e);
            r->label_len[i] = 1;
        } else if (json_is_string(e)) {
            st = encode(tok, json_string_value(e), json_string_length(e), 0,
                        r->line, "labels", &r->label_seq[i], &r->label_len[i],
                        err);
        } else if (json_is_array(e)) {
            st = id_array(e, r->line, "labels", &r->label_seq[i],
                          &r->label_len[i], err);
        } else {
            return mc_fail(err, MC_ERR_FORMAT, NULL, "labels", -1,
                           "line %llu: \"labels\"[%zu]: expected a token id, "
                           "a text or an array of token ids",
                           (unsigned long long)r->line, i);
        }
        if (st)
            return st;
        if (r->label_len[i] == 0)
            return mc_fail(err, MC_ERR_FORMAT, NULL, "labels", -1,
                           "line %llu: \"labels\"[%zu] is %s: a label needs "
                           "at least one token",
                           (unsigned long long)r->line, i,
                           json_is_string(e) ? "a text that encodes to no "
                                               "tokens"
                                             : "an empty array");
        r->label_json[i] = dump_dup(e);
        if (!r->label_json[i])
            return mc_fail(err, MC_ERR_NOMEM, NULL, "labels", -1,
                           "line %llu", (unsigned long long)r->line);
    }
    return MC_OK;
}

/* "stop": token ids and stop strings, in two lists. */
static mc_status get_stop(const json_t *v, rt_jsonl_req *r, mc_error *err)
{
    if (!json_is_array(v))
        return bad(err, r->line, "stop",
                   "expected an array of token ids and texts");
    size_t k = json_array_size(v);
    r->stop = malloc((k ? k : 1) * sizeof *r->stop);
    r->stop_str = calloc(k ? k : 1, sizeof *r->stop_str);
    r->stop_str_len = calloc(k ? k : 1, sizeof *r->stop_str_len);
    if (!r->stop || !r->stop_str || !r->stop_str_len)
        return mc_fail(err, MC_ERR_NOMEM, NULL, "stop", -1, "line %llu",
                       (unsigned long long)r->line);
    for (size_t i = 0; i < k; i++) {
        const json_t *e = json_array_get(v, i);
        if (json_is_integer(e) && json_integer_value(e) >= 0 &&
            json_integer_value(e) <= INT32_MAX) {
            r->stop[r->n_stop++] = (int32_t)json_integer_value(e);
            continue;
        }
        size_t n = json_is_string(e) ? json_string_length(e) : 0;
        if (n == 0 || n > RT_STOP_STRING_MAX)
            return mc_fail(err, MC_ERR_FORMAT, NULL, "stop", -1,
                           "line %llu: \"stop\"[%zu]: expected a token id "
                           "(an integer 0..%d) or a text of 1..%d bytes",
                           (unsigned long long)r->line, i, INT32_MAX,
                           RT_STOP_STRING_MAX);
        char *s = malloc(n);
        if (!s)
            return mc_fail(err, MC_ERR_NOMEM, NULL, "stop", -1, "line %llu",
                           (unsigned long long)r->line);
        memcpy(s, json_string_value(e), n);
        r->stop_str[r->n_stop_str] = s;
        r->stop_str_len[r->n_stop_str++] = n;
    }
    return MC_OK;
}

/* The optional numeric keys. */
static mc_status get_options(const json_t *o, rt_jsonl_req *r, mc_error *err)
{
    const json_t *v;
    if ((v = json_object_get(o, "max_new_tokens"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > 1000000)
            return bad(err, r->line, "max_new_tokens",
                       "expected an integer 0..1000000");
        r->max_new_tokens = (uint32_t)json_integer_value(v);
    }
    if ((v = json_object_get(o, "temperature"))) {
        double t = json_number_value(v);
        if (!json_is_number(v) || !(t >= 0) || !isfinite(t) || t > 1e6)
            return bad(err, r->line, "temperature",
                       "expected a number 0..1e6 (0: greedy)");
        r->temperature = (float)t;
    }
    if ((v = json_object_get(o, "top_k"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > UINT32_MAX)
            return bad(err, r->line, "top_k",
                       "expected an integer 0..4294967295 (0: off)");
        r->top_k = (uint32_t)json_integer_value(v);
    }
    if ((v = json_object_get(o, "top_p"))) {
        double p = json_number_value(v);
        if (!json_is_number(v) || !(p > 0) || p > 1)
            return bad(err, r->line, "top_p", "expected a number in (0, 1]");
        r->top_p = (float)p;
    }
    if ((v = json_object_get(o, "seed"))) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return bad(err, r->line, "seed", "expected an integer >= 0");
        r->seed = (uint64_t)json_integer_value(v);
        r->seq_index = 0;
    }
    if ((v = json_object_get(o, "stop")))
        return get_stop(v, r, err);
    return MC_OK;
}

static mc_status parse_object(const json_t *o, const rt_jsonl_defaults *d,
                              const rt_tokenizer *tok, rt_jsonl_req *r,
                              mc_error *err)
{
    const json_t *v = json_object_get(o, "id");
    if (v && !json_is_string(v) && !json_is_integer(v))
        return bad(err, r->line, "id", "expected a string or an integer");
    r->id = v ? dump_dup(v) : NULL;
    if (!r->id) {
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)r->line);
        r->id = strdup(num);
    }
    if (!r->id)
        return mc_fail(err, MC_ERR_NOMEM, NULL, "id", -1, "line %llu",
                       (unsigned long long)r->line);
    const json_t *pt = json_object_get(o, "prompt");
    const json_t *pi = json_object_get(o, "ids");
    if (!pt == !pi)
        return bad(err, r->line, pt ? "ids" : "prompt",
                   "give exactly one of \"prompt\" (text) and \"ids\" "
                   "(token ids)");
    if (pt && !json_is_string(pt))
        return bad(err, r->line, "prompt", "expected a string");
    mc_status st = pt ? text_or_ids(pt, tok, d->add_special, r->line,
                                    "prompt", &r->ids, &r->n_ids, err)
                      : id_array(pi, r->line, "ids", &r->ids, &r->n_ids, err);
    if (st || (st = get_options(o, r, err)))
        return st;
    if ((v = json_object_get(o, "labels"))) {
        r->score = 1;
        if ((st = get_labels(v, tok, r, err)))
            return st;
    }
    if ((v = json_object_get(o, "continuation"))) {
        r->score = 1;
        if ((st = text_or_ids(v, tok, 0, r->line, "continuation", &r->cont,
                              &r->n_cont, err)))
            return st;
        if (r->n_cont == 0)
            return bad(err, r->line, "continuation", "empty");
    }
    return MC_OK;
}

/* ---- the parse scratch ---------------------------------------------------- */

/* jansson's allocator while a line is parsed into a scratch: a bump
 * allocator (free only takes back the last block), reset per line.  The
 * job parses on one thread, and the worker threads never call jansson. */
static rt_jsonl_scratch *g_scratch;

static void *scratch_malloc(size_t n)
{
    rt_jsonl_scratch *s = g_scratch;
    size_t a = (n + 15) & ~(size_t)15;
    if (a < n || a > s->cap - s->used) {
        s->exhausted = 1;
        return NULL;
    }
    void *p = s->buf + s->used;
    s->used += a;
    return p;
}

static void scratch_free(void *p)
{
    (void)p; /* the whole scratch is reset when the line is parsed */
}

/* json_dumps(v) copied to the heap (the dump itself lives in whatever
 * jansson allocates from now). */
static char *dump_dup(const json_t *v)
{
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!d)
        return NULL;
    char *c = strdup(d);
    json_free_t f;
    json_get_alloc_funcs(NULL, &f);
    f(d);
    return c;
}

mc_status rt_jsonl_parse_in(const char *line, size_t len, uint64_t line_no,
                            const rt_jsonl_defaults *d,
                            const rt_tokenizer *tok,
                            rt_jsonl_scratch *scratch, rt_jsonl_req *out,
                            mc_error *err)
{
    if (!scratch)
        return rt_jsonl_parse(line, len, line_no, d, tok, out, err);
    json_malloc_t om;
    json_free_t of;
    json_get_alloc_funcs(&om, &of);
    scratch->used = 0;
    scratch->exhausted = 0;
    g_scratch = scratch;
    json_set_alloc_funcs(scratch_malloc, scratch_free);
    mc_status st = rt_jsonl_parse(line, len, line_no, d, tok, out, err);
    json_set_alloc_funcs(om, of);
    g_scratch = NULL;
    if (st && scratch->exhausted) {
        /* Whatever jansson said (out of memory, or a parse error after
         * a failed allocation), the cause is the line's size. */
        mc_error_clear(err);
        st = mc_fail(err, MC_ERR_FORMAT, NULL, NULL, -1,
                     "line %llu: its JSON (%zu bytes) needs more than the "
                     "job's parse scratch of %zu bytes (%llu x "
                     "--max-line-bytes)",
                     (unsigned long long)line_no, len, scratch->cap,
                     (unsigned long long)RT_JOB_SCRATCH_PER_LINE_BYTE);
    }
    return st;
}

uint64_t rt_jsonl_req_bytes(const rt_jsonl_req *r)
{
    uint64_t n = 0;
    if (r->id)
        n += rt_plan_heap_chunk(strlen(r->id) + 1);
    if (r->ids)
        n += rt_plan_heap_chunk((r->n_ids ? r->n_ids : 1) * sizeof(int32_t));
    if (r->stop) {
        size_t k = r->n_stop + r->n_stop_str;
        n += rt_plan_heap_chunk((k ? k : 1) * sizeof(int32_t)) +
             rt_plan_heap_chunk((k ? k : 1) * sizeof(char *)) +
             rt_plan_heap_chunk((k ? k : 1) * sizeof(size_t));
        for (size_t i = 0; i < r->n_stop_str; i++)
            n += rt_plan_heap_chunk(r->stop_str_len[i]);
    }
    if (r->label_seq) {
        n += 2 * rt_plan_heap_chunk(r->n_labels * sizeof(void *)) +
             rt_plan_heap_chunk(r->n_labels * sizeof(size_t));
        for (size_t i = 0; i < r->n_labels; i++)
            n += rt_plan_heap_chunk(r->label_len[i] * sizeof(int32_t)) +
                 (r->label_json[i]
                      ? rt_plan_heap_chunk(strlen(r->label_json[i]) + 1)
                      : 0);
    }
    if (r->cont)
        n += rt_plan_heap_chunk((r->n_cont ? r->n_cont : 1) * sizeof(int32_t));
    return n;
}

mc_status rt_jsonl_parse(const char *line, size_t len, uint64_t line_no,
                         const rt_jsonl_defaults *d, const rt_tokenizer *tok,
                         rt_jsonl_req *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    out->line = line_no;
    out->max_new_tokens = d->max_new_tokens;
    out->temperature = d->temperature;
    out->top_k = d->top_k;
    out->top_p = d->top_p;
    out->seed = d->seed;
    out->seq_index = line_no ? line_no - 1 : 0;
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                           &je);
    if (!o)
        return mc_fail(err, MC_ERR_FORMAT, NULL, NULL, -1,
                       "line %llu: not JSON (column %d: %s)",
                       (unsigned long long)line_no, je.column, je.text);
    mc_status st = json_is_object(o)
                       ? parse_object(o, d, tok, out, err)
                       : mc_fail(err, MC_ERR_FORMAT, NULL, NULL, -1,
                                 "line %llu: expected a JSON object",
                                 (unsigned long long)line_no);
    json_decref(o);
    if (st) {
        char *id = out->id;
        out->id = NULL;
        rt_jsonl_req_free(out);
        out->line = line_no;
        out->id = id;
    }
    return st;
}

/* ---- output --------------------------------------------------------------- */

static void head(sbuf *b, const char *id, uint64_t line)
{
    sb_str(b, "{\"id\":");
    if (id)
        sb_str(b, id);
    else
        sb_printf(b, "%llu", (unsigned long long)line);
    sb_printf(b, ",\"line\":%llu", (unsigned long long)line);
}

static void result_body(sbuf *b, const rt_jsonl_req *r,
                        const rt_jsonl_result *res);

mc_status rt_jsonl_format_result(const rt_jsonl_req *r,
                                 const rt_jsonl_result *res, char **out,
                                 size_t *len)
{
    sbuf b = {0};
    result_body(&b, r, res);
    return sb_finish(&b, out, len);
}

mc_status rt_jsonl_write_result(const rt_jsonl_req *r,
                                const rt_jsonl_result *res,
                                const rt_jsonl_sink *sink)
{
    sbuf b = sb_sink(sink);
    result_body(&b, r, res);
    return sb_flush(&b);
}

static void result_body(sbuf *b0, const rt_jsonl_req *r,
                        const rt_jsonl_result *res)
{
    sbuf b = *b0;
    head(&b, r->id, r->line);
    sb_printf(&b, ",\"prompt_tokens\":%zu", res->prompt_tokens);
    if (!r->score) {
        sb_printf(&b, ",\"generated_tokens\":%zu,\"stop_reason\":\"%s\","
                      "\"ids\":[",
                  res->n_gen,
                  res->stop_string  ? "stop_string"
                  : res->stop_token ? "stop_token"
                                    : "length");
        for (size_t i = 0; i < res->n_gen; i++)
            sb_printf(&b, i ? ",%d" : "%d", (int)res->gen_ids[i]);
        sb_str(&b, "],\"text\":");
        if (res->text)
            sb_json_str(&b, res->text, res->text_len);
        else
            sb_str(&b, "null");
    }
    if (r->n_labels) {
        size_t best = 0;
        sb_str(&b, ",\"labels\":[");
        for (size_t i = 0; i < r->n_labels; i++) {
            sb_str(&b, i ? ",{\"label\":" : "{\"label\":");
            sb_str(&b, r->label_json[i]);
            sb_str(&b, ",\"logprob\":");
            sb_float(&b, res->label_logprobs[i], 9);
            sb_printf(&b, ",\"tokens\":%zu}", r->label_len[i]);
            if (res->label_logprobs[i] > res->label_logprobs[best])
                best = i;
        }
        sb_str(&b, "],\"label\":");
        sb_str(&b, r->label_json[best]);
    }
    if (r->n_cont) {
        double sum = 0.0;
        sb_str(&b, ",\"continuation_logprobs\":[");
        for (size_t i = 0; i < r->n_cont; i++) {
            if (i)
                sb_str(&b, ",");
            sb_float(&b, res->cont_logprobs[i], 9);
            sum += res->cont_logprobs[i];
        }
        sb_str(&b, "],\"continuation_sum\":");
        sb_float(&b, sum, 17);
    }
    sb_str(&b, "}");
    *b0 = b;
}

static void error_body(sbuf *b, const char *id, uint64_t line_no,
                       const char *msg, uint32_t max_batch, uint64_t max_seq)
{
    head(b, id, line_no);
    sb_str(b, ",\"error\":");
    sb_json_str(b, msg, strlen(msg));
    if (max_seq > 0)
        sb_printf(b, ",\"max_batch\":%u,\"max_seq\":%llu", max_batch,
                  (unsigned long long)max_seq);
    sb_str(b, "}");
}

mc_status rt_jsonl_format_error(const char *id, uint64_t line_no,
                                const char *msg, uint32_t max_batch,
                                uint64_t max_seq, char **out, size_t *len)
{
    sbuf b = {0};
    error_body(&b, id, line_no, msg, max_batch, max_seq);
    return sb_finish(&b, out, len);
}

mc_status rt_jsonl_write_error(const char *id, uint64_t line_no,
                               const char *msg, uint32_t max_batch,
                               uint64_t max_seq, const rt_jsonl_sink *sink)
{
    sbuf b = sb_sink(sink);
    error_body(&b, id, line_no, msg, max_batch, max_seq);
    return sb_flush(&b);
}

mc_status rt_jsonl_output_id(const char *line, size_t len, char **id,
                             int *failed, mc_error *err)
{
    *id = NULL;
    *failed = 0;
    json_error_t je;
    /* JSON_ALLOW_NUL: a generated text may hold a NUL byte (a byte-fallback
     * token), written as \u0000; jansson refuses that by default. */
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    const json_t *v = json_object_get(o, "id"); /* NULL-safe */
    mc_status st = MC_OK;
    if (!v || (!json_is_string(v) && !json_is_integer(v)) ||
        !json_is_integer(json_object_get(o, "line")))
        st = mc_fail(err, MC_ERR_FORMAT, NULL, "id", -1,
                     "not a result line (an object with \"id\" and "
                     "\"line\" expected)");
    else if (!(*id = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT)))
        st = mc_fail(err, MC_ERR_NOMEM, NULL, "id", -1, "resume");
    else
        *failed = json_object_get(o, "error") != NULL;
    json_decref(o);
    return st;
}

/* cmp_calib_data.c - calibration data: token ids or text (see
 * cmp_calib_data.h for the detection rule and how text is cut). */
#include "cmp_calib_data.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_artifact.h"
#include "fmt_file.h"
#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_tokenizer.h"

/* Ids the tokenizer may produce per byte of a document are at most one for
 * every supported tokenizer (byte-level or byte fallback), plus a few for a
 * prepended "▁" and added tokens; this slack makes the first encode fit, and
 * a document that still does not is encoded again at its reported size. */
#define ENCODE_SLACK 16u

static int is_blank(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}


/* The detection rule of the header.  Returns 1 for ids.  For text,
 * *why_line is the first line (1-based) that is neither blank, a comment
 * nor ids, and *why_off its byte offset; both 0 when every line is blank
 * or a comment (a file of comments is text, not an empty ids file). */
static int looks_like_ids(const uint8_t *s, size_t len, size_t *why_line,
                          size_t *why_off)
{
    size_t i = 0, line = 1, id_lines = 0;
    *why_line = *why_off = 0;
    while (i < len) {
        const uint8_t *nl = memchr(s + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - s) : len, k = i;
        if (end > i && s[end - 1] == '\r')
            end--;
        while (k < end && (s[k] == ' ' || s[k] == '\t'))
            k++;
        if (k < end && s[k] != '#') {
            for (; k < end; k++)
                if (!(s[k] >= '0' && s[k] <= '9') && s[k] != ' ' &&
                    s[k] != '\t') {
                    *why_line = line;
                    *why_off = i;
                    return 0;
                }
            id_lines++;
        }
        i = nl ? (size_t)(nl - s) + 1 : len;
        line++;
    }
    return id_lines > 0;
}

/* tokenizer.json in the model's directory (fmt_model_dir's rule: the path
 * itself when it is a directory, else the directory holding it).  New
 * string, NULL when out of memory. */
static char *tokenizer_path(const char *model_path)
{
    static const char name[] = "/tokenizer.json";
    struct stat sb;
    const char *dir = model_path;
    size_t n = strlen(model_path);
    if (stat(model_path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        const char *slash = strrchr(model_path, '/');
        if (!slash) {
            dir = ".";
            n = 1;
        } else {
            n = slash == model_path ? 1 : (size_t)(slash - model_path);
        }
    }
    size_t total;
    char *p = mc_add_size(n, sizeof name, &total) ? mc_malloc(total) : NULL;
    if (p) {
        memcpy(p, dir, n);
        memcpy(p + n, name, sizeof name);
    }
    return p;
}

/* Load the tokenizer text needs, or say why there is none.  why_line /
 * why_off come from looks_like_ids (why the file is text). */
static mc_status load_tokenizer(const char *path, const char *model_path,
                                size_t why_line, size_t why_off,
                                rt_tokenizer **tok, mc_error *err)
{
    char why[96];
    if (why_line)
        snprintf(why, sizeof why, "line %zu is not token ids", why_line);
    else
        snprintf(why, sizeof why, "no line holds token ids");
    int64_t off = why_line ? (int64_t)why_off : -1;
    if (!model_path)
        return mc_fail(err, MC_ERR_NOT_FOUND, path, NULL, off,
                       "%s, so the file is read as text, and text needs the "
                       "model's tokenizer.json, but no model path was given; "
                       "or pass token ids (one sequence per line)", why);
    char *tp = tokenizer_path(model_path);
    if (!tp)
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "allocating a path");
    struct stat sb;
    mc_status st = MC_OK;
    /* any other stat failure (EACCES, ...) is left to rt_tokenizer_load,
     * whose message names it */
    if (stat(tp, &sb) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
        st = mc_fail(err, MC_ERR_NOT_FOUND, path, NULL, off,
                     "%s, so the file is read as text, and text needs a "
                     "tokenizer.json next to the model: %s does not exist; "
                     "copy the model's tokenizer.json there, or pass token "
                     "ids (whitespace-separated, one sequence per line)",
                     why, tp);
    } else {
        mc_error te;
        mc_error_clear(&te);
        st = rt_tokenizer_load(tp, tok, &te);
        if (st != MC_OK) {
            char inner[1600];
            mc_error_format(&te, inner, sizeof inner);
            /* status kept (NOMEM stays NOMEM); the calib file is the
             * subject, the tokenizer's own error follows */
            mc_fail(err, st, path, NULL, -1,
                    "read as text (%s), but the model's tokenizer does not "
                    "load: %s", why, inner);
        }
    }
    mc_free(tp);
    return st;
}

/* Token stream of the whole text (grows geometrically). */
typedef struct stream {
    int32_t *ids; /* (cap) */
    size_t n;     /* used */
    size_t cap;   /* allocated, in ids */
} stream;

static int stream_reserve(stream *s, size_t extra)
{
    size_t need;
    if (!mc_add_size(s->n, extra, &need))
        return 0;
    if (need <= s->cap)
        return 1;
    size_t cap = s->cap > SIZE_MAX / 2 ? need : s->cap * 2;
    if (cap < need)
        cap = need;
    size_t bytes;
    if (!mc_mul_size(cap, sizeof *s->ids, &bytes))
        return 0;
    int32_t *p = mc_realloc(s->ids, bytes);
    if (!p)
        return 0;
    s->ids = p;
    s->cap = cap;
    return 1;
}

/* Encode one document (doc[0..len), starting at byte off on line `line` of
 * the file) onto the stream, BOS first when bos >= 0. */
static mc_status encode_doc(const rt_tokenizer *tok, int32_t bos,
                            const char *path, uint32_t vocab_size,
                            const uint8_t *doc, size_t len, size_t off,
                            size_t line, stream *s, mc_error *err)
{
    size_t hb = bos >= 0, guess, n = 0;
    if (!mc_add_size(len, hb + ENCODE_SLACK, &guess) ||
        !stream_reserve(s, guess))
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, (int64_t)off,
                       "out of memory for the token ids of line %zu", line);
    mc_error te;
    mc_error_clear(&te);
    mc_status st = rt_tokenizer_encode(tok, (const char *)doc, len, 0,
                                       s->ids + s->n + hb, s->cap - s->n - hb,
                                       &n, &te);
    if (st == MC_ERR_INVALID_ARG && n > s->cap - s->n - hb) {
        size_t need;
        if (!mc_add_size(n, hb, &need) || !stream_reserve(s, need))
            return mc_fail(err, MC_ERR_NOMEM, path, NULL, (int64_t)off,
                           "out of memory for the token ids of line %zu",
                           line);
        st = rt_tokenizer_encode(tok, (const char *)doc, len, 0,
                                 s->ids + s->n + hb, s->cap - s->n - hb, &n,
                                 &te);
    }
    if (st != MC_OK)
        return mc_fail(err, st, path, NULL, (int64_t)off,
                       "encoding the paragraph at line %zu: %s", line,
                       te.message);
    if (n == 0)
        return MC_OK;
    if (hb)
        s->ids[s->n] = bos;
    for (size_t i = 0; i < n + hb; i++) {
        int32_t id = s->ids[s->n + i];
        if (vocab_size && (id < 0 || (uint32_t)id >= vocab_size))
            return mc_fail(err, MC_ERR_FORMAT, path, NULL, (int64_t)off,
                           "the paragraph at line %zu encodes to %s %d, not "
                           "below the model's vocabulary size %u: the "
                           "tokenizer.json beside the model does not match it",
                           line, hb && i == 0 ? "the BOS id" : "token id", id,
                           vocab_size);
    }
    s->n += n + hb;
    return MC_OK;
}

/* Split text into paragraphs and encode each onto the stream. */
static mc_status encode_text(const rt_tokenizer *tok, const char *path,
                             uint32_t vocab_size, const uint8_t *t,
                             size_t len, stream *s, mc_error *err)
{
    int32_t bos = rt_tokenizer_bos(tok);
    size_t i = 0, line = 1;
    size_t doc = 0, doc_end = 0, doc_line = 0; /* doc_line 0: none open */
    mc_status st = MC_OK;
    while (st == MC_OK && i < len) {
        const uint8_t *nl = memchr(t + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - t) : len, k = i;
        while (k < end && is_blank(t[k]))
            k++;
        if (k == end) { /* a blank line closes the open paragraph */
            if (doc_line)
                st = encode_doc(tok, bos, path, vocab_size, t + doc,
                                doc_end - doc, doc, doc_line, s, err);
            doc_line = 0;
        } else {
            if (!doc_line) {
                doc = i;
                doc_line = line;
            }
            doc_end = end > i && t[end - 1] == '\r' ? end - 1 : end;
        }
        i = nl ? end + 1 : len;
        line++;
    }
    if (st == MC_OK && doc_line)
        st = encode_doc(tok, bos, path, vocab_size, t + doc, doc_end - doc,
                        doc, doc_line, s, err);
    return st;
}

/* Cut the stream into sequences of max_seq (see the header).  Takes the
 * stream's ids. */
static mc_status cut(stream *s, uint32_t max_seq, const char *path,
                     fmt_ids **out, mc_error *err)
{
    size_t m = max_seq ? max_seq : CMP_CALIB_DATA_DEFAULT_SEQ;
    size_t full = s->n / m, tail = s->n % m;
    int keep_tail = tail && (tail >= CMP_CALIB_DATA_MIN_TAIL || full == 0);
    size_t n_seqs = full + (size_t)keep_tail;
    size_t n_ids = full * m + (keep_tail ? tail : 0);
    fmt_ids *f = mc_calloc(1, sizeof *f);
    if (f)
        f->offsets = mc_malloc_array(n_seqs + 1, sizeof *f->offsets);
    if (!f || !f->offsets) {
        fmt_ids_free(f);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1,
                       "out of memory for %zu sequences", n_seqs);
    }
    /* give back the slack; a failed shrink keeps the larger block */
    int32_t *p = mc_realloc(s->ids, n_ids * sizeof *p);
    f->ids = p ? p : s->ids;
    s->ids = NULL;
    s->n = s->cap = 0;
    f->n_ids = n_ids;
    f->n_seqs = n_seqs;
    for (size_t i = 0; i < n_seqs; i++)
        f->offsets[i] = i * m;
    f->offsets[n_seqs] = n_ids;
    *out = f;
    return MC_OK;
}

static mc_status load_text(const char *path, const char *model_path,
                           uint32_t vocab_size, uint32_t max_seq,
                           const uint8_t *t, size_t len, size_t why_line,
                           size_t why_off, fmt_ids **out, mc_error *err)
{
    rt_tokenizer *tok = NULL;
    mc_status st = load_tokenizer(path, model_path, why_line, why_off, &tok,
                                  err);
    if (st != MC_OK)
        return st;
    stream s = {NULL, 0, 0};
    st = encode_text(tok, path, vocab_size, t, len, &s, err);
    rt_tokenizer_free(tok);
    if (st == MC_OK && s.n == 0)
        st = mc_fail(err, MC_ERR_FORMAT, path, NULL, -1,
                     "the text encodes to no tokens");
    if (st == MC_OK)
        st = cut(&s, max_seq, path, out, err);
    mc_free(s.ids);
    return st;
}

mc_status cmp_calib_data_load(const char *path, const char *model_path,
                              uint32_t vocab_size, uint32_t max_seq,
                              fmt_ids **out, int *was_text,
                              cmp_calib_source *src, mc_error *err)
{
    if (out)
        *out = NULL;
    if (was_text)
        *was_text = 0;
    if (!path || !out)
        return mc_fail(err, MC_ERR_INVALID_ARG, path, NULL, -1,
                       "cmp_calib_data_load: NULL argument");
    char *text;
    size_t len;
    mc_status st = fmt_file_read(path, CMP_CALIB_DATA_MAX_BYTES,
                                 "1 GiB (a few MiB of text or ids is plenty)",
                                 &text, &len, err);
    if (st != MC_OK)
        return st;
    if (src) {
        src->xxh3 = fmt_art_xxh3(text, len);
        src->bytes = len;
    }
    const uint8_t *buf = (const uint8_t *)text;
    size_t k = 0;
    while (k < len && (is_blank(buf[k]) || buf[k] == '\n'))
        k++;
    const uint8_t *nul = memchr(buf, '\0', len);
    size_t why_line, why_off;
    if (k == len)
        st = mc_fail(err, MC_ERR_FORMAT, path, NULL, -1,
                     "the file is empty: calibration needs token ids (one "
                     "sequence per line) or text");
    else if (nul)
        st = mc_fail(err, MC_ERR_FORMAT, path, NULL, (int64_t)(nul - buf),
                     "NUL byte: neither token ids nor text (a binary file?)");
    else if (looks_like_ids(buf, len, &why_line, &why_off))
        st = fmt_ids_parse(buf, len, path, vocab_size, out, err);
    else {
        st = load_text(path, model_path, vocab_size, max_seq, buf, len,
                       why_line, why_off, out, err);
        if (st == MC_OK && was_text)
            *was_text = 1;
    }
    mc_free(text);
    return st;
}

/* fmt_json_strict.c - strict JSON loading with file offsets in errors.
 * See fmt_json_strict.h. */
#include "fmt_json_strict.h"

#include <stdio.h>
#include <string.h>

#include "fmt_file.h"
#include "mc_alloc.h"

int fmt_utf8_valid(const unsigned char *s, size_t n, size_t *bad)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xbf; /* allowed range of the 2nd byte */
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            if (c == 0xe0)
                lo = 0xa0; /* overlong */
            else if (c == 0xed)
                hi = 0x9f; /* UTF-16 surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            if (c == 0xf0)
                lo = 0x90; /* overlong */
            else if (c == 0xf4)
                hi = 0x8f; /* above U+10FFFF */
        } else {
            goto invalid; /* continuation byte, C0/C1 overlong, F5..FF */
        }
        if (need > n - i - 1)
            goto invalid;
        if (s[i + 1] < lo || s[i + 1] > hi)
            goto invalid;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                goto invalid;
        i += need + 1;
    }
    return 1;
invalid:
    if (bad)
        *bad = i;
    return 0;
}

size_t fmt_json_skip_ws(const char *t, size_t len, size_t i)
{
    while (i < len && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r'))
        i++;
    return i;
}

/* t[i] is '"': offset just past the closing quote. */
static size_t skip_string(const char *t, size_t len, size_t i)
{
    i++;
    while (i < len && t[i] != '"')
        i += t[i] == '\\' ? 2 : 1;
    return i < len ? i + 1 : len;
}

static size_t skip_value(const char *t, size_t len, size_t i)
{
    if (i >= len)
        return len;
    if (t[i] == '"')
        return skip_string(t, len, i);
    if (t[i] == '{' || t[i] == '[') {
        size_t depth = 0;
        while (i < len) {
            char c = t[i];
            if (c == '"') {
                i = skip_string(t, len, i);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return len;
    }
    while (i < len && t[i] != ',' && t[i] != '}' && t[i] != ']' && t[i] != ' ' &&
           t[i] != '\t' && t[i] != '\n' && t[i] != '\r')
        i++;
    return i;
}

size_t fmt_json_scan_object(const char *t, size_t len, size_t obj,
                            fmt_json_member *out, size_t cap)
{
    size_t n = 0;
    if (obj >= len || t[obj] != '{')
        return 0;
    size_t i = obj + 1;
    for (;;) {
        i = fmt_json_skip_ws(t, len, i);
        if (i >= len || t[i] == '}')
            break;
        if (t[i] == ',') {
            i++;
            continue;
        }
        size_t key = i;
        i = fmt_json_skip_ws(t, len, skip_string(t, len, i));
        if (i < len && t[i] == ':')
            i++;
        i = fmt_json_skip_ws(t, len, i);
        if (n < cap) {
            out[n].key = key;
            out[n].value = i;
        }
        n++;
        i = skip_value(t, len, i);
    }
    return n;
}

/* jansson stops right after the duplicate key's closing quote: walk back to
 * its opening quote (one not preceded by an odd run of backslashes) and
 * decode the key with jansson.  Returns the key's offset, or -1. */
static int64_t find_dup_key(const char *t, size_t len, size_t pos, char *key,
                            size_t keycap)
{
    if (pos == 0 || pos > len || t[pos - 1] != '"')
        return -1;
    size_t close = pos - 1;
    for (size_t j = close; j-- > 0;) {
        if (t[j] != '"')
            continue;
        size_t bs = 0;
        while (j - bs > 0 && t[j - bs - 1] == '\\')
            bs++;
        if (bs % 2)
            continue;
        json_t *s = json_loadb(t + j, close - j + 1, JSON_DECODE_ANY, NULL);
        if (!json_is_string(s)) {
            json_decref(s);
            return -1;
        }
        snprintf(key, keycap, "%s", json_string_value(s));
        json_decref(s);
        return (int64_t)j;
    }
    return -1;
}

/* jansson's lexer turns some failed allocations into syntax errors ("invalid
 * token"), so the loader watches allocations itself: the same mc_malloc
 * route as mc_alloc_install_jansson(), plus a per-thread note of failure. */
static _Thread_local int json_alloc_failed;

static void *strict_malloc(size_t n)
{
    void *p = mc_malloc(n);
    if (!p)
        json_alloc_failed = 1;
    return p;
}

mc_status fmt_json_load_strict(const char *text, size_t len, const char *file,
                               int64_t base, json_t **out, mc_error *err)
{
    *out = NULL;
    size_t bad = 0;
    if (!fmt_utf8_valid((const unsigned char *)text, len, &bad))
        return mc_fail(err, MC_ERR_FORMAT, file, NULL, base + (int64_t)bad,
                       "invalid UTF-8 (byte 0x%02x); expected UTF-8 JSON text",
                       (unsigned char)text[bad]);
    json_set_alloc_funcs(strict_malloc, mc_free);
    json_alloc_failed = 0;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        enum json_error_code code = json_error_code(&je);
        if (code == json_error_out_of_memory || json_alloc_failed)
            return mc_fail(err, MC_ERR_NOMEM, file, NULL, -1,
                           "out of memory while parsing JSON");
        size_t pos = je.position > 0 ? (size_t)je.position : 0;
        if (code == json_error_duplicate_key) {
            char key[256];
            int64_t at = find_dup_key(text, len, pos, key, sizeof key);
            if (at >= 0)
                return mc_fail(err, MC_ERR_FORMAT, file, key, base + at,
                               "duplicate key '%s' (line %d); JSON readers "
                               "keep only one, so the file is ambiguous",
                               key, je.line);
        }
        /* position counts bytes consumed; the offending token ends there */
        int64_t at = base + (int64_t)(pos > 0 ? pos - 1 : 0);
        return mc_fail(err, MC_ERR_FORMAT, file, NULL, at,
                       "invalid JSON at line %d, column %d: %s", je.line,
                       je.column, je.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        size_t at = fmt_json_skip_ws(text, len, 0);
        return mc_fail(err, MC_ERR_FORMAT, file, NULL, base + (int64_t)at,
                       "top level is an array; expected a JSON object");
    }
    *out = root;
    return MC_OK;
}

mc_status fmt_json_load_file_strict(const char *path, json_t **out,
                                    mc_error *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    mc_status st = fmt_file_read(path, 16u << 20, "16 MiB", &text, &len, err);
    if (st == MC_OK)
        st = fmt_json_load_strict(text, len, path, 0, out, err);
    mc_free(text);
    return st;
}

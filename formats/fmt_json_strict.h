/*
 * fmt_json_strict.h - JSON loading for file formats whose errors must say
 * where: strict UTF-8, no duplicate keys, byte offsets in the file.
 *
 * Internal to mc_formats (safetensors headers, index.json).  jansson keeps
 * object keys in document order and rejects duplicates only anonymously;
 * these helpers name the duplicate key and map jansson's positions (bytes
 * consumed) to file offsets.  fmt_json_scan_object() recovers the byte
 * offset of each member of an already-validated object, so later semantic
 * errors ("shape[1] is negative") can point at the value in the file.
 */
#ifndef FMT_JSON_STRICT_H
#define FMT_JSON_STRICT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

/* 1 if s[0, n) is valid UTF-8 (no overlong forms, no surrogates, nothing
 * above U+10FFFF).  Otherwise 0 and *bad (if non-NULL) is the offset of the
 * first byte of the first invalid sequence. */
int fmt_utf8_valid(const unsigned char *s, size_t n, size_t *bad);

/* Parse text[0, len) as a JSON object.  file names the file in errors and
 * base is the file offset of text[0] (8 for a safetensors header).  Errors:
 * MC_ERR_FORMAT for invalid UTF-8, invalid JSON (line/column and file byte
 * offset), a duplicate key (named, at its offset) or a top level that is not
 * an object; MC_ERR_NOMEM when an allocation failed.  On success *out is a
 * new reference (json_decref it); on failure *out is NULL. */
mc_status fmt_json_load_strict(const char *text, size_t len, const char *file,
                               int64_t base, json_t **out, mc_error *err);

/* fmt_json_load_strict on the whole file at path (read with fmt_file_read,
 * refused over 16 MiB: the JSON files read this way are configs).  Errors
 * name path; MC_ERR_NOT_FOUND when it does not exist. */
mc_status fmt_json_load_file_strict(const char *path, json_t **out,
                                    mc_error *err);

/* Byte offsets (into text) of one object member: the key's opening quote
 * and the first byte of its value. */
typedef struct fmt_json_member {
    size_t key;
    size_t value;
} fmt_json_member;

/* For the object whose '{' is at text[obj] in text that jansson accepted,
 * store up to cap members in document order (the order json_object_foreach
 * visits them) and return how many members the object has (may exceed cap). */
size_t fmt_json_scan_object(const char *text, size_t len, size_t obj,
                            fmt_json_member *out, size_t cap);

/* Offset of the first non-whitespace byte at or after i (len if none). */
size_t fmt_json_skip_ws(const char *text, size_t len, size_t i);

#endif /* FMT_JSON_STRICT_H */

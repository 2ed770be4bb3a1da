/*
 * tok_dump.c - encode and decode a corpus with our tokenizer, for
 * scripts/tokenizer-check (which compares the output with Hugging Face
 * `tokenizers`).  Not a test and not installed.
 *
 *   tok_dump TOKENIZER.json CORPUS.json
 *
 * CORPUS.json is a JSON array of strings.  Prints one JSON object per line
 * and string: {"ids": [...] (add_special 0), "ids_special": [...]
 * (add_special 1), "decode": hex, "decode_skip": hex} where the decodes are
 * of ids_special without / with skip_special, as hex because they are bytes
 * (possibly not UTF-8).  A load failure prints the error and exits 1.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_tokenizer.h"

static json_t *encode(const rt_tokenizer *t, const char *s, size_t len,
                      int special, int32_t **ids, size_t *n)
{
    size_t need = 0;
    mc_error e;
    rt_tokenizer_encode(t, s, len, special, NULL, 0, &need, &e);
    *ids = malloc((need ? need : 1) * sizeof **ids);
    if (!*ids || rt_tokenizer_encode(t, s, len, special, *ids, need, n, &e))
        return NULL;
    json_t *a = json_array();
    for (size_t i = 0; i < *n; i++)
        json_array_append_new(a, json_integer((*ids)[i]));
    return a;
}

static json_t *decode_hex(const rt_tokenizer *t, const int32_t *ids, size_t n,
                          int skip)
{
    size_t need = 0, len = 0;
    rt_tokenizer_decode(t, ids, n, skip, NULL, 0, &need);
    char *buf = malloc(need + 1);
    char *hex = malloc(2 * need + 1);
    if (!buf || !hex || rt_tokenizer_decode(t, ids, n, skip, buf, need + 1,
                                            &len)) {
        free(buf);
        free(hex);
        return NULL;
    }
    for (size_t i = 0; i < len; i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)buf[i]);
    hex[2 * len] = '\0';
    json_t *v = json_string(hex);
    free(buf);
    free(hex);
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tok_dump TOKENIZER.json CORPUS.json\n");
        return 2;
    }
    rt_tokenizer *t = NULL;
    mc_error e;
    char msg[1400];
    if (rt_tokenizer_load(argv[1], &t, &e)) {
        printf("%s\n", mc_error_format(&e, msg, sizeof msg));
        return 1;
    }
    json_error_t je;
    json_t *corpus = json_load_file(argv[2], JSON_ALLOW_NUL, &je);
    if (!json_is_array(corpus)) {
        fprintf(stderr, "tok_dump: %s: not a JSON array of strings\n", argv[2]);
        return 1;
    }
    int rc = 0;
    for (size_t i = 0; i < json_array_size(corpus); i++) {
        json_t *s = json_array_get(corpus, i);
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        json_t *o = json_object();
        json_t *ea = encode(t, json_string_value(s), json_string_length(s), 0,
                            &a, &na);
        json_t *eb = encode(t, json_string_value(s), json_string_length(s), 1,
                            &b, &nb);
        json_object_set_new(o, "ids", ea ? ea : json_null());
        json_object_set_new(o, "ids_special", eb ? eb : json_null());
        json_t *d = eb ? decode_hex(t, b, nb, 0) : NULL;
        json_t *ds = eb ? decode_hex(t, b, nb, 1) : NULL;
        json_object_set_new(o, "decode", d ? d : json_null());
        json_object_set_new(o, "decode_skip", ds ? ds : json_null());
        if (!ea || !eb || !d || !ds)
            rc = 1;
        char *line = json_dumps(o, JSON_COMPACT);
        printf("%s\n", line);
        free(line);
        json_decref(o);
        free(a);
        free(b);
    }
    json_decref(corpus);
    rt_tokenizer_free(t);
    return rc;
}
